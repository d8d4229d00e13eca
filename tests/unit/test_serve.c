/* zaya serve without HTTP: the request parser's checks, UTF-8 repair, and the continuous-batching engine against
 * generate() — many requests of different lengths sharing a few slots give each its own greedy text; stop strings
 * cut the text; cancelling and shutting down free every KV block; a full queue and oversized requests are refused. */
#include <cjson/cJSON.h>
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "infer/decode.h"
#include "model/model.h"
#include "serve/serve_engine.h"
#include "serve/serve_http.h"
#include "serve/serve_request.h"
#include "serve/serve_structured.h"
#include "test.h"
#include "tokenizer/tokenizer.h"

static int parse(const char *body, ServeKind kind, ServeRequest *r, ServeError *e) {
    return serve_request_parse(body, strlen(body), kind, r, e);
}

TEST(serve_request_parser) {
    ServeRequest r;
    ServeError e;
    REQUIRE(parse("{\"model\":\"m\",\"prompt\":\"hi\",\"max_tokens\":7,\"temperature\":0,\"top_p\":0.5,\"top_k\":-1,"
                  "\"stop\":\"\\n\",\"seed\":-3,\"stream\":true,\"stream_options\":{\"include_usage\":true},"
                  "\"logprobs\":2,\"user\":\"u\",\"n\":null,\"ignore_eos\":true}", SERVE_COMPLETION, &r, &e) == 0);
    CHECK(strcmp(r.model, "m") == 0 && r.n_prompts == 1 && strcmp(r.prompts[0].text, "hi") == 0 && r.max_tokens == 7 &&
          r.temperature == 0);
    CHECK(r.top_p == 0.5 && r.top_k == 0 && r.n_stop == 1 && strcmp(r.stop[0], "\n") == 0 && r.has_seed);
    CHECK(r.stream && r.include_usage && r.logprobs == 2 && r.ignore_eos);
    serve_request_free(&r);
    REQUIRE(parse("{\"model\":\"m\",\"prompt\":[[4,5,6]]}", SERVE_COMPLETION, &r, &e) == 0);
    CHECK(r.n_prompts == 1 && r.prompts[0].n_ids == 3 && r.prompts[0].ids[2] == 6 && r.max_tokens == -1 &&
          isnan(r.temperature) && r.n == 1 && !r.echo);
    serve_request_free(&r);
    /* batches: strings, token lists; n choices each; echo with max_tokens 0; vLLM's sampling fields */
    REQUIRE(parse("{\"model\":\"m\",\"prompt\":[\"a\",\"b c\"],\"n\":3,\"echo\":true,\"max_tokens\":0,\"logprobs\":1,"
                  "\"min_p\":0.1,\"presence_penalty\":0.5,\"frequency_penalty\":-1,\"repetition_penalty\":1.3,"
                  "\"logit_bias\":{\"17\":-100,\"5\":2.5},\"stop_token_ids\":[9,10],\"skip_special_tokens\":false,"
                  "\"include_stop_str_in_output\":true}", SERVE_COMPLETION, &r, &e) == 0);
    CHECK(r.n_prompts == 2 && strcmp(r.prompts[1].text, "b c") == 0 && r.n == 3 && r.echo && r.max_tokens == 0);
    CHECK(r.min_p == 0.1 && r.presence_penalty == 0.5 && r.frequency_penalty == -1 && r.repetition_penalty == 1.3);
    CHECK(r.n_bias == 2 && r.bias_ids[0] == 17 && r.bias[0] == -100 && r.bias_ids[1] == 5 && r.bias[1] == 2.5f);
    CHECK(r.n_stop_ids == 2 && r.stop_ids[1] == 10 && r.skip_special_tokens == 0 && r.include_stop_str);
    serve_request_free(&r);
    REQUIRE(parse("{\"model\":\"m\",\"prompt\":[[1,2],[3]]} \r\n", SERVE_COMPLETION, &r, &e) == 0);
    CHECK(r.n_prompts == 2 && r.prompts[0].n_ids == 2 && r.prompts[1].ids[0] == 3 && !r.prompts[1].text);
    serve_request_free(&r);
    /* /tokenize and /detokenize (model optional) */
    REQUIRE(parse("{\"prompt\":\"hi\",\"add_special_tokens\":false,\"return_token_strs\":true}", SERVE_TOKENIZE, &r,
                  &e) == 0);
    CHECK(!r.model && r.n_prompts == 1 && r.add_special_tokens == 0 && r.return_token_strs && !r.chat_json);
    serve_request_free(&r);
    REQUIRE(parse("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", SERVE_TOKENIZE, &r, &e) == 0);
    CHECK(r.chat_json && r.add_special_tokens == -1 && r.add_generation_prompt == 1);
    serve_request_free(&r);
    REQUIRE(parse("{\"tokens\":[5,6,7]}", SERVE_DETOKENIZE, &r, &e) == 0);
    CHECK(r.n_prompts == 1 && r.prompts[0].n_ids == 3 && r.prompts[0].ids[0] == 5);
    serve_request_free(&r);
    REQUIRE(parse("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
                  "{\"type\":\"text\",\"text\":\"b\"}]}],\"chat_template_kwargs\":{\"enable_thinking\":false},"
                  "\"logprobs\":true,\"top_logprobs\":4}", SERVE_CHAT, &r, &e) == 0);
    CHECK(strstr(r.chat_json, "\"content\":\"a\\nb\"") && strstr(r.chat_json, "\"enable_thinking\":false"));
    CHECK(r.logprobs == 4);
    serve_request_free(&r);
    static const struct {
        const char *body;
        ServeKind kind;
        const char *param, *says;
    } bad[] = {
        {"{\"model\":\"m\",\"prompt\":", SERVE_COMPLETION, "", "not valid JSON"},
        {"[]", SERVE_COMPLETION, "", "JSON object"},
        {"{\"prompt\":\"x\"}", SERVE_COMPLETION, "model", "required"},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"max_tokens\":-2}", SERVE_COMPLETION, "max_tokens", "integer"},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"max_tokens\":2.5}", SERVE_COMPLETION, "max_tokens", "integer"},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"temperature\":\"hot\"}", SERVE_COMPLETION, "temperature", "hot"},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"temperature\":3}", SERVE_COMPLETION, "temperature", "<= 2"},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"top_p\":0}", SERVE_COMPLETION, "top_p", "> 0"},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"n\":0}", SERVE_COMPLETION, "n", "integer from 1"},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"best_of\":3}", SERVE_COMPLETION, "best_of", "must be 1"},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"bogus\":1}", SERVE_COMPLETION, "bogus", "unknown field"},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"model\":\"n\"}", SERVE_COMPLETION, "model", "twice"},
        {"{\"model\":\"m\",\"prompt\":[1,-2]}", SERVE_COMPLETION, "prompt", "token ids"},
        {"{\"model\":\"m\",\"prompt\":[]}", SERVE_COMPLETION, "prompt", "empty"},
        {"{\"model\":\"m\",\"prompt\":[\"a\",[1]]}", SERVE_COMPLETION, "prompt", "not a mix"},
        {"{\"model\":\"m\",\"prompt\":[[1],[]]}", SERVE_COMPLETION, "prompt", "empty"},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"stop\":[\"a\",\"\"]}", SERVE_COMPLETION, "stop", "non-empty"},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"max_tokens\":0}", SERVE_COMPLETION, "max_tokens", "only with echo"},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"echo\":1}", SERVE_COMPLETION, "echo", "true or false"},
        /* the defects of issue 33: junk after the object, raw bytes that are not UTF-8, a number past a double */
        {"{\"model\":\"m\",\"prompt\":\"x\"}xyz", SERVE_COMPLETION, "", "more follows"},
        {"{\"model\":\"m\",\"prompt\":\"x\"} {}", SERVE_COMPLETION, "", "more follows"},
        {"{\"model\":\"m\",\"prompt\":\"a\xff\"}", SERVE_COMPLETION, "", "not valid UTF-8 (byte 24)"},
        {"{\"model\":\"m\",\"prompt\":\"\xed\xa0\x80\"}", SERVE_COMPLETION, "", "not valid UTF-8"},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"temperature\":1e309}", SERVE_COMPLETION, "temperature",
         "too large to represent"},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"logit_bias\":{\"a\":1}}", SERVE_COMPLETION, "logit_bias", "token ids"},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"logit_bias\":{\"3\":101}}", SERVE_COMPLETION, "logit_bias", "<= 100"},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"stop_token_ids\":[1,-1]}", SERVE_COMPLETION, "stop_token_ids",
         "token ids"},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"min_p\":2}", SERVE_COMPLETION, "min_p", "<= 1"},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"repetition_penalty\":0}", SERVE_COMPLETION, "repetition_penalty",
         "> 0"},
        {"{\"model\":\"m\",\"prompt\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\"],\"n\":128}", SERVE_COMPLETION, "n", "choices"},
        {"{\"prompt\":\"x\",\"messages\":[]}", SERVE_TOKENIZE, "messages", "either"},
        {"{\"prompt\":[1]}", SERVE_TOKENIZE, "prompt", "string"},
        {"{\"prompt\":\"x\",\"n\":1}", SERVE_TOKENIZE, "n", "unknown field"},
        {"{\"tokens\":\"x\"}", SERVE_DETOKENIZE, "tokens", "list of token ids"},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"logprobs\":9}", SERVE_COMPLETION, "logprobs", "integer"},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"stream_options\":{\"include_usage\":true}}", SERVE_COMPLETION,
         "stream_options", "stream: true"},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"frequency_penalty\":3}", SERVE_COMPLETION, "frequency_penalty",
         "<= 2"},
        {"{\"model\":\"m\"}", SERVE_CHAT, "messages", "required"},
        {"{\"model\":\"m\",\"messages\":[]}", SERVE_CHAT, "messages", "non-empty"},
        {"{\"model\":\"m\",\"messages\":[{\"role\":1}]}", SERVE_CHAT, "messages[0]", "role"},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":7}]}", SERVE_CHAT, "messages[0]", "content"},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":2}", SERVE_CHAT,
         "top_logprobs", "logprobs"},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"prompt\":\"x\"}", SERVE_CHAT, "prompt",
         "unknown field"},
    };
    for (size_t i = 0; i < ZY_ARRAY_LEN(bad); i++) {
        memset(&e, 0, sizeof e);
        int rc = parse(bad[i].body, bad[i].kind, &r, &e);
        CHECK_MSG(rc == -1 && e.status == 400 && strcmp(e.param, bad[i].param) == 0 && strstr(e.message, bad[i].says) &&
                      !r.model && !r.prompts,
                  "%s -> %d %s: %s", bad[i].body, e.status, e.param, e.message);
    }
}

TEST(serve_utf8_repair_as_python) {
    /* expected bytes from Python: b.decode("utf-8", "replace").encode() */
    static const struct {
        const char *in, *out;
    } v[] = {{"ok", "ok"},
             {"\xF0\x9F\x98", "\xEF\xBF\xBD"},
             {"\xE0\x80" "A", "\xEF\xBF\xBD\xEF\xBF\xBD" "A"},
             {"\xFC\xFC", "\xEF\xBF\xBD\xEF\xBF\xBD"},
             {"\xED\xA0\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},
             {"ok\xC3", "ok\xEF\xBF\xBD"},
             {"\xC3\xA9\xF0\x9F\x8E\x89", "\xC3\xA9\xF0\x9F\x8E\x89"}};
    for (size_t i = 0; i < ZY_ARRAY_LEN(v); i++) {
        size_t n;
        char *o = serve_utf8_sanitize(v[i].in, strlen(v[i].in), &n);
        CHECK_MSG(o && n == strlen(v[i].out) && memcmp(o, v[i].out, n) == 0, "case %zu", i);
        free(o);
    }
}

typedef struct {
    Model m;
    Tokenizer *tok;
} Fixture;

static int fixture(Fixture *f, ZyErr *err) {
    static const char *corpus = "the quick brown fox jumps over the lazy dog. 12+34=46. hello world, zaya serves. "
                                "one two three four five six seven eight nine ten.";
    size_t len = strlen(corpus);
    if (tokenizer_train_texts(&corpus, &len, 1, 300, 0, &f->tok, NULL, err)) return -1;
    ZayaConfig c = {.vocab_size = 320, .hidden_size = 32, .num_layers = 2, .num_heads = 4, .num_kv_heads = 2,
                    .head_dim = 8, .num_experts = 3, .moe_intermediate_size = 16, .router_hidden_size = 8,
                    .cca_time0 = 2, .cca_time1 = 2, .rms_norm_eps = 1e-5f, .tie_word_embeddings = 1,
                    .max_position_embeddings = 128, .rope_theta = 10000.0f, .partial_rotary_factor = 0.5f,
                    .initializer_range = 0.5f, .bos_token_id = 1, .eos_token_id = 2, .pad_token_id = 0};
    if (model_create(&f->m, &c, err)) return -1;
    model_init_weights(&f->m, 5);
    return 0;
}

/* Everything a job says, until it ends. */
static char *drain(ServeJob *j, const char **finish, int *completion) {
    size_t cap = 64, n = 0;
    char *text = calloc(1, cap);
    for (;;) {
        if (!serve_job_wait(j, 1000)) continue;
        ServeDelta d;
        if (serve_job_take(j, &d)) {
            *finish = "take failed";
            break;
        }
        if (n + d.len + 1 > cap) text = realloc(text, cap = 2 * (n + d.len + 1));
        memcpy(text + n, d.text ? d.text : "", d.len);
        n += d.len;
        text[n] = 0;
        int done = d.finished;
        if (done) {
            *finish = d.finish;
            *completion = d.completion_tokens;
        }
        serve_delta_free(&d);
        if (done) break;
    }
    return text;
}

typedef struct {
    int32_t ids[256];
    int n;
    int32_t stop;
} Ids;

static int collect(void *ctx, int32_t tok, ZyErr *err) {
    Ids *o = ctx;
    if (tok != o->stop) o->ids[o->n++] = tok;
    return 0;
}

/* generate()'s greedy text for a prompt, repaired as the server repairs it. */
static char *reference(Fixture *f, const int32_t *prompt, int n, int max_new, const int32_t *stop, ZyErr *err) {
    KVCache c;
    Sampler s;
    if (kvcache_create(&c, &f->m.cfg, 1, n + max_new, err)) return NULL;
    if (sampler_create(&s, f->m.cfg.vocab_size, err)) {
        kvcache_free(&c);
        return NULL;
    }
    s.n_allowed = tokenizer_vocab_size(f->tok);
    SamplingParams greedy = {0, 0, 1, 0};
    ZyRng rng;
    zy_rng_seed(&rng, 1);
    Ids out = {.n = 0, .stop = stop[0]};
    GenerateStats st;
    int rc = generate(&f->m, &c, &s, &greedy, &rng, prompt, n, max_new, stop, 1, collect, &out, &st, err);
    kvcache_free(&c);
    sampler_free(&s);
    char *bytes = NULL, *text = NULL;
    size_t len = 0, tl;
    if (rc == 0 && tokenizer_decode(f->tok, out.ids, (size_t)out.n, &bytes, &len, err) == 0)
        text = serve_utf8_sanitize(bytes ? bytes : "", len, &tl);
    free(bytes);
    return text;
}

TEST(serve_engine_matches_generate) {
    ZyErr err = {{0}};
    Fixture f;
    REQUIRE(fixture(&f, &err) == 0);
    ServeEngineOpts o = {.max_batch = 3, .max_context = 96, .block_tokens = 4, .prefill_chunk = 5, .step_tokens = 9,
                         .max_queue = 16};
    ServeEngine *e;
    REQUIRE(serve_engine_create(&e, &f.m, f.tok, &o, &err) == 0);
    enum { NJ = 7 };
    int32_t prompts[NJ][40];
    const int lens[NJ] = {1, 3, 17, 40, 6, 11, 2}, max_new[NJ] = {12, 30, 5, 20, 25, 8, 40};
    const int32_t stop = f.m.cfg.eos_token_id;
    ServeJob *jobs[NJ];
    for (int q = 0; q < NJ; q++) {
        for (int t = 0; t < lens[q]; t++) prompts[q][t] = (int32_t)(3 + (q * 37 + t * 11) % 290);
        ServeJobSpec sp = {.prompt = prompts[q], .n_prompt = lens[q], .max_tokens = max_new[q],
                           .sampling = {0, 0, 1, 0}, .seed = 1, .stop_ids = &stop, .n_stop_ids = 1, .logprobs = -1};
        ServeError se;
        REQUIRE(serve_engine_submit(e, &sp, &jobs[q], &se) == 0);
    }
    for (int q = 0; q < NJ; q++) {
        const char *finish = NULL;
        int completion = 0;
        char *got = drain(jobs[q], &finish, &completion);
        char *want = reference(&f, prompts[q], lens[q], max_new[q], &stop, &err);
        CHECK_MSG(want && strcmp(got, want) == 0, "job %d: \"%s\" vs \"%s\"", q, got, want ? want : "?");
        CHECK(finish && (strcmp(finish, "length") == 0 ? completion == max_new[q] : strcmp(finish, "stop") == 0));
        /* a stop string from the middle of that text ends the next run of the same prompt before it */
        if (q == 1) {
            /* two ASCII letters or digits after the start (the random model's text is mostly not ASCII) */
            size_t at = 1;
            while (want[at] && want[at + 1] && !(isalnum((unsigned char)want[at]) && isalnum((unsigned char)want[at + 1])))
                at++;
            REQUIRE(want[at] && want[at + 1]);
            char stop_str[3] = {want[at], want[at + 1], 0};
            char *stops[1] = {stop_str};
            ServeJobSpec sp = {.prompt = prompts[q], .n_prompt = lens[q], .max_tokens = max_new[q],
                               .sampling = {0, 0, 1, 0}, .stop_ids = &stop, .n_stop_ids = 1, .stop = stops, .n_stop = 1,
                               .logprobs = -1};
            ServeJob *j;
            ServeError se;
            REQUIRE(serve_engine_submit(e, &sp, &j, &se) == 0);
            char *cut = drain(j, &finish, &completion);
            CHECK_MSG(strncmp(cut, want, strlen(cut)) == 0 && strstr(want, stop_str) == want + strlen(cut) &&
                          strcmp(finish, "stop") == 0,
                      "stop \"%s\": \"%s\" of \"%s\"", stop_str, cut, want);
            free(cut);
            serve_job_release(j);
        }
        free(got);
        free(want);
        serve_job_release(jobs[q]);
    }
    int running, queued, used;
    serve_engine_load(e, &running, &queued, &used);
    CHECK(running == 0 && queued == 0 && used == 0);
    char *metrics = serve_engine_metrics(e);
    CHECK(metrics && strstr(metrics, "zaya_generation_tokens_total") && strstr(metrics, "zaya_kv_blocks_used 0"));
    free(metrics);
    serve_engine_free(e);
    model_free(&f.m);
    tokenizer_free(f.tok);
}

TEST(serve_engine_cancel_queue_and_shutdown) {
    ZyErr err = {{0}};
    Fixture f;
    REQUIRE(fixture(&f, &err) == 0);
    ServeEngineOpts o = {.max_batch = 1, .max_context = 64, .block_tokens = 8, .prefill_chunk = 8, .max_queue = 0,
                         .kv_memory = (kvpool_block_bytes(&f.m.cfg, 8, 0) + kvpool_state_bytes(&f.m.cfg)) * 10};
    ServeEngine *e;
    REQUIRE(serve_engine_create(&e, &f.m, f.tok, &o, &err) == 0);
    int32_t prompt[70];
    for (int i = 0; i < 70; i++) prompt[i] = 5 + i;
    ServeJobSpec sp = {.prompt = prompt, .n_prompt = 4, .max_tokens = 50, .sampling = {1.0, 0, 1, 0}, .seed = 2,
                       .logprobs = 1};
    ServeJob *a, *b;
    ServeError se;
    const char *finish = NULL;
    int completion = 0, refused = 0;
    /* a running: the one slot is taken, so a second request is refused (503). On a loaded machine the tiny model can
     * finish a's 50 tokens before the second submit, freeing the slot: that attempt shows nothing and is repeated.
     * An engine that admits past its capacity is never refused. */
    for (int attempt = 0; attempt < 20 && !refused; attempt++) {
        REQUIRE(serve_engine_submit(e, &sp, &a, &se) == 0);
        REQUIRE(serve_job_wait(a, 10000) == 1);
        if (serve_engine_submit(e, &sp, &b, &se) == -1) {
            refused = 1;
            CHECK(se.status == 503 && strstr(se.message, "capacity"));
            break;
        }
        free(drain(b, &finish, &completion)), serve_job_release(b);
        free(drain(a, &finish, &completion)), serve_job_release(a);
    }
    REQUIRE(refused); /* else a second request was admitted in each of 20 attempts while the one slot was taken */
    ServeDelta d;
    REQUIRE(serve_job_take(a, &d) == 0);
    CHECK(d.n_logprobs >= 1 && d.logprobs[0].n_top == 1 && d.logprobs[0].logprob <= 0 &&
          d.logprobs[0].top_logprob[0] >= d.logprobs[0].logprob);
    if (d.finished) { /* the tiny model ran all 50 tokens before this thread got here: nothing left to cancel */
        CHECK(strcmp(d.finish, "length") == 0 && d.completion_tokens == 50);
        serve_delta_free(&d);
    } else { /* (test_serve.py cancels 3,000-token streams mid-way, where there is no such race) */
        serve_delta_free(&d);
        serve_job_cancel(a);
        free(drain(a, &finish, &completion));
        CHECK(finish && (strcmp(finish, "abort") == 0 || (strcmp(finish, "length") == 0 && completion == 50)));
    }
    serve_job_release(a);
    int running = 1, used = 1;
    for (int i = 0; i < 100 && (running || used); i++) {
        serve_engine_load(e, &running, NULL, &used);
        usleep(10000);
    }
    CHECK(running == 0 && used == 0);
    /* refused outright: a prompt that fills the context, an id outside the vocabulary */
    sp.n_prompt = 64;
    CHECK(serve_engine_submit(e, &sp, &b, &se) == -1 && se.status == 400 && strcmp(se.code, "context_length_exceeded") == 0);
    prompt[0] = 320;
    sp.n_prompt = 3;
    CHECK(serve_engine_submit(e, &sp, &b, &se) == -1 && se.status == 400 && strstr(se.message, "vocabulary"));
    prompt[0] = 5;
    /* more tokens asked than the context holds: it runs until the context is full */
    sp.n_prompt = 40;
    sp.max_tokens = 60;
    REQUIRE(serve_engine_submit(e, &sp, &b, &se) == 0);
    free(drain(b, &finish, &completion));
    CHECK_MSG(strcmp(finish, "length") == 0 && completion == 64 - 40 + 1, "%s after %d tokens", finish, completion);
    serve_job_release(b);
    sp.n_prompt = 4;
    /* shutting down with a request running and no grace: it ends as aborted, its blocks returned */
    sp.max_tokens = 50;
    REQUIRE(serve_engine_submit(e, &sp, &a, &se) == 0);
    REQUIRE(serve_job_wait(a, 10000) == 1);
    serve_engine_shutdown(e, 0);
    free(drain(a, &finish, &completion));
    CHECK(strcmp(finish, "abort") == 0);
    serve_job_release(a);
    serve_engine_load(e, &running, NULL, &used);
    CHECK(running == 0 && used == 0);
    CHECK(serve_engine_submit(e, &sp, &b, &se) == -1 && se.status == 503);
    serve_engine_free(e);
    model_free(&f.m);
    tokenizer_free(f.tok);
}

/* Server-sent events appended to one growing buffer: every payload length against every fill level of the buffer
 * (the sanitizer build catches a byte written past the allocation, as an sprintf's terminator once was when an event
 * ended exactly at the buffer's end), and the bytes are exactly the events in order. */
TEST(serve_sse_events_fill_the_buffer_exactly) {
    char *buf = NULL;
    size_t len = 0, cap = 0, expect_len = 0;
    char payload[200];
    for (int round = 0; round < 3; round++)
        for (int n = 0; n < (int)sizeof payload; n++) {
            memset(payload, 'a' + (n % 26), (size_t)n);
            payload[n] = 0;
            REQUIRE(serve_sse_append(&buf, &len, &cap, payload) == 0);
            expect_len += 6 + (size_t)n + 2;
            CHECK(len == expect_len && len <= cap);
            CHECK(memcmp(buf + len - n - 8, "data: ", 6) == 0 && memcmp(buf + len - 2, "\n\n", 2) == 0);
            CHECK(n == 0 || (buf[len - 3] == 'a' + (n % 26) && buf[len - 2 - n] == 'a' + (n % 26)));
            if (n % 50 == 49) { /* the server drains and starts over, keeping its allocation */
                len = expect_len = 0;
            }
        }
    REQUIRE(serve_sse_append(&buf, &len, &cap, "[DONE]") == 0);
    CHECK(len >= 14 && memcmp(buf + len - 14, "data: [DONE]\n\n", 14) == 0);
    free(buf);
    /* an event that ends exactly at the allocation's end, after first events of every length */
    int exact = 0;
    for (int n1 = 0; n1 < 150; n1++) {
        char *b = NULL;
        size_t l = 0, c = 0;
        memset(payload, 'x', (size_t)n1);
        payload[n1] = 0;
        REQUIRE(serve_sse_append(&b, &l, &c, payload) == 0);
        const size_t room = c - l;
        if (room >= 8 && room - 8 < sizeof payload) {
            memset(payload, 'y', room - 8);
            payload[room - 8] = 0;
            REQUIRE(serve_sse_append(&b, &l, &c, payload) == 0);
            CHECK(l == c && b[l - 1] == '\n' && b[l - 3] == (room > 8 ? 'y' : ' '));
            exact++;
        }
        free(b);
    }
    CHECK(exact > 100);
}

/* ---- echo, choices, penalties, stops ---------------------------------------------------------------------------- */

/* Everything a job says: its text, finish reason and log-probabilities. */
typedef struct {
    char *text;
    const char *finish;
    int completion;
    ServeLogprob *lp;
    int n_lp;
} Said;

static Said drain_all(ServeJob *j) {
    Said s = {.text = calloc(1, 1)};
    size_t n = 0;
    for (;;) {
        if (!serve_job_wait(j, 1000)) continue;
        ServeDelta d;
        if (serve_job_take(j, &d)) {
            s.finish = "take failed";
            break;
        }
        s.text = realloc(s.text, n + d.len + 1);
        memcpy(s.text + n, d.text ? d.text : "", d.len);
        n += d.len;
        s.text[n] = 0;
        if (d.n_logprobs) {
            s.lp = realloc(s.lp, sizeof *s.lp * (s.n_lp + d.n_logprobs));
            memcpy(s.lp + s.n_lp, d.logprobs, sizeof *s.lp * d.n_logprobs);
            s.n_lp += d.n_logprobs;
        }
        const int done = d.finished;
        if (done) {
            s.finish = d.finish;
            s.completion = d.completion_tokens;
        }
        serve_delta_free(&d);
        if (done) break;
    }
    return s;
}

static void said_free(Said *s) {
    free(s->text);
    free(s->lp);
}

/* A backend like a GPU's: no fork (each choice prefills its own prompt) and the logits of one row per sequence (an
 * echoed prompt goes one token a step). */
typedef struct {
    const Model *m;
    KVPool pool;
} PlainPool;
static int plain_step(void *x, const DecodeSeq *seqs, int n, const int32_t *tokens, float *logits, ZyErr *err) {
    PlainPool *c = x;
    for (int i = 0; i < n; i++) /* what a pool without every row's logits refuses */
        if (seqs[i].logits == DECODE_LOGITS_ALL && seqs[i].n > 1) return zy_fail(err, "every row asked of a plain pool");
    return model_decode_step(c->m, &c->pool, seqs, n, tokens, logits, err);
}
static int plain_reserve(void *x, int slot, int tokens) { return kvpool_reserve(&((PlainPool *)x)->pool, slot, tokens); }
static void plain_reset(void *x, int slot) { kvpool_seq_reset(&((PlainPool *)x)->pool, slot); }
static void plain_release(void *x, int slot) { kvpool_seq_release(&((PlainPool *)x)->pool, slot); }
static int plain_len(void *x, int slot) { return ((PlainPool *)x)->pool.blocks.len[slot]; }
static int plain_free_blocks(void *x) { return ((PlainPool *)x)->pool.blocks.n_free; }
static void plain_destroy(void *x) {
    kvpool_free(&((PlainPool *)x)->pool);
    free(x);
}
static int plain_open(ServeBackend *be, void *arg, const Model *m, int max_seqs, int max_len, int n_blocks,
                      int block_tokens, int max_rows, int chunk, int kv_bf16, ZyErr *err) {
    PlainPool *c = calloc(1, sizeof *c);
    c->m = m;
    if (kvpool_create(&c->pool, &m->cfg, max_seqs, max_len, n_blocks, block_tokens, max_rows, chunk, kv_bf16, err)) {
        free(c);
        return -1;
    }
    *be = (ServeBackend){.ctx = c, .step = plain_step, .reserve = plain_reserve, .seq_reset = plain_reset,
                         .seq_release = plain_release, .seq_len = plain_len, .n_free = plain_free_blocks,
                         .destroy = plain_destroy};
    return 0;
}

/* The id of the token that decodes to exactly these bytes, or -1. */
static int32_t token_of(const Tokenizer *t, const char *bytes, size_t n) {
    for (int32_t id = 0; id < tokenizer_vocab_size(t); id++) {
        char *b = NULL;
        size_t len = 0;
        ZyErr err;
        int hit = tokenizer_decode(t, &id, 1, &b, &len, &err) == 0 && len == n && memcmp(b, bytes, n) == 0;
        free(b);
        if (hit) return id;
    }
    return -1;
}

/* Greedy decoding with penalties, step by step on a KVCache: what the engine must give. */
static char *reference_penalized(Fixture *f, const int32_t *prompt, int n, int max_new, const LogitsPenalties *pen,
                                 int32_t stop, ZyErr *err) {
    const int V = f->m.cfg.vocab_size;
    KVCache c;
    if (kvcache_create(&c, &f->m.cfg, 1, n + max_new, err)) return NULL;
    float *lg = malloc(sizeof(float) * V);
    int32_t *counts = calloc(V, sizeof *counts), out[256];
    int n_out = 0, rc = model_decode(&f->m, &c, prompt, n, lg, 1, err);
    const int allowed = tokenizer_vocab_size(f->tok);
    while (rc == 0 && n_out < max_new) {
        logits_apply_penalties(lg, V, pen, prompt, n, out, n_out, counts);
        const int32_t tok = sample_argmax(lg, allowed);
        if (tok == stop) break;
        out[n_out++] = tok;
        if (n_out < max_new) rc = model_decode(&f->m, &c, &tok, 1, lg, 1, err);
    }
    char *bytes = NULL, *text = NULL;
    size_t len = 0, tl;
    if (rc == 0 && tokenizer_decode(f->tok, out, (size_t)n_out, &bytes, &len, err) == 0)
        text = serve_utf8_sanitize(bytes ? bytes : "", len, &tl);
    free(bytes);
    free(lg);
    free(counts);
    kvcache_free(&c);
    return text;
}

/* echo: the prompt's log-probabilities equal log_softmax of the full forward's logits (the first token's NAN), on
 * the CPU backend (every prompt row's logits in one step) and on one without (a row a step); n choices of a prompt
 * (one prefill, the cache forked) each give what one request with seed + j gives; the penalties give what a
 * step-by-step reference gives; a stop string holding U+FFFD matches the repaired text; stop ids; special tokens
 * skipped or not. */
TEST(serve_engine_echo_choices_penalties_and_stops) {
    ZyErr err = {{0}};
    Fixture f;
    REQUIRE(fixture(&f, &err) == 0);
    const int V = f.m.cfg.vocab_size;
    enum { NP = 23 };
    int32_t prompt[NP];
    for (int t = 0; t < NP; t++) prompt[t] = (int32_t)(3 + (t * 53 + 7) % 290);
    Activations a;
    REQUIRE(acts_create(&a, &f.m.cfg, 1, NP, &err) == 0);
    model_forward(&f.m, &a, prompt);
    const int32_t stop = f.m.cfg.eos_token_id;
    for (int plain = 0; plain < 2; plain++) {
        ServeEngineOpts o = {.max_batch = 4, .max_context = 96, .block_tokens = 4, .prefill_chunk = 5,
                             .step_tokens = 12, .max_queue = 16};
        ServeEngine *e;
        REQUIRE((plain ? serve_engine_create_with(&e, &f.m, f.tok, &o, plain_open, NULL, &err)
                       : serve_engine_create(&e, &f.m, f.tok, &o, &err)) == 0);
        ServeError se;
        /* the prompt alone (max_tokens 0), then with 6 tokens after it, 2 choices */
        for (int with_output = 0; with_output < 2; with_output++) {
            ServeJobSpec sp = {.prompt = prompt, .n_prompt = NP, .max_tokens = with_output ? 6 : 0,
                               .sampling = {0, 0, 1, 0}, .seed = 1, .stop_ids = &stop, .n_stop_ids = 1, .logprobs = 2,
                               .prompt_logprobs = 1, .n = with_output ? 2 : 1};
            ServeJob *jobs[2];
            REQUIRE(serve_engine_submit(e, &sp, jobs, &se) == 0);
            for (int c = 0; c < sp.n; c++) {
                Said s = drain_all(jobs[c]);
                CHECK_MSG(s.n_lp == NP + s.completion && strcmp(s.finish, with_output ? "length" : "length") == 0 &&
                              (with_output ? s.completion >= 1 : s.completion == 0 && !s.text[0]),
                          "%d entries, %d tokens, %s", s.n_lp, s.completion, s.finish);
                CHECK(s.n_lp > 0 && isnan(s.lp[0].logprob) && s.lp[0].token == prompt[0] && s.lp[0].n_top == 0);
                double worst = 0;
                for (int t = 1; t < NP && t < s.n_lp; t++) {
                    const float *lg = a.logits + (size_t)(t - 1) * V;
                    double mx = -INFINITY, sum = 0;
                    for (int v = 0; v < V; v++) mx = lg[v] > mx ? lg[v] : mx;
                    for (int v = 0; v < V; v++) sum += exp(lg[v] - mx);
                    const double want = lg[prompt[t]] - mx - log(sum);
                    int best = 0;
                    for (int v = 1; v < V; v++) best = lg[v] > lg[best] ? v : best;
                    worst = fmax(worst, fabs(s.lp[t].logprob - want));
                    CHECK(s.lp[t].token == prompt[t] && s.lp[t].n_top == 2 && s.lp[t].top[0] == best);
                }
                CHECK_MSG(worst < 1e-4, "%s backend: prompt logprob error %.3g", plain ? "plain" : "cpu", worst);
                said_free(&s);
                serve_job_release(jobs[c]);
            }
        }
        /* n = 3 at temperature 1: choice j is what one request with seed 40 + j says */
        ServeJobSpec sp = {.prompt = prompt, .n_prompt = 9, .max_tokens = 14, .sampling = {1.0, 0, 1, 0}, .seed = 40,
                           .stop_ids = &stop, .n_stop_ids = 1, .logprobs = -1, .n = 3};
        ServeJob *jobs[3], *one, *five[5];
        REQUIRE(serve_engine_submit(e, &sp, jobs, &se) == 0);
        sp.n = 5; /* more choices than slots: refused */
        CHECK(serve_engine_submit(e, &sp, five, &se) == -1 && se.status == 400 && strcmp(se.param, "n") == 0);
        sp.n = 1;
        char *texts[3];
        for (int c = 0; c < 3; c++) {
            Said s = drain_all(jobs[c]);
            texts[c] = s.text;
            free(s.lp);
            serve_job_release(jobs[c]);
        }
        for (int c = 0; c < 3; c++) {
            sp.seed = 40 + (uint64_t)c;
            REQUIRE(serve_engine_submit(e, &sp, &one, &se) == 0);
            Said s = drain_all(one);
            CHECK_MSG(strcmp(s.text, texts[c]) == 0, "choice %d: \"%s\" vs alone \"%s\"", c, texts[c], s.text);
            said_free(&s);
            serve_job_release(one);
        }
        CHECK(strcmp(texts[0], texts[1]) != 0 || strcmp(texts[1], texts[2]) != 0); /* the seeds differ */
        for (int c = 0; c < 3; c++) free(texts[c]);
        int running, queued, used;
        serve_engine_load(e, &running, &queued, &used);
        CHECK(running == 0 && queued == 0 && used == 0);
        serve_engine_free(e);
    }
    acts_free(&a);

    ServeEngineOpts o = {.max_batch = 3, .max_context = 96, .block_tokens = 4, .prefill_chunk = 5, .max_queue = 16};
    ServeEngine *e;
    REQUIRE(serve_engine_create(&e, &f.m, f.tok, &o, &err) == 0);
    ServeError se;
    ServeJob *j;
    /* penalties: exactly the reference's greedy text */
    const int32_t bias_ids[2] = {17, 40};
    const float bias[2] = {3.0f, -100};
    const LogitsPenalties pens[3] = {{.presence = 1.5, .frequency = 0.7, .repetition = 1.8},
                                     {.repetition = 0.6, .bias_ids = bias_ids, .bias = bias, .n_bias = 2},
                                     {.frequency = -0.3, .presence = 0.2}};
    for (int k = 0; k < 3; k++) {
        ServeJobSpec sp = {.prompt = prompt, .n_prompt = 11, .max_tokens = 20, .sampling = {0, 0, 1, 0},
                           .penalties = pens[k], .stop_ids = &stop, .n_stop_ids = 1, .logprobs = -1};
        REQUIRE(serve_engine_submit(e, &sp, &j, &se) == 0);
        Said s = drain_all(j);
        char *want = reference_penalized(&f, prompt, 11, 20, &pens[k], stop, &err);
        CHECK_MSG(want && strcmp(s.text, want) == 0, "penalties %d: \"%s\" vs \"%s\"", k, s.text, want ? want : "?");
        free(want);
        said_free(&s);
        serve_job_release(j);
    }
    /* a token forced by logit_bias: the byte 0xFF, never UTF-8, so each comes out as U+FFFD */
    const int32_t ff = token_of(f.tok, "\xFF", 1);
    REQUIRE(ff >= 0);
    const float force = 100;
    char fffd2[] = "\xEF\xBF\xBD\xEF\xBF\xBD", *stops[1] = {fffd2};
    for (int include = 0; include < 2; include++) {
        ServeJobSpec sp = {.prompt = prompt, .n_prompt = 5, .max_tokens = 10, .sampling = {0, 0, 1, 0},
                           .penalties = {.bias_ids = &ff, .bias = &force, .n_bias = 1}, .stop_ids = &stop,
                           .n_stop_ids = 1, .stop = stops, .n_stop = 1, .include_stop_str = include, .logprobs = -1};
        REQUIRE(serve_engine_submit(e, &sp, &j, &se) == 0);
        Said s = drain_all(j);
        CHECK_MSG(strcmp(s.finish, "stop") == 0 && strcmp(s.text, include ? fffd2 : "") == 0 && s.completion == 2,
                  "U+FFFD stop (include %d): \"%s\" %s after %d", include, s.text, s.finish, s.completion);
        said_free(&s);
        serve_job_release(j);
    }
    /* stop_token_ids: the forced token ends it at once, not in the text */
    const int32_t two_stops[2] = {stop, ff};
    ServeJobSpec sp = {.prompt = prompt, .n_prompt = 5, .max_tokens = 10, .sampling = {0, 0, 1, 0},
                       .penalties = {.bias_ids = &ff, .bias = &force, .n_bias = 1}, .stop_ids = two_stops,
                       .n_stop_ids = 2, .logprobs = -1};
    REQUIRE(serve_engine_submit(e, &sp, &j, &se) == 0);
    Said s = drain_all(j);
    CHECK(strcmp(s.finish, "stop") == 0 && !s.text[0] && s.completion == 1);
    said_free(&s);
    serve_job_release(j);
    /* a special token forced: in the text, or skipped */
    const int32_t special = f.m.cfg.bos_token_id;
    const char *special_text = tokenizer_token_text(f.tok, special);
    REQUIRE(special_text && special_text[0] == '<');
    for (int skip = 0; skip < 2; skip++) {
        ServeJobSpec q = {.prompt = prompt, .n_prompt = 5, .max_tokens = 3, .sampling = {0, 0, 1, 0},
                          .penalties = {.bias_ids = &special, .bias = &force, .n_bias = 1}, .stop_ids = &stop,
                          .n_stop_ids = 1, .skip_special = skip, .logprobs = -1};
        REQUIRE(serve_engine_submit(e, &q, &j, &se) == 0);
        s = drain_all(j);
        char three[64];
        snprintf(three, sizeof three, "%s%s%s", special_text, special_text, special_text);
        CHECK_MSG(strcmp(s.text, skip ? "" : three) == 0, "skip %d: \"%s\"", skip, s.text);
        said_free(&s);
        serve_job_release(j);
    }
    serve_engine_free(e);
    model_free(&f.m);
    tokenizer_free(f.tok);
}

/* ---- structured output ------------------------------------------------------------------------------------------ */

/* A mask that allows nothing, counting its states: the engine ends the choice ("length", no text) and closes each. */
static int masks_open;
static void *none_open(void *arg) { return __atomic_add_fetch(&masks_open, 1, __ATOMIC_SEQ_CST), arg; }
static int none_mask(void *st, float *logits, int V, long left, const int32_t *end, int n_end) { return 0; }
static int none_accept(void *st, int32_t tok) { return 0; }
static void none_close(void *st) { __atomic_sub_fetch(&masks_open, 1, __ATOMIC_SEQ_CST); }

TEST(serve_engine_structured_output) {
    ZyErr err = {{0}};
    Fixture f;
    REQUIRE(fixture(&f, &err) == 0);
    ServeEngineOpts o = {.max_batch = 4, .max_context = 96, .block_tokens = 4, .prefill_chunk = 5, .step_tokens = 12,
                         .max_queue = 16};
    ServeEngine *e;
    REQUIRE(serve_engine_create(&e, &f.m, f.tok, &o, &err) == 0);
    ServeStructured *ss = serve_structured_new(f.tok, f.m.cfg.vocab_size);
    REQUIRE(ss);
    ServeRequest r;
    ServeError se;
    REQUIRE(parse("{\"model\": \"m\", \"prompt\": \"x\", \"response_format\": {\"type\": \"json_schema\", \"json_schema\":"
                  " {\"name\": \"p\", \"schema\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"},"
                  " \"b\": {\"enum\": [\"one\", \"two\"]}, \"c\": {\"type\": \"array\", \"items\": {\"type\": "
                  "\"boolean\"}}}, \"required\": [\"a\", \"b\"]}}}}", SERVE_COMPLETION, &r, &se) == 0);
    ServeConstraint *c = NULL;
    CHECK(serve_constraint_new(ss, &r, 15, &c, &se) == -1 && strcmp(se.param, "max_tokens") == 0); /* 17 bytes least */
    REQUIRE(serve_constraint_new(ss, &r, 40, &c, &se) == 0 && c);
    const int32_t prompt[] = {1, 40, 41, 42}, stop = f.m.cfg.eos_token_id;
    for (int max_tokens = 17; max_tokens <= 40; max_tokens += 23) {
        ServeJobSpec sp = {.prompt = prompt, .n_prompt = 4, .max_tokens = max_tokens, .sampling = {1.0, 0, 1, 0},
                           .seed = 3, .stop_ids = &stop, .n_stop_ids = 1, .logprobs = -1, .n = 3,
                           .mask = &serve_constraint_ops, .mask_arg = c};
        ServeJob *jobs[3];
        REQUIRE(serve_engine_submit(e, &sp, jobs, &se) == 0);
        for (int k = 0; k < 3; k++) {
            Said s = drain_all(jobs[k]);
            cJSON *doc = cJSON_Parse(s.text);
            const cJSON *a = cJSON_GetObjectItemCaseSensitive(doc, "a"), *b = cJSON_GetObjectItemCaseSensitive(doc, "b");
            CHECK_MSG(cJSON_IsNumber(a) && a->valuedouble == floor(a->valuedouble) && cJSON_IsString(b) &&
                          (!strcmp(b->valuestring, "one") || !strcmp(b->valuestring, "two")) &&
                          strcmp(s.finish, "stop") == 0 && s.completion <= max_tokens,
                      "max_tokens %d choice %d: %s (%s, %d tokens)", max_tokens, k, s.text, s.finish, s.completion);
            cJSON_Delete(doc);
            said_free(&s);
            serve_job_release(jobs[k]);
        }
    }
    serve_constraint_release(c);
    serve_request_free(&r);
    /* nothing allowed: ends at once, every choice's state closed */
    static const ServeMaskOps none = {none_open, none_mask, none_accept, none_close};
    ServeJobSpec sp = {.prompt = prompt, .n_prompt = 4, .max_tokens = 8, .sampling = {1.0, 0, 1, 0}, .seed = 3,
                       .stop_ids = &stop, .n_stop_ids = 1, .logprobs = -1, .n = 2, .mask = &none, .mask_arg = &f};
    ServeJob *jobs[2];
    REQUIRE(serve_engine_submit(e, &sp, jobs, &se) == 0);
    for (int k = 0; k < 2; k++) {
        Said s = drain_all(jobs[k]);
        CHECK_MSG(strcmp(s.finish, "length") == 0 && s.completion == 0 && !s.text[0], "%s %d", s.finish, s.completion);
        said_free(&s);
        serve_job_release(jobs[k]);
    }
    serve_engine_free(e);
    CHECK(masks_open == 0);
    serve_structured_free(ss);
    model_free(&f.m);
    tokenizer_free(f.tok);
}

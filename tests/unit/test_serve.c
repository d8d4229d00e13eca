/* zaya serve without HTTP: the request parser's checks, UTF-8 repair, and the continuous-batching engine against
 * generate() — many requests of different lengths sharing a few slots give each its own greedy text; stop strings
 * cut the text; cancelling and shutting down free every KV block; a full queue and oversized requests are refused. */
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
                         .kv_memory = kvpool_block_bytes(&f.m.cfg, 8, 0) * 10};
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

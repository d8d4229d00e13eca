/* zaya reason: Markovian RSA (src/serve/reason.h) on one problem, on the serving engine in-process (the CPU). The
 * chosen trace goes to stdout; the per-round report (tokens generated, prefix-cache hits, wall time) and the answer
 * to stderr, or everything as one JSON object with --json. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "args.h"
#include "commands.h"
#include "model_args.h"
#include "infer/eval.h"
#include "io/model_io.h"
#include "jinja/jinja.h"
#include "serve/reason.h"
#include "serve/serve_engine.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

static void print_report(const RsaResult *r) {
    for (int k = 0; k < r->shape.rounds; k++) {
        const RsaRound *rd = &r->rounds[k];
        char hits[32];
        if (rd->prefix_cache_hits >= 0)
            snprintf(hits, sizeof hits, "%ld", rd->prefix_cache_hits);
        else
            snprintf(hits, sizeof hits, "n/a");
        fprintf(stderr, "round %d: %d traces, %ld tokens generated, %ld prompt tokens, prefix-cache hits %s, %.2f s "
                "(%.1f tokens/s)\n", k + 1, r->shape.population, rd->tokens_generated, rd->prompt_tokens, hits,
                rd->seconds, rd->seconds > 0 ? rd->tokens_generated / rd->seconds : 0.0);
    }
    const RsaTrace *c = rsa_chosen(r);
    fprintf(stderr, "answer: %s (%d of %d votes; trace %d of the last round)\n", c->answer ? c->answer : "(none)",
            r->votes, r->shape.population, r->chosen + 1);
}

int cmd_reason(int argc, char **argv) {
    const char *model_dir = NULL, *tok_path = NULL, *prompt = NULL, *messages = NULL, *template_path = NULL;
    const char *dtype = "auto", *kv_dtype = "auto";
    int population = 8, subset = 4, rounds = 3, tail = 1024, max_tokens = 512, max_context = 0, threads = 0;
    int json = 0;
    double temperature = -1, top_p = 1;
    uint64_t seed = 0;
    ArgSpec specs[] = {
        {"--model", ARG_STRING, 1, &model_dir, "model directory (config.json + safetensors)", 0},
        {"--tokenizer", ARG_STRING, 0, &tok_path, "tokenizer.json (default: the model directory's); its folder's "
                                                  "chat template renders --messages", 0},
        {"--prompt", ARG_STRING, 0, &prompt, "the problem as raw text (encoded with bos first, as zaya generate)", 0},
        {"--messages", ARG_STRING, 0, &messages, "instead of --prompt: a JSON list of chat messages; the last user "
                                                 "message is the problem (and holds the aggregation prompt in later "
                                                 "rounds)", 0},
        {"--population", ARG_INT, 0, &population, "N: traces per round (default 8)", 0},
        {"--subset", ARG_INT, 0, &subset, "K: traces of the last round each new trace aggregates (default 4)", 0},
        {"--rounds", ARG_INT, 0, &rounds, "T: rounds (default 3)", 0},
        {"--tail", ARG_INT, 0, &tail, "τ: the last tokens of each trace carried to the next round (default 1024)", 0},
        {"--template", ARG_STRING, 0, &template_path, "the aggregation prompt, a Jinja file over problem, candidates, "
                                                      "round, population (default: configs/rsa_aggregate.jinja's "
                                                      "text, built in)", 0},
        {"--max-tokens", ARG_INT, 0, &max_tokens, "tokens per trace at most (default 512)", 0},
        {"--temperature", ARG_FLOAT, 0, &temperature, "sampling temperature (default: generation_config.json's, "
                                                      "else 1)", 0},
        {"--top-p", ARG_FLOAT, 0, &top_p, "nucleus sampling (default 1)", 0},
        {"--seed", ARG_U64, 0, &seed, "seed of the samples and the subsets (default 0)", 0},
        {"--max-context", ARG_INT, 0, &max_context, "tokens per trace, prompt + output (default: the model's, at "
                                                    "most 4096)", 0},
        {"--dtype", ARG_STRING, 0, &dtype, "weights: auto, f32 or bf16", 0},
        {"--kv-dtype", ARG_STRING, 0, &kv_dtype, "KV cache: auto, f32 or bf16", 0},
        {"--threads", ARG_INT, 0, &threads, "OpenMP/BLAS threads (default: all cores)", 0},
        {"--json", ARG_SWITCH, 0, &json, "print the report with every trace as one JSON object on stdout", 0},
    };
    const int n = ZY_ARRAY_LEN(specs);
    if (args_help(argc, argv, 2, "reason", "--model DIR (--prompt TEXT | --messages FILE) --population N --subset K "
                                           "--rounds T --tail TOKENS [--template F.jinja] [--max-tokens N] "
                                           "[--temperature t] [--seed S] [--json]",
                  specs, n))
        return 0;
    ZyErr err = {{0}};
    ServeError se = {0};
    Model m;
    Tokenizer *tok = NULL;
    ChatConfig chat_cfg;
    ChatRenderer *chat = NULL;
    ServeEngine *eng = NULL;
    JinjaTemplate *tmpl = NULL;
    char *tmpl_text = NULL, *msgs_text = NULL, *chat_json = NULL, *problem = NULL;
    RsaResult res = {0};
    int rc = 1, have_model = 0, have_res = 0;
    char tok_file[PATH_MAX];
    if (args_parse(argc, argv, 2, specs, n, NULL, 0, NULL, "reason", &err)) goto fail;
    if (!prompt == !messages) {
        zy_fail(&err, "reason: give exactly one of --prompt and --messages");
        goto fail;
    }
    const ServeRsa shape = {.population = population, .subset = subset, .rounds = rounds, .tail = tail};
    if (rsa_shape_check(&shape, SERVE_RSA_MAX_POPULATION, "--", &se)) {
        zy_fail(&err, "reason: %s", se.message);
        goto fail;
    }
    if (max_tokens < 1) {
        zy_fail(&err, "reason: --max-tokens must be at least 1 (got %d)", max_tokens);
        goto fail;
    }
    if (template_path ? zy_read_text_file(template_path, &tmpl_text, &err) : 0) goto fail;
    const char *src = tmpl_text ? tmpl_text : RSA_DEFAULT_TEMPLATE;
    if (jinja_parse(src, strlen(src), &tmpl, &err)) {
        if (template_path) zy_wrap(&err, "reason: --template %s", template_path);
        goto fail;
    }
    if (!tok_path) {
        if (zy_path_join(tok_file, sizeof tok_file, model_dir, "tokenizer.json", &err)) goto fail;
        tok_path = tok_file;
    }
    if (messages) { /* {"messages": [...]}, as a chat request holds them */
        if (zy_read_text_file(messages, &msgs_text, &err)) goto fail;
        size_t l = strlen(msgs_text);
        if (!(chat_json = malloc(l + 16))) {
            zy_fail(&err, "out of memory");
            goto fail;
        }
        snprintf(chat_json, l + 16, "{\"messages\":%s}", msgs_text);
        if (rsa_chat_problem(chat_json, &problem, &se)) {
            zy_fail(&err, "reason: --messages %s: %s", messages, se.message);
            goto fail;
        }
        if (chat_config_load(tok_path, &chat_cfg, &err)) goto fail;
        const int bad = chat_renderer_new(&chat_cfg, &chat, &err);
        chat_config_free(&chat_cfg);
        if (bad) goto fail;
    }
    GenerationConfig gen;
    if (generation_config_load(&gen, model_dir, &err)) goto fail;
    ModelArgs ma = {.command = "reason", .dir = model_dir, .dtype = dtype, .device = "cpu", .kv_dtype = kv_dtype};
    if (model_args_device(&ma, &err) || model_args_dtype(&ma, &err) || model_args_kv_dtype(&ma, &err) ||
        model_args_load(&ma, &m, &err))
        goto fail;
    have_model = 1;
    if (model_args_tokenizer(&ma, tok_path, &m, &tok, &err)) goto fail;
    if (!max_context) max_context = m.cfg.max_position_embeddings < 4096 ? m.cfg.max_position_embeddings : 4096;
    /* a round is one batch: N slots */
    ServeEngineOpts eo = {.max_batch = population, .max_context = max_context, .block_tokens = 16,
                          .prefill_chunk = 64, .max_queue = population, .threads = threads, .kv_bf16 = ma.kv_bf16};
    if (serve_engine_create(&eng, &m, tok, &eo, &err)) goto fail;
    EvalTokenizer et = {0};
    eval_tokenizer_from(&et, tok, &m.cfg);
    int32_t stops[GEN_MAX_STOPS];
    const int n_stops = generation_stop_ids(stops, m.cfg.eos_token_id, et.eos_id, &gen);
    if (temperature < 0) /* as zaya serve's default: generation_config.json's, else 1 */
        temperature = gen.present && !(gen.has_do_sample && gen.do_sample) ? 0.0
                      : gen.present && gen.has_temperature                 ? gen.temperature
                                                                           : 1.0;
    RsaEncoder enc = {.tok = tok, .chat = chat, .chat_json = chat_json, .bos_id = et.bos_id};
    RsaPrompter pr = {.ctx = &enc, .encode = rsa_encode};
    RsaOpts ro = {.shape = shape, .aggregate = tmpl, .tok = tok, .max_tokens = max_tokens, .max_context = max_context,
                  .base = {.sampling = {.temperature = temperature, .top_p = top_p}, .stop_ids = stops,
                           .n_stop_ids = n_stops},
                  .seed = seed, .keep_prompts = json, .field_prefix = "--"};
    if (rsa_run(eng, &ro, &pr, problem ? problem : prompt, &res, &se)) {
        zy_fail(&err, "reason: %s", se.message);
        goto fail;
    }
    have_res = 1;
    if (json) {
        cJSON *o = rsa_report_json(&res, 1);
        cJSON_AddStringToObject(o, "text", rsa_chosen(&res)->text);
        char *s = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        if (!s) {
            zy_fail(&err, "out of memory");
            goto fail;
        }
        printf("%s\n", s);
        free(s);
    } else {
        print_report(&res);
        printf("%s\n", rsa_chosen(&res)->text);
    }
    rc = 0;
fail:
    if (rc) fprintf(stderr, "zaya: %s\n", err.msg);
    if (have_res) rsa_result_free(&res);
    serve_engine_free(eng);
    jinja_free(tmpl);
    chat_renderer_free(chat);
    tokenizer_free(tok);
    if (have_model) model_free(&m);
    free(tmpl_text);
    free(msgs_text);
    free(chat_json);
    free(problem);
    return rc;
}

/* zaya serve: an OpenAI-compatible HTTP server over continuous batching (src/serve/). SIGTERM or SIGINT: stop
 * accepting, let running requests finish for up to --grace-seconds (then cancel them), exit 0. */
#include <ctype.h>
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "args.h"
#include "tokenizer/chat_template.h"
#include "commands.h"
#include "model_args.h"
#include "gpu/gpu.h"
#include "gpu/gpu_decode.h"
#include "gpu/gpu_model.h"
#include "infer/eval.h"
#include "infer/prefix_cache.h"
#include "model/model.h"
#include "io/model_io.h"
#include "serve/serve_engine.h"
#include "serve/serve_http.h"
#include "serve/serve_tools.h"
#include "tokenizer/tokenizer.h"

/* "512M", "4G", "1.5GiB", "1000000" → bytes. */
static int parse_bytes(const char *s, size_t *out, ZyErr *err) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || !(v > 0)) return zy_fail(err, "serve: --kv-memory \"%s\" is not a size (e.g. 4G, 512M)", s);
    while (isspace((unsigned char)*end)) end++;
    double mul = 1;
    switch (toupper((unsigned char)*end)) {
    case 0: break;
    case 'K': mul = 1024.0; break;
    case 'M': mul = 1024.0 * 1024; break;
    case 'G': mul = 1024.0 * 1024 * 1024; break;
    case 'T': mul = 1024.0 * 1024 * 1024 * 1024; break;
    default: return zy_fail(err, "serve: --kv-memory \"%s\": unknown unit (use K, M, G or T)", s);
    }
    if (*end) {
        end++;
        if (strcasecmp(end, "ib") != 0 && strcasecmp(end, "b") != 0 && *end)
            return zy_fail(err, "serve: --kv-memory \"%s\": unknown unit (use K, M, G or T)", s);
    }
    if (v * mul > 1e15) return zy_fail(err, "serve: --kv-memory \"%s\" is too large", s);
    *out = (size_t)(v * mul);
    return 0;
}

/* The engine's GPU backend (serve_engine.h): gpu_decode.h's block pool and ragged step over the model on the GPU. */
typedef struct {
    GpuModel *gm;
    GpuKVPool *pool;
    PrefixCache pc; /* pc.blocks is NULL until asked for */
} GpuServe;
static int gpu_step(void *x, const DecodeSeq *seqs, int n_seqs, const int32_t *tokens, float *logits, ZyErr *err) {
    GpuServe *g = x;
    return gpu_model_decode_step(g->gm, g->pool, seqs, n_seqs, tokens, logits, err);
}
static int gpu_reserve(void *x, int slot, int tokens) { return gpu_kvpool_reserve(((GpuServe *)x)->pool, slot, tokens); }
static void gpu_seq_reset(void *x, int slot) { gpu_kvpool_seq_reset(((GpuServe *)x)->pool, slot); }
static void gpu_seq_release(void *x, int slot) { gpu_kvpool_seq_release(((GpuServe *)x)->pool, slot); }
static int gpu_seq_len(void *x, int slot) { return gpu_kvpool_len(((GpuServe *)x)->pool, slot); }
static int gpu_n_free(void *x) { return gpu_kvpool_free_blocks(((GpuServe *)x)->pool); }
static int gpu_fork(void *x, int parent, int child) { return gpu_kvpool_fork(((GpuServe *)x)->pool, parent, child); }
static int gpu_share(void *pool, int slot, const int32_t *blocks, int n) {
    return gpu_kvpool_seq_share(pool, slot, blocks, n);
}
static PrefixCache *gpu_prefix_cache(void *x, ZyErr *err) {
    GpuServe *g = x;
    if (!g->pc.blocks && (gpu_kvpool_keep_block_states(g->pool, err) ||
                          prefix_cache_init(&g->pc, gpu_kvpool_blocks(g->pool), gpu_share, g->pool, err)))
        return NULL;
    return &g->pc;
}
static void gpu_destroy(void *x) {
    GpuServe *g = x;
    prefix_cache_free(&g->pc);
    gpu_kvpool_free(g->pool);
    free(g);
}

/* arg: the GpuModel (it outlives the engine). */
static int gpu_open_backend(ServeBackend *be, void *arg, const Model *m, int max_seqs, int max_len, int n_blocks,
                            int block_tokens, int max_rows, int chunk, int kv_bf16, ZyErr *err) {
    GpuServe *g = calloc(1, sizeof *g);
    if (!g) return zy_fail(err, "out of memory");
    g->gm = arg;
    if (gpu_kvpool_create_kv(&g->pool, g->gm, max_seqs, max_len, n_blocks, block_tokens, max_rows, chunk, kv_bf16,
                             err)) {
        free(g);
        return -1;
    }
    *be = (ServeBackend){.ctx = g, .step = gpu_step, .reserve = gpu_reserve, .seq_reset = gpu_seq_reset,
                         .seq_release = gpu_seq_release, .seq_len = gpu_seq_len, .n_free = gpu_n_free,
                         .destroy = gpu_destroy, .fork = gpu_fork, .all_logits = 1,
                         .prefix_cache = gpu_prefix_cache};
    return 0;
}

int cmd_serve(int argc, char **argv) {
    const char *model_dir = NULL, *tok_path = NULL, *host = "127.0.0.1", *device = "cpu", *dtype = "auto";
    const char *kv_memory = NULL, *api_key = NULL, *model_name = NULL, *kv_dtype = "auto", *chat_template = NULL;
    const char *tool_parser = "auto";
    int port = 8080, max_batch = 32, max_context = 0, block_tokens = 16, prefill_chunk = 64, step_tokens = 0;
    int max_queue = 256, max_connections = 1024, threads = 0, no_prefix_cache = 0;
    double grace = 10;
    ArgSpec specs[] = {
        {"--model", ARG_STRING, 1, &model_dir, "model directory (config.json + safetensors)", 0},
        {"--tokenizer", ARG_STRING, 0, &tok_path, "tokenizer.json or its folder (default: the model directory's); its "
                                                  "folder's chat template serves /v1/chat/completions", 0},
        {"--chat-template", ARG_STRING, 0, &chat_template, "a Jinja chat template file for /v1/chat/completions "
                                                           "instead of the tokenizer folder's (which may have none; "
                                                           "the special tokens stay the folder's)", 0},
        {"--tool-call-parser", ARG_STRING, 0, &tool_parser, "how the model writes tool calls, parsed into tool_calls: "
                                                           "auto (default: the format the chat template writes), "
                                                           "zaya_xml, qwen3_coder, hermes, or none", 0},
        {"--host", ARG_STRING, 0, &host, "IPv4 address to listen on (default 127.0.0.1; 0.0.0.0 for all)", 0},
        {"--port", ARG_INT, 0, &port, "port (default 8080; 0 = any free port, printed at start)", 0},
        {"--device", ARG_STRING, 0, &device, "cpu (default), cuda or cuda:N (the model, the KV pool and the steps on "
                                            "the GPU; --kv-memory is then GPU memory; --dtype bf16 = bf16 products)", 0},
        {"--dtype", ARG_STRING, 0, &dtype, "weights: auto (default: a quantized folder's q8/q4, bf16 if the model stores bf16 matrices, else f32), f32, bf16, or q8/q4 (a quantized folder's codes read in place)", 0},
        {"--kv-dtype", ARG_STRING, 0, &kv_dtype, "KV cache: auto (default: bf16 with bf16 or quantized weights, "
                                                 "else f32), f32 or bf16 (half the memory per token)", 0},
        {"--max-batch", ARG_INT, 0, &max_batch, "sequences decoded together (default 32)", 0},
        {"--max-context", ARG_INT, 0, &max_context, "tokens per request, prompt + completion (default: the model's "
                                                    "max_position_embeddings, at most 4096)", 0},
        {"--kv-memory", ARG_STRING, 0, &kv_memory, "bytes for the KV-cache block pool, e.g. 2G (default: max-batch "
                                                   "full-context sequences)", 0},
        {"--block-tokens", ARG_INT, 0, &block_tokens, "tokens per KV-cache block (default 16)", 0},
        {"--prefill-chunk", ARG_INT, 0, &prefill_chunk, "prompt tokens per request per step (default 64)", 0},
        {"--step-tokens", ARG_INT, 0, &step_tokens, "token rows per step in all (default max-batch + 4 x prefill-chunk)", 0},
        {"--no-prefix-cache", ARG_SWITCH, 0, &no_prefix_cache, "compute every prompt in full (default: full KV blocks "
                                                               "are kept after a request and reused by prompts that "
                                                               "start with the same tokens)", 0},
        {"--max-queue", ARG_INT, 0, &max_queue, "requests that may wait for a slot; more get 503 (default 256)", 0},
        {"--threads", ARG_INT, 0, &threads, "OpenMP/BLAS threads for decoding (default: all cores; on a machine "
                                            "shared with other work, fewer can be faster)", 0},
        {"--max-connections", ARG_INT, 0, &max_connections, "open HTTP connections at most (default 1024)", 0},
        {"--api-key", ARG_STRING, 0, &api_key, "require 'Authorization: Bearer KEY' on /v1/ (default: "
                                               "$ZAYA_API_KEY if set, else none)", 0},
        {"--model-name", ARG_STRING, 0, &model_name, "the model id clients use (default: the directory's name)", 0},
        {"--grace-seconds", ARG_FLOAT, 0, &grace, "on SIGTERM, how long running requests may finish (default 10)", 0},
    };
    const int n = ZY_ARRAY_LEN(specs);
    if (args_help(argc, argv, 2, "serve", "--model DIR [--tokenizer F] [--chat-template F.jinja] [--tool-call-parser "
                                          "NAME] [--host 127.0.0.1 "
                                          "--port 8080] [--max-batch N --max-context T --kv-memory BYTES] [--api-key K]",
                  specs, n))
        return 0;
    ZyErr err = {{0}};
    Model m;
    Tokenizer *tok = NULL;
    ChatConfig chat_cfg;
    ChatRenderer *chat = NULL;
    ServeEngine *eng = NULL;
    ServeHttp *http = NULL;
    GpuModel *gm = NULL;
    int rc = 1, have_model = 0;
    size_t kv_bytes = 0;
    char tok_file[PATH_MAX];
    if (args_parse(argc, argv, 2, specs, n, NULL, 0, NULL, "serve", &err)) goto fail;
    ModelArgs ma = {.command = "serve", .dir = model_dir, .dtype = dtype, .device = device, .kv_dtype = kv_dtype};
    if (model_args_device(&ma, &err)) goto fail;
    if (ma.gpu && !gpu_compiled()) { /* said before a long model load */
        zy_fail(&err, "serve: --device %s: this zaya was built without GPU support (build on a machine with CUDA's "
                "nvcc and without CUDA=0), so it serves on the CPU only (--device cpu)", device);
        goto fail;
    }
    if (kv_memory && parse_bytes(kv_memory, &kv_bytes, &err)) goto fail;
    const ToolFormat *tool_format = tool_format_find(tool_parser);
    const int tools_auto = strcmp(tool_parser, "auto") == 0;
    if (!tool_format && !tools_auto && strcmp(tool_parser, "none") != 0) {
        zy_fail(&err, "serve: --tool-call-parser %s: unknown (auto, %s or none)", tool_parser, tool_format_names());
        goto fail;
    }
    if (!api_key) api_key = getenv("ZAYA_API_KEY");
    if (api_key && !*api_key) api_key = NULL;
    /* the tokenizer: the flag, else the model folder's */
    if (!tok_path) {
        if (zy_path_join(tok_file, sizeof tok_file, model_dir, "tokenizer.json", &err)) goto fail;
        if (access(tok_file, R_OK) != 0) {
            zy_fail(&err, "serve: %s has no tokenizer.json; give --tokenizer FILE", model_dir);
            goto fail;
        }
        tok_path = tok_file;
    }
    GenerationConfig gen;
    if (generation_config_load(&gen, model_dir, &err)) goto fail;
    if (model_args_dtype(&ma, &err) || model_args_kv_dtype(&ma, &err) || model_args_load(&ma, &m, &err)) goto fail;
    have_model = 1;
    model_args_print_quant(&ma, &m);
    if (ma.gpu && gpu_model_create(&gm, &m, ma.gpu_index, 1, 1, ma.bf16, 0, &err)) {
        zy_wrap(&err, "serve"); /* the GPU's message names --device */
        goto fail;
    }
    if (model_args_tokenizer(&ma, tok_path, &m, &tok, &err)) goto fail;
    if ((chat_template ? chat_config_load_template(tok_path, chat_template, &chat_cfg, &err)
                       : chat_config_load(tok_path, &chat_cfg, &err)) == 0) {
        if (tools_auto) /* the format the template writes calls in (its tool_use template's, if it has one) */
            tool_format = tool_format_of_template(chat_cfg.tool_source ? chat_cfg.tool_source : chat_cfg.source);
        int bad = chat_renderer_new(&chat_cfg, &chat, &err);
        chat_config_free(&chat_cfg);
        if (bad) {
            if (chat_template) zy_wrap(&err, "serve: --chat-template %s", chat_template);
            goto fail;
        }
    } else if (chat_template) {
        zy_wrap(&err, "serve: --chat-template %s", chat_template);
        goto fail;
    } else if (!strstr(err.msg, "no chat template")) {
        goto fail;
    } else {
        fprintf(stderr, "zaya serve: %s: /v1/chat/completions will answer 400\n", err.msg);
        err.msg[0] = 0;
    }
    if (!max_context) max_context = m.cfg.max_position_embeddings < 4096 ? m.cfg.max_position_embeddings : 4096;
    ServeEngineOpts eo = {.max_batch = max_batch, .max_context = max_context, .kv_memory = kv_bytes,
                          .block_tokens = block_tokens, .prefill_chunk = prefill_chunk, .step_tokens = step_tokens,
                          .max_queue = max_queue, .threads = threads, .kv_bf16 = ma.kv_bf16,
                          .no_prefix_cache = no_prefix_cache};
    /* every thread started from here on inherits the blocked signals; this one waits for them */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN); /* a client gone mid-write is an error return, not a signal */
    if (ma.gpu ? serve_engine_create_with(&eng, &m, tok, &eo, gpu_open_backend, gm, &err)
               : serve_engine_create(&eng, &m, tok, &eo, &err))
        goto fail;
    EvalTokenizer et = {0};
    eval_tokenizer_from(&et, tok, &m.cfg);
    int32_t stops[GEN_MAX_STOPS];
    const int n_stops = generation_stop_ids(stops, m.cfg.eos_token_id, et.eos_id, &gen);
    /* defaults for requests that set nothing: generation_config.json as transformers reads it, else OpenAI's */
    const int sample = gen.present && gen.has_do_sample && gen.do_sample;
    double temperature = gen.present ? (!sample ? 0.0 : gen.has_temperature ? gen.temperature : 1.0) : 1.0;
    double top_p = gen.present && gen.has_top_p ? gen.top_p : 1.0;
    int top_k = gen.present && gen.has_top_k ? gen.top_k : 0;
    char name_buf[PATH_MAX];
    if (!model_name) {
        snprintf(name_buf, sizeof name_buf, "%s", model_dir);
        size_t l = strlen(name_buf);
        while (l > 1 && name_buf[l - 1] == '/') name_buf[--l] = 0;
        model_name = basename(name_buf);
    }
    ServeEngineOpts got;
    int n_blocks;
    size_t block_bytes;
    serve_engine_info(eng, &got, &n_blocks, &block_bytes);
    ServeHttpOpts ho = {.host = host, .port = port, .api_key = api_key, .model_name = model_name,
                        .max_connections = max_connections, .tok = tok, .chat = chat, .bos_id = et.bos_id,
                        .stop_ids = stops, .n_stop_ids = n_stops, .temperature = temperature, .top_p = top_p,
                        .top_k = top_k, .max_context = got.max_context, .vocab_size = m.cfg.vocab_size,
                        .tool_format = tool_format};
    if (serve_http_start(&http, eng, &ho, &err)) goto fail;
    const int per_seq = (got.max_context + got.block_tokens - 1) / got.block_tokens;
    fprintf(stderr,
            "zaya serve: model %s (%s, %s), tokenizer %s, chat template %s, tool calls %s\n"
            "zaya serve: batch %d, context %d, KV pool %d blocks x %d tokens = %.1f MiB (%s, %zu bytes per token: %d "
            "full-context requests at once), prefill chunk %d, step %d rows, queue %d, %d threads, prefix cache %s\n",
            model_name, model_dir, model_args_dtype_name(&ma), tok_path, chat ? "yes" : "none",
            tool_format ? tool_format->name : "not parsed", got.max_batch,
            got.max_context, n_blocks, got.block_tokens, n_blocks * (double)block_bytes / 1048576.0,
            ma.kv_bf16 ? "bf16" : "f32", kvcache_bytes_per_token(&m.cfg, ma.kv_bf16), n_blocks / per_seq, got.prefill_chunk,
            got.step_tokens, got.max_queue,
            got.threads > 0 ? got.threads : omp_get_max_threads(),
            !got.no_prefix_cache ? "on (each block also keeps the CCA state at its end)"
            : no_prefix_cache    ? "off (--no-prefix-cache)"
                                 : "off (not on this device)");
    if (ma.gpu) fprintf(stderr, "zaya serve: device GPU %s (the KV pool in GPU memory)\n", gpu_model_device(gm));
    /* the one line scripts wait for */
    printf("zaya serve: listening on http://%s:%d\n", host, serve_http_port(http));
    fflush(stdout);
    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "zaya serve: %s: no new requests; running ones get up to %g s to finish\n",
            sig == SIGTERM ? "SIGTERM" : "SIGINT", grace);
    serve_http_quiesce(http);
    serve_engine_shutdown(eng, grace);
    /* every generation has ended (finished, or cancelled at the deadline); stopping the daemon now would cut the
     * streams whose last events and [DONE] are not yet written, so let them drain first */
    const int unfinished = serve_http_drain(http, 10);
    if (unfinished) fprintf(stderr, "zaya serve: %d answers still unsent after 10 s: closing them\n", unfinished);
    serve_http_stop(http);
    http = NULL;
    fprintf(stderr, "zaya serve: stopped\n");
    rc = 0;
fail:
    if (rc) fprintf(stderr, "zaya: %s\n", err.msg);
    serve_http_stop(http);
    serve_engine_free(eng); /* before the GPU model its pool lives on */
    gpu_model_free(gm);
    chat_renderer_free(chat);
    tokenizer_free(tok);
    if (have_model) model_free(&m);
    return rc;
}

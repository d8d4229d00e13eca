/* zaya generate: prefill a prompt, then cached decoding with sampling; text streams to stdout as it is produced. */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "tokenizer/chat_template.h"
#include "commands.h"
#include "model_args.h"
#include "infer/decode.h"
#include "infer/eval.h"
#include "gpu/gpu_decode.h"
#include "model/model.h"
#include "io/model_io.h"
#include "infer/sampling.h"
#include "tokenizer/tokenizer.h"

/* "1 2 3" or "1,2,3" → ids (malloc'ed). */
static int parse_ids(const char *text, int32_t **out, int *n_out, ZyErr *err) {
    size_t cap = 16, n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids) return zy_fail(err, "out of memory");
    const char *p = text;
    for (;;) {
        while (*p == ',' || isspace((unsigned char)*p)) p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX || (*end && *end != ',' && !isspace((unsigned char)*end))) {
            free(ids);
            return zy_fail(err, "generate: --prompt with --ids must be token ids separated by spaces or commas "
                                "(bad \"%.20s\")", p);
        }
        if (n == cap) {
            int32_t *grown = realloc(ids, (cap *= 2) * sizeof *ids);
            if (!grown) {
                free(ids);
                return zy_fail(err, "out of memory");
            }
            ids = grown;
        }
        ids[n++] = (int32_t)v;
        p = end;
    }
    if (n == 0) {
        free(ids);
        return zy_fail(err, "generate: empty prompt");
    }
    *out = ids;
    *n_out = (int)n;
    return 0;
}

typedef struct {
    int first;
} IdsOut;

static int print_id(void *ctx, int32_t tok, ZyErr *err) {
    IdsOut *o = ctx;
    printf(o->first ? "%d" : " %d", tok);
    o->first = 0;
    fflush(stdout);
    return 0;
}

/* Streams each token's bytes as it comes (byte-level BPE decodes token by token, concatenated); eos prints nothing. */
typedef struct {
    const Tokenizer *tok;
    int32_t eos;
} TextOut;

static int print_text(void *ctx, int32_t tok, ZyErr *err) {
    TextOut *o = ctx;
    if (tok == o->eos) return 0;
    char *bytes = NULL;
    size_t len = 0;
    if (tokenizer_decode(o->tok, &tok, 1, &bytes, &len, err)) return -1;
    fwrite(bytes, 1, len, stdout);
    fflush(stdout);
    free(bytes);
    return 0;
}

static const char *stop_reason(GenStop s) {
    switch (s) {
    case GEN_STOP_EOS: return "end of sequence";
    case GEN_STOP_CALLBACK: return "stop requested";
    case GEN_STOP_CACHE_FULL: return "context full";
    case GEN_STOP_MAX_TOKENS: break;
    }
    return "max tokens";
}

static void print_stats(const GenerateStats *st, size_t cache_bytes, int max_len, const ZayaConfig *cfg, int kv_bf16) {
    fprintf(stderr, "prompt tokens     %d\n", st->n_prompt);
    fprintf(stderr, "generated tokens  %d (stopped: %s)\n", st->n_generated, stop_reason(st->stop));
    fprintf(stderr, "prefill           %.4f s (%.1f tokens/s)\n", st->prefill_s,
            st->prefill_s > 0 ? st->n_prompt / st->prefill_s : 0.0);
    const int steps = st->n_generated > 0 ? st->n_generated - 1 : 0;
    fprintf(stderr, "decode            %.1f tokens/s (%d steps in %.4f s)\n", st->decode_s > 0 ? steps / st->decode_s : 0.0,
            steps, st->decode_s);
    fprintf(stderr, "KV cache          %zu bytes per token (k+v %s, %d layers), %zu bytes in all for %d tokens "
                    "(with the conv/value state)\n",
            kvcache_bytes_per_token(cfg, kv_bf16), kv_bf16 ? "bf16" : "f32", cfg->num_layers, cache_bytes, max_len);
}

int cmd_generate(int argc, char **argv) {
    const char *model_dir = NULL, *tok_path = NULL, *prompt = NULL, *messages = NULL, *dtype = "auto", *device = "cpu";
    const char *kv_dtype = "auto";
    /* sampling flags start unset (NAN, INT_MIN): a flag wins, then the model's generation_config.json, then zaya's
     * defaults; a bad value given as a flag still fails sampling_validate */
    int max_tokens = 128, top_k = INT_MIN, ids_mode = 0;
    double temperature = NAN, top_p = NAN;
    uint64_t seed = 0;
    ArgSpec specs[] = {
        {"--model", ARG_STRING, 1, &model_dir, "model directory (config.json + model.safetensors)", 0},
        {"--tokenizer", ARG_STRING, 0, &tok_path, "tokenizer file (required unless --ids)", 0},
        {"--prompt", ARG_STRING, 0, &prompt, "prompt text (with --ids: token ids, e.g. \"2 17 5\")", 0},
        {"--messages", ARG_STRING, 0, &messages, "instead of --prompt: a JSON list of chat messages, rendered with the "
                                                 "tokenizer folder's chat template (add_generation_prompt=true)", 0},
        {"--max-tokens", ARG_INT, 0, &max_tokens, "tokens to generate at most (default 128)", 0},
        {"--temperature", ARG_FLOAT, 0, &temperature, "sampling temperature, 0 = greedy (default: generation_config.json, else 0.8)", 0},
        {"--top-k", ARG_INT, 0, &top_k, "keep the k most likely tokens, 0 = off (default: generation_config.json, else 0)", 0},
        {"--top-p", ARG_FLOAT, 0, &top_p, "nucleus sampling mass, 1 = off (default: generation_config.json, else 0.95)", 0},
        {"--seed", ARG_U64, 0, &seed, "sampling seed (default 0)", 0},
        {"--ids", ARG_SWITCH, 0, &ids_mode, "token ids in and out, no tokenizer (no bos is added)", 0},
        {"--dtype", ARG_STRING, 0, &dtype, "weights: auto (default: a quantized folder's q8/q4, bf16 if the model stores bf16 matrices, else f32), f32, bf16 "
                                           "(matrices in bf16, read in place from the mapped files when stored bf16), or q8/q4 "
                                           "(a quantized folder's codes read in place)", 0},
        {"--device", ARG_STRING, 0, &device, "cpu (default), cuda or cuda:N (on a GPU, --dtype bf16 = bf16 products)", 0},
        {"--kv-dtype", ARG_STRING, 0, &kv_dtype, "KV cache: auto (default: bf16 with bf16 or quantized weights, else "
                                                 "f32), f32 or bf16 (as zaya serve's)", 0},
    };
    const int n = ZY_ARRAY_LEN(specs);
    if (args_help(argc, argv, 2, "generate",
                  "--model DIR (--tokenizer T | --ids) (--prompt TEXT | --messages FILE.json) [--max-tokens N] [--temperature t] "
                  "[--top-k k] [--top-p p] [--seed s] [--dtype auto|f32|bf16|q8|q4] [--kv-dtype auto|f32|bf16] [--device cpu|cuda]",
                  specs, n))
        return 0;
    ZyErr err = {{0}};
    Model m;
    KVCache c;
    GpuModel *gm = NULL;
    GpuKVCache *gc = NULL;
    Sampler smp;
    Tokenizer *tok = NULL;
    int32_t *ids = NULL;
    int n_ids = 0, rc = 1, have_model = 0, have_cache = 0, have_sampler = 0;
    SamplingParams sp;
    GenerationConfig gen;
    if (args_parse(argc, argv, 2, specs, n, NULL, 0, NULL, "generate", &err)) goto fail;
    ModelArgs ma = {.command = "generate", .dir = model_dir, .dtype = dtype, .device = device, .kv_dtype = kv_dtype};
    if (generation_config_load(&gen, model_dir, &err)) goto fail;
    if (gen.present) { /* as transformers' GenerationConfig: greedy unless do_sample; its defaults 1.0, 50, 1.0 */
        const int sample = gen.has_do_sample && gen.do_sample;
        if (isnan(temperature)) temperature = !sample ? 0.0 : gen.has_temperature ? gen.temperature : 1.0;
        if (top_k == INT_MIN) top_k = gen.has_top_k ? gen.top_k : 50;
        if (isnan(top_p)) top_p = gen.has_top_p ? gen.top_p : 1.0;
    }
    if (isnan(temperature)) temperature = 0.8;
    if (top_k == INT_MIN) top_k = 0;
    if (isnan(top_p)) top_p = 0.95;
    sp = (SamplingParams){temperature, top_k, top_p, 0};
    if (sampling_validate(&sp, &err)) {
        zy_wrap(&err, "generate");
        goto fail;
    }
    if (max_tokens < 0) {
        zy_fail(&err, "generate: --max-tokens must be >= 0 (got %d)", max_tokens);
        goto fail;
    }
    if (!ids_mode && !tok_path) {
        zy_fail(&err, "generate: give --tokenizer (or --ids to pass token ids)");
        goto fail;
    }
    if (!prompt == !messages || (messages && ids_mode)) {
        zy_fail(&err, "generate: give exactly one of --prompt and --messages (--messages needs a tokenizer, not --ids)");
        goto fail;
    }
    if (model_args_dtype(&ma, &err) || model_args_device(&ma, &err) || model_args_kv_dtype(&ma, &err)) goto fail;
    if (ids_mode && parse_ids(prompt, &ids, &n_ids, &err)) goto fail;
    if (model_args_load(&ma, &m, &err)) goto fail;
    have_model = 1;
    if (ma.bf16) {
        size_t mapped, copied;
        model_weight_bytes(&m, &mapped, &copied);
        fprintf(stderr, "weights           bf16 (matrices in bf16; vectors, activations and sums in fp32): %.1f MB used in "
                        "place from the mapped files, %.1f MB copied\n", mapped / 1e6, copied / 1e6);
    }
    model_args_print_quant(&ma, &m);
    EvalTokenizer et = {0};
    if (!ids_mode) {
        if (model_args_tokenizer(&ma, tok_path, &m, &tok, &err)) goto fail;
        eval_tokenizer_from(&et, tok, &m.cfg);
        int32_t *body = NULL;
        size_t n_body = 0, text_len = prompt ? strlen(prompt) : 0;
        /* a chat is rendered, then encoded without special tokens: apply_chat_template(tokenize=True) does the
         * same, since the template writes its own bos */
        char *chat = NULL;
        if (messages && chat_render_messages_file(tok_path, messages, &chat, &text_len, &err)) goto fail;
        int enc = tokenizer_encode(tok, chat ? chat : prompt, text_len, &body, &n_body, &err);
        free(chat);
        if (enc) goto fail;
        const int has_bos = !messages && et.bos_id >= 0;
        ids = malloc(sizeof(int32_t) * (n_body + 1));
        if (!ids || n_body + has_bos == 0 || n_body > (size_t)1 << 30) {
            free(body);
            zy_fail(&err, ids ? "generate: empty prompt" : "out of memory");
            goto fail;
        }
        if (has_bos) ids[0] = et.bos_id;
        if (n_body) memcpy(ids + has_bos, body, sizeof(int32_t) * n_body);
        free(body);
        n_ids = (int)n_body + has_bos;
    }
    if (model_check_tokens(&m, ids, 1, n_ids, &err)) {
        zy_wrap(&err, "generate: prompt");
        goto fail;
    }
    /* the last generated token is never fed back, so the context needs n_prompt + max_tokens - 1 slots */
    long need = (long)n_ids + (max_tokens > 0 ? max_tokens - 1 : 0);
    int max_len = need < m.cfg.max_position_embeddings ? (int)need : m.cfg.max_position_embeddings;
    if (ma.gpu) {
        if (gpu_model_create(&gm, &m, ma.gpu_index, 1, 1, ma.bf16, 0, &err) ||
            gpu_kvcache_create_kv(&gc, gm, 1, max_len, 0, ma.kv_bf16, &err))
            goto fail;
        fprintf(stderr, "device            GPU %s\n", gpu_model_device(gm));
    } else {
        if (kvcache_create_kv(&c, &m.cfg, 1, max_len, KV_DEFAULT_CHUNK, ma.kv_bf16, &err)) goto fail;
        have_cache = 1;
    }
    if (sampler_create(&smp, m.cfg.vocab_size, &err)) goto fail;
    have_sampler = 1;
    if (tok) smp.n_allowed = tokenizer_vocab_size(tok); /* never sample an id the tokenizer cannot decode */
    ZyRng rng;
    zy_rng_seed(&rng, seed);
    /* stop at the config's eos, and in text mode at the tokenizer's too */
    int32_t stops[GEN_MAX_STOPS];
    const int n_stops = generation_stop_ids(stops, m.cfg.eos_token_id, ids_mode ? -1 : et.eos_id, &gen);
    IdsOut ids_out = {1};
    TextOut text_out = {tok, et.eos_id};
    GenerateStats st;
    if (gen.present) /* said once everything is checked, so an error stays the first line */
        fprintf(stderr, "sampling          temperature %g, top-k %d, top-p %g (flags, then %s/generation_config.json)\n",
                sp.temperature, sp.top_k, sp.top_p, model_dir);
    GenerateTokenFn out_fn = ids_mode ? print_id : print_text;
    void *out_ctx = ids_mode ? (void *)&ids_out : (void *)&text_out;
    if (ma.gpu ? gpu_generate(gm, gc, &smp, &sp, &rng, ids, n_ids, max_tokens, stops, n_stops, out_fn, out_ctx, &st, &err)
               : generate(&m, &c, &smp, &sp, &rng, ids, n_ids, max_tokens, stops, n_stops, out_fn, out_ctx, &st, &err))
        goto fail;
    printf("\n");
    fflush(stdout);
    print_stats(&st, ma.gpu ? gpu_kvcache_bytes(gc) : c.cache_bytes, max_len, &m.cfg, ma.kv_bf16);
    const double peak = zy_peak_resident_bytes();
    if (peak > 0)
        fprintf(stderr, "peak memory       %.2f GB resident at most (VmHWM: weights' file pages touched, KV cache, "
                        "scratch)\n", peak / 1e9);
    rc = 0;
fail:
    if (rc) fprintf(stderr, "zaya: %s\n", err.msg);
    free(ids);
    if (have_sampler) sampler_free(&smp);
    if (have_cache) kvcache_free(&c);
    gpu_kvcache_free(gc);
    gpu_model_free(gm);
    if (have_model) model_free(&m);
    tokenizer_free(tok);
    return rc;
}

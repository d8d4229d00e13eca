/* zaya bench decode: prefill and per-token cached decoding of a model (a directory, or a config initialised at
 * random) at a given context length: prefill tokens/s, median per-token decode latency and tokens/s, KV cache size. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "commands.h"
#include "config.h"
#include "decode.h"
#include "model.h"
#include "model_io.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int bench_decode(int argc, char **argv) {
    const char *model_dir = NULL, *config_path = NULL;
    int context = 128, new_tokens = 128, threads = 0;
    ArgSpec specs[] = {
        {"--model", ARG_STRING, 0, &model_dir, "model directory (or --config for random weights)", 0},
        {"--config", ARG_STRING, 0, &config_path, "model config.json, initialised at random", 0},
        {"--context", ARG_INT, 0, &context, "prompt length prefilled first (default 128)", 0},
        {"--tokens", ARG_INT, 0, &new_tokens, "tokens decoded one at a time after it (default 128)", 0},
        {"--threads", ARG_INT, 0, &threads, "OpenMP/BLAS threads (default: all)", 0},
    };
    for (int i = 3; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0) {
            args_usage("bench decode", "(--model DIR | --config CFG.json) [--context N --tokens M --threads K]", specs,
                       ZY_ARRAY_LEN(specs));
            return 0;
        }
    ZyErr err = {{0}};
    Model m;
    KVCache c;
    int have_model = 0, have_cache = 0, rc = 1;
    int32_t *ids = NULL;
    float *logits = NULL;
    double *lat = NULL;
    if (args_parse(argc, argv, 3, specs, ZY_ARRAY_LEN(specs), NULL, 0, NULL, "bench decode", &err)) goto done;
    if (!model_dir == !config_path) {
        zy_fail(&err, "bench decode: give exactly one of --model or --config");
        goto done;
    }
    if (context <= 0 || new_tokens <= 0 || threads < 0) {
        zy_fail(&err, "bench decode: --context and --tokens must be positive");
        goto done;
    }
    if (threads > 0) omp_set_num_threads(threads);
    if (model_dir) {
        if (model_load_dir(&m, model_dir, &err)) goto done;
    } else {
        ZayaConfig cfg;
        if (config_load(&cfg, config_path, &err) || model_create(&m, &cfg, &err)) goto done;
        model_init_weights(&m, 1);
    }
    have_model = 1;
    const int total = context + new_tokens;
    if (kvcache_create(&c, &m.cfg, 1, total, &err)) goto done;
    have_cache = 1;
    ids = malloc((size_t)total * sizeof *ids);
    logits = malloc((size_t)m.cfg.vocab_size * sizeof *logits);
    lat = malloc((size_t)new_tokens * sizeof *lat);
    if (!ids || !logits || !lat) {
        zy_fail(&err, "out of memory");
        goto done;
    }
    ZyRng rng;
    zy_rng_seed(&rng, 3);
    for (int i = 0; i < total; i++) ids[i] = (int32_t)(zy_rng_next(&rng) % (uint64_t)m.cfg.vocab_size);
    /* one untimed pass to warm caches and thread pools, then the timed one */
    if (model_decode(&m, &c, ids, context, logits, 1, &err)) goto done;
    kvcache_reset(&c);
    double t0 = zy_now_seconds();
    if (model_decode(&m, &c, ids, context, logits, 1, &err)) goto done;
    double prefill = zy_now_seconds() - t0;
    for (int i = 0; i < new_tokens; i++) {
        double t = zy_now_seconds();
        if (model_decode(&m, &c, ids + context + i, 1, logits, 1, &err)) goto done;
        lat[i] = zy_now_seconds() - t;
    }
    double sum = 0;
    for (int i = 0; i < new_tokens; i++) sum += lat[i];
    qsort(lat, (size_t)new_tokens, sizeof *lat, cmp_double);
    double median = new_tokens % 2 ? lat[new_tokens / 2] : 0.5 * (lat[new_tokens / 2 - 1] + lat[new_tokens / 2]);
    printf("model        %s: %zu parameters, %d threads\n", model_dir ? model_dir : config_path, params_count(&m.params, 0),
           omp_get_max_threads());
    printf("prefill      %d tokens in %.4f s: %.0f tokens/s\n", context, prefill, context / prefill);
    printf("decode       %d tokens after a %d-token context: median %.3f ms/token (p90 %.3f), %.0f tokens/s\n", new_tokens,
           context, 1e3 * median, 1e3 * lat[(int)(0.9 * (new_tokens - 1))], new_tokens / sum);
    printf("KV cache     %zu bytes per token (k and v, %d layers); %.2f MB at %d tokens\n",
           kvcache_bytes_per_token(&m.cfg), m.cfg.num_layers, kvcache_bytes_per_token(&m.cfg) * (double)total / 1e6, total);
    rc = 0;
done:
    if (rc) fprintf(stderr, "zaya: %s\n", err.msg);
    free(ids), free(logits), free(lat);
    if (have_cache) kvcache_free(&c);
    if (have_model) model_free(&m);
    return rc;
}

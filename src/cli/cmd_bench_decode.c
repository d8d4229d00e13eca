/* zaya bench decode: prefill and per-token cached decoding of a model (a directory, or a config initialised at
 * random) at a given context length: prefill tokens/s, median per-token decode latency and tokens/s, KV cache size. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "args.h"
#include "commands.h"
#include "model_args.h"
#include "model/model_stats.h"
#include "model/config.h"
#include "infer/decode.h"
#include "gpu/gpu.h"
#include "gpu/gpu_decode.h"
#include "model/model.h"
#include "io/model_io.h"

/* Resident memory of this process now (/proc/self/statm), in MB; 0 where unreadable. */
static double resident_mb(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long size = 0, resident = 0;
    if (!f) return 0;
    int n = fscanf(f, "%ld %ld", &size, &resident);
    fclose(f);
    return n == 2 ? resident * (double)sysconf(_SC_PAGESIZE) / 1e6 : 0;
}

/* The machine's memory read bandwidth, the limit of decoding (each token streams its weights once): every thread
 * sums its part of a 512 MB buffer (far larger than any cache). On a shared machine that bandwidth moves from minute
 * to minute (one probe of five passes read 19-33 GB/s between runs of one invocation), so the passes run between the
 * decoding steps they are compared with, one every PROBE_EVERY steps, and the median of all of them is the figure. */
enum { PROBE_EVERY = 4, PROBE_MIN_PASSES = 5 };
typedef struct {
    uint64_t *buf;
    size_t n;
    double *t;
    int passes, cap;
} BandwidthProbe;

static volatile uint64_t probe_sink; /* the sums are used, so the loads are not elided */

static void probe_pass(BandwidthProbe *p) {
    uint64_t total = 0;
    const size_t n = p->n;
    const uint64_t *buf = p->buf;
    const double t0 = zy_now_seconds();
#pragma omp parallel for schedule(static) reduction(+ : total)
    for (size_t i = 0; i < n; i += 8) /* 8 independent chains per 64-byte line keep the loads in flight */
        total += buf[i] + buf[i + 1] + buf[i + 2] + buf[i + 3] + buf[i + 4] + buf[i + 5] + buf[i + 6] + buf[i + 7];
    const double t = zy_now_seconds() - t0;
    if (p->passes < p->cap) p->t[p->passes++] = t;
    probe_sink += total;
}

/* The buffer touched (first touch by the thread that reads it) and one warm-up pass, not counted. */
static int probe_open(BandwidthProbe *p, int steps, ZyErr *err) {
    p->n = (size_t)512 << 20 >> 3;
    p->cap = steps / PROBE_EVERY + PROBE_MIN_PASSES + 1;
    p->passes = 0;
    p->buf = malloc(p->n * sizeof *p->buf);
    p->t = malloc((size_t)p->cap * sizeof *p->t);
    if (!p->buf || !p->t) return zy_fail(err, "out of memory for the bandwidth probe (512 MB)");
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < p->n; i++) p->buf[i] = i;
    probe_pass(p);
    p->passes = 0;
    return 0;
}

/* Bytes/s: the median pass, after enough more passes to make PROBE_MIN_PASSES. */
static double probe_bandwidth(BandwidthProbe *p) {
    while (p->passes < PROBE_MIN_PASSES) probe_pass(p);
    return (double)p->n * sizeof *p->buf / zy_median(p->t, p->passes);
}

static void probe_close(BandwidthProbe *p) {
    free(p->buf), free(p->t);
    memset(p, 0, sizeof *p);
}

/* What the host gave the threads beside the steps. A step with 4-bit weights is close to the cores' arithmetic limit
 * as well as the memory's, so on a shared host it also moves with the clock (a busy host's cores boost less) and with
 * the time the hypervisor takes from the vCPUs. Clock: every thread times a chain of dependent adds (one cycle each
 * on x86-64 and arm64 cores; elsewhere not measured), one probe after every PROBE_EVERY steps, the median of all; steal: the share of the CPUs'
 * time /proc/stat counts as stolen, over all the steps. */
enum { CLOCK_CHAIN = 1 << 18 }; /* ~0.1 ms at 2-4 GHz */
typedef struct {
    double ghz[512];
    int n;
    unsigned long long steal0, total0;
    int have_stat;
} HostProbe;

/* The machine's "cpu" line of /proc/stat: steal and the sum of every field, in clock ticks; 0 where unreadable. */
static int read_cpu_times(unsigned long long *steal, unsigned long long *total) {
    FILE *f = fopen("/proc/stat", "r");
    unsigned long long v[10] = {0};
    int n = f ? fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4],
                       &v[5], &v[6], &v[7], &v[8], &v[9])
              : 0;
    if (f) fclose(f);
    if (n < 8) return 0;
    *steal = v[7];
    *total = 0;
    for (int i = 0; i < 8; i++) *total += v[i]; /* guest time (8, 9) is already in user and nice */
    return 1;
}

static void host_probe_start(HostProbe *h) {
    h->n = 0;
    h->have_stat = read_cpu_times(&h->steal0, &h->total0);
}

#if defined(__x86_64__)
#define DEPENDENT_ADD "add %1, %0\n\t"
#elif defined(__aarch64__)
#define DEPENDENT_ADD "add %0, %0, %1\n\t"
#endif

static void host_probe_clock(HostProbe *h) {
#if defined(DEPENDENT_ADD) /* elsewhere not measured: the clock is reported as 0 */
#pragma omp parallel
    {
        uint64_t x = 1;
        const double t0 = zy_now_seconds();
        for (int i = 0; i < CLOCK_CHAIN / 8; i++) /* eight dependent adds an iteration: the loop's own work overlaps */
            __asm__ volatile(DEPENDENT_ADD DEPENDENT_ADD DEPENDENT_ADD DEPENDENT_ADD DEPENDENT_ADD DEPENDENT_ADD
                             DEPENDENT_ADD DEPENDENT_ADD
                             : "+r"(x) : "r"((uint64_t)i));
        const double t = zy_now_seconds() - t0;
#pragma omp critical
        if (h->n < (int)ZY_ARRAY_LEN(h->ghz) && t > 0) h->ghz[h->n++] = CLOCK_CHAIN / t / 1e9;
        probe_sink += x;
    }
#else
    (void)h;
#endif
}

/* The median clock (GHz) and the stolen share of the CPU time since host_probe_start (negative where unknown). */
static void host_probe_finish(HostProbe *h, double *ghz, double *steal) {
    unsigned long long s, t;
    *ghz = h->n ? zy_median(h->ghz, h->n) : 0;
    *steal = h->have_stat && read_cpu_times(&s, &t) && t > h->total0 ? (double)(s - h->steal0) / (double)(t - h->total0)
                                                                     : -1;
}

/* dtype: a ModelDtype (quantized ones need a quantized --model folder) */
static int load_model(Model *m, const char *model_dir, const char *config_path, int dtype, ZyErr *err) {
    const int bf16 = dtype == MODEL_DTYPE_BF16;
    if (model_dir) {
        if (model_load_dir_as(m, model_dir, dtype, err)) return -1;
    } else {
        ZayaConfig cfg;
        if (config_load(&cfg, config_path, err) || model_create(m, &cfg, err)) return -1;
        model_init_weights(m, 1);
        if (bf16 && model_use_bf16(m, err) < 0) return -1;
    }
    model_drop_grads(m); /* inference: no backward */
    return 0;
}

/* Bytes per value of a quantized matrix: B/8 for the code plus a scale and a bias per group. */
static double quant_bytes_per_value(const ZyQuantMatrix *q) {
    return q->bits / 8.0 + 2.0 * (double)zy_dtype_size(q->scale_dtype) / q->group_size;
}

/* Bytes per weight value as m holds its matrices: 4 (f32), 2 (bf16), or the head's quantized format (a folder that
 * zaya quantize wrote has one format but for the router's matrices: router_extra_bytes). */
static double bytes_per_weight(const Model *m, int bf16) {
    const ZyQuantMatrix *q = &m->w.lm_head_quant;
    return q->q ? quant_bytes_per_value(q) : bf16 ? 2 : 4;
}

/* The bytes a token reads beyond per_value for the router's matrices held in a format of their own (zaya quantize
 * --bits 4 keeps them at 8 bits): every token runs every layer's router. */
static double router_extra_bytes(const Model *m, double per_value) {
    double extra = 0;
    for (int l = 0; l < m->cfg.num_layers; l++) {
        const LayerWeights *L = &m->w.layers[l];
        const ZyQuantMatrix *r[] = {&L->router_down_w_quant, &L->router_fc1_w_quant, &L->router_fc2_w_quant,
                                    &L->router_out_w_quant, &L->router_w_quant};
        for (size_t i = 0; i < ZY_ARRAY_LEN(r); i++)
            if (r[i]->q) extra += (double)r[i]->rows * r[i]->cols * (quant_bytes_per_value(r[i]) - per_value);
    }
    return extra;
}

/* Weight bytes one decoded token reads: the parameters it passes through (model_stats: every layer's projections,
 * convolutions, router and one expert, the head; for the research variants what they have instead), at `per_value`
 * bytes each. Decoding one token is bound by these reads. */
static double weight_bytes_per_token(const ZayaConfig *f, double per_value) {
    ModelStats st;
    ZyErr err;
    if (model_stats_of(&st, f, 1, &err)) return NAN;
    return (double)st.active * per_value;
}

/* Weight bytes one decoded row really reads, tensor by tensor as m holds it: the matrices at per_value (the head's
 * format: router_extra_bytes adds what the router's own format costs beyond it), of the experts one per layer, of an
 * untied embedding the one row gathered; the grouped convolution kernels at the view decoding's convolution reads
 * (bf16 copies where the model made them, else fp32); every other tensor (norms, biases, residual scales, the
 * depthwise kernels) in fp32. */
static double decode_read_bytes(const Model *m, double per_value) {
    const ZayaConfig *f = &m->cfg;
    const int moe = f->moe != ZY_MOE_DENSE;
    const double conv = f->num_layers > 0 && m->w.layers[0].conv_gr_w16 ? 2 : 4;
    double bytes = 0;
    for (int i = 0; i < m->params.count; i++) {
        const ParamInfo *p = &m->params.info[i];
        double n = (double)p->numel;
        if (moe && strstr(p->name, ".mlp.experts.")) n /= f->num_experts;
        if (!f->tie_word_embeddings && !strcmp(p->name, "model.embed_tokens.weight")) n = f->hidden_size;
        bytes += n * (model_holds_bf16(p) ? per_value : strstr(p->name, "conv_qk_grouped.weight") ? conv : 4);
    }
    return bytes;
}

/* Teacher-forced logits of the bf16 (or quantized: `name`) model against its fp32 twin over one sequence:
 * per-position relative error (median, max) and how often the most likely next token is the same. */
static int compare_with_f32(const Model *m, const Model *m32, const char *name, const int32_t *ids, int T, ZyErr *err) {
    Activations a, a32;
    if (acts_create(&a, &m->cfg, 1, T, err)) return -1;
    if (acts_create(&a32, &m->cfg, 1, T, err)) {
        acts_free(&a);
        return -1;
    }
    model_forward((Model *)m, &a, ids);
    model_forward((Model *)m32, &a32, ids);
    const int V = m->cfg.vocab_size;
    double *rel = malloc((size_t)T * sizeof *rel);
    int same_top1 = 0;
    for (int t = 0; rel && t < T; t++) {
        const float *x = a.logits + (long)t * V, *y = a32.logits + (long)t * V;
        double d = 0, r = 0;
        int ax = 0, ay = 0;
        for (int v = 0; v < V; v++) {
            d += ((double)x[v] - y[v]) * ((double)x[v] - y[v]);
            r += (double)y[v] * y[v];
            if (x[v] > x[ax]) ax = v;
            if (y[v] > y[ay]) ay = v;
        }
        rel[t] = sqrt(d) / (sqrt(r) > 1e-30 ? sqrt(r) : 1e-30);
        same_top1 += ax == ay;
    }
    if (rel) {
        qsort(rel, (size_t)T, sizeof *rel, zy_cmp_double);
        printf("%-4s vs f32  logits over %d positions: relative error median %.2e, max %.2e; same top-1 token at "
               "%.1f%%\n", name, T, rel[T / 2], rel[T - 1], 100.0 * same_top1 / T);
    }
    free(rel);
    acts_free(&a);
    acts_free(&a32);
    return rel ? 0 : zy_fail(err, "out of memory");
}

/* The GPU steps through a path: the same-length cache (generate's: gpu_model_decode) or the block pool (the server's:
 * gpu_model_decode_step, whose step shapes ZAYA_GPU_GRAPHS=1 captures once as CUDA graphs and replays). */
typedef struct {
    GpuModel *gm;
    GpuKVCache *c; /* the cache path */
    GpuKVPool *p;  /* the pool path */
    DecodeSeq *seqs;
    int batch;
} GpuDecodePath;

/* Drops what the sequences hold (a fresh start for the timed prefill). */
static void gpu_path_reset(GpuDecodePath *d) {
    if (d->c) gpu_kvcache_reset(d->c);
    for (int b = 0; d->p && b < d->batch; b++) gpu_kvpool_seq_reset(d->p, b);
}

/* n tokens per sequence (tokens [batch, n]), each sequence's last logits into logits [batch, V]. */
static int gpu_path_step(GpuDecodePath *d, const int32_t *tokens, int n, float *logits, ZyErr *err) {
    if (d->c) return gpu_model_decode(d->gm, d->c, tokens, n, logits, 1, err);
    for (int b = 0; b < d->batch; b++) {
        if (gpu_kvpool_reserve(d->p, b, gpu_kvpool_len(d->p, b) + n))
            return zy_fail(err, "bench decode: the block pool ran out of blocks");
        d->seqs[b] = (DecodeSeq){.slot = b, .n = n, .logits = 1};
    }
    return gpu_model_decode_step(d->gm, d->p, d->seqs, d->batch, tokens, logits, err);
}

/* The GPU run: batch sequences prefilled with `context` tokens each, then `new_tokens` steps of one token per
 * sequence, each step's last logits copied to the host as sampling needs them. pool: through the block pool. */
static int bench_decode_gpu(const char *label, Model *m, int gpu_index, int batch, int context, int new_tokens, int bf16,
                            int kv_bf16, int pool, ZyErr *err) {
    GpuModel *gm = NULL;
    GpuKVCache *c = NULL;
    GpuKVPool *kp = NULL;
    GpuDecodePath path = {.batch = batch};
    const int total = context + new_tokens, V = m->cfg.vocab_size;
    int32_t *ids = malloc((size_t)batch * total * sizeof *ids), *step = malloc((size_t)batch * sizeof *step);
    float *logits = malloc((size_t)batch * V * sizeof *logits);
    double *lat = malloc((size_t)new_tokens * sizeof *lat);
    int rc = -1;
    if (!ids || !step || !logits || !lat) {
        zy_fail(err, "out of memory");
        goto done;
    }
    if (gpu_model_create(&gm, m, gpu_index, 1, 1, bf16, 0, err)) goto done;
    const int block_tokens = 16, per_seq = (total + block_tokens - 1) / block_tokens;
    if (pool ? gpu_kvpool_create_kv(&kp, gm, batch, total, batch * per_seq, block_tokens, batch * context, context,
                                    kv_bf16, err)
             : gpu_kvcache_create_kv(&c, gm, batch, total, 0, kv_bf16, err))
        goto done;
    path = (GpuDecodePath){.gm = gm, .c = c, .p = kp, .seqs = malloc((size_t)batch * sizeof(DecodeSeq)), .batch = batch};
    if (!path.seqs) {
        zy_fail(err, "out of memory");
        goto done;
    }
    ZyRng rng;
    zy_rng_seed(&rng, 3);
    for (long i = 0; i < (long)batch * total; i++) ids[i] = (int32_t)(zy_rng_next(&rng) % (uint64_t)V);
    int32_t *prompt = malloc((size_t)batch * context * sizeof *prompt);
    if (!prompt) {
        zy_fail(err, "out of memory");
        goto done;
    }
    for (int b = 0; b < batch; b++) memcpy(prompt + (long)b * context, ids + (long)b * total, context * sizeof *ids);
    int fail = gpu_path_step(&path, prompt, context, logits, err); /* warm-up */
    gpu_path_reset(&path);
    double t0 = zy_now_seconds();
    fail = fail || gpu_path_step(&path, prompt, context, logits, err);
    const double prefill = zy_now_seconds() - t0;
    free(prompt);
    if (fail) goto done;
    for (int i = 0; i < new_tokens; i++) {
        for (int b = 0; b < batch; b++) step[b] = ids[(long)b * total + context + i];
        double t = zy_now_seconds();
        if (gpu_path_step(&path, step, 1, logits, err)) goto done;
        lat[i] = zy_now_seconds() - t;
    }
    double sum = 0;
    for (int i = 0; i < new_tokens; i++) sum += lat[i];
    const double median = zy_median(lat, new_tokens); /* lat sorted: p90 below */
    size_t used = 0, total_mem = 0;
    gpu_memory_used(gpu_model_ctx(gm), &used, &total_mem);
    printf("model        %s: %zu parameters\n", label, params_count(&m->params, 0));
    printf("device       GPU %s; %s products", gpu_model_device(gm), bf16 ? "bf16" : "fp32");
    if (gpu_model_few_rows(gm))
        printf(" (steps of up to %d rows: the few-row kernels)\n", gpu_model_few_rows(gm));
    else
        printf("%s\n", bf16 ? " (cuBLASLt and the grouped experts at every step: ZAYA_GPU_FEW_ROWS=off)" : "");
    const double fp32_gib = gpu_model_fp32_weight_bytes(gm) / 1073741824.0,
                 all_gib = m->params.total * 4.0 / 1073741824.0;
    if (bf16)
        printf("arenas       bf16 %.2f GiB; fp32 %.2f GiB (%s)\n", m->params.total * 2.0 / 1073741824.0, fp32_gib,
               fp32_gib < all_gib ? "a lean arena: norms, biases, convolutions"
                                  : "every tensor: ZAYA_GPU_ARENA=full, or no sparse ranges here");
    printf("launches     %s\n", gpu_model_programmatic_launch(gm)
                                     ? "programmatic: each small kernel overlaps the one before (ZAYA_GPU_PDL=off: not)"
                                     : "each kernel after the one before ends (programmatic launch: sm_90+, ZAYA_GPU_PDL)");
    if (pool)
        printf("path         the block pool (the server's step, %d-token blocks); CUDA graphs: %s (%d held)\n",
               block_tokens, gpu_kvpool_graphs(kp) ? "on" : "off (ZAYA_GPU_GRAPHS=1 turns them on)",
               gpu_kvpool_graphs(kp));
    else
        printf("path         the same-length cache (generate's)\n");
    if (kp && gpu_kvpool_graph_kernels(kp))
        printf("kernels      %d a step in the newest graph (%.1f a layer, %d layers)\n", gpu_kvpool_graph_kernels(kp),
               (double)gpu_kvpool_graph_kernels(kp) / m->cfg.num_layers, m->cfg.num_layers);
    double barrier_us = 0;
    long stale = 0;
    int barrier_blocks = 0;
    ZyErr probe_err;
    if (gpu_grid_sync_probe(gpu_model_ctx(gm), 1000, &barrier_us, &stale, &barrier_blocks, &probe_err) == 0)
        printf("barrier      %.2f us a grid barrier over %d blocks (the persistent layer's; %ld stale reads)\n",
               barrier_us, barrier_blocks, stale);
    else
        printf("barrier      not measured: %s\n", probe_err.msg);
    const long layer_runs = gpu_model_decode_layer_runs(gm);
    if (gpu_model_decode_layer_persistent(gm))
        printf("layers       a one-token step's layers as one persistent kernel: %ld layer runs (or captures) so far%s\n",
               layer_runs, layer_runs ? "" : " (none: refused, or a model it does not take)");
    else
        printf("layers       as their launches (ZAYA_GPU_DECODE_LAYER=persistent: one kernel a step)\n");
    printf("prefill      %d x %d tokens in %.4f s: %.0f tokens/s\n", batch, context, prefill,
           (double)batch * context / prefill);
    printf("decode       %d steps of %d token%s after a %d-token context: median %.3f ms/step (p90 %.3f), %.0f "
           "tokens/s\n", new_tokens, batch, batch > 1 ? "s" : "", context, 1e3 * median,
           1e3 * lat[(int)(0.9 * (new_tokens - 1))], (double)batch * new_tokens / sum);
    printf("weights      %.1f MB of %s matrices read per step (%.1f GB/s at the median step)\n",
           weight_bytes_per_token(&m->cfg, bf16 ? 2 : 4) / 1e6, bf16 ? "bf16" : "f32",
           weight_bytes_per_token(&m->cfg, bf16 ? 2 : 4) / median / 1e9);
    printf("KV cache     %zu bytes per token (%s k and v, %d layers); %.2f MB for %d x %d tokens; GPU memory in use "
           "%.2f GiB\n", kvcache_bytes_per_token(&m->cfg, kv_bf16), kv_bf16 ? "bf16" : "fp32", m->cfg.num_layers,
           kvcache_bytes_per_token(&m->cfg, kv_bf16) * (double)batch * total / 1e6, batch, total, used / 1073741824.0);
    printf("json         {\"device\": \"cuda\", \"path\": \"%s\", \"graphs\": %d, \"graph_kernels\": %d, "
           "\"programmatic_launch\": %d, \"persistent_layer_runs\": %ld, \"grid_barrier_us\": %.3f, \"batch\": %d, \"decode_tokens_per_s\": %.1f, "
           "\"median_step_ms\": %.3f, \"prefill_tokens_per_s\": %.1f}\n",
           pool ? "pool" : "cache", kp ? gpu_kvpool_graphs(kp) : 0, kp ? gpu_kvpool_graph_kernels(kp) : 0,
           gpu_model_programmatic_launch(gm), layer_runs, barrier_us, batch, (double)batch * new_tokens / sum, 1e3 * median,
           (double)batch * context / prefill);
    rc = 0;
done:
    gpu_kvcache_free(c);
    gpu_kvpool_free(kp);
    free(path.seqs);
    gpu_model_free(gm);
    free(ids), free(step), free(logits), free(lat);
    return rc;
}

int bench_decode(int argc, char **argv) {
    const char *model_dir = NULL, *config_path = NULL, *dtype = "auto", *device = "cpu", *kv_dtype = "auto",
               *gpu_path = "cache";
    int context = 128, new_tokens = 128, threads = 0, batch = 1;
    ArgSpec specs[] = {
        {"--model", ARG_STRING, 0, &model_dir, "model directory (or --config for random weights)", 0},
        {"--config", ARG_STRING, 0, &config_path, "model config.json, initialised at random", 0},
        {"--context", ARG_INT, 0, &context, "prompt length prefilled first (default 128)", 0},
        {"--tokens", ARG_INT, 0, &new_tokens, "tokens decoded one at a time after it (default 128)", 0},
        {"--threads", ARG_INT, 0, &threads, "OpenMP/BLAS threads (default: all)", 0},
        {"--dtype", ARG_STRING, 0, &dtype, "weights: auto (default: a quantized folder's q8/q4, bf16 for a model stored "
         "bf16, else f32), f32, bf16, q8 or q4 (a quantized folder read in place); bf16, q8 and q4 also report their "
         "logits against f32 where an f32 copy fits in memory", 0},
        {"--device", ARG_STRING, 0, &device, "cpu (default), cuda or cuda:N (bf16: bf16 products on the GPU)", 0},
        {"--batch", ARG_INT, 0, &batch, "sequences decoded together, one token each per step (default 1)", 0},
        {"--kv-dtype", ARG_STRING, 0, &kv_dtype, "KV cache: auto (default: bf16 with bf16 or quantized weights, else "
                                                 "f32), f32 or bf16", 0},
        {"--path", ARG_STRING, 0, &gpu_path, "GPU only: cache (default: generate's same-length cache) or pool (the "
         "server's block pool, whose steps ZAYA_GPU_GRAPHS=1 replays as CUDA graphs)", 0},
    };
    if (args_help(argc, argv, 3, "bench decode",
                  "(--model DIR | --config CFG.json) [--context N --tokens M --threads K --dtype auto|f32|bf16|q8|q4 --device cpu|cuda "
                  "--batch B --kv-dtype auto|f32|bf16 --path cache|pool]", specs,
                  ZY_ARRAY_LEN(specs)))
        return 0;
    ZyErr err = {{0}};
    Model m, m32;
    KVCache c;
    int have_model = 0, have_m32 = 0, have_cache = 0, rc = 1;
    BandwidthProbe probe = {0};
    int32_t *ids = NULL, *prompt = NULL, *step = NULL, *route = NULL;
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
    /* --dtype auto with --config (random weights): f32 */
    ModelArgs ma = {.command = "bench decode", .dir = model_dir, .dtype = dtype, .device = device, .kv_dtype = kv_dtype};
    if (model_args_dtype(&ma, &err) || model_args_device(&ma, &err) || model_args_kv_dtype(&ma, &err) ||
        model_args_quant_device(&ma, &err))
        goto done;
    if (batch <= 0 || batch > 4096) {
        zy_fail(&err, "bench decode: --batch %d: sequences decoded together, 1..4096", batch);
        goto done;
    }
    if (strcmp(gpu_path, "cache") && strcmp(gpu_path, "pool")) {
        zy_fail(&err, "bench decode: --path %s: expected cache or pool", gpu_path);
        goto done;
    }
    if (!ma.gpu && strcmp(gpu_path, "cache")) {
        zy_fail(&err, "bench decode: --path pool is the GPU's block pool (add --device cuda)");
        goto done;
    }
    if (threads > 0) omp_set_num_threads(threads);
    if (ma.gpu) { /* a bf16 folder goes up from its mapped files; an fp32 one (or a --config init) as fp32, the GPU
                   * making its own bf16 copy */
        if (load_model(&m, model_dir, config_path, model_dir && ma.bf16 ? MODEL_DTYPE_BF16 : 0, &err)) goto done;
        have_model = 1;
        if (bench_decode_gpu(model_dir ? model_dir : config_path, &m, ma.gpu_index, batch, context, new_tokens, ma.bf16,
                             ma.kv_bf16, !strcmp(gpu_path, "pool"), &err))
            goto done;
        rc = 0;
        goto done;
    }
    if (load_model(&m, model_dir, config_path, ma.quant_bits ? ma.quant_bits : ma.bf16, &err)) goto done;
    have_model = 1;
    model_args_print_quant(&ma, &m);
    const double model_mb = resident_mb();
    const char *dtype_name = model_args_dtype_name(&ma);
    /* an fp32 twin to measure the bf16 logits against (for quantized weights: the same values dequantized, so what
     * differs is the kernels' arithmetic), where it fits (an 8B model's would need 35 GB) */
    const double twin_bytes = (double)params_count(&m.params, 0) * 4;
    const int reduced = ma.bf16 || ma.quant_bits;
    const int compare = reduced && twin_bytes < 0.5 * zy_available_memory_bytes(); /* loaded last: not in the peak */
    const int total = context + new_tokens, L = m.cfg.num_layers, E = m.cfg.num_experts;
    if (kvcache_create_kv(&c, &m.cfg, batch, total, KV_DEFAULT_CHUNK, ma.kv_bf16, &err)) goto done;
    have_cache = 1;
    /* ids [batch, total]; the prompts [batch, context] and each step's tokens [batch] are gathered from it */
    ids = malloc((size_t)batch * total * sizeof *ids);
    prompt = malloc((size_t)batch * context * sizeof *prompt);
    step = malloc((size_t)batch * sizeof *step);
    route = malloc((size_t)L * batch * sizeof *route);
    logits = malloc((size_t)batch * m.cfg.vocab_size * sizeof *logits);
    lat = malloc((size_t)new_tokens * sizeof *lat);
    if (!ids || !prompt || !step || !route || !logits || !lat) {
        zy_fail(&err, "out of memory");
        goto done;
    }
    ZyRng rng;
    zy_rng_seed(&rng, 3);
    for (long i = 0; i < (long)batch * total; i++) ids[i] = (int32_t)(zy_rng_next(&rng) % (uint64_t)m.cfg.vocab_size);
    for (int b = 0; b < batch; b++) memcpy(prompt + (long)b * context, ids + (long)b * total, context * sizeof *ids);
    /* one untimed pass to warm caches and thread pools, then the timed one */
    if (model_decode(&m, &c, prompt, context, logits, 1, &err)) goto done;
    kvcache_reset(&c);
    double t0 = zy_now_seconds();
    if (model_decode(&m, &c, prompt, context, logits, 1, &err)) goto done;
    double prefill = zy_now_seconds() - t0;
    /* the prefill's peak, before the probe's buffer exists; the probe's passes then run between the steps */
    const double peak_prefill = zy_peak_resident_bytes();
    if (probe_open(&probe, new_tokens, &err)) goto done;
    long experts_read = 0; /* (layer, expert) pairs some row of a step was routed to, summed over the steps */
    HostProbe host;
    host_probe_start(&host);
    host_probe_clock(&host);
    for (int i = 0; i < new_tokens; i++) {
        for (int b = 0; b < batch; b++) step[b] = ids[(long)b * total + context + i];
        double t = zy_now_seconds();
        if (model_decode_ex(&m, &c, step, 1, logits, 1, route, &err)) goto done;
        lat[i] = zy_now_seconds() - t;
        if ((i + 1) % PROBE_EVERY == 0) probe_pass(&probe), host_probe_clock(&host);
        for (int l = 0; l < L; l++) {
            unsigned char seen[4096] = {0};
            for (int b = 0; b < batch; b++) {
                const int e = route[(long)l * batch + b];
                if (e >= 0 && e < E && e < 4096 && !seen[e]) seen[e] = 1, experts_read++;
            }
        }
    }
    double ghz, steal;
    host_probe_finish(&host, &ghz, &steal);
    double sum = 0;
    for (int i = 0; i < new_tokens; i++) sum += lat[i];
    const double median = zy_median(lat, new_tokens); /* lat sorted: p90 below */
    printf("model        %s: %zu parameters, %d threads\n", model_dir ? model_dir : config_path, params_count(&m.params, 0),
           omp_get_max_threads());
    printf("prefill      %d x %d tokens in %.4f s: %.0f tokens/s\n", batch, context, prefill,
           (double)batch * context / prefill);
    printf("decode       %d step%s of %d token%s after a %d-token context: median %.3f ms/step (p90 %.3f), %.0f "
           "tokens/s\n", new_tokens, new_tokens > 1 ? "s" : "", batch, batch > 1 ? "s" : "", context, 1e3 * median,
           1e3 * lat[(int)(0.9 * (new_tokens - 1))], (double)batch * new_tokens / sum);
    /* the decoding steps' peak less the probe's 512 MB, resident throughout them (or the prefill's, if higher); a step
     * of several rows reads the weights once, every expert some row was routed to (the standard MoE layout: gate_up
     * [2I, D] and down [D, I] per expert) */
    const double peak = fmax(peak_prefill, zy_peak_resident_bytes() - (double)probe.n * sizeof *probe.buf);
    const double per_value = bytes_per_weight(&m, ma.bf16);
    double per_step = decode_read_bytes(&m, per_value) + router_extra_bytes(&m, per_value);
    if (batch > 1 && m.cfg.moe != ZY_MOE_DENSE) {
        const double expert = 3.0 * m.cfg.hidden_size * m.cfg.moe_intermediate_size * per_value;
        per_step += ((double)experts_read / new_tokens - L) * expert;
        printf("experts      a step reads %.1f of the %d experts per layer (the distinct experts its %d rows chose)\n",
               (double)experts_read / new_tokens / L, E, batch);
    }
    const double bandwidth = probe_bandwidth(&probe);
    const int passes = probe.passes;
    probe_close(&probe);
    size_t mapped, copied;
    model_weight_bytes(&m, &mapped, &copied);
    const double kv_read = (double)kvcache_bytes_per_token(&m.cfg, ma.kv_bf16) * batch * (context + new_tokens / 2.0);
    printf("weights      %s: %.1f MB read per decoding step (%.1f GB/s at the median latency); %.0f MB resident once "
           "loaded (%.1f MB used in place from the mapped files, %.1f MB copies)\n", dtype_name,
           per_step / 1e6, per_step / median / 1e9, model_mb, mapped / 1e6, copied / 1e6);
    printf("bandwidth    %.1f GB/s memory read, measured (%d threads, median of %d passes over 512 MB between the steps): "
           "decoding at most %.1f tokens/s from the weights alone, %.1f with the KV cache's %.1f MB a mid-run step reads; "
           "the median step ran at %.0f%% of the latter\n", bandwidth / 1e9, omp_get_max_threads(), passes,
           batch * bandwidth / per_step,
           batch * bandwidth / (per_step + kv_read), kv_read / 1e6,
           100.0 * (per_step + kv_read) / median / bandwidth);
    if (host.n)
        printf("host         the threads' clock %.2f GHz (median of %d chains of dependent adds between the steps); ",
               ghz, host.n);
    else
        printf("host         the threads' clock not measured (x86-64 and arm64 only); ");
    if (steal >= 0)
        printf("%.1f%% of the CPU time stolen by the hypervisor over the steps\n", 100 * steal);
    else
        printf("stolen time unknown (no /proc/stat)\n");
    printf("KV cache     %zu bytes per token (k and v %s, %d layers); %.2f MB at %d x %d tokens\n",
           kvcache_bytes_per_token(&m.cfg, ma.kv_bf16), ma.kv_bf16 ? "bf16" : "f32", m.cfg.num_layers,
           kvcache_bytes_per_token(&m.cfg, ma.kv_bf16) * (double)batch * total / 1e6, batch, total);
    if (compare) {
        if (load_model(&m32, model_dir, config_path, 0, &err)) goto done;
        have_m32 = 1;
        if (compare_with_f32(&m, &m32, dtype_name, ids, total, &err)) goto done;
    }
    if (reduced && !compare)
        printf("%-4s vs f32  not compared: an f32 copy (%.1f GB) does not fit in the %.1f GB available\n", dtype_name, twin_bytes / 1e9,
               zy_available_memory_bytes() / 1e9);
    printf("peak memory  %.2f GB resident at most while decoding (VmHWM: weights' file pages touched, KV cache, "
           "scratch)\n", peak / 1e9);
    printf("json         {\"device\": \"cpu\", \"dtype\": \"%s\", \"kv_dtype\": \"%s\", \"batch\": %d, \"decode_tokens_per_s\": %.3f, "
           "\"median_ms\": %.3f, \"bytes_per_step\": %.0f, \"kv_bytes_per_step\": %.0f, "
           "\"bandwidth_bytes_per_s\": %.0f, \"bound_tokens_per_s\": %.3f, \"peak_rss_bytes\": %.0f, \"clock_ghz\": %.3f, "
           "\"steal_share\": %.4f}\n", dtype_name, ma.kv_bf16 ? "bf16" : "f32", batch, (double)batch * new_tokens / sum,
           1e3 * median, per_step, kv_read, bandwidth, batch * bandwidth / per_step, peak, ghz, steal);
    rc = 0;
done:
    if (rc) fprintf(stderr, "zaya: %s\n", err.msg);
    free(ids), free(prompt), free(step), free(route), free(logits), free(lat);
    if (have_cache) kvcache_free(&c);
    if (have_model) model_free(&m);
    if (have_m32) model_free(&m32);
    probe_close(&probe);
    return rc;
}

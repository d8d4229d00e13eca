/* zaya bench train: full optimizer steps (K micro-batches' forward and backward accumulated, clipping, Muon +
 * AdamW) through the training run's own StepBackend and accumulation (train/step.h), on random tokens or token
 * shards, timed after warm-up: median tokens/s over whole optimizer steps, achieved FLOP/s, MFU (CPU: against an
 * sgemm peak measured at start-up; GPU: the dense bf16 datasheet peak and the measured cuBLASLt one), peak memory,
 * and where the time goes (attention, experts, router, norms, head, optimizer, other). */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "args.h"
#include "commands.h"
#include "model/config.h"
#include "dist/distributed.h"
#include "gpu/gpu.h"
#include "gpu/gpu_model.h"
#include "gpu/gpu_trainer.h"
#include "train/loader.h"
#include "train/runconfig.h"
#include "train/step.h"
#include "kernels/matmul.h"
#include "model/model.h"
#include "optim/optim.h"

/* Where bench train's micro-batches come from: K fixed micro-batches of random tokens (the same every step), or with
 * --data a token-shard folder read through the training run's loader, as a RUN.json with that one dataset and the
 * same seed reads it (step.h: step_data_loader). */
typedef struct {
    int32_t *tokens, *targets; /* random: [K, B, T] */
    int B, T, K;
    int use_loader;
    Loader loader;
    BatchRow *rows;            /* [B·K]: one optimizer step's planned rows */
    int32_t *window;           /* [B, T + 1] */
    StepLoaderData src;
} BenchData;

static int random_micro(void *x, int k, int32_t *inputs, int32_t *targets, ZyErr *err) {
    const BenchData *d = x;
    const size_t n = (size_t)d->B * d->T;
    memcpy(inputs, d->tokens + (size_t)k * n, n * sizeof *inputs);
    memcpy(targets, d->targets + (size_t)k * n, n * sizeof *targets);
    return 0;
}

/* Plans step `index` (the data index: warm-up steps count) and returns its micro-batches. */
static int bench_data_step(BenchData *d, const Model *m, int64_t index, StepData *out, ZyErr *err) {
    if (!d->use_loader) {
        *out = (StepData){.ctx = d, .read = random_micro};
        return 0;
    }
    static const double one_dataset[1] = {1.0};
    if (loader_plan(&d->loader, (uint64_t)index, d->B * d->K, d->T, one_dataset, d->rows, err)) return -1;
    d->src = (StepLoaderData){.loader = &d->loader, .rows = d->rows, .first_row = 0, .micro_batch = d->B, .T = d->T,
                              .window = d->window, .model = m, .step = index};
    *out = step_data_loader(&d->src);
    return 0;
}

/* One timed optimizer step through the training run's StepBackend and accumulation (one process, clip 1, lr 1e-3):
 * *whole its wall time with the queue drained, *fwd_bwd the K micro-batches' forward + backward, *loss their mean. */
static int bench_step(const StepBackend *be, BenchData *d, const Model *m, int64_t index, RoutingCounts *routes,
                      int32_t *inputs, int32_t *targets, double *whole, double *fwd_bwd, double *loss, ZyErr *err) {
    StepData data;
    double sumsq, comm;
    if (bench_data_step(d, m, index, &data, err)) return -1;
    const double t0 = zy_now_seconds();
    if (step_accumulate(be, &data, d->K, inputs, targets, routes, 0, loss, &sumsq, &comm, fwd_bwd, err) ||
        be->apply(be->ctx, clip_coefficient(1.0, sqrt(sumsq)), 1e-3, &comm, err) ||
        (be->sync && be->sync(be->ctx, err)))
        return -1;
    *whole = zy_now_seconds() - t0;
    return 0;
}

/* Every step's loss, warm-up first, exactly (a RUN.json run on the same data and seed prints the same in
 * metrics.jsonl). */
static void print_losses(const double *losses, int n) {
    printf("losses      ");
    for (int i = 0; i < n; i++) printf(" %.17g", losses[i]);
    printf("\n");
}

/* The GPU figures: the same steps as `zaya train --device cuda` takes (forward, backward, the routing statistics,
 * clipping, Muon + AdamW), then more steps with the queue drained at every phase boundary for the breakdown. */
static int report_gpu(const char *config_path, const StepBackend *be, BenchData *d, Model *m, int steps, int warmup,
                      int bf16, int gemm_probe, const OptimConfig *oc, double *times, double *fb,
                      const double *losses, const long plan0[2], double plan_s0, RoutingCounts *routes,
                      int32_t *inputs, int32_t *targets, ZyErr *err) {
    const ZayaConfig *cfg = &m->cfg;
    GpuTrainer *gt = step_backend_gpu_trainer(be);
    GpuCtx *g = gpu_model_ctx(gpu_trainer_model(gt));
    const int B = d->B, T = d->T, K = d->K;
    /* host time picking cuBLASLt algorithms inside the timed steps (the experts' row counts change every step) */
    const double builds = (double)(g->plan_builds - plan0[0]) / steps;
    const double heuristics = (double)(g->plan_heuristics - plan0[1]) / steps;
    const double plan_ms = 1e3 * (g->plan_seconds - plan_s0) / steps;
    /* where the time goes: more steps with the queue drained at every phase boundary (slower, so apart) */
    enum { BREAKDOWN_STEPS = 2 };
    double phase[MODEL_PHASES] = {0}, t_opt = 0, t_all = 0;
    be->set_timing(be->ctx, phase);
    for (int s = 0; s < BREAKDOWN_STEPS; s++) {
        double whole, fwd_bwd, loss;
        if (bench_step(be, d, m, warmup + steps + s, routes, inputs, targets, &whole, &fwd_bwd, &loss, err))
            return -1;
        t_opt += whole - fwd_bwd;
        t_all += whole;
    }
    be->set_timing(be->ctx, NULL);
    const double median = zy_median(times, steps), fb_median = zy_median(fb, steps); /* sorts them */
    const double tokens = (double)B * T * K, tps = tokens / median, flops = model_train_flops_per_token(cfg, T);
    const double dense = gpu_dense_bf16_peak_tflops(g);
    /* under a profiler the probe's 23 GEMMs would mix with the step's own: --no-gemm-probe leaves them out */
    double probe16 = -1;
    if (gemm_probe) {
        g->bf16 = 1;
        probe16 = gpu_gemm_probe_tflops(g, 8192, 20);
        g->bf16 = bf16;
    }
    printf("model        %s: %zu parameters (%.1f M active matrix FLOPs/token/6 incl. head)\n", config_path,
           params_count(&m->params, 0), (flops - 6.0 * cfg->num_layers * cfg->num_heads * cfg->head_dim * T) / 6e6);
    printf("device       GPU %s\n", gpu_trainer_device(gt));
    printf("batch        %d micro-batch%s of %d x %d = %.0f tokens per optimizer step, %d timed steps after %d "
           "warm-up, optimizer %s\n", K, K > 1 ? "es" : "", B, T, tokens, steps, warmup,
           oc->adamw_only ? "AdamW" : "Muon + AdamW");
    /* what a profiler of this process sees: kernel totals divide by this, not by the timed steps */
    printf("steps run    %d (%d warm-up, %d timed, %d for the phase breakdown)\n", warmup + steps + BREAKDOWN_STEPS,
           warmup, steps, BREAKDOWN_STEPS);
    const int grouped = gpu_model_experts_grouped(gpu_trainer_model(gt));
    printf("precision    %s; attention: %s; the experts' products %s\n",
           bf16 ? "bf16 products (cuBLASLt, fp32 accumulation); fp32 master weights, optimizer state, norms, softmax "
                  "statistics and loss"
                : "fp32 throughout (no TF32)",
           gpu_model_attention_path(gpu_trainer_model(gt)),
           grouped == 3   ? "grouped on the device (one launch each; wgmma + TMA, CUTLASS's sm90 grouped GEMM)"
           : grouped == 2 ? "grouped on the device (one launch each; cp.async into a ring of tiles)"
           : grouped == 1 ? "grouped on the device (one launch each; staged form)"
                          : "one cuBLASLt product per expert");
    int graph_kernels = 0;
    long graph_replays = 0;
    const char *graphs_refused = NULL;
    const int graphs = gpu_model_graphs(gpu_trainer_model(gt), &graph_kernels, &graph_replays, &graphs_refused);
    if (graph_kernels > 0)
        printf("graphs       each micro-batch's forward, loss and backward replayed as one CUDA graph of %d kernels "
               "(%ld micro-batches so far)\n", graph_kernels, graph_replays);
    else if (graphs || graphs_refused)
        printf("graphs       asked for, not used: %s\n", graphs_refused ? graphs_refused : "no micro-batch ran");
    else
        printf("graphs       off (ZAYA_GPU_GRAPHS=1: each micro-batch's launches as one CUDA graph)\n");
    printf("step         median %.4f s per optimizer step (min %.4f, max %.4f)\n", median, times[0],
           times[steps - 1]);
    printf("throughput   %.0f tokens/s over whole optimizer steps, %.1f TFLOP/s (%.3g GFLOP/token, 6N + attention "
           "convention)\n", tps, tps * flops / 1e12, flops / 1e9);
    if (dense > 0) printf("MFU          %.1f%% of the dense bf16 peak %.0f TFLOP/s (datasheet)\n", 100 * tps * flops / (dense * 1e12), dense);
    if (probe16 > 0)
        printf("MFU cuBLAS   %.1f%% of the measured cuBLASLt bf16 peak %.0f TFLOP/s (8192^3)\n",
               100 * tps * flops / (probe16 * 1e12), probe16);
    else
        printf("MFU cuBLAS   not measured (%s)\n", gemm_probe ? "the GEMM probe failed" : "--no-gemm-probe");
    printf("fwd+bwd      median %.4f s (%.0f tokens/s); optimizer and clipping %.4f s\n", fb_median,
           tokens / fb_median, median - fb_median);
    print_losses(losses, warmup + steps);
    printf("peak memory  %.1f GiB on the GPU (device total in use: weights, gradients, optimizer state, activations)\n",
           gpu_trainer_memory_used(gt) / 1073741824.0);
    printf("products     per timed step: %.1f new product shapes (%.1f ran cuBLASLt's heuristic, the rest reused a "
           "checked algorithm), %.2f ms of host time building them\n", builds, heuristics, plan_ms);
    static const char *names[MODEL_PHASES] = {"attention", "router", "experts", "norms", "head+loss"};
    double accounted = t_opt;
    printf("breakdown    (%d steps with the GPU queue drained at each phase boundary: %.4f s/step)\n", BREAKDOWN_STEPS,
           t_all / BREAKDOWN_STEPS);
    for (int k = 0; k < MODEL_PHASES; k++) {
        printf("  %-11s %6.1f%%  %8.4f s/step\n", names[k], 100 * phase[k] / t_all, phase[k] / BREAKDOWN_STEPS);
        accounted += phase[k];
    }
    printf("  %-11s %6.1f%%  %8.4f s/step\n", "optimizer", 100 * t_opt / t_all, t_opt / BREAKDOWN_STEPS);
    printf("  %-11s %6.1f%%  %8.4f s/step   (routing statistics to the host, token upload)\n", "other",
           100 * (t_all - accounted) / t_all, (t_all - accounted) / BREAKDOWN_STEPS);
    printf("json         {\"device\": \"cuda\", \"tokens_per_s\": %.1f, \"step_s\": %.5f, \"tokens_per_step\": %.0f, "
           "\"micro_batches\": %d, \"mfu_dense\": %.4f, \"mfu_cublas\": %.4f, \"steps_run\": %d, \"gpu_mem_gib\": %.2f, "
           "\"plan_builds_per_step\": %.1f, \"plan_heuristics_per_step\": %.1f, \"plan_ms_per_step\": %.3f, "
           "\"graph_kernels\": %d}\n",
           tps, median, tokens, K, dense > 0 ? tps * flops / (dense * 1e12) : 0,
           probe16 > 0 ? tps * flops / (probe16 * 1e12) : 0, warmup + steps + BREAKDOWN_STEPS,
           gpu_trainer_memory_used(gt) / 1073741824.0, builds, heuristics, plan_ms, graph_kernels);
    return 0;
}

int bench_train(int argc, char **argv) {
    const char *config_path = NULL, *optimizer = "muon", *precision = "fp32", *device = "cpu", *products = "auto";
    const char *data_dir = NULL;
    int B = 8, T = 128, K = 1, steps = 10, warmup = 2, threads = 0, no_gemm_probe = 0;
    uint64_t seed = 1;
    ArgSpec specs[] = {
        {"--config", ARG_STRING, 1, &config_path, "model config.json", 0},
        {"--batch", ARG_INT, 0, &B, "sequences per micro-batch (default 8)", 0},
        {"--seq", ARG_INT, 0, &T, "sequence length (default 128)", 0},
        {"--micro-batches", ARG_INT, 0, &K,
         "micro-batches accumulated per optimizer step (gradient accumulation, as RUN.json's batch_size / "
         "micro_batch; default 1)", 0},
        {"--steps", ARG_INT, 0, &steps, "timed optimizer steps (default 10)", 0},
        {"--warmup", ARG_INT, 0, &warmup, "untimed steps first (default 2)", 0},
        {"--data", ARG_STRING, 0, &data_dir,
         "token shards (a zaya data prepare folder) read as a training run reads one dataset (default: fixed random "
         "tokens)", 0},
        {"--seed", ARG_U64, 0, &seed, "the weights' initialisation and, with --data, the loader's seed (default 1)", 0},
        {"--threads", ARG_INT, 0, &threads, "OpenMP/BLAS threads (default: all)", 0},
        {"--optimizer", ARG_STRING, 0, &optimizer,
         "muon (Muon for the matrices + AdamW, ZAYA's recipe; default) or adamw (AdamW for every tensor)", 0},
        {"--precision", ARG_STRING, 0, &precision,
         "fp32 (default) or bf16 (bf16 inputs to the matrix products, fp32 sums and master weights)", 0},
        {"--bf16-products", ARG_STRING, 0, &products,
         "with --precision bf16 on a CPU: auto (default: what a training run picks for this CPU), fp32, onednn or sgemm", 0},
        {"--device", ARG_STRING, 0, &device, "cpu (default), cuda or cuda:N", 0},
        {"--no-gemm-probe", ARG_SWITCH, 0, &no_gemm_probe,
         "with --device cuda: skip the cuBLASLt peak probe (its GEMMs would count in a profile of the steps)", 0},
    };
    if (args_help(argc, argv, 3, "bench train", "--config CFG.json [--batch B --seq T --micro-batches K --steps N "
                  "--warmup W --data DIR --seed S --threads N --optimizer muon|adamw --precision fp32|bf16 "
                  "--bf16-products auto|fp32|onednn|sgemm --device cpu|cuda --no-gemm-probe]", specs,
                  ZY_ARRAY_LEN(specs)))
        return 0;
    ZyErr err = {{0}};
    ZayaConfig cfg;
    Model m;
    Optimizer o;
    StepBackend be = {0};
    BenchData d = {0};
    RoutingCounts routes = {0};
    int have_model = 0, have_opt = 0, rc = 1;
    int32_t *inputs = NULL, *targets = NULL;
    double *times = NULL, *fb_times = NULL, *losses = NULL; /* whole steps; forward + backward alone; every loss */
    if (args_parse(argc, argv, 3, specs, ZY_ARRAY_LEN(specs), NULL, 0, NULL, "bench train", &err)) goto done;
    if (B <= 0 || T <= 0 || steps <= 0 || warmup < 0 || threads < 0) {
        zy_fail(&err, "bench train: --batch, --seq and --steps must be positive, --warmup and --threads non-negative");
        goto done;
    }
    if (K <= 0 || (int64_t)B * K > (1 << 20)) {
        zy_fail(&err, "bench train: --micro-batches must be a positive integer (micro-batches per optimizer step) with "
                "--batch x --micro-batches at most 2^20, not %d", K);
        goto done;
    }
    if (strcmp(optimizer, "muon") != 0 && strcmp(optimizer, "adamw") != 0) {
        zy_fail(&err, "bench train: --optimizer must be muon or adamw, not \"%s\"", optimizer);
        goto done;
    }
    if (strcmp(precision, "fp32") != 0 && strcmp(precision, "bf16") != 0) {
        zy_fail(&err, "bench train: --precision must be fp32 or bf16, not \"%s\"", precision);
        goto done;
    }
    const int bf16 = strcmp(precision, "bf16") == 0;
    ZyBf16Products want_products;
    if (zy_bf16_products_parse(products, &want_products, "bench train: --bf16-products", &err)) goto done;
    char products_why[256] = "";
    if (bf16 && !zy_bf16_products_available(want_products, products_why, sizeof products_why)) {
        zy_fail(&err, "bench train: --bf16-products %s: %s", products, products_why);
        goto done;
    }
    int gpu = 0, gpu_index = -1;
    if (runconfig_parse_device(device, &gpu, &gpu_index, &err)) {
        zy_wrap(&err, "bench train: --device");
        goto done;
    }
    if (threads > 0) omp_set_num_threads(threads);
    if (config_load(&cfg, config_path, &err) || model_create(&m, &cfg, &err)) goto done;
    have_model = 1;
    if (T > cfg.max_position_embeddings) {
        zy_fail(&err, "bench train: --seq %d exceeds max_position_embeddings %d", T, cfg.max_position_embeddings);
        goto done;
    }
    model_init_weights(&m, seed);
    /* the data: K micro-batches of B x T a step */
    d.B = B, d.T = T, d.K = K;
    const size_t n = (size_t)B * T;
    inputs = malloc(n * sizeof *inputs);
    targets = malloc(n * sizeof *targets);
    times = calloc((size_t)steps, sizeof *times);
    fb_times = calloc((size_t)steps, sizeof *fb_times);
    losses = calloc((size_t)(warmup + steps), sizeof *losses);
    if (!inputs || !targets || !times || !fb_times || !losses) {
        zy_fail(&err, "out of memory");
        goto done;
    }
    if (data_dir) {
        const char *names[1] = {"data"}, *dirs[1] = {data_dir};
        if (loader_open(&d.loader, 1, names, dirs, seed, 1, &err)) {
            zy_wrap(&err, "bench train: --data");
            goto done;
        }
        d.use_loader = 1;
        if (shardset_vocab_size(d.loader.train[0]) > cfg.vocab_size) {
            zy_fail(&err, "bench train: --data %s: token vocabulary %d is larger than the model's vocab_size %d",
                    data_dir, shardset_vocab_size(d.loader.train[0]), cfg.vocab_size);
            goto done;
        }
        d.rows = calloc((size_t)B * K, sizeof *d.rows);
        d.window = malloc((size_t)B * (T + 1) * sizeof *d.window);
        if (!d.rows || !d.window) {
            zy_fail(&err, "out of memory");
            goto done;
        }
    } else {
        d.tokens = malloc((size_t)K * n * sizeof *d.tokens);
        d.targets = malloc((size_t)K * n * sizeof *d.targets);
        if (!d.tokens || !d.targets) {
            zy_fail(&err, "out of memory");
            goto done;
        }
        ZyRng rng;
        zy_rng_seed(&rng, 7);
        for (size_t i = 0; i < (size_t)K * n; i++) d.tokens[i] = (int32_t)(zy_rng_next(&rng) % (uint64_t)cfg.vocab_size);
        for (int k = 0; k < K; k++) make_next_token_targets(d.targets + (size_t)k * n, d.tokens + (size_t)k * n, B, T);
    }
    /* as a training run decides: timed on the experts' gate/up product where the CPU leaves it open */
    const ZyBf16Products prod = bf16 && !gpu ? zy_bf16_products_resolve(want_products, B * T / (cfg.num_experts > 0 ? cfg.num_experts : 1),
                                                                         2 * cfg.moe_intermediate_size, cfg.hidden_size,
                                                                         products_why, sizeof products_why)
                                             : ZY_BF16_PRODUCTS_FP32;
    OptimConfig oc;
    optim_config_default(&oc);
    oc.adamw_only = strcmp(optimizer, "adamw") == 0;
    if (optim_create(&o, &m.params, &oc, &err)) goto done;
    have_opt = 1;
    optim_set_bf16(&o, prod);
    if (routing_counts_create(&routes, cfg.num_layers, cfg.num_experts, &err)) goto done;
    /* the step a training run takes: one process, ZeRO-1's one block */
    static const Dist solo = {.rank = 0, .size = 1};
    const size_t bounds[2] = {0, m.params.total};
    const StepHost host = {.model = &m, .opt = &o, .dist = &solo, .zero_bounds = bounds, .grad_scratch = NULL};
    if ((gpu ? step_backend_gpu(&be, &host, gpu_index, bf16, B, T, &err) : step_backend_cpu(&be, &host, prod, &err)) ||
        be.set_shape(be.ctx, B, T, &err))
        goto done;
    double peak = 0, peak16 = 0;
    if (!gpu) peak = zy_sgemm_probe_gflops(1024, 1.0), peak16 = prod ? zy_gemm_bf16_probe_gflops(prod, 1024, 1.0) : 0;
    double phase[MODEL_PHASES] = {0}, optim_s = 0;
    long plan0[2] = {0, 0};
    double plan_s0 = 0;
    for (int s = -warmup; s < steps; s++) {
        if (s == 0 && gpu) {
            const GpuCtx *g = gpu_model_ctx(gpu_trainer_model(step_backend_gpu_trainer(&be)));
            plan0[0] = g->plan_builds, plan0[1] = g->plan_heuristics, plan_s0 = g->plan_seconds;
        }
        if (s == 0 && !gpu) be.set_timing(be.ctx, phase); /* the CPU's breakdown is of the timed steps */
        double whole, fwd_bwd;
        if (bench_step(&be, &d, &m, warmup + s, &routes, inputs, targets, &whole, &fwd_bwd, &losses[warmup + s], &err))
            goto done;
        if (s >= 0) {
            times[s] = whole;
            fb_times[s] = fwd_bwd;
            optim_s += whole - fwd_bwd;
        }
    }
    if (gpu) {
        if (report_gpu(config_path, &be, &d, &m, steps, warmup, bf16, !no_gemm_probe, &oc, times, fb_times, losses,
                       plan0, plan_s0, &routes, inputs, targets, &err))
            goto done;
        rc = 0;
        goto done;
    }
    be.set_timing(be.ctx, NULL);
    double total = 0;
    for (int s = 0; s < steps; s++) total += times[s];
    const double median = zy_median(times, steps), fb_median = zy_median(fb_times, steps); /* sorts them */
    const double tokens = (double)B * T * K, tps = tokens / median, flops = model_train_flops_per_token(&cfg, T);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("model        %s: %zu parameters (%.1f M active matrix FLOPs/token/6 incl. head)\n", config_path,
           params_count(&m.params, 0), (flops - 6.0 * cfg.num_layers * cfg.num_heads * cfg.head_dim * T) / 6e6);
    printf("batch        %d micro-batch%s of %d x %d = %.0f tokens per optimizer step, %d threads, %d timed steps "
           "after %d warm-up, optimizer %s\n", K, K > 1 ? "es" : "", B, T, tokens, omp_get_max_threads(), steps,
           warmup, oc.adamw_only ? "AdamW" : "Muon + AdamW");
    printf("data         %s\n", data_dir ? data_dir : "fixed random tokens (seed 7), the same every step");
    printf("steps run    %d (%d warm-up, %d timed)\n", warmup + steps, warmup, steps);
    char backend[256];
    zy_gemm_bf16_backend(prod, backend, sizeof backend);
    if (!bf16)
        printf("precision    fp32\n");
    else if (prod == ZY_BF16_PRODUCTS_FP32)
        printf("precision    bf16 asked, products %s: %s\n", backend, products_why);
    else
        printf("precision    bf16 products (%s): %s (%s); Newton-Schulz products bf16 too; fp32 master weights, "
               "optimizer state, norms, attention\n", zy_bf16_products_name(prod), backend, products_why);
    printf("step         median %.4f s per optimizer step (min %.4f, max %.4f)\n", median, times[0], times[steps - 1]);
    printf("throughput   %.0f tokens/s over whole optimizer steps, %.1f GFLOP/s (%.3g GFLOP/token, 6N + attention "
           "convention)\n", tps, tps * flops / 1e9, flops / 1e9);
    printf("MFU          %.1f%% of the measured sgemm peak %.1f GFLOP/s\n", 100 * tps * flops / (peak * 1e9), peak);
    if (prod)
        printf("MFU bf16     %.1f%% of the measured bf16 product peak %.1f GFLOP/s (1024^3, rounding included)\n",
               100 * tps * flops / (peak16 * 1e9), peak16);
    /* the optimizer's FLOPs (Muon's Newton–Schulz) are outside the 6N convention: MFU of the model's own part */
    printf("MFU fwd+bwd  %.1f%% (forward + backward alone, median %.4f s; %.0f tokens/s)\n",
           100 * tokens / fb_median * flops / (peak * 1e9), fb_median, tokens / fb_median);
    print_losses(losses, warmup + steps);
    printf("peak memory  %.1f MB resident\n", ru.ru_maxrss / 1024.0);
    static const char *names[MODEL_PHASES] = {"attention", "router", "experts", "norms", "head+loss"};
    double accounted = optim_s;
    printf("breakdown    (share of all timed steps)\n");
    for (int k = 0; k < MODEL_PHASES; k++) {
        printf("  %-11s %6.1f%%  %8.4f s/step\n", names[k], 100 * phase[k] / total, phase[k] / steps);
        accounted += phase[k];
    }
    printf("  %-11s %6.1f%%  %8.4f s/step\n", "optimizer", 100 * optim_s / total, optim_s / steps);
    printf("  %-11s %6.1f%%  %8.4f s/step   (residual merges' backward, embedding, zeroing, data)\n", "other",
           100 * (total - accounted) / total, (total - accounted) / steps);
    rc = 0;
done:
    if (rc) fprintf(stderr, "zaya: %s\n", err.msg);
    if (be.free) be.free(be.ctx);
    routing_counts_free(&routes);
    if (d.use_loader) loader_close(&d.loader);
    free(d.rows), free(d.window), free(d.tokens), free(d.targets);
    free(inputs), free(targets), free(times), free(fb_times), free(losses);
    if (have_opt) optim_free(&o);
    if (have_model) model_free(&m);
    return rc;
}

/* zaya bench train: full training steps (forward, backward, clipping, Muon + AdamW) on random tokens, timed after
 * warm-up: median tokens/s, achieved GFLOP/s, MFU against an sgemm peak measured at start-up, peak resident
 * memory, and where the time goes (attention, experts, router, norms, head, optimizer, other). */
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
#include "train/runconfig.h"
#include "kernels/matmul.h"
#include "model/model.h"
#include "optim/optim.h"

/* One timed GPU training step (one process, clip 1, lr 1e-3): *whole its wall time with the queue drained, *fwd_bwd
 * the forward + backward part. */
static int gpu_step(GpuTrainer *gt, Model *m, const int32_t *tokens, const int32_t *targets, RoutingCounts *routes,
                    double *whole, double *fwd_bwd, ZyErr *err) {
    const Dist solo = {.rank = 0, .size = 1};
    const size_t bounds[2] = {0, m->params.total};
    double loss, sumsq, t0 = zy_now_seconds();
    gpu_trainer_begin(gt);
    routing_counts_reset(routes);
    if (gpu_trainer_micro(gt, tokens, targets, routes, err) || gpu_trainer_sync(gt, err)) return -1;
    *fwd_bwd = zy_now_seconds() - t0;
    if (gpu_trainer_reduce(gt, m, &solo, bounds, NULL, 1, 0, &loss, &sumsq, err) ||
        gpu_trainer_apply(gt, m, &solo, bounds, clip_coefficient(1.0, sqrt(sumsq)), 1e-3, err) ||
        gpu_trainer_sync(gt, err))
        return -1;
    *whole = zy_now_seconds() - t0;
    return 0;
}

/* The GPU run: the same steps as `zaya train --device cuda` takes (gpu_trainer.h: forward, backward, the routing
 * statistics, clipping, Muon + AdamW), timed with the GPU's queue drained at each step's end. */
static int bench_train_gpu(const char *config_path, Model *m, int gpu_index, int B, int T, int steps, int warmup,
                           int bf16, int gemm_probe, const OptimConfig *oc, const int32_t *tokens,
                           const int32_t *targets, ZyErr *err) {
    const ZayaConfig *cfg = &m->cfg;
    Optimizer o;
    GpuTrainer *gt = NULL;
    RoutingCounts routes = {0};
    int rc = -1;
    double *times = calloc((size_t)steps, sizeof *times), *fb = calloc((size_t)steps, sizeof *fb);
    if (!times || !fb) {
        free(times), free(fb);
        return zy_fail(err, "out of memory");
    }
    if (optim_create(&o, &m->params, oc, err)) {
        free(times), free(fb);
        return -1;
    }
    if (routing_counts_create(&routes, cfg->num_layers, cfg->num_experts, err) ||
        gpu_trainer_create(&gt, m, &o, NULL, gpu_index, bf16, B, T, err))
        goto done;
    GpuCtx *g = gpu_model_ctx(gpu_trainer_model(gt));
    long builds0 = 0, heuristics0 = 0;
    double plan_s0 = 0;
    for (int s = -warmup; s < steps; s++) {
        double whole, fwd_bwd;
        if (s == 0) builds0 = g->plan_builds, heuristics0 = g->plan_heuristics, plan_s0 = g->plan_seconds;
        if (gpu_trainer_sync(gt, err) || gpu_step(gt, m, tokens, targets, &routes, &whole, &fwd_bwd, err)) goto done;
        if (s >= 0) times[s] = whole, fb[s] = fwd_bwd;
    }
    /* host time picking cuBLASLt algorithms inside the timed steps (the experts' row counts change every step) */
    const double builds = (double)(g->plan_builds - builds0) / steps;
    const double heuristics = (double)(g->plan_heuristics - heuristics0) / steps;
    const double plan_ms = 1e3 * (g->plan_seconds - plan_s0) / steps;
    /* where the time goes: more steps with the queue drained at every phase boundary (slower, so apart) */
    enum { BREAKDOWN_STEPS = 2 };
    double phase[MODEL_PHASES] = {0}, t_opt = 0, t_all = 0;
    gpu_model_set_timing(gpu_trainer_model(gt), phase);
    for (int s = 0; s < BREAKDOWN_STEPS; s++) {
        double whole, fwd_bwd;
        if (gpu_step(gt, m, tokens, targets, &routes, &whole, &fwd_bwd, err)) goto done;
        t_opt += whole - fwd_bwd;
        t_all += whole;
    }
    gpu_model_set_timing(gpu_trainer_model(gt), NULL);
    const double median = zy_median(times, steps), fb_median = zy_median(fb, steps);
    const double tps = (double)B * T / median, flops = model_train_flops_per_token(cfg, T);
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
    printf("batch        %d x %d tokens, %d timed steps after %d warm-up, optimizer %s\n", B, T, steps, warmup,
           oc->adamw_only ? "AdamW" : "Muon + AdamW");
    /* what a profiler of this process sees: kernel totals divide by this, not by the timed steps */
    printf("steps run    %d (%d warm-up, %d timed, %d for the phase breakdown)\n", warmup + steps + BREAKDOWN_STEPS,
           warmup, steps, BREAKDOWN_STEPS);
    printf("precision    %s; the experts' products %s\n",
           bf16 ? "bf16 products (cuBLASLt, fp32 accumulation) and tensor-core attention (head dim 64/128); fp32 "
                  "master weights, optimizer state, norms, softmax statistics and loss"
                : "fp32 throughout (no TF32)",
           gpu_model_experts_grouped(gpu_trainer_model(gt)) ? "grouped on the device (one launch each)"
                                                            : "one cuBLASLt product per expert");
    printf("step         median %.4f s (min %.4f, max %.4f)\n", median, times[0], times[steps - 1]);
    printf("throughput   %.0f tokens/s, %.1f TFLOP/s (%.3g GFLOP/token, 6N + attention convention)\n", tps,
           tps * flops / 1e12, flops / 1e9);
    if (dense > 0) printf("MFU          %.1f%% of the dense bf16 peak %.0f TFLOP/s (datasheet)\n", 100 * tps * flops / (dense * 1e12), dense);
    if (probe16 > 0)
        printf("MFU cuBLAS   %.1f%% of the measured cuBLASLt bf16 peak %.0f TFLOP/s (8192^3)\n",
               100 * tps * flops / (probe16 * 1e12), probe16);
    else
        printf("MFU cuBLAS   not measured (%s)\n", gemm_probe ? "the GEMM probe failed" : "--no-gemm-probe");
    printf("fwd+bwd      median %.4f s (%.0f tokens/s); optimizer and clipping %.4f s\n", fb_median,
           (double)B * T / fb_median, median - fb_median);
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
    printf("json         {\"device\": \"cuda\", \"tokens_per_s\": %.1f, \"step_s\": %.5f, \"mfu_dense\": %.4f, "
           "\"mfu_cublas\": %.4f, \"steps_run\": %d, \"gpu_mem_gib\": %.2f, \"plan_builds_per_step\": %.1f, "
           "\"plan_heuristics_per_step\": %.1f, \"plan_ms_per_step\": %.3f}\n",
           tps, median, dense > 0 ? tps * flops / (dense * 1e12) : 0, probe16 > 0 ? tps * flops / (probe16 * 1e12) : 0,
           warmup + steps + BREAKDOWN_STEPS, gpu_trainer_memory_used(gt) / 1073741824.0, builds, heuristics, plan_ms);
    rc = 0;
done:
    gpu_trainer_free(gt);
    routing_counts_free(&routes);
    optim_free(&o);
    free(times), free(fb);
    return rc;
}

int bench_train(int argc, char **argv) {
    const char *config_path = NULL, *optimizer = "muon", *precision = "fp32", *device = "cpu", *products = "auto";
    int B = 8, T = 128, steps = 10, warmup = 2, threads = 0, no_gemm_probe = 0;
    ArgSpec specs[] = {
        {"--config", ARG_STRING, 1, &config_path, "model config.json", 0},
        {"--batch", ARG_INT, 0, &B, "sequences per step (default 8)", 0},
        {"--seq", ARG_INT, 0, &T, "sequence length (default 128)", 0},
        {"--steps", ARG_INT, 0, &steps, "timed steps (default 10)", 0},
        {"--warmup", ARG_INT, 0, &warmup, "untimed steps first (default 2)", 0},
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
    if (args_help(argc, argv, 3, "bench train", "--config CFG.json [--batch B --seq T --steps N --warmup W --threads K --optimizer muon|adamw "
                  "--precision fp32|bf16 --bf16-products auto|fp32|onednn|sgemm --device cpu|cuda --no-gemm-probe]", specs,
                  ZY_ARRAY_LEN(specs)))
        return 0;
    ZyErr err = {{0}};
    ZayaConfig cfg;
    Model m;
    Activations a;
    Optimizer o;
    int have_model = 0, have_acts = 0, have_opt = 0, rc = 1;
    int32_t *tokens = NULL, *targets = NULL;
    double *times = NULL, *fb_times = NULL; /* whole steps; forward + backward alone */
    if (args_parse(argc, argv, 3, specs, ZY_ARRAY_LEN(specs), NULL, 0, NULL, "bench train", &err)) goto done;
    if (B <= 0 || T <= 0 || steps <= 0 || warmup < 0 || threads < 0) {
        zy_fail(&err, "bench train: --batch, --seq and --steps must be positive, --warmup and --threads non-negative");
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
    model_init_weights(&m, 1);
    if (gpu) {
        OptimConfig goc;
        optim_config_default(&goc);
        goc.adamw_only = strcmp(optimizer, "adamw") == 0;
        tokens = malloc((size_t)B * T * sizeof *tokens);
        targets = malloc((size_t)B * T * sizeof *targets);
        if (!tokens || !targets) {
            zy_fail(&err, "out of memory");
            goto done;
        }
        ZyRng grng;
        zy_rng_seed(&grng, 7);
        for (long i = 0; i < (long)B * T; i++) tokens[i] = (int32_t)(zy_rng_next(&grng) % (uint64_t)cfg.vocab_size);
        make_next_token_targets(targets, tokens, B, T);
        if (bench_train_gpu(config_path, &m, gpu_index, B, T, steps, warmup, bf16, !no_gemm_probe, &goc, tokens,
                            targets, &err))
            goto done;
        rc = 0;
        goto done;
    }
    if (acts_create(&a, &cfg, B, T, &err)) goto done;
    have_acts = 1;
    /* as a training run decides: timed on the experts' gate/up product where the CPU leaves it open */
    const ZyBf16Products prod = bf16 ? zy_bf16_products_resolve(want_products, B * T / (cfg.num_experts > 0 ? cfg.num_experts : 1),
                                                                2 * cfg.moe_intermediate_size, cfg.hidden_size,
                                                                products_why, sizeof products_why)
                                     : ZY_BF16_PRODUCTS_FP32;
    acts_set_bf16(&a, prod);
    OptimConfig oc;
    optim_config_default(&oc);
    oc.adamw_only = strcmp(optimizer, "adamw") == 0;
    if (optim_create(&o, &m.params, &oc, &err)) goto done;
    optim_set_bf16(&o, prod);
    have_opt = 1;
    tokens = malloc((size_t)B * T * sizeof *tokens);
    targets = malloc((size_t)B * T * sizeof *targets);
    times = calloc((size_t)steps, sizeof *times);
    fb_times = calloc((size_t)steps, sizeof *fb_times);
    if (!tokens || !targets || !times || !fb_times) {
        zy_fail(&err, "out of memory");
        goto done;
    }
    ZyRng rng;
    zy_rng_seed(&rng, 7);
    for (long i = 0; i < (long)B * T; i++) tokens[i] = (int32_t)(zy_rng_next(&rng) % (uint64_t)cfg.vocab_size);
    make_next_token_targets(targets, tokens, B, T);
    double peak = zy_sgemm_probe_gflops(1024, 1.0), peak16 = prod ? zy_gemm_bf16_probe_gflops(prod, 1024, 1.0) : 0;
    double phase[MODEL_PHASES] = {0}, optim_s = 0;
    for (int s = -warmup; s < steps; s++) {
        a.phase_seconds = s >= 0 ? phase : NULL;
        double t0 = zy_now_seconds();
        params_zero_grad(&m.params);
        model_forward(&m, &a, tokens);
        model_backward(&m, &a, targets);
        double t1 = zy_now_seconds();
        grad_clip(&m.params, 1.0, grad_global_norm(&m.params));
        optim_step(&o, &m.params, 1e-3);
        double t2 = zy_now_seconds();
        if (s >= 0) {
            times[s] = t2 - t0;
            fb_times[s] = t1 - t0;
            optim_s += t2 - t1;
        }
    }
    double total = 0;
    for (int s = 0; s < steps; s++) total += times[s];
    const double median = zy_median(times, steps), fb_median = zy_median(fb_times, steps);
    double tps = (double)B * T / median, flops = model_train_flops_per_token(&cfg, T);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("model        %s: %zu parameters (%.1f M active matrix FLOPs/token/6 incl. head)\n", config_path,
           params_count(&m.params, 0), (flops - 6.0 * cfg.num_layers * cfg.num_heads * cfg.head_dim * T) / 6e6);
    printf("batch        %d x %d tokens, %d threads, %d timed steps after %d warm-up, optimizer %s\n", B, T,
           omp_get_max_threads(), steps, warmup, oc.adamw_only ? "AdamW" : "Muon + AdamW");
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
    printf("step         median %.4f s (min %.4f, max %.4f)\n", median, times[0], times[steps - 1]);
    printf("throughput   %.0f tokens/s, %.1f GFLOP/s (%.3g GFLOP/token, 6N + attention convention)\n", tps,
           tps * flops / 1e9, flops / 1e9);
    printf("MFU          %.1f%% of the measured sgemm peak %.1f GFLOP/s\n", 100 * tps * flops / (peak * 1e9), peak);
    if (prod)
        printf("MFU bf16     %.1f%% of the measured bf16 product peak %.1f GFLOP/s (1024^3, rounding included)\n",
               100 * tps * flops / (peak16 * 1e9), peak16);
    /* the optimizer's FLOPs (Muon's Newton–Schulz) are outside the 6N convention: MFU of the model's own part */
    printf("MFU fwd+bwd  %.1f%% (forward + backward alone, median %.4f s; %.0f tokens/s)\n",
           100 * (double)B * T / fb_median * flops / (peak * 1e9), fb_median, (double)B * T / fb_median);
    printf("peak memory  %.1f MB resident\n", ru.ru_maxrss / 1024.0);
    static const char *names[MODEL_PHASES] = {"attention", "router", "experts", "norms", "head+loss"};
    double accounted = optim_s;
    printf("breakdown    (share of all timed steps)\n");
    for (int k = 0; k < MODEL_PHASES; k++) {
        printf("  %-11s %6.1f%%  %8.4f s/step\n", names[k], 100 * phase[k] / total, phase[k] / steps);
        accounted += phase[k];
    }
    printf("  %-11s %6.1f%%  %8.4f s/step\n", "optimizer", 100 * optim_s / total, optim_s / steps);
    printf("  %-11s %6.1f%%  %8.4f s/step   (residual merges' backward, embedding, zeroing)\n", "other",
           100 * (total - accounted) / total, (total - accounted) / steps);
    rc = 0;
done:
    if (rc) fprintf(stderr, "zaya: %s\n", err.msg);
    free(tokens), free(targets), free(times), free(fb_times);
    if (have_opt) optim_free(&o);
    if (have_acts) acts_free(&a);
    if (have_model) model_free(&m);
    return rc;
}

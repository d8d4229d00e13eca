/* zaya info: what this binary is and what it found on this machine — the version, the CPU and its features, the
 * kernel level chosen (cpu.h), how bf16 runs here, the BLAS and its core type, threads, GPU support. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "commands.h"
#include "gpu/gpu.h"
#include "kernels/blas_core.h"
#include "kernels/cpu.h"
#include "kernels/matmul.h"
#include "kernels/quant.h"
#include "kernels/quant_many.h"

#ifndef ZAYA_VERSION
#define ZAYA_VERSION "0.5.0"
#endif
#ifndef ZAYA_GIT_REV
#define ZAYA_GIT_REV "unknown"
#endif

static const char *compiler(void) {
#if defined(__clang__)
    return "clang " __clang_version__;
#elif defined(__GNUC__)
    return "gcc " __VERSION__;
#else
    return "unknown compiler";
#endif
}

int cmd_system_info(int argc, char **argv) {
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            printf("usage: zaya info\n\nPrints the version, the CPU features found, the kernel level chosen (ZAYA_CPU\n"
                   "forces a lower one: generic, avx2, avx512, avx512bf16), how bf16 runs, the BLAS and its core\n"
                   "type, the thread count and whether GPU support is compiled in.\n");
            return 0;
        }
        fprintf(stderr, "zaya info: unknown argument \"%s\"\n", argv[i]);
        return 1;
    }
    ZyCpuInfo ci;
    zy_cpu_detect(&ci);
    char features[512];
    zy_cpu_features_string(&ci, features, sizeof features);
    const ZyCpuLevel level = zy_cpu_level(), best = zy_cpu_best_level(&ci);
    const char *forced = getenv("ZAYA_CPU");

    printf("zaya         %s (git %s), built by %s%s\n", ZAYA_VERSION, ZAYA_GIT_REV, compiler(),
#if defined(__AVX2__)
           ", baseline x86-64-v3 or above (NATIVE build?)"
#elif defined(__x86_64__)
           ", baseline x86-64-v2"
#else
           ""
#endif
    );
    printf("cpu          %s (%s, family %d model %d stepping %d)\n", ci.brand[0] ? ci.brand : "unknown",
           ci.vendor[0] ? ci.vendor : "unknown vendor", ci.family, ci.model, ci.stepping);
    printf("features     %s\n", features);
    printf("levels      ");
    for (int l = 0; l < ZY_CPU_LEVELS; l++)
        printf(" %s %s%s", zy_cpu_level_name((ZyCpuLevel)l), zy_cpu_supports(&ci, (ZyCpuLevel)l) ? "yes" : "no",
               l + 1 < ZY_CPU_LEVELS ? "," : "\n");
    printf("kernels      %s (%s)\n", zy_cpu_level_name(level),
           forced && *forced ? "forced by ZAYA_CPU" : level == best ? "the best this CPU runs" : "?");
    const char *bf16w = getenv("ZAYA_BF16_WEIGHTS");
    printf("bf16 weights %s%s\n", zy_bf16_weights_describe(zy_bf16_weights()),
           bf16w && *bf16w ? " (ZAYA_BF16_WEIGHTS)" : "");
    const char *qway = getenv("ZAYA_QUANT_WAY");
    char many[256];
    zy_quant_many_describe(zy_quant_many(), many, sizeof many);
    printf("quant        %s kernels; %s%s; more than %d rows: %s\n", zy_quant_kernel_name(zy_quant_kernel_for_level()),
           zy_quant_way_describe(zy_quant_way()), qway && *qway ? " (ZAYA_QUANT_WAY)" : "", ZY_QUANT_MAX_ROWS, many);
    /* what a training run with "precision": "bf16" and "bf16_products": "auto" would compute (timed where it must) */
    char backend[256], why[256];
    const ZyBf16Products p = zy_bf16_products_resolve(ZY_BF16_PRODUCTS_AUTO, 1024, 1024, 1024, why, sizeof why);
    zy_gemm_bf16_backend(p, backend, sizeof backend);
    printf("bf16 train   %s products: %s; %s\n", zy_bf16_products_name(p), backend, why);
    const char *cfg = zy_blas_config(), *core = zy_blas_core_name();
    printf("blas         %s; core %s; %d threads\n", cfg ? cfg : "OpenBLAS", core ? core : "?", zy_blas_threads());
    /* why this core: zaya's own reason when it set OPENBLAS_CORETYPE (src/cli/main.c), else the same decision
     * taken now, on the core the library runs */
    const char *zaya_why = getenv("ZAYA_BLAS_CORE_WHY");
    ZyBlasCoreChoice bc;
    zy_blas_core_choose(&ci, level, forced && *forced && strcasecmp(forced, "auto") != 0, core,
                        zaya_why ? NULL : getenv("OPENBLAS_CORETYPE"), &bc);
    const ZyBlasClass have = zy_blas_core_class(core), want = zy_blas_class_for_level(level);
    printf("blas core    %s (%s kernels): %s\n", core ? core : "?", zy_blas_class_name(have), zaya_why ? zaya_why : bc.why);
    char runnable[128];
    zy_blas_cores_runnable(&ci, runnable, sizeof runnable);
    printf("blas cores   %s (one per instruction class this CPU runs)\n", runnable);
    if (have == want)
        printf("blas check   ok: %s kernels for the %s level\n", zy_blas_class_name(have), zy_cpu_level_name(level));
    else if (have == ZY_BLAS_UNKNOWN)
        printf("blas check   unknown: zaya does not know the core %s\n", core ? core : "(unnamed)");
    else
        printf("blas check   MISMATCH: %s kernels under the %s level (it needs %s)\n", zy_blas_class_name(have),
               zy_cpu_level_name(level), zy_blas_class_name(want));
    const char *omp = getenv("OMP_NUM_THREADS");
    printf("threads      %d OpenMP threads (%s), %d processors\n", omp_get_max_threads(),
           omp ? "OMP_NUM_THREADS" : "all processors", omp_get_num_procs());
    if (gpu_compiled()) {
        GpuCtx g;
        ZyErr err;
        if (gpu_open(&g, -1, &err) == 0) {
            printf("gpu          CUDA support compiled in; device %d: %s, sm_%d%d, %d SMs, %.1f GiB\n", g.device, g.name,
                   g.cc_major, g.cc_minor, g.sm_count, g.mem_total / 1073741824.0);
            char paths[512];
            gpu_kernel_paths(paths, sizeof paths);
            printf("gpu kernels  %s\n", paths);
            gpu_close(&g);
        } else {
            printf("gpu          CUDA support compiled in; no usable GPU here (%s)\n", err.msg);
        }
    } else {
        printf("gpu          not compiled in (CPU-only build: no nvcc, or make CUDA=0)\n");
    }
    return 0;
}

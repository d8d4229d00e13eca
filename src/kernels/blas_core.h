/* blas_core: which OpenBLAS core (its kernel set) the process runs, decided from zaya's own CPU detection.
 *
 * OpenBLAS picks its core when it loads, from a table of CPU models; a CPU newer than the library falls back to an
 * old core (Debian's 0.3.21 runs a 5th-generation Xeon, family 6 model 207, on its SSE3 "Prescott" kernels at a
 * quarter of the speed, and AMD Zen 4/5 on AVX2 ones). zaya compares that pick with what the CPU's features allow
 * and, where the library chose weaker kernels than the process's kernel level, asks for the strongest core the
 * CPU runs (OPENBLAS_CORETYPE, read when the library loads: src/cli/main.c sets it and re-executes). A forced
 * ZAYA_CPU level below the best holds OpenBLAS to the same instructions; a value the user set always wins. */
#ifndef ZAYA_BLAS_CORE_H
#define ZAYA_BLAS_CORE_H

#include <stddef.h>

#include "kernels/cpu.h"

/* The instructions a core's kernels use, weakest first. */
typedef enum {
    ZY_BLAS_UNKNOWN = -1, /* a name zaya does not know (a newer library) */
    ZY_BLAS_SSE,          /* Prescott, Core2, Nehalem, Barcelona, Atom, ... */
    ZY_BLAS_AVX,          /* Sandybridge, Bulldozer ... Excavator */
    ZY_BLAS_AVX2,         /* Haswell, Zen */
    ZY_BLAS_AVX512        /* SkylakeX, Cooperlake, SapphireRapids */
} ZyBlasClass;

/* The class of an OpenBLAS core name as openblas_get_corename() or OPENBLAS_CORETYPE spell it (any case). */
ZyBlasClass zy_blas_core_class(const char *core);
/* "sse", "avx", "avx2", "avx512", "unknown". */
const char *zy_blas_class_name(ZyBlasClass c);
/* The class a kernel level's products need: generic SSE, avx2 AVX2, avx512 and avx512bf16 AVX-512. */
ZyBlasClass zy_blas_class_for_level(ZyCpuLevel level);
/* The core zaya asks for at a level: Nehalem, Haswell (Zen on AMD), SkylakeX. */
const char *zy_blas_core_for_level(const ZyCpuInfo *ci, ZyCpuLevel level);

/* One core per instruction class this CPU (with its OS) runs, weakest first, space-separated: "Prescott Sandybridge
 * Haswell SkylakeX" (Zen for Haswell on AMD). The tests run under each. */
void zy_blas_cores_runnable(const ZyCpuInfo *ci, char *out, size_t cap);

typedef struct {
    const char *set; /* the OPENBLAS_CORETYPE to set before the library loads, or NULL: keep what it runs */
    int ok;          /* the core that will run (set, or else the current one) has the level's class */
    char why[240];   /* one sentence for zaya info */
} ZyBlasCoreChoice;

/* The decision, from the CPU, the process's kernel level (forced: chosen by ZAYA_CPU), the core the library runs
 * (NULL: it does not say) and OPENBLAS_CORETYPE as the user left it (NULL: unset). */
void zy_blas_core_choose(const ZyCpuInfo *ci, ZyCpuLevel level, int forced, const char *library_core,
                         const char *user_coretype, ZyBlasCoreChoice *out);

#endif

#include "kernels/blas_core.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

/* OpenBLAS's x86-64 core names (driver/others/dynamic.c) by the instructions their kernels use. */
static const struct {
    const char *name;
    ZyBlasClass cls;
} cores[] = {
    {"Katmai", ZY_BLAS_SSE},      {"Coppermine", ZY_BLAS_SSE},   {"Northwood", ZY_BLAS_SSE},
    {"Prescott", ZY_BLAS_SSE},    {"Banias", ZY_BLAS_SSE},       {"Core2", ZY_BLAS_SSE},
    {"Penryn", ZY_BLAS_SSE},      {"Dunnington", ZY_BLAS_SSE},   {"Nehalem", ZY_BLAS_SSE},
    {"Atom", ZY_BLAS_SSE},        {"Athlon", ZY_BLAS_SSE},       {"Opteron", ZY_BLAS_SSE},
    {"Opteron(SSE3)", ZY_BLAS_SSE}, {"Barcelona", ZY_BLAS_SSE},  {"Nano", ZY_BLAS_SSE},
    {"Bobcat", ZY_BLAS_SSE},      {"Sandybridge", ZY_BLAS_AVX},  {"Bulldozer", ZY_BLAS_AVX},
    {"Piledriver", ZY_BLAS_AVX},  {"Steamroller", ZY_BLAS_AVX},  {"Excavator", ZY_BLAS_AVX},
    {"Haswell", ZY_BLAS_AVX2},    {"Zen", ZY_BLAS_AVX2},         {"SkylakeX", ZY_BLAS_AVX512},
    {"Cooperlake", ZY_BLAS_AVX512}, {"SapphireRapids", ZY_BLAS_AVX512},
};

ZyBlasClass zy_blas_core_class(const char *core) {
    if (!core) return ZY_BLAS_UNKNOWN;
    for (size_t i = 0; i < sizeof cores / sizeof cores[0]; i++)
        if (strcasecmp(core, cores[i].name) == 0) return cores[i].cls;
    return ZY_BLAS_UNKNOWN;
}

const char *zy_blas_class_name(ZyBlasClass c) {
    switch (c) {
    case ZY_BLAS_SSE: return "sse";
    case ZY_BLAS_AVX: return "avx";
    case ZY_BLAS_AVX2: return "avx2";
    case ZY_BLAS_AVX512: return "avx512";
    default: return "unknown";
    }
}

ZyBlasClass zy_blas_class_for_level(ZyCpuLevel level) {
    return level >= ZY_CPU_AVX512 ? ZY_BLAS_AVX512 : level == ZY_CPU_AVX2 ? ZY_BLAS_AVX2 : ZY_BLAS_SSE;
}

const char *zy_blas_core_for_level(const ZyCpuInfo *ci, ZyCpuLevel level) {
    switch (zy_blas_class_for_level(level)) {
    case ZY_BLAS_AVX512: return "SkylakeX"; /* Cooperlake and SapphireRapids add bf16 kernels zaya does not call */
    case ZY_BLAS_AVX2: return strcmp(ci->vendor, "AuthenticAMD") == 0 ? "Zen" : "Haswell";
    default: return "Nehalem"; /* SSE4.2: the build's x86-64-v2 baseline */
    }
}

void zy_blas_cores_runnable(const ZyCpuInfo *ci, char *out, size_t cap) {
    snprintf(out, cap, "Prescott%s%s%s", ci->avx && ci->os_avx ? " Sandybridge" : "",
             zy_cpu_supports(ci, ZY_CPU_AVX2) ? (strcmp(ci->vendor, "AuthenticAMD") == 0 ? " Zen" : " Haswell") : "",
             zy_cpu_supports(ci, ZY_CPU_AVX512) ? " SkylakeX" : "");
}

void zy_blas_core_choose(const ZyCpuInfo *ci, ZyCpuLevel level, int forced, const char *library_core,
                         const char *user_coretype, ZyBlasCoreChoice *out) {
    const ZyBlasClass want = zy_blas_class_for_level(level);
    const char *lvl = zy_cpu_level_name(level);
    out->set = NULL;
    if (user_coretype && *user_coretype) {
        const ZyBlasClass have = zy_blas_core_class(library_core ? library_core : user_coretype);
        out->ok = have == want || have == ZY_BLAS_UNKNOWN;
        if (out->ok)
            snprintf(out->why, sizeof out->why, "OPENBLAS_CORETYPE=%s, set by you (%s kernels, as the %s level needs)",
                     user_coretype, zy_blas_class_name(have), lvl);
        else
            snprintf(out->why, sizeof out->why, "OPENBLAS_CORETYPE=%s, set by you (%s kernels; the %s level needs %s)",
                     user_coretype, zy_blas_class_name(have), lvl, zy_blas_class_name(want));
        return;
    }
    if (!library_core) {
        out->ok = 1;
        snprintf(out->why, sizeof out->why, "the BLAS does not name its core: kept as it is");
        return;
    }
    const ZyBlasClass have = zy_blas_core_class(library_core);
    if (have == ZY_BLAS_UNKNOWN) {
        out->ok = 1;
        snprintf(out->why, sizeof out->why, "OpenBLAS's own pick, %s, a core zaya does not know (a newer library): kept",
                 library_core);
        return;
    }
    if (have == want) {
        out->ok = 1;
        snprintf(out->why, sizeof out->why, "OpenBLAS's own pick (%s kernels, as the %s level needs)",
                 zy_blas_class_name(have), lvl);
        return;
    }
    out->set = zy_blas_core_for_level(ci, level);
    out->ok = 1;
    if (have < want)
        snprintf(out->why, sizeof out->why,
                 "set by zaya: OpenBLAS picked %s (%s kernels) on a CPU whose best kernel level is %s%s",
                 library_core, zy_blas_class_name(have), zy_cpu_level_name(zy_cpu_best_level(ci)),
                 forced ? " (ZAYA_CPU chose this level)" : "");
    else
        snprintf(out->why, sizeof out->why, "set by zaya: ZAYA_CPU=%s holds OpenBLAS (which picked %s) to %s kernels",
                 lvl, library_core, zy_blas_class_name(want));
}

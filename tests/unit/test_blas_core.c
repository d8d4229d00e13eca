/* The OpenBLAS core zaya asks for (kernels/blas_core.h), from simulated CPUID leaves of CPUs this machine is not:
 * Intel family 6 models 143 (Sapphire Rapids) and 207 (Emerald Rapids, the Xeon where Debian's OpenBLAS 0.3.21 falls
 * back to Prescott), an Intel model no library knows yet, AMD Zen 3, 4 and 5 — each against the cores OpenBLAS may
 * pick on it. */
#include <string.h>

#include "kernels/blas_core.h"
#include "kernels/cpu.h"
#include "test.h"

typedef struct {
    const char *vendor; /* 12 characters */
    unsigned signature; /* CPUID.1:EAX */
    int avx512, bf16, amx;
    unsigned long long xcr0;
} SimCpu;

enum {
    ECX1 = (1u << 12) | (1u << 20) | (1u << 22) | (1u << 23) | (1u << 27) | (1u << 28) | (1u << 29), /* fma sse4.2
        movbe popcnt osxsave avx f16c */
    EBX7_AVX2 = (1u << 3) | (1u << 5) | (1u << 8),                                   /* bmi1 avx2 bmi2 */
    EBX7_AVX512 = (1u << 16) | (1u << 17) | (1u << 28) | (1u << 30) | (1u << 31),    /* f dq cd bw vl */
};

static void sim_leaf(void *ctx, unsigned leaf, unsigned sub, unsigned r[4]) {
    const SimCpu *c = ctx;
    r[0] = r[1] = r[2] = r[3] = 0;
    switch (leaf) {
    case 0:
        r[0] = 7;
        memcpy(&r[1], c->vendor, 4), memcpy(&r[3], c->vendor + 4, 4), memcpy(&r[2], c->vendor + 8, 4);
        break;
    case 1: r[0] = c->signature, r[2] = ECX1; break;
    case 7:
        if (sub == 0) {
            r[0] = 1;
            r[1] = EBX7_AVX2 | (c->avx512 ? (unsigned)EBX7_AVX512 : 0u);
            r[3] = c->amx ? 1u << 22 : 0;
        } else if (sub == 1) {
            r[0] = c->bf16 ? 1u << 5 : 0;
        }
        break;
    case 0x80000000u: r[0] = 0x80000001u; break;
    case 0x80000001u: r[2] = 1u << 5; break; /* lzcnt */
    }
}

static unsigned long long sim_xcr0(void *ctx) { return ((const SimCpu *)ctx)->xcr0; }

static ZyCpuInfo sim(const SimCpu *c) {
    ZyCpuInfo ci;
    zy_cpu_detect_from(&ci, &(ZyCpuid){.leaf = sim_leaf, .xgetbv0 = sim_xcr0, .ctx = (void *)c});
    return ci;
}

#define XCR0_AVX 0x7ull
#define XCR0_AVX512 0xe7ull
static const SimCpu spr = {"GenuineIntel", 0x000806F8, 1, 1, 1, XCR0_AVX512}; /* 6/143 */
static const SimCpu emr = {"GenuineIntel", 0x000C06F2, 1, 1, 0, XCR0_AVX512}; /* 6/207, AMX not exposed (a VM) */
static const SimCpu future = {"GenuineIntel", 0x00400F10, 1, 1, 1, XCR0_AVX512}; /* family 19: no table has it */
static const SimCpu zen3 = {"AuthenticAMD", 0x00A00F11, 0, 0, 0, XCR0_AVX};     /* 25/1 (Milan) */
static const SimCpu zen4 = {"AuthenticAMD", 0x00A10F11, 1, 1, 0, XCR0_AVX512};  /* 25/17 (Genoa) */
static const SimCpu zen5 = {"AuthenticAMD", 0x00B00F20, 1, 1, 0, XCR0_AVX512};  /* 26/2 (Turin) */
static const SimCpu zen4_no_os = {"AuthenticAMD", 0x00A10F11, 1, 1, 0, XCR0_AVX}; /* an OS without AVX-512 state */

/* The core zaya sets ("" = it keeps the library's) for a CPU at a level, given the library's pick. */
static const char *chosen(const SimCpu *c, const char *zaya_cpu, const char *library_core, const char *user,
                          int *ok) {
    ZyCpuInfo ci = sim(c);
    ZyCpuLevel level;
    if (zy_cpu_choose_level(zaya_cpu, &ci, &level, NULL)) return "(level refused)";
    ZyBlasCoreChoice bc;
    zy_blas_core_choose(&ci, level, zaya_cpu != NULL, library_core, user, &bc);
    if (ok) *ok = bc.ok;
    return bc.set ? bc.set : "";
}

TEST(cpuid_decoding_of_simulated_cpus) {
    const struct {
        const SimCpu *c;
        int family, model;
        ZyCpuLevel best;
    } want[] = {{&spr, 6, 143, ZY_CPU_AVX512BF16}, {&emr, 6, 207, ZY_CPU_AVX512BF16},
                {&future, 19, 1, ZY_CPU_AVX512BF16}, {&zen3, 25, 1, ZY_CPU_AVX2},
                {&zen4, 25, 17, ZY_CPU_AVX512BF16}, {&zen5, 26, 2, ZY_CPU_AVX512BF16},
                {&zen4_no_os, 25, 17, ZY_CPU_AVX2}};
    for (size_t i = 0; i < ZY_ARRAY_LEN(want); i++) {
        ZyCpuInfo ci = sim(want[i].c);
        CHECK_MSG(ci.family == want[i].family && ci.model == want[i].model, "case %zu: family %d model %d", i,
                  ci.family, ci.model);
        CHECK_MSG(zy_cpu_best_level(&ci) == want[i].best, "case %zu: level %s", i,
                  zy_cpu_level_name(zy_cpu_best_level(&ci)));
        CHECK(strcmp(ci.vendor, want[i].c->vendor) == 0);
    }
    CHECK(sim(&spr).amx_bf16 && !sim(&emr).amx_bf16);
}

TEST(blas_core_follows_the_cpu_features_not_the_library_table) {
    const struct {
        const SimCpu *c;
        const char *zaya_cpu, *library, *user, *set;
    } cases[] = {
        /* the library does not know the CPU and falls back: zaya asks for the strongest core its features run */
        {&emr, NULL, "Prescott", NULL, "SkylakeX"},
        {&spr, NULL, "Prescott", NULL, "SkylakeX"},
        {&future, NULL, "Prescott", NULL, "SkylakeX"},
        {&future, NULL, "Sandybridge", NULL, "SkylakeX"},
        {&zen5, NULL, "Prescott", NULL, "SkylakeX"},
        {&zen4, NULL, "Zen", NULL, "SkylakeX"},
        {&zen4, NULL, "Haswell", NULL, "SkylakeX"},
        {&zen3, NULL, "Prescott", NULL, "Zen"},
        {&zen3, NULL, "Nehalem", NULL, "Zen"},
        /* the library's own pick already matches: kept (an AVX-512 core with bf16 kernels is no weaker) */
        {&spr, NULL, "SapphireRapids", NULL, ""},
        {&emr, NULL, "Cooperlake", NULL, ""},
        {&zen3, NULL, "Zen", NULL, ""},
        {&zen4_no_os, NULL, "Zen", NULL, ""},
        /* an OS that does not save AVX-512 registers: held to AVX2 whatever the library thinks */
        {&zen4_no_os, NULL, "SkylakeX", NULL, "Zen"},
        /* ZAYA_CPU below the best holds the library to the same instructions, and above its pick raises it */
        {&zen4, "generic", "Zen", NULL, "Nehalem"},
        {&zen4, "avx2", "Zen", NULL, ""},
        {&emr, "avx2", "Prescott", NULL, "Haswell"},
        {&emr, "avx2", "SkylakeX", NULL, "Haswell"},
        {&emr, "avx512", "Prescott", NULL, "SkylakeX"},
        /* a core the user set, or one zaya does not know, is left alone */
        {&emr, NULL, "Prescott", "Prescott", ""},
        {&zen5, NULL, "Zen5", NULL, ""},
    };
    for (size_t i = 0; i < ZY_ARRAY_LEN(cases); i++) {
        const char *got = chosen(cases[i].c, cases[i].zaya_cpu, cases[i].library, cases[i].user, NULL);
        CHECK_MSG(strcmp(got, cases[i].set) == 0, "case %zu (library %s, ZAYA_CPU %s): set \"%s\", want \"%s\"", i,
                  cases[i].library, cases[i].zaya_cpu ? cases[i].zaya_cpu : "-", got, cases[i].set);
    }
    /* what the check reports: the user's SSE core under an AVX-512 level is a mismatch, zaya's own choices are not */
    int ok = -1;
    chosen(&emr, NULL, "Prescott", "Prescott", &ok);
    CHECK(ok == 0);
    chosen(&emr, NULL, "Prescott", NULL, &ok);
    CHECK(ok == 1);
}

TEST(blas_core_names_and_classes) {
    CHECK(zy_blas_core_class("Prescott") == ZY_BLAS_SSE && zy_blas_core_class("NEHALEM") == ZY_BLAS_SSE);
    CHECK(zy_blas_core_class("Sandybridge") == ZY_BLAS_AVX && zy_blas_core_class("Excavator") == ZY_BLAS_AVX);
    CHECK(zy_blas_core_class("Haswell") == ZY_BLAS_AVX2 && zy_blas_core_class("zen") == ZY_BLAS_AVX2);
    CHECK(zy_blas_core_class("SkylakeX") == ZY_BLAS_AVX512 && zy_blas_core_class("SapphireRapids") == ZY_BLAS_AVX512);
    CHECK(zy_blas_core_class("Zen5") == ZY_BLAS_UNKNOWN && zy_blas_core_class(NULL) == ZY_BLAS_UNKNOWN);
    /* every core zaya asks for is one it knows, of the level's class */
    const SimCpu *cpus[] = {&emr, &zen4};
    for (int c = 0; c < 2; c++) {
        ZyCpuInfo ci = sim(cpus[c]);
        for (int l = 0; l < ZY_CPU_LEVELS; l++) {
            const char *core = zy_blas_core_for_level(&ci, (ZyCpuLevel)l);
            CHECK(zy_blas_core_class(core) == zy_blas_class_for_level((ZyCpuLevel)l));
        }
    }
    char list[128];
    ZyCpuInfo ci = sim(&zen3);
    zy_blas_cores_runnable(&ci, list, sizeof list);
    CHECK_MSG(strcmp(list, "Prescott Sandybridge Zen") == 0, "%s", list);
    ci = sim(&emr);
    zy_blas_cores_runnable(&ci, list, sizeof list);
    CHECK_MSG(strcmp(list, "Prescott Sandybridge Haswell SkylakeX") == 0, "%s", list);
}

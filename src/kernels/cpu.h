/* cpu: what the processor can do, read from CPUID at run time, and the kernel level the process runs at.
 *
 * One binary runs on every x86-64 CPU from x86-64-v2 up: the hot kernels are compiled once per level
 * (kernel_table.h) and the process picks the best level this CPU and its OS support, or the one ZAYA_CPU names. */
#ifndef ZAYA_CPU_H
#define ZAYA_CPU_H

#include "util/util.h"

/* Kernel levels, each including the ones before it. */
typedef enum {
    ZY_CPU_GENERIC,    /* the build's baseline (x86-64-v2 on x86-64; whatever the compiler targets elsewhere) */
    ZY_CPU_AVX2,       /* x86-64-v3: AVX2, FMA, F16C, BMI1/2, LZCNT, MOVBE */
    ZY_CPU_AVX512,     /* x86-64-v4: AVX-512 F, BW, CD, DQ, VL */
    ZY_CPU_AVX512BF16, /* x86-64-v4 and AVX512-BF16 (vdpbf16ps: Zen 4/5, Cooper Lake, Sapphire Rapids and later) */
    ZY_CPU_LEVELS
} ZyCpuLevel;

typedef struct {
    char vendor[13];
    char brand[49];
    int family, model, stepping;
    /* instruction sets the CPU reports and, for AVX and AVX-512, whose registers the OS saves (XGETBV) */
    unsigned sse42 : 1, popcnt : 1, avx : 1, avx2 : 1, fma : 1, f16c : 1, bmi1 : 1, bmi2 : 1, lzcnt : 1, movbe : 1;
    unsigned avx512f : 1, avx512bw : 1, avx512cd : 1, avx512dq : 1, avx512vl : 1, avx512bf16 : 1;
    unsigned amx_bf16 : 1, os_avx : 1, os_avx512 : 1;
    /* the integer dot products (vpdpbusd) the quantized-weight kernels use: AVX512-VNNI (EVEX) and AVX-VNNI (VEX) */
    unsigned avx512vnni : 1, avxvnni : 1;
} ZyCpuInfo;

/* Reads CPUID (and XGETBV). On other architectures everything is 0 and the level is generic. */
void zy_cpu_detect(ZyCpuInfo *ci);
/* The same decoding from any source of CPUID leaves and XCR0: the tests feed it other CPUs' values. */
typedef struct {
    void (*leaf)(void *ctx, unsigned leaf, unsigned subleaf, unsigned eax_ebx_ecx_edx[4]); /* all 0 if absent */
    unsigned long long (*xgetbv0)(void *ctx);                                                /* XCR0 */
    void *ctx;
} ZyCpuid;
void zy_cpu_detect_from(ZyCpuInfo *ci, const ZyCpuid *src);
/* The highest level whose instructions this CPU has and its OS enables. */
ZyCpuLevel zy_cpu_best_level(const ZyCpuInfo *ci);
/* Whether the CPU (with its OS) can run kernels of `level`. */
int zy_cpu_supports(const ZyCpuInfo *ci, ZyCpuLevel level);
/* "generic", "avx2", "avx512", "avx512bf16". */
const char *zy_cpu_level_name(ZyCpuLevel level);
/* The features found, space-separated, in CPUID order ("sse4.2 popcnt avx avx2 fma ... avx512bf16"). */
void zy_cpu_features_string(const ZyCpuInfo *ci, char *out, size_t cap);

/* The level a ZAYA_CPU value asks for, checked against the CPU: NULL or "" (or "auto") gives the best level; a
 * name the CPU cannot run, or one that is not a level, is an error naming ZAYA_CPU and the reason. */
int zy_cpu_choose_level(const char *zaya_cpu, const ZyCpuInfo *ci, ZyCpuLevel *out, ZyErr *err);

/* The process's kernel level: set once by the program's entry (zy_cpu_set_level, after zy_cpu_choose_level);
 * until then, and in programs that never set it, the best level of this CPU. */
ZyCpuLevel zy_cpu_level(void);
void zy_cpu_set_level(ZyCpuLevel level);
/* For a program's entry: detects the CPU, chooses the level ZAYA_CPU (zaya_cpu) asks for and sets it; -1 with the
 * reason otherwise (nothing set). */
int zy_cpu_init(const char *zaya_cpu, ZyErr *err);

#endif

#include "kernels/cpu.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define ZY_X86 1
#endif

static const char *const level_names[ZY_CPU_LEVELS] = {"generic", "avx2", "avx512", "avx512bf16"};

const char *zy_cpu_level_name(ZyCpuLevel level) {
    return level >= 0 && level < ZY_CPU_LEVELS ? level_names[level] : "?";
}

#ifdef ZY_X86
static void cpuid_native(void *ctx, unsigned leaf, unsigned sub, unsigned r[4]) {
    (void)ctx;
    if (!__get_cpuid_count(leaf, sub, &r[0], &r[1], &r[2], &r[3])) r[0] = r[1] = r[2] = r[3] = 0;
}

/* XCR0: which register states the OS saves on a context switch (without it AVX registers would be clobbered). */
static unsigned long long xgetbv0_native(void *ctx) {
    (void)ctx;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}
#endif

void zy_cpu_detect(ZyCpuInfo *ci) {
#ifdef ZY_X86
    zy_cpu_detect_from(ci, &(ZyCpuid){.leaf = cpuid_native, .xgetbv0 = xgetbv0_native});
#else
    memset(ci, 0, sizeof *ci);
#endif
}

void zy_cpu_detect_from(ZyCpuInfo *ci, const ZyCpuid *src) {
    memset(ci, 0, sizeof *ci);
    unsigned r[4];
#define cpuid(l, sub, r) src->leaf(src->ctx, l, sub, r)
    cpuid(0, 0, r);
    const unsigned max_leaf = r[0];
    memcpy(ci->vendor, &r[1], 4), memcpy(ci->vendor + 4, &r[3], 4), memcpy(ci->vendor + 8, &r[2], 4);
    if (max_leaf >= 1) {
        cpuid(1, 0, r);
        const unsigned base_family = (r[0] >> 8) & 0xf, base_model = (r[0] >> 4) & 0xf;
        ci->family = (int)(base_family == 0xf ? base_family + ((r[0] >> 20) & 0xff) : base_family);
        ci->model = (int)(base_family == 0x6 || base_family == 0xf ? base_model | (((r[0] >> 16) & 0xf) << 4)
                                                                   : base_model);
        ci->stepping = (int)(r[0] & 0xf);
        const unsigned c = r[2];
        ci->fma = (c >> 12) & 1, ci->sse42 = (c >> 20) & 1, ci->movbe = (c >> 22) & 1, ci->popcnt = (c >> 23) & 1;
        ci->avx = (c >> 28) & 1, ci->f16c = (c >> 29) & 1;
        if ((c >> 27) & 1) { /* OSXSAVE: XGETBV is available */
            const unsigned long long xcr0 = src->xgetbv0(src->ctx);
            ci->os_avx = (xcr0 & 0x6) == 0x6;             /* XMM and YMM state */
            ci->os_avx512 = ci->os_avx && (xcr0 & 0xe0) == 0xe0; /* opmask, ZMM0-15 upper halves, ZMM16-31 */
        }
    }
    if (max_leaf >= 7) {
        cpuid(7, 0, r);
        const unsigned b = r[1], max_sub = r[0];
        ci->bmi1 = (b >> 3) & 1, ci->avx2 = (b >> 5) & 1, ci->bmi2 = (b >> 8) & 1, ci->avx512f = (b >> 16) & 1;
        ci->avx512dq = (b >> 17) & 1, ci->avx512cd = (b >> 28) & 1, ci->avx512bw = (b >> 30) & 1;
        ci->avx512vl = (b >> 31) & 1, ci->amx_bf16 = (r[3] >> 22) & 1, ci->avx512vnni = (r[2] >> 11) & 1;
        if (max_sub >= 1) {
            cpuid(7, 1, r);
            ci->avx512bf16 = (r[0] >> 5) & 1, ci->avxvnni = (r[0] >> 4) & 1;
        }
    }
    cpuid(0x80000000u, 0, r);
    const unsigned max_ext = r[0];
    if (max_ext >= 0x80000001u) {
        cpuid(0x80000001u, 0, r);
        ci->lzcnt = (r[2] >> 5) & 1;
    }
    if (max_ext >= 0x80000004u) {
        for (unsigned i = 0; i < 3; i++) {
            cpuid(0x80000002u + i, 0, r);
            memcpy(ci->brand + 16 * i, r, 16);
        }
        /* the brand string is padded with leading spaces on some CPUs */
        size_t skip = strspn(ci->brand, " ");
        memmove(ci->brand, ci->brand + skip, strlen(ci->brand + skip) + 1);
    }
#undef cpuid
}

int zy_cpu_supports(const ZyCpuInfo *ci, ZyCpuLevel level) {
    const int v3 = ci->os_avx && ci->avx && ci->avx2 && ci->fma && ci->f16c && ci->bmi1 && ci->bmi2 && ci->lzcnt &&
                   ci->movbe;
    const int v4 = v3 && ci->os_avx512 && ci->avx512f && ci->avx512bw && ci->avx512cd && ci->avx512dq && ci->avx512vl;
    switch (level) {
    case ZY_CPU_GENERIC: return 1;
    case ZY_CPU_AVX2: return v3;
    case ZY_CPU_AVX512: return v4;
    case ZY_CPU_AVX512BF16: return v4 && ci->avx512bf16;
    default: return 0;
    }
}

ZyCpuLevel zy_cpu_best_level(const ZyCpuInfo *ci) {
    ZyCpuLevel best = ZY_CPU_GENERIC;
    for (int l = ZY_CPU_AVX2; l < ZY_CPU_LEVELS; l++)
        if (zy_cpu_supports(ci, (ZyCpuLevel)l)) best = (ZyCpuLevel)l;
    return best;
}

void zy_cpu_features_string(const ZyCpuInfo *ci, char *out, size_t cap) {
    const struct {
        const char *name;
        int on;
    } f[] = {{"sse4.2", ci->sse42},       {"popcnt", ci->popcnt},       {"avx", ci->avx},
             {"avx2", ci->avx2},          {"fma", ci->fma},             {"f16c", ci->f16c},
             {"bmi1", ci->bmi1},          {"bmi2", ci->bmi2},           {"lzcnt", ci->lzcnt},
             {"movbe", ci->movbe},        {"avx512f", ci->avx512f},     {"avx512bw", ci->avx512bw},
             {"avx512cd", ci->avx512cd},  {"avx512dq", ci->avx512dq},   {"avx512vl", ci->avx512vl},
             {"avx512bf16", ci->avx512bf16}, {"amx-bf16", ci->amx_bf16}, {"avx512vnni", ci->avx512vnni},
             {"avxvnni", ci->avxvnni}};
    size_t n = 0;
    if (cap) out[0] = '\0';
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        if (!f[i].on) continue;
        int w = snprintf(out + n, n < cap ? cap - n : 0, "%s%s", n ? " " : "", f[i].name);
        if (w > 0) n += (size_t)w;
    }
    if (n == 0 && cap) snprintf(out, cap, "(none of the listed)");
}

int zy_cpu_choose_level(const char *zaya_cpu, const ZyCpuInfo *ci, ZyCpuLevel *out, ZyErr *err) {
    const ZyCpuLevel best = zy_cpu_best_level(ci);
    if (!zaya_cpu || !*zaya_cpu || strcasecmp(zaya_cpu, "auto") == 0) {
        *out = best;
        return 0;
    }
    for (int l = 0; l < ZY_CPU_LEVELS; l++) {
        if (strcasecmp(zaya_cpu, level_names[l]) != 0) continue;
        if (!zy_cpu_supports(ci, (ZyCpuLevel)l))
            return zy_fail(err, "ZAYA_CPU=%s: this CPU cannot run that kernel level (the highest it can is %s)",
                           zaya_cpu, level_names[best]);
        *out = (ZyCpuLevel)l;
        return 0;
    }
    return zy_fail(err, "ZAYA_CPU=%s: not a kernel level (one of generic, avx2, avx512, avx512bf16, auto)", zaya_cpu);
}

/* The process's level: written once by the entry point, read by every kernel call (-1: not chosen yet). */
static atomic_int process_level = -1;

ZyCpuLevel zy_cpu_level(void) {
    int l = atomic_load_explicit(&process_level, memory_order_relaxed);
    if (l >= 0) return (ZyCpuLevel)l;
    ZyCpuInfo ci;
    zy_cpu_detect(&ci);
    l = (int)zy_cpu_best_level(&ci);
    int expected = -1;
    atomic_compare_exchange_strong(&process_level, &expected, l);
    return (ZyCpuLevel)atomic_load(&process_level);
}

void zy_cpu_set_level(ZyCpuLevel level) { atomic_store(&process_level, (int)level); }

int zy_cpu_init(const char *zaya_cpu, ZyErr *err) {
    ZyCpuInfo ci;
    ZyCpuLevel level;
    zy_cpu_detect(&ci);
    if (zy_cpu_choose_level(zaya_cpu, &ci, &level, err)) return -1;
    zy_cpu_set_level(level);
    return 0;
}

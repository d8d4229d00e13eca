/* The many-row products with quantized weights (quant_many.h): fp32 panels for sgemm, bf16 panels for oneDNN's bf16
 * matmul, oneDNN's int8 matmul over the groups; which one the process runs. */
#include "kernels/quant_many.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef ZY_HAVE_DNNL
#include <dnnl.h>
#endif

#include "kernels/cpu.h"
#include "kernels/matmul.h"

static const char *const path_names[ZY_QMANY_COUNT] = {"panels", "bf16", "int8"};

const char *zy_quant_many_name(ZyQuantMany m) { return m >= 0 && m < ZY_QMANY_COUNT ? path_names[m] : "?"; }

int zy_quant_many_bf16_native(void) {
    char why[128];
    return zy_bf16_products_available(ZY_BF16_PRODUCTS_ONEDNN, why, sizeof why);
}

/* ---- bf16: panels dequantized, rounded to bf16, oneDNN's bf16 matmul through the bf16 GEMM seam ---- */

/* The seam's oneDNN primitives and bf16 copies, one per thread (a ZyGemmCtx is not shared between threads); kept for
 * the process, as a run's products repeat their shapes. */
static _Thread_local ZyGemmCtx bf16_ctx;

static int many_bf16(int rows, int out, int in, const float *X, int ldx, const ZyQuantMatrix *W, float *Y, int ldy) {
    const int panel = out < ZY_QUANT_PANEL ? out : ZY_QUANT_PANEL;
    float *wp = malloc((size_t)panel * in * sizeof *wp);
    if (!wp) return -1;
    /* SGEMM: the same bf16-rounded operands widened back to fp32 (where oneDNN has no native bf16 kernel) */
    bf16_ctx.bf16 = zy_quant_many_bf16_native() ? ZY_BF16_PRODUCTS_ONEDNN : ZY_BF16_PRODUCTS_SGEMM;
    zy_gemm_ctx_weights_changed(&bf16_ctx); /* X (STABLE) is rounded to bf16 once for all the panels of this call */
    for (int o0 = 0; o0 < out; o0 += panel) {
        const int np = out - o0 < panel ? out - o0 : panel;
#pragma omp parallel for schedule(static) if ((long)np * in >= 65536L)
        for (int o = 0; o < np; o++) zy_quant_dequant_row(W, o0 + o, wp + (long)o * in);
        zy_gemm_ctx_ex(&bf16_ctx, 0, 1, rows, np, in, 1.0f, X, ldx, ZY_MM_STABLE, wp, in, ZY_MM_TEMP, 0.0f, Y + o0, ldy);
    }
    free(wp);
    return 0;
}

/* ---- int8: oneDNN's int8 matmul, one product of depth G per group ---- */
#ifdef ZY_HAVE_DNNL
/* oneDNN without VNNI sums each pair of u8 x s8 products in int16 (vpmaddubsw), saturating above 32767: 255 x 64 x 2
 * fits, 255 x 127 x 2 does not (measured on 2.6.3: a 255 x 127 dot product comes out halved). */
static int dnnl_int8_exact(void) {
    const unsigned isa = (unsigned)dnnl_get_effective_cpu_isa(), v512 = (unsigned)dnnl_cpu_isa_avx512_core_vnni,
                   v256 = (unsigned)dnnl_cpu_isa_avx2_vnni;
    return (isa & v512) == v512 || (isa & v256) == v256;
}

/* One batched product: codes [ng, np, G] (u8) x activations [ng, G, rows] (s8) -> [ng, np, rows] (s32). */
typedef struct {
    int ng, np, G, rows;
    dnnl_primitive_t prim;
    dnnl_memory_t a, b, c;
} Int8Prim;

enum { INT8_PRIMS = 8 };
static _Thread_local struct {
    dnnl_engine_t eng;
    dnnl_stream_t strm;
    Int8Prim p[INT8_PRIMS];
    int n, next, broken;
} i8;

static void int8_prim_free(Int8Prim *p) {
    if (p->prim) dnnl_primitive_destroy(p->prim);
    if (p->a) dnnl_memory_destroy(p->a);
    if (p->b) dnnl_memory_destroy(p->b);
    if (p->c) dnnl_memory_destroy(p->c);
    memset(p, 0, sizeof *p);
}

static Int8Prim *int8_prim(int ng, int np, int G, int rows) {
    if (!i8.eng && (dnnl_engine_create(&i8.eng, dnnl_cpu, 0) != dnnl_success ||
                    dnnl_stream_create(&i8.strm, i8.eng, dnnl_stream_default_flags) != dnnl_success))
        i8.broken = 1;
    if (i8.broken) return NULL;
    for (int i = 0; i < i8.n; i++)
        if (i8.p[i].ng == ng && i8.p[i].np == np && i8.p[i].G == G && i8.p[i].rows == rows) return &i8.p[i];
    Int8Prim *p = &i8.p[i8.n < INT8_PRIMS ? i8.n++ : (i8.next++ % INT8_PRIMS)]; /* a few shapes: oldest replaced */
    int8_prim_free(p);
    dnnl_memory_desc_t a_md, b_md, c_md;
    const dnnl_dims_t a_dims = {ng, np, G}, b_dims = {ng, G, rows}, c_dims = {ng, np, rows};
    /* sums stored [ng, rows, np] (along the outputs, as Y is) measured 20-500x slower: oneDNN's reference kernel */
    const dnnl_dims_t a_str = {(dnnl_dim_t)np * G, G, 1}, b_str = {(dnnl_dim_t)rows * G, 1, G},
                      c_str = {(dnnl_dim_t)np * rows, rows, 1};
    dnnl_matmul_desc_t md;
    dnnl_primitive_desc_t pd = NULL;
    int ok = dnnl_memory_desc_init_by_strides(&a_md, 3, a_dims, dnnl_u8, a_str) == dnnl_success &&
             dnnl_memory_desc_init_by_strides(&b_md, 3, b_dims, dnnl_s8, b_str) == dnnl_success &&
             dnnl_memory_desc_init_by_strides(&c_md, 3, c_dims, dnnl_s32, c_str) == dnnl_success &&
             dnnl_matmul_desc_init(&md, &a_md, &b_md, NULL, &c_md) == dnnl_success &&
             dnnl_primitive_desc_create(&pd, &md, NULL, i8.eng, NULL) == dnnl_success &&
             dnnl_primitive_create(&p->prim, pd) == dnnl_success &&
             dnnl_memory_create(&p->a, &a_md, i8.eng, DNNL_MEMORY_NONE) == dnnl_success &&
             dnnl_memory_create(&p->b, &b_md, i8.eng, DNNL_MEMORY_NONE) == dnnl_success &&
             dnnl_memory_create(&p->c, &c_md, i8.eng, DNNL_MEMORY_NONE) == dnnl_success;
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (!ok) {
        int8_prim_free(p);
        return NULL;
    }
    p->ng = ng, p->np = np, p->G = G, p->rows = rows;
    return p;
}

static int many_int8(int rows, int out, int in, const float *X, int ldx, const ZyQuantMatrix *W, float *Y, int ldy) {
    const int G = W->group_size, ng = in / G, bits = W->bits, c = 1 << (bits - 1);
    const int panel = out < ZY_QUANT_PANEL ? out : ZY_QUANT_PANEL;
    const float levels = (float)zy_quant_many_int8_levels(bits);
    int8_t *xq = malloc((size_t)rows * in);              /* [ng, rows, G]: group g's activations, row by row */
    float *ds = malloc(sizeof(float) * (size_t)rows * ng * 3); /* per [g, r]: d, c·d·Σxq, Σx */
    uint8_t *codes = malloc((size_t)panel * in);          /* [ng, np, G] */
    int32_t *sums = malloc(sizeof(int32_t) * (size_t)ng * panel * rows);
    float *scale = malloc(sizeof(float) * (size_t)ng * panel * 2), *offset = scale ? scale + (size_t)ng * panel : NULL;
    float *ytr = malloc(sizeof(float) * (size_t)panel * rows); /* the panel's outputs, [np, rows] */
    int failed = !xq || !ds || !codes || !sums || !scale || !ytr;
    if (!failed) {
        float *d = ds, *cd = ds + (size_t)rows * ng, *xsum = ds + (size_t)2 * rows * ng;
#pragma omp parallel for schedule(static) if ((long)rows * in >= 65536L)
        for (int r = 0; r < rows; r++)
            for (int g = 0; g < ng; g++) {
                const float *x = X + (long)r * ldx + (long)g * G;
                float amax = 0, s = 0;
                for (int k = 0; k < G; k++) amax = fmaxf(amax, fabsf(x[k])), s += x[k];
                const float dg = amax / levels, id = dg > 0 ? 1.0f / dg : 0.0f;
                int8_t *q = xq + ((size_t)g * rows + r) * G;
                int32_t isum = 0;
                for (int k = 0; k < G; k++) {
                    const float v = rintf(x[k] * id);
                    q[k] = (int8_t)(v > levels ? levels : v < -levels ? -levels : v);
                    isum += q[k];
                }
                d[(size_t)g * rows + r] = dg, cd[(size_t)g * rows + r] = (float)c * dg * (float)isum;
                xsum[(size_t)g * rows + r] = s;
            }
    }
    for (int o0 = 0; o0 < out && !failed; o0 += panel) {
        const int np = out - o0 < panel ? out - o0 : panel;
        Int8Prim *p = int8_prim(ng, np, G, rows);
        if (!p) {
            failed = 1;
            break;
        }
        /* the panel's codes as bytes, group by group; its scales s and c·s + b in fp32, [ng, np] */
#pragma omp parallel for schedule(static) if ((long)np * in >= 65536L)
        for (int o = 0; o < np; o++) {
            const uint8_t *row = (const uint8_t *)(W->q + (size_t)(o0 + o) * zy_quant_row_words(in, bits));
            for (int g = 0; g < ng; g++) {
                uint8_t *dst = codes + ((size_t)g * np + o) * G;
                if (bits == 8)
                    memcpy(dst, row + (size_t)g * G, (size_t)G);
                else /* the even column in the low nibble */
                    for (int j = 0; j < G / 2; j++) {
                        const uint8_t byte = row[(size_t)g * G / 2 + j];
                        dst[2 * j] = byte & 15, dst[2 * j + 1] = byte >> 4;
                    }
                const size_t at = (size_t)(o0 + o) * ng + g;
                const float sc = zy_quant_load(W->scale_dtype, W->scales, at);
                scale[(size_t)g * np + o] = sc;
                offset[(size_t)g * np + o] = (float)c * sc + zy_quant_load(W->scale_dtype, W->biases, at);
            }
        }
        dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, p->a}, {DNNL_ARG_WEIGHTS, p->b}, {DNNL_ARG_DST, p->c}};
        if (dnnl_memory_set_data_handle(p->a, codes) != dnnl_success ||
            dnnl_memory_set_data_handle(p->b, xq) != dnnl_success ||
            dnnl_memory_set_data_handle(p->c, sums) != dnnl_success ||
            dnnl_primitive_execute(p->prim, i8.strm, 3, args) != dnnl_success || dnnl_stream_wait(i8.strm) != dnnl_success) {
            failed = 1;
            break;
        }
        /* Σ_g s·d·(Σ xq q − c Σ xq) + (c·s + b)·Σx: the codes' offset c taken against the exact sums, as the few-row
         * int8 way does, so the activations' rounding weighs by |q − c| */
        const float *d = ds, *cd = ds + (size_t)rows * ng, *xsum = ds + (size_t)2 * rows * ng;
#pragma omp parallel for schedule(static) if ((long)np * rows * ng >= 65536L)
        for (int o = 0; o < np; o++) { /* along the rows, as the sums lie; then transposed into Y */
            float *yt = ytr + (size_t)o * rows;
            for (int r = 0; r < rows; r++) yt[r] = 0;
            for (int g = 0; g < ng; g++) {
                const int32_t *sg = sums + ((size_t)g * np + o) * rows;
                const float sc = scale[(size_t)g * np + o], of = offset[(size_t)g * np + o];
                const float *dg = d + (size_t)g * rows, *cdg = cd + (size_t)g * rows, *xg = xsum + (size_t)g * rows;
                for (int r = 0; r < rows; r++) yt[r] += sc * (dg[r] * (float)sg[r] - cdg[r]) + of * xg[r];
            }
        }
#pragma omp parallel for schedule(static) if ((long)np * rows >= 65536L)
        for (int r = 0; r < rows; r++)
            for (int o = 0; o < np; o++) Y[(long)r * ldy + o0 + o] = ytr[(size_t)o * rows + r];
    }
    free(xq), free(ds), free(codes), free(sums), free(scale), free(ytr);
    return failed ? -1 : 0;
}
#endif

/* ---- which path ---- */

int zy_quant_many_int8_levels(int bits) {
#ifdef ZY_HAVE_DNNL
    return bits == 8 && !dnnl_int8_exact() ? 64 : 127; /* 2·255·64 <= 32767 < 2·255·127 */
#else
    (void)bits;
    return 127;
#endif
}

int zy_quant_many_available(ZyQuantMany m, char *why, size_t cap) {
    if (m == ZY_QMANY_PANELS || m == ZY_QMANY_BF16) return 1;
    if (m != ZY_QMANY_INT8) {
        snprintf(why, cap, "not a many-row path");
        return 0;
    }
#ifdef ZY_HAVE_DNNL
    static atomic_int runs = -1; /* whether oneDNN makes an int8 matmul here: asked once */
    int r = atomic_load(&runs);
    if (r < 0) {
        r = int8_prim(1, 16, 32, 16) != NULL;
        atomic_store(&runs, r);
    }
    if (!r) snprintf(why, cap, "oneDNN %d.%d has no int8 matmul for this CPU", dnnl_version()->major, dnnl_version()->minor);
    return r;
#else
    snprintf(why, cap, "this zaya is built without oneDNN");
    return 0;
#endif
}

static atomic_int process_path = -1; /* -1: auto */

int zy_quant_many_set(const char *name, ZyErr *err) {
    if (!name || !*name || strcmp(name, "auto") == 0) {
        atomic_store(&process_path, -1);
        return 0;
    }
    for (int m = 0; m < ZY_QMANY_COUNT; m++) {
        if (strcmp(name, path_names[m]) != 0) continue;
        char why[160];
        if (!zy_quant_many_available((ZyQuantMany)m, why, sizeof why))
            return zy_fail(err, "ZAYA_QUANT_MANY=%s: cannot run here: %s", name, why);
        atomic_store(&process_path, m);
        return 0;
    }
    return zy_fail(err, "ZAYA_QUANT_MANY=%s: not a many-row path for quantized weights (auto, panels, bf16, int8)", name);
}

/* 1 where oneDNN runs bf16 matmuls on AMX tiles here (at the avx512bf16 level). */
static int bf16_amx(void) {
#ifdef ZY_HAVE_DNNL
    const unsigned isa = (unsigned)dnnl_get_effective_cpu_isa(), amx = (unsigned)dnnl_cpu_isa_avx512_core_amx;
    return zy_quant_many_bf16_native() && (isa & amx) == amx;
#else
    return 0;
#endif
}

ZyQuantMany zy_quant_many(void) {
    const int m = atomic_load_explicit(&process_path, memory_order_relaxed);
    if (m >= 0) return (ZyQuantMany)m;
    /* bf16 where it wins by construction: AMX tiles multiply bf16 at several times fp32 FMA's rate. Not on
     * AVX512-BF16 alone (oneDNN's bf16 matmul measured 0.71x sgemm there, docs/cpus.md), nor emulated (sgemm plus two
     * roundings); int8 measured slower than the panels here (docs/quantization.md) */
    return bf16_amx() ? ZY_QMANY_BF16 : ZY_QMANY_PANELS;
}

void zy_quant_many_describe(ZyQuantMany m, char *out, size_t cap) {
    const int forced = atomic_load(&process_path) >= 0;
    switch (m) {
    case ZY_QMANY_BF16:
        snprintf(out, cap, "bf16: panels dequantized to bf16, activations rounded to bf16, %s%s",
                 zy_quant_many_bf16_native() ? "oneDNN's bf16 matmul (native bf16 instructions)"
                                             : "the rounded values through sgemm (emulated: oneDNN has no native bf16 "
                                               "kernel here)",
                 forced ? " (ZAYA_QUANT_MANY)" : "");
        break;
    case ZY_QMANY_INT8:
        snprintf(out, cap, "int8: oneDNN's int8 matmul per group of columns, activations rounded per row and group%s%s",
                 zy_quant_many_int8_levels(8) < 127 ? " (7 bits against 8-bit codes: no VNNI)" : "",
                 forced ? " (ZAYA_QUANT_MANY)" : "");
        break;
    default:
        snprintf(out, cap, "panels: dequantized to fp32 for sgemm%s",
                 forced ? " (ZAYA_QUANT_MANY)" : " (no AMX for oneDNN's bf16 matmul here: the faster, measured)");
    }
}

int zy_matmul_quant_many(ZyQuantMany m, int rows, int out, int in, const float *X, int ldx, const ZyQuantMatrix *W,
                         float *Y, int ldy) {
    if (rows <= 0 || out <= 0 || in <= 0) return 0;
    switch (m) {
    case ZY_QMANY_PANELS: zy_matmul_quant_panels(rows, out, in, X, ldx, W, Y, ldy); return 0;
    case ZY_QMANY_BF16: return many_bf16(rows, out, in, X, ldx, W, Y, ldy);
#ifdef ZY_HAVE_DNNL
    case ZY_QMANY_INT8: {
        char why[160];
        return zy_quant_many_available(m, why, sizeof why) ? many_int8(rows, out, in, X, ldx, W, Y, ldy) : -1;
    }
#endif
    default: return -1;
    }
}

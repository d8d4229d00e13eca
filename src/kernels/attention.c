/* Fused, tiled causal GQA attention (attention.h), forward and backward side by side.
 *
 * Square TILE x TILE blocks of (query rows, key rows): query tile qt meets only key tiles kt <= qt, and only the
 * diagonal tile needs the causal mask (column c <= row r), so about half of the T x T work is skipped. With a
 * sliding window W (query t sees keys t-W+1..t) the key tiles wholly before every row's window are skipped too
 * (about T·W work instead of T²/2), and the tiles the window's start crosses mask a prefix of each row; a row may
 * see nothing of such a tile, and then leaves its running softmax as it was. W = 0 runs the plain causal path
 * unchanged. The forward
 * runs an online softmax over the key tiles (running row max m and sum l, rescaling the output accumulator) and
 * saves LSE = m + log l; the backward recomputes P = exp(S - LSE) per tile. The small matrix products go through
 * one register-blocked micro-kernel on GCC/Clang vector types (AVX2, AVX-512 or plain SSE, whatever -march
 * allows), and the exponentials through a polynomial that vectorises (libm's expf does not). */
#include "kernels/attention.h"
#include "kernels/kernel_table.h"

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

/* ISO C mode turns GCC's FMA contraction off; the micro-kernel wants it (Clang contracts within an expression). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=fast")
#endif
/* `omp simd` lets the row reductions vectorise; unoptimised (sanitizer) builds may decline the hint. */
#if defined(__clang__)
#pragma clang diagnostic ignored "-Wpass-failed"
#endif

/* Compiled once per CPU level (kernel_table.h): the public names carry the level's suffix. */
#ifndef ZY_ISA
#error "attention.c is compiled once per CPU level, with -DZY_ISA=<level> (see the Makefile)"
#endif

#define TILE ZY_ATTN_KEY_TILE

/* Vector width in floats: the widest registers -march allows (16-byte vectors are baseline on x86-64 and arm64).
 * -DZW=16 checks the AVX-512 layout on a machine without it (the compiler splits the vectors). */
#if defined(ZW)
#elif defined(__AVX512F__)
#define ZW 16
#elif defined(__AVX__)
#define ZW 8
#else
#define ZW 4
#endif
typedef float zvec __attribute__((vector_size(ZW * sizeof(float))));

static inline zvec vload(const float *p) {
    zvec v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline void vstore(float *p, zvec v) { memcpy(p, &v, sizeof v); }

static inline int round_up(int n, int m) { return (n + m - 1) / m * m; }

/* t + a·b for the scalar loops (columns past the last whole vector): one fused multiply-add where the vectors'
 * `x += a * b` contracts to one, else a multiply and an add as theirs. Left to fp-contract, GCC unrolls such a loop
 * and SLP-vectorises the products of the unrolled steps (a multiply, then separate adds) but fuses the leftover
 * steps: which sums fuse then hangs on the key count and the rows of the block, not on the element. */
static inline float fmadd(float a, float b, float t) {
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
    return __builtin_fmaf(a, b, t);
#else
    return t + a * b;
#endif
}

/* Which part of a diagonal tile a product may skip (row i, column j of the tile, causal: j <= i). */
enum { FULL, A_LOWER /* A(i,k) = 0 for k > i */, A_UPPER /* A(i,k) = 0 for k < i */, C_LOWER /* only C(i,n<=i) */ };

/* Rows i..i+MR-1 of C, columns n..n+NV·ZW-1, over k in [kb, ke): MR x NV accumulators stay in registers (MR and
 * NV are constants after inlining). */
static inline __attribute__((always_inline)) void mm_block(const int MR, const int NV, float *restrict C, long ldc,
                                                           const float *restrict A, long ars, long acs,
                                                           const float *restrict B, long ldb, int n, int kb, int ke,
                                                           int accumulate) {
    zvec x[6][2];
    for (int r = 0; r < MR; r++)
        for (int v = 0; v < NV; v++) x[r][v] = accumulate ? vload(C + r * ldc + n + v * ZW) : (zvec){0};
    for (int k = kb; k < ke; k++) {
        zvec b[2];
        for (int v = 0; v < NV; v++) b[v] = vload(B + k * ldb + n + v * ZW);
        for (int r = 0; r < MR; r++) {
            const float y = A[r * ars + k * acs];
            for (int v = 0; v < NV; v++) x[r][v] += y * b[v];
        }
    }
    for (int r = 0; r < MR; r++)
        for (int v = 0; v < NV; v++) vstore(C + r * ldc + n + v * ZW, x[r][v]);
}

/* The main 6 x 2 block spelled out and its k loop not unrolled: otherwise Clang spills accumulators to the stack. */
#if defined(__clang__)
#define NO_UNROLL _Pragma("clang loop unroll(disable)")
#else
#define NO_UNROLL
#endif
static inline __attribute__((always_inline)) void mm_block_6x2(float *restrict C, long ldc, const float *restrict A,
                                                               long ars, long acs, const float *restrict B, long ldb,
                                                               int n, int kb, int ke, int accumulate) {
    const zvec z = {0};
    float *c0 = C + n, *c1 = c0 + ldc, *c2 = c1 + ldc, *c3 = c2 + ldc, *c4 = c3 + ldc, *c5 = c4 + ldc;
    zvec x00 = z, x01 = z, x10 = z, x11 = z, x20 = z, x21 = z, x30 = z, x31 = z, x40 = z, x41 = z, x50 = z, x51 = z;
    if (accumulate) {
        x00 = vload(c0), x01 = vload(c0 + ZW), x10 = vload(c1), x11 = vload(c1 + ZW), x20 = vload(c2);
        x21 = vload(c2 + ZW), x30 = vload(c3), x31 = vload(c3 + ZW), x40 = vload(c4), x41 = vload(c4 + ZW);
        x50 = vload(c5), x51 = vload(c5 + ZW);
    }
    const float *a0 = A, *a1 = a0 + ars, *a2 = a1 + ars, *a3 = a2 + ars, *a4 = a3 + ars, *a5 = a4 + ars;
    NO_UNROLL
    for (int k = kb; k < ke; k++) {
        const zvec b0 = vload(B + k * ldb + n), b1 = vload(B + k * ldb + n + ZW);
        const long o = k * acs;
        float y = a0[o];
        x00 += y * b0, x01 += y * b1, y = a1[o];
        x10 += y * b0, x11 += y * b1, y = a2[o];
        x20 += y * b0, x21 += y * b1, y = a3[o];
        x30 += y * b0, x31 += y * b1, y = a4[o];
        x40 += y * b0, x41 += y * b1, y = a5[o];
        x50 += y * b0, x51 += y * b1;
    }
    vstore(c0, x00), vstore(c0 + ZW, x01), vstore(c1, x10), vstore(c1 + ZW, x11), vstore(c2, x20);
    vstore(c2 + ZW, x21), vstore(c3, x30), vstore(c3 + ZW, x31), vstore(c4, x40), vstore(c4 + ZW, x41);
    vstore(c5, x50), vstore(c5 + ZW, x51);
}

static inline __attribute__((always_inline)) void mm_rows(const int MR, float *restrict C, long ldc,
                                                          const float *restrict A, long ars, long acs,
                                                          const float *restrict B, long ldb, int N, int kb, int ke,
                                                          int accumulate) {
    int n = 0;
    for (; n + 2 * ZW <= N; n += 2 * ZW) {
        if (MR == 6)
            mm_block_6x2(C, ldc, A, ars, acs, B, ldb, n, kb, ke, accumulate);
        else
            mm_block(MR, 2, C, ldc, A, ars, acs, B, ldb, n, kb, ke, accumulate);
    }
    for (; n + ZW <= N; n += ZW) mm_block(MR, 1, C, ldc, A, ars, acs, B, ldb, n, kb, ke, accumulate);
    for (; n < N; n++)
        for (int r = 0; r < MR; r++) {
            float t = accumulate ? C[r * ldc + n] : 0;
            for (int k = kb; k < ke; k++) t = fmadd(A[r * ars + k * acs], B[k * ldb + n], t);
            C[r * ldc + n] = t;
        }
}

/* C[M,N] (+)= A B with A(i,k) = A[i*ars + k*acs] (row-major, or transposed with ars = 1), B row-major [K,N];
 * accumulate = 0 overwrites C. Blocks of 6 rows x 2 vectors (12 accumulators: AVX2 has 16 registers); `tri` trims
 * the k range or the columns of each row block on a diagonal tile. */
static void mm(float *restrict C, long ldc, const float *restrict A, long ars, long acs, const float *restrict B,
               long ldb, int M, int N, int K, int accumulate, int tri) {
    for (int i = 0; i < M;) {
        const int mr = M - i >= 6 ? 6 : M - i >= 4 ? 4 : 1;
        int kb = 0, ke = K, ne = N;
        if (tri == A_LOWER) ke = i + mr < K ? i + mr : K;
        if (tri == A_UPPER) kb = i < K ? i : K;
        if (tri == C_LOWER) ne = round_up(i + mr, 2 * ZW) < N ? round_up(i + mr, 2 * ZW) : N; /* whole blocks */
        float *c = C + i * ldc;
        const float *a = A + i * ars;
        if (mr == 6)
            mm_rows(6, c, ldc, a, ars, acs, B, ldb, ne, kb, ke, accumulate);
        else if (mr == 4)
            mm_rows(4, c, ldc, a, ars, acs, B, ldb, ne, kb, ke, accumulate);
        else
            mm_rows(1, c, ldc, a, ars, acs, B, ldb, ne, kb, ke, accumulate);
        i += mr;
    }
}

typedef int32_t zivec __attribute__((vector_size(ZW * sizeof(int32_t))));

static inline zvec vsplat(float a) { return (zvec){0} + a; }
static inline zvec vselect(zivec mask, zvec a, zvec b) { return (zvec)((mask & (zivec)a) | (~mask & (zivec)b)); }

/* exp(x) for x <= 88 (Cephes expf: range reduction by ln 2 and a degree-6 polynomial, ~1 ulp) on whole vectors
 * (libm's expf is scalar); 0 below -87.3, where expf is denormal or 0, and for -inf (masked scores). */
static inline zvec vexp(zvec x) {
    const zvec lo = vsplat(-87.3f), hi = vsplat(88.0f);
    const zivec under = x < lo;
    zvec xc = vselect(under, lo, x);
    xc = vselect(xc > hi, hi, xc);
    const zvec t = xc * 1.44269504088896341f + 12582912.0f; /* 1.5·2^23: round(x·log2 e) lands in the low bits */
    const zvec n = t - 12582912.0f;
    const zvec r = xc - n * 0.693359375f + n * 2.12194440e-4f;
    zvec p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const zivec pow2n = ((zivec)t - 0x4B400000 + 127) << 23; /* 2^n, n in [-126, 127] */
    return (zvec)(~under & (zivec)(p * (zvec)pow2n));
}

typedef struct {
    const float *Q, *K, *V;
    int B, T, Hq, Hkv, dh, G, nt;
    int W; /* sliding window (keys t-W+1..t), 0: plain causal; a window of T or more is plain causal too */
    long ldq, ldk;
    float scale;
} Shape;

static Shape make_shape(const float *Q, const float *K, const float *V, int B, int T, int Hq, int Hkv, int dh,
                        int window) {
    return (Shape){.Q = Q, .K = K, .V = V, .B = B, .T = T, .Hq = Hq, .Hkv = Hkv, .dh = dh, .G = Hq / Hkv,
                   .nt = (T + TILE - 1) / TILE, .W = window > 0 && window < T ? window : 0, .ldq = (long)Hq * dh,
                   .ldk = (long)Hkv * dh, .scale = (float)(1.0 / sqrt((double)dh))};
}

/* The first key tile any row of query tile qt sees (0 without a window). */
static int first_key_tile(const Shape *s, int qt) {
    const long k = (long)qt * TILE - s->W + 1;
    return s->W && k > 0 ? (int)(k / TILE) : 0;
}

/* The last query tile any row of which sees key tile kb. */
static int last_query_tile(const Shape *s, int kb) {
    if (!s->W) return s->nt - 1;
    const long q = ((long)kb * TILE + TILE - 1 + s->W - 1) / TILE;
    return q < s->nt - 1 ? (int)q : s->nt - 1;
}

/* The first column of key tile k0 that query t sees (> 0 only where the window starts inside or after the tile). */
static int window_start(const Shape *s, int t, int k0) {
    const long c = (long)t - s->W + 1 - k0;
    return s->W && c > 0 ? (c < TILE ? (int)c : TILE) : 0;
}

/* Per-thread scratch, each buffer padded to a cache line: the key tile transposed (times scale) and the value tile
 * transposed [dh, TILE]; contiguous copies of the key (or value) rows and of the query and dO rows [TILE, dh] (a
 * tile's rows are Hq·dh floats apart, and power-of-two strides make them collide in a few L1 sets); two [TILE, dh]
 * accumulators (forward output; backward dK, dV); two [TILE, TILE] score tiles; one row vector. */
typedef struct {
    float *kt, *vt, *kr, *qr, *dor, *acc, *acc2, *p, *ds, *row;
} Scratch;

static size_t per_thread_floats(int dh) {
    return 7 * (size_t)round_up(TILE * dh, 16) + 2 * (size_t)TILE * TILE + TILE;
}

size_t ZY_ISA_NAME(flash_attention_workspace_floats)(int dh, int threads) {
    return per_thread_floats(dh) * (size_t)(threads > 0 ? threads : 1);
}

static Scratch carve_scratch(float *ws, int dh) {
    const size_t td = (size_t)round_up(TILE * dh, 16);
    Scratch x;
    x.kt = ws, x.vt = x.kt + td, x.kr = x.vt + td, x.qr = x.kr + td, x.dor = x.qr + td, x.acc = x.dor + td;
    x.acc2 = x.acc + td, x.p = x.acc2 + td, x.ds = x.p + TILE * TILE, x.row = x.ds + TILE * TILE;
    return x;
}

/* dst[d*TILE + c] = src[c*ld + d] for the n rows of a tile, columns n..(vector width) zeroed: the score
 * products run over whole vectors of key columns. */
static void load_transposed(float *dst, const float *src, long ld, int n, int dh) {
    const int w = round_up(n, ZW) < TILE ? round_up(n, ZW) : TILE;
    for (int c = 0; c < n; c++)
        for (int d = 0; d < dh; d++) dst[d * TILE + c] = src[c * ld + d];
    for (int d = 0; d < dh; d++)
        for (int c = n; c < w; c++) dst[d * TILE + c] = 0;
}

/* dst[r*dh + d] = src[r*ld + d] for n rows. */
static void load_rows(float *dst, const float *src, long ld, int n, int dh) {
    for (int r = 0; r < n; r++) memcpy(dst + (long)r * dh, src + r * ld, sizeof(float) * (size_t)dh);
}

static int threads_for(int threads, double flops) {
    int t = omp_get_max_threads();
    t = threads < t ? threads : t;
    return flops < 2e5 || t < 1 ? 1 : t; /* tiny problems (decode-sized T) are not worth waking the team */
}

/* ---- the online softmax's step, shared by the forward and cached decoding ------------------------------------ */

/* pr[0, nv) *= scale. Scores are scaled after their product, (q·k)·scale, as transformers does (and cached
 * decoding, whose keys are stored unscaled): both then round the very same score. */
static void scale_row(float *pr, int nv, float scale) {
    for (int c = 0; c < nv; c += ZW) vstore(pr + c, vload(pr + c) * scale);
}

/* One row of one key tile: pr[c0, c1) (whole vectors at tile columns that are multiples of ZW, -inf where masked)
 * holds the row's scores. They become exp(s - m') with m' = max(m, their max); *m = m', *l = *l·alpha + their sum
 * (in ZW float lanes, lane c mod ZW, then in order); returns alpha = exp(m - m'), the factor the row's earlier output
 * takes (0 on its first tile, m = -inf). Masked columns add exact zeros, so a range that covers a row's unmasked
 * columns with fewer masked ones gives the same bits: cached decoding relies on that. */
static inline float online_softmax_step(float *pr, int c0, int c1, float *m, double *l) {
    zvec vm = vsplat(*m), vs = {0};
    for (int c = c0; c < c1; c += ZW) {
        const zvec v = vload(pr + c);
        vm = vselect(v > vm, v, vm);
    }
    float mx = vm[0], sum = 0;
    for (int i = 1; i < ZW; i++) mx = vm[i] > mx ? vm[i] : mx;
    for (int c = c0; c < c1; c += ZW) {
        const zvec e = vexp(vload(pr + c) - mx);
        vstore(pr + c, e);
        vs += e;
    }
    for (int i = 0; i < ZW; i++) sum += vs[i];
    const float alpha = vexp(vsplat(*m - mx))[0]; /* 0 on the first tile (m = -inf) */
    *m = mx;
    *l = *l * alpha + sum;
    return alpha;
}

/* o[0, dh) *= alpha, skipped when alpha is 1 (the row's max did not move). */
static void rescale_output(float *o, int dh, float alpha) {
    if (alpha != 1.0f)
        for (int d = 0; d < dh; d++) o[d] *= alpha;
}

/* The output row at the end: o / l. */
static void normalise_output(float *o, const float *acc, int dh, double l) {
    const float inv = (float)(1.0 / l);
    for (int d = 0; d < dh; d++) o[d] = acc[d] * inv;
}

/* ---- forward ------------------------------------------------------------------------------------------------ */

/* Rows q0..q0+qn of head h against key tiles 0..qt: online softmax, then O = acc / l and LSE = m + log l. */
static void forward_query_tile(const Shape *s, float *O, float *LSE, int b, int h, int qt, const Scratch *x) {
    const int dh = s->dh, q0 = qt * TILE, qn = s->T - q0 < TILE ? s->T - q0 : TILE;
    float *p = x->p, *acc = x->acc, *m = x->row;
    double l[TILE];
    const long qoff = ((long)b * s->T + q0) * s->ldq + (long)h * dh;
    load_rows(x->qr, s->Q + qoff, s->ldq, qn, dh);
    memset(acc, 0, sizeof(float) * (size_t)qn * dh);
    for (int r = 0; r < qn; r++) m[r] = -INFINITY, l[r] = 0;
    for (int kb = first_key_tile(s, qt); kb <= qt; kb++) {
        const int k0 = kb * TILE, kn = s->T - k0 < TILE ? s->T - k0 : TILE;
        const int kw = round_up(kn, ZW) < TILE ? round_up(kn, ZW) : TILE, diag = kb == qt;
        const long koff = ((long)b * s->T + k0) * s->ldk + (long)(h / s->G) * dh;
        load_transposed(x->kt, s->K + koff, s->ldk, kn, dh);
        load_rows(x->kr, s->V + koff, s->ldk, kn, dh);
        mm(p, TILE, x->qr, dh, 1, x->kt, TILE, qn, kw, dh, 0, diag ? C_LOWER : FULL);
        for (int r = 0; r < qn; r++) {
            float *pr = p + r * TILE;
            /* causal mask on the diagonal tile: -inf up to a whole vector, so the loops below have no scalar tail */
            const int n = diag ? r + 1 : kn, nv = round_up(n, ZW) < TILE ? round_up(n, ZW) : TILE;
            const int lo = window_start(s, q0 + r, k0); /* sliding window: columns before lo are out of it */
            if (lo >= n) { /* this row sees none of the tile: its softmax and output stay as they are */
                memset(pr, 0, sizeof(float) * (size_t)kn);
                continue;
            }
            for (int c = 0; c < lo; c++) pr[c] = -INFINITY;
            for (int c = n; c < nv; c++) pr[c] = -INFINITY;
            scale_row(pr, nv, s->scale);
            const float alpha = online_softmax_step(pr, 0, nv, &m[r], &l[r]);
            for (int c = nv; c < kn; c++) pr[c] = 0;
            rescale_output(acc + (long)r * dh, dh, alpha);
        }
        mm(acc, dh, p, TILE, 1, x->kr, dh, qn, dh, kn, 1, diag ? A_LOWER : FULL); /* acc += P V */
    }
    float *lse = LSE + ((long)b * s->Hq + h) * s->T + q0;
    for (int r = 0; r < qn; r++) {
        normalise_output(O + qoff + r * s->ldq, acc + (long)r * dh, dh, l[r]);
        lse[r] = (float)(m[r] + log(l[r]));
    }
}

void ZY_ISA_NAME(flash_attention_forward)(float *O, float *LSE, const float *Q, const float *K, const float *V, int B, int T,
                             int Hq, int Hkv, int dh, int window, float *work, int threads) {
    if (B <= 0 || T <= 0 || Hq <= 0 || Hkv <= 0 || dh <= 0) return;
    const Shape s = make_shape(Q, K, V, B, T, Hq, Hkv, dh, window);
    const long bh = (long)B * Hq, tasks = bh * s.nt;
    const size_t per = per_thread_floats(dh);
    const int nthr = threads_for(threads, 2.0 * bh * T * (s.W ? s.W : T) * dh);
    /* Tasks (query tile, b, h), the longest rows of key tiles first so the dynamic schedule ends balanced. */
#pragma omp parallel num_threads(nthr) if (nthr > 1)
    {
        const Scratch x = carve_scratch(work + per * (size_t)omp_get_thread_num(), dh);
#pragma omp for schedule(dynamic, 1)
        for (long i = 0; i < tasks; i++)
            forward_query_tile(&s, O, LSE, (int)(i % bh / Hq), (int)(i % Hq), s.nt - 1 - (int)(i / bh), &x);
    }
}

/* ---- backward ----------------------------------------------------------------------------------------------- */

typedef struct {
    float *dQ;
    const float *dO, *O, *LSE;
} Grads;

/* One (query tile qt of head h, key tile kb) block, the key tile already in x->kt, x->vt, x->kr: recompute
 * P = exp(S - LSE) and dS = P ⊙ (dO Vᵀ - D)·scale with D = rowsum(dO ⊙ O), then dV += Pᵀ dO and dK += dSᵀ Q into
 * the key tile's accumulators x->acc2, x->acc (with_dkdv) and dQ += dS K (with_dq). */
static void backward_block(const Shape *s, const Grads *g, int b, int h, int qt, int kb, int with_dkdv, int with_dq,
                           const Scratch *x) {
    const int dh = s->dh, q0 = qt * TILE, qn = s->T - q0 < TILE ? s->T - q0 : TILE;
    const int kn = s->T - kb * TILE < TILE ? s->T - kb * TILE : TILE;
    const int kw = round_up(kn, ZW) < TILE ? round_up(kn, ZW) : TILE, diag = kb == qt;
    const long qoff = ((long)b * s->T + q0) * s->ldq + (long)h * dh;
    const float *o = g->O + qoff, *lse = g->LSE + ((long)b * s->Hq + h) * s->T + q0;
    float *p = x->p, *ds = x->ds, *D = x->row, *q = x->qr, *dO = x->dor;
    load_rows(q, s->Q + qoff, s->ldq, qn, dh);
    load_rows(dO, g->dO + qoff, s->ldq, qn, dh);
    for (int r = 0; r < qn; r++) {
        float dot = 0;
        const float *dr = dO + (long)r * dh, *orow = o + r * s->ldq;
#pragma omp simd reduction(+ : dot)
        for (int d = 0; d < dh; d++) dot += dr[d] * orow[d];
        D[r] = dot;
    }
    mm(p, TILE, q, dh, 1, x->kt, TILE, qn, kw, dh, 0, diag ? C_LOWER : FULL);   /* S (unscaled) */
    mm(ds, TILE, dO, dh, 1, x->vt, TILE, qn, kw, dh, 0, diag ? C_LOWER : FULL); /* dP = dO Vᵀ */
    for (int r = 0; r < qn; r++) {
        float *pr = p + r * TILE, *dr = ds + r * TILE;
        const int n = diag ? r + 1 : kn, nv = round_up(n, ZW) < TILE ? round_up(n, ZW) : TILE;
        const int lo = window_start(s, q0 + r, kb * TILE);
        const float lr = lse[r], Dr = D[r], sc = s->scale;
        for (int c = 0; c < lo && c < nv; c++) pr[c] = -INFINITY; /* out of the sliding window: P = 0, dS = 0 */
        for (int c = n; c < nv; c++) pr[c] = -INFINITY; /* masked, as in the forward */
        scale_row(pr, nv, sc);
        for (int c = 0; c < nv; c += ZW) {
            const zvec e = vexp(vload(pr + c) - lr);
            vstore(pr + c, e);
            vstore(dr + c, e * (vload(dr + c) - Dr) * sc);
        }
        for (int c = nv; c < kn; c++) pr[c] = 0, dr[c] = 0;
    }
    if (with_dkdv) { /* Pᵀ and dSᵀ read transposed in place */
        mm(x->acc2, dh, p, 1, TILE, dO, dh, kn, dh, qn, 1, diag ? A_UPPER : FULL);
        mm(x->acc, dh, ds, 1, TILE, q, dh, kn, dh, qn, 1, diag ? A_UPPER : FULL);
    }
    if (with_dq) mm(g->dQ + qoff, s->ldq, ds, TILE, 1, x->kr, dh, qn, dh, kn, 1, diag ? A_LOWER : FULL);
}

static void load_key_tile(const Shape *s, int b, int j, int kb, const Scratch *x) {
    const int kn = s->T - kb * TILE < TILE ? s->T - kb * TILE : TILE;
    const long koff = ((long)b * s->T + (long)kb * TILE) * s->ldk + (long)j * s->dh;
    load_transposed(x->kt, s->K + koff, s->ldk, kn, s->dh);
    load_transposed(x->vt, s->V + koff, s->ldk, kn, s->dh);
    load_rows(x->kr, s->K + koff, s->ldk, kn, s->dh);
}

/* Key tile kb of kv head j: dK, dV rows of the tile from every query head of the group and every query tile at or
 * below the diagonal; with_dq also adds the dQ contributions (only when this task owns the whole (b, j) group). */
static void backward_key_tile(const Shape *s, const Grads *g, float *dK, float *dV, int b, int j, int kb, int with_dq,
                              const Scratch *x) {
    const int dh = s->dh, kn = s->T - kb * TILE < TILE ? s->T - kb * TILE : TILE;
    const long koff = ((long)b * s->T + (long)kb * TILE) * s->ldk + (long)j * dh;
    load_key_tile(s, b, j, kb, x);
    memset(x->acc, 0, sizeof(float) * (size_t)kn * dh);
    memset(x->acc2, 0, sizeof(float) * (size_t)kn * dh);
    const int qt_end = last_query_tile(s, kb);
    for (int h = j * s->G; h < (j + 1) * s->G; h++)
        for (int qt = kb; qt <= qt_end; qt++) backward_block(s, g, b, h, qt, kb, 1, with_dq, x);
    for (int r = 0; r < kn; r++)
        for (int d = 0; d < dh; d++) {
            dK[koff + r * s->ldk + d] += x->acc[r * dh + d];
            dV[koff + r * s->ldk + d] += x->acc2[r * dh + d];
        }
}

/* dQ rows of query tile qt of head h alone (the second pass when key-tile tasks cannot own dQ). */
static void backward_query_tile(const Shape *s, const Grads *g, int b, int h, int qt, const Scratch *x) {
    for (int kb = first_key_tile(s, qt); kb <= qt; kb++) {
        load_key_tile(s, b, h / s->G, kb, x);
        backward_block(s, g, b, h, qt, kb, 0, 1, x);
    }
}

void ZY_ISA_NAME(flash_attention_backward)(float *dQ, float *dK, float *dV, const float *dO, const float *O, const float *LSE,
                              const float *Q, const float *K, const float *V, int B, int T, int Hq, int Hkv, int dh,
                              int window, float *work, int threads) {
    if (B <= 0 || T <= 0 || Hq <= 0 || Hkv <= 0 || dh <= 0) return;
    const Shape s = make_shape(Q, K, V, B, T, Hq, Hkv, dh, window);
    const Grads g = {.dQ = dQ, .dO = dO, .O = O, .LSE = LSE};
    const long groups = (long)B * Hkv, bh = (long)B * Hq;
    const size_t per = per_thread_floats(dh);
    const int nthr = threads_for(threads, 5.0 * bh * T * (s.W ? s.W : T) * dh);
    /* One pass over whole (b, kv head) groups owns their dQ, dK and dV slices: no races and 5 tile products per
     * block. With too few groups to keep the threads evenly busy, split by key tile instead (dK, dV) and add dQ
     * in a second pass over query tiles, which recomputes S and dP (7 products per block instead of 5). */
    const long rounds = (groups + nthr - 1) / nthr;
    const int one_pass = nthr == 1 || (groups >= nthr && rounds * nthr * 5 <= groups * 7);
#pragma omp parallel num_threads(nthr) if (nthr > 1)
    {
        const Scratch x = carve_scratch(work + per * (size_t)omp_get_thread_num(), dh);
        if (one_pass) {
#pragma omp for schedule(dynamic, 1)
            for (long i = 0; i < groups; i++)
                for (int kb = 0; kb < s.nt; kb++)
                    backward_key_tile(&s, &g, dK, dV, (int)(i / Hkv), (int)(i % Hkv), kb, 1, &x);
        } else {
#pragma omp for schedule(dynamic, 1)
            for (long i = 0; i < groups * s.nt; i++) /* key tile 0 has the most query tiles: first */
                backward_key_tile(&s, &g, dK, dV, (int)(i % groups / Hkv), (int)(i % Hkv), (int)(i / groups), 0, &x);
#pragma omp for schedule(dynamic, 1)
            for (long i = 0; i < bh * s.nt; i++)
                backward_query_tile(&s, &g, (int)(i % bh / Hq), (int)(i % Hq), s.nt - 1 - (int)(i / bh), &x);
        }
    }
}

/* ---- cached decoding: a few new queries against one block of cached keys and values ---------------------------- */

void ZY_ISA_NAME(decode_attn_scores)(float *S, long lds, const float *Q, long ldq, const float *KT, long ldkt, int n,
                                     int cnt, int avail, int dh, float scale) {
    const int full = cnt / ZW * ZW, rest = cnt - full;
    if (full) mm(S, lds, Q, ldq, 1, KT, ldkt, n, full, dh, 0, FULL);
    if (rest && avail >= full + ZW) { /* a partial last vector: all of it computed where the keys may be read */
        float tmp[16 * ZW];
        for (int t0 = 0; t0 < n; t0 += 16) {
            const int m = n - t0 < 16 ? n - t0 : 16;
            mm(tmp, ZW, Q + t0 * ldq, ldq, 1, KT + full, ldkt, m, ZW, dh, 0, FULL);
            for (int r = 0; r < m; r++) memcpy(S + (t0 + r) * lds + full, tmp + r * ZW, sizeof(float) * rest);
        }
    } else if (rest)
        mm(S + full, lds, Q, ldq, 1, KT + full, ldkt, n, rest, dh, 0, FULL); /* one column at a time */
    for (int t = 0; t < n; t++) {
        float *srow = S + t * lds;
        for (int s = 0; s < cnt; s++) srow[s] *= scale;
    }
}

/* ... the same against a cache of bf16 keys and values (a bf16 model's): each vector of them widened to fp32 as it is
 * loaded (bf16 is the top half of a float), every product and sum fp32. */
typedef uint16_t zhvec __attribute__((vector_size(ZW * sizeof(uint16_t))));
static inline zvec vload_bf16(const uint16_t *p) {
    zhvec h;
    memcpy(&h, p, sizeof h);
    const zivec u = __builtin_convertvector(h, zivec) << 16; /* zero-extended: the sign bit lands in bit 31 */
    zvec f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static inline float bf16_to_f32(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* NR query rows against NV·ZW keys starting at column s; of the last vector, the first `keep` scores stored. Two
 * vectors of keys a pass where there are (NV = 2): each query value is loaded once for both, and the 2·NR sums are
 * independent chains (NR alone, 4 at most, would wait on the multiply-add's latency). Every score's sum runs over d
 * in order either way: the same bits. */
static inline __attribute__((always_inline)) void scores_bf16_block(const int NR, const int NV, float *S, long lds,
                                                                    const float *Q, long ldq, const uint16_t *KT,
                                                                    long ldkt, int s, int keep, int dh, float scale) {
    zvec acc[4][2] = {{{0}}};
    for (int d = 0; d < dh; d++) {
        zvec k[2];
        for (int v = 0; v < NV; v++) k[v] = vload_bf16(KT + d * ldkt + s + v * ZW);
        for (int r = 0; r < NR; r++) {
            const float q = Q[r * ldq + d];
            for (int v = 0; v < NV; v++) acc[r][v] += q * k[v];
        }
    }
    for (int r = 0; r < NR; r++)
        for (int v = 0; v < NV; v++) {
            const zvec x = acc[r][v] * scale;
            if (v < NV - 1 || keep == ZW)
                vstore(S + r * lds + s + v * ZW, x);
            else
                memcpy(S + r * lds + s + v * ZW, &x, sizeof(float) * keep);
        }
}

void ZY_ISA_NAME(decode_attn_scores_bf16)(float *S, long lds, const float *Q, long ldq, const uint16_t *KT, long ldkt,
                                          int n, int cnt, int avail, int dh, float scale) {
    for (int t0 = 0; t0 < n; t0 += 4) {
        const int nr = n - t0 < 4 ? n - t0 : 4;
        float *St = S + t0 * lds;
        const float *Qt = Q + t0 * ldq;
        int s = 0;
        for (; s + 2 * ZW <= cnt; s += 2 * ZW)
            switch (nr) { /* the row count as a constant: the sums stay in registers */
            case 1: scores_bf16_block(1, 2, St, lds, Qt, ldq, KT, ldkt, s, ZW, dh, scale); break;
            case 2: scores_bf16_block(2, 2, St, lds, Qt, ldq, KT, ldkt, s, ZW, dh, scale); break;
            case 3: scores_bf16_block(3, 2, St, lds, Qt, ldq, KT, ldkt, s, ZW, dh, scale); break;
            default: scores_bf16_block(4, 2, St, lds, Qt, ldq, KT, ldkt, s, ZW, dh, scale); break;
            }
        for (; s < cnt && (s + ZW <= cnt || s + ZW <= avail); s += ZW) {
            const int keep = cnt - s < ZW ? cnt - s : ZW;
            switch (nr) {
            case 1: scores_bf16_block(1, 1, St, lds, Qt, ldq, KT, ldkt, s, keep, dh, scale); break;
            case 2: scores_bf16_block(2, 1, St, lds, Qt, ldq, KT, ldkt, s, keep, dh, scale); break;
            case 3: scores_bf16_block(3, 1, St, lds, Qt, ldq, KT, ldkt, s, keep, dh, scale); break;
            default: scores_bf16_block(4, 1, St, lds, Qt, ldq, KT, ldkt, s, keep, dh, scale); break;
            }
        }
        for (; s < cnt; s++) /* keys at the end of the readable columns: one at a time */
            for (int r = 0; r < nr; r++) {
                float x = 0;
                for (int d = 0; d < dh; d++) x = fmadd(Qt[r * ldq + d], bf16_to_f32(KT[d * ldkt + s]), x);
                St[r * lds + s] = x * scale;
            }
    }
}

/* NR probability rows against cnt values, output columns c .. c + NV·ZW - 1. */
static inline __attribute__((always_inline)) void values_bf16_block(const int NR, const int NV, float *O, long ldo,
                                                                    const float *P, long ldp, const uint16_t *V,
                                                                    long ldv, int c, int cnt, int accumulate) {
    zvec acc[4][2];
    for (int r = 0; r < NR; r++)
        for (int v = 0; v < NV; v++) acc[r][v] = accumulate ? vload(O + r * ldo + c + v * ZW) : (zvec){0};
    for (int s = 0; s < cnt; s++) {
        zvec x[2];
        for (int v = 0; v < NV; v++) x[v] = vload_bf16(V + s * ldv + c + v * ZW);
        for (int r = 0; r < NR; r++) {
            const float p = P[r * ldp + s];
            for (int v = 0; v < NV; v++) acc[r][v] += p * x[v];
        }
    }
    for (int r = 0; r < NR; r++)
        for (int v = 0; v < NV; v++) vstore(O + r * ldo + c + v * ZW, acc[r][v]);
}

static inline __attribute__((always_inline)) void values_bf16_rows(const int NR, float *O, long ldo, const float *P,
                                                                   long ldp, const uint16_t *V, long ldv, int cnt,
                                                                   int dh, int accumulate) {
    int c = 0;
    for (; c + 2 * ZW <= dh; c += 2 * ZW) values_bf16_block(NR, 2, O, ldo, P, ldp, V, ldv, c, cnt, accumulate);
    for (; c + ZW <= dh; c += ZW) values_bf16_block(NR, 1, O, ldo, P, ldp, V, ldv, c, cnt, accumulate);
    for (; c < dh; c++)
        for (int r = 0; r < NR; r++) {
            float x = accumulate ? O[r * ldo + c] : 0;
            for (int s = 0; s < cnt; s++) x = fmadd(P[r * ldp + s], bf16_to_f32(V[s * ldv + c]), x);
            O[r * ldo + c] = x;
        }
}

void ZY_ISA_NAME(decode_attn_values_bf16)(float *O, long ldo, const float *P, long ldp, const uint16_t *V, long ldv,
                                          int n, int cnt, int dh, int accumulate) {
    for (int t0 = 0; t0 < n; t0 += 4) {
        const int nr = n - t0 < 4 ? n - t0 : 4;
        float *Ot = O + t0 * ldo;
        const float *Pt = P + t0 * ldp;
        switch (nr) {
        case 1: values_bf16_rows(1, Ot, ldo, Pt, ldp, V, ldv, cnt, dh, accumulate); break;
        case 2: values_bf16_rows(2, Ot, ldo, Pt, ldp, V, ldv, cnt, dh, accumulate); break;
        case 3: values_bf16_rows(3, Ot, ldo, Pt, ldp, V, ldv, cnt, dh, accumulate); break;
        default: values_bf16_rows(4, Ot, ldo, Pt, ldp, V, ldv, cnt, dh, accumulate); break;
        }
    }
}

/* One score row of cached decoding against the part c0..c1-1 of the forward's key tile that starts at key k0: the
 * forward's online softmax step on the same columns (a tile-aligned copy, -inf outside the row's keys first..last),
 * so decoding rounds every exponential, sum and rescale as the full forward does. */
void ZY_ISA_NAME(decode_attn_softmax_tile)(float *s, int k0, int c0, int c1, int first, int last, float *m, double *l,
                                           float *o, int dh) {
    const int a = first > c0 ? first : c0, b = last < c1 - 1 ? last : c1 - 1; /* the row's keys in the piece */
    if (a > b) { /* none: its softmax and output stay as they are, its probabilities here are 0 */
        memset(s, 0, sizeof(float) * (size_t)(c1 - c0));
        return;
    }
    float tile[TILE];
    const int v0 = (a - k0) / ZW * ZW, v1 = round_up(b - k0 + 1, ZW) < TILE ? round_up(b - k0 + 1, ZW) : TILE;
    for (int c = v0; c < v1; c++) tile[c] = -INFINITY;
    memcpy(tile + (a - k0), s + (a - c0), sizeof(float) * (size_t)(b - a + 1));
    rescale_output(o, dh, online_softmax_step(tile, v0, v1, m, l));
    memset(s, 0, sizeof(float) * (size_t)(c1 - c0));
    memcpy(s + (a - c0), tile + (a - k0), sizeof(float) * (size_t)(b - a + 1));
}

void ZY_ISA_NAME(decode_attn_normalise)(float *o, int dh, double l) { normalise_output(o, o, dh, l); }

/* O[t] (+)= Σ_s P[t, s] · V[s] for n probability rows (stride ldp) against the cnt cached values of one KV block
 * (stride ldv), into O (stride ldo): the tiles' register-blocked product, each value row read once per 2 vectors of
 * output columns for all n rows (a query's heads, or a prefill piece's queries of one head). */
void ZY_ISA_NAME(decode_attn_values)(float *O, long ldo, const float *P, long ldp, const float *V, long ldv, int n,
                                     int cnt, int dh, int accumulate) {
    mm(O, ldo, P, ldp, 1, V, ldv, n, dh, cnt, accumulate, FULL);
}

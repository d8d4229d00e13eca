/* Fused, tiled causal GQA attention (attention.h), forward and backward side by side.
 *
 * Square TILE x TILE blocks of (query rows, key rows): query tile qt meets only key tiles kt <= qt, and only the
 * diagonal tile needs the causal mask (column c <= row r), so about half of the T x T work is skipped. The forward
 * runs an online softmax over the key tiles (running row max m and sum l, rescaling the output accumulator) and
 * saves LSE = m + log l; the backward recomputes P = exp(S - LSE) per tile. The small matrix products go through
 * one register-blocked micro-kernel on GCC/Clang vector types (AVX2, AVX-512 or plain SSE, whatever -march
 * allows), and the exponentials through a polynomial that vectorises (libm's expf does not). */
#include "attention.h"

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

#define TILE 64

/* Vector width in floats: the widest registers -march allows (16-byte vectors are baseline on x86-64 and arm64). */
#if defined(__AVX512F__)
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

/* C[M,N] (+)= A B with A(i,k) = A[i*ars + k*acs] (row-major, or transposed with ars = 1), B row-major [K,N];
 * accumulate = 0 overwrites C. 4 rows x 2 vectors of accumulators stay in registers across the k loop. */
static void mm(float *restrict C, long ldc, const float *restrict A, long ars, long acs, const float *restrict B,
               long ldb, int M, int N, int K, int accumulate) {
    const zvec z = {0};
    int i = 0;
    for (; i + 4 <= M; i += 4) {
        const float *a0 = A + i * ars, *a1 = a0 + ars, *a2 = a1 + ars, *a3 = a2 + ars;
        float *c0 = C + i * ldc, *c1 = c0 + ldc, *c2 = c1 + ldc, *c3 = c2 + ldc;
        int n = 0;
        for (; n + 2 * ZW <= N; n += 2 * ZW) {
            zvec x00 = z, x01 = z, x10 = z, x11 = z, x20 = z, x21 = z, x30 = z, x31 = z;
            if (accumulate) {
                x00 = vload(c0 + n), x01 = vload(c0 + n + ZW), x10 = vload(c1 + n), x11 = vload(c1 + n + ZW);
                x20 = vload(c2 + n), x21 = vload(c2 + n + ZW), x30 = vload(c3 + n), x31 = vload(c3 + n + ZW);
            }
            for (int k = 0; k < K; k++) {
                const float *b = B + k * ldb + n;
                const zvec b0 = vload(b), b1 = vload(b + ZW);
                const float y0 = a0[k * acs], y1 = a1[k * acs], y2 = a2[k * acs], y3 = a3[k * acs];
                x00 += y0 * b0, x01 += y0 * b1, x10 += y1 * b0, x11 += y1 * b1;
                x20 += y2 * b0, x21 += y2 * b1, x30 += y3 * b0, x31 += y3 * b1;
            }
            vstore(c0 + n, x00), vstore(c0 + n + ZW, x01), vstore(c1 + n, x10), vstore(c1 + n + ZW, x11);
            vstore(c2 + n, x20), vstore(c2 + n + ZW, x21), vstore(c3 + n, x30), vstore(c3 + n + ZW, x31);
        }
        for (; n + ZW <= N; n += ZW) {
            zvec x0 = z, x1 = z, x2 = z, x3 = z;
            if (accumulate) x0 = vload(c0 + n), x1 = vload(c1 + n), x2 = vload(c2 + n), x3 = vload(c3 + n);
            for (int k = 0; k < K; k++) {
                const zvec b0 = vload(B + k * ldb + n);
                x0 += a0[k * acs] * b0, x1 += a1[k * acs] * b0, x2 += a2[k * acs] * b0, x3 += a3[k * acs] * b0;
            }
            vstore(c0 + n, x0), vstore(c1 + n, x1), vstore(c2 + n, x2), vstore(c3 + n, x3);
        }
        for (; n < N; n++) {
            float s0 = accumulate ? c0[n] : 0, s1 = accumulate ? c1[n] : 0;
            float s2 = accumulate ? c2[n] : 0, s3 = accumulate ? c3[n] : 0;
            for (int k = 0; k < K; k++) {
                const float bk = B[k * ldb + n];
                s0 += a0[k * acs] * bk, s1 += a1[k * acs] * bk, s2 += a2[k * acs] * bk, s3 += a3[k * acs] * bk;
            }
            c0[n] = s0, c1[n] = s1, c2[n] = s2, c3[n] = s3;
        }
    }
    for (; i < M; i++) {
        const float *a = A + i * ars;
        float *c = C + i * ldc;
        int n = 0;
        for (; n + ZW <= N; n += ZW) {
            zvec x = accumulate ? vload(c + n) : z;
            for (int k = 0; k < K; k++) x += a[k * acs] * vload(B + k * ldb + n);
            vstore(c + n, x);
        }
        for (; n < N; n++) {
            float s = accumulate ? c[n] : 0;
            for (int k = 0; k < K; k++) s += a[k * acs] * B[k * ldb + n];
            c[n] = s;
        }
    }
}

/* exp(x) for x <= 88 (Cephes expf: range reduction by ln 2 and a degree-6 polynomial, ~1 ulp), branch-free so that
 * loops over it vectorise; 0 below -87.3, where expf is denormal or 0 (and for -inf). */
static inline float exp_approx(float x) {
    float xc = x < -87.3f ? -87.3f : x;
    xc = xc > 88.0f ? 88.0f : xc;
    const float t = xc * 1.44269504088896341f + 12582912.0f; /* 1.5·2^23: round(x·log2 e) lands in the low bits */
    const float n = t - 12582912.0f;
    int32_t ti;
    memcpy(&ti, &t, sizeof ti);
    const float r = xc - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const int32_t bits = (ti - 0x4B400000 + 127) << 23; /* 2^n, n in [-126, 127] */
    float s;
    memcpy(&s, &bits, sizeof s);
    return x < -87.3f ? 0.0f : p * s;
}

typedef struct {
    const float *Q, *K, *V;
    int B, T, Hq, Hkv, dh, G, nt;
    long ldq, ldk;
    float scale;
} Shape;

static Shape make_shape(const float *Q, const float *K, const float *V, int B, int T, int Hq, int Hkv, int dh) {
    return (Shape){.Q = Q, .K = K, .V = V, .B = B, .T = T, .Hq = Hq, .Hkv = Hkv, .dh = dh, .G = Hq / Hkv,
                   .nt = (T + TILE - 1) / TILE, .ldq = (long)Hq * dh, .ldk = (long)Hkv * dh,
                   .scale = (float)(1.0 / sqrt((double)dh))};
}

static inline int round_up(int n, int m) { return (n + m - 1) / m * m; }

/* Per-thread scratch: two transposed [dh, TILE] key/value tiles, two [TILE, TILE] score tiles, two [TILE, dh]
 * accumulators and a row vector, each padded to a cache line. */
static size_t per_thread_floats(int dh) {
    const size_t tile_dh = (size_t)round_up(TILE * dh, 16), tile2 = (size_t)TILE * TILE;
    return 4 * tile_dh + 2 * tile2 + TILE;
}

size_t flash_attention_workspace_floats(int dh, int threads) {
    return per_thread_floats(dh) * (size_t)(threads > 0 ? threads : 1);
}

/* dst[d*TILE + c] = mul · src[c*ld + d] for the n rows of a tile, columns n..(vector width) zeroed: the score
 * products run over whole vectors of key columns. */
static void load_transposed(float *dst, const float *src, long ld, int n, int dh, float mul) {
    const int w = round_up(n, ZW) < TILE ? round_up(n, ZW) : TILE;
    for (int c = 0; c < n; c++)
        for (int d = 0; d < dh; d++) dst[d * TILE + c] = mul * src[c * ld + d];
    for (int d = 0; d < dh; d++)
        for (int c = n; c < w; c++) dst[d * TILE + c] = 0;
}

static int threads_for(int threads, double flops) {
    int t = omp_get_max_threads();
    t = threads < t ? threads : t;
    return flops < 2e5 || t < 1 ? 1 : t; /* tiny problems (decode-sized T) are not worth waking the team */
}

/* ---- forward ------------------------------------------------------------------------------------------------ */

/* Rows q0..q0+qn of head h against key tiles 0..qt: online softmax, then O = acc / l and LSE = m + log l. */
static void forward_query_tile(const Shape *s, float *O, float *LSE, int b, int h, int qt, float *ws) {
    const int dh = s->dh, q0 = qt * TILE, qn = s->T - q0 < TILE ? s->T - q0 : TILE;
    float *kt = ws, *p = kt + round_up(TILE * dh, 16), *acc = p + TILE * TILE, *m = acc + round_up(TILE * dh, 16);
    double l[TILE];
    const long qoff = ((long)b * s->T + q0) * s->ldq + (long)h * dh;
    const float *q = s->Q + qoff;
    memset(acc, 0, sizeof(float) * (size_t)qn * dh);
    for (int r = 0; r < qn; r++) m[r] = -INFINITY, l[r] = 0;
    for (int kb = 0; kb <= qt; kb++) {
        const int k0 = kb * TILE, kn = s->T - k0 < TILE ? s->T - k0 : TILE;
        const long koff = ((long)b * s->T + k0) * s->ldk + (long)(h / s->G) * dh;
        load_transposed(kt, s->K + koff, s->ldk, kn, dh, s->scale);
        mm(p, TILE, q, s->ldq, 1, kt, TILE, qn, round_up(kn, ZW) < TILE ? round_up(kn, ZW) : TILE, dh, 0);
        for (int r = 0; r < qn; r++) {
            float *pr = p + r * TILE;
            const int n = kb == qt ? r + 1 : kn; /* causal mask on the diagonal tile */
            float mx = m[r], sum = 0;
#pragma omp simd reduction(max : mx)
            for (int c = 0; c < n; c++) mx = pr[c] > mx ? pr[c] : mx;
#pragma omp simd reduction(+ : sum)
            for (int c = 0; c < n; c++) {
                const float e = exp_approx(pr[c] - mx);
                pr[c] = e;
                sum += e;
            }
            for (int c = n; c < kn; c++) pr[c] = 0;
            const float alpha = exp_approx(m[r] - mx); /* 0 on the first tile (m = -inf) */
            m[r] = mx;
            l[r] = l[r] * alpha + sum;
            if (alpha != 1.0f) {
                float *ar = acc + (long)r * dh;
                for (int d = 0; d < dh; d++) ar[d] *= alpha;
            }
        }
        mm(acc, dh, p, TILE, 1, s->V + koff, s->ldk, qn, dh, kn, 1);
    }
    float *lse = LSE + ((long)b * s->Hq + h) * s->T + q0;
    for (int r = 0; r < qn; r++) {
        const float inv = (float)(1.0 / l[r]);
        float *o = O + qoff + r * s->ldq;
        const float *ar = acc + (long)r * dh;
        for (int d = 0; d < dh; d++) o[d] = ar[d] * inv;
        lse[r] = (float)(m[r] + log(l[r]));
    }
}

void flash_attention_forward(float *O, float *LSE, const float *Q, const float *K, const float *V, int B, int T,
                             int Hq, int Hkv, int dh, float *work, int threads) {
    if (B <= 0 || T <= 0 || Hq <= 0 || Hkv <= 0 || dh <= 0) return;
    const Shape s = make_shape(Q, K, V, B, T, Hq, Hkv, dh);
    const long bh = (long)B * Hq, tasks = bh * s.nt;
    const size_t per = per_thread_floats(dh);
    const int nthr = threads_for(threads, 2.0 * bh * T * T * dh);
    /* Tasks (query tile, b, h), the longest rows of key tiles first so the dynamic schedule ends balanced. */
#pragma omp parallel num_threads(nthr) if (nthr > 1)
    {
        float *ws = work + per * (size_t)omp_get_thread_num();
#pragma omp for schedule(dynamic, 1)
        for (long i = 0; i < tasks; i++)
            forward_query_tile(&s, O, LSE, (int)(i % bh / Hq), (int)(i % Hq), s.nt - 1 - (int)(i / bh), ws);
    }
}

/* ---- backward ----------------------------------------------------------------------------------------------- */

typedef struct {
    float *dQ;
    const float *dO, *O, *LSE;
} Grads;

/* One (query tile qt of head h, key tile kb) block: recompute P = exp(S - LSE) and dS = P ⊙ (dO Vᵀ - D)·scale
 * with D = rowsum(dO ⊙ O), then dV += Pᵀ dO and dK += dSᵀ Q into the key tile's accumulators (when dk/dv are
 * given) and dQ += dS K (when with_dq). kt/vt hold the key tile transposed (keys times scale). */
static void backward_block(const Shape *s, const Grads *g, int b, int h, int qt, int kb, const float *kt,
                           const float *vt, float *dk, float *dv, int with_dq, float *p, float *ds, float *D) {
    const int dh = s->dh, q0 = qt * TILE, qn = s->T - q0 < TILE ? s->T - q0 : TILE;
    const int k0 = kb * TILE, kn = s->T - k0 < TILE ? s->T - k0 : TILE;
    const int kw = round_up(kn, ZW) < TILE ? round_up(kn, ZW) : TILE;
    const long qoff = ((long)b * s->T + q0) * s->ldq + (long)h * dh;
    const float *q = s->Q + qoff, *dO = g->dO + qoff, *o = g->O + qoff;
    const float *lse = g->LSE + ((long)b * s->Hq + h) * s->T + q0;
    for (int r = 0; r < qn; r++) {
        float dot = 0;
        const float *dor = dO + r * s->ldq, *orow = o + r * s->ldq;
#pragma omp simd reduction(+ : dot)
        for (int d = 0; d < dh; d++) dot += dor[d] * orow[d];
        D[r] = dot;
    }
    mm(p, TILE, q, s->ldq, 1, kt, TILE, qn, kw, dh, 0);   /* S (scaled) */
    mm(ds, TILE, dO, s->ldq, 1, vt, TILE, qn, kw, dh, 0); /* dP = dO Vᵀ */
    for (int r = 0; r < qn; r++) {
        float *pr = p + r * TILE, *dr = ds + r * TILE;
        const int n = kb == qt ? r + 1 : kn;
        const float lr = lse[r], Dr = D[r], sc = s->scale;
#pragma omp simd
        for (int c = 0; c < n; c++) {
            const float e = exp_approx(pr[c] - lr);
            pr[c] = e;
            dr[c] = e * (dr[c] - Dr) * sc;
        }
        for (int c = n; c < kn; c++) pr[c] = 0, dr[c] = 0;
    }
    if (dv) mm(dv, dh, p, 1, TILE, dO, s->ldq, kn, dh, qn, 1); /* Pᵀ read transposed in place */
    if (dk) mm(dk, dh, ds, 1, TILE, q, s->ldq, kn, dh, qn, 1);
    if (with_dq) {
        const long koff = ((long)b * s->T + k0) * s->ldk + (long)(h / s->G) * dh;
        mm(g->dQ + qoff, s->ldq, ds, TILE, 1, s->K + koff, s->ldk, qn, dh, kn, 1);
    }
}

/* Scratch layout shared by the two task kinds. */
typedef struct {
    float *kt, *vt, *p, *ds, *dk, *dv, *D;
} Scratch;

static Scratch carve_scratch(float *ws, int dh) {
    const size_t td = (size_t)round_up(TILE * dh, 16);
    Scratch x;
    x.kt = ws, x.vt = x.kt + td, x.dk = x.vt + td, x.dv = x.dk + td;
    x.p = x.dv + td, x.ds = x.p + TILE * TILE, x.D = x.ds + TILE * TILE;
    return x;
}

/* Key tile kb of kv head j: dK, dV rows of the tile from every query head of the group and every query tile at or
 * below the diagonal; with_dq also adds the dQ contributions (only when this task owns the whole (b, j) group). */
static void backward_key_tile(const Shape *s, const Grads *g, float *dK, float *dV, int b, int j, int kb, int with_dq,
                              const Scratch *x) {
    const int dh = s->dh, k0 = kb * TILE, kn = s->T - k0 < TILE ? s->T - k0 : TILE;
    const long koff = ((long)b * s->T + k0) * s->ldk + (long)j * dh;
    load_transposed(x->kt, s->K + koff, s->ldk, kn, dh, s->scale);
    load_transposed(x->vt, s->V + koff, s->ldk, kn, dh, 1.0f);
    memset(x->dk, 0, sizeof(float) * (size_t)kn * dh);
    memset(x->dv, 0, sizeof(float) * (size_t)kn * dh);
    for (int h = j * s->G; h < (j + 1) * s->G; h++)
        for (int qt = kb; qt < s->nt; qt++)
            backward_block(s, g, b, h, qt, kb, x->kt, x->vt, x->dk, x->dv, with_dq, x->p, x->ds, x->D);
    for (int r = 0; r < kn; r++)
        for (int d = 0; d < dh; d++) {
            dK[koff + r * s->ldk + d] += x->dk[r * dh + d];
            dV[koff + r * s->ldk + d] += x->dv[r * dh + d];
        }
}

/* dQ rows of query tile qt of head h alone (the second pass when key-tile tasks cannot own dQ). */
static void backward_query_tile(const Shape *s, const Grads *g, int b, int h, int qt, const Scratch *x) {
    const int dh = s->dh;
    for (int kb = 0; kb <= qt; kb++) {
        const int k0 = kb * TILE, kn = s->T - k0 < TILE ? s->T - k0 : TILE;
        const long koff = ((long)b * s->T + k0) * s->ldk + (long)(h / s->G) * dh;
        load_transposed(x->kt, s->K + koff, s->ldk, kn, dh, s->scale);
        load_transposed(x->vt, s->V + koff, s->ldk, kn, dh, 1.0f);
        backward_block(s, g, b, h, qt, kb, x->kt, x->vt, NULL, NULL, 1, x->p, x->ds, x->D);
    }
}

void flash_attention_backward(float *dQ, float *dK, float *dV, const float *dO, const float *O, const float *LSE,
                              const float *Q, const float *K, const float *V, int B, int T, int Hq, int Hkv, int dh,
                              float *work, int threads) {
    if (B <= 0 || T <= 0 || Hq <= 0 || Hkv <= 0 || dh <= 0) return;
    const Shape s = make_shape(Q, K, V, B, T, Hq, Hkv, dh);
    const Grads g = {.dQ = dQ, .dO = dO, .O = O, .LSE = LSE};
    const long groups = (long)B * Hkv, bh = (long)B * Hq;
    const size_t per = per_thread_floats(dh);
    const int nthr = threads_for(threads, 5.0 * bh * T * T * dh);
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

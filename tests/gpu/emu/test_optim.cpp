/* src/gpu/gpu_optim.cu run on the CPU (cuda_emu.h) against the CPU's arithmetic: the element-wise ops (f32 → bf16
 * one and four at a time against zy_f32_to_bf16 — ties to even, NaN made quiet, overflow to inf —, every bf16
 * pattern widened, bf16 added into fp32, scaling), the sums of squares (one block; the gradient norm's chunks and
 * their in-order sum), global-norm clipping against clip_coefficient, and whole Muon steps of a group through
 * go_muon_group itself (momentum with the per-matrix norms, Newton–Schulz's prep, B and the mirror of its banded
 * products, the update with its bf16 copy), fp32 and bf16 products, wide, tall and square matrices, one band and
 * several, more than one norm chunk, no iteration at all. Sizes not a multiple of 4, of a warp or of a block, grid-
 * stride loops with small grids, ranges inside an arena with everything around them checked untouched.
 * Element-wise results must equal the CPU's bit for bit; sums of squares (double, another order than the reference)
 * are within (terms + 2)·2⁻⁵³ relative of a long double sum: every term is exact in double (a float's square) and
 * non-negative, so any order's rounding error is at most (terms − 1)·u of the sum. The Newton–Schulz products run
 * on the host (gpu_gemm_batched below), the same function for the reference step, so a Muon step's weights must
 * equal the reference's bit for bit too (its one sum taken from the device, itself checked as above). Prints
 * "gpu-emu: N passed, N failed". */
#define ZAYA_GPU_EMU 1
#include "gpu_optim.cu"
#include "gpu_mirror.cu" /* the banded symmetric products' mirror, as a GPU step runs it */
#include "emu_check.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

/* ---- what gpu_optim.cu links against besides its own kernels ---- */

/* What only the rest of the GPU optimizer calls (create, free, checkpoints, error paths, and gpu_optim_step's AdamW
 * pass, which test_adamw.cpp runs): never reached here, so each stops the test loudly if it is. */
[[noreturn]] static void not_in_this_test(const char *what) {
    std::fprintf(stderr, "test_optim: %s was called, which this test does not provide\n", what);
    std::abort();
}
extern "C" {
void *gpu_alloc(size_t, const char *, ZyErr *) { not_in_this_test("gpu_alloc"); }
void gpu_free(void *) { not_in_this_test("gpu_free"); }
int gpu_upload(GpuCtx *, void *, const void *, size_t, ZyErr *) { not_in_this_test("gpu_upload"); }
int gpu_download(GpuCtx *, void *, const void *, size_t, ZyErr *) { not_in_this_test("gpu_download"); }
void gk_adamw(GkStream, float *, uint16_t *, const float *, float *, float *, uint64_t, const GpuOptimChunk *, int,
              GkOptimStep, GkOptimStep) {
    not_in_this_test("gk_adamw");
}
int param_is_router(const ParamInfo *) { not_in_this_test("param_is_router"); }
int zy_fail(ZyErr *, const char *, ...) { not_in_this_test("zy_fail"); }
int zy_wrap(ZyErr *, const char *, ...) { not_in_this_test("zy_wrap"); }

/* gpu_grad_sumsq with no chunks zeroes its output: the emulator's device memory is host memory */
void gpu_memset_async(GpuCtx *, void *dst, int value, size_t bytes) { std::memset(dst, value, bytes); }

/* optim.c's ns_symmetric_bands, transcribed (optim.c is not part of this build). Any bands give the same bits here:
 * each entry of a band is the whole product's dot product (host_gemm), and the products are symmetric bit for bit. */
int ns_symmetric_bands(int r, int band_rows, NsBand bands[NS_MAX_BANDS]) {
    int h = band_rows;
    if (h <= 0 && r < NS_BAND_MIN_R) h = r;
    if (h <= 0) {
        h = ((r + 7) / 8 + 127) / 128 * 128;
        if (h < 256) h = 256;
    }
    if (h > r) h = r;
    if (h < 1) h = 1;
    if ((r + h - 1) / h > NS_MAX_BANDS) h = (r + NS_MAX_BANDS - 1) / NS_MAX_BANDS;
    int n = 0;
    for (int r0 = 0; r0 < r; r0 += h) bands[n++] = NsBand{r0, r - r0 < h ? r - r0 : h};
    return n;
}
}

/* Newton–Schulz's products on the host: row-major D = alpha op(A) op(B) + beta C (gpu.h), each entry's dot product
 * summed in fp32 in k order (products of bf16 values are exact in fp32), then scaled (beta 0: C not read) and, bf16
 * out, rounded once. Any fixed order would do: the reference step uses this same function on whole matrices, so the
 * GPU step's bands, mirror, strides and batch reproduce the reference's bits exactly when they address the right
 * entries (X Xᵀ and A² come out symmetric bit for bit: the same products in the same order either side). */
static float widen(float x) { return x; }
static float widen(uint16_t h) { return zy_bf16_to_f32(h); }
static void narrow(float v, float *d) { *d = v; }
static void narrow(float v, uint16_t *d) { *d = zy_f32_to_bf16(v); }
template <typename T>
static void host_gemm(int ta, int tb, int M, int N, int K, float alpha, const T *A, int lda, const T *B, int ldb,
                      float beta, const T *C, T *D, int ldc) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float acc = 0;
            for (int k = 0; k < K; k++)
                acc += widen(ta ? A[(long)k * lda + i] : A[(long)i * lda + k]) *
                       widen(tb ? B[(long)j * ldb + k] : B[(long)k * ldb + j]);
            T &d = D[(long)i * ldc + j];
            narrow(beta == 0.0f ? alpha * acc : alpha * acc + beta * widen(C[(long)i * ldc + j]), &d);
        }
}

/* gpu.h's rules for a batched product, counted when broken: D's matrices must not overlap one another, nor A's or
 * B's (C may be D); bf16 only where the context says so. */
static long gemm_rule_breaks = 0;
static long span(int rows, int cols, int ld, long long stride, int batch) {
    return (long)(batch - 1) * (long)stride + (long)(rows - 1) * ld + cols;
}
template <typename T>
static void check_rules(int ta, int tb, int M, int N, int K, const T *A, int lda, long long sa, const T *B, int ldb,
                        long long sb, const T *D, int ldc, long long sc, int batch) {
    const long d_end = span(M, N, ldc, sc, batch);
    const T *a_lo = A, *a_hi = A + span(ta ? K : M, ta ? M : K, lda, sa, batch);
    const T *b_lo = B, *b_hi = B + span(tb ? N : K, tb ? K : N, ldb, sb, batch);
    const bool overlap_a = D < a_hi && a_lo < D + d_end, overlap_b = D < b_hi && b_lo < D + d_end;
    const bool d_overlaps_d = batch > 1 && sc < (long long)(M - 1) * ldc + N;
    gemm_rule_breaks += overlap_a || overlap_b || d_overlaps_d;
}
template <typename T>
static void host_gemm_batched(int ta, int tb, int M, int N, int K, float alpha, const T *A, int lda, long long sa,
                              const T *B, int ldb, long long sb, float beta, const T *C, T *D, int ldc, long long sc,
                              int batch) {
    check_rules(ta, tb, M, N, K, A, lda, sa, B, ldb, sb, D, ldc, sc, batch);
    for (int z = 0; z < batch; z++)
        host_gemm(ta, tb, M, N, K, alpha, A + z * sa, lda, B + z * sb, ldb, beta, C ? C + z * sc : nullptr, D + z * sc,
                  ldc);
}
extern "C" int gpu_gemm_batched(GpuCtx *g, int ta, int tb, int M, int N, int K, float alpha, const float *A,
                                const uint16_t *A16, int lda, long long sa, const float *B, const uint16_t *B16,
                                int ldb, long long sb, float beta, float *C, int ldc, long long sc, int batch,
                                ZyErr *) {
    gemm_rule_breaks += g->bf16 != 0 || A16 || B16; /* the fp32 iteration runs with fp32 products only */
    host_gemm_batched(ta, tb, M, N, K, alpha, A, lda, sa, B, ldb, sb, beta, (const float *)C, C, ldc, sc, batch);
    return 0;
}
extern "C" int gpu_gemm_batched_bf16(GpuCtx *g, int ta, int tb, int M, int N, int K, float alpha, const uint16_t *A16,
                                     int lda, long long sa, const uint16_t *B16, int ldb, long long sb, float beta,
                                     const uint16_t *C16, uint16_t *D16, int ldc, long long sc, int batch, ZyErr *) {
    gemm_rule_breaks += g->bf16 == 0 || (beta != 0.0f && !C16);
    host_gemm_batched(ta, tb, M, N, K, alpha, A16, lda, sa, B16, ldb, sb, beta, C16, D16, ldc, sc, batch);
    return 0;
}

/* ---- helpers ---- */

static uint32_t bits(float f) { return __float_as_uint(f); }
static float from_bits(uint32_t u) { return __uint_as_float(u); }
static uint32_t rand_bits() { /* emu_check's xorshift, 32 bits of it */
    uint64_t &s = emu_rng();
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    return (uint32_t)(s >> 32);
}
static std::vector<float> rnd(size_t n, float scale) {
    std::vector<float> v(n);
    for (float &x : v) x = scale * urand();
    return v;
}
/* The first element of v at a 16-byte boundary (v has 16 bytes to spare), so a test chooses its offsets from there. */
template <typename T> static T *aligned16(std::vector<T> &v) {
    const uintptr_t p = (uintptr_t)v.data();
    return v.data() + (16 - p % 16) % 16 / sizeof(T);
}
/* (terms + 2)·2⁻⁵³: the bound on a double sum of non-negative exact terms in any order, the reference's own error
 * and one more add (*out +=) included */
static double sum_tolerance(long terms) { return (double)(terms + 2) * 0x1p-53; }
static double rel_err(double got, long double want) {
    return want == 0 ? std::fabs(got) : (double)(std::fabs((long double)got - want) / std::fabs(want));
}

/* ---- f32 → bf16 ---- */

/* bf16_specials, n_bf16_specials */
#include "../bf16_specials.h"

/* n patterns: the specials first, then any bit pattern, exact ties, near ties and ordinary values in turn */
static std::vector<uint32_t> rounding_patterns(size_t n) {
    std::vector<uint32_t> u(n);
    for (size_t i = 0; i < n; i++) {
        if (i < n_bf16_specials) u[i] = bf16_specials[i];
        else if (i % 4 == 0) u[i] = rand_bits();
        else if (i % 4 == 1) u[i] = (rand_bits() & 0xffff0000u) | 0x8000u;
        else if (i % 4 == 2) u[i] = (rand_bits() & 0xffff0000u) | (0x7fffu + rand_bits() % 3);
        else u[i] = bits(3.0f * urand());
    }
    return u;
}

/* gk_f32_to_bf16 from src + src_off into dst + dst_off (elements past a 16-byte boundary): the four-at-a-time kernel
 * where src is 16-byte and dst 8-byte aligned and n >= 4, else one at a time. Sentinels either side must stay. */
static void f32_to_bf16_case(long n, int src_off, int dst_off) {
    const uint16_t SENT = 0x5a5a;
    std::vector<float> src_buf((size_t)n + 8);
    std::vector<uint16_t> dst_buf((size_t)n + 24, SENT);
    float *src = aligned16(src_buf) + src_off;
    uint16_t *dst = aligned16(dst_buf) + 4 + dst_off; /* 4: room for sentinels before it */
    const std::vector<uint32_t> u = rounding_patterns((size_t)n);
    std::memcpy(src, u.data(), (size_t)n * 4); /* no float arithmetic on the patterns */
    const bool vec4 = ((uintptr_t)src & 15u) == 0 && ((uintptr_t)dst & 7u) == 0 && n >= 4;
    gk_f32_to_bf16(nullptr, dst, src, n);
    long bad = 0, first = -1;
    for (long i = 0; i < n; i++)
        if (dst[i] != zy_f32_to_bf16(src[i]) && !bad++) first = i;
    bool kept = true;
    for (uint16_t *p = dst_buf.data(); p < dst_buf.data() + dst_buf.size(); p++)
        if (p < dst || p >= dst + n) kept = kept && *p == SENT;
    const std::string first_at = bad ? " (the first at " + std::to_string(first) + ")" : "";
    char what[240];
    std::snprintf(what, sizeof what,
                  "f32 -> bf16 n %ld, offsets %d/%d (%s): %ld differ from zy_f32_to_bf16%s, sentinels %s", n, src_off,
                  dst_off, vec4 ? "four at a time" : "one at a time", bad, first_at.c_str(),
                  kept ? "kept" : "OVERWRITTEN");
    report(bad == 0 && kept, what);
}

/* Either kernel launched with a small grid: every thread takes several turns of the grid-stride loop. */
static void f32_to_bf16_stride_case(bool vec4, long n, unsigned grid, unsigned threads) {
    std::vector<float> src_buf((size_t)n + 4);
    std::vector<uint16_t> dst_buf((size_t)n + 8, 0x5a5a);
    float *src = aligned16(src_buf);
    uint16_t *dst = aligned16(dst_buf);
    const std::vector<uint32_t> u = rounding_patterns((size_t)n);
    std::memcpy(src, u.data(), (size_t)n * 4);
    if (vec4) GK_LAUNCH(go_f32_to_bf16_vec4_kernel, grid, threads, 0, nullptr, dst, src, n);
    else GK_LAUNCH(go_f32_to_bf16_kernel, grid, threads, 0, nullptr, dst, src, n);
    long bad = 0;
    for (long i = 0; i < n; i++) bad += dst[i] != zy_f32_to_bf16(src[i]);
    bad += dst[n] != 0x5a5a;
    char what[160];
    std::snprintf(what, sizeof what, "f32 -> bf16 %s, grid %u x %u over n %ld: %ld wrong",
                  vec4 ? "four at a time" : "one at a time", grid, threads, n, bad);
    report(bad == 0, what);
}

/* ---- bf16 → f32, bf16 added into f32, scale ---- */

/* n patterns (65536 + 3: every one, three twice), from an odd offset into an odd offset */
static void bf16_to_f32_case(long n) {
    std::vector<uint16_t> src_buf((size_t)n + 1);
    std::vector<float> dst_buf((size_t)n + 2, from_bits(0x5a5a5a5au));
    uint16_t *src = src_buf.data() + 1;
    float *dst = dst_buf.data() + 1;
    for (long i = 0; i < n; i++) src[i] = (uint16_t)((unsigned long)i * 40503u); /* odd multiplier: all patterns */
    gk_bf16_to_f32(nullptr, dst, src, n);
    long bad = 0;
    for (long i = 0; i < n; i++) bad += bits(dst[i]) != bits(zy_bf16_to_f32(src[i]));
    bad += bits(dst_buf[0]) != 0x5a5a5a5au || bits(dst_buf[(size_t)n + 1]) != 0x5a5a5a5au;
    char what[160];
    std::snprintf(what, sizeof what, "bf16 -> f32, %ld patterns at odd offsets: %ld differ from zy_bf16_to_f32", n,
                  bad);
    report(bad == 0, what);
}

/* dst += widened src, against the CPU's fp32 sum; values that overflow to inf and infinities among them */
static void add_bf16_case(long n, int off) {
    std::vector<float> dst_buf = rnd((size_t)n + 8, 2.0f);
    std::vector<uint16_t> src_buf((size_t)n + 8);
    float *dst = dst_buf.data() + off;
    uint16_t *src = src_buf.data() + off;
    for (long i = 0; i < n; i++) src[i] = zy_f32_to_bf16(0.5f * urand());
    if (n > 3) {
        dst[0] = from_bits(0x7f7fffffu), src[0] = 0x7f7f; /* FLT_MAX + a large bf16: inf */
        dst[1] = 1.0f, src[1] = 0xff80;                  /* 1 + −inf */
        dst[2] = -0.0f, src[2] = 0x8000;                 /* −0 + −0 */
    }
    const std::vector<float> before = dst_buf;
    gk_add_bf16_to_f32(nullptr, dst, src, n);
    long bad = 0;
    for (size_t i = 0; i < dst_buf.size(); i++) {
        const long k = (long)i - off;
        const float want = k >= 0 && k < n ? before[i] + zy_bf16_to_f32(src[k]) : before[i];
        bad += bits(dst_buf[i]) != bits(want);
    }
    char what[160];
    std::snprintf(what, sizeof what, "bf16 added into f32, n %ld at offset %d: %ld differ from the CPU's sums", n, off,
                  bad);
    report(bad == 0, what);
}

/* x *= a: through gk_scale, and launched with a small grid (grid > 0) */
static void scale_case(long n, int off, float a, unsigned grid) {
    std::vector<float> buf = rnd((size_t)n + 8, 3.0f);
    const std::vector<float> before = buf;
    float *x = buf.data() + off;
    if (grid) GK_LAUNCH(go_scale_kernel, grid, 64, 0, nullptr, x, a, n);
    else gk_scale(nullptr, x, a, n);
    long bad = 0;
    for (size_t i = 0; i < buf.size(); i++) {
        const long k = (long)i - off;
        bad += bits(buf[i]) != bits(k >= 0 && k < n ? before[i] * a : before[i]);
    }
    char what[160];
    std::snprintf(what, sizeof what, "scale by %g, n %ld at offset %d, grid %s: %ld differ from the CPU's products",
                  (double)a, n, off, grid ? (std::to_string(grid) + " x 64").c_str() : "gk_scale's", bad);
    report(bad == 0, what);
}

/* ---- sums of squares ---- */

static double worst_sum_err = 0; /* the worst relative error of every sum checked */
static bool sum_ok(double got, long double want, long terms, double *err) {
    *err = rel_err(got, want);
    worst_sum_err = std::max(worst_sum_err, *err);
    return *err <= sum_tolerance(terms);
}

/* gk_sumsq: *out += Σ x² over [off, off + n) from 0.25, then again into the same output; a rerun: the same bits */
static void sumsq_case(long n, int off) {
    const std::vector<float> buf = rnd((size_t)n + 8, 1.5f);
    const float *x = buf.data() + off;
    long double want = 0.25L;
    for (long i = 0; i < n; i++) want += (long double)x[i] * x[i];
    double out = 0.25;
    gk_sumsq(nullptr, &out, x, n);
    double err;
    const bool ok = sum_ok(out, want, n, &err);
    double again = 0.25;
    gk_sumsq(nullptr, &again, x, n);
    double twice = out;
    gk_sumsq(nullptr, &twice, x, n); /* accumulates */
    double err2;
    const bool ok2 = sum_ok(twice, 2 * want - 0.25L, 2 * n, &err2);
    char what[200];
    std::snprintf(what, sizeof what,
                  "sum of squares, one block, n %ld at offset %d: rel err %.2e, %.2e accumulated (tol %.1e); rerun "
                  "%s",
                  n, off, err, err2, sum_tolerance(2 * n), std::memcmp(&again, &out, 8) == 0 ? "same bits" : "DIFFERS");
    report(ok && ok2 && std::memcmp(&again, &out, sizeof out) == 0, what);
}

/* go_sum_partials_kernel on its own: `rows` blocks, each out[y] = Σ of n partials (more than a thread each when
 * n > 1024) */
static void sum_partials_case(int rows, int n) {
    std::vector<double> partial((size_t)rows * n);
    for (double &p : partial) p = (double)std::fabs(urand()) * std::ldexp(1.0, (int)(rand_bits() % 40) - 20);
    std::vector<double> out((size_t)rows + 1, -1.0);
    GK_LAUNCH(go_sum_partials_kernel, rows, 1024, 0, nullptr, out.data(), partial.data(), n);
    bool ok = out[(size_t)rows] == -1.0;
    double worst = 0;
    for (int y = 0; y < rows; y++) {
        long double want = 0;
        for (int i = 0; i < n; i++) want += partial[(size_t)y * n + i];
        double err;
        ok = sum_ok(out[(size_t)y], want, n, &err) && ok;
        worst = std::max(worst, err);
    }
    char what[160];
    std::snprintf(what, sizeof what, "in-order sum of partials, %d rows of %d: worst rel err %.2e (tol %.1e)", rows, n,
                  worst, sum_tolerance(n));
    report(ok, what);
}

/* gpu_grad_sumsq over chunks of tensors in an arena (go_add_chunks: the optimizer's own chunking, GO_SUM_CHUNK and
 * smaller), then the same bits again; and with no chunks, a zero. */
static void grad_sumsq_case(size_t chunk) {
    struct Tensor {
        size_t off, numel;
    };
    const Tensor tensors[] = {{3, 1}, {10, 255}, {300, 257}, {600, 1000}, {1700, (size_t)GO_SUM_CHUNK + 700}};
    const size_t total = tensors[4].off + tensors[4].numel + 5;
    std::vector<float> g = rnd(total, 0.1f);
    int n = 0;
    for (const Tensor &t : tensors) n = go_add_chunks(nullptr, n, t.off, t.numel, chunk, 0);
    std::vector<GpuOptimChunk> chunks((size_t)n);
    n = 0;
    for (const Tensor &t : tensors) n = go_add_chunks(chunks.data(), n, t.off, t.numel, chunk, 0);
    std::vector<double> partial((size_t)n);
    GpuOptimizer o{};
    o.grad_chunks = chunks.data(), o.n_grad_chunks = n, o.partial = partial.data(), o.n_partial = n;
    GpuCtx ctx{};
    double out = -1, again = -2;
    gpu_grad_sumsq(&o, &ctx, g.data(), &out);
    gpu_grad_sumsq(&o, &ctx, g.data(), &again);
    long double want = 0;
    long terms = 0;
    for (const Tensor &t : tensors)
        for (size_t i = t.off; i < t.off + t.numel; i++) want += (long double)g[i] * g[i], terms++;
    double err;
    const bool ok = sum_ok(out, want, terms, &err);
    char what[200];
    std::snprintf(what, sizeof what,
                  "gradient sum of squares, %d chunks of up to %zu (%ld terms): rel err %.2e (tol %.1e), rerun %s", n,
                  chunk, terms, err, sum_tolerance(terms), std::memcmp(&out, &again, 8) == 0 ? "same bits" : "DIFFERS");
    report(ok && std::memcmp(&out, &again, sizeof out) == 0, what);
}
static void grad_sumsq_empty_case() {
    GpuOptimizer o{};
    GpuCtx ctx{};
    double out = 7.0;
    gpu_grad_sumsq(&o, &ctx, nullptr, &out);
    report(out == 0.0, "gradient sum of squares with no chunks: 0");
}

/* ---- clipping ---- */

/* optim.c's clip_coefficient */
static double reference_clip_coefficient(double max_norm, double norm) {
    if (max_norm <= 0) return 1.0;
    double coef = max_norm / (norm + 1e-6);
    return coef < 1.0 ? coef : 1.0;
}

/* gpu_grad_clip over [off, off + n) of an arena, against grad_clip: g *= (float)coef only when coef < 1 */
static void clip_case(const char *name, long n, int off, double sumsq, double max_norm) {
    std::vector<float> buf = rnd((size_t)n + 8, 2.0f);
    const std::vector<float> before = buf;
    GpuCtx ctx{};
    gpu_grad_clip(&ctx, buf.data() + off, (size_t)n, &sumsq, max_norm);
    const double coef = reference_clip_coefficient(max_norm, std::sqrt(sumsq));
    long bad = 0, changed = 0;
    for (size_t i = 0; i < buf.size(); i++) {
        const long k = (long)i - off;
        float want = before[i];
        if (k >= 0 && k < n && coef < 1.0) want *= (float)coef;
        bad += bits(buf[i]) != bits(want);
        changed += bits(buf[i]) != bits(before[i]);
    }
    char what[200];
    std::snprintf(what, sizeof what,
                  "clip %s (n %ld at offset %d, norm² %g, max %g): %ld differ from grad_clip's, %ld changed", name, n,
                  off, sumsq, max_norm, bad, changed);
    report(bad == 0, what);
}

/* ---- Muon ---- */

/* The reference step of one matrix, muon_job of optim.c operation for operation. First the momentum and the Nesterov
 * vector: M ← μM + G, returns X = G + μM (G read as g·grad_scale: grad_clip's multiply, only when it clips). */
static std::vector<float> reference_nesterov(const float *g, float *mom, size_t len, float mu, float grad_scale) {
    std::vector<float> X(len);
    for (size_t i = 0; i < len; i++) {
        const float gi = grad_scale != 1.0f ? g[i] * grad_scale : g[i];
        mom[i] = mu * mom[i] + gi;
        X[i] = gi + mu * mom[i];
    }
    return X;
}
/* Then X normalised by its norm, Newton–Schulz as go_muon_group documents it (fp32: ns5_iterate's iteration with
 * whole products; bf16: the iterates kept in bf16, the coefficients in the products' alpha / beta), the products
 * through host_gemm, and W ← W − (scale·O + decay·W). sumsq is the device's sum of X² (checked by the caller against
 * its own reference): summed in another order it may round differently, and everything after it is compared bit for
 * bit. */
static void reference_update(float *w, std::vector<float> X, int m, int n, double lr, double wd, int steps, bool bf16,
                             double sumsq) {
    const float a = 3.4445f, b = -4.7750f, c = 2.0315f;
    const int tall = m > n, r = tall ? n : m;
    const size_t len = (size_t)m * n, rr = (size_t)r * r;
    const float inv = (float)(1.0 / (std::sqrt(sumsq) + 1e-7));
    for (size_t i = 0; i < len; i++) X[i] *= inv;
    std::vector<float> O(len);
    if (!bf16) {
        std::vector<float> Xn(len), A(rr), B(rr);
        float *x = X.data(), *xn = Xn.data();
        for (int it = 0; it < steps; it++) {
            if (tall) host_gemm(1, 0, r, r, m, 1.0f, x, n, x, n, 0.0f, (const float *)nullptr, A.data(), r);
            else host_gemm(0, 1, r, r, n, 1.0f, x, n, x, n, 0.0f, (const float *)nullptr, A.data(), r);
            for (size_t i = 0; i < rr; i++) B[i] = b * A[i];
            host_gemm(0, 0, r, r, r, c, A.data(), r, A.data(), r, 1.0f, B.data(), B.data(), r);
            for (size_t i = 0; i < len; i++) xn[i] = a * x[i];
            if (tall) host_gemm(0, 0, m, n, n, 1.0f, x, n, B.data(), r, 1.0f, xn, xn, n);
            else host_gemm(0, 0, m, n, m, 1.0f, B.data(), r, x, n, 1.0f, xn, xn, n);
            std::swap(x, xn);
        }
        std::copy(x, x + len, O.begin());
    } else {
        std::vector<uint16_t> Xa(len), Xb(len), A16(rr), B16(rr);
        for (size_t i = 0; i < len; i++) Xa[i] = zy_f32_to_bf16(X[i]);
        uint16_t *x = Xa.data(), *xn = Xb.data();
        for (int it = 0; it < steps; it++) {
            if (tall) host_gemm(1, 0, r, r, m, 1.0f, x, n, x, n, 0.0f, (const uint16_t *)nullptr, A16.data(), r);
            else host_gemm(0, 1, r, r, n, 1.0f, x, n, x, n, 0.0f, (const uint16_t *)nullptr, A16.data(), r);
            host_gemm(0, 0, r, r, r, c, A16.data(), r, A16.data(), r, b, A16.data(), B16.data(), r);
            if (tall) host_gemm(0, 0, m, n, n, 1.0f, x, n, B16.data(), r, a, x, xn, n);
            else host_gemm(0, 0, m, n, m, 1.0f, B16.data(), r, x, n, a, x, xn, n);
            std::swap(x, xn);
        }
        for (size_t i = 0; i < len; i++) O[i] = steps > 0 ? zy_bf16_to_f32(x[i]) : X[i]; /* no iteration: X itself */
    }
    const float scale = (float)(0.2 * std::sqrt((double)(m > n ? m : n)) * lr), decay = (float)(lr * wd);
    for (size_t i = 0; i < len; i++) w[i] -= scale * O[i] + decay * w[i];
}

/* A buffer of n T with `spare` more after it, all filled with a NaN pattern (the optimizer's scratch holds the last
 * step's values; a read of an entry no launch wrote is a NaN in the result), the spare part checked untouched. */
template <typename T> struct Scratch {
    std::vector<T> v;
    size_t n;
    static constexpr size_t spare = 64;
    explicit Scratch(size_t count) : v(count + spare), n(count) { std::memset(v.data(), 0xff, v.size() * sizeof(T)); }
    T *data() { return v.data(); }
    bool tail_kept() const {
        for (size_t i = n; i < v.size(); i++) {
            T poison;
            std::memset(&poison, 0xff, sizeof poison);
            if (std::memcmp(&v[i], &poison, sizeof poison)) return false;
        }
        return true;
    }
};

struct MuonCase {
    const char *name;
    int m, n, count, band_rows, ns_steps;
    float grad_scale;
    bool params16;
};

/* Two optimizer steps of one Muon group through go_muon_group: the group's matrices (count, [m, n]) placed in an
 * arena in reverse order with gaps, an owned block starting inside it, the offsets list holding another group's
 * matrix first (the group starts at entry 1); the optimizer's scratch sized as gpu_optim_create sizes it. */
static void muon_case(const MuonCase &mc, bool bf16) {
    const int m = mc.m, n = mc.n, cnt = mc.count, r = m < n ? m : n;
    const size_t len = (size_t)m * n, rr = (size_t)r * r, gap = 5, begin = 37;
    const size_t ls = go_pad(len), rs = go_pad(rr), parts = (len + GO_NS_CHUNK - 1) / GO_NS_CHUNK;
    const size_t total = begin + 3 + (size_t)(cnt + 1) * (len + gap) + 11;
    std::vector<uint64_t> offs((size_t)cnt + 1);
    offs[0] = begin + 3; /* another group's matrix: must stay as it is */
    for (int j = 0; j < cnt; j++) offs[(size_t)j + 1] = begin + 3 + (len + gap) * (size_t)(cnt - j);
    std::vector<float> w = rnd(total, 0.5f), mom(total - begin);
    for (size_t i = 0; i < mom.size(); i++) mom[i] = 0.05f * urand();
    const uint16_t SENT = 0xbeef;
    std::vector<uint16_t> w16(total, SENT);
    std::vector<float> rw = w, rmom = mom;
    /* the optimizer's scratch, as gpu_optim_create_grouped sizes it for this one group */
    Scratch<float> ns_x((size_t)(cnt - 1) * ls + len), ns_xn(ns_x.n), ns_a((size_t)(cnt - 1) * rs + rr), ns_b(ns_a.n);
    Scratch<uint16_t> ns_x16(ns_x.n), ns_m16(ns_a.n);
    Scratch<double> partial((size_t)cnt * parts), ns_sumsq((size_t)cnt);
    GpuOptimizer o{};
    o.cfg.weight_decay = 0.1, o.cfg.beta1 = 0.9, o.cfg.beta2 = 0.95, o.cfg.eps = 1e-8, o.cfg.muon_momentum = 0.95;
    o.cfg.muon_ns_steps = mc.ns_steps, o.cfg.router_lr_scale = 1.0;
    o.params16 = mc.params16 ? w16.data() : nullptr;
    o.begin = begin, o.end = total;
    o.exp_avg = mom.data();
    o.muon_off = offs.data();
    o.ns_x = ns_x.data(), o.ns_xn = ns_xn.data(), o.ns_a = ns_a.data(), o.ns_b = ns_b.data();
    o.ns_x16 = ns_x16.data(), o.ns_m16 = ns_m16.data();
    o.ns_len = ns_x.n, o.ns_rr = ns_a.n;
    o.partial = partial.data(), o.n_partial = (int)partial.n, o.ns_sumsq = ns_sumsq.data(), o.max_batch = cnt;
    o.ns_band_rows = mc.band_rows;
    GpuCtx ctx{};
    ctx.bf16 = bf16;
    const GpuMuonGroup gr = {1, cnt, m, n, 0};
    NsBand bands[NS_MAX_BANDS];
    const int nb = ns_symmetric_bands(r, mc.band_rows, bands);
    const long breaks_before = gemm_rule_breaks;
    bool launched = true, sums_ok = true;
    double worst_sum = 0;
    for (int step = 1; step <= 2; step++) {
        const std::vector<float> g = rnd(total, 0.02f);
        const double lr = 0.01 * step;
        o.step = step;
        const GkOptimStep k = go_step_consts(&o, lr, mc.grad_scale);
        ZyErr err{};
        launched = go_muon_group(&o, &ctx, w.data(), g.data(), &gr, &k, &err) == 0 && launched;
        for (int j = 0; j < cnt; j++) {
            const size_t off = offs[(size_t)j + 1];
            const std::vector<float> X =
                reference_nesterov(g.data() + off, rmom.data() + (off - begin), len, (float)0.95, mc.grad_scale);
            long double want = 0; /* the norm: the device's sum against a long double one */
            for (float x : X) want += (long double)x * x;
            double e;
            sums_ok = sum_ok(ns_sumsq.v[(size_t)j], want, (long)len, &e) && sums_ok;
            worst_sum = std::max(worst_sum, e);
            reference_update(rw.data() + off, X, m, n, lr, 0.1, mc.ns_steps, bf16, ns_sumsq.v[(size_t)j]);
        }
    }
    long w_bad = 0, mom_bad = 0, w16_bad = 0;
    for (size_t i = 0; i < total; i++) w_bad += bits(w[i]) != bits(rw[i]);
    for (size_t i = 0; i < mom.size(); i++) mom_bad += bits(mom[i]) != bits(rmom[i]);
    std::vector<bool> in_group(total, false);
    for (int j = 0; j < cnt; j++)
        for (size_t i = 0; i < len; i++) in_group[offs[(size_t)j + 1] + i] = true;
    for (size_t i = 0; i < total; i++)
        w16_bad += w16[i] != (mc.params16 && in_group[i] ? zy_f32_to_bf16(rw[i]) : SENT);
    const bool tails = ns_x.tail_kept() && ns_xn.tail_kept() && ns_a.tail_kept() && ns_b.tail_kept() &&
                       ns_x16.tail_kept() && ns_m16.tail_kept() && partial.tail_kept() && ns_sumsq.tail_kept();
    const long breaks = gemm_rule_breaks - breaks_before;
    char what[400];
    std::snprintf(what, sizeof what,
                  "Muon %s, %s products, %d band%s, %d NS steps, grad scale %g%s: 2 steps, %ld weights, %ld momenta, "
                  "%ld bf16 copies differ from the reference; norms' rel err %.2e (tol %.1e); %s; %ld product rule "
                  "breaks",
                  mc.name, bf16 ? "bf16" : "fp32", nb, nb == 1 ? "" : "s", mc.ns_steps, (double)mc.grad_scale,
                  mc.params16 ? ", bf16 copy" : "", w_bad, mom_bad, w16_bad, worst_sum, sum_tolerance((long)len),
                  tails ? "scratch bounds kept" : "SCRATCH OVERRUN", breaks);
    report(launched && w_bad == 0 && mom_bad == 0 && w16_bad == 0 && sums_ok && tails && breaks == 0, what);
}

int main() {
    emu_rng() = 0x6f7074696d757321ull;

    for (long n : {1L, 3L, 4L, 7L, 31L, 1027L, 4099L}) f32_to_bf16_case(n, 0, 0);
    f32_to_bf16_case(2053, 1, 0); /* unaligned source */
    f32_to_bf16_case(2050, 0, 1); /* destination 2 bytes off */
    f32_to_bf16_case(2051, 0, 2); /* destination 4 bytes off */
    f32_to_bf16_case(2051, 4, 4); /* both off their buffers' starts, still aligned: four at a time */
    f32_to_bf16_stride_case(true, 4 * 1000 + 3, 3, 64);
    f32_to_bf16_stride_case(false, 1001, 2, 96);
    bf16_to_f32_case(65536 + 3);
    add_bf16_case(5, 1);
    add_bf16_case(3001, 3);
    for (long n : {1L, 33L, 2051L}) scale_case(n, 3, -1.37f, 0);
    scale_case(1000, 1, 0.5f, 2);

    for (long n : {1L, 31L, 1024L, 5003L}) sumsq_case(n, 5);
    sum_partials_case(1, 7);
    sum_partials_case(3, 3000);
    grad_sumsq_case(GO_SUM_CHUNK);
    grad_sumsq_case(100);
    grad_sumsq_empty_case();

    clip_case("above the limit", 2051, 3, 16.0, 1.0);
    clip_case("below the limit", 33, 1, 0.25, 1.0);
    clip_case("at a NaN norm", 33, 1, NAN, 1.0);
    clip_case("at an infinite norm", 300, 2, INFINITY, 1.0);
    clip_case("off (max 0)", 33, 1, 16.0, 0.0);
    clip_case("a single element", 1, 5, 4.0, 1.5);

    const MuonCase cases[] = {
        {"wide [3, 70] x 3, one-row bands", 3, 70, 3, 1, 5, 1.0f, true},
        {"tall [70, 3] x 2, two-row bands", 70, 3, 2, 2, 5, 0.37f, false},
        {"square [33, 33] x 1, whole products", 33, 33, 1, INT_MAX, 1, 1.0f, true},
        {"row [1, 40] x 2", 1, 40, 2, 0, 5, 1.0f, false},
        {"[5, 7] x 2, no iteration", 5, 7, 2, 0, 0, 0.5f, true},
        {"wide [130, 131] x 2: two norm chunks, 50-row bands", 130, 131, 2, 50, 2, 1.0f, true},
        {"tall [140, 120] x 1: two norm chunks, 45-row bands", 140, 120, 1, 45, 1, 0.8f, false},
    };
    for (const MuonCase &mc : cases) {
        muon_case(mc, false);
        muon_case(mc, true);
    }
    std::printf("gpu-emu: %d passed, %d failed (worst sum of squares rel err %.2e)\n", emu_passed(), emu_failed(),
                worst_sum_err);
    return emu_failed() != 0;
}

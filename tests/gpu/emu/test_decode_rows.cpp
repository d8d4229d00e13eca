/* src/gpu/gpu_decode_kernels.cu's row moves run on the CPU (cuda_emu.h), against plain loops:
 * - gk_copy_rows_idx2 (two copies in one launch, as a decoding step appends k̂ and v, or gathers the convolution
 *   state with the new rows): one copy through both index lists (scattered by a permutation, gathered with
 *   repeats), the other strided without any, rows of different lengths; every written element equal to its source
 *   (bf16 destinations: rounded as zy_f32_to_bf16), every other element untouched; either copy empty; rows whose
 *   destination index is negative skipped (a padded list: the kept block states' copies);
 * - gk_cca_decode_rows (CCA after the convolution in one launch: q-k mean, norm + RoPE, the delayed values with each
 *   sequence's kept vd, k̂ and v appended, the convolution state copied), against the launches it replaces: a ragged
 *   batch's sequences of one and of several rows in slots out of order, the slots no sequence uses untouched, fp32
 *   and bf16 caches; and the same-length cache's form (no descriptors);
 * - gk_cca_conv_decode (the convolution's outputs at a step's new rows only) against the CPU's formula in double.
 * Prints "gpu-emu: N passed, N failed". */
#define ZAYA_GPU_EMU 1
#include "gpu_decode_kernels.cu"
#include "emu_check.h"

#include <cmath>
#include <cstring>
#include <vector>

static uint16_t ref_bf16(float f) { /* zy_f32_to_bf16 */
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static uint32_t stored(float x, float *) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    return u;
}
static uint32_t stored(float x, uint16_t *) { return ref_bf16(x); }
static uint32_t bits(const float *p) {
    uint32_t u;
    std::memcpy(&u, p, 4);
    return u;
}
static uint32_t bits(const uint16_t *p) { return *p; }

static std::vector<float> rand_vec(size_t n) {
    std::vector<float> v(n);
    for (auto &x : v) x = urand();
    return v;
}

/* Copy a: n_a rows of len_a through dst_idx (a permutation of a larger destination; with skips, every third row's
 * index -1: not copied) and src_idx (with repeats); copy b: n_b rows of len_b, strided, no index; the two land in
 * disjoint halves of one destination. */
template <class T> static void copy2_case(const char *type, int n_a, int n_b, bool skips = false) {
    const long len_a = 29, sst_a = len_a + 3, len_b = 11, dst_b_stride = len_b + 5, src_b_stride = len_b + 2;
    const int rows_a = n_a + 4, src_rows_a = 7; /* a few rows no index names */
    /* copy a's rows start one row in: a skipped row written at index -1 would land in that row, checked untouched */
    const long size_a = (rows_a + 1) * len_a, size = size_a + (long)(n_b > 0 ? n_b : 1) * dst_b_stride;
    const std::vector<float> src_a = rand_vec((size_t)src_rows_a * sst_a),
                             src_b = rand_vec((size_t)(n_b + 1) * src_b_stride);
    std::vector<int32_t> dst_idx(n_a > 0 ? n_a : 1), src_idx(n_a > 0 ? n_a : 1);
    for (int k = 0; k < n_a; k++) /* 7 is prime to rows_a (10, 13): distinct destinations */
        dst_idx[k] = skips && k % 3 == 1 ? -1 : (k * 7 + 3) % rows_a, src_idx[k] = (k * 3) % src_rows_a;
    std::vector<T> dst((size_t)size);
    std::memset(dst.data(), 0x7f, dst.size() * sizeof(T));
    const std::vector<T> before = dst;
    const GkRowCopy a = {dst.data() + len_a, len_a, dst_idx.data(), src_a.data(), sst_a, src_idx.data(), len_a, n_a},
                    b = {dst.data() + size_a, dst_b_stride, nullptr, src_b.data(), src_b_stride, nullptr, len_b, n_b};
    if constexpr (sizeof(T) == 4) gk_copy_rows_idx2(nullptr, a, b);
    else gk_copy_rows_idx2_bf16(nullptr, a, b);
    std::vector<int> written((size_t)size, 0);
    long bad = 0;
    for (int k = 0; k < n_a; k++)
        for (long i = 0; i < len_a && dst_idx[k] >= 0; i++) {
            const long d = (dst_idx[k] + 1) * len_a + i;
            written[d]++;
            bad += bits(&dst[d]) != stored(src_a[src_idx[k] * sst_a + i], (T *)nullptr);
        }
    for (int r = 0; r < n_b; r++)
        for (long i = 0; i < len_b; i++) {
            const long d = size_a + r * dst_b_stride + i;
            written[d]++;
            bad += bits(&dst[d]) != stored(src_b[r * src_b_stride + i], (T *)nullptr);
        }
    for (long d = 0; d < size; d++) bad += !written[d] && bits(&dst[d]) != bits(&before[d]);
    char what[160];
    std::snprintf(what, sizeof what, "copy_rows_idx2 %s: %d indexed rows%s + %d strided rows, %ld elements wrong", type,
                  n_a, skips ? " (every third skipped)" : "", n_b, bad);
    report(bad == 0, what);
}

/* The old kernels' per-row steps, one warp an item, through gpu_cca_rows.cuh's functions: the q-k mean of row r into
 * qpre / kpre, then the norm + RoPE of each head (queries without a temperature, keys with one). */
__global__ void qk_mean_ref_kernel(float *qpre, float *kpre, const float *Xe, const float *Ye, const int32_t *xrow,
                                   int Hq, int Hkv, int dh) {
    const int r = blockIdx.x, G = Hq / Hkv, C = (Hq + Hkv) * dh, Cq = Hq * dh;
    for (int el = threadIdx.x; el < Hkv * dh; el += blockDim.x)
        qk_mean_at(Xe + (long)xrow[r] * C, Ye + (long)xrow[r] * C, el / dh, el % dh, G, dh, Cq,
                   qpre + (long)r * Cq + (long)(el / dh) * G * dh, dh, kpre + (long)r * Hkv * dh + el);
}
__global__ void norm_rope_ref_kernel(float *y, const float *x, const float *temp, const float *cosv, const float *sinv,
                                     const int32_t *pos, int H, int dh, int half, float scale, float eps) {
    const int r = blockIdx.x, h = threadIdx.x / GPU_WARP;
    const long it = (long)r * H + h;
    l2norm_rope_head(y + it * dh, nullptr, x + it * dh, temp ? temp + h : nullptr, cosv + (long)pos[r] * half,
                     sinv + (long)pos[r] * half, dh, half, scale, eps);
}

/* gk_cca_decode_rows against the launches it replaces (q-k mean, norm + RoPE, delayed values, the appends, the
 * convolution state's copy) as the old kernels' steps and plain loops: sequences of lens[i] consecutive rows in slots
 * slots[i] (out of order) of a kept-vd array of n_slots, their rows at scattered columns of the [state | new] blocks,
 * at scattered positions and cache rows; uniform: the same-length cache's form (n rows each, slot i, no descriptors:
 * columns (r / n)·TE + P + r % n, positions r % n of offset tables, cache rows (r / n)·kv_seq + p0 + r % n). Every
 * output compared bit for bit, every element not written left as it was. */
template <class KV>
static void cca_rows_case(const char *label, const std::vector<int> &lens, const std::vector<int> &slots, int n_slots,
                          int Hq, int Hkv, int dh, int rd, bool uniform) {
    const int S = (int)lens.size(), Cq = Hq * dh, Ck = Hkv * dh, C = Cq + Ck, half = Ck / 2, hr = rd / 2;
    const int P = 2, n = lens[0], TE = P + n, kv_seq = 50, p0 = 7, n_pos = 64;
    const long slot_stride = half + 3;
    std::vector<int32_t> row_seq, first(S), last(S), slot(slots.begin(), slots.end());
    for (int i = 0; i < S; i++) {
        first[i] = (int)row_seq.size();
        for (int t = 0; t < lens[i]; t++) row_seq.push_back(i);
        last[i] = (int)row_seq.size() - 1;
    }
    const int N = (int)row_seq.size(), n_in = uniform ? S * TE : N + 5, n_cache = uniform ? S * kv_seq : 3 * N + 4;
    std::vector<int32_t> xrow(N), pos(N), kv_row(N), xout(S);
    for (int r = 0; r < N; r++) {
        const int i = row_seq[r], t = r - first[i];
        xrow[r] = uniform ? i * TE + P + t : (r * 7 + 2) % n_in;
        pos[r] = uniform ? p0 + t : (r * 13 + 5) % n_pos;
        kv_row[r] = uniform ? i * kv_seq + p0 + t : (r * 5 + 1) % n_cache; /* distinct: 5 and 3N + 4 coprime here */
    }
    for (int i = 0; i < S; i++) xout[i] = (i * 3 + 1) % n_in;
    const std::vector<float> Xe = rand_vec((size_t)n_in * C), Ye = rand_vec((size_t)n_in * C);
    const std::vector<float> vc = rand_vec((size_t)N * half), vd = rand_vec((size_t)N * half), temp = rand_vec(Hkv);
    std::vector<float> cosv((size_t)n_pos * hr), sinv((size_t)n_pos * hr);
    for (size_t k = 0; k < cosv.size(); k++) cosv[k] = std::cos(0.1f * k), sinv[k] = std::sin(0.1f * k);
    std::vector<float> kept = rand_vec((size_t)n_slots * slot_stride), state = rand_vec((size_t)n_slots * P * C + 3);
    std::vector<KV> kc((size_t)n_cache * Ck), vcache((size_t)n_cache * Ck);
    for (auto &x : kc) x = (KV)3;
    for (auto &x : vcache) x = (KV)5;
    /* the reference */
    std::vector<float> qpre((size_t)N * Cq), kpre((size_t)N * Ck), want_q((size_t)N * Cq), khat((size_t)N * Ck);
    const float scale = std::sqrt((float)dh), eps = 1.1920928955078125e-07f;
    GK_LAUNCH(qk_mean_ref_kernel, dim3(N), dim3(64), 0, nullptr, qpre.data(), kpre.data(), Xe.data(), Ye.data(),
              xrow.data(), Hq, Hkv, dh);
    GK_LAUNCH(norm_rope_ref_kernel, dim3(N), dim3(Hq * GPU_WARP), 0, nullptr, want_q.data(), qpre.data(), nullptr,
              cosv.data(), sinv.data(), pos.data(), Hq, dh, hr, scale, eps);
    GK_LAUNCH(norm_rope_ref_kernel, dim3(N), dim3(Hkv * GPU_WARP), 0, nullptr, khat.data(), kpre.data(), temp.data(),
              cosv.data(), sinv.data(), pos.data(), Hkv, dh, hr, scale, eps);
    std::vector<KV> want_k = kc, want_v = vcache;
    std::vector<float> want_kept = kept, want_state = state;
    for (int r = 0; r < N; r++) {
        const int i = row_seq[r];
        for (int c = 0; c < Ck; c++) {
            float v;
            if (c < half)
                v = vc[(size_t)r * half + c];
            else
                v = r == first[i] ? kept[slot[i] * slot_stride + c - half] : vd[(size_t)(r - 1) * half + c - half];
            kv_store(&want_k[(size_t)kv_row[r] * Ck + c], khat[(size_t)r * Ck + c]);
            kv_store(&want_v[(size_t)kv_row[r] * Ck + c], v);
        }
    }
    for (int i = 0; i < S; i++) {
        for (int j = 0; j < half; j++) want_kept[slot[i] * slot_stride + j] = vd[(size_t)last[i] * half + j];
        const int src = uniform ? i * TE + n : xout[i];
        std::memcpy(&want_state[(size_t)slot[i] * P * C], &Xe[(size_t)src * C], (size_t)P * C * sizeof(float));
    }
    /* the one launch */
    std::vector<float> q((size_t)N * Cq, 12345.0f);
    GkCcaDecode d = {};
    d.Xe = Xe.data(), d.Ye = Ye.data(), d.TE = TE, d.P = P, d.vc = vc.data(), d.vd = vd.data();
    d.vd_prev = kept.data(), d.slot_stride = slot_stride, d.temp = temp.data(), d.scale = scale, d.eps = eps;
    d.query = q.data(), d.k_cache = kc.data(), d.v_cache = vcache.data(), d.kv_bf16 = sizeof(KV) == 2;
    d.N = N, d.Hq = Hq, d.Hkv = Hkv, d.dh = dh, d.rd = rd;
    if (uniform) {
        d.n = n, d.cosv = cosv.data() + (size_t)p0 * hr, d.sinv = sinv.data() + (size_t)p0 * hr, d.kv_seq = kv_seq;
        d.kv_p0 = p0;
        d.state = GkRowCopy{state.data(), (long)P * C, nullptr, Xe.data() + (size_t)n * C, (long)TE * C, nullptr,
                            (long)P * C, S};
    } else {
        d.xrow = xrow.data(), d.row_seq = row_seq.data(), d.seq_first = first.data(), d.seq_last = last.data();
        d.seq_slot = slot.data(), d.cosv = cosv.data(), d.sinv = sinv.data(), d.pos = pos.data();
        d.kv_row = kv_row.data();
        d.state = GkRowCopy{state.data(), (long)P * C, nullptr, Xe.data(), C, nullptr, (long)P * C, S};
    }
    std::vector<int32_t> state_dst(slot), state_src(xout); /* the ragged form's copy goes through both index lists */
    if (!uniform) d.state.dst_idx = state_dst.data(), d.state.src_idx = state_src.data();
    gk_cca_decode_rows(nullptr, &d);
    const bool ok = !std::memcmp(q.data(), want_q.data(), q.size() * 4) &&
                    !std::memcmp(kc.data(), want_k.data(), kc.size() * sizeof(KV)) &&
                    !std::memcmp(vcache.data(), want_v.data(), vcache.size() * sizeof(KV)) &&
                    !std::memcmp(kept.data(), want_kept.data(), kept.size() * 4) &&
                    !std::memcmp(state.data(), want_state.data(), state.size() * 4);
    char what[200];
    std::snprintf(what, sizeof what,
                  "cca_decode_rows %s (%s): %d sequences, %d rows, Hq %d Hkv %d dh %d rd %d: query, k and v appended, "
                  "kept vd, convolution state",
                  label, uniform ? "same-length" : "ragged", S, N, Hq, Hkv, dh, rd);
    report(ok, what);
}

/* gk_cca_conv_decode: Y at the new rows P.. of B blocks of T rows against the CPU's formula (cca_conv_forward: the
 * depthwise rows b0 + taps in order, positions before the block skipped; then b1 + the group's dh·k1 products) in
 * double; every other row of Y left as it was. */
static void conv_decode_case(int B, int T, int P, int C, int dh, int k0, int k1) {
    const std::vector<float> X = rand_vec((size_t)B * T * C), w0 = rand_vec((size_t)C * k0), b0 = rand_vec(C);
    const std::vector<float> w1 = rand_vec((size_t)C * dh * k1), b1 = rand_vec(C);
    std::vector<float> Y((size_t)B * T * C, 12345.0f);
    const int rc = gk_cca_conv_decode(nullptr, Y.data(), X.data(), w0.data(), b0.data(), w1.data(), b1.data(), B, T, P,
                                      C, dh, k0, k1);
    double worst = 0;
    bool untouched = true;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++) {
                const float got = Y[((size_t)b * T + t) * C + c];
                if (t < P) {
                    untouched = untouched && got == 12345.0f;
                    continue;
                }
                const int g0 = c / dh * dh;
                double y = b1[c], mag = std::fabs(b1[c]);
                for (int kidx = 0; kidx < dh; kidx++)
                    for (int d = 0; d < k1; d++) {
                        const int tau = t + d - (k1 - 1), ch = g0 + kidx;
                        double m = b0[ch];
                        for (int j = 0; j < k0; j++) {
                            const int x = tau - (k0 - 1) + j;
                            if (x >= 0) m += (double)w0[(size_t)ch * k0 + j] * X[((size_t)b * T + x) * C + ch];
                        }
                        const double p = (double)w1[((size_t)c * dh + kidx) * k1 + d] * m;
                        y += p, mag += std::fabs(p);
                    }
                worst = std::fmax(worst, std::fabs(got - y) / (mag + 1e-30));
            }
    char what[200];
    std::snprintf(what, sizeof what, "cca_conv_decode B %d T %d P %d C %d dh %d k %d/%d: new rows vs double %.2e, the "
                  "cached rows untouched", B, T, P, C, dh, k0, k1, worst);
    report(rc == 0 && untouched && worst < 1e-6, what);
}

int main() {
    emu_rng() = 0x726f7773ull;
    copy2_case<float>("fp32", 9, 4);
    copy2_case<uint16_t>("bf16", 9, 4);
    copy2_case<float>("fp32", 0, 3);
    copy2_case<uint16_t>("bf16", 6, 0);
    copy2_case<float>("fp32", 9, 4, true);
    copy2_case<uint16_t>("bf16", 7, 2, true);
    cca_rows_case<float>("fp32", {1}, {0}, 1, 4, 2, 16, 8, false);
    cca_rows_case<uint16_t>("bf16", {1, 3, 1, 4}, {5, 0, 3, 2}, 7, 4, 2, 16, 16, false);
    cca_rows_case<float>("fp32", {6}, {2}, 3, 3, 1, 40, 24, false);
    cca_rows_case<float>("fp32", {3, 3, 3}, {0, 1, 2}, 3, 4, 2, 16, 8, true);
    cca_rows_case<uint16_t>("bf16", {1, 1}, {0, 1}, 2, 2, 2, 8, 8, true);
    conv_decode_case(1, 3, 2, 12, 4, 2, 2);
    conv_decode_case(3, 5, 2, 20, 10, 2, 2);   /* three new rows a block */
    conv_decode_case(2, 6, 4, 16, 8, 3, 3);
    conv_decode_case(2, 1, 0, 6, 3, 1, 1);     /* no taps before: no cached rows */
    conv_decode_case(1, 3, 2, 640, 128, 2, 2); /* ZAYA1's head size, five groups */
    conv_decode_case(2, 5, 3, 24, 8, 1, 4);
    {
        std::vector<float> Y(64, 7.0f), X(64), w(64);
        report(gk_cca_conv_decode(nullptr, Y.data(), X.data(), w.data(), w.data(), w.data(), w.data(), 1, 6, 5, 8, 4,
                                  1, 5) == -1 &&
                   Y == std::vector<float>(64, 7.0f),
               "cca_conv_decode refused: k1 5; nothing written");
    }
    std::printf("gpu-emu: %d passed, %d failed\n", emu_passed(), emu_failed());
    return emu_failed() != 0;
}

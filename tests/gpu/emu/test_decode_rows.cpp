/* src/gpu/gpu_decode_kernels.cu's row moves run on the CPU (cuda_emu.h), against plain loops:
 * - gk_copy_rows_idx2 (two copies in one launch, as a decoding step appends k̂ and v, or gathers the convolution
 *   state with the new rows): one copy through both index lists (scattered by a permutation, gathered with
 *   repeats), the other strided without any, rows of different lengths; every written element equal to its source
 *   (bf16 destinations: rounded as zy_f32_to_bf16), every other element untouched; either copy empty;
 * - gk_decode_delayed_value (CCA's values with each sequence's kept vd), against the three steps it replaces (the
 *   delayed value, the first rows' kept vd, the last rows' vd kept): a ragged batch's sequences of one and of several
 *   rows in slots out of order, the slots no sequence uses untouched; and the same-length cache's (no descriptors:
 *   every sequence n rows, sequence i in slot i).
 * Prints "gpu-emu: N passed, N failed". */
#define ZAYA_GPU_EMU 1
#include "gpu_decode_kernels.cu"
#include "emu_check.h"

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

/* Copy a: n_a rows of len_a through dst_idx (a permutation of a larger destination) and src_idx (with repeats);
 * copy b: n_b rows of len_b, strided, no index; the two land in disjoint halves of one destination. */
template <class T> static void copy2_case(const char *type, int n_a, int n_b) {
    const long len_a = 29, sst_a = len_a + 3, len_b = 11, dst_b_stride = len_b + 5, src_b_stride = len_b + 2;
    const int rows_a = n_a + 4, src_rows_a = 7; /* a few rows no index names */
    const long size_a = rows_a * len_a, size = size_a + (long)(n_b > 0 ? n_b : 1) * dst_b_stride;
    const std::vector<float> src_a = rand_vec((size_t)src_rows_a * sst_a),
                             src_b = rand_vec((size_t)(n_b + 1) * src_b_stride);
    std::vector<int32_t> dst_idx(n_a > 0 ? n_a : 1), src_idx(n_a > 0 ? n_a : 1);
    for (int k = 0; k < n_a; k++) /* 7 is prime to rows_a (10, 13): distinct destinations */
        dst_idx[k] = (k * 7 + 3) % rows_a, src_idx[k] = (k * 3) % src_rows_a;
    std::vector<T> dst((size_t)size);
    std::memset(dst.data(), 0x7f, dst.size() * sizeof(T));
    const std::vector<T> before = dst;
    const GkRowCopy a = {dst.data(), len_a, dst_idx.data(), src_a.data(), sst_a, src_idx.data(), len_a, n_a},
                    b = {dst.data() + size_a, dst_b_stride, nullptr, src_b.data(), src_b_stride, nullptr, len_b, n_b};
    if constexpr (sizeof(T) == 4) gk_copy_rows_idx2(nullptr, a, b);
    else gk_copy_rows_idx2_bf16(nullptr, a, b);
    std::vector<int> written((size_t)size, 0);
    long bad = 0;
    for (int k = 0; k < n_a; k++)
        for (long i = 0; i < len_a; i++) {
            const long d = dst_idx[k] * len_a + i;
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
    std::snprintf(what, sizeof what, "copy_rows_idx2 %s: %d indexed rows + %d strided rows, %ld elements wrong", type,
                  n_a, n_b, bad);
    report(bad == 0, what);
}

/* Sequences of lens[i] consecutive rows, sequence i in slot slots[i] of a kept-vd array of n_slots; uniform: all
 * lens equal and slots 0.. in order, passed without descriptors (the same-length cache's form). */
static void delayed_value_case(const std::vector<int> &lens, const std::vector<int> &slots, int n_slots,
                               bool uniform = false) {
    const int half = 37, S = (int)lens.size();
    const long slot_stride = half + 3;
    std::vector<int32_t> row_seq, first(S), last(S), slot(slots.begin(), slots.end());
    for (int i = 0; i < S; i++) {
        first[i] = (int)row_seq.size();
        for (int t = 0; t < lens[i]; t++) row_seq.push_back(i);
        last[i] = (int)row_seq.size() - 1;
    }
    const int N = (int)row_seq.size();
    const std::vector<float> vc = rand_vec((size_t)N * half), vd = rand_vec((size_t)N * half);
    std::vector<float> kept = rand_vec((size_t)n_slots * slot_stride), value((size_t)N * 2 * half, 12345.0f);
    /* the reference: the three steps the kernel replaces */
    std::vector<float> want_value((size_t)N * 2 * half), want_kept = kept;
    for (int r = 0; r < N; r++)
        for (int j = 0; j < half; j++) {
            want_value[(size_t)r * 2 * half + j] = vc[(size_t)r * half + j];
            want_value[(size_t)r * 2 * half + half + j] = r > 0 ? vd[(size_t)(r - 1) * half + j] : 0.0f;
        }
    for (int i = 0; i < S; i++)
        for (int j = 0; j < half; j++)
            want_value[(size_t)first[i] * 2 * half + half + j] = kept[slot[i] * slot_stride + j];
    for (int i = 0; i < S; i++)
        for (int j = 0; j < half; j++) want_kept[slot[i] * slot_stride + j] = vd[(size_t)last[i] * half + j];
    if (uniform)
        gk_decode_delayed_value(nullptr, value.data(), vc.data(), vd.data(), kept.data(), slot_stride, nullptr,
                                nullptr, nullptr, nullptr, lens[0], N, half);
    else
        gk_decode_delayed_value(nullptr, value.data(), vc.data(), vd.data(), kept.data(), slot_stride, row_seq.data(),
                                first.data(), last.data(), slot.data(), 0, N, half);
    const bool ok = std::memcmp(value.data(), want_value.data(), value.size() * sizeof(float)) == 0 &&
                    std::memcmp(kept.data(), want_kept.data(), kept.size() * sizeof(float)) == 0;
    char what[160];
    std::snprintf(what, sizeof what, "decode_delayed_value (%s): %d sequences, %d rows, %d slots: values and kept vd",
                  uniform ? "same-length" : "ragged", S, N, n_slots);
    report(ok, what);
}

int main() {
    emu_rng() = 0x726f7773ull;
    copy2_case<float>("fp32", 9, 4);
    copy2_case<uint16_t>("bf16", 9, 4);
    copy2_case<float>("fp32", 0, 3);
    copy2_case<uint16_t>("bf16", 6, 0);
    delayed_value_case({1}, {0}, 1);
    delayed_value_case({1, 3, 1, 4}, {5, 0, 3, 2}, 7);
    delayed_value_case({6}, {2}, 3);
    delayed_value_case({3, 3, 3}, {0, 1, 2}, 3, true);
    delayed_value_case({1, 1}, {0, 1}, 2, true);
    std::printf("gpu-emu: %d passed, %d failed\n", emu_passed(), emu_failed());
    return emu_failed() != 0;
}

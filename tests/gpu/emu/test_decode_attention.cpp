/* src/gpu/gpu_decode_kernels.cu run on the CPU (cuda_emu.h): cached decoding's attention with the KV cache in bf16
 * (--kv-dtype bf16) against the fp32 cache, for the same-length cache and the block pool, with and without a sliding
 * window, 1 and 2 query heads a kv head.
 * - the appends (gk_copy_rows_idx2_bf16: k̂ and v in one launch) round every value as zy_f32_to_bf16: bit for bit;
 * - the bf16 kernels equal the fp32 kernels run on the same values rounded to bf16, bit for bit (one arithmetic, the
 *   loads widen exactly), and a double-precision reference on those values within 1e-5 (relative L2, fp32 sums);
 * - against the unrounded fp32 cache, within 1e-2 and not equal. Why 1e-2: each k̂ / v value rounds with a relative
 *   error of at most 2^-9 (bf16 keeps 8 significant bits, nearest). v's error moves the output, a convex combination
 *   of v rows, by at most 2^-9 ≈ 2e-3 of its size; k̂'s moves each score by at most scale·Σ|q_i k_i|·2^-9, about
 *   (1/8)·64·(1/4)·2^-9 ≈ 4e-3 here (q and k̂ uniform in [-1, 1), dh 64), so the softmax weights by at most ≈ 8e-3
 *   relative. The sum, ≈ 1e-2, bounds the relative L2 error; typical errors are a few times smaller.
 * Each case runs twice: with the key pieces' scratch (GkAttnPieces: contexts past 32 keys cut into pieces attended by
 * separate blocks and combined by the last one, which must leave its count zero) and without it (one block walks them
 * all); both against the reference; and blocks running at once sharing a (row, head)'s pieces (as the persistent
 * layer's blocks do) giving the launches' bits. Contexts of 1-16 keys (one piece) and 41-601 (2-10 pieces, windows across pieces,
 * head dims 64, 128 and 256: the kernels' two register forms).
 * Prints "gpu-emu: N passed, N failed". */
#define ZAYA_GPU_EMU 1
#include "gpu_decode_kernels.cu"

#include <algorithm>
#include <cstring>
#include <vector>

#include "attention_ref.h"

/* zy_f32_to_bf16 (src/util/util.h), the CPU's rounding the appends must match. */
static uint16_t ref_bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static float widen(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

static bool same_bits(const std::vector<float> &a, const std::vector<float> &b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
static double rel_l2(const std::vector<float> &a, const std::vector<float> &b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); i++) num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), den += (double)b[i] * b[i];
    return std::sqrt(num / (den > 0 ? den : 1));
}

/* The key pieces' scratch for `rows` rows of Hq heads (its counts zeroed, as the decoding scratch's), or none. */
struct Pieces {
    std::vector<float> partial;
    std::vector<unsigned> count;
    bool on;
    Pieces(bool on_, int rows, int Hq, int dh)
        : partial(on_ ? (size_t)rows * Hq * GK_ATTN_PIECES * (dh + 2) : 0, NAN), count(on_ ? (size_t)rows * Hq : 0, 0),
          on(on_) {}
    GkAttnPieces arg() { return on ? GkAttnPieces{partial.data(), count.data()} : GkAttnPieces{nullptr, nullptr}; }
    bool counts_zero() const { return std::all_of(count.begin(), count.end(), [](unsigned c) { return c == 0; }); }
};

/* The three checks of the header on one result: bf16 kernel out16, fp32 kernel on the rounded cache out_r, fp32
 * kernel on the fp32 cache out32, the double reference on the rounded values ref. */
static void check_results(const char *tag, const std::vector<float> &out16, const std::vector<float> &out_r,
                          const std::vector<float> &out32, const std::vector<double> &ref) {
    char what[256];
    std::snprintf(what, sizeof what, "%s: bf16 cache = fp32 kernel on the rounded values, bit for bit", tag);
    report(same_bits(out16, out_r), what);
    const double er = rel_err(out16.data(), ref.data(), out16.size());
    std::snprintf(what, sizeof what, "%s: vs double reference on the rounded values %.2e (tol 1e-5)", tag, er);
    report(er <= 1e-5, what);
    const double e32 = rel_l2(out16, out32);
    std::snprintf(what, sizeof what, "%s: vs the fp32 cache %.2e (tol 1e-2, and > 0)", tag, e32);
    report(e32 <= 1e-2 && e32 > 0, what);
}

/* The same-length cache [B, max_len, Hkv·dh]: n new queries per sequence at p0.. over keys 0..p0+n-1. */
static void contiguous_case(int B, int n, int p0, int Hq, int Hkv, int dh, int window, bool pieces) {
    const int T = p0 + n, max_len = T + 3, Cq = Hq * dh, Ck = Hkv * dh;
    const std::vector<float> Qall = rand_vec((size_t)B * T * Cq, 1), K = rand_vec((size_t)B * T * Ck, 1),
                             V = rand_vec((size_t)B * T * Ck, 1);
    /* the caches: fp32 as it is, and the bf16 one written by the append kernel, row by row of each sequence */
    std::vector<float> K32((size_t)B * max_len * Ck, 0), V32(K32.size(), 0), Kr(K32.size(), 0), Vr(K32.size(), 0);
    std::vector<uint16_t> K16(K32.size(), 0x7fc1), V16(K32.size(), 0x7fc1); /* NaN poison past the rows written */
    gk_copy_rows(nullptr, K32.data(), (long)max_len * Ck, K.data(), (long)T * Ck, (long)T * Ck, B);
    gk_copy_rows(nullptr, V32.data(), (long)max_len * Ck, V.data(), (long)T * Ck, (long)T * Ck, B);
    const long seq = (long)T * Ck; /* each sequence's rows as one row of the copy, as gpu_decode.c appends them */
    gk_copy_rows_idx2_bf16(nullptr, GkRowCopy{K16.data(), (long)max_len * Ck, nullptr, K.data(), seq, nullptr, seq, B},
                           GkRowCopy{V16.data(), (long)max_len * Ck, nullptr, V.data(), seq, nullptr, seq, B});
    size_t bad = 0;
    for (int b = 0; b < B; b++)
        for (size_t i = 0; i < (size_t)T * Ck; i++) {
            const size_t c = (size_t)b * max_len * Ck + i, s = (size_t)b * T * Ck + i;
            bad += K16[c] != ref_bf16(K[s]) || V16[c] != ref_bf16(V[s]);
        }
    char tag[128], what[200];
    std::snprintf(tag, sizeof tag, "cache B%d n%d p0 %d Hq%d Hkv%d dh%d window %d, %s", B, n, p0, Hq, Hkv, dh, window,
                  pieces ? "key pieces" : "one block a row");
    std::snprintf(what, sizeof what, "%s: the bf16 append rounds as zy_f32_to_bf16 (%zu differ)", tag, bad);
    report(bad == 0, what);
    for (size_t i = 0; i < K32.size(); i++) Kr[i] = widen(K16[i]), Vr[i] = widen(V16[i]);
    /* the new queries: the last n rows of each sequence */
    std::vector<float> Q((size_t)B * n * Cq);
    for (int b = 0; b < B; b++)
        std::memcpy(&Q[(size_t)b * n * Cq], &Qall[((size_t)b * T + p0) * Cq], (size_t)n * Cq * sizeof(float));
    std::vector<float> out16(Q.size(), NAN), out_r(Q.size(), NAN), out32(Q.size(), NAN);
    Pieces sp(pieces, B * n, Hq, dh);
    gk_decode_attention_bf16(nullptr, out16.data(), Q.data(), K16.data(), V16.data(), B, n, p0, max_len, Hq, Hkv, dh,
                             window, sp.arg());
    gk_decode_attention(nullptr, out_r.data(), Q.data(), Kr.data(), Vr.data(), B, n, p0, max_len, Hq, Hkv, dh, window,
                        sp.arg());
    gk_decode_attention(nullptr, out32.data(), Q.data(), K32.data(), V32.data(), B, n, p0, max_len, Hq, Hkv, dh, window,
                        sp.arg());
    if (pieces) { /* without the scratch there is no count to check */
        std::snprintf(what, sizeof what, "%s: the piece counts left zero", tag);
        report(sp.counts_zero(), what);
    }
    /* the reference: full causal attention over the rounded values, its last n rows per sequence */
    std::vector<float> Kt((size_t)B * T * Ck), Vt(Kt.size());
    for (size_t i = 0; i < Kt.size(); i++) Kt[i] = widen(ref_bf16(K[i])), Vt[i] = widen(ref_bf16(V[i]));
    const AttnRef full = attention_reference(Qall, Kt, Vt, std::vector<float>(Qall.size(), 0), B, T, Hq, Hkv, dh,
                                             window > 0 && window < T ? window : 0);
    std::vector<double> ref(Q.size());
    for (int b = 0; b < B; b++)
        std::copy_n(&full.O[((size_t)b * T + p0) * Cq], (size_t)n * Cq, &ref[(size_t)b * n * Cq]);
    check_results(tag, out16, out_r, out32, ref);
}

/* A block pool of n_blocks·bt rows: sequences of lengths len[i] in blocks handed out in a shuffled order, the step's
 * rows the last n[i] positions of each (appended through the index copy, as pool_append_attend does). */
static void paged_case(int Hq, int Hkv, int dh, int bt, int window, bool long_seqs, bool pieces) {
    constexpr int S = 3;
    const int short_lens[S] = {9, 14, 1}, long_lens[S] = {150, 37, 1}, news[S] = {2, 3, 1}, Cq = Hq * dh, Ck = Hkv * dh;
    const int *lens = long_seqs ? long_lens : short_lens;
    int max_blocks = 0, n_blocks = 0;
    for (int i = 0; i < S; i++) max_blocks = std::max(max_blocks, (lens[i] + bt - 1) / bt), n_blocks += (lens[i] + bt - 1) / bt;
    n_blocks += 2; /* two never handed out */
    std::vector<int32_t> table((size_t)S * max_blocks, -1), row_seq, row_pos, phys;
    std::vector<int32_t> order(n_blocks);
    int step = 7;
    while (std::__gcd(step, n_blocks) != 1) step += 2;
    for (int i = 0; i < n_blocks; i++) order[i] = (i * step + 3) % n_blocks; /* step prime to n_blocks: a permutation */
    int next = 0;
    for (int i = 0; i < S; i++)
        for (int k = 0; k < (lens[i] + bt - 1) / bt; k++) table[(size_t)i * max_blocks + k] = order[next++];
    /* every position of every sequence is a row to append; the last news[i] of each are the step's query rows */
    std::vector<int32_t> q_seq, q_pos;
    for (int i = 0; i < S; i++)
        for (int p = 0; p < lens[i]; p++) {
            row_seq.push_back(i), row_pos.push_back(p);
            phys.push_back(table[(size_t)i * max_blocks + p / bt] * bt + p % bt);
            if (p >= lens[i] - news[i]) q_seq.push_back(i), q_pos.push_back(p);
        }
    const int rows = (int)row_seq.size(), N = (int)q_seq.size();
    const std::vector<float> K = rand_vec((size_t)rows * Ck, 1), V = rand_vec((size_t)rows * Ck, 1),
                             Q = rand_vec((size_t)N * Cq, 1);
    const size_t pool = (size_t)n_blocks * bt * Ck;
    std::vector<float> K32(pool, 0), V32(pool, 0), Kr(pool, 0), Vr(pool, 0);
    std::vector<uint16_t> K16(pool, 0x7fc1), V16(pool, 0x7fc1);
    gk_copy_rows_idx(nullptr, K32.data(), Ck, phys.data(), K.data(), Ck, nullptr, Ck, rows);
    gk_copy_rows_idx(nullptr, V32.data(), Ck, phys.data(), V.data(), Ck, nullptr, Ck, rows);
    gk_copy_rows_idx2_bf16(nullptr, GkRowCopy{K16.data(), Ck, phys.data(), K.data(), Ck, nullptr, Ck, rows},
                           GkRowCopy{V16.data(), Ck, phys.data(), V.data(), Ck, nullptr, Ck, rows});
    size_t bad = 0;
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < Ck; i++) {
            const size_t c = (size_t)phys[r] * Ck + i, s = (size_t)r * Ck + i;
            bad += K16[c] != ref_bf16(K[s]) || V16[c] != ref_bf16(V[s]);
        }
    char tag[128], what[200];
    std::snprintf(tag, sizeof tag, "pool bt %d Hq%d Hkv%d dh%d window %d, lengths %d %d %d, %s", bt, Hq, Hkv, dh, window,
                  lens[0], lens[1], lens[2], pieces ? "key pieces" : "one block a row");
    std::snprintf(what, sizeof what, "%s: the bf16 pool append rounds as zy_f32_to_bf16 (%zu differ)", tag, bad);
    report(bad == 0, what);
    for (size_t i = 0; i < pool; i++) Kr[i] = widen(K16[i]), Vr[i] = widen(V16[i]);
    std::vector<float> out16(Q.size(), NAN), out_r(Q.size(), NAN), out32(Q.size(), NAN);
    Pieces sp(pieces, N, Hq, dh);
    gk_paged_decode_attention_bf16(nullptr, out16.data(), Q.data(), K16.data(), V16.data(), q_seq.data(),
                                   q_pos.data(), table.data(), max_blocks, bt, N, Hq, Hkv, dh, window, sp.arg());
    gk_paged_decode_attention(nullptr, out_r.data(), Q.data(), Kr.data(), Vr.data(), q_seq.data(), q_pos.data(),
                              table.data(), max_blocks, bt, N, Hq, Hkv, dh, window, sp.arg());
    gk_paged_decode_attention(nullptr, out32.data(), Q.data(), K32.data(), V32.data(), q_seq.data(), q_pos.data(),
                              table.data(), max_blocks, bt, N, Hq, Hkv, dh, window, sp.arg());
    if (pieces) { /* without the scratch there is no count to check */
        std::snprintf(what, sizeof what, "%s: the piece counts left zero", tag);
        report(sp.counts_zero(), what);
    }
    /* the reference, one query row at a time over its sequence's rounded keys (in position order) */
    std::vector<double> ref(Q.size());
    const double sc = 1.0 / std::sqrt((double)dh);
    for (int r = 0; r < N; r++)
        for (int h = 0; h < Hq; h++) {
            const int j = h / (Hq / Hkv), last = q_pos[r], first = window > 0 ? std::max(0, last - window + 1) : 0;
            std::vector<double> p;
            double m = -INFINITY, sum = 0;
            for (int s = first; s <= last; s++) {
                const size_t at = ((size_t)table[(size_t)q_seq[r] * max_blocks + s / bt] * bt + s % bt) * Ck + j * dh;
                double dot = 0;
                for (int d = 0; d < dh; d++) dot += (double)Q[(size_t)r * Cq + h * dh + d] * Kr[at + d];
                p.push_back(dot * sc), m = std::max(m, dot * sc);
            }
            for (double &x : p) sum += (x = std::exp(x - m));
            for (int d = 0; d < dh; d++) {
                double o = 0;
                for (int s = first; s <= last; s++) {
                    const size_t at = ((size_t)table[(size_t)q_seq[r] * max_blocks + s / bt] * bt + s % bt) * Ck + j * dh;
                    o += p[s - first] * Vr[at + d];
                }
                ref[(size_t)r * Cq + h * dh + d] = o / sum;
            }
        }
    check_results(tag, out16, out_r, out32, ref);
}

/* Blocks sharing a (row, head)'s key pieces while running at once, as the persistent layer's do: Z virtual blocks a
 * (row, head) strided over the grid (cooperative: all blocks' threads together, so the sanitizer sees a combine that
 * read another block's piece without the count's release and acquire as a race). */
template <class KV>
__global__ void shared_pieces_kernel(float *O, const float *Q, const KV *Kc, const KV *Vc, int B, int p0, int max_len,
                                     int Hq, int Hkv, int dh, float scale, GkAttnPieces ap, int Z) {
    GK_DYNAMIC_SMEM_T(float, sm);
    for (int vb = blockIdx.x; vb < B * Hq * Z; vb += gridDim.x)
        attend_contiguous(O, Q, Kc, Vc, 0, vb / B % Hq, vb % B, 1, p0, max_len, Hq, Hkv, dh, scale, 0, ap,
                          vb / (B * Hq), Z, sm);
}
/* One new row a sequence at p0 (bf16 cache): the launches' result, and the blocks' at once sharing the pieces, Z a
 * (row, head) over `blocks` blocks: the same bits, and the counts left zero. */
static void shared_pieces_case(int B, int p0, int Hq, int Hkv, int dh, int Z, int blocks) {
    const int max_len = p0 + 1, Cq = Hq * dh, Ck = Hkv * dh;
    std::vector<uint16_t> K16((size_t)B * max_len * Ck), V16(K16.size());
    for (size_t i = 0; i < K16.size(); i++) K16[i] = ref_bf16(urand()), V16[i] = ref_bf16(urand());
    const std::vector<float> Q = rand_vec((size_t)B * Cq, 1);
    std::vector<float> want(Q.size(), NAN), got(Q.size(), NAN);
    Pieces a(true, B, Hq, dh), b(true, B, Hq, dh);
    gk_decode_attention_bf16(nullptr, want.data(), Q.data(), K16.data(), V16.data(), B, 1, p0, max_len, Hq, Hkv, dh, 0,
                             a.arg());
    GK_LAUNCH_COOPERATIVE(shared_pieces_kernel<uint16_t>, dim3(blocks), dim3(DA_THREADS), DA_SMEM_FLOATS * sizeof(float),
                          nullptr, got.data(), Q.data(), K16.data(), V16.data(), B, p0, max_len, Hq, Hkv, dh,
                          (float)(1.0 / std::sqrt((double)dh)), b.arg(), Z);
    char what[200];
    std::snprintf(what, sizeof what, "B%d p0 %d Hq%d dh%d: %d keys' pieces shared %d a (row, head) over %d blocks at once: "
                  "the launches' bits, the counts left zero", B, p0, Hq, dh, p0 + 1, Z, blocks);
    report(same_bits(want, got) && b.counts_zero(), what);
}

int main(int argc, char **argv) {
    const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0; /* the sanitizer run */
    shared_pieces_case(1, 100, 2, 1, 64, 4, 3); /* four pieces; blocks taking 2-3 virtual blocks each */
    if (!quick) shared_pieces_case(2, 200, 2, 2, 128, 3, 5);
    for (bool pieces : {true, false}) {
        contiguous_case(2, 3, 13, 4, 2, 64, 0, pieces);  /* 2 query heads a kv head, plain causal */
        paged_case(2, 2, 64, 4, 0, false, pieces);       /* one query head a kv head, blocks of 4 */
        contiguous_case(1, 2, 40, 2, 1, 64, 0, pieces);  /* 41-42 keys: two pieces */
        if (quick) continue;
        contiguous_case(1, 1, 40, 2, 1, 64, 7, pieces);  /* one new token, a sliding window */
        contiguous_case(2, 2, 5, 2, 2, 128, 0, pieces);  /* dh 128: several values a lane */
        paged_case(4, 2, 64, 5, 6, false, pieces);       /* a window across block edges */
        contiguous_case(1, 1, 600, 2, 1, 64, 0, pieces);    /* 601 keys: ten pieces of 64 */
        contiguous_case(1, 1, 300, 2, 1, 128, 100, pieces); /* a window of 100 keys: four pieces, not at 0 */
        contiguous_case(1, 1, 70, 1, 1, 256, 0, pieces);    /* dh 256: the wider form, three pieces */
        paged_case(2, 2, 64, 16, 0, true, pieces);          /* 150 keys in blocks of 16: five pieces; 37: two */
        paged_case(2, 1, 128, 8, 45, true, pieces);         /* windows of 45 across pieces and blocks */
    }
    std::printf("gpu-emu: %d passed, %d failed (decode attention, bf16 KV cache, warp of %d lanes)\n", emu_passed(),
                emu_failed(), GPU_WARP);
    return emu_failed() != 0;
}

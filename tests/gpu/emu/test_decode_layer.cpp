/* gk_decode_plan + gk_decode_layers (src/gpu/gpu_decode_layer.cu) run on the CPU (cuda_emu.h): a decoding step's layers
 * as one persistent kernel, every block at once with a grid barrier between its phases and between layers, against the
 * eleven launches a layer it replaces (gpu_skinny.cu's products and router tail, gpu_decode_kernels.cu's convolution,
 * CCA rows and attention, and the merge normed, as gpu_norms.cu runs gpu_norms.cuh's row body), bit for bit in every
 * buffer the layers write: Xe, Ye, the queries, k̂ and v in each layer's cache, its convolution state and kept values,
 * attention, the projections, the merges and norms, the router's state, logits, probabilities, choice and gate, the
 * experts' activations and output. 1, 2 and 3 rows (the 1-, 2- and 4-row forms) over a bf16 cache, the same-length
 * cache (its layers planned at position 0 and moved to the step's by the launch) and a block pool with its tables out
 * of order, contexts of one piece of keys and of three (GkAttnPieces: a (row, head)'s pieces shared over two blocks
 * here, a block each in the launches), grids of 1, 2, 3, 7 and 9 blocks (phases with more virtual blocks than real
 * ones, and fewer); one layer alone (its merge run, or taken from a layer before and left to one after) and chains of
 * 2 and 3 layers in one launch (the first embedding the step's tokens and norming them, each other one taking the one
 * before's last merge; at 1-2 rows every block merging every row, at
 * 3 a block a row and a barrier), the last one's logits' product run after its merge (against gk_skinny_mm's launch)
 * or not (the logits left as they were); the refusals (5 rows, an fp32 cache, a convolution of several new rows, a
 * same-length layer not planned at position 0, a broken chain, layers of different rows, a head or an embedding
 * misplaced) launching nothing; and the
 * barrier's own probe (gk_grid_sync_probe). --quick: the first case only (the sanitizer's run: a phase reading what
 * another block writes without the grid barrier between is a reported race). Prints "gpu-emu: N passed, N failed". */
#define ZAYA_GPU_EMU 1
#include "gpu_decode_layer.cu"
#include "gpu_decode_kernels.cu"
#include "gpu_skinny.cu"
#include "emu_check.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "util/util.h"

/* gpu_norms.cu's merge_rmsnorm_forward_kernel (that file launches its backward kernels with <<<>>>, which the
 * emulator does not take): the same row body, a block a row */
template <int W>
__global__ void merge_ref_kernel(float *out, float *y, float *rstd, const float *h, const float *res, const float *hs,
                                 const float *hb, const float *rs, const float *rb, const float *w, int dim, float eps) {
    __shared__ double red[32];
    norms::merge_rmsnorm_row<W>(out, y, rstd, h, res, hs, hb, rs, rb, w, blockIdx.x, dim, eps, blockDim.x, red);
}
static void merge_ref(const GkMergeNorm &m, int N, int D, float eps) {
    GK_LAUNCH(merge_ref_kernel<4>, dim3(N), dim3(norms::norm_threads(D, 4)), 0, nullptr, m.out, m.y, m.rstd, m.h, m.res,
              m.hs, m.hb, m.rs, m.rb, m.w, D, eps);
}
/* gk_embed_forward then gk_rmsnorm_forward, as gpu_norms.cu runs their bodies (a warp a row: the embedding's values
 * are elementwise; a block a row for the norm) */
__global__ void embed_ref_kernel(GkEmbedNorm e, int dim) {
    const long at = (long)e.tokens[blockIdx.x] * dim;
    const float *row = e.emb16 ? nullptr : e.emb + at;
    const uint16_t *row16 = e.emb16 ? e.emb16 + at : nullptr;
    for (int i = threadIdx.x * 4; i < dim; i += GPU_WARP * 4)
        store_pack<4>(e.x + (long)blockIdx.x * dim + i, norms::embed_value<4>(row, row16, e.bias, e.scale, i));
}
__global__ void rmsnorm_ref_kernel(GkEmbedNorm e, int dim, float eps) {
    __shared__ double red[32];
    norms::rmsnorm_row<4>(e.u, e.rstd, e.x + (long)blockIdx.x * dim, e.norm_w, blockIdx.x, dim, eps, blockDim.x, red);
}
static void embed_norm_ref(const GkEmbedNorm &e, int N, int D, float eps) {
    GK_LAUNCH(embed_ref_kernel, dim3(N), dim3(GPU_WARP), 0, nullptr, e, D);
    GK_LAUNCH(rmsnorm_ref_kernel, dim3(N), dim3(norms::norm_threads(D, 4)), 0, nullptr, e, D, eps);
}

/* Every buffer of one layer's step, allocated 16-byte aligned in one vector each. */
struct Buf {
    std::vector<std::vector<float>> store;
    float *f(size_t n, float scale = 1.0f) {
        store.emplace_back(n + 4);
        float *p = store.back().data();
        while ((uintptr_t)p % 16) p++;
        for (size_t i = 0; i < n; i++) p[i] = scale * urand();
        return p;
    }
    uint16_t *bf(size_t n, float scale) {
        uint16_t *p = reinterpret_cast<uint16_t *>(f(n / 2 + 1));
        for (size_t i = 0; i < n; i++) p[i] = zy_f32_to_bf16(scale * urand());
        return p;
    }
    int32_t *i(size_t n) { return reinterpret_cast<int32_t *>(f(n)); }
};

struct Shape {
    int N, paged, blocks;
    int layers = 1;   /* layers in the launch, a chain */
    int chained = 0;  /* the first takes a merge left by a layer before the launch, the last leaves its own (and
                         prefetches a next layer's projections); else the first embeds the step's tokens and norms
                         them */
    int p0 = 3;       /* the new row's position: 3, one piece of keys; 70, three pieces (GK_ATTN_PIECE_KEYS 32) */
    int head = 1;     /* the logits' product run after the last merge (where the last layer runs its merge) */
    int emb16 = 0;    /* the embedding's rows from a bf16 copy (bf16 inference) */
};

constexpr int D = 64, Hq = 4, Hkv = 2, dh = 16, Cq = Hq * dh, Ck = Hkv * dh, C = Cq + Ck, half = Ck / 2;
constexpr int k0 = 2, k1 = 2, P = (k0 - 1) + (k1 - 1), TE = P + 1, R = 16, E = 4, classes = E + 1, I = 32, rd = 8;
constexpr int MAX_LEN = 72, BT = 8, MAX_BLOCKS = MAX_LEN / BT, VOCAB = 40;

/* A step's layers over fresh random state: their descriptors, and the sizes of everything they write (for the
 * checks). The rows' buffers are shared by the layers, as the decoding scratch's; weights, caches and states are each
 * layer's own. */
struct Stack {
    Buf b;
    std::vector<GkDecodeLayer> d;
    std::vector<std::pair<std::string, std::pair<void *, size_t>>> outputs; /* name, (pointer, bytes) */
    void out(const std::string &name, void *p, size_t bytes) { outputs.push_back({name, {p, bytes}}); }
};

static void build(Stack &S, const Shape &s, uint64_t seed) {
    emu_rng() = seed;
    Buf &b = S.b;
    const int N = s.N, slots = N + 2, kv_rows = s.paged ? slots * MAX_LEN : N * MAX_LEN;
    const size_t kv_floats = ((size_t)kv_rows * Ck + 1) / 2; /* bf16 */
    float *x = b.f((size_t)N * D), *u = b.f((size_t)N * D), *x_mid = b.f((size_t)N * D), *rstd = b.f(N);
    float *Xe = b.f((size_t)N * TE * C), *Ye = b.f((size_t)N * TE * C), *vc = b.f((size_t)N * half);
    float *vd = b.f((size_t)N * half), *query = b.f((size_t)N * Cq), *attn_out = b.f((size_t)N * Cq);
    float *proj = b.f((size_t)N * D), *z[2] = {b.f((size_t)N * R), b.f((size_t)N * R)}, *r_prev0 = b.f((size_t)N * R);
    float *logits = b.f((size_t)N * classes), *probs = b.f((size_t)N * classes), *gate = b.f(N);
    float *act = b.f((size_t)N * I), *moe_out = b.f((size_t)N * D), *head_out = b.f((size_t)N * VOCAB);
    const uint16_t *lm_head = b.bf((size_t)VOCAB * D, 0.3f);
    const float *emb = b.f((size_t)VOCAB * D), *emb_bias = b.f(D, 0.1f), *emb_scale = b.f(D, 0.5f);
    const uint16_t *emb16 = s.emb16 ? b.bf((size_t)VOCAB * D, 0.3f) : nullptr;
    int32_t *tokens = b.i(N);
    for (int r = 0; r < N; r++) tokens[r] = (7 * r + 3) % VOCAB;
    int32_t *choice = b.i(N);
    const long slot_state = (long)P * C + half; /* the pool's per-slot state: P conv rows, then the kept vd */
    float *cosv = b.f((size_t)MAX_LEN * rd / 2), *sinv = b.f((size_t)MAX_LEN * rd / 2);
    /* the same-length cache: sequence r in slot r (conv state P·C floats a sequence, vd_prev half); the pool: sequence
     * r in slot slots − 1 − r, its table a permutation of blocks, positions p0 for every row */
    int32_t *seq_slot = b.i(N), *xrow = b.i(N), *xin = b.i(N), *xout = b.i(N), *pos = b.i(N), *row_seq = b.i(N);
    int32_t *first = b.i(N), *last = b.i(N), *kv_row = b.i(N), *table = b.i((size_t)N * MAX_BLOCKS);
    const int P0 = s.p0;
    for (int r = 0; r < N; r++) {
        seq_slot[r] = slots - 1 - r, xrow[r] = r * TE + P, xin[r] = r * TE, xout[r] = r * TE + 1, pos[r] = P0;
        row_seq[r] = r, first[r] = r, last[r] = r;
        for (int k = 0; k < MAX_BLOCKS; k++) /* 2 is prime to MAX_BLOCKS (9): a permutation */
            table[r * MAX_BLOCKS + k] = seq_slot[r] * MAX_BLOCKS + (k * 2 + 1) % MAX_BLOCKS;
        kv_row[r] = table[r * MAX_BLOCKS + P0 / BT] * BT + P0 % BT;
    }
    const size_t slots_heads = (size_t)N * Hq;
    const GkAttnPieces pieces = {b.f(slots_heads * GK_ATTN_PIECES * (dh + 2)), reinterpret_cast<unsigned *>(b.i(slots_heads))};
    std::memset(pieces.count, 0, slots_heads * sizeof(unsigned)); /* as the decoding scratch's */
    unsigned *barrier = reinterpret_cast<unsigned *>(b.i(1));
    *barrier = 0; /* as the decoding scratch's, zeroed when created */
    auto vec = [&](float base) {
        float *p = b.f(D, 0.2f);
        for (int i = 0; i < D; i++) p[i] += base;
        return p;
    };
    /* the norms' vectors of layer l: its merges' scales and its input norm (layer n's: the final norm) */
    struct Vecs {
        const float *input_norm, *hs, *hb, *rs, *rb, *post_norm, *mhs, *mhb, *mrs, *mrb;
    };
    std::vector<Vecs> v(s.layers + 1);
    for (Vecs &w : v) w = {vec(1), vec(1), vec(0), vec(1), vec(0), vec(1), vec(1), vec(0), vec(1), vec(0)};
    const Vecs before = {vec(1), vec(1), vec(0), vec(1), vec(0), vec(1), vec(1), vec(0), vec(1), vec(0)};
    std::vector<const uint16_t *> proj_w(4 * (s.layers + 1));
    for (int l = 0; l <= s.layers; l++) {
        const int n[4] = {Cq, Ck, half, half};
        for (int j = 0; j < 4; j++) proj_w[4 * l + j] = b.bf((size_t)n[j] * D, 0.2f);
    }

    S.d.assign(s.layers, GkDecodeLayer{});
    S.outputs.clear();
    for (int l = 0; l < s.layers; l++) {
        GkDecodeLayer &d = S.d[l];
        float *k_cache = b.f(kv_floats), *v_cache = b.f(kv_floats);
        uint16_t *k16 = reinterpret_cast<uint16_t *>(k_cache), *v16 = reinterpret_cast<uint16_t *>(v_cache);
        for (size_t i = 0; i < (size_t)kv_rows * Ck; i++) k16[i] = zy_f32_to_bf16(urand()), v16[i] = zy_f32_to_bf16(urand());
        float *state = s.paged ? b.f((size_t)slots * slot_state) : nullptr, *temp = b.f(Hkv);
        for (int h = 0; h < Hkv; h++) temp[h] = 1.0f + 0.25f * temp[h];
        float *conv_state = s.paged ? state : b.f((size_t)N * P * C), *vd_prev = s.paged ? state + (long)P * C : b.f((size_t)N * half);
        const long conv_stride = s.paged ? slot_state : (long)P * C;
        const uint16_t *wo = b.bf((size_t)D * Cq, 0.2f), *wrd = b.bf((size_t)R * D, 0.3f);
        const uint16_t *w1 = b.bf((size_t)R * R, 0.3f), *w2 = b.bf((size_t)R * R, 0.3f), *wout = b.bf((size_t)classes * R, 0.5f);
        const uint16_t *wgu = b.bf((size_t)E * 2 * I * D, 0.2f), *wdown = b.bf((size_t)E * D * I, 0.2f);
        float *cw0 = b.f((size_t)C * k0, 0.5f), *cb0 = b.f(C, 0.1f), *cw1 = b.f((size_t)C * dh * k1, 0.3f), *cb1 = b.f(C, 0.1f);
        float *rdb = b.f(R, 0.1f), *gamma = b.f(R, 0.5f), *rnorm = b.f(R, 0.2f), *b1 = b.f(R, 0.1f), *b2 = b.f(R, 0.1f);
        float *bal = b.f(classes, 0.1f);
        for (int i = 0; i < R; i++) rnorm[i] += 1.0f;
        const Vecs &V = v[l], &next = v[l + 1], &prev = l ? v[l - 1] : before;

        d.u = u;
        d.proj[0] = GkSkinnyOut{proj_w[4 * l], Xe + (long)P * C, Cq, TE * C, nullptr};
        d.proj[1] = GkSkinnyOut{proj_w[4 * l + 1], Xe + (long)P * C + Cq, Ck, TE * C, nullptr};
        d.proj[2] = GkSkinnyOut{proj_w[4 * l + 2], vc, half, half, nullptr};
        d.proj[3] = GkSkinnyOut{proj_w[4 * l + 3], vd, half, half, nullptr};
        d.xe_state = GkRowCopy{Xe, s.paged ? (long)C : (long)TE * C, s.paged ? xin : nullptr, conv_state, conv_stride,
                               s.paged ? seq_slot : nullptr, (long)P * C, N};
        d.Ye = Ye, d.Xe = Xe, d.conv_w0 = cw0, d.conv_b0 = cb0, d.conv_w1 = cw1, d.conv_b1 = cb1;
        d.TE = TE, d.P = P, d.C = C, d.k0 = k0, d.k1 = k1;
        GkCcaDecode &rw = d.rows;
        rw = GkCcaDecode{};
        rw.Xe = Xe, rw.Ye = Ye, rw.TE = TE, rw.P = P, rw.vc = vc, rw.vd = vd, rw.vd_prev = vd_prev;
        rw.slot_stride = s.paged ? slot_state : half, rw.temp = temp, rw.scale = 4.0f, rw.eps = 1.1920928955078125e-07f;
        rw.query = query, rw.k_cache = k_cache, rw.v_cache = v_cache, rw.kv_bf16 = 1;
        rw.N = N, rw.n = 1, rw.Hq = Hq, rw.Hkv = Hkv, rw.dh = dh, rw.rd = rd;
        if (s.paged) {
            rw.xrow = xrow, rw.row_seq = row_seq, rw.seq_first = first, rw.seq_last = last, rw.seq_slot = seq_slot;
            rw.cosv = cosv, rw.sinv = sinv, rw.pos = pos, rw.kv_row = kv_row;
            rw.state = GkRowCopy{conv_state, slot_state, seq_slot, Xe, C, xout, (long)P * C, N};
        } else {
            rw.cosv = cosv + (long)P0 * (rd / 2), rw.sinv = sinv + (long)P0 * (rd / 2);
            rw.kv_seq = MAX_LEN, rw.kv_p0 = P0;
            rw.state = GkRowCopy{conv_state, (long)P * C, nullptr, Xe + C, (long)TE * C, nullptr, (long)P * C, N};
        }
        d.attn_out = attn_out, d.query = query, d.k_cache = k_cache, d.v_cache = v_cache;
        if (s.paged) d.att_seq = row_seq, d.att_pos = pos, d.att_table = table;
        d.max_blocks = MAX_BLOCKS, d.block_tokens = BT, d.p0 = P0, d.max_len = MAX_LEN, d.window = 0;
        d.att_scale = 0.25f;
        d.att_pieces = pieces;
        d.o_proj = GkSkinnyOut{wo, proj, D, D, nullptr};
        d.merge_attn = GkMergeNorm{x_mid, u, rstd, proj, x, V.hs, V.hb, V.rs, V.rb, V.post_norm};
        d.router_down = GkSkinnyOut{wrd, z[l & 1], R, R, nullptr};
        d.tail = GkRouterTail{z[l & 1], rdb, l ? z[(l - 1) & 1] : r_prev0, gamma, rnorm, 1e-5f, w1, w2, wout, b1, b2, bal,
                              logits, probs, gate, choice, N, R, classes};
        d.act = act, d.moe_out = moe_out, d.w_gate_up = wgu, d.w_down = wdown, d.choice = choice, d.gate = gate;
        /* layer l takes the merge of the one before it (layer 0: of a layer before the launch, where chained) */
        if (l > 0 || s.chained)
            d.merge_in = GkMergeNorm{x, u, rstd, moe_out, x_mid, prev.mhs, prev.mhb, prev.mrs, prev.mrb, V.input_norm};
        else
            d.embed_in = GkEmbedNorm{emb, emb_bias, emb_scale, V.input_norm, tokens, x, u, rstd, emb16};
        if (l + 1 == s.layers && !s.chained) {
            d.merge_mlp = GkMergeNorm{x, u, rstd, moe_out, x_mid, V.mhs, V.mhb, V.mrs, V.mrb, next.input_norm};
            d.head = GkSkinnyOut{lm_head, head_out, VOCAB, VOCAB, nullptr};
        }
        if (l + 1 < s.layers || s.chained)
            for (int j = 0; j < 4; j++) /* the next layer's projections, only prefetched here */
                d.next_proj[j] = GkSkinnyOut{proj_w[4 * (l + 1) + j], nullptr, d.proj[j].n, 0, nullptr};
        d.N = N, d.D = D, d.Hq = Hq, d.Hkv = Hkv, d.dh = dh, d.I = I, d.E = E, d.eps = 1e-5f;
        d.barrier = barrier;
        d.blocks = s.blocks;
        const std::string at = " (layer " + std::to_string(l) + ")";
        S.out("k cache" + at, k_cache, kv_floats * 4), S.out("v cache" + at, v_cache, kv_floats * 4);
        S.out("conv state" + at, conv_state, s.paged ? (size_t)slots * slot_state * 4 : (size_t)N * P * C * 4);
        S.out("vd_prev" + at, vd_prev, s.paged ? 0 : (size_t)N * half * 4);
    }
    S.out("x", x, N * D * 4), S.out("u", u, N * D * 4), S.out("x_mid", x_mid, N * D * 4), S.out("rstd", rstd, N * 4);
    S.out("Xe", Xe, (size_t)N * TE * C * 4), S.out("Ye (new rows)", Ye, 0), S.out("vc", vc, N * half * 4);
    S.out("vd", vd, N * half * 4), S.out("query", query, N * Cq * 4), S.out("attn_out", attn_out, N * Cq * 4);
    S.out("proj", proj, N * D * 4), S.out("z", z[0], N * R * 4), S.out("z'", z[1], N * R * 4);
    S.out("logits", logits, N * classes * 4), S.out("probs", probs, N * classes * 4), S.out("gate", gate, N * 4);
    S.out("choice", choice, N * 4), S.out("act", act, N * I * 4), S.out("moe_out", moe_out, N * D * 4);
    S.out("logits (head)", head_out, (size_t)N * VOCAB * 4);
    S.out("attention's pieces", pieces.partial, s.p0 > GK_ATTN_PIECE_KEYS ? slots_heads * GK_ATTN_PIECES * (dh + 2) * 4 : 0);
    S.out("attention's piece counts", pieces.count, slots_heads * 4);
}

/* The launches gk_decode_layers replaces, in the decoding step's order, for one layer. */
static void launches(const GkDecodeLayer &d) {
    const int N = d.N;
    if (d.embed_in.emb) embed_norm_ref(d.embed_in, N, D, d.eps);
    if (d.merge_in.out) merge_ref(d.merge_in, N, D, d.eps);
    gk_skinny_mm(nullptr, d.u, D, N, D, d.proj, 4);
    gk_copy_rows_idx2(nullptr, d.xe_state, GkRowCopy{});
    gk_cca_conv_decode(nullptr, d.Ye, d.Xe, d.conv_w0, d.conv_b0, d.conv_w1, d.conv_b1, N, TE, P, C, dh, k0, k1);
    gk_cca_decode_rows(nullptr, &d.rows);
    if (d.att_table)
        gk_paged_decode_attention_bf16(nullptr, d.attn_out, d.query, (const uint16_t *)d.k_cache,
                                       (const uint16_t *)d.v_cache, d.att_seq, d.att_pos, d.att_table, MAX_BLOCKS, BT, N,
                                       Hq, Hkv, dh, 0, d.att_pieces);
    else
        gk_decode_attention_bf16(nullptr, d.attn_out, d.query, (const uint16_t *)d.k_cache, (const uint16_t *)d.v_cache,
                                 N, 1, d.p0, MAX_LEN, Hq, Hkv, dh, 0, d.att_pieces);
    gk_skinny_mm(nullptr, d.attn_out, Cq, N, Cq, &d.o_proj, 1);
    merge_ref(d.merge_attn, N, D, d.eps);
    gk_skinny_mm(nullptr, d.u, D, N, D, &d.router_down, 1);
    gk_skinny_router_tail(nullptr, &d.tail);
    gk_skinny_expert_swiglu(nullptr, d.act, d.u, d.choice, d.w_gate_up, N, D, I, E);
    gk_skinny_expert_down(nullptr, d.moe_out, d.act, d.choice, d.gate, d.w_down, N, I, D, E);
    if (d.merge_mlp.out) merge_ref(d.merge_mlp, N, D, d.eps);
}

/* The same-length cache's layers as the decoding step plans them: at position 0 (the launch moves them to p0). */
static std::vector<GkDecodeLayer> at_position_0(std::vector<GkDecodeLayer> d) {
    for (GkDecodeLayer &a : d)
        if (!a.att_table) {
            const long rows = (long)a.p0 * (a.rows.rd / 2);
            a.rows.cosv -= rows, a.rows.sinv -= rows, a.p0 = 0, a.rows.kv_p0 = 0;
        }
    return d;
}

/* gk_decode_plan then gk_decode_layers (-1: a refusal, nothing launched). */
static int run_planned(const std::vector<GkDecodeLayer> &d, int p0, int head) {
    const int n = (int)d.size();
    std::vector<unsigned long long> plans((n * gk_decode_plan_bytes() + 7) / 8);
    if (gk_decode_plan(d.data(), n, plans.data())) return -1;
    return gk_decode_layers(nullptr, &d[0], plans.data(), n, p0, head);
}

static int &routed_rows() { /* rows the cases sent through an expert (not the skip expert) */
    static int n = 0;
    return n;
}

static void layer_case(const Shape &s) {
    Stack want, got;
    const uint64_t seed = 1000 + s.N * 10 + s.paged + s.layers * 100;
    build(want, s, seed);
    build(got, s, seed); /* the same inputs */
    for (const GkDecodeLayer &d : want.d) launches(d);
    const GkDecodeLayer &last = want.d.back();
    if (s.head && last.head.w) gk_skinny_mm(nullptr, last.u, D, s.N, D, &last.head, 1); /* the logits' launch */
    const int rc = run_planned(at_position_0(got.d), s.paged ? 0 : s.p0, s.head);
    char what[160];
    std::snprintf(what, sizeof what, "%d layer(s), %d row(s), %s, %d block(s)%s, position %d%s%s", s.layers, s.N,
                  s.paged ? "pool" : "same-length", s.blocks, s.chained ? ", chained" : "", s.p0,
                  s.chained ? "" : s.head ? ", logits" : ", no logits", s.emb16 ? ", bf16 embedding" : "");
    report(rc == 0, (std::string(what) + ": launched").c_str());
    std::string bad;
    for (size_t i = 0; i < want.outputs.size(); i++) {
        const auto &w = want.outputs[i].second, &g = got.outputs[i].second;
        size_t bytes = w.second;
        if (want.outputs[i].first == "Ye (new rows)") { /* only the new rows are written */
            for (int r = 0; r < s.N; r++)
                if (std::memcmp((float *)w.first + ((size_t)r * TE + P) * C, (float *)g.first + ((size_t)r * TE + P) * C,
                                C * 4))
                    bad += " Ye";
            continue;
        }
        if (bytes && std::memcmp(w.first, g.first, bytes)) bad += " " + want.outputs[i].first;
    }
    for (int r = 0; r < s.N; r++) routed_rows() += want.d.back().choice[r] >= 0 && want.d.back().choice[r] < E;
    report(bad.empty(), (std::string(what) + ": every buffer bit for bit" + (bad.empty() ? "" : " — differ:" + bad)).c_str());
    unsigned counts = 0;
    for (int i = 0; i < s.N * Hq; i++) counts |= want.d[0].att_pieces.count[i] | got.d[0].att_pieces.count[i];
    report(counts == 0, (std::string(what) + ": attention's piece counts left zero").c_str());
}

int main(int argc, char **argv) {
    std::setvbuf(stdout, nullptr, _IONBF, 0);
    const bool quick = argc > 1 && !std::strcmp(argv[1], "--quick"); /* one case: the sanitizer's run */
    /* {rows, pool, blocks, layers, chained, position} */
    layer_case({2, 1, 3, 2, 0}); /* two layers, the barrier between them, the last merge and the logits */
    if (!quick) {
        layer_case({1, 1, 9, 1, 1, 70}); /* three pieces of keys: two blocks a (row, head) here, one a piece launched */
        layer_case({2, 0, 3, 1, 0, 70});
        layer_case({1, 0, 3, 1, 1});
        layer_case({3, 0, 3, 1, 0, 3, 0});
        layer_case({2, 0, 2, 1, 0, 3, 0});
        layer_case({1, 1, 3, 1, 0});
        layer_case({3, 1, 1, 1, 0});
        layer_case({3, 1, 7, 1, 1});
        layer_case({2, 1, 1, 1, 1});
        layer_case({1, 0, 9, 2, 0, 70}); /* a whole step: the embedding first, the last merge and the logits */
        layer_case({2, 1, 3, 2, 0, 3, 1, 1}); /* the same from the embedding's bf16 copy (bf16 inference) */
        layer_case({3, 1, 3, 2, 0});
        layer_case({2, 0, 3, 3, 1});
    }
    {
        Stack S;
        build(S, {2, 0, 3, 2, 0}, 7);
        std::vector<GkDecodeLayer> d = at_position_0(S.d);
        std::vector<unsigned long long> plans((2 * gk_decode_plan_bytes() + 7) / 8);
        auto refused = [&](std::vector<GkDecodeLayer> x) { return gk_decode_plan(x.data(), (int)x.size(), plans.data()) == -1; };
        std::vector<GkDecodeLayer> x = d;
        x[0].N = 5;
        report(refused(x), "5 rows refused");
        x = d, x[1].rows.kv_bf16 = 0;
        report(refused(x), "an fp32 cache refused");
        x = d, x[0].TE = P + 2;
        report(refused(x), "two new rows a sequence refused");
        report(refused(S.d), "a same-length layer not planned at position 0 refused");
        x = d, x[1].merge_in.out = nullptr;
        report(refused(x), "a chain whose second layer does not take the first's merge refused");
        x = d, x[0].merge_mlp = x[1].merge_mlp;
        report(refused(x), "a chain whose first layer runs its own last merge refused");
        x = d, x[1].N = 1;
        report(refused(x), "layers of different rows in one launch refused");
        x = d, x[0].head = x[1].head;
        report(refused(x), "a head before the last layer refused");
        x = d, x[1].merge_mlp.out = nullptr;
        report(refused(x), "a head without the last merge refused");
        x = d, x[1].embed_in = x[0].embed_in;
        report(refused(x), "an embedding past the first layer refused");
        x = d, x[0].merge_in = x[1].merge_in;
        report(refused(x), "an embedding and a merge before the same layer refused");
        report(!refused(d), "the same chain planned as the decoding step plans it");
        report(gk_decode_layers(nullptr, &d[0], plans.data(), 0, 0, 1) == -1 &&
                   gk_decode_layers(nullptr, &d[0], plans.data(), 2, -1, 1) == -1,
               "no layers, or a negative position, refused");
    }
    report(routed_rows() > 0, "some rows went through an expert's products");
    /* ZAYA1-8B's shapes (configs/zaya1-8b.json; the buffers the small ones', nothing runs): a step of 1, 2 and 4 rows
     * is planned, and its shared memory fits an H100's / H200's 227 KB a block */
    for (int rows : {1, 2, 4}) {
        Stack S;
        build(S, {std::min(rows, 3), 0, 3, 2, 0}, 9);
        std::vector<GkDecodeLayer> d = at_position_0(S.d);
        for (GkDecodeLayer &a : d) {
            a.N = a.rows.N = a.tail.rows = a.xe_state.n = a.rows.state.n = rows;
            a.D = 2048, a.Hq = a.rows.Hq = 8, a.Hkv = a.rows.Hkv = 2, a.dh = a.rows.dh = 128, a.rows.rd = 64;
            a.I = 2048, a.E = 16, a.C = (8 + 2) * 128, a.tail.R = 256, a.tail.classes = 17;
            a.proj[0].n = 1024, a.proj[1].n = 256, a.proj[2].n = a.proj[3].n = 128, a.o_proj.n = 2048;
            a.router_down.n = 256;
            if (a.head.w) a.head.n = a.head.ldy = 262272;
        }
        std::vector<unsigned long long> plans((2 * gk_decode_plan_bytes() + 7) / 8);
        size_t ys_at, plan_at, smem = 0;
        smem = rows == 1 ? layer_smem_bytes<1>(d[0], &ys_at, &plan_at)
             : rows == 2 ? layer_smem_bytes<2>(d[0], &ys_at, &plan_at)
                         : layer_smem_bytes<4>(d[0], &ys_at, &plan_at);
        char what[120];
        std::snprintf(what, sizeof what, "ZAYA1-8B's shapes at %d row(s) planned, %zu bytes of shared memory a block",
                      rows, smem);
        report(gk_decode_plan(d.data(), 2, plans.data()) == 0 && smem <= 227 * 1024, what);
    }
    /* the barrier alone: every block sees its neighbour's stamp of each round; from a zeroed word, and from one a
     * launch with an odd number of barriers left (the top bit set: a layer takes 9 with its own last merge) */
    for (unsigned start : {0u, 0x80000000u}) {
        const int blocks = quick ? 4 : 5, reps = quick ? 3 : 10;
        std::vector<unsigned> words(1 + 2 * blocks, 0);
        words[0] = start;
        const int rc = gk_grid_sync_probe(nullptr, words.data(), blocks, reps);
        unsigned stale = 0;
        for (int b = 0; b < blocks; b++) stale += words[1 + blocks + b];
        report(rc == 0 && stale == 0 && words[0] == start && words[1] == (unsigned)reps,
               start ? "grid barrier probe from a flipped word: no stale stamp, the word as it was"
                     : "grid barrier probe: no stale stamp, the barrier's word ready for the next launch");
    }
    std::printf("gpu-emu: %d passed, %d failed\n", emu_passed(), emu_failed());
    return emu_failed() ? 1 : 0;
}

/* gpu_decode_layer: a decoding step's layers as one persistent kernel (gk_decode_layers, gpu_kernels.h). At batch 1 a
 * layer's dozen small kernels cost more in launch gaps than in memory traffic; here one cooperative launch runs them
 * as phases, each block taking the phase's "virtual blocks" in turn (the launch's grid, strided over the real one)
 * with that launch's thread counts and order of sums, then a grid-wide barrier (gk_grid_sync) before the next phase,
 * and the layers one after another the same way. The phases are the launches' own bodies (gpu_skinny.cuh,
 * gpu_decode_ops.cuh, gpu_norms.cuh): the same bits. Each layer's descriptor and its products' arguments (a plan) are
 * written once on the host and read from device memory into shared memory as the layer starts. */
#include <stdint.h>

#include <cstring>

#include "gpu_common.cuh"
#include "gpu_decode_ops.cuh"
#include "gpu_kernels.h"
#include "gpu_norms.cuh"
#include "gpu_skinny.cuh"

namespace {
using namespace skinny;
using namespace decode_ops;

constexpr int LAYER_THREADS = RT_THREADS; /* the widest phase: the router's tail */
constexpr int LAYER_WARPS = LAYER_THREADS / GPU_WARP;
/* Up to this many rows every block computes every row of a merge itself, instead of a block a row and a barrier: a
 * row's merge costs about a load's latency, a barrier about as much (a guess until measured on a GPU). */
constexpr int MERGE_EVERYWHERE_ROWS = 2;

/* A layer's plan: its descriptor and its product phases' arguments, written on the host (gk_decode_plan), copied into
 * the block's shared memory as the layer starts (load_plan). */
struct LayerPlan {
    GkDecodeLayer a;
    SkinnyArgs proj, o_proj, router_down, swiglu, down, next_proj, head;
};

/* The phases' bodies are called, not inlined, where the kernel has several call sites or forms of them: inlined,
 * each of the three row counts' kernels carried its own copies (ten of the plain products' block alone), nvcc took
 * 196 s on this file instead of 134 (three targets, one Zen 5 core) and ptxas spilled more at the kernel's 128
 * registers. A call a virtual block or a row costs next to nothing beside its loads. */
template <int ROWS, int MODE>
__device__ __noinline__ void skinny_block_call(const SkinnyArgs &a, const float *x, int blk, int threads, float *sm,
                                               const SkinnyPre<MODE> pre) {
    skinny_block<ROWS, MODE>(a, x, blk, threads, sm, pre);
}

/* One product phase: the launch's blocks blk = blockIdx.x, + gridDim.x, ..., after `before()` (a grid barrier, a
 * merge), which runs once the block's first weight pieces were loaded (SK_PLAIN: weights are not written while
 * decoding), so they stream in while it waits; the experts' rows depend on the router and load after it.
 * x: a.x, or this block's copy of those rows in shared memory (ldx unchanged). */
template <int ROWS, int MODE, class Before>
__device__ __forceinline__ void products_after(const SkinnyArgs &a, float *sm, Before before, const float *x = nullptr) {
    const int threads = skinny_threads(a.K), blocks = skinny_blocks<MODE>(a.n_units);
    SkinnyPre<MODE> pre = skinny_prefetch<MODE>(a, blockIdx.x, threads); /* nothing past the last block */
    before();
    for (int blk = blockIdx.x; blk < blocks; blk += gridDim.x) {
        if (blk != (int)blockIdx.x) pre = skinny_prefetch<MODE>(a, blk, threads);
        skinny_block_call<ROWS, MODE>(a, x ? x : a.x, blk, threads, sm, pre);
    }
}
/* The same with the grid barrier before it where bar is set. */
template <int ROWS, int MODE>
__device__ __forceinline__ void products(const SkinnyArgs &a, float *sm, unsigned *bar = nullptr,
                                         const float *x = nullptr) {
    products_after<ROWS, MODE>(a, sm, [&] { if (bar) gk_grid_sync(bar); }, x);
}

/* This block's virtual blocks' weight rows of a product phase, asked of the L2 cache (hints: the same bits). */
template <int MODE> __device__ __forceinline__ void products_l2(const SkinnyArgs &a) {
    for (int blk = blockIdx.x; blk < skinny_blocks<MODE>(a.n_units); blk += gridDim.x) skinny_prefetch_l2<MODE>(a, blk);
}

/* What the phases after the projections read and no phase writes, asked of the L2 cache once the projections' own
 * loads are done, so it streams in while the convolution, CCA's rows and attention wait on latency and barriers: the
 * output and router projections' rows, this block's channels of the convolution, the router tail's second and last
 * layers (block 0; its first it loads into registers) and the merges' vectors (the blocks that run merges). */
__device__ __forceinline__ void later_weights_l2(const GkDecodeLayer &a, const SkinnyArgs &o_proj,
                                                 const SkinnyArgs &router_down) {
    products_l2<SK_PLAIN>(o_proj);
    products_l2<SK_PLAIN>(router_down);
    for (long c = (long)blockIdx.x * LAYER_WARPS; c < a.C; c += (long)gridDim.x * LAYER_WARPS) {
        const long n = a.C - c < LAYER_WARPS ? a.C - c : LAYER_WARPS; /* the channels of this block's warps */
        gk_prefetch_l2(a.conv_w1 + c * a.dh * a.k1, n * a.dh * a.k1 * 4);
        gk_prefetch_l2(a.conv_w0 + c * a.k0, n * a.k0 * 4);
    }
    if (blockIdx.x == 0) {
        gk_prefetch_l2(a.tail.w2, (long)a.tail.R * a.tail.R * 2);
        gk_prefetch_l2(a.tail.w_out, (long)a.tail.classes * a.tail.R * 2);
    }
    if ((int)blockIdx.x < a.N || a.N <= MERGE_EVERYWHERE_ROWS)
        for (const GkMergeNorm *m : {&a.merge_attn, &a.merge_mlp})
            if (m->out)
                for (const float *v : {m->hs, m->hb, m->rs, m->rb, m->w}) gk_prefetch_l2(v, (long)a.D * 4);
}

/* Row r of the merge normed; write: its out, y and rstd (else only ys, when given). */
__device__ __noinline__ void norm_row(const GkMergeNorm &m, int r, bool write, int D, float eps, bool vec4,
                                      float *sm, float *ys) {
    double *red = reinterpret_cast<double *>(sm);
    float *out = write ? m.out : nullptr, *y = write ? m.y : nullptr, *rstd = write ? m.rstd : nullptr;
    if (vec4)
        norms::merge_rmsnorm_row<4>(out, y, rstd, m.h, m.res, m.hs, m.hb, m.rs, m.rb, m.w, r, D, eps,
                                    norms::norm_threads(D, 4), red, ys);
    else
        norms::merge_rmsnorm_row<1>(out, y, rstd, m.h, m.res, m.hs, m.hb, m.rs, m.rb, m.w, r, D, eps,
                                    norms::norm_threads(D, 1), red, ys);
}

/* Row r of the embedding and its norm: the row's x into xs (shared: D floats) by the threads of the norm that read
 * them (each reads only what it wrote: no barrier), then RMSNorm from there; write: x's, u's and rstd's row r (else
 * only ys, when given). */
template <int W>
__device__ __forceinline__ void embed_norm_row_w(const GkEmbedNorm &e, int r, bool write, int D, float eps, float *sm,
                                                 float *ys) {
    double *red = reinterpret_cast<double *>(sm);
    float *xs = sm + 64; /* past the sums' 32 doubles */
    const long at = (long)e.tokens[r] * D;
    const float *row = e.emb16 ? nullptr : e.emb + at;
    const uint16_t *row16 = e.emb16 ? e.emb16 + at : nullptr;
    const int threads = norms::norm_threads(D, W), first = (int)threadIdx.x < threads ? (int)threadIdx.x * W : D;
    for (int i = first; i < D; i += threads * W) {
        const Pack<W> v = norms::embed_value<W>(row, row16, e.bias, e.scale, i);
        store_pack<W>(xs + i, v);
        if (write) store_pack<W>(e.x + (long)r * D + i, v);
    }
    norms::rmsnorm_row<W>(write ? e.u : nullptr, write ? e.rstd : nullptr, xs, e.norm_w, r, D, eps, threads, red, ys);
}
__device__ __noinline__ void norm_row(const GkEmbedNorm &e, int r, bool write, int D, float eps, bool vec4,
                                      float *sm, float *ys) {
    if (vec4)
        embed_norm_row_w<4>(e, r, write, D, eps, sm, ys);
    else
        embed_norm_row_w<1>(e, r, write, D, eps, sm, ys);
}

/* Rows of a merge (GkMergeNorm) or of the embedding (GkEmbedNorm) normed, one row a virtual block: a barrier must
 * follow before they are read. */
template <class Norm>
__device__ __forceinline__ void norm_rows(const Norm &m, int N, int D, float eps, bool vec4, float *sm) {
    for (int r = blockIdx.x; r < N; r += gridDim.x) norm_row(m, r, true, D, eps, vec4, sm, nullptr);
}
/* Every row of them normed in this block, the norm's rows into ys (shared: N·D floats) for the block's next phase, no
 * barrier needed; block r % gridDim.x also writes row r's outputs (read after later barriers). */
template <class Norm>
__device__ __forceinline__ void norm_rows_everywhere(const Norm &m, int N, int D, float eps, bool vec4, float *sm,
                                                     float *ys) {
    for (int r = 0; r < N; r++) norm_row(m, r, r % (int)gridDim.x == (int)blockIdx.x, D, eps, vec4, sm, ys);
    __syncthreads(); /* ys, whole, to every thread */
}

/* Rows normed (the embedding's, or a merge's), then a product of them, its first weight pieces loading across the
 * barriers before it: `after`, one first (the rows' inputs were written by other blocks). At up to
 * MERGE_EVERYWHERE_ROWS rows every block norms every row into ys and the product reads them there, no barrier
 * between; else a block a row, a barrier, and the product reads them from memory. */
template <int ROWS, class Norm>
__device__ __forceinline__ void norm_then_products(const GkDecodeLayer &a, const Norm &m, const SkinnyArgs &product,
                                                   bool after, bool vec4, float *sm, float *ys) {
    if (a.N <= MERGE_EVERYWHERE_ROWS) {
        products_after<ROWS, SK_PLAIN>(product, sm, [&] {
            if (after) gk_grid_sync(a.barrier);
            norm_rows_everywhere(m, a.N, a.D, a.eps, vec4, sm, ys);
        }, ys);
    } else {
        products_after<ROWS, SK_PLAIN>(product, sm, [&] {
            if (after) gk_grid_sync(a.barrier);
            norm_rows(m, a.N, a.D, a.eps, vec4, sm);
            gk_grid_sync(a.barrier);
        });
    }
}

/* Layer plan src into the block's copy dst. The same-length cache's layers are planned at position 0: p0 moves them
 * to the step's (the one thing that changes from step to step). */
__device__ __forceinline__ void load_plan(LayerPlan &dst, const LayerPlan *src, int p0) {
    static_assert(sizeof(LayerPlan) % 8 == 0 && alignof(LayerPlan) <= 8, "copied in 8-byte words");
    __syncthreads(); /* the layer before is done reading the copy */
    const unsigned long long *from = reinterpret_cast<const unsigned long long *>(src);
    unsigned long long *to = reinterpret_cast<unsigned long long *>(&dst);
    for (int i = threadIdx.x; i < (int)(sizeof(LayerPlan) / 8); i += blockDim.x) to[i] = from[i];
    __syncthreads();
    if (threadIdx.x == 0 && !dst.a.att_table && p0) {
        GkDecodeLayer &a = dst.a;
        a.p0 += p0, a.rows.kv_p0 += p0;
        a.rows.cosv += (long)p0 * (a.rows.rd / 2), a.rows.sinv += (long)p0 * (a.rows.rd / 2);
    }
    __syncthreads();
}

/* Phases 2-4 of a layer (the convolution, CCA's rows, attention: no row count in them), each ended by a grid barrier
 * but the last, whose barrier is the next phase's. */
template <class KV> __device__ __noinline__ void conv_cca_attention(const GkDecodeLayer &a, float *sm) {
    const int warp = threadIdx.x / GPU_WARP, N = a.N;
    const long gthread = (long)blockIdx.x * blockDim.x + threadIdx.x, gthreads = (long)gridDim.x * blockDim.x;

    /* 2. the convolution at the new rows: a warp a (channel, row) */
    for (long task = (long)blockIdx.x * LAYER_WARPS + warp; task < (long)a.C * N; task += (long)gridDim.x * LAYER_WARPS)
        conv_decode_channel(a.Ye, a.Xe, a.conv_w0, a.conv_b0, a.conv_w1, a.conv_b1, (int)(task % a.C),
                            (int)(task / a.C), a.P, a.TE, a.C, a.dh, a.k0, a.k1, sm + (long)warp * a.k1 * a.dh);
    gk_grid_sync(a.barrier);

    /* 3. CCA's rows: q-k mean, norm + RoPE, k̂ and v into the cache; the state's copy back */
    for (int vb = blockIdx.x; vb < N * a.Hkv; vb += gridDim.x) cca_rows_block<KV>(a.rows, vb % N, vb / N, sm);
    cca_state_copy(a.rows, gthread, gthreads);
    gk_grid_sync(a.barrier);

    /* 4. attention: a virtual block a (row, head, z), z < Z taking the key pieces z, z + Z, ... (Z: the grid's blocks
     * a (row, head), up to the most pieces) */
    {
        const int Z = a.att_pieces.partial ? max(1, min(GK_ATTN_PIECES, (int)gridDim.x / (N * a.Hq))) : 1;
        for (int vb = blockIdx.x; vb < N * a.Hq * Z; vb += gridDim.x) {
            const int r = vb % N, h = vb / N % a.Hq, z = vb / (N * a.Hq);
            if (a.att_table)
                attend_paged(a.attn_out, a.query, (const KV *)a.k_cache, (const KV *)a.v_cache, a.att_seq, a.att_pos,
                             a.att_table, a.max_blocks, a.block_tokens, r, h, a.Hq, a.Hkv, a.dh, a.att_scale, a.window,
                             a.att_pieces, z, Z, sm);
            else
                attend_contiguous(a.attn_out, a.query, (const KV *)a.k_cache, (const KV *)a.v_cache, 0, h, r, 1, a.p0,
                                  a.max_len, a.Hq, a.Hkv, a.dh, a.att_scale, a.window, a.att_pieces, z, Z, sm);
        }
    }
}

/* One layer's phases. after: a layer ran before it in this launch (its last writes need a barrier first); head: its
 * head's product runs after its last merge. */
template <int ROWS, class KV>
__device__ __forceinline__ void layer_phases(const LayerPlan &plan, bool after, bool head, bool vec4, float *sm,
                                             float *ys) {
    const GkDecodeLayer &a = plan.a;
    const long gthread = (long)blockIdx.x * blockDim.x + threadIdx.x, gthreads = (long)gridDim.x * blockDim.x;

    /* 0., 1. the step's embedding and its norm, or the previous layer's merge normed, where it was left here; the
     * projections of u (q | k into Xe's new rows), and the convolution state into Xe */
    if (a.embed_in.emb)
        norm_then_products<ROWS>(a, a.embed_in, plan.proj, false, vec4, sm, ys);
    else if (a.merge_in.out)
        norm_then_products<ROWS>(a, a.merge_in, plan.proj, after, vec4, sm, ys);
    else
        products<ROWS, SK_PLAIN>(plan.proj, sm, after ? a.barrier : nullptr);
    later_weights_l2(a, plan.o_proj, plan.router_down);
    const long state = row_copy_total(a.xe_state);
    copy_rows_range<float>(a.xe_state, GkRowCopy{}, state, state, gthread, gthreads);
    gk_grid_sync(a.barrier);

    conv_cca_attention<KV>(a, sm);

    /* 5. the output projection (its weights loading across the barrier) */
    products<ROWS, SK_PLAIN>(plan.o_proj, sm, a.barrier);
    gk_grid_sync(a.barrier);

    /* 6., 7. the merge normed for the MoE block; the router's down projection (its weights loading across the barrier
     * where there is one) */
    norm_then_products<ROWS>(a, a.merge_attn, plan.router_down, false, vec4, sm, ys);

    /* 8. the router's tail, one block (its first hidden layer's weights loading across the barrier) */
    {
        const RouterTailPre pre = router_tail_prefetch(a.tail);
        gk_grid_sync(a.barrier);
        if (blockIdx.x == 0) router_tail_block<ROWS>(a.tail, sm, pre);
    }
    gk_grid_sync(a.barrier);

    /* 9., 10. the experts: SwiGLU of the chosen expert's gate and up, then down with the gate (its rows asked of the
     * L2 cache first: the router has chosen them, and they stream in during SwiGLU and its barrier) */
    products_l2<SK_DOWN>(plan.down);
    products<ROWS, SK_SWIGLU>(plan.swiglu, sm);
    /* the next layer's projections, to stream during this barrier, the down products and the barrier or launch
     * between: the same grid takes the same virtual blocks there */
    if (plan.next_proj.n_outs) products_l2<SK_PLAIN>(plan.next_proj);
    gk_grid_sync(a.barrier);
    products<ROWS, SK_DOWN>(plan.down, sm);

    /* 11. the merge normed for the next layer, unless left to the next layer or the caller; 12. the logits' product
     * (its weights loading across the barrier where there is one) */
    if (head) {
        norm_then_products<ROWS>(a, a.merge_mlp, plan.head, true, vec4, sm, ys);
    } else if (a.merge_mlp.out) {
        gk_grid_sync(a.barrier);
        norm_rows(a.merge_mlp, a.N, a.D, a.eps, vec4, sm);
    }
}

template <int ROWS, class KV>
__global__ void __launch_bounds__(LAYER_THREADS, 1) decode_layers_kernel(const LayerPlan *plans, int n_layers, int p0,
                                                                         int head, int vec4, int ys_at, int plan_at) {
    GK_DYNAMIC_SMEM_T(float, sm);
    LayerPlan &plan = *reinterpret_cast<LayerPlan *>(sm + plan_at);
    for (int l = 0; l < n_layers; l++) {
        load_plan(plan, plans + l, p0);
        layer_phases<ROWS, KV>(plan, l > 0, head && l + 1 == n_layers && plan.a.head.w, vec4 != 0, sm, sm + ys_at);
    }
}

/* gk_grid_sync_probe: each round every block's thread 0 stamps its flag, passes the barrier, checks its neighbour's
 * stamp (counting a stale one as an error: a barrier that let a block through early, or a read served from a stale
 * cache line, since the block read that flag the round before), and passes the barrier again before the next stamp. */
__global__ void __launch_bounds__(LAYER_THREADS, 1) grid_sync_probe_kernel(unsigned *bar, unsigned *flags,
                                                                           unsigned *errors, int reps) {
    for (int r = 1; r <= reps; r++) {
        if (threadIdx.x == 0) flags[blockIdx.x] = (unsigned)r;
        gk_grid_sync(bar);
        if (threadIdx.x == 0 && flags[(blockIdx.x + 1) % gridDim.x] != (unsigned)r) errors[blockIdx.x]++;
        gk_grid_sync(bar);
    }
}

inline bool layer_al16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* Shared floats the widest phase needs (its scratch), rounded to 16 bytes. */
template <int ROWS> size_t layer_smem_floats(const GkDecodeLayer &a) {
    size_t f = (size_t)skinny_smem_floats<ROWS, SK_PLAIN>();
    const size_t more[] = {(size_t)skinny_smem_floats<ROWS, SK_SWIGLU>(), (size_t)LAYER_WARPS * a.k1 * a.dh,
                           (size_t)cca_rows_smem_floats(a.rows), (size_t)DA_SMEM_FLOATS,
                           (size_t)router_tail_smem_floats<ROWS>(), 64 /* 32 doubles */,
                           a.embed_in.emb ? 64 + (size_t)a.D : 0 /* the sums, an embedded row */};
    for (size_t m : more) f = m > f ? m : f;
    return (f + 3) / 4 * 4;
}

SkinnyArgs plain_args(const float *x, long ldx, int rows, int K, const GkSkinnyOut *outs, int n_outs) {
    SkinnyArgs a = {};
    a.x = x, a.ldx = ldx, a.rows = rows, a.K = K, a.n_outs = n_outs;
    for (int j = 0; j < n_outs; j++) a.outs[j] = outs[j], a.n_units += outs[j].n;
    return a;
}

/* The plan of layer a: the launches' arguments of its product phases. */
LayerPlan plan_of(const GkDecodeLayer &a) {
    LayerPlan p;
    std::memset(&p, 0, sizeof p); /* the padding too: the same layers, the same bytes */
    p.a = a;
    p.proj = plain_args(a.u, a.D, a.N, a.D, a.proj, 4);
    p.o_proj = plain_args(a.attn_out, (long)a.Hq * a.dh, a.N, a.Hq * a.dh, &a.o_proj, 1);
    p.router_down = plain_args(a.u, a.D, a.N, a.D, &a.router_down, 1);
    SkinnyArgs &sw = p.swiglu, &dn = p.down;
    sw.x = a.u, sw.ldx = a.D, sw.rows = a.N, sw.K = a.D, sw.n_units = a.I;
    sw.choice = a.choice, sw.w = a.w_gate_up, sw.w_stride = 2L * a.I * a.D, sw.E = a.E;
    sw.I = a.I, sw.y = a.act, sw.ldy = a.I;
    dn.x = a.act, dn.ldx = a.I, dn.rows = a.N, dn.K = a.I, dn.n_units = a.D;
    dn.choice = a.choice, dn.gate = a.gate, dn.w = a.w_down, dn.w_stride = (long)a.D * a.I, dn.E = a.E;
    dn.y = a.moe_out, dn.ldy = a.D;
    /* the next layer's projections where given (all four, or none) */
    p.next_proj = plain_args(nullptr, a.D, a.N, a.D, a.next_proj, a.next_proj[0].w ? 4 : 0);
    p.head = plain_args(a.u, a.D, a.N, a.D, &a.head, a.head.w ? 1 : 0);
    return p;
}

/* The norms' vector form (1 where every merge's and the embedding norm's rows and vectors are on 16 bytes); -1: the
 * norms would take different forms as launches. */
int merges_vec4(const GkDecodeLayer &a) {
    const GkMergeNorm &m1 = a.merge_attn;
    const bool vec4 = can_vec4(a.D, {m1.out, m1.y, m1.h, m1.res, m1.hs, m1.hb, m1.rs, m1.rb, m1.w});
    for (const GkMergeNorm *m : {&a.merge_in, &a.merge_mlp})
        if (m->out && vec4 != can_vec4(a.D, {m->out, m->y, m->h, m->res, m->hs, m->hb, m->rs, m->rb, m->w}))
            return -1;
    const GkEmbedNorm &e = a.embed_in;
    /* gk_rmsnorm_forward's test, and the embedding's loads in the same packs */
    if (e.emb && vec4 != can_vec4(a.D, {e.u, e.x, e.norm_w, e.emb16 ? e.bias : e.emb, e.bias, e.scale})) return -1;
    return vec4;
}

/* Whether the phases take layer a's shapes: every product's (skinny_fits), the convolution's (gk_cca_conv_decode's),
 * the rows' and attention's. */
bool layer_fits(const GkDecodeLayer &a) {
    const int Cq = a.Hq * a.dh, Ck = a.Hkv * a.dh;
    if (a.N < 1 || a.N > GK_DECODE_LAYER_ROWS || !a.rows.kv_bf16 || a.D < 8 || a.D % 8 || Cq % 8 || a.I < 8 ||
        a.I % 8 || a.E < 1 || !layer_al16(a.u) || !layer_al16(a.attn_out) || !layer_al16(a.act) || !a.barrier)
        return false;
    for (const GkSkinnyOut &o : {a.proj[0], a.proj[1], a.proj[2], a.proj[3], a.o_proj, a.router_down})
        if (o.n < 1 || !o.y || !layer_al16(o.w)) return false;
    for (const GkSkinnyOut &o : a.next_proj)
        if (a.next_proj[0].w && (o.n < 1 || !o.w)) return false; /* all four, or none */
    if (a.head.w && (a.head.n < 1 || !a.head.y || !layer_al16(a.head.w) || !a.merge_mlp.out)) return false;
    const GkEmbedNorm &e = a.embed_in;
    if (e.emb && (a.merge_in.out || e.u != a.u || !e.bias || !e.scale || !e.norm_w || !e.tokens || !e.x || !e.rstd))
        return false;
    if (!layer_al16(a.w_gate_up) || !layer_al16(a.w_down) || !router_tail_fits(a.tail) || a.tail.rows != a.N)
        return false;
    if (a.P < 0 || a.TE != a.P + 1 || a.C != Cq + Ck || a.dh <= 0 || a.dh > DA_MAX_DH || a.C % a.dh || a.k0 < 1 ||
        a.k1 < 1 || a.k1 > CD_MAX_TAPS || a.Hkv <= 0 || a.Hq % a.Hkv || a.Hq / a.Hkv > 31 ||
        cca_rows_threads(a.rows) > LAYER_THREADS || a.rows.N != a.N)
        return false;
    if (a.att_pieces.partial && (long)a.N * a.Hq > GK_ATTN_PIECE_ROWS_HEADS) return false; /* the launches leave them */
    return merges_vec4(a) >= 0;
}

/* What the launch's shape depends on: the same in every layer of a launch. */
bool same_launch(const GkDecodeLayer &a, const GkDecodeLayer &b) {
    return a.N == b.N && a.D == b.D && a.Hq == b.Hq && a.Hkv == b.Hkv && a.dh == b.dh && a.I == b.I && a.E == b.E &&
           a.k1 == b.k1 && cca_rows_smem_floats(a.rows) == cca_rows_smem_floats(b.rows) && a.barrier == b.barrier &&
           a.blocks == b.blocks && !a.att_table == !b.att_table && merges_vec4(a) == merges_vec4(b);
}

/* The launch's shared memory: the scratch, then (merges everywhere) the block's copy of the normed rows, then the
 * layer's plan; ys_at and plan_at in floats. */
template <int ROWS> size_t layer_smem_bytes(const GkDecodeLayer &a, size_t *ys_at, size_t *plan_at) {
    *ys_at = layer_smem_floats<ROWS>(a);
    *plan_at = *ys_at + (a.N <= MERGE_EVERYWHERE_ROWS ? ((size_t)a.N * a.D + 3) / 4 * 4 : 0);
    return *plan_at * sizeof(float) + sizeof(LayerPlan);
}

template <int ROWS, class KV>
int launch_layers(GkStream s, const GkDecodeLayer &a, const LayerPlan *plans, int n_layers, int p0, int head,
                  bool vec4) {
    size_t ys_at, plan_at;
    const size_t smem = layer_smem_bytes<ROWS>(a, &ys_at, &plan_at);
    void (*kern)(const LayerPlan *, int, int, int, int, int, int) = decode_layers_kernel<ROWS, KV>;
    int blocks = a.blocks;
#ifndef ZAYA_GPU_EMU
    static int fitting[3]; /* blocks that fit at once, per form (found once: the device does not change) */
    int &fit = fitting[ROWS <= 1 ? 0 : ROWS <= 2 ? 1 : 2];
    /* past 48 KB of dynamic shared memory a kernel must ask (each model's widths may need more than the last's) */
    if (smem > 48 * 1024 &&
        gpuFuncSetAttribute((const void *)kern, gpuFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != gpuSuccess)
        return (void)gpuGetLastError(), -1;
    if (!fit) {
        int dev = 0, sms = 0, per_sm = 0;
        if (gpuGetDevice(&dev) != gpuSuccess ||
            gpuDeviceGetAttribute(&sms, gpuDevAttrMultiProcessorCount, dev) != gpuSuccess ||
            gpuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, LAYER_THREADS, smem) != gpuSuccess ||
            per_sm < 1)
            return (void)gpuGetLastError(), -1;
        fit = sms * per_sm;
    }
    if (blocks <= 0 || blocks > fit) blocks = fit;
#else
    if (blocks <= 0) blocks = 4;
#endif
    if (GK_LAUNCH_COOPERATIVE(kern, dim3(blocks), dim3(LAYER_THREADS), smem, s, plans, n_layers, p0, head,
                              (int)vec4, (int)ys_at, (int)plan_at) != gpuSuccess)
        return (void)gpuGetLastError(), -1;
    return 0;
}

} // namespace

extern "C" size_t gk_decode_plan_bytes(void) { return sizeof(LayerPlan); }

extern "C" int gk_decode_plan(const GkDecodeLayer *layers, int n_layers, void *plans) {
    if (n_layers < 1 || !layers || !plans) return -1;
    for (int l = 0; l < n_layers; l++) {
        const GkDecodeLayer &a = layers[l];
        if (!layer_fits(a) || !same_launch(a, layers[0])) return -1;
        if (!a.att_table && (a.p0 || a.rows.kv_p0)) return -1; /* the same-length cache's layers: at position 0 */
        /* a chain: each layer's last merge left to the next, which runs it first */
        if ((l > 0 && (!a.merge_in.out || a.embed_in.emb)) || (l + 1 < n_layers && (a.merge_mlp.out || a.head.w)))
            return -1;
    }
    for (int l = 0; l < n_layers; l++) {
        const LayerPlan p = plan_of(layers[l]);
        std::memcpy(static_cast<unsigned char *>(plans) + (size_t)l * sizeof p, &p, sizeof p);
    }
    return 0;
}

extern "C" int gk_decode_layers(GkStream s, const GkDecodeLayer *first, const void *plans, int n_layers, int p0,
                                int head) {
    if (!first || !plans || n_layers < 1 || p0 < 0 || first->N < 1 || first->N > GK_DECODE_LAYER_ROWS) return -1;
    const int vec4 = merges_vec4(*first);
    if (vec4 < 0) return -1;
    const LayerPlan *lp = static_cast<const LayerPlan *>(plans);
    static_assert(GK_DECODE_LAYER_ROWS == 4, "the forms below");
    if (first->N <= 1) return launch_layers<1, uint16_t>(s, *first, lp, n_layers, p0, head != 0, vec4);
    if (first->N <= 2) return launch_layers<2, uint16_t>(s, *first, lp, n_layers, p0, head != 0, vec4);
    return launch_layers<4, uint16_t>(s, *first, lp, n_layers, p0, head != 0, vec4);
}

extern "C" int gk_grid_sync_probe(GkStream s, unsigned *words, int blocks, int reps) {
    if (blocks < 1 || reps < 0 || !words) return -1;
    if (GK_LAUNCH_COOPERATIVE(grid_sync_probe_kernel, dim3(blocks), dim3(LAYER_THREADS), 0, s, words, words + 1,
                              words + 1 + blocks, reps) != gpuSuccess)
        return (void)gpuGetLastError(), -1;
    return 0;
}

/* attention: fused, tiled causal GQA softmax attention (flash-attention style) for the fp32 model. Same maths and
 * layouts as attention_forward/attention_backward in kernels.inc (the test oracle), but the [T, T] probabilities
 * are never stored: the forward keeps only the per-row log-sum-exp, the backward recomputes the probabilities
 * tile by tile, and key tiles entirely above the diagonal (or before a sliding window) are skipped.
 *
 * Layouts: Q, O, dQ, dO [B*T, Hq*dh] (row = token b*T + t), K, V, dK, dV [B*T, Hkv*dh]; query head h reads kv
 * head h / (Hq/Hkv); scores are scaled by 1/sqrt(dh). LSE [B, Hq, T]. */
#ifndef ZAYA_ATTENTION_H
#define ZAYA_ATTENTION_H

#include <stdint.h>
#include <stddef.h>

/* The forward's key tiles: decoding steps its softmax over the same tiles (decode_attn_softmax_tile). */
#define ZY_ATTN_KEY_TILE 64

/* OP(return type, name, (parameters), (arguments)) for every op here: declared below, and dispatched through the
 * table of the process's CPU level (kernel_table.h). */
#define ZY_ATTENTION_OPS(OP)                                                                                           \
    /* Floats of scratch the calls below need to run up to `threads` OpenMP threads at head size dh (independent of    \
     * B and T: one set of tile buffers per thread). Calls running at the same time need their own scratch. */         \
    OP(size_t, flash_attention_workspace_floats, (int dh, int threads), (dh, threads))                                 \
    /* O = softmax(Q Kᵀ / sqrt(dh), causal) V, overwriting O; LSE[b,h,t] = log Σ_s exp(score[t,s]). window > 0: a      \
     * sliding window, query t sees keys t-window+1..t only (transformers' sliding_window, config.h); 0: plain         \
     * causal. work: flash_attention_workspace_floats(dh, threads) floats; at most `threads` threads run. */           \
    OP(void, flash_attention_forward,                                                                                  \
       (float *O, float *LSE, const float *Q, const float *K, const float *V, int B, int T, int Hq, int Hkv, int dh,   \
        int window, float *work, int threads),                                                                         \
       (O, LSE, Q, K, V, B, T, Hq, Hkv, dh, window, work, threads))                                                    \
    /* ACCUMULATES (+=) dQ, dK, dV from dO, given the forward's O and LSE (probabilities recomputed per tile);         \
     * window as in the forward. */                                                                                    \
    OP(void, flash_attention_backward,                                                                                 \
       (float *dQ, float *dK, float *dV, const float *dO, const float *O, const float *LSE, const float *Q,            \
        const float *K, const float *V, int B, int T, int Hq, int Hkv, int dh, int window, float *work, int threads),  \
       (dQ, dK, dV, dO, O, LSE, Q, K, V, B, T, Hq, Hkv, dh, window, work, threads))                                    \
    /* Cached decoding (decode.c): S[t, s] = scale · Q[t]·K[s] for n query rows (stride ldq) against cnt cached keys   \
     * of one KV block stored transposed, key s's channel d at KT[d ldkt + s], into S (stride lds): the tiles'         \
     * register-blocked product, each vector of keys loaded once for all n rows. Columns cnt..avail-1 of KT may be     \
     * read too (the rest of the block, values unused): a partial last vector of keys then runs as a whole one. */     \
    OP(void, decode_attn_scores,                                                                                       \
       (float *S, long lds, const float *Q, long ldq, const float *KT, long ldkt, int n, int cnt, int avail, int dh,   \
        float scale),                                                                                                  \
       (S, lds, Q, ldq, KT, ldkt, n, cnt, avail, dh, scale))                                                           \
    /* ... the same two products against a cache of bf16 keys (transposed as above) and values: each widened to        \
     * fp32 as it is loaded, products and sums fp32. */                                                                \
    OP(void, decode_attn_scores_bf16,                                                                                  \
       (float *S, long lds, const float *Q, long ldq, const uint16_t *KT, long ldkt, int n, int cnt, int avail,        \
        int dh, float scale),                                                                                          \
       (S, lds, Q, ldq, KT, ldkt, n, cnt, avail, dh, scale))                                                           \
    OP(void, decode_attn_values_bf16,                                                                                  \
       (float *O, long ldo, const float *P, long ldp, const uint16_t *V, long ldv, int n, int cnt, int dh,             \
        int accumulate),                                                                                               \
       (O, ldo, P, ldp, V, ldv, n, cnt, dh, accumulate))                                                               \
    /* ... one score row's softmax step against keys c0..c1-1 of the full forward's key tile that starts at key k0  \
     * (a multiple of ZY_ATTN_KEY_TILE; k0 <= c0 < c1 <= k0 + ZY_ATTN_KEY_TILE), s[0, c1-c0) their scaled scores:     \
     * the forward's online softmax, bit for bit. The row sees keys first..last; s becomes its unnormalised           \
     * probabilities (0 outside first..last), its running max *m (-inf before its first tile) and sum *l move on,     \
     * and its output row o[0, dh) (zero before the first tile) is rescaled as the forward's. A row's tiles in key     \
     * order, each followed by o += P V over the tile's keys (decode_attn_values, accumulating); then                 \
     * decode_attn_normalise(o, dh, l) divides by the sum as the forward does. */                                     \
    OP(void, decode_attn_softmax_tile,                                                                                 \
       (float *s, int k0, int c0, int c1, int first, int last, float *m, double *l, float *o, int dh),                 \
       (s, k0, c0, c1, first, last, m, l, o, dh))                                                                      \
    OP(void, decode_attn_normalise, (float *o, int dh, double l), (o, dh, l))                                          \
    /* ... O[t] (+)= Σ_s P[t, s] · V[s] for n rows against one block's cnt values (accumulate: add to O, else          \
     * overwrite). */                                                                                                  \
    OP(void, decode_attn_values,                                                                                       \
       (float *O, long ldo, const float *P, long ldp, const float *V, long ldv, int n, int cnt, int dh,                \
        int accumulate),                                                                                               \
       (O, ldo, P, ldp, V, ldv, n, cnt, dh, accumulate))

#define ZY_ATTENTION_OP_DECL(ret, name, params, args) ret name params;
ZY_ATTENTION_OPS(ZY_ATTENTION_OP_DECL)
#undef ZY_ATTENTION_OP_DECL

#endif

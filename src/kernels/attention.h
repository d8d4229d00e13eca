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
    /* ... a score row's softmax over columns [first, last] in place, the other columns of [0, n) zero; and            \
     * O[t] (+)= Σ_s P[t, s] · V[s] for n rows against one block's cnt values (accumulate: add to O, else              \
     * overwrite). */                                                                                                  \
    OP(void, decode_attn_softmax, (float *row, int n, int first, int last), (row, n, first, last))                     \
    OP(void, decode_attn_values,                                                                                       \
       (float *O, long ldo, const float *P, long ldp, const float *V, long ldv, int n, int cnt, int dh,                \
        int accumulate),                                                                                               \
       (O, ldo, P, ldp, V, ldv, n, cnt, dh, accumulate))

#define ZY_ATTENTION_OP_DECL(ret, name, params, args) ret name params;
ZY_ATTENTION_OPS(ZY_ATTENTION_OP_DECL)
#undef ZY_ATTENTION_OP_DECL

#endif

/* gpu_router: one row of the router's state norm and of its top-1 choice, each done by one warp: the row functions of
 * gpu_moe.cu's kernels and of the few-row router tail in gpu_skinny.cu (gk_skinny_router_tail), so both give the same
 * bits. The same maths as the CPU's router (src/kernels/kernels.inc). Include after gpu_common.cuh. */
#ifndef ZAYA_GPU_ROUTER_CUH
#define ZAYA_GPU_ROUTER_CUH

/* z += bias (+ r_prev ⊙ γ), written back; zn = w ⊙ z · rstd, rstd = 1 / sqrt(mean(z²) + eps) (Σz² in double, lane l
 * taking the V-wide pieces l, l + warp, ...). r_prev NULL: the first layer (no depth average). One warp, every lane. */
template <int V>
__device__ __forceinline__ void state_rmsnorm_row(float *zr, float *zn, float *rstd, const float *bias,
                                                  const float *rp, const float *gamma, const float *w, int dim,
                                                  float eps) {
    const int lane = threadIdx.x % GPU_WARP, nv = dim / V;
    double ss = 0;
    for (int j = lane; j < nv; j += GPU_WARP) {
        float v[V], b[V];
        ldv<V>(v, zr + j * V);
        ldv<V>(b, bias + j * V);
#pragma unroll
        for (int k = 0; k < V; k++) v[k] += b[k];
        if (rp) {
            float p[V], g[V];
            ldv<V>(p, rp + j * V);
            ldv<V>(g, gamma + j * V);
#pragma unroll
            for (int k = 0; k < V; k++) v[k] += p[k] * g[k];
        }
        stv<V>(zr + j * V, v);
#pragma unroll
        for (int k = 0; k < V; k++) ss += (double)v[k] * v[k];
    }
    ss = warp_sum_d(ss);
    const float s = (float)(1.0 / sqrt(ss / dim + (double)eps));
    if (lane == 0 && rstd) *rstd = s;
    for (int j = lane; j < nv; j += GPU_WARP) { /* re-reads this lane's own writes of z */
        float v[V], ww[V];
        ldv<V>(v, zr + j * V);
        ldv<V>(ww, w + j * V);
#pragma unroll
        for (int k = 0; k < V; k++) v[k] = ww[k] * (v[k] * s);
        stv<V>(zn + j * V, v);
    }
}

/* Does candidate (v2, e2) beat (v1, e1) in the CPU's sequential scan `if (e == 0 || v > best_v)`? A total order:
 * empty (e < 0) loses; class 0 with a NaN score wins outright (the CPU never replaces it); a NaN elsewhere never
 * wins; else the larger score, then the smaller class. */
__device__ __forceinline__ bool choice_beats(float v2, int e2, float v1, int e1) {
    if (e2 < 0) return false;
    if (e1 < 0) return true;
    if (e1 == 0 && v1 != v1) return false;
    if (e2 == 0 && v2 != v2) return true;
    if (v2 != v2) return false;
    if (v1 != v1) return true;
    return v2 > v1 || (v2 == v1 && e2 < e1);
}

/* p = softmax(logits) over nc classes (exp and sum in double), the class with the largest p + bias (choice_beats'
 * order) and its p as the gate. One warp, every lane; p is written and re-read by the same lane. */
__device__ __forceinline__ void router_choice_row(float *p, int32_t *choice, float *gate, const float *l,
                                                  const float *bias, int nc) {
    const int lane = threadIdx.x % GPU_WARP;
    float mx = -INFINITY;
    for (int e = lane; e < nc; e += GPU_WARP) mx = fmaxf(mx, l[e]);
    mx = warp_max(mx);
    double sum = 0;
    for (int e = lane; e < nc; e += GPU_WARP) {
        const float pe = (float)exp((double)(l[e] - mx));
        p[e] = pe;
        sum += pe;
    }
    sum = warp_sum_d(sum);
    const float inv = (float)(1.0 / sum);
    float best_v = 0, best_p = 0;
    int best = -1;
    for (int e = lane; e < nc; e += GPU_WARP) {
        const float pe = p[e] * inv; /* this lane's own unnormalised value */
        p[e] = pe;
        const float v = pe + bias[e];
        if (choice_beats(v, e, best_v, best)) best_v = v, best = e, best_p = pe;
    }
    for (int o = GPU_WARP / 2; o > 0; o >>= 1) { /* butterfly: every lane ends with the same winner */
        const float ov = gk_shfl_xor(best_v, o), op = gk_shfl_xor(best_p, o);
        const int oe = gk_shfl_xor(best, o);
        if (choice_beats(ov, oe, best_v, best)) best_v = ov, best = oe, best_p = op;
    }
    if (lane == 0) {
        *choice = best;
        *gate = best_p;
    }
}

#endif

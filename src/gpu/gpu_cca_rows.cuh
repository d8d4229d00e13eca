/* gpu_cca_rows: CCA's per-row steps after the convolution, as device functions shared by gpu_cca.cu's kernels (every
 * pass) and gpu_decode_kernels.cu's fused decoding step (gk_cca_decode_rows), so both give the same bits. The same
 * maths as the CPU's (src/kernels/kernels.inc). Include after gpu_common.cuh. */
#ifndef ZAYA_GPU_CCA_ROWS_CUH
#define ZAYA_GPU_CCA_ROWS_CUH

/* The q-k mean skip at element i of kv head j, for one row of X (pre-convolution) and Y (post): the G query heads of
 * j's group, h = j·G + g, get y[h] + (x[h] + x_key[j]) / 2, written to q_out[g·q_stride + i]; the key gets y_key[j] +
 * the mean of those halves (the half-sums in double, rounded once). */
__device__ __forceinline__ void qk_mean_at(const float *x, const float *y, int j, int i, int G, int dh, int Cq,
                                           float *q_out, long q_stride, float *k_out) {
    const int el = j * dh + i;
    const double kk = x[Cq + el];
    double sum = 0;
    for (int g = 0; g < G; g++) {
        const int h = j * G + g;
        const float qm = (float)(((double)x[h * dh + i] + kk) * 0.5);
        q_out[(long)g * q_stride + i] = __fadd_rn(y[h * dh + i], qm);
        sum += qm;
    }
    *k_out = __fadd_rn(y[Cq + el], (float)(sum / G));
}

/* One head of the QK L2 norm and partial RoPE, one warp: y = rope(x · scale / max(‖x‖, eps) (· temp)), the first
 * 2·half dims rotated by the table rows cs / sn, the rest only scaled; ‖x‖ to *norm_out when it is set. temp: the head's
 * temperature or NULL. */
__device__ __forceinline__ void l2norm_rope_head(float *yv, float *norm_out, const float *xv, const float *temp,
                                                 const float *cs, const float *sn, int dh, int half, float scale,
                                                 float eps) {
    const int lane = threadIdx.x % GPU_WARP;
    double ss = 0;
    for (int i = lane; i < dh; i += GPU_WARP) ss += (double)xv[i] * xv[i];
    ss = warp_sum_d(ss);
    const float n = (float)sqrt(ss);
    if (lane == 0 && norm_out) *norm_out = n;
    const float f = scale / (n > eps ? n : eps);
    /* the same two roundings as the CPU (x·f, then ·temp) */
    auto scaled = [&](float v) { return temp ? __fmul_rn(__fmul_rn(v, f), *temp) : __fmul_rn(v, f); };
    for (int k = lane; k < half; k += GPU_WARP) {
        const float a = scaled(xv[k]), b = scaled(xv[k + half]), c = cs[k], s = sn[k];
        yv[k] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
        yv[k + half] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
    }
    for (int k = 2 * half + lane; k < dh; k += GPU_WARP) yv[k] = scaled(xv[k]);
}

#endif

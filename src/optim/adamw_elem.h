/* adamw_elem: AdamW's update of one element, the CPU optimizer's (optim.c) and the reference the GPU kernel
 * (src/gpu/gpu_adamw.cu) is checked against on the CPU emulator (tests/gpu/emu/test_adamw.cpp) — one copy of the
 * arithmetic, in this order, without fused multiply-adds (ISO C/C++ modes do not contract). */
#ifndef ZAYA_OPTIM_ADAMW_ELEM_H
#define ZAYA_OPTIM_ADAMW_ELEM_H

#include <math.h>

/* decay = 1 − lr·wd (or 1 where no weight decay applies); step_size = lr / (1 − β1^t); inv_bc2 = 1 / √(1 − β2^t). */
static inline void adamw_elem(float *w, const float *g, float *m, float *v, float step_size, float eps, float b1,
                              float b2, float inv_bc2, float decay) {
    *w *= decay;
    *m += (*g - *m) * (1.0f - b1);
    *v = b2 * *v + (1.0f - b2) * *g * *g;
    const float denom = sqrtf(*v) * inv_bc2 + eps;
    *w -= step_size * (*m / denom);
}

#endif

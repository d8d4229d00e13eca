/* gpu_tc: the matrix-unit wrapper. Every tensor-core use (gpu_attention_tc.cu, gpu_expert_gemm.cu) goes through
 * tc::, so the port to another vendor, or to the CPU emulation the tests run (tests/gpu/emu), is this file. */
#ifndef ZAYA_GPU_TC_CUH
#define ZAYA_GPU_TC_CUH

#include <stdint.h>

/* CUDA: nvcuda::wmma from <mma.h> (bf16 fragments need sm_80+). HIP (-DZAYA_HIP): rocWMMA offers the same API
 * (fragment<matrix_a / matrix_b / accumulator, 16, 16, 16, T, layout>, load_matrix_sync, mma_sync,
 * store_matrix_sync, fill_fragment, .x[] and num_elements), so a namespace alias and the bf16 type are the port.
 * NOTE: the HIP branch cannot be compiled or run in this build (no ROCm here) and is untested; on wave64 AMD GPUs
 * GPU_WARP = 64, which the callers' row code follows. */
#if defined(ZAYA_GPU_EMU) /* tests/gpu/emu/cuda_emu.h: the same API on the CPU, one thread per CUDA thread */
namespace tcw = emu_wmma;
typedef emu_wmma::bf16 tc_bf16;
#elif defined(ZAYA_HIP)
#include <rocwmma/rocwmma.hpp>
namespace tcw = rocwmma;
typedef rocwmma::bfloat16_t tc_bf16;
#else
#include <mma.h>
namespace tcw = nvcuda::wmma;
typedef __nv_bfloat16 tc_bf16;
#endif

namespace tc {
using A = tcw::fragment<tcw::matrix_a, 16, 16, 16, tc_bf16, tcw::row_major>;  /* 16 rows of a row-major tile */
using At = tcw::fragment<tcw::matrix_a, 16, 16, 16, tc_bf16, tcw::col_major>; /* Xᵀ of a row-major tile X */
using Bt = tcw::fragment<tcw::matrix_b, 16, 16, 16, tc_bf16, tcw::col_major>; /* Xᵀ of a row-major tile X */
using B = tcw::fragment<tcw::matrix_b, 16, 16, 16, tc_bf16, tcw::row_major>;  /* a row-major tile as it is */
using C = tcw::fragment<tcw::accumulator, 16, 16, 16, float>;
constexpr int CN = C::num_elements; /* accumulator elements per lane */

/* bf16 tiles are kept as raw bits (uint16_t); ld in elements (a multiple of 8), p 32-byte aligned. */
template <class F>
__device__ __forceinline__ void load(F &f, const uint16_t *p, int ld) {
    tcw::load_matrix_sync(f, reinterpret_cast<const tc_bf16 *>(p), (unsigned)ld);
}
__device__ __forceinline__ void load(C &f, const float *p, int ld) {
    tcw::load_matrix_sync(f, p, (unsigned)ld, tcw::mem_row_major);
}
__device__ __forceinline__ void store(float *p, const C &f, int ld) {
    tcw::store_matrix_sync(p, f, (unsigned)ld, tcw::mem_row_major);
}
__device__ __forceinline__ void zero(C &f) { tcw::fill_fragment(f, 0.0f); }
template <class FA, class FB>
__device__ __forceinline__ void mma(C &acc, const FA &a, const FB &b) { /* acc += a b */
    tcw::mma_sync(acc, a, b, acc);
}
} // namespace tc

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define TC_ARCH_OK 0 /* no bf16 matrix units: such targets get empty kernels */
#else
#define TC_ARCH_OK 1
#endif

#endif

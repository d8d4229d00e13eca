/* gpu_common: device helpers shared by the kernel files (C++ / CUDA, HIP-portable).
 * Determinism: every reduction here has a fixed order (warp shuffles in a fixed tree, shared-memory sums in a fixed
 * order, column sums over a fixed row split), so a step gives the same bits on every run; no float atomics. */
#ifndef ZAYA_GPU_COMMON_CUH
#define ZAYA_GPU_COMMON_CUH

#include <stdint.h>

#include <initializer_list>

#ifdef ZAYA_GPU_EMU
#include "cuda_emu.h" /* tests/gpu/emu: this source run on the CPU */
#else
#include "gpu_runtime.h"
#include "gpu_kernels.h" /* gk_programmatic_launch_on */

/* A kernel launch, written once for the GPU and for the CPU emulation (cuda_emu.h runs the same call there):
 * kern a kernel or a pointer to one (a template's name with commas goes through a pointer). */
#define GK_LAUNCH(kern, grid, block, smem, stream, ...) kern<<<grid, block, smem, stream>>>(__VA_ARGS__)
/* The block's dynamic shared memory, 128-byte aligned (as T elements: GK_DYNAMIC_SMEM_T). */
#define GK_DYNAMIC_SMEM(name) extern __shared__ __align__(128) unsigned char name[]
#define GK_DYNAMIC_SMEM_T(T, name) extern __shared__ __align__(128) T name[]

/* Programmatic dependent launch (Hopper and newer, CUDA; gk_programmatic_launch in gpu_kernels.h turns it on): a
 * kernel launched through GK_LAUNCH_PDL may be scheduled, its blocks made resident and their first instructions run,
 * while the kernel before it in the stream is still running, so a chain of small kernels (a decoding step) does not
 * pay each launch's latency in turn. Such a kernel MUST call gk_pdl_enter() before it reads or writes anything another
 * kernel of the stream writes or reads (tests/gpu/pdl_check.py checks that it calls it, the emulator that every
 * thread reaches it); what it does before (index arithmetic, loads of weights no kernel of the step writes) overlaps
 * the previous kernel. Elsewhere (HIP, older GPUs, the switch off) it is an ordinary launch. */
#ifndef ZAYA_HIP
/* cudaLaunchKernelEx with one launch attribute. */
template <typename... P, typename... A>
inline cudaError_t gk_launch_with(cudaLaunchAttribute attr, void (*kern)(P...), dim3 grid, dim3 block, size_t smem,
                                  gpuStream_t s, A... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = s;
    cfg.attrs = &attr, cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, kern, static_cast<P>(args)...);
}
template <typename... P, typename... A>
inline void gk_launch_pdl(void (*kern)(P...), dim3 grid, dim3 block, size_t smem, gpuStream_t s, A... args) {
    if (!gk_programmatic_launch_on()) {
        kern<<<grid, block, smem, s>>>(static_cast<P>(args)...);
        return;
    }
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    if (gk_launch_with(attr, kern, grid, block, smem, s, args...) == cudaSuccess) return;
    /* refused (a driver or setup without it): launch as usual from now on; a real launch error repeats below and
     * surfaces at the next gpu_check as any launch's does */
    (void)cudaGetLastError();
    gk_programmatic_launch(0);
    kern<<<grid, block, smem, s>>>(static_cast<P>(args)...);
}
#define GK_LAUNCH_PDL(kern, grid, block, smem, stream, ...) gk_launch_pdl(kern, grid, block, smem, stream, __VA_ARGS__)
#else
#define GK_LAUNCH_PDL GK_LAUNCH
#endif
/* A launch whose blocks are all resident at once, or none (a kernel that waits on gk_grid_sync): CUDA's cooperative
 * launch attribute, HIP's cooperative launch (args of the kernel's own parameter types). Returns the runtime's error
 * (a grid past what fits is refused). */
template <typename... P, typename... A>
inline gpuError_t gk_launch_cooperative(void (*kern)(P...), dim3 grid, dim3 block, size_t smem, gpuStream_t s,
                                        A... args) {
#ifndef ZAYA_HIP
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeCooperative;
    attr.val.cooperative = 1;
    return gk_launch_with(attr, kern, grid, block, smem, s, args...);
#else
    void *argv[] = {(void *)&args...};
    return hipLaunchCooperativeKernel((const void *)kern, grid, block, argv, (unsigned)smem, s);
#endif
}
#define GK_LAUNCH_COOPERATIVE(kern, grid, block, smem, stream, ...)                                                \
    gk_launch_cooperative(kern, grid, block, smem, stream, __VA_ARGS__)
#endif

/* Waits for the kernels before this one in the stream to finish (their writes visible), then lets the next kernel
 * launched through GK_LAUNCH_PDL be scheduled: a no-op where programmatic launch is not in use. Called by every thread,
 * before the first access that depends on (or is read by) another kernel. */
__device__ __forceinline__ void gk_pdl_enter() {
#if defined(ZAYA_GPU_EMU)
    emu::pdl_enter();
#elif !defined(ZAYA_HIP) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cudaGridDependencySynchronize();
    cudaTriggerProgrammaticLaunchCompletion();
#endif
}

/* Device-scope release add and acquire load (the grid barrier's): on the emulator, C++'s, which its thread sanitizer
 * checks. */
__device__ __forceinline__ unsigned gk_atomic_add_release(unsigned *p, unsigned v) {
#if defined(ZAYA_GPU_EMU)
    return __atomic_fetch_add(p, v, __ATOMIC_RELEASE);
#elif defined(ZAYA_HIP)
    return __hip_atomic_fetch_add(p, v, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_AGENT);
#else
    unsigned old;
    asm volatile("atom.add.release.gpu.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
#endif
}
__device__ __forceinline__ unsigned gk_load_acquire(const unsigned *p) {
#if defined(ZAYA_GPU_EMU)
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
#elif defined(ZAYA_HIP)
    return __hip_atomic_load(p, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_AGENT);
#else
    unsigned v;
    asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
#endif
}

/* A persistent kernel's grid-wide barrier (gk_decode_layers): every block's writes before it are visible to every block
 * after it. bar: one zeroed word of device memory owned by the kernel's launches. Each block's first thread adds to it
 * once, with release, and waits, with acquire, for its top bit to flip: every block adds 1 but block 0, which adds
 * 2^31 - (blocks - 1), so the last arrival's add flips the bit and leaves the low bits zero again, ready for the next
 * barrier and the next launch, with no reset on the critical path (one atomic a block, then polls). The block
 * barriers around it carry the block's other threads' writes and reads (the PTX model's causality order is
 * transitive through them). Every block must be resident at once: GK_LAUNCH_COOPERATIVE, with a grid the occupancy
 * allows. A barrier still waiting after ~2^26 polls (seconds: far past any phase's time) traps, so a lost block fails
 * the launch instead of hanging the device. */
__device__ __forceinline__ void gk_grid_sync(unsigned *bar) {
    __syncthreads();
    if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
        const unsigned blocks = gridDim.x * gridDim.y * gridDim.z;
        const bool first = blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0;
        const unsigned seen = gk_atomic_add_release(bar, first ? 0x80000000u - (blocks - 1) : 1u);
        for (unsigned polls = 0; ((gk_load_acquire(bar) ^ seen) & 0x80000000u) == 0; polls++) {
#if defined(ZAYA_GPU_EMU)
            emu::grid_poll(polls);
#elif defined(ZAYA_HIP)
            if (polls >> 26) __builtin_trap();
#else
            if (polls >> 26) __trap();
#endif
        }
    }
    __syncthreads();
}

/* Asks the L2 cache to fetch [p, p + bytes) ahead of its use: a hint (no value changes, nothing waits for it), the
 * block's threads taking a 128-byte line each in turn. Nothing on HIP; the emulator reads a byte of each line and the
 * last, so a range outside its buffer or one another thread is writing shows up in its sanitizers. */
__device__ __forceinline__ void gk_prefetch_l2(const void *p, long bytes) {
#if defined(ZAYA_GPU_EMU)
    const volatile unsigned char *c = static_cast<const volatile unsigned char *>(p);
    for (long i = (long)threadIdx.x * 128; i < bytes; i += (long)blockDim.x * 128) (void)c[i];
    if (threadIdx.x == 0 && bytes > 0) (void)c[bytes - 1];
#elif !defined(ZAYA_HIP)
    const uintptr_t end = (uintptr_t)p + (uintptr_t)bytes;
    for (uintptr_t line = ((uintptr_t)p & ~(uintptr_t)127) + (uintptr_t)threadIdx.x * 128; line < end;
         line += (uintptr_t)blockDim.x * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(line));
#else
    (void)p, (void)bytes;
#endif
}

/* Launch-error check after a kernel launch (the launchers return void; errors surface at gpu_check_last). */
#define GK_LAUNCH_CHECK() ((void)0)

/* zy_f32_to_bf16 (util.h), bit for bit: nearest even; a NaN keeps its top bits and is made quiet. Inf stays inf;
 * a finite value that rounds past the largest bf16 becomes inf, as on the CPU. */
__device__ __forceinline__ uint16_t gk_bf16_bits(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline int gk_blocks(long n, int threads) {
    long b = (n + threads - 1) / threads;
    return (int)(b > 65535L * 16 ? 65535L * 16 : b);
}

/* V-wide loads and stores (V = 4: one 128-bit access; the launcher checks the alignment first). */
template <int V> __device__ __forceinline__ void ldv(float (&d)[V], const float *p);
template <> __device__ __forceinline__ void ldv<1>(float (&d)[1], const float *p) { d[0] = *p; }
template <> __device__ __forceinline__ void ldv<4>(float (&d)[4], const float *p) {
    const float4 t = *reinterpret_cast<const float4 *>(p);
    d[0] = t.x, d[1] = t.y, d[2] = t.z, d[3] = t.w;
}
template <int V> __device__ __forceinline__ void stv(float *p, const float (&d)[V]);
template <> __device__ __forceinline__ void stv<1>(float *p, const float (&d)[1]) { *p = d[0]; }
template <> __device__ __forceinline__ void stv<4>(float *p, const float (&d)[4]) {
    *reinterpret_cast<float4 *>(p) = make_float4(d[0], d[1], d[2], d[3]);
}

/* Orders a warp's shared-memory writes before its lanes' (or a fragment load's) reads of them. */
__device__ __forceinline__ void gk_syncwarp() {
#if defined(ZAYA_HIP) && !defined(ZAYA_GPU_EMU)
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront");
    __builtin_amdgcn_wave_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront");
#else
    __syncwarp();
#endif
}

/* xor shuffle (every lane of the warp calls it). */
template <class T>
__device__ __forceinline__ T gk_shfl_xor(T v, int o) {
#ifdef ZAYA_HIP
    return __shfl_xor(v, o);
#else
    return __shfl_xor_sync(0xffffffffu, v, o);
#endif
}
/* Max / sum over aligned groups of W lanes (W a power of two <= the warp): a fixed butterfly, so every lane of a group
 * ends with the same bits. */
template <int W, class T = float>
__device__ __forceinline__ T lane_group_sum(T v) {
    for (int o = W / 2; o > 0; o >>= 1) v += gk_shfl_xor(v, o);
    return v;
}
template <int W>
__device__ __forceinline__ float lane_group_max(float v) {
    for (int o = W / 2; o > 0; o >>= 1) v = fmaxf(v, gk_shfl_xor(v, o));
    return v;
}

/* Sum / max over a warp (every lane gets the result): the lane-group butterfly over the whole warp. */
__device__ __forceinline__ float warp_sum(float v) { return lane_group_sum<GPU_WARP>(v); }
__device__ __forceinline__ double warp_sum_d(double v) { return lane_group_sum<GPU_WARP, double>(v); }
__device__ __forceinline__ float warp_max(float v) { return lane_group_max<GPU_WARP>(v); }

/* Sum over the block (blockDim.x a multiple of the warp size, <= 1024); every thread gets the result.
 * shared: at least 32 doubles of scratch (__shared__ double s[32]). Fixed order. Ends with a barrier, so the
 * scratch may be reused right after. */
__device__ __forceinline__ double block_sum_d(double v, double *shared) {
    const int lane = threadIdx.x % GPU_WARP, wid = threadIdx.x / GPU_WARP, nw = blockDim.x / GPU_WARP;
    v = warp_sum_d(v);
    if (lane == 0) shared[wid] = v;
    __syncthreads();
    double t = 0;
    for (int i = 0; i < nw; i++) t += shared[i]; /* every thread sums the warps in the same order */
    __syncthreads();
    return t;
}
__device__ __forceinline__ float block_max(float v, float *shared) {
    const int lane = threadIdx.x % GPU_WARP, wid = threadIdx.x / GPU_WARP, nw = blockDim.x / GPU_WARP;
    v = warp_max(v);
    if (lane == 0) shared[wid] = v;
    __syncthreads();
    float t = shared[0];
    for (int i = 1; i < nw; i++) t = fmaxf(t, shared[i]);
    __syncthreads();
    return t;
}

/* Column reductions: dst[c] += Σ_r f(r, c) over rows [0, rows), for c in [0, dim). F is a functor with
 * `__device__ float operator()(long r, int c) const`. Block (32, 16): 32 columns per block, the rows split
 * over 16 thread rows in a fixed stride, partial sums in double, then summed in a fixed order: deterministic. */
template <class F>
__global__ void col_reduce_kernel(float *dst, long rows, int dim, F f) {
    __shared__ double part[16][33];
    const int c = blockIdx.x * 32 + threadIdx.x;
    double acc = 0;
    if (c < dim)
        for (long r = threadIdx.y; r < rows; r += 16) acc += (double)f(r, c);
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < dim) {
        double t = 0;
        for (int i = 0; i < 16; i++) t += part[i][threadIdx.x];
        dst[c] += (float)t;
    }
}
template <class F>
static inline void col_reduce(gpuStream_t s, float *dst, long rows, int dim, F f) {
    if (!dst || dim <= 0) return;
    dim3 block(32, 16), grid((dim + 31) / 32);
    void (*k)(float *, long, int, F) = col_reduce_kernel<F>;
    GK_LAUNCH(k, grid, block, 0, s, dst, rows, dim, f);
}

/* Asynchronous 16-byte copies global → shared (cp.async, sm_80+): the copy engine fills shared memory while the
 * threads compute, with no registers staging the data. gk_copy16_async issues one (valid false: 16 zero bytes, src
 * not read), gk_async_commit closes this thread's group of copies, gk_async_wait<N> waits until at most N of its
 * groups are still in flight; a barrier after the wait makes every thread's copies visible to the block. HIP, the CPU
 * emulation and older targets copy synchronously (the same code is then correct with the waits doing nothing). */
#if !defined(ZAYA_GPU_EMU) && !defined(ZAYA_HIP) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define GK_CP_ASYNC 1
#else
#define GK_CP_ASYNC 0
#endif
__device__ __forceinline__ void gk_copy16_async(void *smem, const void *gmem, bool valid) {
#if GK_CP_ASYNC
    const unsigned dst = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(valid ? 16 : 0));
#else
    *reinterpret_cast<uint4 *>(smem) = valid ? *reinterpret_cast<const uint4 *>(gmem) : make_uint4(0u, 0u, 0u, 0u);
#endif
}
__device__ __forceinline__ void gk_async_commit() {
#if GK_CP_ASYNC
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N>
__device__ __forceinline__ void gk_async_wait() {
#if GK_CP_ASYNC
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

/* Row kernels' vector moves (gpu_norms.cu, gpu_xent.cu). W consecutive floats: W = 4 moves them as one float4 (the caller checked the alignment), W = 1 one float. */
template <int W>
struct Pack {
    float v[W];
};
template <int W>
__device__ __forceinline__ Pack<W> load_pack(const float *p) {
    Pack<W> r;
    if constexpr (W == 4) {
        const float4 t = *reinterpret_cast<const float4 *>(p);
        r.v[0] = t.x, r.v[1] = t.y, r.v[2] = t.z, r.v[3] = t.w;
    } else {
        r.v[0] = *p;
    }
    return r;
}
template <int W>
__device__ __forceinline__ void store_pack(float *p, const Pack<W> &a) {
    if constexpr (W == 4)
        *reinterpret_cast<float4 *>(p) = make_float4(a.v[0], a.v[1], a.v[2], a.v[3]);
    else
        *p = a.v[0];
}

static inline bool aligned16(const void *p) { return p == nullptr || ((uintptr_t)p & 15u) == 0; }

/* float4 moves are possible when every row starts on a 16-byte boundary: dim a multiple of 4 and all bases
 * aligned (cudaMalloc'd buffers are; sub-buffers at odd offsets fall back to scalar loads). */
static inline bool can_vec4(int dim, std::initializer_list<const void *> ptrs) {
    if (dim % 4) return false;
    for (const void *p : ptrs)
        if (!aligned16(p)) return false;
    return true;
}

/* GELU and its derivative exactly as kernels.inc (gelu_s / gelu_grad_s): 1 + erf(z) as 1 ± (1 − erfc(|z|)). */
__device__ __forceinline__ float gk_gelu(float x) {
    const float z = x * 0.70710678118654752440f;
    return 0.5f * x * (1.0f + copysignf(1.0f - erfcf(fabsf(z)), z));
}
__device__ __forceinline__ float gk_gelu_grad(float x) {
    const float z = x * 0.70710678118654752440f;
    return 0.5f * (1.0f + copysignf(1.0f - erfcf(fabsf(z)), z)) +
           x * 0.39894228040143267794f * expf(-0.5f * x * x);
}

/* bf16 → fp32: exact (the bits move up 16 places). */
__device__ __forceinline__ float gk_bf16_float(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

__device__ __forceinline__ float gk_bf16_round(float x) { /* nearest even, like zy_round_bf16 */
    uint32_t u = __float_as_uint(x);
    if ((u & 0x7f800000u) == 0x7f800000u) return x; /* inf / nan unchanged */
    u += 0x7fffu + ((u >> 16) & 1u);
    return __uint_as_float(u & 0xffff0000u);
}

#endif

/* cuda_emu: enough of CUDA to run a kernel source on the CPU (tests/gpu/emu/run.sh): one std::thread per CUDA thread,
 * blocks one after another, __syncthreads / __syncwarp as barriers, __shared__ as static storage (one block at a
 * time), and emu_wmma, a reference WMMA (16 x 16 x 16, fp32 accumulation) with the same calls as nvcuda::wmma. A
 * fragment store is written by lane 0 only, so a kernel that reads it from other lanes without tc::syncwarp() races
 * (ThreadSanitizer reports it). Used for the tensor-core sources that include gpu_tc.cuh. */
#ifndef ZAYA_CUDA_EMU_H
#define ZAYA_CUDA_EMU_H

#include <barrier>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct uint4 {
    unsigned x, y, z, w;
};
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return uint4{a, b, c, d}; }

inline thread_local dim3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#ifndef GPU_WARP
#define GPU_WARP 32 /* -DGPU_WARP=64: an AMD wavefront, as a HIP build has */
#endif
#define GK_LAUNCH_CHECK() ((void)0)
typedef void *GkStream;

namespace emu {
inline std::barrier<> *block_bar;
inline std::vector<std::unique_ptr<std::barrier<>>> warp_bars;

/* Runs fn as grid x block threads: each block's threads at once, the blocks in order (x fastest). */
inline void launch(dim3 grid, dim3 block, const std::function<void()> &fn) {
    const unsigned nt = block.x * block.y * block.z;
    gridDim = grid, blockDim = block;
    for (unsigned bz = 0; bz < grid.z; bz++)
        for (unsigned by = 0; by < grid.y; by++)
            for (unsigned bx = 0; bx < grid.x; bx++) {
                std::barrier<> bar((std::ptrdiff_t)nt);
                block_bar = &bar;
                warp_bars.clear();
                for (unsigned w = 0; w < (nt + GPU_WARP - 1) / GPU_WARP; w++) {
                    const unsigned n = nt - w * GPU_WARP < GPU_WARP ? nt - w * GPU_WARP : GPU_WARP;
                    warp_bars.emplace_back(new std::barrier<>((std::ptrdiff_t)n));
                }
                std::vector<std::thread> th;
                th.reserve(nt);
                for (unsigned t = 0; t < nt; t++)
                    th.emplace_back([&, t] {
                        threadIdx = dim3(t % block.x, t / block.x % block.y, t / (block.x * block.y));
                        blockIdx = dim3(bx, by, bz);
                        fn();
                        warp_bars[t / GPU_WARP]->arrive_and_drop();
                        block_bar->arrive_and_drop();
                    });
                for (auto &x : th) x.join();
            }
}
inline unsigned flat_tid() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }
} // namespace emu

inline void __syncthreads() { emu::block_bar->arrive_and_wait(); }
inline void __syncwarp() { emu::warp_bars[emu::flat_tid() / GPU_WARP]->arrive_and_wait(); }

namespace emu_wmma {
struct row_major {};
struct col_major {};
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
enum layout_t { mem_row_major, mem_col_major };
struct bf16 {
    uint16_t bits;
};
inline float to_float(bf16 v) {
    uint32_t u = (uint32_t)v.bits << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

/* The whole 16 x 16 tile in every lane, (r, c) at x[r * 16 + c] (a: [m][k], b: [k][n], accumulator: [m][n]). */
template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
    static constexpr int num_elements = 256;
    float x[256];
};

/* The hardware's rules, checked: a 256-bit aligned pointer, ld a multiple of 16 bytes. */
inline void check_ptr(const void *p, unsigned ld, unsigned elem_bytes) {
    if ((uintptr_t)p % 32 || ld * elem_bytes % 16) {
        std::fprintf(stderr, "emu_wmma: pointer %p (needs 32-byte alignment) or ld %u (needs 16-byte multiples)\n", p,
                     ld);
        std::abort();
    }
}
template <class Use, class T, class Layout>
inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout> &f, const bf16 *p, unsigned ld) {
    check_ptr(p, ld, 2);
    constexpr bool row = std::is_same<Layout, row_major>::value;
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) f.x[r * 16 + c] = to_float(row ? p[r * ld + c] : p[c * ld + r]);
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p, unsigned ld, layout_t l) {
    check_ptr(p, ld, 4);
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) f.x[r * 16 + c] = l == mem_row_major ? p[r * ld + c] : p[c * ld + r];
}
inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f, unsigned ld, layout_t l) {
    check_ptr(p, ld, 4);
    if (emu::flat_tid() % GPU_WARP) return; /* lane 0 writes: the others must wait for it (syncwarp) */
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) (l == mem_row_major ? p[r * ld + c] : p[c * ld + r]) = f.x[r * 16 + c];
}
template <class Use, class T, class Layout>
inline void fill_fragment(fragment<Use, 16, 16, 16, T, Layout> &f, float v) {
    for (float &x : f.x) x = v;
}
template <class LA, class LB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d, const fragment<matrix_a, 16, 16, 16, bf16, LA> &a,
                     const fragment<matrix_b, 16, 16, 16, bf16, LB> &b,
                     const fragment<accumulator, 16, 16, 16, float> &c) {
    float out[256];
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 16; n++) {
            float s = c.x[m * 16 + n];
            for (int k = 0; k < 16; k++) s += a.x[m * 16 + k] * b.x[k * 16 + n];
            out[m * 16 + n] = s;
        }
    std::memcpy(d.x, out, sizeof out);
}
} // namespace emu_wmma

#endif

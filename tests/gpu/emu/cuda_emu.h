/* cuda_emu: enough of CUDA to run a kernel source on the CPU (tests/gpu/emu/run.sh): one std::thread per CUDA thread
 * (kept in a pool between blocks and launches: creating them was most of the suite's time), blocks one after another, __syncthreads / __syncwarp as barriers, __shared__ as static storage (one block at a
 * time) and dynamic shared memory per block (a cooperative launch runs all its blocks at once, with a grid barrier), warp shuffles through a per-warp exchange, and emu_wmma: a WMMA with the
 * same calls as nvcuda::wmma whose fragments are spread over the warp's lanes in a fixed pseudo-random layout (a
 * kernel that assumes a layout gets wrong numbers), mma_sync a collective of the warp, pointers and strides checked
 * against the hardware's rules. A kernel that reads another lane's or thread's shared-memory writes without the
 * barrier between them races; ThreadSanitizer reports it. Used for the tensor-core sources that include gpu_tc.cuh. */
#ifndef ZAYA_CUDA_EMU_H
#define ZAYA_CUDA_EMU_H

#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <linux/futex.h>
#include <memory>
#include <mutex>
#include <sys/syscall.h>
#include <thread>
#include <unistd.h>
#include <type_traits>
#include <vector>

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct uint2 {
    unsigned x, y;
};
struct uint4 {
    unsigned x, y, z, w;
};
struct float2 {
    float x, y;
};
struct float4 {
    float x, y, z, w;
};
struct ushort4 {
    unsigned short x, y, z, w;
};
inline uint2 make_uint2(unsigned a, unsigned b) { return uint2{a, b}; }
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return uint4{a, b, c, d}; }
inline float2 make_float2(float a, float b) { return float2{a, b}; }
inline float4 make_float4(float a, float b, float c, float d) { return float4{a, b, c, d}; }
inline ushort4 make_ushort4(unsigned short a, unsigned short b, unsigned short c, unsigned short d) {
    return ushort4{a, b, c, d};
}
inline unsigned __float_as_uint(float f) {
    unsigned u;
    std::memcpy(&u, &f, 4);
    return u;
}
inline float __uint_as_float(unsigned u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
/* The round-to-nearest intrinsics: one IEEE operation each (ISO C++ mode does not contract a * b + c into an FMA). */
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline long min(long a, long b) { return a < b ? a : b; }
inline long max(long a, long b) { return a > b ? a : b; }

inline thread_local dim3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) alignas(n)
#ifndef GPU_WARP
#define GPU_WARP 32 /* -DGPU_WARP=64: an AMD wavefront, as a HIP build has */
#endif
#define GK_LAUNCH_CHECK() ((void)0)
typedef void *GkStream;
typedef void *gpuStream_t;
typedef int gpuError_t;
#define gpuSuccess 0
inline gpuError_t gpuGetLastError() { return gpuSuccess; }
#define gpuFuncAttributeMaxDynamicSharedMemorySize 0
inline gpuError_t gpuFuncSetAttribute(const void *, int, int) { return gpuSuccess; }

namespace emu {
/* A barrier of n threads (arrive_and_drop: arrives and leaves for good, as a thread that has returned). Its own
 * atomics carry the order (the arrivals' acquire-release adds on one word, then the completing thread's release of the
 * phase, which the waiters acquire) and a raw futex only puts waiters to sleep. Not std::barrier: libstdc++'s atomic
 * waits share a process-wide table of counters whose read-modify-writes the thread sanitizer takes as synchronisation
 * between any threads that wait, which hid races between blocks (a piece combined before another block wrote it went
 * unreported); nor a mutex and condition variable, whose wake-ups queue on the mutex (the suite took twice as long). */
class Barrier {
    std::atomic<uint64_t> count_; /* expected << 32 | arrived */
    std::atomic<uint32_t> phase_{0};
    void complete(uint32_t arrived) {
        count_.fetch_sub(arrived, std::memory_order_relaxed); /* no one arrives until the phase moves */
        phase_.fetch_add(1, std::memory_order_release);
        syscall(SYS_futex, reinterpret_cast<uint32_t *>(&phase_), FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0);
    }

  public:
    explicit Barrier(unsigned n) : count_((uint64_t)n << 32) {}
    void arrive_and_wait() {
        const uint32_t phase = phase_.load(std::memory_order_acquire);
        const uint64_t now = count_.fetch_add(1, std::memory_order_acq_rel) + 1;
        if ((uint32_t)now == (uint32_t)(now >> 32)) return complete((uint32_t)now);
        while (phase_.load(std::memory_order_acquire) == phase)
            syscall(SYS_futex, reinterpret_cast<uint32_t *>(&phase_), FUTEX_WAIT_PRIVATE, phase, nullptr, nullptr, 0);
    }
    void arrive_and_drop() {
        const uint64_t was = count_.fetch_sub((uint64_t)1 << 32, std::memory_order_acq_rel);
        const uint32_t arrived = (uint32_t)was, expected = (uint32_t)(was >> 32) - 1;
        if (arrived > 0 && arrived == expected) complete(arrived);
    }
};

struct Warp {
    std::unique_ptr<Barrier> bar;
    double xchg[GPU_WARP];  /* shuffles */
    float a[256], b[256];   /* mma_sync's operands, gathered from the lanes */
};
/* One block's barrier, warps and dynamic shared memory; each thread points at its own block's. */
struct Block {
    std::unique_ptr<Barrier> bar;
    std::vector<std::unique_ptr<Warp>> warps;
    std::vector<unsigned char> smem_buf;
    unsigned char *smem = nullptr;
};
inline thread_local Block *block;
/* gk_grid_sync's wait between polls of its word: let the other blocks' threads run; a wait past ten minutes (a
 * block that never arrives) is reported and aborts, as the device's trap fails the launch. */
inline void grid_poll(unsigned polls) {
    static thread_local std::chrono::steady_clock::time_point since;
    if (polls == 0) since = std::chrono::steady_clock::now();
    std::this_thread::yield();
    if (polls % 4096 == 4095 && std::chrono::steady_clock::now() - since > std::chrono::minutes(10)) {
        std::fprintf(stderr, "cuda_emu: gk_grid_sync waited ten minutes in block (%u, %u, %u)\n", blockIdx.x,
                     blockIdx.y, blockIdx.z);
        std::abort();
    }
}

/* GK_LAUNCH_PDL's kernels must call gk_pdl_enter() (gpu_common.cuh) on every thread: set there, checked after. */
inline thread_local bool pdl_entered;
inline void pdl_check() {
    if (pdl_entered) return;
    std::fprintf(stderr, "cuda_emu: a kernel launched through GK_LAUNCH_PDL returned on thread (%u, %u, %u) of block "
                         "(%u, %u, %u) without calling gk_pdl_enter()\n",
                 threadIdx.x, threadIdx.y, threadIdx.z, blockIdx.x, blockIdx.y, blockIdx.z);
    std::abort();
}

inline unsigned flat_tid() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }
inline Warp &my_warp() { return *block->warps[flat_tid() / GPU_WARP]; }

/* A block of nt threads with smem bytes of dynamic shared memory, 128-byte aligned, filled with a NaN pattern. */
inline std::unique_ptr<Block> make_block(unsigned nt, size_t smem) {
    std::unique_ptr<Block> b(new Block());
    b->bar.reset(new Barrier(nt));
    for (unsigned w = 0; w < (nt + GPU_WARP - 1) / GPU_WARP; w++) {
        const unsigned n = nt - w * GPU_WARP < GPU_WARP ? nt - w * GPU_WARP : GPU_WARP;
        b->warps.emplace_back(new Warp());
        b->warps.back()->bar.reset(new Barrier(n));
    }
    b->smem_buf.assign(smem + 128, 0xff);
    b->smem = b->smem_buf.data() + (128 - (uintptr_t)b->smem_buf.data() % 128) % 128;
    return b;
}
/* The CUDA threads' std::threads, started once and kept: run(n, job) has workers 0..n-1 run job(k) at once (a block's
 * threads must all be running to meet at its barriers) and returns when all have. Each worker waits on its own mutex
 * and condition variable, so a job wakes only its n, and the sanitizer sees the same edges a thread's start and join
 * gave (launcher to worker, worker to launcher), none between workers. */
class Pool {
    struct Worker {
        std::mutex m;
        std::condition_variable cv;
        unsigned jobs = 0; /* jobs handed to this worker so far */
        std::thread th;
    };
    std::vector<std::unique_ptr<Worker>> workers_;
    const std::function<void(unsigned)> *job_ = nullptr;
    std::mutex done_m_;
    std::condition_variable done_cv_;
    unsigned left_ = 0;
    std::atomic<bool> quit_{false};

    void work(Worker *w, unsigned k) {
        for (unsigned seen = 0;;) {
            {
                std::unique_lock<std::mutex> lock(w->m);
                w->cv.wait(lock, [&] { return w->jobs != seen || quit_; });
                if (w->jobs == seen) return; /* quit */
                seen = w->jobs;
            }
            (*job_)(k);
            std::lock_guard<std::mutex> lock(done_m_);
            if (--left_ == 0) done_cv_.notify_one();
        }
    }

  public:
    void run(unsigned n, const std::function<void(unsigned)> &job) {
        while (workers_.size() < n) {
            Worker *w = new Worker();
            const unsigned k = (unsigned)workers_.size();
            workers_.emplace_back(w);
            w->th = std::thread([this, w, k] { work(w, k); });
        }
        if (n == 0) return;
        job_ = &job;
        left_ = n; /* no worker is running a job now: none touches it */
        for (unsigned k = 0; k < n; k++) {
            std::lock_guard<std::mutex> lock(workers_[k]->m);
            workers_[k]->jobs++;
            workers_[k]->cv.notify_one();
        }
        std::unique_lock<std::mutex> lock(done_m_);
        done_cv_.wait(lock, [&] { return left_ == 0; });
    }
    ~Pool() {
        quit_ = true;
        for (auto &w : workers_) {
            std::lock_guard<std::mutex> lock(w->m);
            w->cv.notify_one();
        }
        for (auto &w : workers_) w->th.join();
    }
};
inline Pool &pool() {
    static Pool p;
    return p;
}

/* Blocks blks (their ids in ids) of bdim threads each, all at once on the pool, running fn. */
inline void run_blocks(const std::vector<Block *> &blks, const std::vector<dim3> &ids, dim3 bdim,
                       const std::function<void()> &fn) {
    const unsigned nt = bdim.x * bdim.y * bdim.z;
    pool().run(nt * (unsigned)blks.size(), [&](unsigned k) {
        const unsigned b = k / nt, t = k % nt;
        threadIdx = dim3(t % bdim.x, t / bdim.x % bdim.y, t / (bdim.x * bdim.y));
        blockIdx = ids[b];
        block = blks[b];
        fn();
        blks[b]->warps[t / GPU_WARP]->bar->arrive_and_drop();
        blks[b]->bar->arrive_and_drop();
    });
}

/* Runs fn as grid x block threads: each block's threads at once, the blocks in order (x fastest); smem bytes of
 * dynamic shared memory a block (GK_DYNAMIC_SMEM). */
inline void launch(dim3 grid, dim3 bdim, size_t smem, const std::function<void()> &fn) {
    gridDim = grid, blockDim = bdim;
    for (unsigned bz = 0; bz < grid.z; bz++)
        for (unsigned by = 0; by < grid.y; by++)
            for (unsigned bx = 0; bx < grid.x; bx++) {
                std::unique_ptr<Block> blk = make_block(bdim.x * bdim.y * bdim.z, smem);
                run_blocks({blk.get()}, {dim3(bx, by, bz)}, bdim, fn);
            }
}

/* A cooperative launch (GK_LAUNCH_COOPERATIVE): every block's threads at once (gk_grid_sync's own atomics make the
 * grid barrier). Static __shared__ storage is one copy for all blocks here: such kernels keep theirs in dynamic shared memory. */
inline void launch_cooperative(dim3 grid, dim3 bdim, size_t smem, const std::function<void()> &fn) {
    gridDim = grid, blockDim = bdim;
    const unsigned nt = bdim.x * bdim.y * bdim.z;
    std::vector<std::unique_ptr<Block>> blocks;
    std::vector<Block *> blks;
    std::vector<dim3> ids;
    for (unsigned bz = 0; bz < grid.z; bz++)
        for (unsigned by = 0; by < grid.y; by++)
            for (unsigned bx = 0; bx < grid.x; bx++) {
                blocks.push_back(make_block(nt, smem));
                blks.push_back(blocks.back().get());
                ids.push_back(dim3(bx, by, bz));
            }
    run_blocks(blks, ids, bdim, fn);
}
} // namespace emu

#define GK_DYNAMIC_SMEM(name) unsigned char *name = emu::block->smem
#define GK_DYNAMIC_SMEM_T(T, name) T *name = reinterpret_cast<T *>(emu::block->smem)
#define GK_LAUNCH(kern, grid, block, smem, stream, ...)                                                        \
    ((void)(stream), emu::launch(grid, block, smem, [&] { kern(__VA_ARGS__); }))

/* Programmatic dependent launch has nothing to overlap here (one kernel at a time): a launch that checks every thread
 * passed gk_pdl_enter(). */
#define GK_LAUNCH_PDL(kern, grid, block, smem, stream, ...)                                                    \
    ((void)(stream), emu::launch(grid, block, smem, [&] {                                                     \
         emu::pdl_entered = false;                                                                            \
         kern(__VA_ARGS__);                                                                                   \
         emu::pdl_check();                                                                                    \
     }))

#define GK_LAUNCH_COOPERATIVE(kern, grid, block, smem, stream, ...)                                                \
    ((void)(stream), emu::launch_cooperative(grid, block, smem, [&] { kern(__VA_ARGS__); }), 0)

inline void __syncthreads() { emu::block->bar->arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu::my_warp().bar->arrive_and_wait(); }
template <class T>
inline T __shfl_xor_sync(unsigned, T v, int o) {
    static_assert(sizeof(T) <= sizeof(double), "shuffle of a wide type");
    emu::Warp &w = emu::my_warp();
    const unsigned lane = emu::flat_tid() % GPU_WARP;
    std::memcpy(&w.xchg[lane], &v, sizeof v);
    w.bar->arrive_and_wait();
    T r;
    std::memcpy(&r, &w.xchg[(lane ^ (unsigned)o) % GPU_WARP], sizeof r);
    w.bar->arrive_and_wait(); /* the exchange may be reused */
    return r;
}

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
inline float to_float(bf16 v) { return __uint_as_float((uint32_t)v.bits << 16); }

constexpr int NE = 256 / GPU_WARP; /* elements a lane holds */
/* Where element i of lane L sits in the 16 x 16 tile (r * 16 + c): a fixed permutation per fragment kind. */
template <class Use>
inline int pos(unsigned lane, int i) {
    static const std::vector<int> perm = [] {
        std::vector<int> p(256);
        uint64_t s = std::is_same<Use, matrix_a>::value ? 11 : std::is_same<Use, matrix_b>::value ? 23 : 37;
        for (int k = 0; k < 256; k++) p[k] = k;
        for (int k = 255; k > 0; k--) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            const int j = (int)((s >> 33) % (uint64_t)(k + 1));
            std::swap(p[k], p[j]);
        }
        return p;
    }();
    return perm[lane * NE + i];
}

template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
    static constexpr int num_elements = NE;
    float x[NE];
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
    const unsigned lane = emu::flat_tid() % GPU_WARP;
    for (int i = 0; i < NE; i++) {
        const int q = pos<Use>(lane, i), r = q / 16, c = q % 16;
        f.x[i] = to_float(row ? p[r * ld + c] : p[c * ld + r]);
    }
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p, unsigned ld, layout_t l) {
    check_ptr(p, ld, 4);
    const unsigned lane = emu::flat_tid() % GPU_WARP;
    for (int i = 0; i < NE; i++) {
        const int q = pos<accumulator>(lane, i), r = q / 16, c = q % 16;
        f.x[i] = l == mem_row_major ? p[r * ld + c] : p[c * ld + r];
    }
}
inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f, unsigned ld, layout_t l) {
    check_ptr(p, ld, 4);
    const unsigned lane = emu::flat_tid() % GPU_WARP;
    for (int i = 0; i < NE; i++) {
        const int q = pos<accumulator>(lane, i), r = q / 16, c = q % 16;
        (l == mem_row_major ? p[r * ld + c] : p[c * ld + r]) = f.x[i];
    }
}
template <class Use, class T, class Layout>
inline void fill_fragment(fragment<Use, 16, 16, 16, T, Layout> &f, float v) {
    for (float &x : f.x) x = v;
}
/* d = a b + c over the warp: the lanes' pieces of a and b gathered, each lane its own elements of d. */
template <class LA, class LB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d, const fragment<matrix_a, 16, 16, 16, bf16, LA> &a,
                     const fragment<matrix_b, 16, 16, 16, bf16, LB> &b,
                     const fragment<accumulator, 16, 16, 16, float> &c) {
    emu::Warp &w = emu::my_warp();
    const unsigned lane = emu::flat_tid() % GPU_WARP;
    for (int i = 0; i < NE; i++) w.a[pos<matrix_a>(lane, i)] = a.x[i], w.b[pos<matrix_b>(lane, i)] = b.x[i];
    w.bar->arrive_and_wait();
    float out[NE];
    for (int i = 0; i < NE; i++) {
        const int q = pos<accumulator>(lane, i), m = q / 16, n = q % 16;
        float s = c.x[i];
        for (int k = 0; k < 16; k++) s += w.a[m * 16 + k] * w.b[k * 16 + n];
        out[i] = s;
    }
    w.bar->arrive_and_wait(); /* the operands may be gathered again */
    std::memcpy(d.x, out, sizeof out);
}
} // namespace emu_wmma

#endif

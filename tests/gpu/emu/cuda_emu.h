/* cuda_emu: enough of CUDA to run a kernel source on the CPU (tests/gpu/emu/run.sh): a fiber per CUDA thread (kept in a
 * pool between blocks and launches), all on the launching OS thread, each running until it waits and then switching to
 * the next; blocks one after another, __syncthreads / __syncwarp as barriers, __shared__ as static storage (one block at
 * a time) and dynamic shared memory per block (a cooperative launch runs all its blocks at once, with a grid barrier),
 * warp shuffles through a per-warp exchange, and emu_wmma: a WMMA with the same calls as nvcuda::wmma whose fragments
 * are spread over the warp's lanes in a fixed pseudo-random layout (a kernel that assumes a layout gets wrong numbers),
 * mma_sync a collective of the warp, pointers and strides checked against the hardware's rules. The sanitizers take
 * each fiber as a thread, and the switches between them order nothing: a kernel that reads another lane's or thread's
 * shared-memory writes without the barrier between them races, and ThreadSanitizer reports it. Used for the
 * tensor-core sources that include gpu_tc.cuh. */
#ifndef ZAYA_CUDA_EMU_H
#define ZAYA_CUDA_EMU_H
#ifndef ZAYA_GPU_EMU
#define ZAYA_GPU_EMU 1 /* gpu_runtime.h: this runtime */
#endif

#include <atomic>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <tuple>
#include <pthread.h>
#include <sys/mman.h>
#include <type_traits>
#include <vector>

#if defined(__SANITIZE_THREAD__)
#define EMU_TSAN 1
#endif
#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN 1
#endif
#if defined(__has_feature)
#if __has_feature(thread_sanitizer) && !defined(EMU_TSAN)
#define EMU_TSAN 1
#endif
#if __has_feature(address_sanitizer) && !defined(EMU_ASAN)
#define EMU_ASAN 1
#endif
#endif
#if EMU_TSAN
#include <sanitizer/tsan_interface.h>
#endif
#if EMU_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

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
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline long min(long a, long b) { return a < b ? a : b; }
inline long max(long a, long b) { return a > b ? a : b; }

inline dim3 blockDim, gridDim;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) alignas(n)
#ifndef GPU_WARP
#define GPU_WARP 32 /* -DGPU_WARP=64: an AMD wavefront, as a HIP build has */
#endif
#define GK_LAUNCH_CHECK() ((void)0)
typedef void *GkStream;
/* The runtime's host side (emu_runtime.cpp), under the names src/gpu uses */
#include "gpu_runtime.h"

namespace emu {
struct Block;
/* A CUDA thread: a fiber with its own stack, and the values that are per thread on a GPU. All of a launch's threads
 * run on the launching OS thread, each until it waits (a barrier, a shuffle, a grid barrier's poll) or returns, then
 * the next (Pool below). A switch is a few stores and loads (emu_fiber_switch); a thread per OS thread made every
 * barrier a futex wake-up and sleep, ~85% of the suite's time. */
struct Fiber {
    void *sp = nullptr;                 /* its stack pointer while switched out */
    void *stack = nullptr;              /* the lowest usable byte (a guard page below it) */
    size_t stack_bytes = 0;
    void *tsan = nullptr;               /* the thread sanitizer's context for it */
    unsigned k = 0;                     /* its place in the pool */
    dim3 tid, bid;                      /* threadIdx, blockIdx */
    Block *block = nullptr;
    bool pdl_entered = false;           /* GK_LAUNCH_PDL's check */
};
/* The fiber running now: an atomic, as every fiber writes it when it switches and the sanitizer takes fibers as threads
 * (relaxed: it must not order one fiber's work before another's). */
inline Fiber main_fiber;
inline std::atomic<Fiber *> current{&main_fiber};
inline Fiber &self() { return *current.load(std::memory_order_relaxed); }
void yield();
void progress();

/* A barrier of n threads (arrive_and_drop: arrives and leaves for good, as a thread that has returned). Its own
 * atomics carry the order: each arrival's release add on one word, the completing thread's acquire of them and its
 * release of the phase, which each waiter acquires once it has moved; a waiter lets the other threads run until then.
 * The fibers' switches carry no order of their own, so a read of another thread's write with no barrier between is a
 * reported race. Under the thread sanitizer every acquire costs a merge of a clock as long as there are threads: the
 * waits poll relaxed and acquire once. */
class Barrier {
    std::atomic<uint64_t> count_; /* expected << 32 | arrived */
    std::atomic<uint32_t> phase_{0};
    void complete(uint32_t arrived) {
        (void)count_.load(std::memory_order_acquire); /* every arrival's release add before it */
        count_.fetch_sub(arrived, std::memory_order_relaxed); /* no one arrives until the phase moves */
        phase_.fetch_add(1, std::memory_order_release);
    }

  public:
    explicit Barrier(unsigned n) : count_((uint64_t)n << 32) {}
    void arrive_and_wait() {
        progress();
        const uint32_t phase = phase_.load(std::memory_order_relaxed);
        const uint64_t now = count_.fetch_add(1, std::memory_order_release) + 1;
        if ((uint32_t)now == (uint32_t)(now >> 32)) return complete((uint32_t)now);
        while (phase_.load(std::memory_order_relaxed) == phase) yield();
        (void)phase_.load(std::memory_order_acquire);
    }
    void arrive_and_drop() {
        progress();
        const uint64_t was = count_.fetch_sub((uint64_t)1 << 32, std::memory_order_release);
        const uint32_t arrived = (uint32_t)was, expected = (uint32_t)(was >> 32) - 1;
        if (arrived > 0 && arrived == expected) complete(arrived);
    }
};

struct Warp {
    std::unique_ptr<Barrier> bar;
    unsigned lanes = GPU_WARP; /* fewer in a block's last warp when the block is not a multiple of the warp */
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
/* gk_grid_sync's wait between polls of its word: let the other threads run (a block that never arrives is a deadlock,
 * which Pool::yield reports). */
inline void grid_poll(unsigned) { yield(); }

/* GK_LAUNCH_PDL's kernels must call gk_pdl_enter() (gpu_common.cuh) on every thread: set there, checked after. */
inline void pdl_enter() { self().pdl_entered = true; }
inline void pdl_check() {
    const Fiber &f = self();
    if (f.pdl_entered) return;
    std::fprintf(stderr, "cuda_emu: a kernel launched through GK_LAUNCH_PDL returned on thread (%u, %u, %u) of block "
                         "(%u, %u, %u) without calling gk_pdl_enter()\n",
                 f.tid.x, f.tid.y, f.tid.z, f.bid.x, f.bid.y, f.bid.z);
    std::abort();
}

inline unsigned flat_tid() {
    const dim3 &t = self().tid;
    return t.x + blockDim.x * (t.y + blockDim.y * t.z);
}
inline Warp &my_warp() { return *self().block->warps[flat_tid() / GPU_WARP]; }

/* A block of nt threads with smem bytes of dynamic shared memory, 128-byte aligned, filled with a NaN pattern. */
inline std::unique_ptr<Block> make_block(unsigned nt, size_t smem) {
    std::unique_ptr<Block> b(new Block());
    b->bar.reset(new Barrier(nt));
    for (unsigned w = 0; w < (nt + GPU_WARP - 1) / GPU_WARP; w++) {
        const unsigned n = nt - w * GPU_WARP < GPU_WARP ? nt - w * GPU_WARP : GPU_WARP;
        b->warps.emplace_back(new Warp());
        b->warps.back()->bar.reset(new Barrier(n));
        b->warps.back()->lanes = n;
    }
    b->smem_buf.assign(smem + 128, 0xff);
    b->smem = b->smem_buf.data() + (128 - (uintptr_t)b->smem_buf.data() % 128) % 128;
    return b;
}
/* The switch between two fibers: x86-64's callee-saved registers and SSE/x87 control words pushed on the old stack,
 * its pointer stored, the new one's loaded and its registers popped (a fiber's first switch returns into its entry).
 * Weak: each test is one translation unit, but two including this header must still link. */
extern "C" void emu_fiber_switch(void **save_sp, void *load_sp);
#if defined(__x86_64__)
asm(".text\n"
    ".weak emu_fiber_switch\n"
    ".type emu_fiber_switch, @function\n"
    "emu_fiber_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  subq $8, %rsp\n  stmxcsr (%rsp)\n  fnstcw 4(%rsp)\n"
    "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
    "  ldmxcsr (%rsp)\n  fldcw 4(%rsp)\n  addq $8, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size emu_fiber_switch, .-emu_fiber_switch\n");
#else
#error "cuda_emu: its fibers switch with x86-64 code (emu_fiber_switch)"
#endif

/* The CUDA threads' fibers, made once and kept (with their stacks and sanitizer contexts): run(n, job) has fibers
 * 0..n-1 run job(k) and returns when all have. A fiber runs until it waits, then switches to the next one still
 * running (a ring); the last to return switches back to the launcher. The sanitizer sees the edges a thread's start
 * and join would give (launcher to fiber through epoch_, fiber to launcher through left_), none between fibers. */
class Pool {
    static constexpr size_t stack_bytes = 1 << 20, guard_bytes = 4096;
    std::vector<std::unique_ptr<Fiber>> fibers_;
    std::unique_ptr<std::atomic<unsigned>[]> next_, prev_; /* the ring of the job's fibers still running */
    const std::function<void(unsigned)> *job_ = nullptr;
    std::atomic<unsigned> epoch_{0}; /* jobs started: released by the launcher, acquired by each fiber */
    std::atomic<unsigned> left_{0};  /* the job's fibers still running: released by each, acquired by the launcher */
    std::atomic<unsigned long> waits_{0}; /* yields since a fiber last arrived at a barrier or returned */

    static void entry();
    void switch_to(Fiber &from, Fiber &to) {
        current.store(&to, std::memory_order_relaxed);
#if EMU_TSAN
        __tsan_switch_to_fiber(to.tsan, __tsan_switch_to_fiber_no_sync);
#endif
#if EMU_ASAN
        void *fake_stack = nullptr;
        __sanitizer_start_switch_fiber(&fake_stack, to.stack, to.stack_bytes);
#endif
        emu_fiber_switch(&from.sp, to.sp);
#if EMU_ASAN
        __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#endif
    }
    void grow(unsigned n) {
        if (n <= fibers_.size()) return;
        for (unsigned k = (unsigned)fibers_.size(); k < n; k++) {
            std::unique_ptr<Fiber> f(new Fiber());
            void *m = mmap(nullptr, stack_bytes + guard_bytes, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
            if (m == MAP_FAILED || mprotect(m, guard_bytes, PROT_NONE) != 0) {
                std::fprintf(stderr, "cuda_emu: no memory for CUDA thread %u's stack\n", k);
                std::abort();
            }
            f->k = k;
            f->stack = static_cast<unsigned char *>(m) + guard_bytes;
            f->stack_bytes = stack_bytes;
            /* its first switch: the control words, six registers, then "returns" into entry, whose own return
             * address (never used) leaves the stack as a call would */
            uint64_t *sp = reinterpret_cast<uint64_t *>(((uintptr_t)f->stack + stack_bytes) & ~(uintptr_t)15);
            *--sp = 0;
            *--sp = (uint64_t)(uintptr_t)&entry;
            for (int r = 0; r < 6; r++) *--sp = 0;
            uint32_t mxcsr;
            uint16_t fcw;
            asm volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(mxcsr), "=m"(fcw));
            *--sp = (uint64_t)mxcsr | (uint64_t)fcw << 32;
            f->sp = sp;
#if EMU_TSAN
            f->tsan = __tsan_create_fiber(0);
#endif
            fibers_.push_back(std::move(f));
        }
        next_.reset(new std::atomic<unsigned>[n]);
        prev_.reset(new std::atomic<unsigned>[n]);
    }

  public:
    Pool() {
#if EMU_TSAN
        main_fiber.tsan = __tsan_get_current_fiber();
#endif
        pthread_attr_t a;
        size_t bytes = 0;
        void *lo = nullptr;
        if (pthread_getattr_np(pthread_self(), &a) == 0) {
            pthread_attr_getstack(&a, &lo, &bytes);
            pthread_attr_destroy(&a);
        }
        main_fiber.stack = lo, main_fiber.stack_bytes = bytes;
    }
    /* A waiting fiber lets the next one run. Yields with no arrival at a barrier and no return between them, more than
     * every running fiber's few, are a deadlock (a barrier some threads never reach, a block that skips a grid
     * barrier): reported, and the test aborts instead of hanging. */
    void yield() {
        Fiber &f = self();
        const unsigned long limit = 4ul * left_.load(std::memory_order_relaxed) + 64;
        if (&f == &main_fiber || waits_.fetch_add(1, std::memory_order_relaxed) > limit) {
            std::fprintf(stderr, "cuda_emu: deadlock: every running thread waits and none can go on (thread (%u, %u, "
                                 "%u) of block (%u, %u, %u) among them)\n",
                         f.tid.x, f.tid.y, f.tid.z, f.bid.x, f.bid.y, f.bid.z);
            std::abort();
        }
        switch_to(f, *fibers_[next_[f.k].load(std::memory_order_relaxed)]);
    }
    void progress() { waits_.store(0, std::memory_order_relaxed); }
    void run(unsigned n, const std::function<void(unsigned)> &job) {
        if (n == 0) return;
        if (&self() != &main_fiber) {
            std::fprintf(stderr, "cuda_emu: a launch from inside a kernel\n");
            std::abort();
        }
        grow(n);
        job_ = &job;
        for (unsigned k = 0; k < n; k++) {
            next_[k].store((k + 1) % n, std::memory_order_relaxed);
            prev_[k].store((k + n - 1) % n, std::memory_order_relaxed);
        }
        left_.store(n, std::memory_order_relaxed);
        epoch_.fetch_add(1, std::memory_order_release);
        switch_to(main_fiber, *fibers_[0]);
        (void)left_.load(std::memory_order_acquire);
    }
  private:
    /* the fiber has returned from its job: out of the ring, then on to the next (the last: back to the launcher) */
    void finish(Fiber &f) {
        progress();
        const unsigned next = next_[f.k].load(std::memory_order_relaxed);
        const unsigned prev = prev_[f.k].load(std::memory_order_relaxed);
        next_[prev].store(next, std::memory_order_relaxed);
        prev_[next].store(prev, std::memory_order_relaxed);
        Fiber *to = fibers_[next].get(); /* read before the release: the launcher may grow fibers_ after it */
        if (left_.fetch_sub(1, std::memory_order_release) == 1) to = &main_fiber;
        switch_to(f, *to);
    }
};
/* Never destroyed: its fibers stay parked in finish() until the process ends. */
inline Pool &pool() {
    static Pool *p = new Pool();
    return *p;
}
inline void Pool::entry() {
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
    Pool &p = pool();
    Fiber &f = self();
    for (;;) {
        (void)p.epoch_.load(std::memory_order_acquire);
        (*p.job_)(f.k);
        p.finish(f);
    }
}
inline void yield() { pool().yield(); }
inline void progress() { pool().progress(); }

/* Blocks blks (their ids in ids) of bdim threads each, all at once on the pool, running fn. */
inline void run_blocks(const std::vector<Block *> &blks, const std::vector<dim3> &ids, dim3 bdim,
                       const std::function<void()> &fn) {
    const unsigned nt = bdim.x * bdim.y * bdim.z;
    pool().run(nt * (unsigned)blks.size(), [&](unsigned k) {
        const unsigned b = k / nt, t = k % nt;
        Fiber &f = self();
        f.tid = dim3(t % bdim.x, t / bdim.x % bdim.y, t / (bdim.x * bdim.y));
        f.bid = ids[b];
        f.block = blks[b];
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

/* threadIdx and blockIdx: the running fiber's */
#define threadIdx (emu::self().tid)
#define blockIdx (emu::self().bid)
#define GK_DYNAMIC_SMEM(name) unsigned char *name = emu::self().block->smem
#define GK_DYNAMIC_SMEM_T(T, name) T *name = reinterpret_cast<T *>(emu::self().block->smem)
namespace emu {
/* Runs job now or, while a stream is being captured (emu_runtime.cpp), records it for the graph's launches. */
inline void submit(std::function<void()> job) {
    if (!emu_capturing()) {
        job();
        return;
    }
    emu_capture_record(
        new std::function<void()>(std::move(job)), [](void *j) { (*static_cast<std::function<void()> *>(j))(); },
        [](void *j) { delete static_cast<std::function<void()> *>(j); });
}
/* bind(kern)(args...): a kernel call with its arguments converted to the kernel's parameter types when launched, as
 * CUDA copies them then (a graph replays the values a capture saw); converted at the call, so NULL is a pointer. */
template <typename... P>
inline auto bind(void (*kern)(P...)) {
    return [kern](P... args) -> std::function<void()> {
        return [kern, t = std::tuple<std::decay_t<P>...>(args...)] { std::apply(kern, t); };
    };
}
} // namespace emu
#define GK_LAUNCH(kern, grid, block, smem, stream, ...)                                                        \
    ((void)(stream), emu::submit([k_ = emu::bind(kern)(__VA_ARGS__), g_ = dim3(grid), b_ = dim3(block),          \
                                  s_ = (size_t)(smem)] { emu::launch(g_, b_, s_, k_); }))

/* Programmatic dependent launch has nothing to overlap here (one kernel at a time): a launch that checks every thread
 * passed gk_pdl_enter(). */
#define GK_LAUNCH_PDL(kern, grid, block, smem, stream, ...)                                                    \
    ((void)(stream), emu::submit([k_ = emu::bind(kern)(__VA_ARGS__), g_ = dim3(grid), b_ = dim3(block),          \
                                  s_ = (size_t)(smem)] {                                                      \
         emu::launch(g_, b_, s_, [&] {                                                                        \
             emu::self().pdl_entered = false;                                                                 \
             k_();                                                                                            \
             emu::pdl_check();                                                                                \
         });                                                                                                  \
     }))

#define GK_LAUNCH_COOPERATIVE(kern, grid, block, smem, stream, ...)                                            \
    ((void)(stream),                                                                                          \
     emu::submit([k_ = emu::bind(kern)(__VA_ARGS__), g_ = dim3(grid), b_ = dim3(block), s_ = (size_t)(smem)] { \
         emu::launch_cooperative(g_, b_, s_, k_);                                                             \
     }),                                                                                                      \
     gpuSuccess)

inline void __syncthreads() { emu::self().block->bar->arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu::my_warp().bar->arrive_and_wait(); }
namespace emu {
/* A warp collective: each lane's v into the warp's exchange, then each lane reads what read(lane, exchange, lanes)
 * makes of the lanes' values (a barrier before and after: the exchange is reused by the next one). */
template <class T, class R>
inline auto warp_collective(T v, R read) {
    static_assert(sizeof(T) <= sizeof(double), "a warp exchange of a wide type");
    Warp &w = my_warp();
    const unsigned lane = flat_tid() % GPU_WARP;
    std::memcpy(&w.xchg[lane], &v, sizeof v);
    w.bar->arrive_and_wait();
    const auto r = read(lane, w.xchg, w.lanes);
    w.bar->arrive_and_wait();
    return r;
}
/* lane src's value (a lane past the warp's: the caller's own, as the hardware gives) */
template <class T>
inline T shuffle(T v, unsigned src) {
    return warp_collective(v, [&](unsigned lane, const double *x, unsigned lanes) {
        T r;
        std::memcpy(&r, &x[src < lanes ? src : lane], sizeof r);
        return r;
    });
}
/* bit l set where lane l's predicate is non-zero */
inline unsigned long long ballot(int p) {
    return warp_collective(p, [](unsigned, const double *x, unsigned lanes) {
        unsigned long long m = 0;
        for (unsigned l = 0; l < lanes; l++) {
            int q;
            std::memcpy(&q, &x[l], sizeof q);
            m |= (unsigned long long)(q != 0) << l;
        }
        return m;
    });
}
inline unsigned lane_id() { return flat_tid() % GPU_WARP; }
} // namespace emu

/* CUDA's warp intrinsics (the full-warp masks these kernels pass) */
template <class T>
inline T __shfl_xor_sync(unsigned, T v, int o) { return emu::shuffle(v, emu::lane_id() ^ (unsigned)o); }
template <class T>
inline T __shfl_sync(unsigned, T v, int src) { return emu::shuffle(v, (unsigned)src % GPU_WARP); }
template <class T>
inline T __shfl_up_sync(unsigned, T v, unsigned d) {
    const unsigned lane = emu::lane_id();
    return emu::shuffle(v, lane >= d ? lane - d : lane);
}
#if GPU_WARP == 32
inline unsigned __ballot_sync(unsigned, int p) { return (unsigned)emu::ballot(p); }
#endif
inline int __popc(unsigned m) { return __builtin_popcount(m); }
inline int __ffs(int m) { return __builtin_ffs(m); }
/* HIP's (a 64-bit lane mask, whatever the warp) */
template <class T>
inline T __shfl_xor(T v, int o) { return __shfl_xor_sync(~0u, v, o); }
template <class T>
inline T __shfl(T v, int src) { return __shfl_sync(~0u, v, src); }
template <class T>
inline T __shfl_up(T v, unsigned d) { return __shfl_up_sync(~0u, v, d); }
inline unsigned long long __ballot(int p) { return emu::ballot(p); }
inline int __popcll(unsigned long long m) { return __builtin_popcountll(m); }
inline int __ffsll(unsigned long long m) { return __builtin_ffsll((long long)m); }
/* Integer atomics: relaxed, as the device's (they order nothing: the sanitizer sees no edge through them). */
inline int atomicAdd(int *p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
inline unsigned atomicAdd(unsigned *p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }

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

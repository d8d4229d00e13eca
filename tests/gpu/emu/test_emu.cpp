/* The emulator's own checks (cuda_emu.h): that it runs a block's threads, a warp's shuffles and a cooperative launch's
 * grid barrier as a GPU would (the sums come out right), and that it tells what is wrong where they are misused: under
 * ThreadSanitizer a read of another thread's shared-memory write with no barrier between, of another lane's with no
 * __syncwarp, and of another block's with no grid barrier are each a reported race; and a block that skips a grid
 * barrier the others wait at is a reported deadlock, not a hang. Each misuse runs in a child process, whose report the
 * test reads. Prints "gpu-emu: N passed, N failed". */
#define ZAYA_GPU_EMU 1
#include "gpu_common.cuh"
#include "emu_check.h"

#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

static constexpr int NT = 4 * GPU_WARP; /* threads a block */

/* Each thread writes its slot, then thread 0 sums them: with the barrier between, or not. */
__global__ void block_sum_kernel(long *out, bool barrier) {
    GK_DYNAMIC_SMEM_T(long, s);
    s[threadIdx.x] = threadIdx.x + 1;
    if (barrier) __syncthreads();
    if (threadIdx.x == 0) {
        long t = 0;
        for (int i = 0; i < NT; i++) t += s[i];
        *out = t;
    }
}

/* Lane 0 writes a word the others read: after __syncwarp, or not. Then a warp sum by shuffles. */
__global__ void warp_kernel(long *out, bool sync) {
    GK_DYNAMIC_SMEM_T(long, s);
    const unsigned lane = threadIdx.x % GPU_WARP, w = threadIdx.x / GPU_WARP;
    if (lane == 0) s[w] = 1000 * (w + 1);
    if (sync) __syncwarp();
    long v = s[w] + lane;
    for (int o = GPU_WARP / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) out[w] = v;
}

/* Block b writes its word, then reads block b + 1's: across the grid barrier, or not; skip: block 1 returns before
 * it. */
__global__ void grid_kernel(long *g, long *out, unsigned *bar, bool barrier, bool skip) {
    const unsigned b = blockIdx.x, nb = gridDim.x;
    if (skip && b == 1) return;
    if (threadIdx.x == 0) g[b] = 10 * (b + 1);
    if (barrier) gk_grid_sync(bar);
    if (threadIdx.x == 0) out[b] = g[(b + 1) % nb];
}

static long block_sum(bool barrier) {
    long out = 0;
    GK_LAUNCH(block_sum_kernel, dim3(1), dim3(NT), NT * sizeof(long), nullptr, &out, barrier);
    return out;
}
static std::vector<long> warp_sums(bool sync) {
    std::vector<long> out(NT / GPU_WARP);
    GK_LAUNCH(warp_kernel, dim3(1), dim3(NT), NT / GPU_WARP * sizeof(long), nullptr, out.data(), sync);
    return out;
}
static std::vector<long> grid_pass(unsigned blocks, bool barrier, bool skip) {
    std::vector<long> g(blocks, -1), out(blocks, -1);
    unsigned bar = 0;
    (void)GK_LAUNCH_COOPERATIVE(grid_kernel, dim3(blocks), dim3(NT), 0, nullptr, g.data(), out.data(), &bar, barrier,
                                skip);
    return out;
}

/* Runs what in a child process; true if its standard error says want (the sanitizer's report; a race fails the run
 * only with halt_on_error, which run.sh sets). */
template <class F> static bool child_reports(F what, const char *want) {
    char path[] = "/tmp/emu_child_XXXXXX";
    const int fd = mkstemp(path);
    if (fd < 0) return false;
    std::fflush(nullptr);
    const pid_t pid = fork();
    if (pid == 0) {
        dup2(fd, 2);
        what();
        std::fflush(nullptr);
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    std::string err;
    char buf[4096];
    ssize_t n;
    lseek(fd, 0, SEEK_SET);
    while ((n = read(fd, buf, sizeof buf)) > 0) err.append(buf, (size_t)n);
    close(fd);
    unlink(path);
    return err.find(want) != std::string::npos;
}

int main() {
    report(block_sum(true) == (long)NT * (NT + 1) / 2, "a block's threads meet at __syncthreads: the sum is right");
    bool warps_ok = true;
    const std::vector<long> ws = warp_sums(true);
    for (size_t w = 0; w < ws.size(); w++)
        warps_ok &= ws[w] == 1000 * (long)(w + 1) * GPU_WARP + (long)GPU_WARP * (GPU_WARP - 1) / 2;
    report(warps_ok, "each warp's shuffles sum its lanes");
    for (unsigned blocks : {1u, 2u, 5u}) {
        const std::vector<long> out = grid_pass(blocks, true, false);
        bool ok = true;
        for (unsigned b = 0; b < blocks; b++) ok &= out[b] == 10 * (long)((b + 1) % blocks + 1);
        report(ok, ("a cooperative launch of " + std::to_string(blocks) + " blocks: each reads its neighbour's word "
                    "across the grid barrier")
                       .c_str());
    }
    report(child_reports([] { grid_pass(3, true, true); }, "cuda_emu: deadlock"),
           "a block that skips the grid barrier: a reported deadlock, not a hang");
#if EMU_TSAN
    const char *race = "ThreadSanitizer: data race";
    report(child_reports([] { block_sum(false); }, race), "no __syncthreads between a write and another thread's read: "
                                                          "a reported race");
    report(child_reports([] { warp_sums(false); }, race), "no __syncwarp between lane 0's write and the others' reads: "
                                                          "a reported race");
    report(child_reports([] { grid_pass(3, false, false); }, race), "no grid barrier between a block's write and "
                                                                    "another block's read: a reported race");
#endif
    std::printf("gpu-emu: %d passed, %d failed (the emulator itself, warp of %d lanes)\n", emu_passed(), emu_failed(),
                GPU_WARP);
    return emu_failed() != 0;
}

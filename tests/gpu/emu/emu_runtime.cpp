/* The CUDA runtime's host API on the CPU (cuda_runtime_api.h): device memory is host memory kept in a table of
 * allocations, so that a copy is checked against the kinds it claims (a host-to-device copy must land inside one
 * allocation) and a free of something never allocated is an error; work runs when it is queued. A stream capture
 * records what is queued, kernel launches (cuda_emu.h) and copies alike, and a graph launch replays it in order. The
 * rules a GPU enforces during a capture are enforced: no waits, no synchronous copies or allocations, no copies to or
 * from pageable host memory (only cudaMallocHost's). */
#include "cuda_runtime_api.h"
#include "cuda.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

namespace {

constexpr size_t kTotalBytes = size_t(16) << 30; /* what the emulated device says it has */

struct Alloc {
    size_t bytes;
    bool pinned;   /* cudaMallocHost: host memory a copy may use during a capture */
    bool reserved; /* cuMemAddressReserve: address space, readable only where cuMemMap mapped a piece */
};

struct Node {
    cudaGraphNodeType type;
    void *job;
    void (*run)(void *);
    void (*drop)(void *);
};

std::mutex mu;                        /* the table (a server's engine thread and the main thread both allocate) */
std::map<const char *, Alloc> allocs; /* by start address */
size_t in_use;
cudaError_t last_error = cudaSuccess;

/* The capture in progress (one at a time, as zaya takes them) and its stream. */
bool capturing, capture_broken;
cudaStream_t capture_stream;
std::vector<Node> capture_nodes;

cudaError_t fail(cudaError_t e) {
    last_error = e;
    return e;
}

/* The allocation holding [p, p + n) (NULL: none does). */
const Alloc *holding(const void *p, size_t n) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = allocs.upper_bound(static_cast<const char *>(p));
    if (it == allocs.begin()) return nullptr;
    --it;
    const char *c = static_cast<const char *>(p);
    return c >= it->first && c + n <= it->first + it->second.bytes ? &it->second : nullptr;
}

/* A copy's endpoints against its kind: device ends inside a device allocation, host ends outside any (or pinned). */
bool copy_ok(void *dst, const void *src, size_t n, cudaMemcpyKind kind, bool need_pinned) {
    const bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    const bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    const Alloc *d = holding(dst, n), *s = holding(src, n);
    if (dst_dev ? !d || d->pinned : d && !d->pinned) return false;
    if (src_dev ? !s || s->pinned : s && !s->pinned) return false;
    if (need_pinned && ((!dst_dev && !d) || (!src_dev && !s))) return false;
    return true;
}

struct Copy {
    void *dst;
    const void *src;
    size_t n;
};
struct Set {
    void *p;
    int value;
    size_t n;
};

void record(cudaGraphNodeType type, void *job, void (*run)(void *), void (*drop)(void *)) {
    capture_nodes.push_back(Node{type, job, run, drop});
}

/* A wait, or a call that implies one, while capturing: refused, and the capture is broken (as CUDA does). */
bool refuse_in_capture() {
    if (!capturing) return false;
    capture_broken = true;
    fail(cudaErrorStreamCaptureUnsupported);
    return true;
}

} // namespace

struct EmuEvent {
    std::chrono::steady_clock::time_point at;
};
struct EmuGraphNode {
    Node node;
};
struct EmuGraph {
    std::vector<EmuGraphNode> nodes;
};

extern "C" {

const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument (cuda_emu)";
    case cudaErrorMemoryAllocation: return "out of memory (cuda_emu)";
    case cudaErrorInsufficientDriver: return "insufficient driver (cuda_emu)";
    case cudaErrorNoDevice: return "no CUDA-capable device (cuda_emu)";
    case cudaErrorInvalidDevice: return "invalid device ordinal (cuda_emu)";
    case cudaErrorNotReady: return "device not ready (cuda_emu)";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing (cuda_emu)";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture (cuda_emu)";
    case cudaErrorStreamCaptureUnmatched: return "capture was not initiated in this stream (cuda_emu)";
    case cudaErrorStreamCaptureImplicit: return "operation would make the legacy stream depend on a capturing "
                                                "blocking stream (cuda_emu)";
    }
    return "unknown error (cuda_emu)";
}

cudaError_t cudaGetLastError(void) {
    const cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

cudaError_t cudaGetDeviceCount(int *count) {
    *count = 1;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
    if (device != 0) return fail(cudaErrorInvalidDevice);
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int *device) {
    *device = 0;
    return cudaSuccess;
}

/* An H100/H200's compute capability (9.0), so that Hopper's paths (programmatic launch) are the ones emulated; few
 * SMs, so that a persistent kernel's grid (a block an SM) stays small. */
static const int kSMs = 8, kMajor = 9, kMinor = 0;

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
    if (device != 0) return fail(cudaErrorInvalidDevice);
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "cuda_emu (the CPU emulating a GPU)");
    memcpy(prop->uuid.bytes, "cuda_emu-device0", 16);
    prop->totalGlobalMem = kTotalBytes;
    prop->multiProcessorCount = kSMs;
    prop->major = kMajor, prop->minor = kMinor;
    return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int device) {
    if (device != 0) return fail(cudaErrorInvalidDevice);
    switch (attr) {
    case cudaDevAttrMultiProcessorCount: *value = kSMs; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor: *value = kMajor; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor: *value = kMinor; return cudaSuccess;
    }
    return fail(cudaErrorInvalidValue);
}
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, const void *, int, size_t) {
    *blocks = 1;
    return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void *, cudaFuncAttribute, int) { return cudaSuccess; }
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    std::lock_guard<std::mutex> lock(mu);
    *total_bytes = kTotalBytes;
    *free_bytes = in_use < kTotalBytes ? kTotalBytes - in_use : 0;
    return cudaSuccess;
}

static cudaError_t allocate(void **p, size_t bytes, bool pinned) {
    *p = nullptr;
    if (refuse_in_capture()) return cudaErrorStreamCaptureUnsupported;
    {
        std::lock_guard<std::mutex> lock(mu);
        if (!pinned && bytes > kTotalBytes - in_use) return fail(cudaErrorMemoryAllocation);
    }
    const size_t rounded = (bytes + 255) / 256 * 256;
    void *m = aligned_alloc(256, rounded ? rounded : 256);
    if (!m) return fail(cudaErrorMemoryAllocation);
    memset(m, 0xa5, rounded ? rounded : 256); /* not zero: code that assumes fresh memory is zero shows */
    std::lock_guard<std::mutex> lock(mu);
    allocs[static_cast<const char *>(m)] = Alloc{bytes ? bytes : 1, pinned, false};
    if (!pinned) in_use += bytes;
    *p = m;
    return cudaSuccess;
}
static cudaError_t release(void *p, bool pinned) {
    if (!p) return cudaSuccess;
    if (refuse_in_capture()) return cudaErrorStreamCaptureUnsupported;
    std::lock_guard<std::mutex> lock(mu);
    auto it = allocs.find(static_cast<const char *>(p));
    if (it == allocs.end() || it->second.pinned != pinned || it->second.reserved) {
        fprintf(stderr, "cuda_emu: %s of %p, which %s did not return\n", pinned ? "cudaFreeHost" : "cudaFree", p,
                pinned ? "cudaMallocHost" : "cudaMalloc");
        abort();
    }
    if (!pinned) in_use -= it->second.bytes;
    allocs.erase(it);
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMalloc(void **p, size_t bytes) { return allocate(p, bytes, false); }
cudaError_t cudaFree(void *p) { return release(p, false); }
cudaError_t cudaMallocHost(void **p, size_t bytes) { return allocate(p, bytes, true); }
cudaError_t cudaFreeHost(void *p) { return release(p, true); }

static void run_set(void *j) {
    const Set *s = static_cast<const Set *>(j);
    memset(s->p, s->value, s->n);
}
static void run_copy(void *j) {
    const Copy *c = static_cast<const Copy *>(j);
    memmove(c->dst, c->src, c->n);
}
static void drop_set(void *j) { delete static_cast<Set *>(j); }
static void drop_copy(void *j) { delete static_cast<Copy *>(j); }

cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t) {
    if (!bytes) return cudaSuccess;
    if (!holding(p, bytes)) return fail(cudaErrorInvalidValue);
    if (capturing) {
        record(cudaGraphNodeTypeMemset, new Set{p, value, bytes}, run_set, drop_set);
        return cudaSuccess;
    }
    memset(p, value, bytes);
    return cudaSuccess;
}
cudaError_t cudaMemset(void *p, int value, size_t bytes) {
    if (refuse_in_capture()) return cudaErrorStreamCaptureImplicit;
    return cudaMemsetAsync(p, value, bytes, nullptr);
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, cudaStream_t) {
    if (!bytes) return cudaSuccess;
    if (!copy_ok(dst, src, bytes, kind, capturing)) {
        if (capturing) capture_broken = true;
        return fail(capturing ? cudaErrorStreamCaptureUnsupported : cudaErrorInvalidValue);
    }
    if (capturing) {
        record(cudaGraphNodeTypeMemcpy, new Copy{dst, src, bytes}, run_copy, drop_copy);
        return cudaSuccess;
    }
    memmove(dst, src, bytes);
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
    if (refuse_in_capture()) return cudaErrorStreamCaptureImplicit;
    return cudaMemcpyAsync(dst, src, bytes, kind, nullptr);
}

static char stream_tokens[64];
static int streams;
cudaError_t cudaStreamCreate(cudaStream_t *s) {
    *s = &stream_tokens[streams++ % 64];
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t) {
    return refuse_in_capture() ? cudaErrorStreamCaptureUnsupported : cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t) {
    return refuse_in_capture() ? cudaErrorStreamCaptureUnsupported : cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
    return refuse_in_capture() ? cudaErrorStreamCaptureUnsupported : cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *e) {
    *e = new EmuEvent{};
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) {
    if (refuse_in_capture()) return cudaErrorStreamCaptureUnsupported; /* zaya times nothing inside a graph */
    e->at = std::chrono::steady_clock::now();
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t) {
    return refuse_in_capture() ? cudaErrorStreamCaptureUnsupported : cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    *ms = std::chrono::duration<float, std::milli>(end->at - start->at).count();
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    delete e;
    return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode) {
    if (capturing) return fail(cudaErrorStreamCaptureUnsupported);
    capturing = true, capture_broken = false, capture_stream = s;
    capture_nodes.clear();
    return cudaSuccess;
}
static void drop_nodes(std::vector<EmuGraphNode> &nodes) {
    for (EmuGraphNode &n : nodes) n.node.drop(n.node.job);
    nodes.clear();
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph) {
    *graph = nullptr;
    if (!capturing || s != capture_stream) return fail(cudaErrorStreamCaptureUnmatched);
    capturing = false;
    EmuGraph *g = new EmuGraph;
    for (const Node &n : capture_nodes) g->nodes.push_back(EmuGraphNode{n});
    capture_nodes.clear();
    if (capture_broken) {
        drop_nodes(g->nodes);
        delete g;
        return fail(cudaErrorStreamCaptureInvalidated);
    }
    *graph = g;
    return cudaSuccess;
}
/* The executable is a copy of the graph: the graph may be destroyed after instantiation, as zaya does. Jobs are
 * shared by moving them into the executable (the graph keeps none). */
cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long) {
    EmuGraph *x = new EmuGraph;
    x->nodes.swap(graph->nodes);
    *exec = x;
    return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
    if (graph) drop_nodes(graph->nodes);
    delete graph;
    return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) { return cudaGraphDestroy(exec); }
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t) {
    if (capturing) return fail(cudaErrorStreamCaptureUnsupported);
    for (EmuGraphNode &n : exec->nodes) n.node.run(n.node.job);
    return cudaSuccess;
}
cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t *nodes, size_t *count) {
    if (nodes)
        for (size_t i = 0; i < *count && i < graph->nodes.size(); i++) nodes[i] = &graph->nodes[i];
    *count = graph->nodes.size();
    return cudaSuccess;
}
cudaError_t cudaGraphNodeGetType(cudaGraphNode_t node, cudaGraphNodeType *type) {
    *type = node->node.type;
    return cudaSuccess;
}

int emu_capturing(void) { return capturing; }
void emu_capture_record(void *job, void (*run)(void *), void (*drop)(void *)) {
    record(cudaGraphNodeTypeKernel, job, run, drop);
}

} // extern "C"

/* ---- the driver's virtual memory management (cuda.h) ---- */

namespace {
/* A page, not CUDA's 2 MiB: the tests' small models then have matrices whose fp32 room is left unmapped (a lean
 * arena's), so a kernel reading one stops here; zaya's code takes whatever granularity the driver reports. */
constexpr size_t kGranularity = 4096;
/* The reservations, for the fault handler (read without a lock: a fixed table, written before its range is used). */
constexpr int kMaxReserved = 64;
struct Reserved {
    const char *base;
    size_t bytes;
};
Reserved reserved_ranges[kMaxReserved];
struct sigaction previous_segv;
bool handler_installed;

void on_segv(int sig, siginfo_t *info, void *ctx) {
    const char *at = static_cast<const char *>(info->si_addr);
    for (int i = 0; i < kMaxReserved; i++) {
        const Reserved r = reserved_ranges[i];
        if (r.base && at >= r.base && at < r.base + r.bytes) {
            char msg[200];
            const int n = snprintf(msg, sizeof msg, "cuda_emu: an access to %p, byte %zu of a sparse range where nothing "
                                   "is mapped (an illegal address on a GPU: gpu_sparse_commit)\n", info->si_addr,
                                   (size_t)(at - r.base));
            if (n > 0) (void)!write(2, msg, (size_t)n);
            abort();
        }
    }
    /* not ours: the fault again, under the handler that was there before */
    sigaction(SIGSEGV, &previous_segv, nullptr);
    (void)sig, (void)ctx;
}

struct Piece {
    size_t bytes;
};
} // namespace

extern "C" {

cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn, unsigned int, unsigned long long,
                                             cudaDriverEntryPointQueryResult *status) {
    static const struct {
        const char *name;
        void *fn;
    } table[] = {{"cuMemAddressReserve", (void *)cuMemAddressReserve}, {"cuMemAddressFree", (void *)cuMemAddressFree},
                 {"cuMemCreate", (void *)cuMemCreate},                  {"cuMemRelease", (void *)cuMemRelease},
                 {"cuMemMap", (void *)cuMemMap},                        {"cuMemUnmap", (void *)cuMemUnmap},
                 {"cuMemSetAccess", (void *)cuMemSetAccess},
                 {"cuMemGetAllocationGranularity", (void *)cuMemGetAllocationGranularity}};
    *fn = nullptr;
    for (const auto &t : table)
        if (!strcmp(t.name, symbol)) *fn = t.fn;
    if (status) *status = *fn ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
    return cudaSuccess;
}

CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *, CUmemAllocationGranularity_flags) {
    *granularity = kGranularity;
    return CUDA_SUCCESS;
}

CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t, CUdeviceptr, unsigned long long) {
    *ptr = 0;
    if (!size || size % kGranularity) return CUDA_ERROR_INVALID_VALUE;
    void *m = mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    std::lock_guard<std::mutex> lock(mu);
    int slot = -1;
    for (int i = 0; i < kMaxReserved && slot < 0; i++)
        if (!reserved_ranges[i].base) slot = i;
    if (slot < 0) {
        munmap(m, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    reserved_ranges[slot] = Reserved{static_cast<const char *>(m), size};
    if (!handler_installed) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_segv;
        sa.sa_flags = SA_SIGINFO;
        sigaction(SIGSEGV, &sa, &previous_segv);
        handler_installed = true;
    }
    allocs[static_cast<const char *>(m)] = Alloc{size, false, true};
    *ptr = (CUdeviceptr)(uintptr_t)m;
    return CUDA_SUCCESS;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    const char *p = (const char *)(uintptr_t)ptr;
    std::lock_guard<std::mutex> lock(mu);
    auto it = allocs.find(p);
    if (it == allocs.end() || !it->second.reserved || it->second.bytes != size) {
        fprintf(stderr, "cuda_emu: cuMemAddressFree of %p (%zu bytes), which cuMemAddressReserve did not return\n", p,
                size);
        abort();
    }
    allocs.erase(it);
    for (auto &r : reserved_ranges)
        if (r.base == p) r = Reserved{nullptr, 0};
    munmap(const_cast<char *>(p), size);
    return CUDA_SUCCESS;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *, unsigned long long) {
    *handle = 0;
    if (!size || size % kGranularity) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lock(mu);
    if (size > kTotalBytes - in_use) return CUDA_ERROR_OUT_OF_MEMORY;
    in_use += size;
    *handle = (CUmemGenericAllocationHandle)(uintptr_t) new Piece{size};
    return CUDA_SUCCESS;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    Piece *p = (Piece *)(uintptr_t)handle;
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lock(mu);
    in_use -= p->bytes;
    delete p;
    return CUDA_SUCCESS;
}

/* A piece must lie inside one reservation, at the granularity, and match its handle's size (zaya maps whole pieces). */
static bool inside_reservation(CUdeviceptr ptr, size_t size) {
    const Alloc *a = holding((const void *)(uintptr_t)ptr, size);
    return a && a->reserved && ptr % kGranularity == 0 && size % kGranularity == 0;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle, unsigned long long) {
    const Piece *p = (const Piece *)(uintptr_t)handle;
    if (!p || offset || p->bytes != size || !inside_reservation(ptr, size)) return CUDA_ERROR_INVALID_VALUE;
    void *at = (void *)(uintptr_t)ptr;
    if (mprotect(at, size, PROT_READ | PROT_WRITE)) return CUDA_ERROR_INVALID_VALUE;
    memset(at, 0xa5, size); /* fresh memory is not zero */
    return CUDA_SUCCESS;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    if (!inside_reservation(ptr, size)) return CUDA_ERROR_INVALID_VALUE;
    void *at = (void *)(uintptr_t)ptr;
    madvise(at, size, MADV_DONTNEED);
    return mprotect(at, size, PROT_NONE) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
    return desc && count == 1 && inside_reservation(ptr, size) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

} // extern "C"

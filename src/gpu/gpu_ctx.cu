/* gpu_ctx: device selection, the stream, memory, and matrix products through cuBLASLt (gpu.h). */
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef ZAYA_HIP
#include <hipblaslt/hipblaslt.h>
#define cublasLtHandle_t hipblasLtHandle_t
#define cublasLtCreate hipblasLtCreate
#define cublasLtDestroy hipblasLtDestroy
#define cublasLtMatmulDesc_t hipblasLtMatmulDesc_t
#define cublasLtMatmulDescCreate hipblasLtMatmulDescCreate
#define cublasLtMatmulDescDestroy hipblasLtMatmulDescDestroy
#define cublasLtMatmulDescSetAttribute hipblasLtMatmulDescSetAttribute
#define cublasLtMatrixLayout_t hipblasLtMatrixLayout_t
#define cublasLtMatrixLayoutCreate hipblasLtMatrixLayoutCreate
#define cublasLtMatrixLayoutDestroy hipblasLtMatrixLayoutDestroy
#define cublasLtMatrixLayoutSetAttribute hipblasLtMatrixLayoutSetAttribute
#define CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT HIPBLASLT_MATRIX_LAYOUT_BATCH_COUNT
#define CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET HIPBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET
#define cublasLtMatmulPreference_t hipblasLtMatmulPreference_t
#define cublasLtMatmulPreferenceCreate hipblasLtMatmulPreferenceCreate
#define cublasLtMatmulPreferenceDestroy hipblasLtMatmulPreferenceDestroy
#define cublasLtMatmulPreferenceSetAttribute hipblasLtMatmulPreferenceSetAttribute
#define cublasLtMatmulHeuristicResult_t hipblasLtMatmulHeuristicResult_t
#define cublasLtMatmulAlgoGetHeuristic hipblasLtMatmulAlgoGetHeuristic
#define cublasLtMatmulAlgoCheck hipblasLtMatmulAlgoCheck
#define cublasLtMatmul hipblasLtMatmul
#define cublasStatus_t hipblasStatus_t
#define CUBLAS_STATUS_SUCCESS HIPBLAS_STATUS_SUCCESS
#define CUBLAS_COMPUTE_32F HIPBLAS_COMPUTE_32F
#define CUBLAS_OP_N HIPBLAS_OP_N
#define CUBLAS_OP_T HIPBLAS_OP_T
#define CUBLASLT_MATMUL_DESC_TRANSA HIPBLASLT_MATMUL_DESC_TRANSA
#define CUBLASLT_MATMUL_DESC_TRANSB HIPBLASLT_MATMUL_DESC_TRANSB
#define CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES HIPBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES
#define CUDA_R_32F HIP_R_32F
#define CUDA_R_16BF HIP_R_16BF
typedef hipblasOperation_t cublasOperation_t;
typedef hipDataType cudaDataType_t;
#else
#include <cublasLt.h>
/* the driver API's types for the sparse ranges (its functions come from cudaGetDriverEntryPointByVersion); the
 * emulator's own cuda.h where it builds this file */
#include <cuda.h>
#endif

#include "gpu_common.cuh"

extern "C" {
#include "gpu.h"
}

#define LT_WORKSPACE_BYTES (32u << 20) /* what cuBLASLt's Hopper kernels ask for at most */

static int fail_rt(ZyErr *err, gpuError_t e, const char *what) {
    return zy_fail(err, "GPU: %s: %s", what, gpuGetErrorString(e));
}

/* One cached product shape: descriptors and the algorithm cuBLASLt's heuristic picked (picking costs more than a
 * small product, and a step repeats the same few dozen shapes). batch 1: a single product (strides unused, no batch
 * attributes on the layouts); batch > 1: strided-batched, the strides part of the key. */
typedef struct {
    int ta, tb, M, N, K, lda, ldb, ldc;
    int bf16; /* 0 fp32 operands; PLAN_BF16 bf16 operands; | PLAN_OUT16: C and D bf16 too (else fp32) */
    int batch;
    long long sa, sb, sc;
    int al_a, al_b, al_c; /* the operands' alignment in bytes (at most 256): an algorithm picked for 256-byte
                           * aligned matrices may not run on a row slice or an odd leading dimension */
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulHeuristicResult_t algo;
} Plan;
enum { PLAN_BF16 = 1, PLAN_OUT16 = 2 };

#define MAX_PLANS 512
typedef struct {
    Plan p[MAX_PLANS];
    int n;
    int next_evict; /* when full, slots are recycled round-robin */
} PlanCache;

extern "C" int gpu_compiled(void) { return 1; }

extern "C" void gpu_kernel_paths(char *line, size_t n) {
    const char *experts = gk_expert_sm90_ready()   ? "on wgmma + TMA (CUTLASS)"
                          : gk_expert_sm90_built() ? "on WMMA (this build's wgmma + TMA form needs an sm_90 GPU)"
                                                   : "on WMMA (built without CUTLASS's headers: no wgmma + TMA form)";
    snprintf(line, n, "experts %s; attention: zaya's kernels, %s (%s)", experts,
             gk_cudnn_attention_available() ? "or cuDNN's with ZAYA_GPU_ATTENTION=cudnn" : "not cuDNN's",
             gk_cudnn_attention_status());
}

static int pick_device(int device, ZyErr *err) {
    int count = 0;
    gpuError_t e = gpuGetDeviceCount(&count);
    if (e == gpuErrorNoDevice || e == gpuErrorInsufficientDriver || (e == gpuSuccess && count == 0))
        return zy_fail(err, "--device cuda: no GPU on this machine (no device, or no driver new enough for this "
                       "build: %s)", e != gpuSuccess ? gpuGetErrorString(e) : "the driver sees no device");
    if (e != gpuSuccess) return zy_fail(err, "--device cuda: no usable GPU (%s)", gpuGetErrorString(e));
    if (device >= 0) {
        if (device >= count) return zy_fail(err, "GPU %d requested, this machine has %d", device, count);
        return device;
    }
    const char *env = getenv("ZAYA_GPU");
    if (env && *env) {
        char *end;
        long d = strtol(env, &end, 10);
        if (*end || d < 0 || d >= count)
            return zy_fail(err, "ZAYA_GPU=\"%s\": not a device index in [0, %d)", env, count);
        return (int)d;
    }
    /* one process per GPU under mpirun / srun: the node-local rank picks it */
    const char *local_vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "LOCAL_RANK"};
    for (size_t i = 0; i < sizeof local_vars / sizeof *local_vars; i++) {
        const char *v = getenv(local_vars[i]);
        if (v && *v) return atoi(v) % count;
    }
    return 0;
}

/* gk_programmatic_launch: CUDA on compute capability 9.0+ only (the launch attribute and griddepcontrol are
 * Hopper's). */
static int programmatic_launch;
extern "C" int gk_programmatic_launch(int on) {
#ifdef ZAYA_HIP
    (void)on;
    programmatic_launch = 0;
#else
    int dev = 0, major = 0;
    programmatic_launch = on && cudaGetDevice(&dev) == cudaSuccess &&
                          cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                          major >= 9;
#endif
    return programmatic_launch;
}
extern "C" int gk_programmatic_launch_on(void) { return programmatic_launch; }

extern "C" int gpu_open(GpuCtx *g, int device, ZyErr *err) {
    memset(g, 0, sizeof *g);
    int d = pick_device(device, err);
    if (d < 0) return -1;
    gpuError_t e = gpuSetDevice(d);
    if (e != gpuSuccess) return fail_rt(err, e, "selecting the device");
    gpuDeviceProp prop;
    if ((e = gpuGetDeviceProperties(&prop, d)) != gpuSuccess) return fail_rt(err, e, "reading device properties");
    g->device = d;
    snprintf(g->name, sizeof g->name, "%s", prop.name);
    g->sm_count = prop.multiProcessorCount;
    g->cc_major = prop.major;
    g->cc_minor = prop.minor;
    g->mem_total = prop.totalGlobalMem;
    gpuStream_t s;
    if ((e = gpuStreamCreate(&s)) != gpuSuccess) return fail_rt(err, e, "creating a stream");
    g->stream = s;
    cublasLtHandle_t lt;
    if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) {
        gpu_close(g);
        return zy_fail(err, "GPU: cuBLASLt could not start (library missing or too old?)");
    }
    g->lt = lt;
    g->lt_work_bytes = LT_WORKSPACE_BYTES;
    if (!(g->lt_work = gpu_alloc(g->lt_work_bytes, "the cuBLASLt workspace", err))) {
        gpu_close(g);
        return -1;
    }
    g->plans = calloc(1, sizeof(PlanCache));
    if (!g->plans) {
        gpu_close(g);
        return zy_fail(err, "out of memory");
    }
    return 0;
}

static void plans_free(PlanCache *c) {
    if (!c) return;
    for (int i = 0; i < c->n; i++) {
        cublasLtMatmulDescDestroy(c->p[i].desc);
        cublasLtMatrixLayoutDestroy(c->p[i].la);
        cublasLtMatrixLayoutDestroy(c->p[i].lb);
        cublasLtMatrixLayoutDestroy(c->p[i].lc);
    }
    free(c);
}

extern "C" void gpu_close(GpuCtx *g) {
    if (g->stream) gpuStreamSynchronize(g->stream);
    plans_free((PlanCache *)g->plans);
    for (int i = 0; i < 2; i++) gpu_free(g->scratch[i]);
    gpu_free(g->lt_work);
    if (g->lt) cublasLtDestroy((cublasLtHandle_t)g->lt);
    if (g->stream) gk_expert_sm90_release(g->stream);
    if (g->stream) gpuStreamDestroy(g->stream);
    memset(g, 0, sizeof *g);
}

extern "C" int gpu_use(GpuCtx *g, ZyErr *err) {
    gpuError_t e = gpuSetDevice(g->device);
    return e != gpuSuccess ? fail_rt(err, e, "selecting the device") : 0;
}

extern "C" int gpu_sync(GpuCtx *g, const char *what, ZyErr *err) {
    gpuError_t e = gpuStreamSynchronize(g->stream);
    if (e == gpuSuccess) e = gpuGetLastError();
    if (e != gpuSuccess) return zy_fail(err, "GPU fault during %s: %s", what, gpuGetErrorString(e));
    return 0;
}

/* ---- CUDA graphs (gpu.h) ---- */

extern "C" int gpu_graph_begin(GpuCtx *g, ZyErr *err) {
    const gpuError_t e = gpuStreamBeginCapture(g->stream, gpuStreamCaptureModeThreadLocal);
    return e == gpuSuccess ? 0 : zy_fail(err, "starting a graph capture: %s", gpuGetErrorString(e));
}

/* The kernel nodes of a captured graph (0 where they cannot be listed). */
static int graph_kernels(gpuGraph_t graph) {
    size_t n = 0;
    if (gpuGraphGetNodes(graph, NULL, &n) != gpuSuccess || n == 0) return 0;
    gpuGraphNode_t *nodes = (gpuGraphNode_t *)malloc(n * sizeof *nodes);
    int kernels = 0;
    if (nodes && gpuGraphGetNodes(graph, nodes, &n) == gpuSuccess)
        for (size_t i = 0; i < n; i++) {
            gpuGraphNodeType type;
            if (gpuGraphNodeGetType(nodes[i], &type) == gpuSuccess && type == gpuGraphNodeTypeKernel) kernels++;
        }
    free(nodes);
    return kernels;
}

extern "C" int gpu_graph_end(GpuCtx *g, void **exec, int *kernels, ZyErr *err) {
    *exec = NULL;
    gpuGraph_t graph = NULL;
    gpuError_t e = gpuStreamEndCapture(g->stream, &graph);
    gpuGraphExec_t x = NULL;
    if (e == gpuSuccess && kernels) *kernels = graph_kernels(graph);
    if (e == gpuSuccess) e = gpuGraphInstantiateWithFlags(&x, graph, 0);
    if (graph) gpuGraphDestroy(graph);
    if (e != gpuSuccess) {
        gpuGetLastError(); /* a refused capture is not a fault of the stream */
        return zy_fail(err, "capturing a graph: %s", gpuGetErrorString(e));
    }
    *exec = (void *)x;
    return 0;
}

extern "C" int gpu_graph_launch(GpuCtx *g, void *exec, ZyErr *err) {
    const gpuError_t e = gpuGraphLaunch((gpuGraphExec_t)exec, g->stream);
    return e == gpuSuccess ? 0 : zy_fail(err, "launching a graph: %s", gpuGetErrorString(e));
}

extern "C" void gpu_graph_free(void *exec) {
    if (exec) gpuGraphExecDestroy((gpuGraphExec_t)exec);
}

extern "C" void *gpu_alloc(size_t bytes, const char *what, ZyErr *err) {
    void *p = NULL;
    gpuError_t e = gpuMalloc(&p, bytes ? bytes : 16);
    if (e != gpuSuccess) {
        gpuGetLastError(); /* clear the sticky-free error so later checks do not report it again */
        size_t free_b = 0, total_b = 0;
        gpuMemGetInfo(&free_b, &total_b);
        zy_fail(err, "GPU out of memory allocating %.1f MiB for %s (%.1f of %.1f GiB free)", bytes / 1048576.0, what,
                free_b / 1073741824.0, total_b / 1073741824.0);
        return NULL;
    }
    if (gpuMemset(p, 0, bytes ? bytes : 16) != gpuSuccess) {
        gpuFree(p);
        zy_fail(err, "GPU: clearing %s failed", what);
        return NULL;
    }
    return p;
}

extern "C" void gpu_free(void *p) {
    if (p) gpuFree(p);
}

/* ---- sparse device ranges (gpu.h): CUDA's virtual memory management ---- */

struct SparsePiece {
    size_t offset, bytes;
    unsigned long long handle;
};
struct GpuSparse {
    char *base;
    size_t bytes, granularity, committed;
    int device;
    SparsePiece *pieces;
    int n, cap;
};

#ifndef ZAYA_HIP
/* The driver entry points, looked up once (a binary without a GPU driver still loads; nothing links libcuda). */
struct Vmm {
    CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*address_free)(CUdeviceptr, size_t);
    CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
    CUresult (*release)(CUmemGenericAllocationHandle);
    CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
    CUresult (*unmap)(CUdeviceptr, size_t);
    CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
    CUresult (*granularity)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags);
};
static Vmm vmm;
static int vmm_state; /* 0 not looked up, 1 ready, -1 missing */
static char vmm_missing[96];

static int vmm_ready(void) {
    if (vmm_state) return vmm_state > 0;
    struct {
        const char *name;
        void **fn;
    } want[] = {{"cuMemAddressReserve", (void **)&vmm.reserve}, {"cuMemAddressFree", (void **)&vmm.address_free},
                {"cuMemCreate", (void **)&vmm.create},          {"cuMemRelease", (void **)&vmm.release},
                {"cuMemMap", (void **)&vmm.map},                {"cuMemUnmap", (void **)&vmm.unmap},
                {"cuMemSetAccess", (void **)&vmm.set_access},
                {"cuMemGetAllocationGranularity", (void **)&vmm.granularity}};
    vmm_state = 1;
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        if (cudaGetDriverEntryPointByVersion(want[i].name, want[i].fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess || !*want[i].fn) {
            cudaGetLastError();
            snprintf(vmm_missing, sizeof vmm_missing, "the driver has no %s", want[i].name);
            vmm_state = -1;
            break;
        }
    }
    return vmm_state > 0;
}

static CUmemAllocationProp vmm_prop(int device) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    return prop;
}
#endif

extern "C" GpuSparse *gpu_sparse_reserve(GpuCtx *g, size_t bytes, ZyErr *err) {
#ifdef ZAYA_HIP
    (void)g, (void)bytes;
    zy_fail(err, "sparse device ranges are not in HIP builds");
    return NULL;
#else
    if (!vmm_ready()) {
        zy_fail(err, "no sparse device ranges: %s", vmm_missing);
        return NULL;
    }
    const CUmemAllocationProp prop = vmm_prop(g->device);
    size_t gran = 0;
    if (vmm.granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS || gran == 0 ||
        (gran & (gran - 1))) {
        zy_fail(err, "no sparse device ranges: the driver gave no commit granularity");
        return NULL;
    }
    GpuSparse *s = (GpuSparse *)calloc(1, sizeof *s);
    if (!s) {
        zy_fail(err, "out of memory");
        return NULL;
    }
    s->bytes = (bytes + gran - 1) / gran * gran;
    s->granularity = gran;
    s->device = g->device;
    CUdeviceptr base = 0;
    if (vmm.reserve(&base, s->bytes, 0, 0, 0) != CUDA_SUCCESS) {
        free(s);
        zy_fail(err, "reserving %.1f GiB of device addresses failed", bytes / 1073741824.0);
        return NULL;
    }
    s->base = (char *)(uintptr_t)base;
    return s;
#endif
}

extern "C" void *gpu_sparse_base(const GpuSparse *s) { return s->base; }
extern "C" size_t gpu_sparse_granularity(const GpuSparse *s) { return s->granularity; }
extern "C" size_t gpu_sparse_committed(const GpuSparse *s) { return s->committed; }

extern "C" int gpu_sparse_commit(GpuSparse *s, size_t offset, size_t bytes, ZyErr *err) {
#ifdef ZAYA_HIP
    (void)s, (void)offset, (void)bytes;
    return zy_fail(err, "sparse device ranges are not in HIP builds");
#else
    if (!bytes) return 0;
    if (offset % s->granularity || bytes % s->granularity || offset > s->bytes || bytes > s->bytes - offset)
        return zy_fail(err, "sparse range: piece [%zu, +%zu) is outside the range or off its %zu-byte granularity",
                       offset, bytes, s->granularity);
    if (s->n == s->cap) {
        const int cap = s->cap ? 2 * s->cap : 16;
        SparsePiece *p = (SparsePiece *)realloc(s->pieces, (size_t)cap * sizeof *p);
        if (!p) return zy_fail(err, "out of memory");
        s->pieces = p, s->cap = cap;
    }
    const CUmemAllocationProp prop = vmm_prop(s->device);
    CUmemGenericAllocationHandle h = 0;
    const CUdeviceptr at = (CUdeviceptr)(uintptr_t)(s->base + offset);
    if (vmm.create(&h, bytes, &prop, 0) != CUDA_SUCCESS) {
        size_t free_b = 0, total_b = 0;
        gpuMemGetInfo(&free_b, &total_b);
        return zy_fail(err, "GPU out of memory committing %.1f MiB of a sparse range (%.1f of %.1f GiB free)",
                       bytes / 1048576.0, free_b / 1073741824.0, total_b / 1073741824.0);
    }
    if (vmm.map(at, bytes, 0, h, 0) != CUDA_SUCCESS) {
        vmm.release(h);
        return zy_fail(err, "mapping %.1f MiB of a sparse range failed", bytes / 1048576.0);
    }
    CUmemAccessDesc access;
    memset(&access, 0, sizeof access);
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (vmm.set_access(at, bytes, &access, 1) != CUDA_SUCCESS) {
        vmm.unmap(at, bytes);
        vmm.release(h);
        return zy_fail(err, "opening %.1f MiB of a sparse range to the device failed", bytes / 1048576.0);
    }
    s->pieces[s->n++] = (SparsePiece){offset, bytes, (unsigned long long)h};
    s->committed += bytes;
    if (gpuMemset(s->base + offset, 0, bytes) != gpuSuccess) return zy_fail(err, "GPU: clearing a sparse piece failed");
    return 0;
#endif
}

extern "C" void gpu_sparse_free(GpuSparse *s) {
    if (!s) return;
#ifndef ZAYA_HIP
    for (int i = 0; i < s->n; i++) {
        vmm.unmap((CUdeviceptr)(uintptr_t)(s->base + s->pieces[i].offset), s->pieces[i].bytes);
        vmm.release((CUmemGenericAllocationHandle)s->pieces[i].handle);
    }
    if (s->base) vmm.address_free((CUdeviceptr)(uintptr_t)s->base, s->bytes);
#endif
    free(s->pieces);
    free(s);
}

extern "C" int gpu_upload(GpuCtx *g, void *dst, const void *src, size_t bytes, ZyErr *err) {
    gpuError_t e = gpuMemcpyAsync(dst, src, bytes, gpuMemcpyHostToDevice, g->stream);
    if (e != gpuSuccess) return fail_rt(err, e, "copying to the GPU");
    return gpu_sync(g, "a copy to the GPU", err);
}

extern "C" int gpu_download(GpuCtx *g, void *dst, const void *src, size_t bytes, ZyErr *err) {
    gpuError_t e = gpuMemcpyAsync(dst, src, bytes, gpuMemcpyDeviceToHost, g->stream);
    if (e != gpuSuccess) return fail_rt(err, e, "copying from the GPU");
    return gpu_sync(g, "a copy from the GPU", err);
}

extern "C" void gpu_upload_async(GpuCtx *g, void *dst, const void *src, size_t bytes) {
    gpuMemcpyAsync(dst, src, bytes, gpuMemcpyHostToDevice, g->stream);
}

extern "C" void gpu_copy_async(GpuCtx *g, void *dst, const void *src, size_t bytes) {
    gpuMemcpyAsync(dst, src, bytes, gpuMemcpyDeviceToDevice, g->stream);
}

extern "C" void gpu_memset_async(GpuCtx *g, void *dst, int value, size_t bytes) {
    gpuMemsetAsync(dst, value, bytes, g->stream);
}

/* Grows bf16 scratch slot i (its contents are not kept). */
static int grow_scratch(GpuCtx *g, int i, size_t elems, ZyErr *err) {
    if (g->scratch_elems[i] >= elems) return 0;
    gpuStreamSynchronize(g->stream); /* the old scratch may still be read */
    gpu_free(g->scratch[i]);
    g->scratch[i] = NULL;
    g->scratch_elems[i] = 0;
    if (!(g->scratch[i] = (uint16_t *)gpu_alloc(elems * sizeof(uint16_t), "bf16 product operands", err))) return -1;
    g->scratch_elems[i] = elems;
    return 0;
}

extern "C" int gpu_reserve_scratch(GpuCtx *g, size_t elems, ZyErr *err) {
    return grow_scratch(g, 0, elems, err) || grow_scratch(g, 1, elems, err) ? -1 : 0;
}

/* ---- products ------------------------------------------------------------------------------------------- */

/* A row-major M×N = op(A) op(B) is, read column-major, Cᵀ (N×M) = op(B)ᵀ op(A)ᵀ: cuBLASLt's first operand is B
 * and its second A, each with its own transpose flag; no data moves. A batch of them (batch > 1) puts the batch
 * count and each operand's stride on its layout: cuBLASLt's first layout (la) takes B's stride, the second (lb)
 * A's, lc C's. */
/* The largest power of two up to 256 dividing a matrix's address, its row pitch and its batch stride, in bytes. */
static int alignment_of(const void *p, long long ld_bytes, long long stride_bytes) {
    const unsigned long long v = (unsigned long long)(uintptr_t)p | (unsigned long long)ld_bytes |
                                 (unsigned long long)stride_bytes | 256ull;
    return (int)(v & (~v + 1));
}

/* The size class a dimension's algorithm is shared within: a power-of-two range (an expert's row count changes every
 * step; picking an algorithm afresh for each count costs a heuristic query, more than many small products). */
static int size_class(int x) {
    int c = 0;
    while (x > 1) x = (x + 1) / 2, c++;
    return c;
}

/* An algorithm already picked for a product that differs from this one only in M or K within their size classes,
 * checked by cuBLASLt against this product's own descriptors (cublasLtMatmulAlgoCheck: an algorithm that fails it
 * never runs) and its workspace: 1 if p->algo now holds it. */
static int reuse_algo(GpuCtx *g, const PlanCache *c, Plan *p) {
    for (int i = 0; i < c->n; i++) {
        const Plan *q = &c->p[i];
        if (q == p || q->ta != p->ta || q->tb != p->tb || q->N != p->N || q->lda != p->lda || q->ldb != p->ldb ||
            q->ldc != p->ldc || q->bf16 != p->bf16 || q->batch != p->batch || q->sa != p->sa || q->sb != p->sb ||
            q->sc != p->sc || q->al_a != p->al_a || q->al_b != p->al_b || q->al_c != p->al_c ||
            size_class(q->M) != size_class(p->M) || size_class(q->K) != size_class(p->K))
            continue;
        cublasLtMatmulHeuristicResult_t r;
        memset(&r, 0, sizeof r);
        if (cublasLtMatmulAlgoCheck((cublasLtHandle_t)g->lt, p->desc, p->la, p->lb, p->lc, p->lc, &q->algo.algo, &r) ==
                CUBLAS_STATUS_SUCCESS &&
            r.workspaceSize <= g->lt_work_bytes) {
            p->algo = q->algo;
            return 1;
        }
    }
    return 0;
}

static Plan *plan_for(GpuCtx *g, int ta, int tb, int M, int N, int K, int lda, int ldb, int ldc, int bf16, int batch,
                      long long sa, long long sb, long long sc, int al_a, int al_b, int al_c, ZyErr *err) {
    PlanCache *c = (PlanCache *)g->plans;
    if (batch <= 1) batch = 1, sa = sb = sc = 0; /* one product: the same plan whichever strides were passed */
    for (int i = 0; i < c->n; i++) {
        Plan *p = &c->p[i];
        if (p->ta == ta && p->tb == tb && p->M == M && p->N == N && p->K == K && p->lda == lda && p->ldb == ldb &&
            p->ldc == ldc && p->bf16 == bf16 && p->batch == batch && p->sa == sa && p->sb == sb && p->sc == sc &&
            p->al_a == al_a && p->al_b == al_b && p->al_c == al_c)
            return p;
    }
    const double t0 = zy_now_seconds();
    g->plan_builds++;
    Plan *p = c->n < MAX_PLANS ? &c->p[c->n] : &c->p[c->next_evict];
    if (c->n == MAX_PLANS) { /* full: recycle slots in turn (an MoE's per-expert row counts make many shapes) */
        c->next_evict = (c->next_evict + 1) % MAX_PLANS;
        cublasLtMatmulDescDestroy(p->desc);
        cublasLtMatrixLayoutDestroy(p->la);
        cublasLtMatrixLayoutDestroy(p->lb);
        cublasLtMatrixLayoutDestroy(p->lc);
        c->n--;
        /* the recycled slot must be the one past the live entries: swap it with the last */
        Plan *last = &c->p[c->n];
        if (p != last) {
            Plan tmp = *p;
            *p = *last;
            *last = tmp;
            p = last;
        }
    }
    memset(p, 0, sizeof *p);
    p->ta = ta, p->tb = tb, p->M = M, p->N = N, p->K = K, p->lda = lda, p->ldb = ldb, p->ldc = ldc, p->bf16 = bf16;
    p->batch = batch, p->sa = sa, p->sb = sb, p->sc = sc;
    p->al_a = al_a, p->al_b = al_b, p->al_c = al_c;
    const cudaDataType_t in = bf16 ? CUDA_R_16BF : CUDA_R_32F;
    cublasOperation_t op_first = tb ? CUBLAS_OP_T : CUBLAS_OP_N, op_second = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    int ok = cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS;
    ok = ok && cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof op_first) ==
                   CUBLAS_STATUS_SUCCESS;
    ok = ok && cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof op_second) ==
                   CUBLAS_STATUS_SUCCESS;
    /* stored shapes (column-major): B is N×K (tb = 0) or K×N; A is K×M (ta = 0) or M×K */
    ok = ok && cublasLtMatrixLayoutCreate(&p->la, in, tb ? K : N, tb ? N : K, ldb) == CUBLAS_STATUS_SUCCESS;
    ok = ok && cublasLtMatrixLayoutCreate(&p->lb, in, ta ? M : K, ta ? K : M, lda) == CUBLAS_STATUS_SUCCESS;
    ok = ok && cublasLtMatrixLayoutCreate(&p->lc, bf16 & PLAN_OUT16 ? CUDA_R_16BF : CUDA_R_32F, N, M, ldc) ==
                   CUBLAS_STATUS_SUCCESS;
    if (batch > 1) {
        const int32_t count = batch;
        const int64_t stride[3] = {(int64_t)sb, (int64_t)sa, (int64_t)sc}; /* la, lb, lc */
        cublasLtMatrixLayout_t lay[3] = {p->la, p->lb, p->lc};
        for (int i = 0; i < 3; i++) {
            ok = ok && cublasLtMatrixLayoutSetAttribute(lay[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                        sizeof count) == CUBLAS_STATUS_SUCCESS;
            ok = ok && cublasLtMatrixLayoutSetAttribute(lay[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                        &stride[i], sizeof stride[i]) == CUBLAS_STATUS_SUCCESS;
        }
    }
    if (ok && reuse_algo(g, c, p)) {
        c->n++;
        g->plan_seconds += zy_now_seconds() - t0;
        return p;
    }
    g->plan_heuristics++;
    cublasLtMatmulPreference_t pref = NULL;
    ok = ok && cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS;
    size_t ws = g->lt_work_bytes;
    ok = ok && cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws) ==
                   CUBLAS_STATUS_SUCCESS;
#ifndef ZAYA_HIP /* hipBLASLt has no alignment preferences (untested on AMD: docs/gpus.md) */
    /* cuBLASLt's "A" is our B and its "B" our A (row-major products as column-major ones); C and D are C */
    const uint32_t align[4] = {(uint32_t)al_b, (uint32_t)al_a, (uint32_t)al_c, (uint32_t)al_c};
    const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++)
        ok = ok && cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &align[i], sizeof align[i]) ==
                       CUBLAS_STATUS_SUCCESS;
#endif
    int found = 0;
    ok = ok && cublasLtMatmulAlgoGetHeuristic((cublasLtHandle_t)g->lt, p->desc, p->la, p->lb, p->lc, p->lc, pref, 1,
                                              &p->algo, &found) == CUBLAS_STATUS_SUCCESS;
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (!ok || !found) {
        if (p->desc) cublasLtMatmulDescDestroy(p->desc);
        if (p->la) cublasLtMatrixLayoutDestroy(p->la);
        if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
        if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
        if (batch > 1)
            zy_fail(err, "GPU: cuBLASLt has no algorithm for a batch of %d %s products %dx%dx%d (ta %d tb %d, lda %d "
                    "ldb %d ldc %d, strides %lld %lld %lld)", batch, bf16 ? "bf16" : "fp32", M, N, K, ta, tb, lda, ldb,
                    ldc, sa, sb, sc);
        else
            zy_fail(err, "GPU: cuBLASLt has no algorithm for a %s product %dx%dx%d (ta %d tb %d, lda %d ldb %d ldc %d)",
                    bf16 ? "bf16" : "fp32", M, N, K, ta, tb, lda, ldb, ldc);
        return NULL;
    }
    c->n++;
    g->plan_seconds += zy_now_seconds() - t0;
    return p;
}

/* bf16 copy of `batch` row-major rows×cols matrices with leading dimension ld, `stride` elements apart, same layout
 * (the gaps between them are converted too), into scratch slot `which`. */
static const uint16_t *to_bf16(GpuCtx *g, int which, const float *x, int rows, int cols, int ld, int batch,
                               long long stride, ZyErr *err) {
    size_t span = (size_t)(rows - 1) * ld + cols;
    if (batch > 1) span += (size_t)(batch - 1) * (size_t)stride;
    /* only this slot grows: the other may already hold this product's other operand */
    if (grow_scratch(g, which, span, err)) return NULL;
    gk_f32_to_bf16(g->stream, g->scratch[which], x, (long)span);
    return g->scratch[which];
}

/* gpu_gemm and gpu_gemm_batched: batch products, matrix i of each operand `stride` elements after matrix i − 1. */
static int gemm_impl(GpuCtx *g, int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A,
                     const uint16_t *A16, int lda, long long stride_a, const float *B, const uint16_t *B16, int ldb,
                     long long stride_b, float beta, float *C, int ldc, long long stride_c, int batch, ZyErr *err) {
    if (M <= 0 || N <= 0 || batch <= 0) return 0;
    if (batch > 1 && (stride_a < 0 || stride_b < 0 || stride_c < 0))
        return zy_fail(err, "GPU: batched product with a negative stride (%lld, %lld, %lld)", stride_a, stride_b,
                       stride_c);
    if (K <= 0) { /* an empty sum: C = beta C */
        for (int i = 0; i < batch; i++) {
            float *Ci = C + (size_t)i * (size_t)stride_c;
            if (beta == 0.0f)
                for (int r = 0; r < M; r++)
                    gpuMemsetAsync(Ci + (size_t)r * ldc, 0, (size_t)N * sizeof(float), g->stream);
            else if (beta != 1.0f)
                for (int r = 0; r < M; r++) gk_scale(g->stream, Ci + (size_t)r * ldc, beta, N);
        }
        return 0;
    }
    const int bf16 = g->bf16;
    const void *a = A, *b = B;
    if (bf16) {
        a = A16 ? (const void *)A16
                : (const void *)to_bf16(g, 0, A, trans_a ? K : M, trans_a ? M : K, lda, batch, stride_a, err);
        b = B16 ? (const void *)B16
                : (const void *)to_bf16(g, 1, B, trans_b ? N : K, trans_b ? K : N, ldb, batch, stride_b, err);
        if (!a || !b) return -1;
    } else if (!A || !B) {
        return zy_fail(err, "GPU: an fp32 product was given bf16-only weights");
    }
    const long long es = bf16 ? 2 : 4, many = batch > 1;
    Plan *p = plan_for(g, trans_a, trans_b, M, N, K, lda, ldb, ldc, bf16, batch, stride_a, stride_b, stride_c,
                       alignment_of(a, lda * es, many * stride_a * es), alignment_of(b, ldb * es, many * stride_b * es),
                       alignment_of(C, ldc * 4ll, many * stride_c * 4), err);
    if (!p) return -1;
    cublasStatus_t st = cublasLtMatmul((cublasLtHandle_t)g->lt, p->desc, &alpha, b, p->la, a, p->lb, &beta, C, p->lc,
                                       C, p->lc, &p->algo.algo, g->lt_work, g->lt_work_bytes, g->stream);
    if (st != CUBLAS_STATUS_SUCCESS) {
        if (batch > 1)
            return zy_fail(err, "GPU: cuBLASLt batch of %d products %dx%dx%d failed (status %d)", batch, M, N, K,
                           (int)st);
        return zy_fail(err, "GPU: cuBLASLt product %dx%dx%d failed (status %d)", M, N, K, (int)st);
    }
    return 0;
}

extern "C" int gpu_gemm(GpuCtx *g, int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A,
                        const uint16_t *A16, int lda, const float *B, const uint16_t *B16, int ldb, float beta,
                        float *C, int ldc, ZyErr *err) {
    return gemm_impl(g, trans_a, trans_b, M, N, K, alpha, A, A16, lda, 0, B, B16, ldb, 0, beta, C, ldc, 0, 1, err);
}

extern "C" int gpu_gemm_batched(GpuCtx *g, int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A,
                                const uint16_t *A16, int lda, long long stride_a, const float *B, const uint16_t *B16,
                                int ldb, long long stride_b, float beta, float *C, int ldc, long long stride_c,
                                int batch, ZyErr *err) {
    return gemm_impl(g, trans_a, trans_b, M, N, K, alpha, A, A16, lda, stride_a, B, B16, ldb, stride_b, beta, C, ldc,
                     stride_c, batch, err);
}

extern "C" int gpu_gemm_batched_bf16(GpuCtx *g, int trans_a, int trans_b, int M, int N, int K, float alpha,
                                     const uint16_t *A16, int lda, long long stride_a, const uint16_t *B16, int ldb,
                                     long long stride_b, float beta, const uint16_t *C16, uint16_t *D16, int ldc,
                                     long long stride_c, int batch, ZyErr *err) {
    if (M <= 0 || N <= 0 || batch <= 0) return 0;
    if (K <= 0 || !A16 || !B16 || !D16 || (beta != 0.0f && !C16) ||
        (batch > 1 && (stride_a < 0 || stride_b < 0 || stride_c < 0)))
        return zy_fail(err, "GPU: bf16-output product %dx%dx%d (batch %d) with a missing operand, K <= 0 or a negative "
                       "stride", M, N, K, batch);
    const long long many = batch > 1;
    const int al_c = alignment_of(D16, ldc * 2ll, many * stride_c * 2), al_c2 = C16 ? alignment_of(C16, ldc * 2ll,
                                                                                                    many * stride_c * 2)
                                                                                  : al_c;
    Plan *p = plan_for(g, trans_a, trans_b, M, N, K, lda, ldb, ldc, PLAN_BF16 | PLAN_OUT16, batch, stride_a, stride_b,
                       stride_c, alignment_of(A16, lda * 2ll, many * stride_a * 2),
                       alignment_of(B16, ldb * 2ll, many * stride_b * 2), al_c < al_c2 ? al_c : al_c2, err);
    if (!p) return -1;
    cublasStatus_t st = cublasLtMatmul((cublasLtHandle_t)g->lt, p->desc, &alpha, B16, p->la, A16, p->lb, &beta,
                                       C16 ? (const void *)C16 : (const void *)D16, p->lc, D16, p->lc, &p->algo.algo,
                                       g->lt_work, g->lt_work_bytes, g->stream);
    if (st != CUBLAS_STATUS_SUCCESS)
        return zy_fail(err, "GPU: cuBLASLt bf16-output batch of %d products %dx%dx%d failed (status %d)", batch, M, N,
                       K, (int)st);
    return 0;
}

extern "C" int gpu_grid_sync_probe(GpuCtx *g, int reps, double *us, long *stale, int *blocks, ZyErr *err) {
    const int nb = g->sm_count > 0 ? g->sm_count : 1;
    const size_t words = 1 + 2 * (size_t)nb;
    *us = 0, *stale = 0, *blocks = nb;
    unsigned *d = (unsigned *)gpu_alloc(words * sizeof(unsigned), "the grid barrier probe", err);
    if (!d) return -1;
    unsigned *h = (unsigned *)calloc(words, sizeof(unsigned));
    int rc = h ? 0 : zy_fail(err, "out of memory");
    double t1 = 0, tn = 0;
    for (int pass = 0; !rc && pass < 3; pass++) { /* a warm-up, then 1 round and reps rounds */
        const int r = pass == 2 ? reps : 1;
        gpu_memset_async(g, d, 0, words * sizeof(unsigned));
        void *timer = gpu_timer_start(g);
        if (gk_grid_sync_probe(g->stream, d, nb, r)) {
            rc = zy_fail(err, "GPU: the cooperative launch of %d blocks was refused", nb);
            break;
        }
        const double sec = gpu_timer_stop(g, timer);
        if (pass == 1) t1 = sec;
        if (pass == 2) tn = sec;
        rc = gpu_download(g, h, d, words * sizeof(unsigned), err);
        for (int b = 0; !rc && b < nb; b++) *stale += h[1 + nb + b];
    }
    if (!rc && reps > 1) *us = (tn - t1) / (2.0 * (reps - 1)) * 1e6;
    free(h);
    gpu_free(d);
    return rc;
}

extern "C" double gpu_gemm_probe_tflops(GpuCtx *g, int n, int reps) {
    ZyErr err;
    size_t nn = (size_t)n * n;
    float *A = (float *)gpu_alloc(nn * 4, "probe", &err), *B = (float *)gpu_alloc(nn * 4, "probe", &err);
    float *C = (float *)gpu_alloc(nn * 4, "probe", &err);
    uint16_t *A16 = (uint16_t *)gpu_alloc(nn * 2, "probe", &err), *B16 = (uint16_t *)gpu_alloc(nn * 2, "probe", &err);
    double tflops = -1;
    if (A && B && C && A16 && B16) {
        /* random-ish operands: zeros run faster than real data on tensor cores */
        float *h = (float *)malloc(nn * 4);
        if (h) {
            uint64_t s = 0x9E3779B97F4A7C15ull;
            for (size_t i = 0; i < nn; i++) {
                s ^= s << 13, s ^= s >> 7, s ^= s << 17;
                h[i] = (float)((s >> 40) * (1.0 / (1 << 24)) - 0.5);
            }
            gpu_upload(g, A, h, nn * 4, &err);
            gpu_upload(g, B, h, nn * 4, &err);
            free(h);
        }
        gk_f32_to_bf16(g->stream, A16, A, (long)nn);
        gk_f32_to_bf16(g->stream, B16, B, (long)nn);
        for (int w = 0; w < 3; w++) gpu_gemm(g, 0, 1, n, n, n, 1, A, A16, n, B, B16, n, 0, C, n, &err);
        void *timer = gpu_timer_start(g);
        for (int r = 0; r < reps; r++) gpu_gemm(g, 0, 1, n, n, n, 1, A, A16, n, B, B16, n, 0, C, n, &err);
        const double sec = gpu_timer_stop(g, timer);
        if (gpu_sync(g, "the GEMM probe", &err) == 0 && sec > 0) tflops = 2.0 * n * (double)n * n * reps / sec / 1e12;
    }
    gpu_free(A), gpu_free(B), gpu_free(C), gpu_free(A16), gpu_free(B16);
    return tflops;
}

/* A MoE layer's six expert products (gate_up and down forward, their input and weight gradients) at E experts sharing
 * `rows` routed rows unevenly (±50% around the mean, as routing does), hidden D, intermediate I, bf16 operands: grouped
 * (gk_expert_mm / gk_expert_mm_wgrad, sizes read on the device) in each form of gk_expert_kernel, and one cuBLASLt
 * product per expert (gpu_gemm, sizes from the host), each timed over `reps` layers after two warm-ups. 18·rows·D·I
 * FLOP a layer. The sm90 form is timed only where it runs (else its entry stays -1): its launchers are called
 * directly, so a fallback to the WMMA kernels cannot pass for it. */
extern "C" int gpu_expert_gemm_probe(GpuCtx *g, int E, int rows, int D, int I, int reps,
                                     double tflops[GPU_EXPERT_PROBE_FORMS], ZyErr *err) {
    for (int f = 0; f < GPU_EXPERT_PROBE_FORMS; f++) tflops[f] = -1;
    if (E < 1 || E > 1024 || rows < E || D < 1 || I < 1 || reps < 1) return zy_fail(err, "expert probe: bad sizes");
    int32_t *off = (int32_t *)malloc((size_t)(E + 1) * sizeof(int32_t));
    if (!off) return zy_fail(err, "out of memory");
    off[0] = 0;
    double wsum = 0;
    for (int e = 0; e < E; e++) wsum += 1.0 + 0.5 * sin(1.7 * e + 0.3);
    for (int e = 0; e < E; e++) { /* cumulative rounding: the counts add up to rows */
        double cum = 0;
        for (int i = 0; i <= e; i++) cum += 1.0 + 0.5 * sin(1.7 * i + 0.3);
        off[e + 1] = e + 1 == E ? rows : (int)(rows * cum / wsum);
    }
    const size_t I2 = 2 * (size_t)I, nr = (size_t)rows;
    const size_t n16 = nr * D + (size_t)E * I2 * D + (size_t)E * D * I + nr * I + nr * D + nr * I2;
    const size_t n32 = nr * I2 + nr * D + nr * I + nr * D + (size_t)E * I2 * D + (size_t)E * D * I;
    uint16_t *b16 = (uint16_t *)gpu_alloc(n16 * 2, "expert probe", err);
    float *b32 = b16 ? (float *)gpu_alloc(n32 * 4, "expert probe", err) : NULL;
    int32_t *d_off = b32 ? (int32_t *)gpu_alloc((size_t)(E + 1) * 4, "expert probe", err) : NULL;
    int rc = -1;
    if (d_off && gpu_upload(g, d_off, off, (size_t)(E + 1) * 4, err) == 0) {
        uint16_t *X = b16, *Wgu = X + nr * D, *Wd = Wgu + (size_t)E * I2 * D, *act = Wd + (size_t)E * D * I;
        uint16_t *dy = act + nr * I, *dgu = dy + nr * D;
        float *gu = b32, *out = gu + nr * I2, *dact = out + nr * D, *din = dact + nr * I, *Ggu = din + nr * D;
        float *Gd = Ggu + (size_t)E * I2 * D;
        gpuMemsetAsync(b16, 0x3c, n16 * 2, g->stream); /* every bf16 0x3c3c ≈ 0.0115: finite, not zero */
        gpuMemsetAsync(b32, 0, n32 * 4, g->stream);
        const int saved = g->bf16, form = gk_expert_kernel(-1);
        g->bf16 = 1;
        rc = 0;
        for (int mode = 0; mode < GPU_EXPERT_PROBE_FORMS && rc == 0; mode++) {
            if (mode == GPU_EXPERT_PROBE_SM90 && !gk_expert_sm90_ready()) continue;
            int bad = 0;
            void *timer = NULL;
            if (mode != GPU_EXPERT_PROBE_LOOP) gk_expert_kernel(mode == GPU_EXPERT_PROBE_STAGED ? GK_EXPERT_STAGED
                                                                : mode == GPU_EXPERT_PROBE_ASYNC ? GK_EXPERT_ASYNC
                                                                                                 : GK_EXPERT_SM90);
            for (int r = -2; r < reps && !bad; r++) {
                if (r == 0) timer = gpu_timer_start(g);
                if (mode != GPU_EXPERT_PROBE_LOOP) {
                    /* the sm90 form through its launchers themselves: -1 is a failure here, not a fallback */
                    const bool sm90 = mode == GPU_EXPERT_PROBE_SM90;
                    GkStream s = g->stream;
                    auto mm = [&](int N, int K, const uint16_t *A, const uint16_t *W, int trans_w, float *C) {
                        const long ws = (long)N * K;
                        if (sm90)
                            bad |= gk_expert_mm_sm90(s, d_off, E, N, K, A, K, W, ws, trans_w, 0.0f, C, N) != 0;
                        else
                            gk_expert_mm(s, d_off, E, rows, N, K, A, K, W, ws, trans_w, 0.0f, C, N);
                    };
                    auto wgrad = [&](int M, int N, const uint16_t *A, const uint16_t *B, float *G) {
                        if (sm90)
                            bad |= gk_expert_mm_wgrad_sm90(s, d_off, E, M, N, A, M, B, N, 1.0f, G, (long)M * N, N) != 0;
                        else
                            gk_expert_mm_wgrad(s, d_off, E, M, N, A, M, B, N, 1.0f, G, (long)M * N, N);
                    };
                    mm((int)I2, D, X, Wgu, 1, gu);  /* gate_up forward */
                    mm(D, I, act, Wd, 1, out);      /* down forward */
                    mm(I, D, dy, Wd, 0, dact);      /* down's input gradient */
                    wgrad(D, I, dy, act, Gd);       /* down's weight gradient */
                    mm(D, (int)I2, dgu, Wgu, 0, din); /* gate_up's input gradient */
                    wgrad((int)I2, D, dgu, X, Ggu); /* gate_up's weight gradient */
                    if (bad) zy_fail(err, "the sm90 expert products did not launch");
                } else {
                    for (int e = 0; e < E && !bad; e++) {
                        const int r0 = off[e], ne = off[e + 1] - off[e];
                        if (!ne) continue;
                        const uint16_t *Wgue = Wgu + (size_t)e * I2 * D, *Wde = Wd + (size_t)e * D * I;
                        bad |= gpu_gemm(g, 0, 1, ne, (int)I2, D, 1, NULL, X + (size_t)r0 * D, D, NULL, Wgue, D, 0,
                                        gu + (size_t)r0 * I2, (int)I2, err);
                        bad |= gpu_gemm(g, 0, 1, ne, D, I, 1, NULL, act + (size_t)r0 * I, I, NULL, Wde, I, 0,
                                        out + (size_t)r0 * D, D, err);
                        bad |= gpu_gemm(g, 0, 0, ne, I, D, 1, NULL, dy + (size_t)r0 * D, D, NULL, Wde, I, 0,
                                        dact + (size_t)r0 * I, I, err);
                        bad |= gpu_gemm(g, 1, 0, D, I, ne, 1, NULL, dy + (size_t)r0 * D, D, NULL, act + (size_t)r0 * I,
                                        I, 1, Gd + (size_t)e * D * I, I, err);
                        bad |= gpu_gemm(g, 0, 0, ne, D, (int)I2, 1, NULL, dgu + (size_t)r0 * I2, (int)I2, NULL, Wgue,
                                        D, 0, din + (size_t)r0 * D, D, err);
                        bad |= gpu_gemm(g, 1, 0, (int)I2, D, ne, 1, NULL, dgu + (size_t)r0 * I2, (int)I2, NULL,
                                        X + (size_t)r0 * D, D, 1, Ggu + (size_t)e * I2 * D, D, err);
                    }
                }
            }
            const double sec = gpu_timer_stop(g, timer);
            if (bad || gpu_sync(g, "the expert probe", err)) {
                rc = -1;
                break;
            }
            tflops[mode] = sec > 0 ? 18.0 * rows * (double)D * I * reps / sec / 1e12 : -1;
        }
        gk_expert_kernel(form);
        g->bf16 = saved;
    }
    gpu_free(b16), gpu_free(b32), gpu_free(d_off);
    free(off);
    return rc;
}

extern "C" double gpu_dense_bf16_peak_tflops(const GpuCtx *g) {
    /* dense (no sparsity) bf16 tensor-core peaks from the vendors' datasheets, at boost clock */
    static const struct {
        const char *name;
        double tflops;
    } known[] = {{"H100 PCIe", 756.0}, {"H100 NVL", 835.0}, {"H100", 989.4}, {"H200", 989.4}, {"GH200", 989.4},
                 {"A100", 312.0},      {"MI300X", 1307.4},  {"MI250", 362.1}, {"L40S", 362.1}, {"B200", 2250.0}};
    for (size_t i = 0; i < sizeof known / sizeof *known; i++)
        if (strstr(g->name, known[i].name)) return known[i].tflops;
    return 0;
}

/* ---- timing --------------------------------------------------------------------------------------------- */

extern "C" void *gpu_timer_start(GpuCtx *g) {
    gpuEvent_t *e = (gpuEvent_t *)calloc(2, sizeof(gpuEvent_t));
    if (!e) return NULL;
    gpuEventCreate(&e[0]);
    gpuEventCreate(&e[1]);
    gpuEventRecord(e[0], g->stream);
    return e;
}

extern "C" double gpu_timer_stop(GpuCtx *g, void *timer) {
    if (!timer) return -1;
    gpuEvent_t *e = (gpuEvent_t *)timer;
    gpuEventRecord(e[1], g->stream);
    gpuEventSynchronize(e[1]);
    float ms = 0;
    gpuEventElapsedTime(&ms, e[0], e[1]);
    gpuEventDestroy(e[0]);
    gpuEventDestroy(e[1]);
    free(e);
    return ms * 1e-3;
}

extern "C" int gpu_memory_used(GpuCtx *g, size_t *used, size_t *total) {
    size_t f = 0, t = 0;
    if (gpuMemGetInfo(&f, &t) != gpuSuccess) return -1;
    *used = t - f;
    *total = t;
    (void)g;
    return 0;
}

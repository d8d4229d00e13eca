/* gpu_model_internal: the GPU model's state and helpers, shared by gpu_model.c (training and full passes) and
 * gpu_decode.c (cached decoding). Not part of the interface: callers use gpu_model.h / gpu_decode.h. */
#ifndef ZAYA_GPU_MODEL_INTERNAL_H
#define ZAYA_GPU_MODEL_INTERNAL_H

#include "gpu/gpu.h"
#include "gpu/gpu_model.h"
#include "model/model.h"

struct GpuModel {
    GpuCtx g;
    const Model *host;   /* the table (shapes, offsets) */
    ZayaConfig cfg;
    float *params, *grads; /* device arenas, the host table's layout */
    uint16_t *params16;    /* bf16 copy of params (bf16 products) */
    /* the lean fp32 arena (bf16 inference, ZAYA_GPU_ARENA=lean): params is the base of a sparse range that holds only
     * the tensors fp32 kernels read, fp32_ranges [offset, count] pairs (floats, merged); NULL: one whole allocation */
    GpuSparse *params_sparse;
    size_t *fp32_ranges;
    int n_fp32_ranges;
    int bf16, bf16_stale;
    Weights w, gw;         /* views of params / grads */
    float *unit_scale, *zero_bias, *merge_grad_sink; /* no_residual_scaling constants (device) */
    Activations a;         /* device buffers (acts_carve over acts_block) */
    void *acts_block;
    size_t acts_bytes;
    int32_t *targets;      /* device [N] */
    int32_t *plan;         /* device: embedding-gradient plan, rows [N] | start [N + 1] | tok [N] | count [1] */
    int32_t *h_plan, *h_work, *h_tokens; /* host staging */
    int32_t *h_off;        /* host copies of each layer's expert offsets [L, E + 1] */
    double *loss_sum;      /* device: Σ of each loss pass's mean since the last take (gk_loss_add) */
    float *loss_scale;     /* device: the last loss pass's 1 / valid targets (gk_loss_scale) */
    int32_t *loss_valid;   /* device: its count of valid targets */
    int n_parts;           /* loss passes since the last take */
    char device_line[400];
    ZyErr err;             /* the first failure inside a pass (products report errors; kernels do not) */
    int failed;
    double *tm;            /* per-phase seconds (gpu_model_set_timing), NULL: off */
    uint16_t *op16[2];     /* bf16 runs: an activation operand of several products, rounded once (gpu_model.c op16) */
    size_t op16_elems;     /* capacity of each, in bf16 values (N rows by the widest activation) */
    int experts_grouped;   /* bf16 experts as grouped products sized on the device (0: ZAYA_GPU_EXPERTS=loop) */
    int attn_cudnn;        /* bf16 attention through cuDNN's fused SDPA where it takes the shape (ZAYA_GPU_ATTENTION) */
    unsigned char *attn_ran_cudnn; /* [layers]: whether layer l's last forward ran on cuDNN (its backward must too) */
    int few_rows;          /* decoding's few-row steps through gk_skinny_* (0: ZAYA_GPU_FEW_ROWS=off) */
    int conv_tc;           /* bf16 runs: the CCA convolution's products on tensor cores (0: ZAYA_GPU_CONV=fp32) */
    int window_tc;         /* bf16 runs: sliding-window attention on tensor cores (0: ZAYA_GPU_WINDOW_TC=off) */
    int decode_layer_persistent; /* decoding's one-token steps a layer a launch (ZAYA_GPU_DECODE_LAYER=persistent) */
    long decode_layer_runs;      /* layers run (or captured) that way so far */
    /* ZAYA_GPU_GRAPHS=1: a training micro-batch's forward, loss and backward captured once as a CUDA graph and replayed
     * (gpu_model_train_micro); graphs_refused says why a capture was refused (then the passes run as launches) */
    int graphs;
    void *micro_graph;
    const void *micro_graph_bufs[4]; /* the movable buffers it was captured over: a move retires it */
    int micro_graph_kernels;
    long micro_graph_replays;
    char graphs_refused[160];
};

/* bf16 runs: the bf16 copies of the weights rebuilt from the fp32 arena after a change (gpu_model_weights_changed, an
 * upload); in a lean arena only the tensors it holds (the matrices have no fp32 copy there: their bf16 one is the
 * only one). */
void gpu_model_refresh_bf16(GpuModel *gm);
/* ZAYA_GPU_GRAPHS: *on = 1 where it is 1 (unset or 0: off); any other value is an error naming it. */
int gpu_graphs_requested(int *on, ZyErr *err);
/* C = A Wᵀ (A [M, K] with row stride lda, W [N, K]), W16 its bf16 view: a linear layer, as zy_matmul_wt_ctx. */
void gpu_mm_wt(GpuModel *gm, int M, int N, int K, const float *A, int lda, const float *W, const uint16_t *W16,
               float *C, int ldc);
/* The CCA convolutions of B sequences of T rows (X [B·T, C], M and Y as gk_cca_conv_forward's) with layer W's
 * weights: the grouped product on tensor cores in bf16 runs (gk_cca_conv_forward_bf16) unless ZAYA_GPU_CONV=fp32. */
void gpu_cca_conv_forward(GpuModel *gm, const LayerWeights *W, float *Y, float *M, const float *X, int B, int T);
/* One linear layer of several that read the same rows: y = A Wᵀ, W [n, K], y with row stride ldy; with bias set,
 * y = gelu(A Wᵀ + bias) (gk_bias_gelu_forward's y). */
typedef struct GpuLinear {
    const float *w;
    float *y;
    int n, ldy;
    const float *bias;
} GpuLinear;
/* The n <= GK_SKINNY_OUTS linear layers p of the same rows A [M, K] (lda): at decoding's few rows in bf16 runs one
 * few-row launch for all of them (gk_skinny_mm), else one product each, A rounded to bf16 once for them all in bf16
 * runs (where the operand buffers hold it). */
void gpu_mm_wt_rows(GpuModel *gm, int M, int K, const float *A, int lda, const GpuLinear *p, int n);
/* bf16 runs: op16's buffers hold at least `rows` rows of the widest activation operand (grown, never shrunk, here;
 * gpu_model_set_shape sizes them for its batch), so passes of up to that many rows share rounded operands and run the
 * experts grouped. */
int gpu_model_reserve_operands(GpuModel *gm, size_t rows, ZyErr *err);
/* The bf16 view of a weight inside the parameter arena (NULL in fp32 mode). */
const uint16_t *gpu_bf16_of(const GpuModel *gm, const float *w);
/* The embedding rows a pass gathers in bf16 (gk_embed_forward's emb16): bf16 inference gathers the embedding's bf16
 * copy, as the CPU's bf16 inference does (and a lean arena holds no fp32 one); training and fp32 runs the fp32 rows
 * (NULL). */
const uint16_t *gpu_embed16(const GpuModel *gm);
void gpu_zero(GpuModel *gm, void *p, size_t floats);
/* The router's tail of layer W over L's buffers for N rows (gk_skinny_router_tail's, gk_decode_layers'). */
void gpu_router_tail_desc(const GpuModel *gm, const LayerWeights *W, const LayerActs *L, const float *r_prev, int N,
                          GkRouterTail *t);
/* The MoE block over N rows whose buffers L points at (router, top-1, per-expert products, combine), as
 * moe_block_forward; with per-expert products (fp32 runs), layer l's expert offsets land in gm->h_off. decoding:
 * nothing but moe_out is read afterwards, so steps of few rows may take the few-row products (no expert grouping). */
void gpu_moe_forward(GpuModel *gm, int l, const LayerWeights *W, LayerActs *L, const float *r_prev, int N,
                     int decoding);
/* Phase timing (gpu_model_set_timing): a time stamp after draining the queue, and its accumulation. */
double gpu_tick(GpuModel *gm);
void gpu_tock(GpuModel *gm, ModelPhase phase, double *t0);

#endif

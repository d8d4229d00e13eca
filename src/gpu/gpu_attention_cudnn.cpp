/* gpu_attention_cudnn: causal (and sliding-window) GQA attention through cuDNN's fused SDPA, forward and backward.
 *
 * Why: the own tensor-core flash attention (gpu_attention_tc.cu, WMMA) runs at ~75-100 TFLOP/s on an H200; cuDNN's
 * fused SDPA engines are FlashAttention-class on Hopper. They are NVIDIA's library, loaded at run time: the build
 * needs only the headers (cudnn-frontend, header-only, from PyPI's nvidia-cudnn-frontend; cudnn.h from
 * nvidia-cudnn-cu13), and `zaya` dlopens libcudnn.so.9 when a bf16 run first asks for attention (ZAYA_CUDNN_LIB=path,
 * else the loader's search path, else where the build found the library). Without it, for shapes its engines refuse,
 * and on request (ZAYA_GPU_ATTENTION=own) the own kernels run: the caller asks gk_cudnn_attention_plan first and
 * takes one path for both passes of a layer (both write the natural-log LSE, but each backward is checked only
 * against its own forward's O and LSE, whose roundings differ).
 *
 * Contract: gk_flash_attention_forward_bf16's layouts (Q, O [B*T, Hq*dh], K, V [B*T, Hkv*dh], LSE [B, Hq, T]: the
 * token-major tensors are handed to cuDNN as strided [B, H, T, dh] views) and semantics (scores scaled by 1/sqrt(dh),
 * causal, 0 < window < T: query q sees keys q-window+1 .. q, as cuDNN's left bound W keeps key k where k + W > q;
 * a window of T or more is plain causal; the backward accumulates into dQ, dK, dV). cuDNN's operands
 * and results are bf16: Q, K, V, dO are rounded into bf16 scratch first, O and the gradients widened (added) after.
 * LSE is cuDNN's softmax statistics (natural log, fp32). The backward runs cuDNN's deterministic algorithm, so a step
 * gives the same bits on every run. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <cstring> /* the frontend's headers use std::strlen without it */
#include <map>
#include <stdexcept>
#include <memory>
#include <tuple>
#include <unordered_map>

#include <cuda_runtime.h>
#include <cudnn_frontend.h>

#include "gpu_kernels.h"

namespace cudnn_frontend {
void *cudnn_dlhandle = nullptr; /* the frontend's dynamic-loading mode calls through this handle */
}
namespace fe = cudnn_frontend;

namespace attention_cudnn {

enum : int64_t { Q_UID = 1, K_UID, V_UID, O_UID, STATS_UID, DO_UID, DQ_UID, DK_UID, DV_UID };
constexpr int MIN_VERSION = 90300; /* cuDNN 9.3: deterministic Hopper SDPA backward, sliding windows */

int state = -1; /* -1 not tried, 0 unavailable, 1 loaded */
cudnnHandle_t handle = nullptr;
char why[256] = "not loaded yet";
char refusal[512]; /* the last shape cuDNN refused or run that failed, and why ("" when none) */

bool load() {
    if (state >= 0) return state == 1;
    state = 0;
    const char *env = getenv("ZAYA_CUDNN_LIB");
    const char *names[] = {env, "libcudnn.so.9",
#ifdef ZAYA_CUDNN_LIBDIR
                           ZAYA_CUDNN_LIBDIR "/libcudnn.so.9"
#else
                           nullptr
#endif
    };
    void *h = nullptr;
    for (const char *n : names)
        if (n && *n && (h = dlopen(n, RTLD_NOW | RTLD_LOCAL))) break;
    if (!h) {
        snprintf(why, sizeof why, "libcudnn.so.9 not found (ZAYA_CUDNN_LIB=path, or the loader's search path)");
        return false;
    }
    fe::cudnn_dlhandle = h;
    size_t version = 0;
    cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
    try { /* the frontend throws where the library lacks a symbol it looks up */
        version = fe::detail::get_backend_version();
        if (version >= MIN_VERSION) st = fe::detail::create_handle(&handle);
    } catch (const std::exception &e) {
        snprintf(why, sizeof why, "%s", e.what());
        return false;
    }
    if (version < MIN_VERSION) {
        snprintf(why, sizeof why, "cuDNN %zu is older than %d", version, MIN_VERSION);
        return false;
    }
    if (st != CUDNN_STATUS_SUCCESS) {
        snprintf(why, sizeof why, "cuDNN %zu loaded, but cudnnCreate failed (status %d)", version, (int)st);
        return false;
    }
    state = 1;
    return true;
}

/* The fwd and bwd graphs of one shape, built together: a shape is cuDNN's for both passes or for neither. */
struct Plan {
    std::shared_ptr<fe::graph::Graph> fwd, bwd;
    int64_t ws_fwd = 0, ws_bwd = 0;
    bool ok = false;
};
using Key = std::tuple<int, int, int, int, int, int>; /* B, T, Hq, Hkv, dh, window */
/* Leaked on purpose: destroying the graphs at exit would call into cuDNN after the CUDA runtime's own teardown. */
std::map<Key, Plan> &plans = *new std::map<Key, Plan>;

/* A window of T or more masks nothing: plain causal, as the CPU reference and the own kernels take it (one graph,
 * without the band mask, for both). */
int effective_window(int T, int window) { return window > 0 && window < T ? window : 0; }

/* A token-major [B*T, H*dh] tensor as cuDNN's [B, H, T, dh] view; bf16 unless said. */
std::shared_ptr<fe::graph::Tensor_attributes> tensor(fe::graph::Graph &g, const char *name, int64_t uid, int64_t B,
                                                     int64_t H, int64_t T, int64_t dh) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_uid(uid)
                        .set_dim({B, H, T, dh})
                        .set_stride({T * H * dh, dh, H * dh, 1}));
}
void as_output(const std::shared_ptr<fe::graph::Tensor_attributes> &t, int64_t uid, int64_t B, int64_t H, int64_t T,
               int64_t dh) {
    t->set_output(true).set_uid(uid).set_dim({B, H, T, dh}).set_stride({T * H * dh, dh, H * dh, 1});
}
std::shared_ptr<fe::graph::Graph> new_graph() {
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    return g;
}

Plan build_graphs(int B, int T, int Hq, int Hkv, int dh, int window) {
    Plan p;
    const float scale = (float)(1.0 / sqrt((double)dh));
    p.fwd = new_graph();
    {
        fe::graph::Graph &g = *p.fwd;
        auto q = tensor(g, "Q", Q_UID, B, Hq, T, dh), k = tensor(g, "K", K_UID, B, Hkv, T, dh),
             v = tensor(g, "V", V_UID, B, Hkv, T, dh);
        auto opt = fe::graph::SDPA_attributes().set_name("attention").set_generate_stats(true).set_attn_scale(scale)
                       .set_causal_mask(true);
        if (window > 0) opt.set_diagonal_band_left_bound(window);
        auto [o, stats] = g.sdpa(q, k, v, opt);
        as_output(o, O_UID, B, Hq, T, dh);
        stats->set_output(true)
            .set_uid(STATS_UID)
            .set_dim({B, Hq, T, 1})
            .set_stride({(int64_t)Hq * T, T, 1, 1}) /* LSE [B, Hq, T], as the own kernels' */
            .set_data_type(fe::DataType_t::FLOAT);
    }
    p.bwd = new_graph();
    {
        fe::graph::Graph &g = *p.bwd;
        auto q = tensor(g, "Q", Q_UID, B, Hq, T, dh), k = tensor(g, "K", K_UID, B, Hkv, T, dh),
             v = tensor(g, "V", V_UID, B, Hkv, T, dh), o = tensor(g, "O", O_UID, B, Hq, T, dh),
             dout = tensor(g, "dO", DO_UID, B, Hq, T, dh);
        auto stats = g.tensor(fe::graph::Tensor_attributes()
                                  .set_name("Stats")
                                  .set_uid(STATS_UID)
                                  .set_dim({B, Hq, T, 1})
                                  .set_stride({(int64_t)Hq * T, T, 1, 1})
                                  .set_data_type(fe::DataType_t::FLOAT));
        auto opt = fe::graph::SDPA_backward_attributes().set_name("attention_backward").set_attn_scale(scale)
                       .set_causal_mask(true).set_deterministic_algorithm(true);
        if (window > 0) opt.set_diagonal_band_left_bound(window);
        auto [dq, dk, dv] = g.sdpa_backward(q, k, v, o, dout, stats, opt);
        as_output(dq, DQ_UID, B, Hq, T, dh);
        as_output(dk, DK_UID, B, Hkv, T, dh);
        as_output(dv, DV_UID, B, Hkv, T, dh);
    }
    const char *what[2] = {"forward", "backward"};
    for (int pass = 0; pass < 2; pass++) {
        fe::graph::Graph &g = pass ? *p.bwd : *p.fwd;
        int64_t &ws = pass ? p.ws_bwd : p.ws_fwd;
        auto built = g.build(handle, {fe::HeurMode_t::A});
        auto st = built.is_good() ? g.get_workspace_size(ws) : built;
        if (!st.is_good()) {
            snprintf(refusal, sizeof refusal, "it refused B %d T %d Hq %d Hkv %d dh %d window %d, %s graph: %s", B, T,
                     Hq, Hkv, dh, window, what[pass], st.get_message().c_str());
            return Plan{};
        }
    }
    p.ok = true;
    return p;
}

/* The frontend throws where the library lacks a symbol it calls: such a shape is simply not cuDNN's. */
Plan build(int B, int T, int Hq, int Hkv, int dh, int window) {
    try {
        return build_graphs(B, T, Hq, Hkv, dh, window);
    } catch (const std::exception &e) {
        snprintf(refusal, sizeof refusal, "it refused B %d T %d Hq %d Hkv %d dh %d window %d: %s", B, T, Hq, Hkv, dh,
                 window, e.what());
        return Plan{};
    }
}

/* bf16 scratch and cuDNN's workspace, grown on demand (never during a graph capture), per process: one stream at a
 * time uses it (training's). */
void *scratch = nullptr;
size_t scratch_bytes = 0;

bool capturing(GkStream s) {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    return cudaStreamIsCapturing(s, &st) != cudaSuccess || st != cudaStreamCaptureStatusNone;
}

void *scratch_for(GkStream s, size_t bytes) {
    if (bytes <= scratch_bytes) return scratch;
    if (capturing(s)) return nullptr;
    cudaStreamSynchronize(s);
    if (scratch) cudaFree(scratch);
    const size_t had = scratch_bytes;
    scratch = nullptr;
    scratch_bytes = 0;
    if (cudaMalloc(&scratch, bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        /* keep what the layers whose forward already ran here need for their backward */
        if (had && cudaMalloc(&scratch, had) == cudaSuccess)
            scratch_bytes = had;
        else
            scratch = nullptr, (void)cudaGetLastError();
        return nullptr;
    }
    scratch_bytes = bytes;
    return scratch;
}

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

/* The scratch of a shape: the backward's bf16 copies (Q, O, dO, dQ and K, V, dK, dV) and the larger workspace (on
 * Hopper the deterministic backward's holds a bf16 dP, B*Hq*T*T). The forward takes it all, so that a layer whose
 * forward ran here finds its backward's memory: that backward has no other path. */
size_t scratch_need(const Plan &p, size_t nq, size_t nk) {
    return 4 * align256(nq * 2) + 4 * align256(nk * 2) + align256((size_t)std::max(p.ws_fwd, p.ws_bwd));
}

/* The cached plan of a shape, built on first use; nullptr where cuDNN is not loaded or refuses it. */
const Plan *plan_for(int B, int T, int Hq, int Hkv, int dh, int window) {
    if (!load() || B <= 0 || T <= 0 || Hq <= 0 || Hkv <= 0 || Hq % Hkv || (dh != 64 && dh != 128)) return nullptr;
    window = effective_window(T, window);
    const Key key{B, T, Hq, Hkv, dh, window};
    auto it = plans.find(key);
    if (it == plans.end()) it = plans.emplace(key, build(B, T, Hq, Hkv, dh, window)).first;
    return it->second.ok ? &it->second : nullptr;
}

/* Runs a built graph on s; false where cuDNN fails, the reason in the status line (an exception must not cross
 * into the C caller). */
bool run(fe::graph::Graph &g, const char *what, GkStream s, std::unordered_map<int64_t, void *> &pack, void *ws) {
    try {
        const cudnnStatus_t st = fe::detail::set_stream(handle, s);
        if (st != CUDNN_STATUS_SUCCESS) {
            snprintf(refusal, sizeof refusal, "the %s failed: cudnnSetStream status %d", what, (int)st);
            return false;
        }
        auto done = g.execute(handle, pack, ws);
        if (!done.is_good())
            snprintf(refusal, sizeof refusal, "the %s failed: %s", what, done.get_message().c_str());
        return done.is_good();
    } catch (const std::exception &e) {
        snprintf(refusal, sizeof refusal, "the %s failed: %s", what, e.what());
        return false;
    }
}

} // namespace attention_cudnn
using namespace attention_cudnn;

extern "C" int gk_cudnn_attention_available(void) { return load() ? 1 : 0; }

extern "C" const char *gk_cudnn_attention_status(void) {
    static char line[800];
    if (state < 0) load();
    if (state != 1) return why;
    snprintf(line, sizeof line, "cuDNN %zu%s%s%s", fe::detail::get_backend_version(), *refusal ? " (" : "", refusal,
             *refusal ? ")" : "");
    return line;
}

extern "C" int gk_cudnn_attention_plan(int B, int T, int Hq, int Hkv, int dh, int window) {
    return plan_for(B, T, Hq, Hkv, dh, window) ? 1 : 0;
}

extern "C" int gk_cudnn_attention_forward(GkStream s, float *O, float *LSE, const float *Q, const float *K,
                                          const float *V, int B, int T, int Hq, int Hkv, int dh, int window) {
    const Plan *p = plan_for(B, T, Hq, Hkv, dh, window);
    if (!p) return -1;
    const size_t nq = (size_t)B * T * Hq * dh, nk = (size_t)B * T * Hkv * dh;
    char *w = static_cast<char *>(scratch_for(s, scratch_need(*p, nq, nk)));
    if (!w) return -1;
    uint16_t *q16 = (uint16_t *)w, *k16 = (uint16_t *)(w + align256(nq * 2)), *v16 = k16 + align256(nk * 2) / 2;
    uint16_t *o16 = v16 + align256(nk * 2) / 2;
    void *ws = (char *)o16 + align256(nq * 2);
    gk_f32_to_bf16(s, q16, Q, (long)nq);
    gk_f32_to_bf16(s, k16, K, (long)nk);
    gk_f32_to_bf16(s, v16, V, (long)nk);
    std::unordered_map<int64_t, void *> pack = {
        {Q_UID, q16}, {K_UID, k16}, {V_UID, v16}, {O_UID, o16}, {STATS_UID, LSE}};
    if (!run(*p->fwd, "forward", s, pack, ws)) return -2;
    gk_bf16_to_f32(s, O, o16, (long)nq);
    return 0;
}

extern "C" int gk_cudnn_attention_backward(GkStream s, float *dQ, float *dK, float *dV, const float *dO,
                                           const float *O, const float *LSE, const float *Q, const float *K,
                                           const float *V, int B, int T, int Hq, int Hkv, int dh, int window) {
    const Plan *p = plan_for(B, T, Hq, Hkv, dh, window);
    if (!p) return -1;
    const size_t nq = (size_t)B * T * Hq * dh, nk = (size_t)B * T * Hkv * dh, aq = align256(nq * 2),
                 ak = align256(nk * 2);
    /* Q, O, dO, dQ (nq each) and K, V, dK, dV (nk each) in bf16, then the workspace */
    char *w = static_cast<char *>(scratch_for(s, scratch_need(*p, nq, nk)));
    if (!w) return -1;
    uint16_t *q16 = (uint16_t *)w, *o16 = (uint16_t *)(w + aq), *do16 = (uint16_t *)(w + 2 * aq),
             *dq16 = (uint16_t *)(w + 3 * aq), *k16 = (uint16_t *)(w + 4 * aq), *v16 = (uint16_t *)(w + 4 * aq + ak),
             *dk16 = (uint16_t *)(w + 4 * aq + 2 * ak), *dv16 = (uint16_t *)(w + 4 * aq + 3 * ak);
    void *ws = w + 4 * aq + 4 * ak;
    gk_f32_to_bf16(s, q16, Q, (long)nq);
    gk_f32_to_bf16(s, o16, O, (long)nq); /* the forward's bf16 O exactly: O was widened from it */
    gk_f32_to_bf16(s, do16, dO, (long)nq);
    gk_f32_to_bf16(s, k16, K, (long)nk);
    gk_f32_to_bf16(s, v16, V, (long)nk);
    std::unordered_map<int64_t, void *> pack = {{Q_UID, q16},  {K_UID, k16},   {V_UID, v16},   {O_UID, o16},
                                                {DO_UID, do16}, {STATS_UID, (void *)LSE}, {DQ_UID, dq16},
                                                {DK_UID, dk16}, {DV_UID, dv16}};
    if (!run(*p->bwd, "backward", s, pack, ws)) return -2;
    gk_add_bf16_to_f32(s, dQ, dq16, (long)nq);
    gk_add_bf16_to_f32(s, dK, dk16, (long)nk);
    gk_add_bf16_to_f32(s, dV, dv16, (long)nk);
    return 0;
}

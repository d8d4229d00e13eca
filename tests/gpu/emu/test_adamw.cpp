/* src/gpu/gpu_adamw.cu run on the CPU (cuda_emu.h): the multi-tensor AdamW pass against the CPU optimizer's own
 * element update (adamw_elem, src/optim/adamw_elem.h) bit for bit — weights, both moments — over several steps, with
 * decayed and undecayed chunks, the router's learning rate, partial blocks, an owned block that starts inside the
 * arena, the bf16 copy it writes checked against zy_f32_to_bf16 (nearest even; ties, NaN, values that round to
 * inf), and clipping folded into the pass (grad_scale: adamw_elem on grad_clip's g·scale; the gradients themselves
 * left as they were). Every element outside the chunks must stay untouched. Prints "gpu-emu: N passed, N failed". */
#define ZAYA_GPU_EMU 1
#include "gpu_adamw.cu"
#include "emu_check.h"

#include <cmath>
#include <cstdio>
#include <vector>

#include "optim/adamw_elem.h"
#include "util/util.h"

/* the emulator's __float_as_uint / __uint_as_float (cuda_emu.h) */
static uint32_t bits(float f) { return __float_as_uint(f); }
static float from_bits(uint32_t u) { return __uint_as_float(u); }

/* optim.c's step_consts at step t and learning rate lr */
static GkOptimStep consts(double lr, int t, double b1, double b2, double eps, double wd, float grad_scale) {
    GkOptimStep k{};
    k.grad_scale = grad_scale;
    k.step_size = (float)(lr / (1.0 - std::pow(b1, t)));
    k.eps = (float)eps;
    k.b1 = (float)b1;
    k.b2 = (float)b2;
    k.inv_bc2 = (float)(1.0 / std::sqrt(1.0 - std::pow(b2, t)));
    k.adam_decay = (float)(1.0 - lr * wd);
    k.lr = lr;
    return k;
}

/* The arena: total floats, the owned block [begin, total); tensors as chunks (one of them cut into two chunks). */
static void run_case(const char *name, bool with_copy, float grad_scale) {
    const uint64_t total = 3000, begin = 200;
    const GpuOptimChunk chunks[] = {
        {210, 1, GPU_OPTIM_DECAY},                        /* one element */
        {300, 255, 0},                                    /* a partial block, no decay (a norm) */
        {555, 256, GPU_OPTIM_DECAY},                      /* a whole block */
        {811, 700, GPU_OPTIM_DECAY},                      /* one tensor in two chunks */
        {1511, 300, GPU_OPTIM_DECAY},
        {1900, 513, GPU_OPTIM_ROUTER | GPU_OPTIM_DECAY}, /* the router: lr × router_lr_scale */
        {2500, 77, GPU_OPTIM_ROUTER},
    };
    const int n_chunks = (int)(sizeof chunks / sizeof chunks[0]);
    std::vector<float> w(total), g(total), m(total - begin), v(total - begin);
    for (uint64_t i = 0; i < total; i++) w[i] = urand() * 0.5f, g[i] = urand() * 0.01f;
    for (uint64_t i = 0; i < total - begin; i++) m[i] = urand() * 1e-3f, v[i] = std::fabs(urand()) * 1e-5f;
    /* the bf16 copy's hard cases among the weights: an exact tie both ways, a NaN, the largest float (rounds to
     * inf), a negative zero, a subnormal */
    const uint64_t hard[] = {400, 401, 402, 403, 404, 405}; /* in the undecayed chunk, zero gradients: unchanged */
    w[hard[0]] = from_bits(0x3f808000u), w[hard[1]] = from_bits(0x3f818000u), w[hard[2]] = NAN;
    w[hard[3]] = from_bits(0x7f7fffffu), w[hard[4]] = -0.0f, w[hard[5]] = from_bits(0x00000123u);
    for (uint64_t i : hard) g[i] = 0, m[i - begin] = 0, v[i - begin] = 0;
    std::vector<float> rw = w, rm = m, rv = v, w0 = w, m0 = m, v0 = v, g0 = g;
    const uint16_t SENT = 0xbeef;
    std::vector<uint16_t> w16(total, SENT);
    bool same = true;
    for (int t = 1; t <= 3; t++) {
        const double lr = 1e-3 * t, router_scale = 0.1;
        const GkOptimStep k0 = consts(lr, t, 0.9, 0.95, 1e-8, 0.1, grad_scale),
                          k1 = consts(lr * router_scale, t, 0.9, 0.95, 1e-8, 0.1, grad_scale);
        gk_adamw(nullptr, w.data(), with_copy ? w16.data() : nullptr, g.data(), m.data(), v.data(), begin, chunks,
                 n_chunks, k0, k1);
        for (const GpuOptimChunk &c : chunks) {
            const GkOptimStep &k = (c.flags & GPU_OPTIM_ROUTER) ? k1 : k0;
            const float decay = (c.flags & GPU_OPTIM_DECAY) ? k.adam_decay : 1.0f;
            for (uint64_t o = c.off; o < c.off + c.len; o++) {
                float clipped = g[o];
                if (grad_scale != 1.0f) clipped *= grad_scale; /* grad_clip's multiply, only when it clips */
                adamw_elem(&rw[o], &clipped, &rm[o - begin], &rv[o - begin], k.step_size, k.eps, k.b1, k.b2,
                           k.inv_bc2, decay);
            }
        }
        for (uint64_t i = 0; i < total; i++) same = same && bits(w[i]) == bits(rw[i]);
        for (uint64_t i = 0; i < total - begin; i++)
            same = same && bits(m[i]) == bits(rm[i]) && bits(v[i]) == bits(rv[i]);
    }
    char what[256];
    std::snprintf(what, sizeof what, "%s: weights, m and v equal adamw_elem's bit for bit over 3 steps", name);
    report(same, what);
    bool grads_kept = true;
    for (uint64_t i = 0; i < total; i++) grads_kept = grads_kept && bits(g[i]) == bits(g0[i]);
    std::snprintf(what, sizeof what, "%s: the gradients left as they were", name);
    report(grads_kept, what);
    /* outside the chunks: weights and moments as they were (rw never touched them either: check against the start) */
    bool untouched = true;
    std::vector<bool> in(total, false);
    for (const GpuOptimChunk &c : chunks)
        for (uint64_t o = c.off; o < c.off + c.len; o++) in[o] = true;
    for (uint64_t i = 0; i < total; i++)
        if (!in[i]) {
            untouched = untouched && bits(w[i]) == bits(w0[i]) && w16[i] == SENT;
            if (i >= begin) untouched = untouched && bits(m[i - begin]) == bits(m0[i - begin]);
        }
    std::snprintf(what, sizeof what, "%s: everything outside the chunks untouched", name);
    report(untouched, what);
    if (!with_copy) {
        bool none = true;
        for (uint16_t x : w16) none = none && x == SENT;
        std::snprintf(what, sizeof what, "%s: no bf16 copy asked, none written", name);
        report(none, what);
        return;
    }
    bool copy = true;
    int mismatches = 0;
    for (uint64_t i = 0; i < total; i++)
        if (in[i] && w16[i] != zy_f32_to_bf16(w[i])) copy = false, mismatches++;
    std::snprintf(what, sizeof what, "%s: the bf16 copy is zy_f32_to_bf16 of every updated weight (%d differ)", name,
                  mismatches);
    report(copy, what);
    /* the hard cases kept their meaning: the NaN stays a NaN, the largest float went to inf, the ties to even */
    const bool hard_ok = w16[hard[0]] == 0x3f80 && w16[hard[1]] == 0x3f82 && (w16[hard[2]] & 0x7fff) > 0x7f80 &&
                         w16[hard[3]] == 0x7f80 && w16[hard[4]] == 0x8000;
    std::snprintf(what, sizeof what, "%s: ties to even, NaN kept, overflow to inf, -0 kept", name);
    report(hard_ok, what);
}

int main() {
    emu_rng() = 0x2545f4914f6cdd1dull;
    run_case("AdamW pass with the bf16 copy", true, 1.0f);
    run_case("AdamW pass without a copy", false, 1.0f);
    run_case("AdamW pass clipping as it reads (grad_scale 0.37)", true, 0.37f);
    std::printf("gpu-emu: %d passed, %d failed\n", emu_passed(), emu_failed());
    return emu_failed() != 0;
}

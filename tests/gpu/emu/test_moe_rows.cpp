/* src/gpu/gpu_moe.cu's expert data movement run on the CPU (cuda_emu.h), each against the same sums on the host, bit
 * for bit: the gather of routed rows (fp32, and bf16 for the products' operands), the scatter-add back, the combine
 * (gate times the expert's output into each routed row, zeros into the skip expert's), the gate's backward (dy in fp32
 * or bf16, dgate's double sum within 1e-6), and SwiGLU forward and backward (fp32 accumulating, bf16 written). Each
 * with a row count held on the device below the launch's bound (the rows past it must stay as they were) and
 * without, at widths that take the 4-wide and the 1-wide paths. Prints "gpu-emu: N passed, N failed". */
#define ZAYA_GPU_EMU 1
#if GPU_WARP == 64
#define ZAYA_HIP 1
#endif
#include "gpu_moe.cu"
#include "emu_check.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

static const float POISON = -12345.0f;
static uint16_t rne(float f) { /* bf16 bits, nearest even (finite inputs) */
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static uint32_t bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}
static std::vector<float> rnd(size_t n) {
    std::vector<float> v(n);
    for (float &x : v) x = urand();
    return v;
}
static std::string tag(const char *op, int D, bool bf16, bool on_dev) {
    return std::string(op) + ", width " + std::to_string(D) + (bf16 ? ", bf16 out" : ", fp32 out") +
           (on_dev ? ", count on the device" : "");
}

static void gather_case(int D, bool bf16, bool on_dev) {
    const int R = 50, n = 37, count = on_dev ? 29 : n;
    const std::vector<float> src = rnd((size_t)R * D);
    std::vector<int32_t> idx((size_t)n);
    for (int k = 0; k < n; k++) idx[(size_t)k] = (k * 17 + 3) % R;
    std::vector<float> dst((size_t)n * D, POISON);
    std::vector<uint16_t> dst16((size_t)n * D, 0xdead);
    const int32_t dev = count;
    if (bf16) gk_gather_rows_bf16(nullptr, dst16.data(), src.data(), idx.data(), n, on_dev ? &dev : nullptr, D);
    else gk_gather_rows(nullptr, dst.data(), src.data(), idx.data(), n, on_dev ? &dev : nullptr, D);
    long bad = 0;
    for (int k = 0; k < n; k++)
        for (int j = 0; j < D; j++) {
            const size_t o = (size_t)k * D + j;
            const float want = k < count ? src[(size_t)idx[(size_t)k] * D + j] : POISON;
            if (bf16) bad += dst16[o] != (k < count ? rne(want) : 0xdead);
            else bad += bits(dst[o]) != bits(want);
        }
    report(bad == 0, (tag("gather", D, bf16, on_dev) + ": " + std::to_string(bad) + " wrong").c_str());
}

static void scatter_case(int D, bool on_dev) {
    const int R = 50, n = 37, count = on_dev ? 23 : n;
    std::vector<float> dst = rnd((size_t)R * D), want = dst;
    const std::vector<float> src = rnd((size_t)n * D);
    std::vector<int32_t> idx((size_t)n);
    for (int k = 0; k < n; k++) idx[(size_t)k] = (k * 7 + 5) % R; /* distinct: 7 is prime to 50 */
    for (int k = 0; k < count; k++)
        for (int j = 0; j < D; j++) want[(size_t)idx[(size_t)k] * D + j] += src[(size_t)k * D + j];
    const int32_t dev = count;
    gk_scatter_add_rows(nullptr, dst.data(), src.data(), idx.data(), n, on_dev ? &dev : nullptr, D);
    long bad = 0;
    for (size_t i = 0; i < dst.size(); i++) bad += bits(dst[i]) != bits(want[i]);
    report(bad == 0, (tag("scatter-add", D, false, on_dev) + ": " + std::to_string(bad) + " wrong").c_str());
}

/* rows routed to E experts (some to the skip expert), grouped as the model does */
struct Routing {
    int rows, E;
    std::vector<int32_t> choice, off, sorted;
    std::vector<float> gate;
};
static Routing route(int rows, int E) {
    Routing r{rows, E, std::vector<int32_t>((size_t)rows), std::vector<int32_t>((size_t)E + 1),
              std::vector<int32_t>((size_t)rows), std::vector<float>((size_t)rows)};
    for (int i = 0; i < rows; i++) {
        r.choice[(size_t)i] = (i * 5 + i / 3) % (E + 1); /* E: the skip expert */
        r.gate[(size_t)i] = 0.5f * (urand() + 1.0f);
    }
    gk_group_by_expert(nullptr, r.off.data(), r.sorted.data(), r.choice.data(), rows, E);
    return r;
}

static void combine_case(int D) {
    const Routing r = route(45, 4);
    const int n = r.off[(size_t)r.E];
    const std::vector<float> y = rnd((size_t)r.rows * D); /* rows past n: never read */
    std::vector<float> out((size_t)r.rows * D, POISON), want((size_t)r.rows * D, POISON);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < D; j++) {
            const int row = r.sorted[(size_t)i];
            want[(size_t)row * D + j] = r.gate[(size_t)row] * y[(size_t)i * D + j];
        }
    for (int i = 0; i < r.rows; i++)
        if (r.choice[(size_t)i] == r.E)
            for (int j = 0; j < D; j++) want[(size_t)i * D + j] = 0.0f;
    /* the model's call: n unknown on the host, so the bound is every row and the count is off[E] on the device */
    gk_moe_combine(nullptr, out.data(), y.data(), r.gate.data(), r.sorted.data(), r.choice.data(), r.rows, r.rows,
                   &r.off[(size_t)r.E], D, r.E);
    long bad = 0;
    for (size_t i = 0; i < out.size(); i++) bad += bits(out[i]) != bits(want[i]);
    report(bad == 0,
           (tag("combine", D, false, true) + ": " + std::to_string(bad) + " wrong (every row written)").c_str());
}

static void gate_bwd_case(int D, bool bf16) {
    const Routing r = route(45, 4);
    const int n = r.off[(size_t)r.E];
    const std::vector<float> dout = rnd((size_t)r.rows * D), y = rnd((size_t)r.rows * D);
    std::vector<float> dgate = rnd((size_t)r.rows), want_dgate = dgate;
    std::vector<float> dy((size_t)r.rows * D, POISON), want_dy((size_t)r.rows * D, POISON);
    std::vector<uint16_t> dy16((size_t)r.rows * D, 0xdead);
    for (int k = 0; k < n; k++) {
        const int row = r.sorted[(size_t)k];
        double dg = 0;
        for (int j = 0; j < D; j++) {
            dg += (double)dout[(size_t)row * D + j] * y[(size_t)k * D + j];
            want_dy[(size_t)k * D + j] = r.gate[(size_t)row] * dout[(size_t)row * D + j];
        }
        want_dgate[(size_t)row] += (float)dg;
    }
    if (bf16)
        gk_moe_gate_backward_bf16(nullptr, dgate.data(), dy16.data(), dout.data(), y.data(), r.gate.data(),
                                  r.sorted.data(), r.rows, &r.off[(size_t)r.E], D);
    else
        gk_moe_gate_backward(nullptr, dgate.data(), dy.data(), dout.data(), y.data(), r.gate.data(), r.sorted.data(),
                             r.rows, &r.off[(size_t)r.E], D);
    long bad = 0;
    for (size_t i = 0; i < dy.size(); i++) {
        const bool routed = (long)i < (long)n * D;
        if (bf16) bad += dy16[i] != (routed ? rne(want_dy[i]) : 0xdead);
        else bad += bits(dy[i]) != bits(want_dy[i]);
    }
    for (int i = 0; i < r.rows; i++)
        bad += std::fabs(dgate[(size_t)i] - want_dgate[(size_t)i]) > 1e-6f * (1.0f + std::fabs(want_dgate[(size_t)i]));
    report(bad == 0, (tag("gate backward", D, bf16, true) + ": " + std::to_string(bad) + " wrong").c_str());
}

static void swiglu_case(int I, bool bf16, bool on_dev) {
    const int rows = 21, count = on_dev ? 13 : rows;
    const std::vector<float> gu = rnd((size_t)rows * 2 * I), dact = rnd((size_t)rows * I);
    const int32_t dev = count;
    /* forward */
    std::vector<float> act((size_t)rows * I, POISON);
    std::vector<uint16_t> act16((size_t)rows * I, 0xdead);
    if (bf16) gk_swiglu_forward_bf16(nullptr, act16.data(), gu.data(), rows, on_dev ? &dev : nullptr, I);
    else gk_swiglu_forward(nullptr, act.data(), gu.data(), rows, on_dev ? &dev : nullptr, I);
    long bad = 0;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < I; c++) {
            const float g = gu[(size_t)r * 2 * I + c], v = gu[(size_t)r * 2 * I + I + c];
            const float want = r < count ? g / (1.0f + std::exp(-g)) * v : POISON;
            const size_t o = (size_t)r * I + c;
            if (bf16) bad += act16[o] != (r < count ? rne(want) : 0xdead);
            else bad += bits(act[o]) != bits(want);
        }
    report(bad == 0, (tag("SwiGLU forward", I, bf16, on_dev) + ": " + std::to_string(bad) + " wrong").c_str());
    /* backward: fp32 adds into dgu, bf16 writes what it would add to zeros */
    std::vector<float> dgu = rnd((size_t)rows * 2 * I), want = bf16 ? std::vector<float>(dgu.size(), 0.0f) : dgu;
    std::vector<uint16_t> dgu16((size_t)rows * 2 * I, 0xdead);
    for (int r = 0; r < count; r++)
        for (int c = 0; c < I; c++) {
            const size_t og = (size_t)r * 2 * I + c, ov = og + I;
            const float g = gu[og], v = gu[ov], d = dact[(size_t)r * I + c];
            const float sg = 1.0f / (1.0f + std::exp(-g));
            want[og] += d * v * sg * (1.0f + g * (1.0f - sg));
            want[ov] += d * g * sg;
        }
    if (bf16) gk_swiglu_backward_bf16(nullptr, dgu16.data(), dact.data(), gu.data(), rows, on_dev ? &dev : nullptr, I);
    else gk_swiglu_backward(nullptr, dgu.data(), dact.data(), gu.data(), rows, on_dev ? &dev : nullptr, I);
    bad = 0;
    for (size_t i = 0; i < dgu.size(); i++) {
        if (bf16) bad += dgu16[i] != ((long)i < (long)count * 2 * I ? rne(want[i]) : 0xdead);
        else bad += bits(dgu[i]) != bits(want[i]);
    }
    report(bad == 0, (tag("SwiGLU backward", I, bf16, on_dev) + ": " + std::to_string(bad) + " wrong").c_str());
}

int main() {
    emu_rng() = 0x6d6f65726f7773ull;
    for (int D : {64, 30})
        for (bool on_dev : {false, true}) {
            gather_case(D, false, on_dev);
            gather_case(D, true, on_dev);
            scatter_case(D, on_dev);
            swiglu_case(D, false, on_dev);
            swiglu_case(D, true, on_dev);
        }
    for (int D : {64, 30}) {
        combine_case(D);
        gate_bwd_case(D, false);
        gate_bwd_case(D, true);
    }
    std::printf("gpu-emu: %d passed, %d failed (MoE rows, warp of %d lanes)\n", emu_passed(), emu_failed(), GPU_WARP);
    return emu_failed() != 0;
}

/* src/gpu/gpu_cca.cu run on the CPU (cuda_emu.h): every host entry point against a reference on the host.
 *   The convolutions (fp32 and bf16 forms): the depthwise M bit for bit (the kernel repeats the CPU's unfused order);
 *   Y, and the backward's dX, dw0, db0, dw1, db1 from double sums, each within TOL of its magnitude (the sum of the
 *   absolute values of every product it adds, through dM for the depthwise gradients): the GPU sums in fp32 in
 *   another order (fused multiply-adds, split partials), so only the order and fp32 rounding differ. Shapes take the
 *   tiled kernels (k 1-4) and the naive ones (k > 4), each mixed with the other, the weight gradient with one row
 *   split and with several (split partials parked in dM, then the reduce), the depthwise gradient with one row chunk
 *   and with several (its reduce), heads past one 128-wide tile, sizes that are no multiple of a tile or of 4 (the
 *   scalar epilogues) and outputs off 16-byte alignment (the same); dM starts as NaN (it is scratch: nothing of it
 *   may leak), Y and M too (each element written). The bf16 forms run the products on tensor cores (gpu_cca_tc.cu)
 *   against the reference on bf16-rounded operands; their dw1 and db1 are the fp32 form's bits.
 *   The q-k mean skip (GQA), the delayed values, RoPE (partial and odd rotary widths, by row and by position table):
 *   bit for bit against the CPU's operations (src/kernels/kernels.inc) repeated here in fp32.
 *   The QK L2 norm + RoPE forward (one part, both parts with positions) and its backward (dx, dtemp), a zero head
 *   under the norm clamp: within TOL of the magnitude (the squares and dot products are double sums in another
 *   order); the backward without dtemp gives the same dx bits, and a rerun the same bits.
 * Prints "gpu-emu: N passed, N failed". */
#define ZAYA_GPU_EMU 1
#include "gpu_cca.cu"
#include "gpu_cca_tc.cu" /* the bf16 forms' tensor-core products */
#include "emu_check.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

/* Relative to the magnitude (the sum of |terms|): fp32 sums in another order are off by a few units of 2^-24 of it
 * (measured: at most 2.1e-7, the 390-term products of dh 130 with 3 taps; 16 units of 2^-24 allowed). */
static const double TOL = 1e-6;

static std::vector<float> rnd(size_t n, float scale = 1.0f) {
    std::vector<float> v(n);
    for (float &x : v) x = scale * urand();
    return v;
}
static float nan_poison() { return __uint_as_float(0xffffffffu); }

/* n floats at a 16-byte boundary plus off floats (off 1: the kernels' scalar epilogues), filled from v or poisoned. */
struct Buf {
    std::vector<float> store;
    float *p;
    Buf(size_t n, int off = 0) : store(n + 8, nan_poison()) {
        p = reinterpret_cast<float *>(((uintptr_t)store.data() + 15) & ~(uintptr_t)15) + off;
    }
    Buf(const std::vector<float> &v, int off = 0) : Buf(v.size(), off) {
        for (size_t i = 0; i < v.size(); i++) p[i] = v[i];
    }
};

/* Compares got with want, within TOL of mag, or bit for bit (same); worst: the largest |got - want| / mag. */
struct Diff {
    long bad = 0;
    double worst = 0;
    void near(double got, double want, double mag) {
        const double err = std::fabs(got - want);
        if (!(err <= TOL * mag)) bad++;
        const double rel = err / (mag > 0 ? mag : 1e-300);
        worst = std::isnan(rel) ? INFINITY : std::fmax(worst, rel);
    }
    void same(float got, float want) { bad += __float_as_uint(got) != __float_as_uint(want); }
    void same_all(const float *got, const float *want, size_t n) {
        for (size_t i = 0; i < n; i++) same(got[i], want[i]);
    }
};
static void report_diff(const Diff &d, const std::string &what) {
    char line[320];
    std::snprintf(line, sizeof line, "%s: %ld wrong, worst %.1e of magnitude", what.c_str(), d.bad, d.worst);
    report(d.bad == 0, line);
}
static void report_same(const Diff &d, const std::string &what) {
    report(d.bad == 0, (what + ": " + std::to_string(d.bad) + " not bit-identical").c_str());
}

/* ---- the two causal convolutions ----------------------------------------------------------------------------- */

struct ConvCase {
    int B, T, groups, dh, k0, k1;
    bool bf16;    /* the _bf16 forms */
    int misalign; /* 1: Y, dM and dw1 one float off 16-byte alignment */
    bool twice;   /* the backward again: the same bits */
};

static void conv_case(const ConvCase &cc) {
    const int B = cc.B, T = cc.T, dh = cc.dh, C = cc.groups * dh, k0 = cc.k0, k1 = cc.k1, TM = T + k1 - 1;
    const long R = (long)B * TM;
    const size_t nx = (size_t)B * T * C, nm = (size_t)R * C, nw1 = (size_t)C * dh * k1, nw0 = (size_t)C * k0;
    /* the bf16 forms take the tensor cores where gk_cca_conv_gemm_tc takes the shape; else the fp32 kernels */
    const bool tc = cc.bf16 && dh % 16 == 0 && k1 <= 4;
    auto op = [&](float v) { return tc ? (double)gk_bf16_round(v) : (double)v; }; /* a grouped product's operand */
    char tagc[120];
    std::snprintf(tagc, sizeof tagc, "conv%s B %d T %d C %d dh %d k %d,%d%s", cc.bf16 ? " bf16" : "", B, T, C, dh, k0,
                  k1, cc.misalign ? " misaligned" : "");
    const std::string tag = tagc;
    const std::vector<float> X = rnd(nx), w0 = rnd(nw0, 0.7f), b0 = rnd(C, 0.5f);
    const std::vector<float> w1 = rnd(nw1, (float)(1.0 / std::sqrt((double)dh * k1))), b1 = rnd(C, 0.5f);
    const std::vector<float> dY = rnd(nx), dX0 = rnd(nx), dw00 = rnd(nw0), db00 = rnd(C), dw10 = rnd(nw1), db10 = rnd(C);

    auto fwd = cc.bf16 ? gk_cca_conv_forward_bf16 : gk_cca_conv_forward;
    auto bwd = cc.bf16 ? gk_cca_conv_backward_bf16 : gk_cca_conv_backward;
    Buf Y(nx, cc.misalign), M(nm);
    fwd(nullptr, Y.p, M.p, X.data(), w0.data(), b0.data(), w1.data(), b1.data(), B, T, C, dh, k0, k1);

    /* M: the CPU's order (bias, then each tap's product added), unfused fp32 */
    std::vector<float> Mref(nm);
    for (long e = 0; e < R; e++) {
        const int b = (int)(e / TM), i = (int)(e % TM);
        for (int c = 0; c < C; c++) {
            float m = b0[c];
            for (int j = 0; j < k0; j++) {
                const int t = i - (k1 - 1) - (k0 - 1) + j;
                if (t >= 0) m = m + w0[(size_t)c * k0 + j] * X[((size_t)b * T + t) * C + c];
            }
            Mref[(size_t)e * C + c] = m;
        }
    }
    Diff dm_;
    dm_.same_all(M.p, Mref.data(), nm);
    report_same(dm_, tag + ": M, all B(T+k1-1) rows");

    Diff dy_;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int o = 0; o < C; o++) {
                const int g = o / dh;
                double s = b1[o], mag = std::fabs(b1[o]);
                for (int j = 0; j < k1; j++)
                    for (int ii = 0; ii < dh; ii++) {
                        const double p = op(Mref[((size_t)b * TM + t + j) * C + g * dh + ii]) *
                                         op(w1[((size_t)o * dh + ii) * k1 + j]);
                        s += p, mag += std::fabs(p);
                    }
                dy_.near(Y.p[((size_t)b * T + t) * C + o], s, mag);
            }
    report_diff(dy_, tag + ": Y");

    /* the backward from the reference M; gradients preloaded, dM NaN (scratch) */
    Buf dX(dX0), dw0(dw00), db0(db00), dw1(dw10, cc.misalign), db1(db10), dM(nm, cc.misalign);
    bwd(nullptr, dX.p, dw0.p, db0.p, dw1.p, db1.p, dM.p, dY.data(), X.data(), Mref.data(), w0.data(), w1.data(), B, T,
        C, dh, k0, k1);

    /* dM (double) and its magnitude: dM[e][g·dh+ii] = Σ_j Σ_o dE[e-j][g·dh+o] w1[g·dh+o, ii, j], dE the dY rows with
     * zeros at t >= T */
    std::vector<double> dMr(nm, 0.0), dMmag(nm, 0.0);
    for (long e = 0; e < R; e++)
        for (int c = 0; c < C; c++) {
            const int g = c / dh, ii = c % dh;
            double s = 0, mag = 0;
            for (int j = 0; j < k1; j++) {
                const long es = e - j;
                if (es < 0) continue;
                const long b = es / TM, t = es % TM;
                if (t >= T) continue;
                for (int o = 0; o < dh; o++) {
                    const double p = op(dY[((size_t)b * T + t) * C + g * dh + o]) *
                                     op(w1[(((size_t)g * dh + o) * dh + ii) * k1 + j]);
                    s += p, mag += std::fabs(p);
                }
            }
            dMr[(size_t)e * C + c] = s, dMmag[(size_t)e * C + c] = mag;
        }
    Diff ddx, ddw0, ddb0, ddw1, ddb1;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++) {
                const size_t xi = ((size_t)b * T + t) * C + c;
                double s = dX0[xi], mag = std::fabs(dX0[xi]);
                for (int j = 0; j < k0; j++) {
                    const int i = t + (k0 - 1) - j + (k1 - 1);
                    if (i >= TM) continue;
                    const size_t mi = ((size_t)b * TM + i) * C + c;
                    s += dMr[mi] * w0[(size_t)c * k0 + j], mag += dMmag[mi] * std::fabs(w0[(size_t)c * k0 + j]);
                }
                ddx.near(dX.p[xi], s, mag);
            }
    for (int c = 0; c < C; c++) {
        double s = db00[c], mag = std::fabs(db00[c]);
        for (long e = 0; e < R; e++) s += dMr[(size_t)e * C + c], mag += dMmag[(size_t)e * C + c];
        ddb0.near(db0.p[c], s, mag);
        for (int j = 0; j < k0; j++) {
            double sw = dw00[(size_t)c * k0 + j], mw = std::fabs(sw);
            for (int b = 0; b < B; b++)
                for (int i = 0; i < TM; i++) {
                    const int t = i - (k1 - 1) - (k0 - 1) + j;
                    if (t < 0) continue;
                    const size_t mi = ((size_t)b * TM + i) * C + c;
                    const double x = X[((size_t)b * T + t) * C + c];
                    sw += dMr[mi] * x, mw += dMmag[mi] * std::fabs(x);
                }
            ddw0.near(dw0.p[(size_t)c * k0 + j], sw, mw);
        }
        double sb = db10[c], mb = std::fabs(db10[c]);
        for (long r = 0; r < (long)B * T; r++) sb += dY[(size_t)r * C + c], mb += std::fabs(dY[(size_t)r * C + c]);
        ddb1.near(db1.p[c], sb, mb);
    }
    for (int o = 0; o < C; o++) /* dw1: fp32 operands in both forms */
        for (int ii = 0; ii < dh; ii++)
            for (int j = 0; j < k1; j++) {
                const size_t wi = ((size_t)o * dh + ii) * k1 + j;
                const int g = o / dh;
                double s = dw10[wi], mag = std::fabs(dw10[wi]);
                for (int b = 0; b < B; b++)
                    for (int t = 0; t < T; t++) {
                        const double p = (double)dY[((size_t)b * T + t) * C + o] *
                                         Mref[((size_t)b * TM + t + j) * C + g * dh + ii];
                        s += p, mag += std::fabs(p);
                    }
                ddw1.near(dw1.p[wi], s, mag);
            }
    report_diff(ddx, tag + ": dX +=");
    report_diff(ddw0, tag + ": dw0 +=");
    report_diff(ddb0, tag + ": db0 +=");
    report_diff(ddw1, tag + ": dw1 +=");
    report_diff(ddb1, tag + ": db1 +=");

    if (cc.bf16) { /* the weight gradients are the fp32 kernels' in both forms */
        Buf fX(dX0), fw0(dw00), fb0(db00), fw1(dw10, cc.misalign), fb1(db10), fM(nm, cc.misalign);
        gk_cca_conv_backward(nullptr, fX.p, fw0.p, fb0.p, fw1.p, fb1.p, fM.p, dY.data(), X.data(), Mref.data(),
                             w0.data(), w1.data(), B, T, C, dh, k0, k1);
        Diff d;
        d.same_all(dw1.p, fw1.p, nw1);
        d.same_all(db1.p, fb1.p, C);
        report_same(d, tag + ": dw1, db1 the fp32 form's");
    }
    if (cc.twice) { /* fresh scratch, the same preloads: the same bits */
        Buf eX(dX0), ew0(dw00), eb0(db00), ew1(dw10, cc.misalign), eb1(db10), eM(nm, cc.misalign);
        bwd(nullptr, eX.p, ew0.p, eb0.p, ew1.p, eb1.p, eM.p, dY.data(), X.data(), Mref.data(), w0.data(), w1.data(), B,
            T, C, dh, k0, k1);
        Diff d;
        d.same_all(eX.p, dX.p, nx);
        d.same_all(ew0.p, dw0.p, nw0);
        d.same_all(eb0.p, db0.p, C);
        d.same_all(ew1.p, dw1.p, nw1);
        d.same_all(eb1.p, db1.p, C);
        report_same(d, tag + ": backward rerun");
    }
}

/* ---- q-k mean skip ------------------------------------------------------------------------------------------- */

static void qk_mean_case(int rows, int Hq, int Hkv, int dh) {
    const int G = Hq / Hkv, C = (Hq + Hkv) * dh, Cq = Hq * dh, Ck = Hkv * dh;
    const size_t nc = (size_t)rows * C, nq = (size_t)rows * Cq, nk = (size_t)rows * Ck;
    const std::string tag = "qk_mean rows " + std::to_string(rows) + " Hq " + std::to_string(Hq) + " Hkv " +
                            std::to_string(Hkv) + " dh " + std::to_string(dh);
    const std::vector<float> Y = rnd(nc), X = rnd(nc);
    Buf q(nq), k(nk);
    gk_qk_mean_forward(nullptr, q.p, k.p, Y.data(), X.data(), rows, Hq, Hkv, dh);
    std::vector<float> qr(nq), kr(nk);
    for (int r = 0; r < rows; r++) /* the CPU's qk_mean_forward */
        for (int j = 0; j < Hkv; j++)
            for (int i = 0; i < dh; i++) {
                const float *x = &X[(size_t)r * C], *y = &Y[(size_t)r * C];
                const double kk = x[Cq + j * dh + i];
                double sum = 0;
                for (int g = 0; g < G; g++) {
                    const int h = j * G + g;
                    const float qm = (float)((x[h * dh + i] + kk) * 0.5);
                    qr[(size_t)r * Cq + h * dh + i] = y[h * dh + i] + qm;
                    sum += qm;
                }
                kr[(size_t)r * Ck + j * dh + i] = y[Cq + j * dh + i] + (float)(sum / G);
            }
    Diff df;
    df.same_all(q.p, qr.data(), nq);
    df.same_all(k.p, kr.data(), nk);
    report_same(df, tag + ": forward query, key");

    const std::vector<float> dq = rnd(nq), dk = rnd(nk), dY0 = rnd(nc), dX0 = rnd(nc);
    Buf dY(dY0), dX(dX0);
    gk_qk_mean_backward(nullptr, dY.p, dX.p, dq.data(), dk.data(), rows, Hq, Hkv, dh);
    std::vector<float> dYr = dY0, dXr = dX0;
    for (int r = 0; r < rows; r++) /* the CPU's qk_mean_backward */
        for (int j = 0; j < Hkv; j++)
            for (int i = 0; i < dh; i++) {
                float *dx = &dXr[(size_t)r * C], *dy = &dYr[(size_t)r * C];
                const float *dqr = &dq[(size_t)r * Cq];
                const float dkj = dk[(size_t)r * Ck + j * dh + i];
                double dqm_sum = 0;
                for (int g = 0; g < G; g++) {
                    const int h = j * G + g;
                    const float dqm = dqr[h * dh + i] + dkj / G;
                    dy[h * dh + i] += dqr[h * dh + i];
                    dx[h * dh + i] += dqm * 0.5f;
                    dqm_sum += dqm;
                }
                dy[Cq + j * dh + i] += dkj;
                dx[Cq + j * dh + i] += (float)(dqm_sum * 0.5);
            }
    Diff db;
    db.same_all(dY.p, dYr.data(), nc);
    db.same_all(dX.p, dXr.data(), nc);
    report_same(db, tag + ": backward dY +=, dX +=");
}

/* ---- delayed values ------------------------------------------------------------------------------------------ */

static void delayed_value_case(int B, int T, int half) {
    const size_t nh = (size_t)B * T * half, nv = 2 * nh;
    const std::string tag = "delayed_value B " + std::to_string(B) + " T " + std::to_string(T) + " half " +
                            std::to_string(half);
    const std::vector<float> vc = rnd(nh), vd = rnd(nh);
    Buf v(nv);
    gk_delayed_value_forward(nullptr, v.p, vc.data(), vd.data(), B, T, half);
    std::vector<float> vr(nv);
    for (long r = 0; r < (long)B * T; r++)
        for (int i = 0; i < half; i++) {
            vr[(size_t)r * 2 * half + i] = vc[(size_t)r * half + i];
            vr[(size_t)r * 2 * half + half + i] = r % T > 0 ? vd[(size_t)(r - 1) * half + i] : 0.0f;
        }
    Diff df;
    df.same_all(v.p, vr.data(), nv);
    report_same(df, tag + ": forward");

    const std::vector<float> dv = rnd(nv), dvc0 = rnd(nh), dvd0 = rnd(nh);
    Buf dvc(dvc0), dvd(dvd0);
    gk_delayed_value_backward(nullptr, dvc.p, dvd.p, dv.data(), B, T, half);
    std::vector<float> dvcr = dvc0, dvdr = dvd0;
    for (long r = 0; r < (long)B * T; r++)
        for (int i = 0; i < half; i++) {
            dvcr[(size_t)r * half + i] += dv[(size_t)r * 2 * half + i];
            if (r % T + 1 < T) dvdr[(size_t)r * half + i] += dv[(size_t)(r + 1) * 2 * half + half + i];
        }
    Diff db;
    db.same_all(dvc.p, dvcr.data(), nh);
    db.same_all(dvd.p, dvdr.data(), nh);
    report_same(db, tag + ": backward dvc +=, dvd +=");
}

/* ---- RoPE ---------------------------------------------------------------------------------------------------- */

/* cos / sin tables of T positions, rd / 2 columns (as rope_tables builds them; at least one float each) */
struct Tables {
    std::vector<float> cosv, sinv;
    Tables(int T, int rd) {
        const int half = rd / 2;
        cosv.assign((size_t)T * half + 1, 0.0f), sinv.assign((size_t)T * half + 1, 0.0f);
        for (int i = 0; i < half; i++) {
            const float inv_freq = 1.0f / std::pow(10000.0f, (float)(2 * i) / (float)rd);
            for (int t = 0; t < T; t++) {
                const float a = (float)t * inv_freq;
                cosv[(size_t)t * half + i] = std::cos(a), sinv[(size_t)t * half + i] = std::sin(a);
            }
        }
    }
};

/* the CPU's rope_forward / rope_backward on one row of H heads at table row p */
static void rope_row_ref(float *v, const Tables &tb, long p, int H, int dh, int half, bool back) {
    const float *c = &tb.cosv[(size_t)p * half], *s = &tb.sinv[(size_t)p * half];
    for (int h = 0; h < H; h++)
        for (int i = 0; i < half; i++) {
            float *x = v + (size_t)h * dh;
            const float a = x[i], b = x[i + half];
            x[i] = back ? a * c[i] + b * s[i] : a * c[i] - b * s[i];
            x[i + half] = back ? b * c[i] - a * s[i] : b * c[i] + a * s[i];
        }
}

static void rope_case(int rows, int T, int H, int dh, int rd) {
    const size_t n = (size_t)rows * H * dh;
    const int half = rd / 2;
    const std::string tag = "rope rows " + std::to_string(rows) + " T " + std::to_string(T) + " H " +
                            std::to_string(H) + " dh " + std::to_string(dh) + " rd " + std::to_string(rd);
    const std::vector<float> x0 = rnd(n);
    const Tables tb(T, rd);
    std::vector<int32_t> pos(rows);
    for (int r = 0; r < rows; r++) pos[r] = (int)((urand() + 1.0f) * 0.5f * T) % T; /* a ragged batch's positions */
    for (int form = 0; form < 3; form++) { /* forward by row, forward by position, backward */
        Buf x(x0);
        std::vector<float> xr = x0;
        if (form == 0) gk_rope_forward(nullptr, x.p, tb.cosv.data(), tb.sinv.data(), rows, T, H, dh, rd);
        if (form == 1) gk_rope_forward_pos(nullptr, x.p, tb.cosv.data(), tb.sinv.data(), pos.data(), rows, H, dh, rd);
        if (form == 2) gk_rope_backward(nullptr, x.p, tb.cosv.data(), tb.sinv.data(), rows, T, H, dh, rd);
        for (int r = 0; r < rows; r++)
            rope_row_ref(&xr[(size_t)r * H * dh], tb, form == 1 ? pos[r] : r % T, H, dh, half, form == 2);
        Diff d;
        d.same_all(x.p, xr.data(), n);
        report_same(d, tag + (form == 0 ? ": forward" : form == 1 ? ": forward at positions" : ": backward"));
    }
}

/* ---- QK L2 norm + partial RoPE ------------------------------------------------------------------------------- */

static const float NORM_EPS = 1.1920928955078125e-07f;

/* The CPU's l2norm_rope_forward of one head (fp32, the squares summed in order): y, norm, and each y's magnitude. */
static float l2norm_rope_head_ref(float *y, double *mag, const float *x, const float *temp, const float *c,
                                  const float *s, int dh, int half, float scale) {
    double ss = 0;
    for (int i = 0; i < dh; i++) ss += (double)x[i] * x[i];
    const float n = (float)std::sqrt(ss), f = scale / (n > NORM_EPS ? n : NORM_EPS);
    for (int i = 0; i < dh; i++) y[i] = temp ? (x[i] * f) * *temp : x[i] * f;
    for (int i = 0; i < dh; i++) mag[i] = std::fabs(y[i]);
    for (int i = 0; i < half; i++) {
        const float a = y[i], b = y[i + half];
        y[i] = a * c[i] - b * s[i];
        y[i + half] = b * c[i] + a * s[i];
        mag[i] = std::fabs(a * c[i]) + std::fabs(b * s[i]), mag[i + half] = std::fabs(b * c[i]) + std::fabs(a * s[i]);
    }
    return n;
}

/* gk_l2norm_rope_forward (Hk 0: the Hq heads alone, row r at r % T) or gk_l2norm_rope_qk_forward (Hq query heads,
 * Hk key heads with a temperature; at positions pos or at r % T) */
static void l2norm_rope_fwd_check(const std::string &tag, int rows, int T, int dh, int rd, float scale, int Hq,
                                  bool q_temp, int Hk, bool with_pos) {
    const int half = rd / 2;
    const Tables tb(T, rd);
    std::vector<int32_t> pos(rows);
    for (int r = 0; r < rows; r++) pos[r] = with_pos ? (int)((urand() + 1.0f) * 0.5f * T) % T : r % T;
    struct Part {
        int H;
        std::vector<float> x, temp;
        Buf y, norm;
        Part(int rows, int H_, int dh, bool with_temp)
            : H(H_), x(rnd((size_t)rows * H_ * dh)), temp(with_temp ? rnd(H_) : std::vector<float>()),
              y((size_t)rows * H_ * dh), norm((size_t)rows * H_) {
            if (rows > 1 && H > 0) /* row 1's first head zero: the norm clamp */
                std::fill(x.begin() + (size_t)H * dh, x.begin() + (size_t)H * dh + dh, 0.0f);
        }
        GkNormRopePart gk() { return GkNormRopePart{y.p, norm.p, x.data(), temp.empty() ? nullptr : temp.data(), H}; }
    };
    Part q(rows, Hq, dh, q_temp), k(rows, Hk, dh, true);
    if (Hk == 0)
        gk_l2norm_rope_forward(nullptr, q.y.p, q.norm.p, q.x.data(), q.temp.empty() ? nullptr : q.temp.data(),
                               tb.cosv.data(), tb.sinv.data(), rows, T, Hq, dh, rd, scale, NORM_EPS);
    else
        gk_l2norm_rope_qk_forward(nullptr, q.gk(), k.gk(), tb.cosv.data(), tb.sinv.data(),
                                  with_pos ? pos.data() : nullptr, rows, T, dh, rd, scale, NORM_EPS);
    Diff dy, dn;
    std::vector<float> y(dh);
    std::vector<double> mag(dh);
    for (Part *p : {&q, &k}) {
        if (p->H == 0) continue;
        for (int r = 0; r < rows; r++)
            for (int h = 0; h < p->H; h++) {
                const size_t it = (size_t)r * p->H + h;
                const float n = l2norm_rope_head_ref(y.data(), mag.data(), &p->x[it * dh],
                                                     p->temp.empty() ? nullptr : &p->temp[h],
                                                     &tb.cosv[(size_t)pos[r] * half], &tb.sinv[(size_t)pos[r] * half],
                                                     dh, half, scale);
                dn.near(p->norm.p[it], n, n);
                for (int i = 0; i < dh; i++) dy.near(p->y.p[it * dh + i], y[i], mag[i]);
            }
    }
    report_diff(dy, tag + ": forward y");
    report_diff(dn, tag + ": forward norm");
}

static void l2norm_rope_case(int rows, int T, int H, int dh, int rd, bool with_temp) {
    const size_t n = (size_t)rows * H * dh, nn = (size_t)rows * H;
    const int half = rd / 2;
    const float scale = std::sqrt((float)dh);
    const std::string tag = "l2norm_rope rows " + std::to_string(rows) + " T " + std::to_string(T) + " H " +
                            std::to_string(H) + " dh " + std::to_string(dh) + " rd " + std::to_string(rd) +
                            (with_temp ? " temp" : "");
    l2norm_rope_fwd_check(tag, rows, T, dh, rd, scale, H, with_temp, 0, false);

    /* the backward, from the reference's norms: dx overwritten (NaN before), dtemp accumulates, dy scratch */
    const Tables tb(T, rd);
    std::vector<float> x = rnd(n);
    if (rows > 1) std::fill(x.begin() + (size_t)H * dh, x.begin() + (size_t)H * dh + dh, 0.0f); /* the norm clamp */
    const std::vector<float> temp = with_temp ? rnd(H) : std::vector<float>(), dy0 = rnd(n), dtemp0 = rnd(H);
    const float *tp = with_temp ? temp.data() : nullptr;
    std::vector<float> norm(nn), yscratch(dh);
    std::vector<double> mscratch(dh);
    for (size_t it = 0; it < nn; it++)
        norm[it] = l2norm_rope_head_ref(yscratch.data(), mscratch.data(), &x[it * dh], tp ? tp + it % H : nullptr,
                                        tb.cosv.data(), tb.sinv.data(), dh, half, scale);
    Buf dx(n), dtemp(dtemp0), dy(dy0);
    gk_rope_l2norm_backward(nullptr, dx.p, dtemp.p, dy.p, x.data(), norm.data(), tp, tb.cosv.data(), tb.sinv.data(),
                            rows, T, H, dh, rd, scale, NORM_EPS);
    Diff ddx, ddt;
    std::vector<double> dt(H, 0.0), dtmag(H, 0.0);
    std::vector<float> dyr(dh);
    for (int r = 0; r < rows; r++)
        for (int h = 0; h < H; h++) { /* the CPU's rope_l2norm_backward */
            const size_t it = (size_t)r * H + h;
            const float *xv = &x[it * dh], *c = &tb.cosv[(size_t)(r % T) * half], *s = &tb.sinv[(size_t)(r % T) * half];
            std::memcpy(dyr.data(), &dy0[it * dh], (size_t)dh * 4);
            for (int i = 0; i < half; i++) {
                const float a = dyr[i], b = dyr[i + half];
                dyr[i] = a * c[i] + b * s[i];
                dyr[i + half] = b * c[i] - a * s[i];
            }
            const double t = tp ? (double)tp[h] : 1.0;
            const float nv = norm[it];
            double dot = 0, dotmag = 0;
            for (int i = 0; i < dh; i++) dot += (double)dyr[i] * xv[i], dotmag += std::fabs((double)dyr[i] * xv[i]);
            const bool live = nv > NORM_EPS;
            const double f = live ? t * scale / nv : t * scale / NORM_EPS, cc = live ? dot / ((double)nv * nv) : 0.0;
            const double ccmag = live ? dotmag / ((double)nv * nv) : 0.0;
            for (int i = 0; i < dh; i++)
                ddx.near(dx.p[it * dh + i], f * (dyr[i] - cc * xv[i]),
                         std::fabs(f) * (std::fabs(dyr[i]) + ccmag * std::fabs(xv[i])));
            const double fq = scale / (nv > NORM_EPS ? nv : NORM_EPS); /* the CPU's: a float quotient */
            dt[h] += dot * fq, dtmag[h] += dotmag * fq;
        }
    for (int h = 0; h < H; h++) ddt.near(dtemp.p[h], dtemp0[h] + dt[h], std::fabs(dtemp0[h]) + dtmag[h]);
    report_diff(ddx, tag + ": backward dx");
    report_diff(ddt, tag + ": backward dtemp +=");

    /* without dtemp (the query's path): the same dx bits; with it again: the same dx and dtemp bits */
    Buf dx2(n), dy2(dy0), dx3(n), dy3(dy0), dtemp3(dtemp0);
    gk_rope_l2norm_backward(nullptr, dx2.p, nullptr, dy2.p, x.data(), norm.data(), tp, tb.cosv.data(), tb.sinv.data(),
                            rows, T, H, dh, rd, scale, NORM_EPS);
    gk_rope_l2norm_backward(nullptr, dx3.p, dtemp3.p, dy3.p, x.data(), norm.data(), tp, tb.cosv.data(),
                            tb.sinv.data(), rows, T, H, dh, rd, scale, NORM_EPS);
    Diff d;
    d.same_all(dx2.p, dx.p, n);
    d.same_all(dx3.p, dx.p, n);
    d.same_all(dtemp3.p, dtemp.p, H);
    report_same(d, tag + ": backward without dtemp, and rerun");
}

/* rows 0 launch nothing and leave the buffers alone */
static void empty_launches() {
    const std::vector<float> h = rnd(64);
    std::vector<float> d = h;
    float *p = d.data();
    gk_cca_conv_forward(nullptr, p, p, p, p, p, p, p, 0, 4, 8, 4, 2, 2);
    gk_cca_conv_backward(nullptr, p, p, p, p, p, p, p, p, p, p, p, 0, 4, 8, 4, 2, 2);
    gk_qk_mean_forward(nullptr, p, p, p, p, 0, 2, 1, 4);
    gk_qk_mean_backward(nullptr, p, p, p, p, 0, 2, 1, 4);
    gk_delayed_value_forward(nullptr, p, p, p, 0, 4, 4);
    gk_delayed_value_backward(nullptr, p, p, p, 2, 0, 4);
    gk_l2norm_rope_forward(nullptr, p, p, p, p, p, p, 0, 4, 2, 4, 4, 2.0f, 1e-7f);
    gk_rope_l2norm_backward(nullptr, p, p, p, p, p, p, p, p, 0, 4, 2, 4, 4, 2.0f, 1e-7f);
    gk_rope_forward(nullptr, p, p, p, 0, 4, 2, 4, 4);
    gk_rope_backward(nullptr, p, p, p, 0, 4, 2, 4, 4);
    report(std::memcmp(d.data(), h.data(), 64 * 4) == 0, "empty launches (rows 0) touch nothing");
}

int main() {
    emu_rng() = 0x636361656d75ull;
    /* B, T, groups, dh, k0, k1, bf16, misalign, twice */
    const ConvCase conv[] = {
        {2, 37, 3, 8, 2, 2, false, 0, false},   /* ZAYA's taps; sequences inside one row tile */
        {2, 300, 2, 16, 3, 2, false, 0, true},  /* dw1 in 9 row splits + reduce, depthwise in 2 chunks + reduce */
        {1, 9, 2, 6, 5, 5, false, 0, false},    /* both naive fallbacks (k > 4), col_reduce's db1 */
        {2, 33, 2, 16, 2, 2, true, 0, false},   /* bf16: Y and dM on tensor cores */
        {1, 1, 2, 8, 3, 3, false, 0, false},    /* B = T = 1, shorter than both kernels */
        {2, 7, 3, 5, 3, 1, false, 0, false},    /* odd sizes, k1 = 1: scalar epilogues (dh, dh·k1 not multiples of 4) */
        {3, 5, 2, 12, 1, 3, false, 0, false},   /* several sequences a row tile, k0 = 1 */
        {1, 40, 2, 130, 2, 3, false, 0, false}, /* dh > 128: two output tiles, dh·k1 = 390 over four kk tiles */
        {2, 150, 1, 20, 4, 4, false, 0, false}, /* k = 4, the largest tiled; dw1 in 3 splits */
        {2, 260, 2, 16, 2, 2, false, 1, false}, /* misaligned: scalar Y, dM, dw1 partial stores; 8 splits, 2 chunks */
        {2, 37, 3, 8, 2, 2, false, 1, false},   /* misaligned dw1 with one split: the scalar add */
        {2, 11, 2, 4, 5, 2, false, 0, false},   /* tiled grouped, naive depthwise */
        {2, 10, 1, 8, 2, 6, false, 0, false},   /* naive grouped, tiled depthwise */
        {1, 70, 1, 32, 3, 3, true, 0, true},    /* bf16, 3 taps, rerun */
        {2, 7, 2, 12, 2, 2, true, 0, false},    /* bf16 form, a head the tensor cores refuse: the fp32 kernels */
    };
    for (const ConvCase &cc : conv) conv_case(cc);

    qk_mean_case(7, 4, 2, 5); /* GQA, 2 query heads a kv head */
    qk_mean_case(1, 1, 1, 1);
    qk_mean_case(5, 6, 3, 100); /* kv head channels past one block (300) */
    qk_mean_case(3, 8, 8, 3);   /* G = 1 */
    qk_mean_case(4, 8, 1, 7);   /* G = 8 */
    delayed_value_case(3, 5, 7);
    delayed_value_case(1, 1, 1);
    delayed_value_case(2, 4, 300); /* columns past one block */

    rope_case(7, 3, 3, 10, 6); /* partial rotary */
    rope_case(13, 4, 2, 9, 5); /* odd rd: its last channel stays */
    rope_case(1, 1, 1, 2, 2);
    rope_case(5, 6, 3, 200, 200); /* H·half = 300: past one block */

    /* rows, T, H, dh, rd, temp */
    l2norm_rope_case(10, 5, 3, 6, 4, false);
    l2norm_rope_case(9, 3, 2, 7, 3, true); /* odd rd; 18 heads: not a multiple of a block's warps */
    l2norm_rope_case(1, 1, 1, 4, 4, true);
    l2norm_rope_case(5, 5, 2, 1, 0, true);     /* dh 1, no rotation: dtemp's single float slot */
    l2norm_rope_case(6, 3, 2, 33, 0, false);   /* dh past a 32-lane warp */
    l2norm_rope_case(20, 16, 2, 70, 64, true); /* dh past a 64-lane wavefront, partial rotary */
    /* both parts in one launch at a ragged batch's positions: queries without temperature, keys with */
    l2norm_rope_fwd_check("l2norm_rope queries + keys at positions, rows 11 Hq 4 Hkv 2 dh 12 rd 8", 11, 6, 12, 8,
                          std::sqrt(12.0f), 4, false, 2, true);
    l2norm_rope_fwd_check("l2norm_rope queries + keys by row, rows 7 Hq 3 Hkv 1 dh 40 rd 16", 7, 4, 40, 16,
                          std::sqrt(40.0f), 3, false, 1, false);
    empty_launches();

    std::printf("gpu-emu: %d passed, %d failed (CCA, warp of %d lanes)\n", emu_passed(), emu_failed(), GPU_WARP);
    return emu_failed() != 0;
}

/* Every op's backward against central finite differences, in double precision on tiny shapes, and the float
 * instantiation against the double one. The scalar checked is L = Σ g ⊙ op(inputs) for a random g. */
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "test.h"
#include "util/util.h"

#define FD_STEP 1e-5
#define FD_TOL 1e-7

typedef struct FdCase FdCase;
struct FdCase {
    void (*forward)(FdCase *c, double *out); /* recomputes the op's output from the current inputs */
    size_t n_out;
    void *state;
};

static double *randn(ZyRng *rng, size_t n, double scale) {
    double *p = calloc(n ? n : 1, sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = scale * zy_rng_normal(rng);
    return p;
}

static double weighted_sum(FdCase *c, const double *g) {
    double *out = calloc(c->n_out, sizeof *out);
    c->forward(c, out);
    double s = 0;
    for (size_t i = 0; i < c->n_out; i++) s += g[i] * out[i];
    free(out);
    return s;
}

/* Max relative error between the analytic gradient of `param` and central differences. */
static double fd_error(FdCase *c, const double *g, double *param, size_t n, const double *analytic) {
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double keep = param[i];
        param[i] = keep + FD_STEP;
        double lp = weighted_sum(c, g);
        param[i] = keep - FD_STEP;
        double lm = weighted_sum(c, g);
        param[i] = keep;
        double num = (lp - lm) / (2 * FD_STEP);
        double err = fabs(num - analytic[i]) / fmax(1.0, fabs(num));
        if (err > worst) worst = err;
    }
    return worst;
}

#define CHECK_GRAD(c, g, param, n, analytic, label)                                              \
    do {                                                                                         \
        double e_ = fd_error((c), (g), (param), (n), (analytic));                                \
        CHECK_MSG(e_ < FD_TOL, "%s: finite-difference error %.3g", (label), e_);                 \
    } while (0)

/* ---- linear ---------------------------------------------------------------------------------------------- */
typedef struct {
    double *x, *w, *b;
    int rows, in, out;
} LinearState;

static void linear_fd_forward(FdCase *c, double *out) {
    LinearState *s = c->state;
    linear_forward_f64(out, s->x, s->w, s->b, s->rows, s->in, s->out, NULL);
}

TEST(linear_backward_matches_finite_differences) {
    ZyRng rng;
    zy_rng_seed(&rng, 1);
    LinearState s = {.rows = 5, .in = 4, .out = 3};
    s.x = randn(&rng, 20, 1);
    s.w = randn(&rng, 12, 1);
    s.b = randn(&rng, 3, 1);
    FdCase c = {linear_fd_forward, 15, &s};
    double *g = randn(&rng, 15, 1), *dx = calloc(20, 8), *dw = calloc(12, 8), *db = calloc(3, 8);
    linear_backward_f64(dx, dw, db, g, s.x, s.w, s.rows, s.in, s.out, NULL);
    CHECK_GRAD(&c, g, s.x, 20, dx, "dx");
    CHECK_GRAD(&c, g, s.w, 12, dw, "dw");
    CHECK_GRAD(&c, g, s.b, 3, db, "db");
    free(s.x), free(s.w), free(s.b), free(g), free(dx), free(dw), free(db);
}

/* ---- RMSNorm --------------------------------------------------------------------------------------------- */
typedef struct {
    double *x, *w, *rstd;
    int rows, dim;
} NormState;

static void rmsnorm_fd_forward(FdCase *c, double *out) {
    NormState *s = c->state;
    rmsnorm_forward_f64(out, s->rstd, s->x, s->w, s->rows, s->dim, 1e-5);
}

TEST(rmsnorm_backward_matches_finite_differences) {
    ZyRng rng;
    zy_rng_seed(&rng, 2);
    NormState s = {.rows = 3, .dim = 7};
    s.x = randn(&rng, 21, 1);
    s.w = randn(&rng, 7, 1);
    s.rstd = calloc(3, 8);
    FdCase c = {rmsnorm_fd_forward, 21, &s};
    double *g = randn(&rng, 21, 1), *dx = calloc(21, 8), *dw = calloc(7, 8), *y = calloc(21, 8);
    rmsnorm_forward_f64(y, s.rstd, s.x, s.w, 3, 7, 1e-5);
    rmsnorm_backward_f64(dx, dw, g, s.x, s.w, s.rstd, 3, 7);
    CHECK_GRAD(&c, g, s.x, 21, dx, "dx");
    CHECK_GRAD(&c, g, s.w, 7, dw, "dw");
    free(s.x), free(s.w), free(s.rstd), free(g), free(dx), free(dw), free(y);
}

/* ---- residual merge ---------------------------------------------------------------------------------------- */
typedef struct {
    double *h, *res, *hs, *hb, *rs, *rb;
    int rows, dim;
} MergeState;

static void merge_fd_forward(FdCase *c, double *out) {
    MergeState *s = c->state;
    residual_merge_forward_f64(out, s->h, s->res, s->hs, s->hb, s->rs, s->rb, s->rows, s->dim);
}

TEST(residual_merge_backward_matches_finite_differences) {
    ZyRng rng;
    zy_rng_seed(&rng, 3);
    const int R = 3, D = 5, N = R * D;
    MergeState s = {randn(&rng, N, 1), randn(&rng, N, 1), randn(&rng, D, 1), randn(&rng, D, 1),
                    randn(&rng, D, 1), randn(&rng, D, 1), R, D};
    FdCase c = {merge_fd_forward, N, &s};
    double *g = randn(&rng, N, 1);
    double *dh = calloc(N, 8), *dres = calloc(N, 8), *dhs = calloc(D, 8), *dhb = calloc(D, 8), *drs = calloc(D, 8),
           *drb = calloc(D, 8);
    residual_merge_backward_f64(dh, dres, dhs, dhb, drs, drb, g, s.h, s.res, s.hs, s.hb, s.rs, s.rb, R, D);
    CHECK_GRAD(&c, g, s.h, N, dh, "dh");
    CHECK_GRAD(&c, g, s.res, N, dres, "dres");
    CHECK_GRAD(&c, g, s.hs, D, dhs, "dhs");
    CHECK_GRAD(&c, g, s.hb, D, dhb, "dhb");
    CHECK_GRAD(&c, g, s.rs, D, drs, "drs");
    CHECK_GRAD(&c, g, s.rb, D, drb, "drb");
    free(s.h), free(s.res), free(s.hs), free(s.hb), free(s.rs), free(s.rb), free(g);
    free(dh), free(dres), free(dhs), free(dhb), free(drs), free(drb);
}

/* ---- embedding input --------------------------------------------------------------------------------------- */
typedef struct {
    double *emb, *bias, *scale;
    const int32_t *tokens;
    int rows, dim;
} EmbedState;

static void embed_fd_forward(FdCase *c, double *out) {
    EmbedState *s = c->state;
    embed_forward_f64(out, s->emb, s->tokens, s->bias, s->scale, s->rows, s->dim);
}

TEST(embed_backward_matches_finite_differences_except_pad_row) {
    ZyRng rng;
    zy_rng_seed(&rng, 4);
    const int V = 5, D = 4, R = 6;
    static const int32_t tokens[6] = {1, 0, 3, 1, 4, 0}; /* pad id 0 appears twice, token 1 twice */
    EmbedState s = {randn(&rng, V * D, 1), randn(&rng, D, 1), randn(&rng, D, 1), tokens, R, D};
    FdCase c = {embed_fd_forward, R * D, &s};
    double *g = randn(&rng, R * D, 1), *de = calloc(V * D, 8), *db = calloc(D, 8), *ds = calloc(D, 8);
    embed_backward_f64(de, db, ds, g, s.emb, tokens, s.bias, s.scale, R, D, 0);
    for (int i = 0; i < D; i++) CHECK(de[i] == 0.0); /* the pad row receives nothing from the lookup */
    CHECK_GRAD(&c, g, s.emb + D, (V - 1) * D, de + D, "demb (non-pad rows)");
    CHECK_GRAD(&c, g, s.bias, D, db, "dbias");
    CHECK_GRAD(&c, g, s.scale, D, ds, "dscale");
    free(s.emb), free(s.bias), free(s.scale), free(g), free(de), free(db), free(ds);
}

/* ---- CCA convolutions -------------------------------------------------------------------------------------- */
typedef struct {
    double *X, *w0, *b0, *w1, *b1, *M, *wp, *dwp; /* wp, dwp: the conv's workspaces */
    ZyConvShape shape;
} ConvState;

static void conv_fd_forward(FdCase *c, double *out) {
    ConvState *s = c->state;
    cca_conv_forward_f64(out, s->M, s->wp, s->X, s->w0, s->b0, s->w1, s->b1, s->shape);
}

static void check_conv(int *zy_test_failed_, int k0, int k1, uint64_t seed) {
    ZyRng rng;
    zy_rng_seed(&rng, seed);
    ConvState s = {.shape = {.B = 2, .T = 4, .C = 6, .dh = 2, .k0 = k0, .k1 = k1}};
    const int C = s.shape.C, dh = s.shape.dh, N = s.shape.B * s.shape.T * C, NM = s.shape.B * (s.shape.T + k1 - 1) * C;
    s.X = randn(&rng, N, 1);
    s.w0 = randn(&rng, C * k0, 1);
    s.b0 = randn(&rng, C, 1);
    s.w1 = randn(&rng, C * dh * k1, 1);
    s.b1 = randn(&rng, C, 1);
    s.M = calloc(NM, 8);
    s.wp = calloc(cca_conv_work_floats(s.shape), 8);
    s.dwp = calloc(cca_conv_grad_work_floats(s.shape), 8);
    FdCase c = {conv_fd_forward, N, &s};
    double *g = randn(&rng, N, 1), *y = calloc(N, 8), *dX = calloc(N, 8), *dM = calloc(NM, 8);
    double *dw0 = calloc(C * k0, 8), *db0 = calloc(C, 8), *dw1 = calloc(C * dh * k1, 8), *db1 = calloc(C, 8);
    conv_fd_forward(&c, y);
    /* The very first output sees only padding through the depthwise conv: Y(0) = b1 + w1·[b0 ... b0, ...]. */
    cca_conv_backward_f64(dX, dw0, db0, dw1, db1, dM, s.wp, s.dwp, g, s.X, s.M, s.w0, s.w1, s.shape);
    char label[64];
    snprintf(label, sizeof label, "k0=%d k1=%d dX", k0, k1);
    CHECK_GRAD(&c, g, s.X, N, dX, label);
    CHECK_GRAD(&c, g, s.w0, C * k0, dw0, "dw0");
    CHECK_GRAD(&c, g, s.b0, C, db0, "db0");
    CHECK_GRAD(&c, g, s.w1, C * dh * k1, dw1, "dw1");
    CHECK_GRAD(&c, g, s.b1, C, db1, "db1");
    free(s.X), free(s.w0), free(s.b0), free(s.w1), free(s.b1), free(s.M), free(g), free(y), free(dX), free(dM);
    free(dw0), free(db0), free(dw1), free(db1), free(s.wp), free(s.dwp);
}

TEST(cca_conv_backward_matches_finite_differences) {
    check_conv(zy_test_failed_, 2, 2, 5);
    check_conv(zy_test_failed_, 3, 2, 6);
    check_conv(zy_test_failed_, 2, 3, 7);
    check_conv(zy_test_failed_, 1, 1, 8);
}

/* Padded positions: with X = 0 everywhere each output is b1 + Σ_{i,j} w1[o,i,j] b0[g dh + i]. */
TEST(cca_conv_padded_positions_carry_the_depthwise_bias) {
    const int B = 1, T = 3, C = 4, dh = 2, k0 = 2, k1 = 2;
    double X[12] = {0}, w0[8], b0[4] = {1, 2, 3, 4}, w1[16], b1[4] = {0.5, -0.5, 1, -1}, M[16], Y[12], wp[32];
    for (int i = 0; i < 8; i++) w0[i] = 0.1 * (i + 1);
    for (int i = 0; i < 16; i++) w1[i] = 0.01 * (i + 1);
    cca_conv_forward_f64(Y, M, wp, X, w0, b0, w1, b1, (ZyConvShape){B, T, C, dh, k0, k1});
    for (int t = 0; t < T; t++)
        for (int o = 0; o < C; o++) {
            int g = o / dh;
            double want = b1[o];
            for (int i = 0; i < dh; i++)
                for (int j = 0; j < k1; j++) want += w1[(o * dh + i) * k1 + j] * b0[g * dh + i];
            CHECK_NEAR(Y[t * C + o], want, 1e-12);
        }
}

/* ---- q-k mean skip ----------------------------------------------------------------------------------------- */
typedef struct {
    double *Y, *X;
    int rows, Hq, Hkv, dh;
} QkState;

static void qk_fd_forward(FdCase *c, double *out) {
    QkState *s = c->state;
    int Cq = s->Hq * s->dh;
    qk_mean_forward_f64(out, out + (size_t)s->rows * Cq, s->Y, s->X, s->rows, s->Hq, s->Hkv, s->dh);
}

TEST(qk_mean_backward_matches_finite_differences) {
    ZyRng rng;
    zy_rng_seed(&rng, 9);
    QkState s = {.rows = 3, .Hq = 6, .Hkv = 2, .dh = 2};
    const int C = (s.Hq + s.Hkv) * s.dh, Cq = s.Hq * s.dh, Ck = s.Hkv * s.dh, N = s.rows * C;
    s.Y = randn(&rng, N, 1);
    s.X = randn(&rng, N, 1);
    FdCase c = {qk_fd_forward, (size_t)s.rows * (Cq + Ck), &s};
    double *g = randn(&rng, c.n_out, 1), *dY = calloc(N, 8), *dX = calloc(N, 8);
    qk_mean_backward_f64(dY, dX, g, g + s.rows * Cq, s.rows, s.Hq, s.Hkv, s.dh);
    CHECK_GRAD(&c, g, s.Y, N, dY, "dY");
    CHECK_GRAD(&c, g, s.X, N, dX, "dX");
    free(s.Y), free(s.X), free(g), free(dY), free(dX);
}

/* ---- delayed values ---------------------------------------------------------------------------------------- */
typedef struct {
    double *vc, *vd;
    int B, T, half;
} DelayState;

static void delay_fd_forward(FdCase *c, double *out) {
    DelayState *s = c->state;
    delayed_value_forward_f64(out, s->vc, s->vd, s->B, s->T, s->half);
}

TEST(delayed_value_backward_matches_finite_differences) {
    ZyRng rng;
    zy_rng_seed(&rng, 10);
    DelayState s = {.B = 2, .T = 3, .half = 3};
    const int n = s.B * s.T * s.half;
    s.vc = randn(&rng, n, 1);
    s.vd = randn(&rng, n, 1);
    FdCase c = {delay_fd_forward, 2 * (size_t)n, &s};
    double *g = randn(&rng, 2 * n, 1), *dvc = calloc(n, 8), *dvd = calloc(n, 8), *v = calloc(2 * n, 8);
    delay_fd_forward(&c, v);
    CHECK(v[s.half] == 0.0 && v[s.T * 2 * s.half + s.half] == 0.0); /* t = 0 of each row sees u_{-1} = 0 */
    delayed_value_backward_f64(dvc, dvd, g, s.B, s.T, s.half);
    CHECK_GRAD(&c, g, s.vc, n, dvc, "dvc");
    CHECK_GRAD(&c, g, s.vd, n, dvd, "dvd");
    free(s.vc), free(s.vd), free(g), free(dvc), free(dvd), free(v);
}

/* ---- QK L2 norm with temperature --------------------------------------------------------------------------- */
typedef struct {
    double *x, *temp, *norm;
    int rows, H, dh;
} L2State;

static void l2_fd_forward(FdCase *c, double *out) {
    L2State *s = c->state;
    l2norm_forward_f64(out, s->norm, s->x, s->temp, s->rows, s->H, s->dh, sqrt((double)s->dh), 1.1920928955078125e-07);
}

TEST(l2norm_backward_matches_finite_differences) {
    ZyRng rng;
    zy_rng_seed(&rng, 11);
    L2State s = {.rows = 3, .H = 2, .dh = 4};
    const int n = s.rows * s.H * s.dh;
    s.x = randn(&rng, n, 1);
    s.temp = randn(&rng, s.H, 1);
    s.norm = calloc(s.rows * s.H, 8);
    for (int i = 0; i < s.dh; i++) s.x[i] *= 1e-9; /* one head below the clamp: the gradient is linear there */
    FdCase c = {l2_fd_forward, n, &s};
    double *g = randn(&rng, n, 1), *dx = calloc(n, 8), *dt = calloc(s.H, 8), *y = calloc(n, 8);
    l2_fd_forward(&c, y);
    l2norm_backward_f64(dx, dt, g, s.x, s.norm, s.temp, s.rows, s.H, s.dh, sqrt((double)s.dh), 1.1920928955078125e-07);
    /* Below the clamp (head 0 of row 0) the op is linear: dx = dy·temp·√dh/eps exactly. */
    for (int i = 0; i < s.dh; i++)
        CHECK_NEAR(dx[i], g[i] * s.temp[0] * sqrt((double)s.dh) / 1.1920928955078125e-07, 1e-12);
    CHECK_GRAD(&c, g, s.x + s.dh, n - s.dh, dx + s.dh, "dx");
    CHECK_GRAD(&c, g, s.temp, s.H, dt, "dtemp");
    free(s.x), free(s.temp), free(s.norm), free(g), free(dx), free(dt), free(y);
}

/* ---- RoPE -------------------------------------------------------------------------------------------------- */
typedef struct {
    double *x, *cosv, *sinv;
    int rows, T, H, dh, rd;
} RopeState;

static void rope_fd_forward(FdCase *c, double *out) {
    RopeState *s = c->state;
    memcpy(out, s->x, c->n_out * sizeof *out);
    rope_forward_f64(out, s->cosv, s->sinv, s->rows, s->T, s->H, s->dh, s->rd);
}

TEST(rope_backward_matches_finite_differences) {
    ZyRng rng;
    zy_rng_seed(&rng, 12);
    for (int rd = 4; rd <= 8; rd += 4) { /* partial (4 of 8) and full rotation */
        RopeState s = {.rows = 6, .T = 3, .H = 2, .dh = 8, .rd = rd};
        const int n = s.rows * s.H * s.dh;
        s.x = randn(&rng, n, 1);
        s.cosv = calloc(s.T * rd / 2, 8);
        s.sinv = calloc(s.T * rd / 2, 8);
        rope_tables_f64(s.cosv, s.sinv, s.T, rd, 10000.0);
        FdCase c = {rope_fd_forward, n, &s};
        double *g = randn(&rng, n, 1), *dx = calloc(n, 8);
        memcpy(dx, g, n * sizeof *dx);
        rope_backward_f64(dx, s.cosv, s.sinv, s.rows, s.T, s.H, s.dh, rd);
        CHECK_GRAD(&c, g, s.x, n, dx, rd == 4 ? "partial rope dx" : "full rope dx");
        free(s.x), free(s.cosv), free(s.sinv), free(g), free(dx);
    }
}

TEST(rope_tables_match_reference_formula) {
    /* inv_freq_i = θ^(-2i/rd); x'[i] = x[i]cos a − x[i+rd/2] sin a */
    float c[4 * 2], s[4 * 2];
    rope_tables(c, s, 4, 4, 10000.0f);
    CHECK_NEAR(c[3 * 2 + 1], cos(3.0 * pow(10000.0, -0.5)), 1e-6);
    CHECK_NEAR(s[2 * 2 + 0], sin(2.0), 1e-6);
}

/* ---- causal GQA attention ---------------------------------------------------------------------------------- */
typedef struct {
    double *Q, *K, *V, *P;
    int B, T, Hq, Hkv, dh;
} AttnState;

static void attn_fd_forward(FdCase *c, double *out) {
    AttnState *s = c->state;
    attention_forward_f64(out, s->P, s->Q, s->K, s->V, s->B, s->T, s->Hq, s->Hkv, s->dh);
}

TEST(attention_backward_matches_finite_differences) {
    ZyRng rng;
    zy_rng_seed(&rng, 13);
    AttnState s = {.B = 2, .T = 4, .Hq = 4, .Hkv = 2, .dh = 3};
    const int nq = s.B * s.T * s.Hq * s.dh, nk = s.B * s.T * s.Hkv * s.dh;
    s.Q = randn(&rng, nq, 1);
    s.K = randn(&rng, nk, 1);
    s.V = randn(&rng, nk, 1);
    s.P = calloc((size_t)s.B * s.Hq * s.T * s.T, 8);
    FdCase c = {attn_fd_forward, nq, &s};
    double *g = randn(&rng, nq, 1), *o = calloc(nq, 8), *dQ = calloc(nq, 8), *dK = calloc(nk, 8), *dV = calloc(nk, 8);
    double *dP = calloc(s.T * s.T, 8);
    attn_fd_forward(&c, o);
    /* causality: the first query's output is exactly its own value */
    for (int i = 0; i < s.dh; i++) CHECK_NEAR(o[i], s.V[i], 1e-12);
    attention_backward_f64(dQ, dK, dV, dP, g, s.P, s.Q, s.K, s.V, s.B, s.T, s.Hq, s.Hkv, s.dh);
    CHECK_GRAD(&c, g, s.Q, nq, dQ, "dQ");
    CHECK_GRAD(&c, g, s.K, nk, dK, "dK");
    CHECK_GRAD(&c, g, s.V, nk, dV, "dV");
    free(s.Q), free(s.K), free(s.V), free(s.P), free(g), free(o), free(dQ), free(dK), free(dV), free(dP);
}

/* ---- activations ------------------------------------------------------------------------------------------- */
typedef struct {
    double *x;
    int rows, I;
} ActState;

static void gelu_fd_forward(FdCase *c, double *out) {
    ActState *s = c->state;
    gelu_forward_f64(out, s->x, (long)c->n_out);
}

static void swiglu_fd_forward(FdCase *c, double *out) {
    ActState *s = c->state;
    swiglu_forward_f64(out, s->x, s->rows, s->I);
}

TEST(gelu_and_swiglu_backward_match_finite_differences) {
    ZyRng rng;
    zy_rng_seed(&rng, 14);
    ActState s = {randn(&rng, 24, 2), 4, 3};
    FdCase c = {gelu_fd_forward, 24, &s};
    double *g = randn(&rng, 24, 1), *dx = calloc(24, 8);
    gelu_backward_f64(dx, g, s.x, 24);
    CHECK_GRAD(&c, g, s.x, 24, dx, "gelu dx");
    double one = 1.0, gelu_one;
    gelu_forward_f64(&gelu_one, &one, 1);
    CHECK_NEAR(gelu_one, 0.8413447460685429, 1e-12); /* exact (erf) GELU: 1·Φ(1) */
    FdCase c2 = {swiglu_fd_forward, 12, &s};
    memset(dx, 0, 24 * sizeof *dx);
    swiglu_backward_f64(dx, g, s.x, 4, 3);
    CHECK_GRAD(&c2, g, s.x, 24, dx, "swiglu dgu");
    free(s.x), free(g), free(dx);
}

/* ---- router choice ----------------------------------------------------------------------------------------- */
typedef struct {
    double *logits, *bias, *probs;
    int32_t *choice;
    int rows, n;
} RouterState;

static void router_fd_forward(FdCase *c, double *out) {
    RouterState *s = c->state;
    router_choice_forward_f64(s->probs, s->choice, out, s->logits, s->bias, s->rows, s->n);
}

TEST(router_choice_gate_backward_matches_finite_differences) {
    ZyRng rng;
    zy_rng_seed(&rng, 15);
    const int rows = 6, n = 4; /* 3 experts + skip */
    RouterState s = {randn(&rng, rows * n, 1), randn(&rng, n, 0.1), calloc(rows * n, 8), calloc(rows, 4), rows, n};
    s.logits[2 * n + 3] = 5; /* row 2 surely routes to the skip expert */
    FdCase c = {router_fd_forward, rows, &s};
    double *g = randn(&rng, rows, 1), *gate = calloc(rows, 8), *dl = calloc(rows * n, 8);
    router_fd_forward(&c, gate);
    CHECK(s.choice[2] == n - 1);
    for (int r = 0; r < rows; r++) {
        int best = 0;
        for (int e = 1; e < n; e++)
            if (s.probs[r * n + e] + s.bias[e] > s.probs[r * n + best] + s.bias[best]) best = e;
        CHECK(s.choice[r] == best);
        CHECK(gate[r] == s.probs[r * n + best]); /* unbiased, not renormalised */
    }
    /* the skip expert's output is zero whatever its gate, so moe_gate_backward leaves its row's dgate at 0 (and the
     * FD check below, which sees the gate as an output, weights it 0 too); such a row sends no gradient */
    g[2] = 0;
    router_choice_backward_f64(dl, g, s.probs, s.choice, rows, n);
    for (int e = 0; e < n; e++) CHECK(dl[2 * n + e] == 0.0);
    CHECK_GRAD(&c, g, s.logits, rows * n, dl, "dlogits");
    free(s.logits), free(s.bias), free(s.probs), free(s.choice), free(g), free(gate), free(dl);
}

/* ---- cross-entropy ----------------------------------------------------------------------------------------- */
typedef struct {
    double *logits;
    const int32_t *targets;
    int rows, V;
} CeState;

static void ce_fd_forward(FdCase *c, double *out) {
    CeState *s = c->state;
    double rl[16];
    out[0] = cross_entropy_f64(NULL, rl, s->logits, s->targets, s->rows, s->V, 1.0);
}

TEST(cross_entropy_backward_matches_finite_differences) {
    ZyRng rng;
    zy_rng_seed(&rng, 16);
    static const int32_t targets[4] = {2, -1, 0, 4};
    CeState s = {randn(&rng, 20, 2), targets, 4, 5};
    FdCase c = {ce_fd_forward, 1, &s};
    /* g on the heap, not a local scalar: with AVX-512, gcc 12 vectorises weighted_sum's loop over n_out = 1 and
     * reports a false 'g may be used uninitialized' for the lanes past g[0], which it never reads. */
    double *g = calloc(1, sizeof *g), *dl = calloc(20, 8);
    g[0] = 1.0;
    double rl[4];
    double loss = cross_entropy_f64(dl, rl, s.logits, targets, 4, 5, 1.0);
    double want = 0;
    for (int r = 0; r < 4; r++) {
        if (targets[r] < 0) continue;
        double sum = 0;
        for (int v = 0; v < 5; v++) sum += exp(s.logits[r * 5 + v]);
        want += log(sum) - s.logits[r * 5 + targets[r]];
    }
    CHECK_NEAR(loss, want / 3, 1e-12);
    for (int v = 0; v < 5; v++) CHECK(dl[5 + v] == 0.0); /* ignored target */
    CHECK_GRAD(&c, g, s.logits, 20, dl, "dlogits");
    static const int32_t none[2] = {-1, -1};
    CHECK(cross_entropy_f64(NULL, rl, s.logits, none, 2, 5, 1.0) == 0.0);
    free(s.logits), free(dl), free(g);
}

/* ---- float instantiation agrees with the double one --------------------------------------------------------- */
TEST(float_ops_agree_with_double_ops) {
    ZyRng rng;
    zy_rng_seed(&rng, 17);
    const int B = 2, T = 5, Hq = 4, Hkv = 2, dh = 4, nq = B * T * Hq * dh, nk = B * T * Hkv * dh;
    double *Q = randn(&rng, nq, 1), *K = randn(&rng, nk, 1), *V = randn(&rng, nk, 1);
    double *O = calloc(nq, 8), *P = calloc(B * Hq * T * T, 8);
    float *Qf = malloc(nq * 4), *Kf = malloc(nk * 4), *Vf = malloc(nk * 4), *Of = malloc(nq * 4),
          *Pf = malloc(B * Hq * T * T * 4);
    for (int i = 0; i < nq; i++) Qf[i] = (float)Q[i];
    for (int i = 0; i < nk; i++) Kf[i] = (float)K[i], Vf[i] = (float)V[i];
    for (int i = 0; i < nq; i++) Q[i] = Qf[i];
    for (int i = 0; i < nk; i++) K[i] = Kf[i], V[i] = Vf[i];
    attention_forward_f64(O, P, Q, K, V, B, T, Hq, Hkv, dh);
    attention_forward(Of, Pf, Qf, Kf, Vf, B, T, Hq, Hkv, dh);
    double worst = 0;
    for (int i = 0; i < nq; i++) worst = fmax(worst, fabs(O[i] - Of[i]));
    CHECK_MSG(worst < 1e-5, "attention float vs double %.3g", worst);
    free(Q), free(K), free(V), free(O), free(P), free(Qf), free(Kf), free(Vf), free(Of), free(Pf);
}

/* The float conv (one GEMM per group and tap over every sequence at once) against the definition written out
 * directly in double, and its backward against the f64 backward (itself checked by finite differences above):
 * several sequences (the rows between them must not leak), k1 = 1..3, several groups. */
TEST(cca_conv_float_matches_the_direct_definition) {
    const int shapes[][6] = {/* B, T, C, dh, k0, k1 */ {3, 7, 12, 4, 2, 2}, {2, 5, 8, 4, 3, 3}, {1, 9, 6, 2, 2, 1},
                             {4, 1, 8, 8, 2, 2}, {2, 33, 24, 8, 4, 2}};
    ZyRng rng;
    zy_rng_seed(&rng, 77);
    double worst_f = 0, worst_b = 0;
    for (size_t s = 0; s < ZY_ARRAY_LEN(shapes); s++) {
        const int B = shapes[s][0], T = shapes[s][1], C = shapes[s][2], dh = shapes[s][3], k0 = shapes[s][4],
                  k1 = shapes[s][5], TM = T + k1 - 1, N = B * T * C, NM = B * TM * C;
        const ZyConvShape shape = {B, T, C, dh, k0, k1};
        double *X = randn(&rng, N, 1), *w0 = randn(&rng, C * k0, 1), *b0 = randn(&rng, C, 1);
        double *w1 = randn(&rng, C * dh * k1, 1), *b1 = randn(&rng, C, 1), *dY = randn(&rng, N, 1);
        float *Xf = malloc(sizeof(float) * N), *w0f = malloc(sizeof(float) * C * k0), *b0f = malloc(sizeof(float) * C);
        float *w1f = malloc(sizeof(float) * C * dh * k1), *b1f = malloc(sizeof(float) * C), *Yf = malloc(sizeof(float) * N);
        float *Mf = malloc(sizeof(float) * NM), *dYf = malloc(sizeof(float) * N);
        float *wpf = malloc(sizeof(float) * cca_conv_work_floats(shape));
        float *dwpf = malloc(sizeof(float) * cca_conv_grad_work_floats(shape));
        /* round the inputs to float so both sides start from the same numbers */
        for (int i = 0; i < N; i++) X[i] = Xf[i] = (float)X[i], dY[i] = dYf[i] = (float)dY[i];
        for (int i = 0; i < C * k0; i++) w0[i] = w0f[i] = (float)w0[i];
        for (int i = 0; i < C; i++) b0[i] = b0f[i] = (float)b0[i], b1[i] = b1f[i] = (float)b1[i];
        for (int i = 0; i < C * dh * k1; i++) w1[i] = w1f[i] = (float)w1[i];
        cca_conv_forward(Yf, Mf, wpf, Xf, w0f, b0f, w1f, b1f, shape);
        /* the definition: M(τ)[c] = b0 + Σ_j w0[c,j] X(τ-(k0-1)+j), Y(t)[o] = b1 + Σ_{i,j} w1[o,i,j] M(t-(k1-1)+j)[g dh+i] */
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++)
                for (int o = 0; o < C; o++) {
                    const int g = o / dh;
                    double y = b1[o], mag = fabs(b1[o]);
                    for (int i = 0; i < dh; i++)
                        for (int j = 0; j < k1; j++) {
                            const int tau = t - (k1 - 1) + j, c = g * dh + i;
                            double m = b0[c];
                            for (int jj = 0; jj < k0; jj++) {
                                const int tx = tau - (k0 - 1) + jj;
                                if (tx >= 0) m += w0[c * k0 + jj] * X[((long)b * T + tx) * C + c];
                            }
                            y += w1[(o * dh + i) * k1 + j] * m;
                            mag += fabs(w1[(o * dh + i) * k1 + j] * m);
                        }
                    const double e = fabs(Yf[((long)b * T + t) * C + o] - y) / (mag + 1e-30);
                    if (e > worst_f) worst_f = e;
                }
        /* backward: float vs f64 on the same inputs */
        double *M = calloc(NM, 8), *Y = calloc(N, 8), *wp = calloc(cca_conv_work_floats(shape), 8);
        double *dwp = calloc(cca_conv_grad_work_floats(shape), 8), *dM = calloc(NM, 8), *dX = calloc(N, 8);
        double *dw0 = calloc(C * k0, 8), *db0 = calloc(C, 8), *dw1 = calloc(C * dh * k1, 8), *db1 = calloc(C, 8);
        float *dMf = malloc(sizeof(float) * NM), *dXf = calloc(N, 4), *dw0f = calloc(C * k0, 4), *db0f = calloc(C, 4);
        float *dw1f = calloc(C * dh * k1, 4), *db1f = calloc(C, 4);
        cca_conv_forward_f64(Y, M, wp, X, w0, b0, w1, b1, shape);
        cca_conv_backward_f64(dX, dw0, db0, dw1, db1, dM, wp, dwp, dY, X, M, w0, w1, shape);
        cca_conv_backward(dXf, dw0f, db0f, dw1f, db1f, dMf, wpf, dwpf, dYf, Xf, Mf, w0f, w1f, shape);
        const struct {
            const float *f;
            const double *d;
            int n;
        } grads[] = {{dXf, dX, N}, {dw0f, dw0, C * k0}, {db0f, db0, C}, {dw1f, dw1, C * dh * k1}, {db1f, db1, C}};
        for (size_t k = 0; k < ZY_ARRAY_LEN(grads); k++) {
            double d = 0, r = 0;
            for (int i = 0; i < grads[k].n; i++) {
                d += (grads[k].f[i] - grads[k].d[i]) * (grads[k].f[i] - grads[k].d[i]);
                r += grads[k].d[i] * grads[k].d[i];
            }
            const double e = sqrt(d / (r + 1e-300));
            if (e > worst_b) worst_b = e;
        }
        free(X), free(w0), free(b0), free(w1), free(b1), free(dY), free(Xf), free(w0f), free(b0f), free(w1f);
        free(b1f), free(Yf), free(Mf), free(dYf), free(wpf), free(dwpf), free(M), free(Y), free(wp), free(dwp);
        free(dM), free(dX), free(dw0), free(db0), free(dw1), free(db1), free(dMf), free(dXf), free(dw0f);
        free(db0f), free(dw1f), free(db1f);
    }
    printf("    float conv vs direct definition: max rel err %.3g; backward vs f64: max normwise %.3g\n", worst_f,
           worst_b);
    CHECK_MSG(worst_f < 1e-6, "forward %.3g", worst_f);
    CHECK_MSG(worst_b < 1e-6, "backward %.3g", worst_b);
}

/* The decoding conv (outputs of each sequence's last n rows only) against the full conv's rows: in double to
 * rounding, in float bit for bit (the same grouped products, whatever the row count or BLAS core: bf16 products
 * downstream would turn a last-bit difference into a bf16 one), from the grouped kernel's fp32 view and from its
 * bf16 view alike (the kernels are bf16 values here, as a bf16 or quantized folder's are). Sequences of [P cached |
 * n new] rows as decoding lays them out, n = 1 and prefill pieces, k0/k1 1..3, one and many groups, and ZAYA1-8B's
 * group width (dh 128, k1 2: 256 taps a product). */
TEST(cca_conv_forward_last_matches_the_full_conv) {
    const int shapes[][7] = {/* B, T, n, C, dh, k0, k1 */ {5, 3, 1, 12, 4, 2, 2}, {3, 9, 7, 8, 4, 3, 3},
                             {2, 6, 6, 6, 2, 2, 1}, {4, 4, 2, 16, 8, 1, 3}, {1, 66, 64, 24, 8, 2, 2},
                             {7, 2, 1, 8, 8, 2, 1}, {2, 3, 1, 256, 128, 2, 2}};
    ZyRng rng;
    zy_rng_seed(&rng, 78);
    double worst_d = 0, worst_f = 0;
    long differ = 0, differ16 = 0;
    for (size_t s = 0; s < ZY_ARRAY_LEN(shapes); s++) {
        const int B = shapes[s][0], T = shapes[s][1], n = shapes[s][2], C = shapes[s][3], dh = shapes[s][4],
                  k0 = shapes[s][5], k1 = shapes[s][6], N = B * T * C;
        const ZyConvShape shape = {B, T, C, dh, k0, k1};
        float *Yf = malloc(4 * (size_t)N), *Mf = malloc(4 * (size_t)B * (T + k1 - 1) * C);
        float *wpf = malloc(4 * (size_t)cca_conv_work_floats(shape));
        double *X = randn(&rng, N, 1), *w0 = randn(&rng, C * k0, 1), *b0 = randn(&rng, C, 1);
        double *w1 = randn(&rng, C * dh * k1, 1), *b1 = randn(&rng, C, 1);
        double *Y = calloc(N, 8), *M = calloc((size_t)B * (T + k1 - 1) * C, 8);
        double *wp = calloc(cca_conv_work_floats(shape), 8);
        double *Yl = calloc((size_t)B * n * C, 8), *Mi = calloc(cca_conv_last_work_floats(B * n, C, k0, k1), 8);
        float *Xf = malloc(4 * (size_t)N), *w0f = malloc(4 * (size_t)C * k0), *b0f = malloc(4 * (size_t)C);
        float *w1f = malloc(4 * (size_t)C * dh * k1), *b1f = malloc(4 * (size_t)C);
        float *Ylf = malloc(4 * (size_t)B * n * C), *Mif = malloc(4 * cca_conv_last_work_floats(B * n, C, k0, k1));
        for (int i = 0; i < N; i++) X[i] = Xf[i] = (float)X[i];
        for (int i = 0; i < C * k0; i++) w0[i] = w0f[i] = (float)w0[i];
        for (int i = 0; i < C; i++) b0[i] = b0f[i] = (float)b0[i], b1[i] = b1f[i] = (float)b1[i];
        uint16_t *w16 = malloc(2 * (size_t)C * dh * k1);
        float *Yl16 = malloc(4 * (size_t)B * n * C);
        for (int i = 0; i < C * dh * k1; i++) w16[i] = zy_f32_to_bf16((float)w1[i]), w1[i] = w1f[i] = zy_bf16_to_f32(w16[i]);
        cca_conv_forward_f64(Y, M, wp, X, w0, b0, w1, b1, shape);
        cca_conv_forward_last_f64(Yl, Mi, X, w0, b0, w1, b1, shape, n);
        cca_conv_forward_last(Ylf, Mif, Xf, w0f, b0f, (ZyWeights){.f32 = w1f}, b1f, shape, n);
        cca_conv_forward_last(Yl16, Mif, Xf, w0f, b0f, (ZyWeights){.bf16 = w16}, b1f, shape, n);
        cca_conv_forward(Yf, Mf, wpf, Xf, w0f, b0f, w1f, b1f, shape);
        for (int b = 0; b < B; b++)
            for (int t = 0; t < n; t++)
                for (int o = 0; o < C; o++) {
                    const long full = ((long)b * T + T - n + t) * C + o, at = ((long)b * n + t) * C + o;
                    const double want = Y[full], scale = 1 + fabs(want);
                    worst_d = fmax(worst_d, fabs(Yl[at] - want) / scale);
                    worst_f = fmax(worst_f, fabs(Ylf[at] - want) / scale);
                    differ += memcmp(&Ylf[at], &Yf[full], sizeof(float)) != 0;
                    differ16 += memcmp(&Yl16[at], &Yf[full], sizeof(float)) != 0;
                }
        free(Yf), free(Mf), free(wpf), free(w16), free(Yl16);
        free(X), free(w0), free(b0), free(w1), free(b1), free(Y), free(M), free(wp), free(Yl), free(Mi);
        free(Xf), free(w0f), free(b0f), free(w1f), free(b1f), free(Ylf), free(Mif);
    }
    printf("    conv of the last rows vs the full conv: double %.2e, float %.2e from double, %ld float outputs not "
           "bit-identical to the full float conv's (%ld from the bf16 view)\n", worst_d, worst_f, differ, differ16);
    CHECK_MSG(worst_d < 1e-12, "double %.3g", worst_d);
    CHECK_MSG(worst_f < 1e-5, "float %.3g", worst_f);
    CHECK_MSG(differ == 0, "%ld float outputs differ", differ);
    CHECK_MSG(differ16 == 0, "%ld float outputs from the bf16 view differ", differ16);
}

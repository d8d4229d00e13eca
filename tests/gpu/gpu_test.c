/* make test-gpu: runs every group (or those named on the command line) and ends with "N passed, N failed". */
#include "gpu_test.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *keep_host(GpuTest *t, void *p) {
    if (!p || t->n_host >= 512) {
        fprintf(stderr, "gpu tests: host allocation failed or too many\n");
        exit(2);
    }
    return t->host[t->n_host++] = p;
}
static void *keep_dev(GpuTest *t, void *p) {
    if (!p || t->n_dev >= 512) {
        fprintf(stderr, "gpu tests: device allocation failed or too many\n");
        exit(2);
    }
    return t->dev[t->n_dev++] = p;
}

float *gt_rand(GpuTest *t, size_t n, float scale) {
    float *h = keep_host(t, malloc((n ? n : 1) * sizeof *h));
    for (size_t i = 0; i < n; i++) h[i] = (float)(scale * zy_rng_normal(&t->rng));
    return h;
}
int32_t *gt_rand_int(GpuTest *t, size_t n, int lo, int hi) {
    int32_t *h = keep_host(t, malloc((n ? n : 1) * sizeof *h));
    for (size_t i = 0; i < n; i++) h[i] = lo + (int32_t)(zy_rng_next(&t->rng) % (uint64_t)(hi - lo));
    return h;
}
float *gt_host(GpuTest *t, size_t n) { return keep_host(t, calloc(n ? n : 1, sizeof(float))); }
float *gt_copy(GpuTest *t, const float *h, size_t n) {
    float *c = gt_host(t, n);
    memcpy(c, h, n * sizeof *c);
    return c;
}
void *gt_dev(GpuTest *t, size_t bytes) {
    ZyErr e;
    void *p = gpu_alloc(bytes ? bytes : 4, "test buffer", &e);
    if (!p) fprintf(stderr, "gpu tests: %s\n", e.msg);
    return keep_dev(t, p);
}
float *gt_up(GpuTest *t, const float *h, size_t n) {
    float *d = gt_dev(t, n * sizeof *d);
    ZyErr e;
    if (n && gpu_upload(t->g, d, h, n * sizeof *d, &e)) fprintf(stderr, "gpu tests: %s\n", e.msg);
    return d;
}
int32_t *gt_up_i(GpuTest *t, const int32_t *h, size_t n) {
    int32_t *d = gt_dev(t, n * sizeof *d);
    ZyErr e;
    if (n && gpu_upload(t->g, d, h, n * sizeof *d, &e)) fprintf(stderr, "gpu tests: %s\n", e.msg);
    return d;
}
float *gt_poison(GpuTest *t, size_t n) {
    float *d = gt_dev(t, n * sizeof *d);
    gpu_memset_async(t->g, d, 0xff, n * sizeof *d); /* 0xffffffff is a NaN */
    return d;
}
float *gt_down(GpuTest *t, const float *d, size_t n) {
    float *h = gt_host(t, n);
    ZyErr e;
    if (n && gpu_download(t->g, h, d, n * sizeof *h, &e)) {
        fprintf(stderr, "gpu tests: %s\n", e.msg);
        for (size_t i = 0; i < n; i++) h[i] = NAN;
    }
    return h;
}
int32_t *gt_down_i(GpuTest *t, const int32_t *d, size_t n) {
    int32_t *h = keep_host(t, calloc(n ? n : 1, sizeof *h));
    ZyErr e;
    if (n && gpu_download(t->g, h, d, n * sizeof *h, &e)) {
        fprintf(stderr, "gpu tests: %s\n", e.msg);
        for (size_t i = 0; i < n; i++) h[i] = -999999;
    }
    return h;
}

double gt_rel_err(const float *a, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) && isfinite(ref[i])) return INFINITY;
        double d = (double)a[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    if (den == 0) return sqrt(num);
    return sqrt(num / den);
}

int gt_check(GpuTest *t, const char *name, const float *dev, const float *ref, size_t n, double tol) {
    float *h = gt_down(t, dev, n);
    double e = gt_rel_err(h, ref, n);
    int ok = e <= tol;
    printf("  %-4s %-10s %-44s rel err %.2e (tol %.0e)\n", ok ? "ok" : "FAIL", t->group, name, e, tol);
    ok ? t->passed++ : t->failed++;
    return ok;
}

int gt_check_i(GpuTest *t, const char *name, const int32_t *dev, const int32_t *ref, size_t n) {
    int32_t *h = gt_down_i(t, dev, n);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (h[i] != ref[i] && !bad++) first = i;
    int ok = bad == 0;
    if (ok)
        printf("  ok   %-10s %-44s %zu values equal\n", t->group, name, n);
    else
        printf("  FAIL %-10s %-44s %zu of %zu differ (first at %zu: %d vs %d)\n", t->group, name, bad, n, first,
               h[first], ref[first]);
    ok ? t->passed++ : t->failed++;
    return ok;
}

int gt_assert(GpuTest *t, int ok, const char *name, const char *fmt, ...) {
    char detail[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    printf("  %-4s %-10s %-44s %s\n", ok ? "ok" : "FAIL", t->group, name, detail);
    ok ? t->passed++ : t->failed++;
    return ok;
}

int gt_gpu_sized(GpuTest *t, const char *what) {
    if (!t->emulated) return 1;
    printf("  --   %-10s %-44s sized for a GPU: make test-gpu runs it\n", t->group, what);
    return 0;
}

void gt_reset(GpuTest *t) {
    ZyErr e;
    if (gpu_sync(t->g, t->group ? t->group : "test", &e)) {
        printf("  FAIL %-10s %-44s %s\n", t->group, "device error", e.msg);
        t->failed++;
    }
    for (int i = 0; i < t->n_host; i++) free(t->host[i]);
    for (int i = 0; i < t->n_dev; i++) gpu_free(t->dev[i]);
    t->n_host = t->n_dev = 0;
}

GtEnv gt_env_set(const char *name, const char *value) {
    const char *outer = getenv(name);
    GtEnv e = {.name = name, .outer = outer ? strdup(outer) : NULL};
    if (value)
        setenv(name, value, 1);
    else
        unsetenv(name);
    return e;
}

void gt_env_restore(GtEnv *e) {
    if (!e->name) return; /* never set */
    if (e->outer)
        setenv(e->name, e->outer, 1);
    else
        unsetenv(e->name);
    free(e->outer);
    e->outer = NULL;
}

ZayaConfig gt_small_config(void) {
    return (ZayaConfig){.vocab_size = 97, .hidden_size = 64, .num_layers = 3, .num_heads = 4, .num_kv_heads = 2,
                        .head_dim = 16, .num_experts = 4, .moe_intermediate_size = 48, .router_hidden_size = 32,
                        .cca_time0 = 2, .cca_time1 = 2, .rms_norm_eps = 1e-5f, .tie_word_embeddings = 1,
                        .max_position_embeddings = 256, .rope_theta = 10000.0f, .partial_rotary_factor = 0.5f,
                        .initializer_range = 0.02f, .bos_token_id = 2, .eos_token_id = 1, .pad_token_id = 0};
}

void gt_randomise_model(GpuTest *t, Model *m) {
    model_init_weights(m, zy_rng_next(&t->rng));
    for (int i = 0; i < m->params.count; i++) {
        const ParamInfo *p = &m->params.info[i];
        float *x = m->params.data + p->offset;
        for (size_t j = 0; j < p->numel; j++)
            x[j] = p->init == INIT_NORMAL ? x[j] * 5.0f : x[j] + (float)(0.1 * zy_rng_normal(&t->rng));
    }
}

int gt_random_model(GpuTest *t, Model *m, const ZayaConfig *cfg, const char *label) {
    ZyErr err = {{0}};
    if (model_create(m, cfg, &err)) {
        gt_assert(t, 0, label, "%s", err.msg);
        return -1;
    }
    gt_randomise_model(t, m);
    return 0;
}

typedef struct {
    const char *name;
    void (*fn)(GpuTest *);
} Group;

int main(int argc, char **argv) {
    const Group groups[] = {{"gemm", test_gpu_gemm},           {"norms", test_gpu_norms}, {"moe", test_gpu_moe},
                            {"cca", test_gpu_cca},             {"attention", test_gpu_attention},
                            {"optim", test_gpu_optim},         {"model", test_gpu_model},
                            {"decode", test_gpu_decode},       {"pool", test_gpu_pool}};
    const int n_groups = (int)(sizeof groups / sizeof groups[0]);
    GpuCtx g;
    ZyErr err;
    setvbuf(stdout, NULL, _IOLBF, 0); /* each result as it comes, also into a pipe or a log (a hang shows where) */
    if (gpu_open(&g, -1, &err)) {
        fprintf(stderr, "zaya gpu tests: %s\n", err.msg);
        printf("0 passed, 1 failed\n");
        return 1;
    }
    printf("zaya gpu tests on %s (sm_%d%d, %d SMs, %.1f GiB)\n", g.name, g.cc_major, g.cc_minor, g.sm_count,
           g.mem_total / 1073741824.0);
    GpuTest t = {.g = &g, .emulated = !strncmp(g.name, "cuda_emu", 8)};
    zy_rng_seed(&t.rng, 20261125);
    for (int k = 0; k < n_groups; k++) {
        int wanted = argc < 2;
        for (int i = 1; i < argc; i++) wanted |= !strcmp(argv[i], groups[k].name);
        if (!wanted) continue;
        t.group = groups[k].name;
        printf("[%s]\n", groups[k].name);
        fflush(stdout);
        g.bf16 = 0;
        groups[k].fn(&t);
        gt_reset(&t);
        fflush(stdout);
    }
    gpu_close(&g);
    printf("%d passed, %d failed\n", t.passed, t.failed);
    return t.failed ? 1 : 0;
}

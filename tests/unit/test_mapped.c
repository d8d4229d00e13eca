/* Sharded, memory-mapped bf16 inference weights (model_load_dir_as with bf16), the streamed zaya init
 * (model_init_streamed) and the checks on model.safetensors.index.json. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/config.h"
#include "infer/decode.h"
#include "model/model.h"
#include "io/model_io.h"
#include "io/safetensors.h"
#include "gpu/gpu_weight_upload.h"
#include "test.h"

static ZayaConfig small_config(int tied) {
    return (ZayaConfig){.vocab_size = 61, .hidden_size = 32, .num_layers = 2, .num_heads = 4, .num_kv_heads = 2,
                        .head_dim = 8, .num_experts = 3, .moe_intermediate_size = 16, .router_hidden_size = 8,
                        .cca_time0 = 2, .cca_time1 = 2, .rms_norm_eps = 1e-5f, .tie_word_embeddings = tied,
                        .max_position_embeddings = 64, .rope_theta = 10000.0f, .partial_rotary_factor = 0.5f,
                        .initializer_range = 0.02f, .bos_token_id = 1, .eos_token_id = 2, .pad_token_id = 0};
}

/* A model with every tensor off its init (no term hides behind a 0 or a 1), values of unit scale per fan-in. */
static int make_model(Model *m, int tied, uint64_t seed, ZyErr *err) {
    ZayaConfig c = small_config(tied);
    if (model_create(m, &c, err)) return -1;
    ZyRng rng;
    zy_rng_seed(&rng, seed);
    for (int i = 0; i < m->params.count; i++) {
        const ParamInfo *p = &m->params.info[i];
        float *x = m->params.data + p->offset;
        for (size_t j = 0; j < p->numel; j++) {
            const double g = zy_rng_normal(&rng);
            if (p->init == INIT_ONE || strstr(p->name, "qk_norm.temp"))
                x[j] = (float)(1.0 + 0.2 * g);
            else if (strstr(p->name, "balancing_biases"))
                x[j] = (float)(0.05 * g);
            else
                x[j] = (float)(g / sqrt((double)p->shape[p->ndim - 1]));
        }
    }
    return 0;
}

/* Faults write_shards can put into a sharded directory. */
enum { FAULT_NONE, FAULT_MISSING_SHARD, FAULT_TWO_SHARDS, FAULT_WRONG_DTYPE, FAULT_INDEX_WRONG_SHARD,
       FAULT_NOT_IN_INDEX, FAULT_INDEX_EXTRA, FAULT_INDEX_NOT_STRING };

/* Writes m's tensors round-robin into n shards of dtype dt (balancing biases F32) with an index, as transformers
 * lays out a sharded checkpoint, plus config.json; `fault` breaks one thing. */
static int write_shards(const Model *m, const char *dir, int n, ZyDtype dt, int fault, ZyErr *err) {
    const ParamTable *t = &m->params;
    StWriteTensor *ts = calloc((size_t)t->count + 1, sizeof *ts);
    int32_t *ints = NULL;
    cJSON *root = cJSON_CreateObject(), *map = cJSON_AddObjectToObject(root, "weight_map");
    cJSON_AddObjectToObject(root, "metadata");
    char path[512], name[64];
    int rc = 0;
    for (int s = 0; s < n && !rc; s++) {
        int k = 0;
        snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, n);
        for (int i = s; i < t->count; i += n) {
            const ParamInfo *p = &t->info[i];
            StWriteTensor *w = &ts[k++];
            *w = (StWriteTensor){.name = p->name, .ndim = p->ndim, .src_dtype = ZY_DT_F32,
                                 .out_dtype = p->kind == PARAM_BUFFER ? ZY_DT_F32 : dt, .data = t->data + p->offset};
            for (int d = 0; d < p->ndim; d++) w->shape[d] = p->shape[d];
            if (fault == FAULT_WRONG_DTYPE && i == 0) { /* the embedding as integers */
                ints = calloc(p->numel, sizeof *ints);
                w->src_dtype = w->out_dtype = ZY_DT_I32, w->data = ints;
            }
            if (!(fault == FAULT_NOT_IN_INDEX && i == 1)) cJSON_AddStringToObject(map, p->name, name);
        }
        if (fault == FAULT_TWO_SHARDS && s == 1) { /* shard 2 holds the embedding as well */
            const ParamInfo *p = &t->info[0];
            ts[k++] = (StWriteTensor){.name = p->name, .ndim = 2, .shape = {p->shape[0], p->shape[1]},
                                        .src_dtype = ZY_DT_F32, .out_dtype = dt, .data = t->data + p->offset};
        }
        snprintf(path, sizeof path, "%s/%s", dir, name);
        rc = st_write(path, ts, k, NULL, err);
    }
    if (fault == FAULT_INDEX_WRONG_SHARD) cJSON_ReplaceItemInObject(map, t->info[0].name, cJSON_CreateString(name));
    if (fault == FAULT_INDEX_EXTRA) cJSON_AddStringToObject(map, "model.layers.0.mlp.extra", name);
    if (fault == FAULT_INDEX_NOT_STRING) cJSON_ReplaceItemInObject(map, t->info[0].name, cJSON_CreateNumber(1));
    char *text = cJSON_Print(root);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (!rc) rc = zy_write_file_atomic(path, text, strlen(text), err);
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (!rc) rc = config_save(&m->cfg, path, dt == ZY_DT_BF16 ? "bfloat16" : "float32", err);
    if (!rc && fault == FAULT_MISSING_SHARD) {
        snprintf(path, sizeof path, "%s/model-%05d-of-%05d.safetensors", dir, 2, n);
        unlink(path);
    }
    free(text);
    cJSON_Delete(root);
    free(ts);
    free(ints);
    return rc;
}

/* Forward logits and cached-decoding logits of a model over a short sequence. */
static int run_model(Model *m, float *logits, float *dec, int T, ZyErr *err) {
    int32_t tok[8];
    for (int t = 0; t < T; t++) tok[t] = (int32_t)((t * 17 + 5) % m->cfg.vocab_size);
    Activations a;
    if (acts_create(&a, &m->cfg, 1, T, err)) return -1;
    model_forward(m, &a, tok);
    memcpy(logits, a.logits, (size_t)T * m->cfg.vocab_size * sizeof *logits);
    acts_free(&a);
    KVCache c;
    if (kvcache_create(&c, &m->cfg, 1, T, err)) return -1;
    int rc = 0;
    for (int t = 0; t < T && !rc; t++)
        rc = model_decode(m, &c, tok + t, 1, dec + (size_t)t * m->cfg.vocab_size, 1, err);
    kvcache_free(&c);
    return rc;
}

/* bf16 inference from bf16 files (one file, and 3 shards) uses the mapped tensors in place and computes exactly what
 * the fp32-loaded model rounded to bf16 (model_use_bf16) computes; from F32 files it converts each matrix and gives
 * the same again. */
TEST(mapped_bf16_in_place_and_equal_to_f32_then_bf16) {
    ZyErr err = {{0}};
    char dir[64], sub[128];
    REQUIRE(zy_test_tmpdir(dir, sizeof dir, "mapped") == 0);
    for (int tied = 0; tied < 2; tied++) {
        Model src;
        REQUIRE(make_model(&src, tied, 40 + tied, &err) == 0);
        const int T = 6, V = src.cfg.vocab_size;
        size_t held = 0, small = 0; /* bytes of the bf16 matrices, of the fp32 rest */
        for (int i = 0; i < src.params.count; i++) {
            const ParamInfo *p = &src.params.info[i];
            if (model_holds_bf16(p)) held += p->numel * 2;
            else small += p->numel * 4;
        }
        for (int form = 0; form < 3; form++) { /* bf16 single file, bf16 in 3 shards, f32 in 2 shards */
            snprintf(sub, sizeof sub, "%s/f%d_%d", dir, tied, form);
            REQUIRE(zy_mkdirs(sub, &err) == 0);
            if (form == 0)
                REQUIRE(model_save_dir(&src, sub, ZY_DT_BF16, &err) == 0);
            else
                REQUIRE(write_shards(&src, sub, form == 1 ? 3 : 2, form == 2 ? ZY_DT_F32 : ZY_DT_BF16, FAULT_NONE,
                                     &err) == 0);
            Model a, b;
            CHECK_MSG(model_load_dir_as(&a, sub, 1, &err) == 0, "%s", err.msg);
            REQUIRE(model_load_dir(&b, sub, &err) == 0);
            REQUIRE(model_use_bf16(&b, &err) > 0);
            CHECK(!a.params.data && !a.params.grad && !a.bf16);
            size_t mapped, copied;
            model_weight_bytes(&a, &mapped, &copied);
            if (form < 2)
                CHECK_MSG(mapped == held && copied == small, "mapped %zu of %zu, copied %zu", mapped, held, copied);
            else
                CHECK_MSG(mapped == 0 && copied == held + small, "mapped %zu, copied %zu", mapped, copied);
            double share;
            CHECK(model_dir_bf16_share(sub, &share, &err) == 0 && share == (form < 2 ? 1.0 : 0.0));
            float *la = malloc(sizeof(float) * T * V * 4), *da = la + T * V, *lb = da + T * V, *db = lb + T * V;
            REQUIRE(la);
            CHECK(run_model(&a, la, da, T, &err) == 0 && run_model(&b, lb, db, T, &err) == 0);
            CHECK_MSG(memcmp(la, lb, sizeof(float) * T * V) == 0, "form %d tied %d: forward logits differ", form, tied);
            CHECK_MSG(memcmp(da, db, sizeof(float) * T * V) == 0, "form %d tied %d: decode logits differ", form, tied);
            int finite = 1;
            for (int i = 0; i < T * V; i++) finite &= isfinite(la[i]) && la[i] != 0;
            CHECK(finite);
            free(la);
            model_free(&a);
            model_free(&b);
        }
        model_free(&src);
    }
    zy_test_rmtree(dir);
}

/* A bf16 tensor at an odd address cannot be read in place: it gets a copy, with the same values. */
TEST(mapped_bf16_misaligned_file_is_copied) {
    ZyErr err = {{0}};
    char dir[64], path[192], odd[128];
    REQUIRE(zy_test_tmpdir(dir, sizeof dir, "mapodd") == 0);
    snprintf(odd, sizeof odd, "%s/odd", dir);
    Model src, a, b;
    REQUIRE(make_model(&src, 1, 7, &err) == 0);
    REQUIRE(model_save_dir(&src, dir, ZY_DT_BF16, &err) == 0);
    REQUIRE(zy_mkdirs(odd, &err) == 0);
    /* the same file with one more space in its header: every tensor starts one byte later */
    char *data;
    size_t len;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    REQUIRE(zy_read_file(path, &data, &len, &err) == 0);
    uint64_t hlen;
    memcpy(&hlen, data, 8);
    char *out = malloc(len + 1);
    REQUIRE(out);
    const uint64_t h2 = hlen + 1;
    memcpy(out, &h2, 8);
    memcpy(out + 8, data + 8, hlen);
    out[8 + hlen] = ' ';
    memcpy(out + 9 + hlen, data + 8 + hlen, len - 8 - hlen);
    snprintf(path, sizeof path, "%s/model.safetensors", odd);
    REQUIRE(zy_write_file_atomic(path, out, len + 1, &err) == 0);
    free(data), free(out);
    snprintf(path, sizeof path, "%s/config.json", odd);
    REQUIRE(config_save(&src.cfg, path, "bfloat16", &err) == 0);
    CHECK_MSG(model_load_dir_as(&a, odd, 1, &err) == 0, "%s", err.msg);
    REQUIRE(model_load_dir_as(&b, dir, 1, &err) == 0);
    size_t mapped, copied;
    model_weight_bytes(&a, &mapped, &copied);
    CHECK(mapped == 0 && copied > 0);
    model_weight_bytes(&b, &mapped, &copied);
    CHECK(mapped > 0);
    const size_t VD = (size_t)src.cfg.vocab_size * src.cfg.hidden_size;
    CHECK(((uintptr_t)a.w.embed16 & 1) == 0 && memcmp(a.w.embed16, b.w.embed16, VD * 2) == 0);
    const size_t EX = (size_t)src.cfg.num_experts * src.cfg.hidden_size * src.cfg.moe_intermediate_size;
    CHECK(memcmp(a.w.layers[1].expert_down16, b.w.layers[1].expert_down16, EX * 2) == 0);
    model_free(&a), model_free(&b), model_free(&src);
    zy_test_rmtree(dir);
}

/* The streamed init writes model_init_weights' values bit for bit (f32), or their bf16 rounding (bf16), in shards
 * with an index that says where each tensor is. */
TEST(init_streamed_equals_init_weights) {
    ZyErr err = {{0}};
    char dir[64], sub[128], path[160];
    REQUIRE(zy_test_tmpdir(dir, sizeof dir, "initstream") == 0);
    const ZayaConfig c = small_config(0);
    Model ref;
    REQUIRE(model_create(&ref, &c, &err) == 0);
    model_init_weights(&ref, 9);
    for (int bf16 = 0; bf16 < 2; bf16++) {
        for (int sharded = 0; sharded < 2; sharded++) {
            snprintf(sub, sizeof sub, "%s/%d%d", dir, bf16, sharded);
            int n_shards = 0;
            CHECK_MSG(model_init_streamed(&c, 9, sub, bf16 ? ZY_DT_BF16 : ZY_DT_F32, sharded ? 6000 : 0, &n_shards,
                                          &err) == 0, "%s", err.msg);
            CHECK(sharded ? n_shards > 3 : n_shards == 1);
            snprintf(path, sizeof path, "%s/model.safetensors.index.json", sub);
            CHECK(sharded == (access(path, F_OK) == 0));
            Model m;
            REQUIRE(model_load_dir(&m, sub, &err) == 0);
            size_t differ = 0, normal = 0;
            for (int i = 0; i < m.params.count; i++) {
                const ParamInfo *p = &m.params.info[i];
                const float *x = m.params.data + p->offset, *y = ref.params.data + p->offset;
                normal += p->init == INIT_NORMAL;
                for (size_t j = 0; j < p->numel; j++) {
                    const float want = bf16 && p->kind != PARAM_BUFFER ? zy_round_bf16(y[j]) : y[j];
                    differ += memcmp(&x[j], &want, 4) != 0;
                }
            }
            CHECK_MSG(differ == 0 && normal > 5, "%zu values differ", differ);
            model_free(&m);
        }
    }
    /* the index: total_size is the bytes of the tensors, each named tensor in the file it names */
    snprintf(path, sizeof path, "%s/11/model.safetensors.index.json", dir);
    char *text;
    size_t len;
    REQUIRE(zy_read_file(path, &text, &len, &err) == 0);
    cJSON *root = cJSON_Parse(text);
    free(text);
    const cJSON *total = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "metadata"), "total_size");
    const cJSON *map = cJSON_GetObjectItem(root, "weight_map");
    size_t bytes = 0;
    for (int i = 0; i < ref.params.count; i++)
        bytes += ref.params.info[i].numel * (ref.params.info[i].kind == PARAM_BUFFER ? 4 : 2);
    CHECK(cJSON_IsNumber(total) && total->valuedouble == (double)bytes);
    CHECK(cJSON_GetArraySize(map) == ref.params.count);
    const cJSON *first = cJSON_GetObjectItem(map, "model.embed_tokens.weight");
    int n_files = 0;
    CHECK(first && sscanf(first->valuestring, "model-00001-of-%05d.safetensors", &n_files) == 1 && n_files > 3);
    cJSON_Delete(root);
    model_free(&ref);
    zy_test_rmtree(dir);
}

/* A broken sharded directory is refused, with an error naming the file, the tensor and what is wrong. */
TEST(sharded_index_errors_are_clear) {
    ZyErr err = {{0}};
    char dir[64], sub[128];
    REQUIRE(zy_test_tmpdir(dir, sizeof dir, "badindex") == 0);
    Model src;
    REQUIRE(make_model(&src, 0, 3, &err) == 0);
    static const struct {
        int fault;
        const char *want[3];
    } cases[] = {
        {FAULT_MISSING_SHARD, {"model.safetensors.index.json", "model-00002-of-00003.safetensors", "does not exist"}},
        {FAULT_TWO_SHARDS, {"model.embed_tokens.weight", "model-00002-of-00003.safetensors", "index puts it in"}},
        {FAULT_WRONG_DTYPE, {"model.embed_tokens.weight", "dtype I32", "expected F32, BF16 or F16"}},
        {FAULT_INDEX_WRONG_SHARD, {"model.embed_tokens.weight", "model-00001-of-00003.safetensors", "index puts it in"}},
        {FAULT_NOT_IN_INDEX, {"model.input_hidden_states_scale", "is not in", "weight_map"}},
        {FAULT_INDEX_EXTRA, {"model.layers.0.mlp.extra", "which does not hold it", "weight_map"}},
        {FAULT_INDEX_NOT_STRING, {"model.embed_tokens.weight", "plain file name", "weight_map"}},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        snprintf(sub, sizeof sub, "%s/c%zu", dir, k);
        REQUIRE(zy_mkdirs(sub, &err) == 0);
        REQUIRE(write_shards(&src, sub, 3, ZY_DT_BF16, cases[k].fault, &err) == 0);
        for (int bf16 = 0; bf16 < 2; bf16++) { /* the fp32 load and the mapped one check the same */
            Model m;
            err.msg[0] = '\0';
            CHECK_MSG(model_load_dir_as(&m, sub, bf16, &err) == -1, "case %zu loaded", k);
            for (int w = 0; w < 3; w++)
                CHECK_MSG(strstr(err.msg, cases[k].want[w]), "case %zu: \"%s\" lacks \"%s\"", k, err.msg,
                          cases[k].want[w]);
        }
    }
    /* and the same directory without a fault loads */
    snprintf(sub, sizeof sub, "%s/good", dir);
    REQUIRE(zy_mkdirs(sub, &err) == 0);
    REQUIRE(write_shards(&src, sub, 3, ZY_DT_BF16, FAULT_NONE, &err) == 0);
    Model m;
    CHECK_MSG(model_load_dir_as(&m, sub, 1, &err) == 0, "%s", err.msg);
    model_free(&m);
    model_free(&src);
    zy_test_rmtree(dir);
}

/* st_read_bf16: BF16 copied, F32/F16 rounded to nearest even from their float32 value (ties to even, NaN kept). */
TEST(st_read_bf16_rounds_like_f32_then_bf16) {
    ZyErr err = {{0}};
    float v[6] = {1.0f, 1.00390625f /* tie: to even, 1 */, 1.01171875f /* tie: up */, -3.3e-20f, 65504.0f, NAN};
    StWriteTensor t = {.name = "x", .ndim = 1, .shape = {6}, .src_dtype = ZY_DT_F32, .out_dtype = ZY_DT_F32, .data = v};
    char dir[64], path[128];
    REQUIRE(zy_test_tmpdir(dir, sizeof dir, "stbf16") == 0);
    snprintf(path, sizeof path, "%s/a.safetensors", dir);
    REQUIRE(st_write(path, &t, 1, NULL, &err) == 0);
    StFile f;
    REQUIRE(st_open(&f, path, &err) == 0);
    uint16_t h[6];
    CHECK(st_read_bf16(&f, &f.entries[0], h, &err) == 0);
    for (int i = 0; i < 6; i++) CHECK(h[i] == zy_f32_to_bf16(v[i]));
    CHECK(h[1] == 0x3f80 && h[2] == 0x3f82);
    st_close(&f);
    zy_test_rmtree(dir);
}

/* ---- what goes up to a GPU (gpu_weight_upload.h), checked with a sink that records instead of copying ---------- */

/* A stand-in device: the fp32 and bf16 arenas in the table's layout, what each tensor received, and the bytes. */
typedef struct {
    const Model *m;
    float *f32;
    uint16_t *bf16;
    int *times, *as_bf16;          /* per tensor: uploads, and 1 if they came as bf16 */
    const void **src;              /* per tensor: the host address it came from */
    size_t f32_bytes, bf16_bytes;
    const char *fail_on;           /* a tensor name whose upload fails (NULL: none) */
} FakeDevice;

static int fake_tensor(FakeDevice *d, size_t offset, size_t n) {
    for (int i = 0; i < d->m->params.count; i++)
        if (d->m->params.info[i].offset == offset && d->m->params.info[i].numel == n) return i;
    return -1;
}
static int fake_put(FakeDevice *d, int i, const void *src, int bf16, ZyErr *err) {
    if (i < 0) return zy_fail(err, "an upload that matches no tensor of the table");
    d->times[i]++, d->as_bf16[i] = bf16, d->src[i] = src;
    if (d->fail_on && !strcmp(d->m->params.info[i].name, d->fail_on)) return zy_fail(err, "device full");
    return 0;
}
static int fake_f32(void *ctx, size_t offset, const float *src, size_t n, ZyErr *err) {
    FakeDevice *d = ctx;
    memcpy(d->f32 + offset, src, n * sizeof(float));
    d->f32_bytes += n * sizeof(float);
    return fake_put(d, fake_tensor(d, offset, n), src, 0, err);
}
static int fake_bf16(void *ctx, size_t offset, const uint16_t *src, size_t n, ZyErr *err) {
    FakeDevice *d = ctx;
    memcpy(d->bf16 + offset, src, n * sizeof(uint16_t));
    for (size_t j = 0; j < n; j++) d->f32[offset + j] = zy_bf16_to_f32(src[j]); /* the device's widening */
    d->bf16_bytes += n * sizeof(uint16_t);
    return fake_put(d, fake_tensor(d, offset, n), src, 1, err);
}

static int fake_open(FakeDevice *d, const Model *m) {
    const size_t n = (size_t)m->params.count, total = m->params.total;
    *d = (FakeDevice){.m = m, .f32 = calloc(total, sizeof(float)), .bf16 = calloc(total, sizeof(uint16_t)),
                      .times = calloc(n, sizeof(int)), .as_bf16 = calloc(n, sizeof(int)),
                      .src = calloc(n, sizeof(void *))};
    return d->f32 && d->bf16 && d->times && d->as_bf16 && d->src ? 0 : -1;
}
static void fake_close(FakeDevice *d) { free(d->f32), free(d->bf16), free(d->times), free(d->as_bf16), free(d->src); }

/* The fake device's fp32 arena equals want's (an fp32 model) bit for bit, every tensor came once, and the bf16 ones
 * are exactly the matrices model_holds_bf16 accepts (or none). */
static void check_fake(int *zy_test_failed_, const FakeDevice *d, const Model *want, int bf16_matrices,
                       const char *what) {
    size_t differ = 0, wrong = 0;
    for (int i = 0; i < want->params.count; i++) {
        const ParamInfo *p = &want->params.info[i];
        differ += memcmp(d->f32 + p->offset, want->params.data + p->offset, p->numel * sizeof(float)) != 0;
        wrong += d->times[i] != 1 || d->as_bf16[i] != (bf16_matrices && model_holds_bf16(p));
    }
    CHECK_MSG(differ == 0 && wrong == 0, "%s: %zu tensors differ, %zu uploaded wrongly", what, differ, wrong);
}

/* A bf16 release loaded for a GPU has no fp32 host copy: every matrix goes up once as bf16 straight from the mapped
 * file (its view, no copy), every other tensor once as fp32 from the small arena, and the device's fp32 arena after
 * widening is the fp32 load of the same folder bit for bit. An fp32 model goes up as fp32 (in one arena); one rounded
 * by model_use_bf16 sends its bf16 arena; a failing upload names its tensor. */
TEST(gpu_upload_from_mapped_bf16_without_fp32_copy) {
    ZyErr err = {{0}};
    char dir[64], sub[128];
    REQUIRE(zy_test_tmpdir(dir, sizeof dir, "gpuup") == 0);
    for (int sharded = 0; sharded < 2; sharded++) {
        Model src, ref, mapped;
        REQUIRE(make_model(&src, sharded, 70 + sharded, &err) == 0); /* tied and untied */
        snprintf(sub, sizeof sub, "%s/s%d", dir, sharded);
        REQUIRE(zy_mkdirs(sub, &err) == 0);
        REQUIRE((sharded ? write_shards(&src, sub, 3, ZY_DT_BF16, FAULT_NONE, &err)
                         : model_save_dir(&src, sub, ZY_DT_BF16, &err)) == 0);
        REQUIRE(model_load_dir(&ref, sub, &err) == 0);
        REQUIRE(model_load_dir_as(&mapped, sub, MODEL_DTYPE_BF16, &err) == 0);
        CHECK(!mapped.params.data && !mapped.bf16 && !gpu_weights_in_one_arena(&mapped));
        CHECK(gpu_weights_in_one_arena(&ref));
        FakeDevice d;
        REQUIRE(fake_open(&d, &mapped) == 0);
        const WeightSink sink = {.ctx = &d, .f32 = fake_f32, .bf16 = fake_bf16};
        CHECK_MSG(gpu_upload_weights(&mapped, &sink, &err) == 0, "%s", err.msg);
        check_fake(zy_test_failed_, &d, &ref, 1, "mapped bf16");
        size_t in_place, copied;
        model_weight_bytes(&mapped, &in_place, &copied);
        CHECK_MSG(d.bf16_bytes == in_place && d.f32_bytes == copied && in_place > 0,
                  "bf16 %zu of %zu mapped, fp32 %zu of %zu copied", d.bf16_bytes, in_place, d.f32_bytes, copied);
        /* the bf16 sources are the model's own views (the mapped file), not copies */
        const int emb = params_find(&mapped.params, "model.embed_tokens.weight");
        const int dn = params_find(&mapped.params, "model.layers.1.mlp.experts.down_proj");
        CHECK(emb >= 0 && d.src[emb] == (const void *)mapped.w.embed16);
        CHECK(dn >= 0 && d.src[dn] == (const void *)mapped.w.layers[1].expert_down16);
        fake_close(&d);

        /* the fp32 model: every tensor as fp32, the same arena */
        REQUIRE(fake_open(&d, &ref) == 0);
        CHECK(gpu_upload_weights(&ref, &(WeightSink){.ctx = &d, .f32 = fake_f32, .bf16 = fake_bf16}, &err) == 0);
        check_fake(zy_test_failed_, &d, &ref, 0, "fp32");
        CHECK(d.bf16_bytes == 0);
        fake_close(&d);

        /* model_use_bf16 gave its matrices' fp32 pages back: they go up from its bf16 arena (exact here: the files
         * held bf16 values already) */
        Model rounded;
        REQUIRE(model_load_dir(&rounded, sub, &err) == 0);
        REQUIRE(model_use_bf16(&rounded, &err) > 0);
        CHECK(!gpu_weights_in_one_arena(&rounded));
        REQUIRE(fake_open(&d, &rounded) == 0);
        CHECK(gpu_upload_weights(&rounded, &(WeightSink){.ctx = &d, .f32 = fake_f32, .bf16 = fake_bf16}, &err) == 0);
        check_fake(zy_test_failed_, &d, &ref, 1, "model_use_bf16");
        fake_close(&d);

        /* a failing upload stops the walk and names the tensor */
        REQUIRE(fake_open(&d, &mapped) == 0);
        d.fail_on = "model.layers.0.self_attn.o_proj.weight";
        CHECK(gpu_upload_weights(&mapped, &(WeightSink){.ctx = &d, .f32 = fake_f32, .bf16 = fake_bf16}, &err) == -1);
        CHECK_MSG(strstr(err.msg, "uploading \"model.layers.0.self_attn.o_proj.weight\"") &&
                  strstr(err.msg, "device full"), "%s", err.msg);
        const int after = params_find(&mapped.params, "model.layers.1.self_attn.o_proj.weight");
        CHECK(after >= 0 && d.times[after] == 0);
        fake_close(&d);
        model_free(&src), model_free(&ref), model_free(&mapped), model_free(&rounded);
    }
    zy_test_rmtree(dir);
}

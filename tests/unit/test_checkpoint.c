/* Checkpoints at disk speed (src/io/checkpoint.c, src/io/ckpt_io.c, src/util/crc32.c): the fast CRC-32 against
 * zlib's, the files a save writes byte for byte what the simple writer (st_write) writes, the manifest's CRCs
 * (counted while writing) those of the files on disk, damage found by verify and by load, a load that gives back
 * the saved state exactly, a reused writer, and the chunked reader and writer at chunk and block boundaries. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "io/checkpoint.h"
#include "io/ckpt_io.h"
#include "io/manifest.h"
#include "io/model_io.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "test.h"

/* The bytes of a file, and their zlib CRC-32. */
static uint32_t file_bytes_crc(const char *path, char **data, size_t *len) {
    ZyErr err;
    if (zy_read_file(path, data, len, &err)) return 0;
    return (uint32_t)crc32(0, (const Bytef *)*data, (uInt)*len);
}

static int files_equal(const char *a, const char *b) {
    char *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    file_bytes_crc(a, &x, &nx);
    file_bytes_crc(b, &y, &ny);
    const int same = x && y && nx == ny && memcmp(x, y, nx) == 0;
    free(x), free(y);
    return same;
}

/* A small model (its config through config.json, as a run reads it) and an optimizer whose state is all distinct. */
static int make_state(const char *dir, Model *m, Optimizer *o, uint64_t seed, ZyErr *err) {
    ZayaConfig c = {.vocab_size = 61, .hidden_size = 32, .num_layers = 2, .num_heads = 4, .num_kv_heads = 2,
                    .head_dim = 8, .num_experts = 3, .moe_intermediate_size = 16, .router_hidden_size = 8,
                    .cca_time0 = 2, .cca_time1 = 2, .rms_norm_eps = 1e-5f, .tie_word_embeddings = 1,
                    .max_position_embeddings = 64, .rope_theta = 10000.0f, .partial_rotary_factor = 0.5f,
                    .initializer_range = 0.02f, .bos_token_id = 1, .eos_token_id = 2, .pad_token_id = 0};
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    ZayaConfig loaded;
    if (config_save(&c, path, "float32", err) || config_load(&loaded, path, err) || model_create(m, &loaded, err)) return -1;
    model_init_weights(m, seed);
    OptimConfig oc;
    optim_config_default(&oc);
    if (optim_create(o, &m->params, &oc, err)) return -1;
    for (size_t j = 0; j < o->end - o->begin; j++) {
        o->exp_avg[j] = (float)(seed % 7) + 1e-3f * (float)j;
        o->exp_avg_sq[j] = 2e-3f * (float)j;
    }
    return 0;
}

/* The optimizer shard as the writer before this one made it: st_write of the owned tensors' moments. */
static int write_shard_simply(const char *path, const Model *m, const Optimizer *o, ZyErr *err) {
    const ParamTable *t = &m->params;
    StWriteTensor *ts = calloc((size_t)2 * t->count, sizeof *ts);
    char(*names)[160] = calloc((size_t)2 * t->count, sizeof *names);
    int n = 0;
    for (int i = 0; i < t->count; i++) {
        const ParamInfo *p = &t->info[i];
        if (!param_trainable(p) || !o->owned[i]) continue;
        for (int which = 0; which < 2; which++) {
            if (which == 1 && p->kind == PARAM_MUON) continue;
            snprintf(names[n], sizeof names[n], "%s/%s", which ? "exp_avg_sq" : "exp_avg", p->name);
            ts[n] = (StWriteTensor){.name = names[n], .ndim = p->ndim, .src_dtype = ZY_DT_F32, .out_dtype = ZY_DT_F32,
                                    .data = optim_state(o, p, which)};
            memcpy(ts[n].shape, p->shape, sizeof p->shape);
            n++;
        }
    }
    int rc = st_write(path, ts, n, NULL, err);
    free(ts);
    free(names);
    return rc;
}

static void flip_byte(const char *path, long at) {
    FILE *f = fopen(path, "r+b");
    if (!f) return;
    fseek(f, at, SEEK_SET);
    int c = fgetc(f);
    fseek(f, at, SEEK_SET);
    fputc(c ^ 0x40, f);
    fclose(f);
}

static long file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

TEST(crc32_matches_zlib_at_every_length_and_alignment) {
    enum { N = 200000 };
    unsigned char *b = malloc(N + 64), *d = malloc(N + 64);
    REQUIRE(b && d);
    ZyRng rng;
    zy_rng_seed(&rng, 3);
    for (int i = 0; i < N + 64; i++) b[i] = (unsigned char)zy_rng_next(&rng);
    int bad = 0;
    for (int it = 0; it < 4000; it++) {
        const size_t off = zy_rng_next(&rng) % 64, len = it < 2048 ? (size_t)it : zy_rng_next(&rng) % N;
        const uint32_t seed = (uint32_t)zy_rng_next(&rng), want = (uint32_t)crc32(seed, b + off, (uInt)len);
        memset(d, 0, N + 64);
        bad += zy_crc32(seed, b + off, len) != want;
        bad += zy_crc32_copy(seed, d + 1, b + off, len) != want || memcmp(d + 1, b + off, len) != 0 || d[0] || d[len + 1];
    }
    CHECK_MSG(bad == 0, "%d mismatches", bad);
    const uint32_t whole = zy_crc32(0, b, N), head = zy_crc32(0, b, 12345), tail = zy_crc32(0, b + 12345, N - 12345);
    CHECK(zy_crc32_combine(head, tail, N - 12345) == whole);
    free(b), free(d);
}

/* Files written through ckpt_write_files and read back through ckpt_read_files with tiny chunks (many chunks,
 * spans across their boundaries, files not a block multiple), through O_DIRECT and the page cache. */
TEST(chunked_writes_and_reads_keep_every_byte_and_count_the_crc) {
    char dir[256];
    REQUIRE(zy_test_tmpdir(dir, sizeof dir, "ckptio") == 0);
    const CkptIoConfig saved = ckpt_io_config();
    ZyErr err;
    for (int direct = 0; direct < 2; direct++) {
        CkptIoConfig c = {.direct = direct, .threads = 3, .chunk_bytes = 8192};
        ckpt_io_configure(&c);
        CkptImage im[2] = {{0}};
        const size_t len[2] = {100003, 4096 * 5};
        char path[2][300];
        CkptFileOut out[2];
        for (int f = 0; f < 2; f++) {
            REQUIRE(ckpt_image_reserve(&im[f], len[f], &err) == 0);
            for (size_t i = 0; i < len[f]; i++) im[f].data[i] = (uint8_t)(i * 131 + f * 7 + (i >> 9));
            snprintf(path[f], sizeof path[f], "%s/f%d-%d.bin", dir, f, direct);
            out[f] = (CkptFileOut){.path = path[f], .data = im[f].data, .len = len[f]};
        }
        REQUIRE(ckpt_write_files(out, 2, &err) == 0);
        for (int f = 0; f < 2; f++) {
            char *data = NULL;
            size_t n = 0;
            const uint32_t crc = file_bytes_crc(path[f], &data, &n);
            CHECK(n == len[f] && data && memcmp(data, im[f].data, n) == 0);
            CHECK(out[f].crc == crc);
            free(data);
        }
        /* three spans of file 0 (one across several chunks), the range around them checksummed */
        uint8_t *dst = calloc(len[0], 1);
        CkptSpan spans[3] = {{.offset = 5000, .len = 3000, .dst = dst + 5000},
                             {.offset = 8190, .len = 30000, .dst = dst + 8190},
                             {.offset = 60000, .len = 1, .dst = dst + 60000}};
        CkptFileIn in[2] = {{.path = path[0], .lo = 4999, .hi = 70001, .spans = spans, .n_spans = 3},
                            {.path = path[1], .lo = 0, .hi = len[1]}};
        REQUIRE(ckpt_read_files(in, 2, &err) == 0);
        CHECK(in[0].crc == zy_crc32(0, im[0].data + 4999, 70001 - 4999));
        CHECK(in[1].crc == zy_crc32(0, im[1].data, len[1]));
        int wrong = 0;
        for (size_t i = 0; i < len[0]; i++) {
            const int inside = (i >= 5000 && i < 8000) || (i >= 8190 && i < 38190) || i == 60000;
            wrong += dst[i] != (inside ? im[0].data[i] : 0);
        }
        CHECK_MSG(wrong == 0, "%d bytes wrong (direct %d)", wrong, direct);
        free(dst);
        ckpt_image_free(&im[0]), ckpt_image_free(&im[1]);
    }
    ckpt_io_configure(&saved);
    zy_test_rmtree(dir);
}

/* A save writes byte for byte what model_save_dir and st_write write (so any zaya reads it), the manifest's CRCs
 * are the files', and a load gives back exactly the state saved, though the arenas were changed in between. */
TEST(checkpoint_files_are_the_simple_writers_and_load_restores_them) {
    char dir[256], root[300], ref[300], path[1100], path2[1100], out[600];
    REQUIRE(zy_test_tmpdir(dir, sizeof dir, "ckpt") == 0);
    snprintf(root, sizeof root, "%s/checkpoints", dir);
    snprintf(ref, sizeof ref, "%s/ref", dir);
    ZyErr err;
    Model m;
    Optimizer o;
    REQUIRE(make_state(dir, &m, &o, 5, &err) == 0);
    CheckpointContent c = {.model = &m, .optim = &o, .trainer_state_json = "{\"step\": 3}", .run_json = "{}"};
    REQUIRE(ckpt_save(root, 3, &c, NULL, 2, out, sizeof out, &err) == 0);
    REQUIRE(model_save_dir(&m, ref, ZY_DT_F32, &err) == 0);
    snprintf(path, sizeof path, "%s/optimizer-00000-of-00001.safetensors", ref);
    REQUIRE(write_shard_simply(path, &m, &o, &err) == 0);
    static const char *const same[] = {"model.safetensors", "config.json", "optimizer-00000-of-00001.safetensors"};
    for (size_t i = 0; i < ZY_ARRAY_LEN(same); i++) {
        snprintf(path, sizeof path, "%s/%s", out, same[i]);
        snprintf(path2, sizeof path2, "%s/%s", ref, same[i]);
        CHECK_MSG(files_equal(path, path2), "%s differs from the simple writer's", same[i]);
    }
    /* the manifest's CRC of each file, as zlib counts the file's bytes */
    char *text = NULL;
    size_t len;
    snprintf(path, sizeof path, "%s/manifest.json", out);
    REQUIRE(zy_read_file(path, &text, &len, &err) == 0);
    CkptManifest man;
    REQUIRE(ckpt_manifest_parse(text, len, path, &man, &err) == 0);
    free(text);
    CHECK(man.n_files == 5); /* config, model, shard, run.json, trainer state: the ranks' CRC notes stay out */
    for (int i = 0; i < man.n_files; i++) {
        char *data = NULL;
        size_t n = 0;
        snprintf(path, sizeof path, "%s/%s", out, man.files[i].name);
        const uint32_t crc = file_bytes_crc(path, &data, &n);
        CHECK_MSG(man.files[i].crc32 == crc && man.files[i].bytes == n, "manifest: %s", man.files[i].name);
        free(data);
    }
    ckpt_manifest_free(&man);
    CHECK(ckpt_verify(out, &err) == 0);
    /* the state changed, then loaded back: bit for bit the saved one (every tensor's values and moments; the
     * arenas' alignment padding and the scratch exp_avg_sq of Muon tensors are not saved) */
    const size_t bytes = m.params.total * sizeof(float), block = (o.end - o.begin) * sizeof(float);
    float *p0 = malloc(bytes), *m0 = malloc(block), *v0 = malloc(block);
    REQUIRE(p0 && m0 && v0);
    memcpy(p0, m.params.data, bytes), memcpy(m0, o.exp_avg, block), memcpy(v0, o.exp_avg_sq, block);
    for (size_t j = 0; j < m.params.total; j++) m.params.data[j] += 1.0f;
    for (size_t j = 0; j < o.end - o.begin; j++) o.exp_avg[j] = o.exp_avg_sq[j] = -1.0f;
    char *state = NULL;
    REQUIRE(ckpt_load(out, &m, &o, &state, NULL, &err) == 0);
    CHECK(state && strcmp(state, "{\"step\": 3}") == 0);
    int wrong = 0;
    for (int i = 0; i < m.params.count; i++) {
        const ParamInfo *p = &m.params.info[i];
        const size_t n = p->numel * sizeof(float);
        wrong += memcmp(p0 + p->offset, m.params.data + p->offset, n) != 0;
        if (!param_trainable(p)) continue;
        wrong += memcmp(m0 + (p->offset - o.begin), optim_state(&o, p, 0), n) != 0;
        if (p->kind == PARAM_ADAMW) wrong += memcmp(v0 + (p->offset - o.begin), optim_state(&o, p, 1), n) != 0;
    }
    CHECK_MSG(wrong == 0, "%d tensors differ after the load", wrong);
    free(state), free(p0), free(m0), free(v0);
    optim_free(&o);
    model_free(&m);
    zy_test_rmtree(dir);
}

/* A byte flipped in an optimizer shard's data, in a header, or a truncated shard: verify and load both refuse it
 * and name the file (the CRC counted while writing is still checked against what is on disk). */
TEST(a_damaged_shard_fails_verify_and_load) {
    char dir[256], root[300], out[600], shard[700], model_file[700];
    REQUIRE(zy_test_tmpdir(dir, sizeof dir, "ckptbad") == 0);
    snprintf(root, sizeof root, "%s/checkpoints", dir);
    ZyErr err;
    Model m;
    Optimizer o;
    REQUIRE(make_state(dir, &m, &o, 6, &err) == 0);
    CheckpointContent c = {.model = &m, .optim = &o, .trainer_state_json = "{}", .run_json = NULL};
    REQUIRE(ckpt_save(root, 1, &c, NULL, 0, out, sizeof out, &err) == 0);
    snprintf(shard, sizeof shard, "%s/optimizer-00000-of-00001.safetensors", out);
    snprintf(model_file, sizeof model_file, "%s/model.safetensors", out);
    const long size = file_size(shard);
    REQUIRE(size > 1000);
    char *state = NULL;
    static const struct {
        const char *what;
        int header; /* flip in the JSON header rather than the data */
    } cases[] = {{"data", 0}, {"header", 1}};
    for (size_t k = 0; k < ZY_ARRAY_LEN(cases); k++) {
        const long at = cases[k].header ? 40 : size - 5;
        flip_byte(shard, at);
        CHECK_MSG(ckpt_verify(out, &err) != 0 && strstr(err.msg, "CRC-32") && strstr(err.msg, "optimizer-00000"),
                  "verify, byte flipped in the %s: %s", cases[k].what, err.msg);
        CHECK_MSG(ckpt_load(out, &m, &o, &state, NULL, &err) != 0 && strstr(err.msg, "CRC-32") &&
                      strstr(err.msg, "optimizer-00000"),
                  "load, byte flipped in the %s: %s", cases[k].what, err.msg);
        CHECK(state == NULL);
        flip_byte(shard, at); /* undone */
        CHECK(ckpt_verify(out, &err) == 0);
    }
    flip_byte(model_file, file_size(model_file) / 2);
    CHECK_MSG(ckpt_load(out, &m, &o, &state, NULL, &err) != 0 && strstr(err.msg, "CRC-32") && strstr(err.msg, "model.safetensors"),
              "load, byte flipped in the model: %s", err.msg);
    flip_byte(model_file, file_size(model_file) / 2);
    REQUIRE(truncate(shard, size - 100) == 0);
    CHECK_MSG(ckpt_verify(out, &err) != 0 && strstr(err.msg, "truncated"), "verify, truncated: %s", err.msg);
    CHECK_MSG(ckpt_load(out, &m, &o, &state, NULL, &err) != 0 && strstr(err.msg, "truncated"), "load, truncated: %s", err.msg);
    optim_free(&o);
    model_free(&m);
    zy_test_rmtree(dir);
}

/* The writer kept by a run: each save holds the state of its own step (taken at the snapshot, not at the write),
 * the retention keeps the newest, and its images are reused. */
TEST(a_reused_writer_saves_each_steps_own_state) {
    char dir[256], root[300], out[600], first[600];
    REQUIRE(zy_test_tmpdir(dir, sizeof dir, "ckptreuse") == 0);
    snprintf(root, sizeof root, "%s/checkpoints", dir);
    ZyErr err;
    Model m;
    Optimizer o;
    REQUIRE(make_state(dir, &m, &o, 7, &err) == 0);
    CkptWriter *w = NULL;
    REQUIRE(ckpt_writer_prepare(&w, &m, &o, NULL, &err) == 0);
    float values[3];
    for (int step = 1; step <= 3; step++) {
        m.params.data[0] = values[step - 1] = 0.25f * (float)step;
        CheckpointContent c = {.model = &m, .optim = &o, .trainer_state_json = "{}", .run_json = NULL};
        REQUIRE(ckpt_save_async(&w, root, step, &c, NULL, 2, &err) == 0);
        m.params.data[0] = 99.0f; /* training goes on while it is written */
        REQUIRE(ckpt_wait(w, NULL, out, sizeof out, NULL, &err) == 0);
        if (step == 1) snprintf(first, sizeof first, "%s", out);
    }
    ckpt_writer_free(w);
    char dirs[8][512];
    CHECK(ckpt_list(root, dirs, 8, &err) == 2);
    CHECK(access(first, F_OK) != 0); /* the oldest pruned */
    for (int k = 0; k < 2; k++) {
        char *state = NULL;
        REQUIRE(ckpt_load(dirs[k], &m, &o, &state, NULL, &err) == 0);
        CHECK(m.params.data[0] == values[2 - k]);
        free(state);
    }
    optim_free(&o);
    model_free(&m);
    zy_test_rmtree(dir);
}

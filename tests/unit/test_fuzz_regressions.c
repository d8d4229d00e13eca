/* Run config and checkpoint manifest parsing: the inputs the fuzz targets (tests/fuzz) found problems with. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/manifest.h"
#include "train/runconfig.h"
#include "test.h"

static const char *RUN =
    "{\"model\": \"m.json\", \"datasets\": {\"a\": \"d/a\"}, \"phases\": [{\"tokens\": 64, \"seq_len\": 8, "
    "\"mixture\": {\"a\": 1}}], \"batch_size\": 2, \"out_dir\": \"o\"}";

static int parse_with(const char *override, RunConfig *rc, ZyErr *err) {
    const char *ov[1] = {override};
    char *json = NULL;
    int r = runconfig_parse(rc, RUN, "run.json", ov, override ? 1 : 0, &json, err);
    free(json);
    return r;
}

TEST(runconfig_rejects_values_that_do_not_survive_run_json) {
    static const struct {
        const char *override, *expect;
    } cases[] = {
        {"seed=9007199254740991", "\"seed\""},               /* 16 digits: cJSON writes it back as 9.00719925474099e+15 */
        {"checkpoint.interval=1000000000000", "\"checkpoint.interval\""}, /* was cast to int (UB) */
        {"eval.interval=1000000000000", "\"eval.interval\""},
        {"phases.0.tokens=1e18", "\"phases.0.tokens\""},     /* 16 such phases overflowed total_steps */
        {"phases.0.tokens=2.5", "must be an integer"},
        {"out_dir=", "\"out_dir\" must not be empty"},
    };
    RunConfig *rc = malloc(sizeof *rc);
    REQUIRE(rc != NULL);
    ZyErr err = {{0}};
    CHECK_MSG(parse_with(NULL, rc, &err) == 0, "%s", err.msg);
    CHECK(parse_with("seed=999999999999999", rc, &err) == 0 && rc->seed == 999999999999999ull);
    for (size_t i = 0; i < ZY_ARRAY_LEN(cases); i++) {
        err.msg[0] = '\0';
        CHECK_MSG(parse_with(cases[i].override, rc, &err) == -1, "%s was accepted", cases[i].override);
        CHECK_MSG(strncmp(err.msg, "run.json: ", 10) == 0 && strstr(err.msg, cases[i].expect), "%s: \"%s\"",
                  cases[i].override, err.msg);
    }
    free(rc);
}

static const char *MANIFEST =
    "{\"format\": \"zaya-checkpoint\", \"version\": 1, \"step\": 12, \"world_size\": 2, \"files\": ["
    "{\"name\": \"model.safetensors\", \"bytes\": 100, \"crc32\": 4294967295},"
    "{\"name\": \"optimizer-00000-of-00002.safetensors\", \"bytes\": 0, \"crc32\": 0}]}";

static int parse_manifest_variant(const char *from, const char *to, CkptManifest *m, ZyErr *err) {
    char s[1024];
    const char *at = strstr(MANIFEST, from);
    if (!at) return -2;
    snprintf(s, sizeof s, "%.*s%s%s", (int)(at - MANIFEST), MANIFEST, to, at + strlen(from));
    return ckpt_manifest_parse(s, strlen(s), "ck/manifest.json", m, err);
}

TEST(manifest_parses_and_rejects_each_bad_field) {
    CkptManifest m;
    ZyErr err = {{0}};
    REQUIRE(parse_manifest_variant("", "", &m, &err) == 0);
    CHECK(m.step == 12 && m.world_size == 2 && m.n_files == 2 && m.files[0].bytes == 100 &&
          m.files[0].crc32 == 4294967295u && strcmp(m.files[1].name, "optimizer-00000-of-00002.safetensors") == 0);
    ckpt_manifest_free(&m);
    REQUIRE(parse_manifest_variant("\"world_size\": 2, ", "", &m, &err) == 0); /* before data parallelism */
    CHECK(m.world_size == 1);
    ckpt_manifest_free(&m);
    static const struct {
        const char *from, *to, *expect;
    } cases[] = {
        {"\"bytes\": 100", "\"bytes\": -1", "malformed entry"},                  /* was cast to uint64 (UB) */
        {"\"crc32\": 4294967295", "\"crc32\": 4294967296", "malformed entry"},   /* was cast to uint32 (UB) */
        {"\"bytes\": 100", "\"bytes\": 9007199254740992", "malformed entry"},     /* not written back exactly */
        {"\"bytes\": 0", "\"bytes\": 0.5", "malformed entry"},
        {"optimizer-00000-of-00002.safetensors", "../model.safetensors", "not a checkpoint file name"},
        {"optimizer-00000-of-00002.safetensors", "model.safetensors", "listed twice"},
        {"optimizer-00000-of-00002.safetensors", "manifest.json", "not a checkpoint file name"},
        {"model.safetensors", "model.bin", "no model.safetensors"},
        {"\"version\": 1", "\"version\": 2", "version"},
        {"zaya-checkpoint", "other", "\"format\""},
        {"\"step\": 12", "\"step\": -1", "\"step\""},
        {"\"world_size\": 2", "\"world_size\": 0", "\"world_size\""},
        {"\"files\": [", "\"files\": {", "not JSON"},
    };
    for (size_t i = 0; i < ZY_ARRAY_LEN(cases); i++) {
        err.msg[0] = '\0';
        int rc = parse_manifest_variant(cases[i].from, cases[i].to, &m, &err);
        CHECK_MSG(rc == -1, "case %zu (%s) was accepted", i, cases[i].expect);
        CHECK_MSG(m.files == NULL && m.n_files == 0, "case %zu left files behind", i);
        CHECK_MSG(strncmp(err.msg, "ck/manifest.json: ", 18) == 0 && strstr(err.msg, cases[i].expect),
                  "case %zu: \"%s\" lacks \"%s\"", i, err.msg, cases[i].expect);
    }
}

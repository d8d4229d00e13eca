/* libFuzzer target for the checkpoint manifest parser (ckpt_manifest_parse). Invariants: a rejected input fails
 * with a message that starts with the label; an accepted manifest holds plain, unique file names including
 * model.safetensors, and written back in checkpoint.c's layout it parses to the identical manifest. Build and run:
 * `make fuzz` or
 *   make build-fuzz/fuzz_manifest && build-fuzz/fuzz_manifest -max_total_time=60 /tmp/new tests/fuzz/corpus/manifest
 */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/manifest.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fail(const char *what, const char *detail) {
    fprintf(stderr, "fuzz_manifest: %s: %s\n", what, detail);
    abort();
}

/* the layout write_manifest (checkpoint.c) produces */
static char *write_back(const CkptManifest *m) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "format", "zaya-checkpoint");
    cJSON_AddNumberToObject(root, "version", 1);
    cJSON_AddNumberToObject(root, "step", (double)m->step);
    cJSON_AddNumberToObject(root, "world_size", m->world_size);
    cJSON *arr = cJSON_AddArrayToObject(root, "files");
    for (int i = 0; i < m->n_files; i++) {
        cJSON *f = cJSON_CreateObject();
        cJSON_AddStringToObject(f, "name", m->files[i].name);
        cJSON_AddNumberToObject(f, "bytes", (double)m->files[i].bytes);
        cJSON_AddNumberToObject(f, "crc32", (double)m->files[i].crc32);
        cJSON_AddItemToArray(arr, f);
    }
    char *s = cJSON_Print(root);
    cJSON_Delete(root);
    return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    CkptManifest m;
    ZyErr err;
    err.msg[0] = '\0';
    /* exactly `size` bytes, no terminator: the parser must not read past the end */
    if (ckpt_manifest_parse((const char *)data, size, "fuzz/manifest.json", &m, &err) != 0) {
        if (strncmp(err.msg, "fuzz/manifest.json: ", 20) != 0 || !err.msg[20])
            fail("error does not name the file", err.msg);
        if (m.files || m.n_files) fail("files left on failure", err.msg);
        return 0;
    }
    if (m.step < 0 || m.world_size < 1 || m.n_files < 1 || m.n_files > CKPT_MANIFEST_MAX_FILES)
        fail("header out of range", "step/world_size/n_files");
    int have_model = 0;
    for (int i = 0; i < m.n_files; i++) {
        const char *n = m.files[i].name;
        if (!memchr(n, 0, sizeof m.files[i].name) || !n[0] || strchr(n, '/') || !strcmp(n, ".") || !strcmp(n, "..") ||
            !strcmp(n, "manifest.json") || m.files[i].bytes >= 1000000000000000ull)
            fail("bad entry accepted", n);
        for (int j = 0; j < i; j++)
            if (strcmp(n, m.files[j].name) == 0) fail("duplicate accepted", n);
        have_model |= strcmp(n, "model.safetensors") == 0;
    }
    if (!have_model) fail("no model.safetensors", "accepted");
    char *text = write_back(&m);
    if (!text) fail("write_back", "NULL");
    CkptManifest m2;
    if (ckpt_manifest_parse(text, strlen(text), "rewritten", &m2, &err)) fail("written manifest does not parse", err.msg);
    if (m2.step != m.step || m2.world_size != m.world_size || m2.n_files != m.n_files ||
        memcmp(m.files, m2.files, (size_t)m.n_files * sizeof *m.files) != 0)
        fail("written manifest parses differently", text);
    free(text);
    ckpt_manifest_free(&m2);
    ckpt_manifest_free(&m);
    return 0;
}

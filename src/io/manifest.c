#include "io/manifest.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Integers up to 1e15 - 1: cJSON writes a number with 15 significant digits whenever that reads back within an ulp,
 * so larger ones would not survive being written back. */
#define MAX_EXACT 999999999999999.0

/* An integer-valued number in [lo, hi]; *out untouched otherwise. */
static int read_integer(const cJSON *obj, const char *key, double lo, double hi, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsNumber(v)) return -1;
    double d = v->valuedouble;
    if (!(d >= lo && d <= hi) || d != floor(d)) return -1;
    *out = d;
    return 0;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp((*(const CkptManifestFile *const *)a)->name, (*(const CkptManifestFile *const *)b)->name);
}

static int check_files(CkptManifest *m, const char *label, ZyErr *err) {
    int have_model = 0;
    for (int i = 0; i < m->n_files; i++) have_model |= strcmp(m->files[i].name, "model.safetensors") == 0;
    if (!have_model) return zy_fail(err, "%s: manifest lists no model.safetensors", label);
    const CkptManifestFile **sorted = malloc((size_t)m->n_files * sizeof *sorted);
    if (!sorted) return zy_fail(err, "%s: out of memory", label);
    for (int i = 0; i < m->n_files; i++) sorted[i] = &m->files[i];
    qsort(sorted, (size_t)m->n_files, sizeof *sorted, cmp_name);
    int rc = 0;
    for (int i = 1; i < m->n_files && !rc; i++)
        if (strcmp(sorted[i]->name, sorted[i - 1]->name) == 0)
            rc = zy_fail(err, "%s: file \"%s\" is listed twice", label, sorted[i]->name);
    free(sorted);
    return rc;
}

int ckpt_manifest_parse(const char *text, size_t len, const char *label, CkptManifest *m, ZyErr *err) {
    memset(m, 0, sizeof *m);
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!root) return zy_fail(err, "%s: invalid manifest (not JSON)", label);
    int rc = -1;
    double d;
    const cJSON *format = cJSON_GetObjectItemCaseSensitive(root, "format");
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(root, "files");
    if (!cJSON_IsObject(root) || !cJSON_IsArray(files)) {
        zy_fail(err, "%s: invalid manifest (expected an object with a \"files\" list)", label);
        goto done;
    }
    if (!cJSON_IsString(format) || strcmp(format->valuestring, "zaya-checkpoint") != 0) {
        zy_fail(err, "%s: invalid manifest (\"format\" must be \"zaya-checkpoint\")", label);
        goto done;
    }
    if (read_integer(root, "version", 1, 1, &d)) {
        zy_fail(err, "%s: unsupported manifest version (expected \"version\": 1)", label);
        goto done;
    }
    if (read_integer(root, "step", 0, MAX_EXACT, &d)) {
        zy_fail(err, "%s: invalid manifest (\"step\" must be an integer >= 0)", label);
        goto done;
    }
    m->step = (int64_t)d;
    d = 1; /* absent in checkpoints written before data parallelism: one rank */
    if (cJSON_GetObjectItemCaseSensitive(root, "world_size") && read_integer(root, "world_size", 1, 1 << 20, &d)) {
        zy_fail(err, "%s: invalid manifest (\"world_size\" must be an integer in [1, %d])", label, 1 << 20);
        goto done;
    }
    m->world_size = (int)d;
    int n = cJSON_GetArraySize(files);
    if (n < 1 || n > CKPT_MANIFEST_MAX_FILES) {
        zy_fail(err, "%s: invalid manifest (%d files listed, expected 1 to %d)", label, n, CKPT_MANIFEST_MAX_FILES);
        goto done;
    }
    if (!(m->files = calloc((size_t)n, sizeof *m->files))) {
        zy_fail(err, "%s: out of memory", label);
        goto done;
    }
    const cJSON *f;
    cJSON_ArrayForEach(f, files) {
        int i = m->n_files;
        CkptManifestFile *e = &m->files[i];
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
        double bytes, crc;
        if (!cJSON_IsObject(f) || !cJSON_IsString(name) || read_integer(f, "bytes", 0, MAX_EXACT, &bytes) ||
            read_integer(f, "crc32", 0, 4294967295.0, &crc)) {
            zy_fail(err, "%s: malformed entry in \"files\" (files[%d] needs a \"name\", \"bytes\" >= 0 and a 32-bit "
                         "\"crc32\")", label, i);
            goto done;
        }
        const char *s = name->valuestring;
        if (!s[0] || strlen(s) >= sizeof e->name || strchr(s, '/') || strcmp(s, ".") == 0 || strcmp(s, "..") == 0 ||
            strcmp(s, "manifest.json") == 0) {
            zy_fail(err, "%s: malformed entry in \"files\" (files[%d]: \"%.64s\" is not a checkpoint file name)", label,
                    i, s);
            goto done;
        }
        strcpy(e->name, s);
        e->bytes = (uint64_t)bytes;
        e->crc32 = (uint32_t)crc;
        m->n_files++;
    }
    rc = check_files(m, label, err);
done:
    cJSON_Delete(root);
    if (rc) ckpt_manifest_free(m);
    return rc;
}

void ckpt_manifest_free(CkptManifest *m) {
    free(m->files);
    m->files = NULL;
    m->n_files = 0;
}

#define _POSIX_C_SOURCE 200809L
#include "io/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* The on-disk format is little-endian; reading it with memcpy is only correct on a little-endian host. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host"
#endif

#define ST_MAX_HEADER ((uint64_t)100 << 20)
/* Integers at or above 2^53 cannot be represented exactly by cJSON's double, so they are refused. */
#define ST_MAX_JSON_INT 9007199254740992.0

static const struct {
    const char *name;
    ZyDtype dt;
} st_dtypes[] = {
    {"F64", ZY_DT_F64},  {"F32", ZY_DT_F32}, {"F16", ZY_DT_F16}, {"BF16", ZY_DT_BF16}, {"I64", ZY_DT_I64},
    {"I32", ZY_DT_I32},  {"I16", ZY_DT_I16}, {"I8", ZY_DT_I8},   {"U64", ZY_DT_U64},   {"U32", ZY_DT_U32},
    {"U16", ZY_DT_U16},  {"U8", ZY_DT_U8},   {"BOOL", ZY_DT_BOOL},
};

static int st_dtype_from_name(const char *s, ZyDtype *out) {
    for (size_t i = 0; i < ZY_ARRAY_LEN(st_dtypes); i++) {
        if (strcmp(s, st_dtypes[i].name) == 0) {
            *out = st_dtypes[i].dt;
            return 0;
        }
    }
    return -1;
}

/* Returns the offset of the first invalid UTF-8 sequence, or len when the whole buffer is valid. */
static size_t utf8_invalid_at(const uint8_t *s, size_t len) {
    size_t i = 0;
    while (i < len) {
        uint8_t c = s[i];
        size_t n;
        uint32_t cp;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xe0) == 0xc0) {
            n = 1;
            cp = c & 0x1f;
        } else if ((c & 0xf0) == 0xe0) {
            n = 2;
            cp = c & 0x0f;
        } else if ((c & 0xf8) == 0xf0) {
            n = 3;
            cp = c & 0x07;
        } else {
            return i;
        }
        if (len - i <= n) return i;
        for (size_t k = 1; k <= n; k++) {
            if ((s[i + k] & 0xc0) != 0x80) return i;
            cp = (cp << 6) | (s[i + k] & 0x3f);
        }
        /* reject overlong forms, surrogates and values past U+10FFFF */
        static const uint32_t min_cp[4] = {0, 0x80, 0x800, 0x10000};
        if (cp < min_cp[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return i;
        i += n + 1;
    }
    return len;
}

static void st_free_parsed(StFile *f) {
    if (f->entries) {
        for (int i = 0; i < f->n_entries; i++) free(f->entries[i].name);
        free(f->entries);
    }
    if (f->metadata_json) cJSON_free(f->metadata_json);
    f->entries = NULL;
    f->n_entries = 0;
    f->metadata_json = NULL;
}

/* Reads a JSON number that must be a non-negative integer below 2^53. */
static int json_uint(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v)) return -1;
    double d = v->valuedouble;
    if (!isfinite(d) || d < 0 || d >= ST_MAX_JSON_INT || d != floor(d)) return -1;
    *out = (uint64_t)d;
    return 0;
}

static int st_parse_entry(StFile *f, const cJSON *obj, StEntry *e, ZyErr *err) {
    const char *name = obj->string;
    if (!cJSON_IsObject(obj))
        return zy_fail(err, "%s: tensor '%.200s': entry is not a JSON object", f->label, name);
    const cJSON *dtype = NULL, *shape = NULL, *offs = NULL;
    for (const cJSON *c = obj->child; c; c = c->next) {
        const cJSON **slot = NULL;
        if (strcmp(c->string, "dtype") == 0)
            slot = &dtype;
        else if (strcmp(c->string, "shape") == 0)
            slot = &shape;
        else if (strcmp(c->string, "data_offsets") == 0)
            slot = &offs;
        else
            continue; /* unknown fields are ignored, as the reference implementation does */
        if (*slot)
            return zy_fail(err, "%s: tensor '%.200s': duplicate field \"%s\"", f->label, name, c->string);
        *slot = c;
    }
    if (!dtype) return zy_fail(err, "%s: tensor '%.200s': missing field \"dtype\"", f->label, name);
    if (!shape) return zy_fail(err, "%s: tensor '%.200s': missing field \"shape\"", f->label, name);
    if (!offs) return zy_fail(err, "%s: tensor '%.200s': missing field \"data_offsets\"", f->label, name);

    if (!cJSON_IsString(dtype))
        return zy_fail(err, "%s: tensor '%.200s': dtype is not a string", f->label, name);
    if (st_dtype_from_name(dtype->valuestring, &e->dtype) != 0)
        return zy_fail(err, "%s: tensor '%.200s': unsupported dtype '%.40s'", f->label, name, dtype->valuestring);

    if (!cJSON_IsArray(shape))
        return zy_fail(err, "%s: tensor '%.200s': shape is not an array", f->label, name);
    int ndim = cJSON_GetArraySize(shape);
    if (ndim > ZY_MAX_DIMS)
        return zy_fail(err, "%s: tensor '%.200s': shape has %d dims, more than the maximum %d", f->label, name,
                       ndim, ZY_MAX_DIMS);
    size_t numel = 1;
    int d = 0;
    for (const cJSON *c = shape->child; c; c = c->next, d++) {
        uint64_t v;
        if (json_uint(c, &v) != 0)
            return zy_fail(err, "%s: tensor '%.200s': shape[%d] is not a non-negative integer below 2^53",
                           f->label, name, d);
        e->shape[d] = (int64_t)v;
        if (v > SIZE_MAX || zy_mul_size(numel, (size_t)v, &numel) != 0)
            return zy_fail(err, "%s: tensor '%.200s': element count overflows", f->label, name);
    }
    e->ndim = ndim;
    e->numel = numel;
    size_t nbytes;
    if (zy_mul_size(numel, zy_dtype_size(e->dtype), &nbytes) != 0)
        return zy_fail(err, "%s: tensor '%.200s': byte size overflows", f->label, name);

    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2)
        return zy_fail(err, "%s: tensor '%.200s': data_offsets is not a [begin, end] array", f->label, name);
    uint64_t begin, end;
    if (json_uint(offs->child, &begin) != 0 || json_uint(offs->child->next, &end) != 0)
        return zy_fail(err, "%s: tensor '%.200s': data_offsets are not non-negative integers below 2^53",
                       f->label, name);
    if (begin > end)
        return zy_fail(err, "%s: tensor '%.200s': data_offsets begin %llu > end %llu", f->label, name,
                       (unsigned long long)begin, (unsigned long long)end);
    if (end > f->data_len)
        return zy_fail(err, "%s: tensor '%.200s': data_offsets end %llu is past the data area (%zu bytes)",
                       f->label, name, (unsigned long long)end, f->data_len);
    if (end - begin != nbytes)
        return zy_fail(err, "%s: tensor '%.200s': data_offsets span %llu bytes but shape and dtype %s need %zu",
                       f->label, name, (unsigned long long)(end - begin), zy_dtype_name(e->dtype), nbytes);
    e->offset = (size_t)begin;
    e->nbytes = nbytes;
    e->name = strdup(name);
    if (!e->name) return zy_fail(err, "%s: out of memory", f->label);
    return 0;
}

static int cmp_str_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Sorts a copy of the pointers and reports the first repeated string, or NULL. */
static const char *first_duplicate(const char **v, size_t n) {
    qsort(v, n, sizeof *v, cmp_str_ptr);
    for (size_t i = 1; i < n; i++)
        if (strcmp(v[i - 1], v[i]) == 0) return v[i];
    return NULL;
}

static int st_parse_metadata(StFile *f, const cJSON *meta, ZyErr *err) {
    if (f->metadata_json) return zy_fail(err, "%s: duplicate \"__metadata__\" entry", f->label);
    if (cJSON_IsNull(meta)) return 0; /* none: mlx.core.save_safetensors writes null (the reference reads an Option) */
    if (!cJSON_IsObject(meta)) return zy_fail(err, "%s: \"__metadata__\" is not a JSON object", f->label);
    size_t n = 0;
    for (const cJSON *c = meta->child; c; c = c->next, n++)
        if (!cJSON_IsString(c))
            return zy_fail(err, "%s: \"__metadata__\" value of '%.200s' is not a string", f->label, c->string);
    if (n > 1) {
        const char **keys = malloc(n * sizeof *keys);
        if (!keys) return zy_fail(err, "%s: out of memory", f->label);
        size_t i = 0;
        for (const cJSON *c = meta->child; c; c = c->next) keys[i++] = c->string;
        const char *dup = first_duplicate(keys, n);
        if (dup) zy_fail(err, "%s: \"__metadata__\" has duplicate key '%.200s'", f->label, dup);
        free(keys);
        if (dup) return -1;
    }
    f->metadata_json = cJSON_PrintUnformatted(meta);
    if (!f->metadata_json) return zy_fail(err, "%s: out of memory", f->label);
    return 0;
}

static int cmp_entry_name(const void *a, const void *b) {
    const StEntry *x = *(const StEntry *const *)a, *y = *(const StEntry *const *)b;
    return strcmp(x->name, y->name);
}

static int cmp_entry_offset(const void *a, const void *b) {
    const StEntry *x = *(const StEntry *const *)a, *y = *(const StEntry *const *)b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    return (x->nbytes > y->nbytes) - (x->nbytes < y->nbytes);
}

/* Duplicate names and overlapping byte ranges, both found by sorting pointers to the entries. */
static int st_check_entries(StFile *f, ZyErr *err) {
    int n = f->n_entries;
    if (n < 2) return 0;
    const StEntry **idx = malloc((size_t)n * sizeof *idx);
    if (!idx) return zy_fail(err, "%s: out of memory", f->label);
    int m = 0;
    for (int i = 0; i < n; i++) idx[i] = &f->entries[i];
    qsort(idx, (size_t)n, sizeof *idx, cmp_entry_name);
    for (int i = 1; i < n; i++) {
        if (strcmp(idx[i - 1]->name, idx[i]->name) == 0) {
            zy_fail(err, "%s: duplicate tensor name '%.200s'", f->label, idx[i]->name);
            free(idx);
            return -1;
        }
    }
    /* zero-size tensors occupy no bytes, so they cannot overlap anything */
    for (int i = 0; i < n; i++)
        if (f->entries[i].nbytes > 0) idx[m++] = &f->entries[i];
    qsort(idx, (size_t)m, sizeof *idx, cmp_entry_offset);
    for (int i = 1; i < m; i++) {
        const StEntry *a = idx[i - 1], *b = idx[i];
        if (b->offset < a->offset + a->nbytes) {
            zy_fail(err, "%s: tensors '%.200s' [%zu, %zu) and '%.200s' [%zu, %zu) overlap", f->label, a->name,
                    a->offset, a->offset + a->nbytes, b->name, b->offset, b->offset + b->nbytes);
            free(idx);
            return -1;
        }
    }
    free(idx);
    return 0;
}

/* cJSON keeps numbers only as doubles, so "1.0" or "1e0" would pass as integers, which the reference reader
 * rejects. Every number in a valid header is a shape or an offset, so no fraction or exponent may appear. */
static int st_check_number_literals(const StFile *f, const uint8_t *h, size_t n, ZyErr *err) {
    int in_str = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t c = h[i];
        if (in_str) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_str = 0;
            continue;
        }
        if (c == '"') {
            in_str = 1;
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            size_t j = i;
            int integral = 1;
            while (j < n && h[j] && strchr("0123456789+-.eE", h[j])) {
                if (h[j] == '.' || h[j] == 'e' || h[j] == 'E') integral = 0;
                j++;
            }
            if (!integral)
                return zy_fail(err, "%s: header number '%.*s' at offset %zu is not an integer literal", f->label,
                               (int)(j - i < 40 ? j - i : 40), (const char *)h + i, i);
            i = j - 1;
        }
    }
    return 0;
}

static int st_is_space(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* Validates the whole file image; f->label must already be set. On failure f holds no allocations. */
static int st_parse(StFile *f, const uint8_t *buf, size_t len, ZyErr *err) {
    if (len < 8) return zy_fail(err, "%s: file is %zu bytes, shorter than the 8-byte header length", f->label, len);
    uint64_t hlen;
    memcpy(&hlen, buf, 8);
    if (hlen == 0) return zy_fail(err, "%s: header length is 0", f->label);
    if (hlen > ST_MAX_HEADER)
        return zy_fail(err, "%s: header length %llu exceeds the 100 MiB limit", f->label, (unsigned long long)hlen);
    if (hlen > len - 8)
        return zy_fail(err, "%s: header length %llu runs past the end of the file (%zu bytes)", f->label,
                       (unsigned long long)hlen, len);
    const uint8_t *hdr = buf + 8;
    size_t n = (size_t)hlen;
    f->data = hdr + n;
    f->data_len = len - 8 - n;

    /* cJSON works on C strings, so a NUL would silently cut names short */
    const uint8_t *nul = memchr(hdr, 0, n);
    if (nul) return zy_fail(err, "%s: header contains a NUL byte at offset %zu", f->label, (size_t)(nul - hdr));
    size_t bad = utf8_invalid_at(hdr, n);
    if (bad != n) return zy_fail(err, "%s: header is not valid UTF-8 (offset %zu)", f->label, bad);

    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts((const char *)hdr, n, &end, 0);
    if (!root) {
        size_t at = end ? (size_t)((const uint8_t *)end - hdr) : 0;
        return zy_fail(err, "%s: header is not valid JSON (error near offset %zu)", f->label, at);
    }
    for (const uint8_t *p = (const uint8_t *)end; p < hdr + n; p++) {
        if (!st_is_space(*p)) {
            cJSON_Delete(root);
            return zy_fail(err, "%s: header has trailing data after the JSON object (offset %zu)", f->label,
                           (size_t)(p - hdr));
        }
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return zy_fail(err, "%s: header is not a JSON object", f->label);
    }

    int count = cJSON_GetArraySize(root);
    f->entries = calloc(count > 0 ? (size_t)count : 1, sizeof *f->entries);
    if (!f->entries) {
        cJSON_Delete(root);
        return zy_fail(err, "%s: out of memory", f->label);
    }
    int rc = 0;
    for (const cJSON *c = root->child; c && rc == 0; c = c->next) {
        if (strcmp(c->string, "__metadata__") == 0) {
            rc = st_parse_metadata(f, c, err);
        } else {
            rc = st_parse_entry(f, c, &f->entries[f->n_entries], err);
            if (rc == 0) f->n_entries++;
        }
    }
    cJSON_Delete(root);
    /* after the per-tensor checks, so most bad numbers get a message naming their tensor */
    if (rc == 0) rc = st_check_number_literals(f, hdr, n, err);
    if (rc == 0) rc = st_check_entries(f, err);
    if (rc != 0) st_free_parsed(f);
    return rc;
}

static void st_set_label(StFile *f, const char *label) {
    snprintf(f->label, sizeof f->label, "%s", label ? label : "<buffer>");
}

int st_open_buffer(StFile *f, const void *buf, size_t len, const char *label, ZyErr *err) {
    memset(f, 0, sizeof *f);
    st_set_label(f, label);
    if (!buf && len > 0) return zy_fail(err, "%s: NULL buffer", f->label);
    if (st_parse(f, buf, len, err) != 0) {
        f->data = NULL;
        f->data_len = 0;
        return -1;
    }
    return 0;
}

int st_open(StFile *f, const char *path, ZyErr *err) {
    memset(f, 0, sizeof *f);
    st_set_label(f, path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return zy_fail(err, "%s: cannot open: %s", f->label, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return zy_fail(err, "%s: cannot stat: %s", f->label, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return zy_fail(err, "%s: not a regular file", f->label);
    }
    size_t len = (size_t)sb.st_size;
    if (len < 8) {
        close(fd);
        return zy_fail(err, "%s: file is %zu bytes, shorter than the 8-byte header length", f->label, len);
    }
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    int map_errno = errno;
    close(fd); /* the mapping stays valid after close */
    if (map == MAP_FAILED) return zy_fail(err, "%s: mmap failed: %s", f->label, strerror(map_errno));
    if (st_parse(f, map, len, err) != 0) {
        munmap(map, len);
        f->data = NULL;
        f->data_len = 0;
        return -1;
    }
    f->map = map;
    f->map_len = len;
    return 0;
}

void st_close(StFile *f) {
    if (!f) return;
    st_free_parsed(f);
    if (f->map) munmap(f->map, f->map_len);
    f->map = NULL;
    f->map_len = 0;
    f->data = NULL;
    f->data_len = 0;
}

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* Linux 5.14; older headers lack the name */
#endif

int st_populate(const StFile *files, int n_files) {
    double total = 0;
    for (int i = 0; i < n_files; i++) total += (double)files[i].map_len;
    if (total <= 0 || total > 0.9 * zy_available_memory_bytes()) return 0; /* paging them in and out would thrash */
    for (int i = 0; i < n_files; i++)
        if (files[i].map && madvise(files[i].map, files[i].map_len, MADV_POPULATE_READ) != 0) return 0;
    return 1;
}

const StEntry *st_find(const StFile *f, const char *name) {
    if (!f || !name) return NULL;
    for (int i = 0; i < f->n_entries; i++)
        if (strcmp(f->entries[i].name, name) == 0) return &f->entries[i];
    return NULL;
}

/* Guards against an entry that does not belong to f (its range was validated against its own file). */
static int st_check_range(const StFile *f, const StEntry *e, ZyErr *err) {
    if (!f || !e) return zy_fail(err, "st_read: NULL file or entry");
    if (e->offset > f->data_len || e->nbytes > f->data_len - e->offset ||
        e->nbytes != e->numel * zy_dtype_size(e->dtype))
        return zy_fail(err, "%s: tensor '%.200s': entry does not match this file", f->label, e->name);
    return 0;
}

static int read_f32_values(const StFile *f, const StEntry *e, float *out, ZyErr *err) {
    const uint8_t *src = f->data + e->offset;
    size_t n = e->numel;
    switch (e->dtype) {
    case ZY_DT_F32:
        if (n) memcpy(out, src, n * 4);
        return 0;
    case ZY_DT_BF16:
    case ZY_DT_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            out[i] = e->dtype == ZY_DT_BF16 ? zy_bf16_to_f32(h) : zy_f16_to_f32(h);
        }
        return 0;
    case ZY_DT_F64:
        for (size_t i = 0; i < n; i++) {
            double v;
            memcpy(&v, src + 8 * i, 8);
            out[i] = (float)v;
        }
        return 0;
    default:
        return zy_fail(err, "%s: tensor '%.200s': dtype %s cannot be read as float32", f->label, e->name,
                       zy_dtype_name(e->dtype));
    }
}

int st_read_f32(const StFile *f, const StEntry *e, float *out, ZyErr *err) {
    if (st_check_range(f, e, err) != 0) return -1;
    int rc = read_f32_values(f, e, out, err);
    /* The mapped file pages just read leave this process's resident set (the page cache keeps them; reading again
     * faults them back in): loading a model then never holds the file and the weights resident at once. */
    if (f->map) zy_release_pages((void *)(f->data + e->offset), e->nbytes); /* not a caller's memory buffer */
    return rc;
}

int st_read_bf16(const StFile *f, const StEntry *e, uint16_t *out, ZyErr *err) {
    if (st_check_range(f, e, err) != 0) return -1;
    const uint8_t *src = f->data + e->offset;
    const size_t n = e->numel;
    if (e->dtype == ZY_DT_BF16) {
        if (n) memcpy(out, src, n * 2);
    } else {
        /* through float32 in small chunks (nearest even from the float32 value, as st_read_f32 + zy_f32_to_bf16) */
        enum { CHUNK = 4096 };
        float tmp[CHUNK];
        for (size_t i = 0; i < n; i += CHUNK) {
            const size_t k = n - i < CHUNK ? n - i : CHUNK;
            StEntry part = *e;
            part.offset = e->offset + i * zy_dtype_size(e->dtype);
            part.numel = k;
            if (read_f32_values(f, &part, tmp, err) != 0) return -1;
            for (size_t j = 0; j < k; j++) out[i + j] = zy_f32_to_bf16(tmp[j]);
        }
    }
    if (f->map) zy_release_pages((void *)(f->data + e->offset), e->nbytes);
    return 0;
}

int st_read_i32(const StFile *f, const StEntry *e, int32_t *out, ZyErr *err) {
    if (st_check_range(f, e, err) != 0) return -1;
    const uint8_t *src = f->data + e->offset;
    size_t n = e->numel;
    switch (e->dtype) {
    case ZY_DT_I32:
        if (n) memcpy(out, src, n * 4);
        return 0;
    case ZY_DT_I64:
        for (size_t i = 0; i < n; i++) {
            int64_t v;
            memcpy(&v, src + 8 * i, 8);
            if (v < INT32_MIN || v > INT32_MAX)
                return zy_fail(err, "%s: tensor '%.200s': value %lld at index %zu is outside the int32 range",
                               f->label, e->name, (long long)v, i);
            out[i] = (int32_t)v;
        }
        return 0;
    default:
        return zy_fail(err, "%s: tensor '%.200s': dtype %s cannot be read as int32", f->label, e->name,
                       zy_dtype_name(e->dtype));
    }
}

/* ---- writer ---- */

typedef struct {
    char *p;
    size_t len, cap;
    int oom;
} StBuf;

static void sb_put(StBuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_puts(StBuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_printf_u64(StBuf *b, uint64_t v) {
    char tmp[32];
    int k = snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)v);
    sb_put(b, tmp, (size_t)k);
}

static void sb_json_string(StBuf *b, const char *s) {
    sb_put(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') {
            char esc[2] = {'\\', (char)*p};
            sb_put(b, esc, 2);
        } else if (*p < 0x20) {
            char esc[8];
            snprintf(esc, sizeof esc, "\\u%04x", *p);
            sb_put(b, esc, 6);
        } else {
            sb_put(b, (const char *)p, 1);
        }
    }
    sb_put(b, "\"", 1);
}

static int st_validate_write(const char *path, const StWriteTensor *t, int n, const char *const *meta,
                             size_t *nbytes, ZyErr *err) {
    if (n < 0) return zy_fail(err, "%s: negative tensor count %d", path, n);
    if (n > 0 && !t) return zy_fail(err, "%s: NULL tensor list", path);
    uint64_t total = 0;
    for (int i = 0; i < n; i++) {
        const char *name = t[i].name;
        if (!name || !*name) return zy_fail(err, "%s: tensor %d has no name", path, i);
        if (utf8_invalid_at((const uint8_t *)name, strlen(name)) != strlen(name))
            return zy_fail(err, "%s: tensor %d name is not valid UTF-8", path, i);
        if (strcmp(name, "__metadata__") == 0)
            return zy_fail(err, "%s: tensor name '__metadata__' is reserved", path);
        int ok = t[i].src_dtype == t[i].out_dtype || (t[i].src_dtype == ZY_DT_F32 && t[i].out_dtype == ZY_DT_BF16);
        if (!ok)
            return zy_fail(err, "%s: tensor '%.200s': cannot write %s data as %s", path, name,
                           zy_dtype_name(t[i].src_dtype), zy_dtype_name(t[i].out_dtype));
        if (t[i].ndim < 0 || t[i].ndim > ZY_MAX_DIMS)
            return zy_fail(err, "%s: tensor '%.200s': ndim %d outside [0, %d]", path, name, t[i].ndim, ZY_MAX_DIMS);
        size_t numel = 1;
        for (int d = 0; d < t[i].ndim; d++) {
            int64_t s = t[i].shape[d];
            if (s < 0 || (double)s >= ST_MAX_JSON_INT)
                return zy_fail(err, "%s: tensor '%.200s': invalid shape[%d] = %lld", path, name, d, (long long)s);
            if ((uint64_t)s > SIZE_MAX || zy_mul_size(numel, (size_t)s, &numel) != 0)
                return zy_fail(err, "%s: tensor '%.200s': element count overflows", path, name);
        }
        if (zy_mul_size(numel, zy_dtype_size(t[i].out_dtype), &nbytes[i]) != 0 ||
            (double)(total + nbytes[i]) >= ST_MAX_JSON_INT || total + nbytes[i] < total)
            return zy_fail(err, "%s: tensor '%.200s': byte size overflows", path, name);
        total += nbytes[i];
        if (!t[i].data && !t[i].fill && !t[i].fill_bytes && numel > 0)
            return zy_fail(err, "%s: tensor '%.200s': NULL data", path, name);
        if (t[i].fill && t[i].src_dtype != ZY_DT_F32)
            return zy_fail(err, "%s: tensor '%.200s': a fill callback makes F32 values", path, name);
        if (t[i].fill_bytes && t[i].src_dtype != t[i].out_dtype)
            return zy_fail(err, "%s: tensor '%.200s': a byte fill callback writes the tensor as it is", path, name);
    }
    size_t n_meta = 0;
    if (meta) {
        for (; meta[2 * n_meta]; n_meta++) {
            const char *k = meta[2 * n_meta], *v = meta[2 * n_meta + 1];
            if (!v) return zy_fail(err, "%s: metadata key '%.200s' has no value", path, k);
            if (utf8_invalid_at((const uint8_t *)k, strlen(k)) != strlen(k) ||
                utf8_invalid_at((const uint8_t *)v, strlen(v)) != strlen(v))
                return zy_fail(err, "%s: metadata '%.200s' is not valid UTF-8", path, k);
        }
    }
    size_t m = (size_t)n > n_meta ? (size_t)n : n_meta;
    if (m < 2) return 0;
    const char **names = malloc(m * sizeof *names);
    if (!names) return zy_fail(err, "%s: out of memory", path);
    for (int i = 0; i < n; i++) names[i] = t[i].name;
    const char *dup = first_duplicate(names, (size_t)n);
    if (dup) {
        zy_fail(err, "%s: duplicate tensor name '%.200s'", path, dup);
        free(names);
        return -1;
    }
    for (size_t i = 0; i < n_meta; i++) names[i] = meta[2 * i];
    dup = first_duplicate(names, n_meta);
    if (dup) zy_fail(err, "%s: duplicate metadata key '%.200s'", path, dup);
    free(names);
    return dup ? -1 : 0;
}

/* Writes one tensor's bytes; F32 -> BF16 is converted through a small reusable buffer, and values a fill callback
 * makes are made chunk by chunk into another (fbuf, chunk_len floats). */
static int st_write_tensor(int fd, const StWriteTensor *t, size_t nbytes, uint16_t *chunk, float *fbuf,
                           size_t chunk_len, int *fill_failed) {
    if (nbytes == 0) return 0;
    if (t->fill_bytes) { /* fbuf's chunk_len floats as bytes */
        for (size_t i = 0; i < nbytes; i += chunk_len * sizeof(float)) {
            const size_t k = nbytes - i < chunk_len * sizeof(float) ? nbytes - i : chunk_len * sizeof(float);
            if (t->fill_bytes(t->fill_ctx, i, k, fbuf) != 0) {
                *fill_failed = 1;
                return -1;
            }
            if (zy_write_all(fd, fbuf, k) != 0) return -1;
        }
        return 0;
    }
    if (t->src_dtype == t->out_dtype && !t->fill) return zy_write_all(fd, t->data, nbytes);
    const size_t esize = zy_dtype_size(t->out_dtype), numel = nbytes / esize;
    for (size_t i = 0; i < numel; i += chunk_len) {
        size_t k = numel - i < chunk_len ? numel - i : chunk_len;
        const float *x = fbuf;
        if (t->fill) {
            if (t->fill(t->fill_ctx, i, k, fbuf) != 0) {
                *fill_failed = 1;
                return -1;
            }
        } else {
            memcpy(fbuf, (const uint8_t *)t->data + 4 * i, 4 * k);
        }
        if (t->out_dtype == ZY_DT_BF16) {
            for (size_t j = 0; j < k; j++) chunk[j] = zy_f32_to_bf16(x[j]);
            if (zy_write_all(fd, chunk, 2 * k) != 0) return -1;
        } else if (zy_write_all(fd, x, 4 * k) != 0) {
            return -1;
        }
    }
    return 0;
}

/* A tensor's bytes in the file (its sizes were validated by st_header). */
static size_t st_tensor_nbytes(const StWriteTensor *t) {
    size_t n = zy_dtype_size(t->out_dtype);
    for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
    return n;
}

/* Makes the rename durable; failure here is not fatal because the data itself is already synced. */
static void fsync_parent_dir(const char *path) {
    const char *slash = strrchr(path, '/');
    char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
    if (!dir) return;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
    free(dir);
}

int st_header(const char *label, const StWriteTensor *tensors, int n_tensors, const char *const *metadata,
              uint8_t **out, size_t *out_len, uint64_t *offsets, ZyErr *err) {
    *out = NULL;
    *out_len = 0;
    size_t *nbytes = calloc(n_tensors > 0 ? (size_t)n_tensors : 1, sizeof *nbytes);
    if (!nbytes) return zy_fail(err, "%s: out of memory", label);
    if (st_validate_write(label, tensors, n_tensors, metadata, nbytes, err) != 0) {
        free(nbytes);
        return -1;
    }
    StBuf h = {0};
    sb_put(&h, "\0\0\0\0\0\0\0\0", 8); /* the length, filled in below */
    sb_puts(&h, "{");
    uint64_t off = 0;
    for (int i = 0; i < n_tensors; i++) {
        const StWriteTensor *t = &tensors[i];
        if (i) sb_puts(&h, ",");
        sb_json_string(&h, t->name);
        sb_puts(&h, ":{\"dtype\":\"");
        sb_puts(&h, zy_dtype_name(t->out_dtype));
        sb_puts(&h, "\",\"shape\":[");
        for (int d = 0; d < t->ndim; d++) {
            if (d) sb_puts(&h, ",");
            sb_printf_u64(&h, (uint64_t)t->shape[d]);
        }
        sb_puts(&h, "],\"data_offsets\":[");
        sb_printf_u64(&h, off);
        sb_puts(&h, ",");
        if (offsets) offsets[i] = off;
        off += nbytes[i];
        sb_printf_u64(&h, off);
        sb_puts(&h, "]}");
    }
    if (metadata) {
        if (n_tensors) sb_puts(&h, ",");
        sb_puts(&h, "\"__metadata__\":{");
        for (size_t i = 0; metadata[2 * i]; i++) {
            if (i) sb_puts(&h, ",");
            sb_json_string(&h, metadata[2 * i]);
            sb_puts(&h, ":");
            sb_json_string(&h, metadata[2 * i + 1]);
        }
        sb_puts(&h, "}");
    }
    sb_puts(&h, "}");
    /* pad with spaces so the data area starts 8-byte aligned, as the reference writer does */
    while (h.len % 8) sb_puts(&h, " ");
    free(nbytes);
    if (h.oom) {
        free(h.p);
        return zy_fail(err, "%s: out of memory building header", label);
    }
    const uint64_t json_len = h.len - 8;
    for (int i = 0; i < 8; i++) h.p[i] = (char)(json_len >> (8 * i)); /* little-endian */
    if (offsets)
        for (int i = 0; i < n_tensors; i++) offsets[i] += h.len;
    *out = (uint8_t *)h.p;
    *out_len = h.len;
    return 0;
}

int st_write(const char *path, const StWriteTensor *tensors, int n_tensors, const char *const *metadata,
             ZyErr *err) {
    if (!path) return zy_fail(err, "st_write: NULL path");
    uint8_t *header;
    size_t header_len;
    if (st_header(path, tensors, n_tensors, metadata, &header, &header_len, NULL, err) != 0) return -1;
    size_t tmp_len = strlen(path) + 32;
    char *tmp = malloc(tmp_len);
    enum { CHUNK = 1 << 16 };
    uint16_t *chunk = malloc(CHUNK * sizeof *chunk);
    float *fbuf = malloc(CHUNK * sizeof *fbuf);
    int fd = -1, rc = -1, created = 0;
    if (!tmp || !chunk || !fbuf) {
        zy_fail(err, "%s: out of memory", path);
        goto done;
    }
    snprintf(tmp, tmp_len, "%s.tmp.%ld", path, (long)getpid());
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        zy_fail(err, "%s: cannot create: %s", tmp, strerror(errno));
        goto done;
    }
    created = 1;
    if (zy_write_all(fd, header, header_len) != 0) {
        zy_fail(err, "%s: write failed: %s", tmp, strerror(errno));
        goto done;
    }
    for (int i = 0; i < n_tensors; i++) {
        int fill_failed = 0;
        if (st_write_tensor(fd, &tensors[i], st_tensor_nbytes(&tensors[i]), chunk, fbuf, CHUNK, &fill_failed) != 0) {
            if (fill_failed)
                zy_fail(err, "%s: tensor '%.200s': its values could not be made", tmp, tensors[i].name);
            else
                zy_fail(err, "%s: write of tensor '%.200s' failed: %s", tmp, tensors[i].name, strerror(errno));
            goto done;
        }
    }
    if (fsync(fd) != 0) {
        zy_fail(err, "%s: fsync failed: %s", tmp, strerror(errno));
        goto done;
    }
    int cr = close(fd);
    fd = -1;
    if (cr != 0) {
        zy_fail(err, "%s: close failed: %s", tmp, strerror(errno));
        goto done;
    }
    if (rename(tmp, path) != 0) {
        zy_fail(err, "%s: rename failed: %s", path, strerror(errno));
        goto done;
    }
    fsync_parent_dir(path);
    rc = 0;
done:
    if (fd >= 0) close(fd);
    if (rc != 0 && created) unlink(tmp);
    free(tmp);
    free(chunk);
    free(fbuf);
    free(header);
    return rc;
}

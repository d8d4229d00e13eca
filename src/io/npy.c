#define _POSIX_C_SOURCE 200809L
#include "io/npy.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* '=' (native) descrs and the raw data copy are only little-endian on a little-endian host. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "npy.c assumes a little-endian host"
#endif

static const struct {
    const char *kind; /* descr without the byte-order character */
    ZyDtype dt;
} npy_kinds[] = {
    {"f4", ZY_DT_F32}, {"f8", ZY_DT_F64}, {"i4", ZY_DT_I32}, {"i8", ZY_DT_I64}, {"i2", ZY_DT_I16}, {"i1", ZY_DT_I8},
    {"u1", ZY_DT_U8},  {"u2", ZY_DT_U16}, {"u4", ZY_DT_U32}, {"u8", ZY_DT_U64}, {"b1", ZY_DT_BOOL},
};

/* numpy's spelling of a dtype, for error messages. */
static const char *npy_descr_name(ZyDtype dt) {
    switch (dt) {
    case ZY_DT_F32: return "<f4";
    case ZY_DT_F64: return "<f8";
    case ZY_DT_I32: return "<i4";
    case ZY_DT_I64: return "<i8";
    case ZY_DT_I16: return "<i2";
    case ZY_DT_I8: return "|i1";
    case ZY_DT_U8: return "|u1";
    case ZY_DT_U16: return "<u2";
    case ZY_DT_U32: return "<u4";
    case ZY_DT_U64: return "<u8";
    case ZY_DT_BOOL: return "|b1";
    default: return zy_dtype_name(dt);
    }
}

static int npy_descr_parse(const char *s, const char *label, ZyDtype *out, ZyErr *err) {
    if (strchr(s, 'O')) return zy_fail(err, "%s: object dtype '%s' is not supported", label, s);
    if (s[0] == '<' || s[0] == '>' || s[0] == '=' || s[0] == '|') {
        for (size_t i = 0; i < ZY_ARRAY_LEN(npy_kinds); i++) {
            if (strcmp(s + 1, npy_kinds[i].kind) != 0) continue;
            ZyDtype dt = npy_kinds[i].dt;
            if (zy_dtype_size(dt) == 1) { /* byte order is irrelevant for single bytes */
                *out = dt;
                return 0;
            }
            if (s[0] == '>') return zy_fail(err, "%s: big-endian descr '%s' is not supported", label, s);
            if (s[0] == '|') break;
            *out = dt;
            return 0;
        }
    }
    return zy_fail(err, "%s: unsupported descr '%s'", label, s);
}

/* ---- header dict parser: {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } ---- */

typedef struct {
    const char *p, *end;
    const char *label;
    ZyErr *err;
} Cur;

static void cur_ws(Cur *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r')) c->p++;
}

/* Skips whitespace and consumes ch if it is next. */
static int cur_eat(Cur *c, char ch) {
    cur_ws(c);
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return 1;
    }
    return 0;
}

static int cur_fail(Cur *c, const char *what) {
    cur_ws(c);
    if (c->p >= c->end) return zy_fail(c->err, "%s: malformed header: %s (got end of header)", c->label, what);
    unsigned char ch = (unsigned char)*c->p;
    if (ch >= 0x20 && ch < 0x7f)
        return zy_fail(c->err, "%s: malformed header: %s (got '%c')", c->label, what, ch);
    return zy_fail(c->err, "%s: malformed header: %s (got byte 0x%02x)", c->label, what, ch);
}

/* A Python string literal in single or double quotes, without escapes (numpy never writes any here). */
static int cur_string(Cur *c, char *out, size_t cap, const char *what) {
    cur_ws(c);
    if (c->p >= c->end || (*c->p != '\'' && *c->p != '"')) return cur_fail(c, what);
    char q = *c->p++;
    size_t n = 0;
    while (c->p < c->end && *c->p != q) {
        char ch = *c->p;
        if (ch == '\\') return zy_fail(c->err, "%s: malformed header: escape sequences are not supported", c->label);
        if (ch == '\n' || ch == '\0')
            return zy_fail(c->err, "%s: malformed header: unterminated string", c->label);
        if (n + 1 >= cap) return zy_fail(c->err, "%s: malformed header: string too long", c->label);
        out[n++] = ch;
        c->p++;
    }
    if (c->p >= c->end) return zy_fail(c->err, "%s: malformed header: unterminated string", c->label);
    c->p++;
    out[n] = '\0';
    return 0;
}

static int cur_is_ident(char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_';
}

static int cur_bool(Cur *c, int *out) {
    cur_ws(c);
    const char *s = c->p;
    size_t n = 0;
    while (s + n < c->end && cur_is_ident(s[n])) n++;
    if (n == 4 && memcmp(s, "True", 4) == 0)
        *out = 1;
    else if (n == 5 && memcmp(s, "False", 5) == 0)
        *out = 0;
    else
        return cur_fail(c, "fortran_order must be True or False");
    c->p += n;
    return 0;
}

/* (d0, d1, ...) with an optional trailing comma; () is a scalar. Python 2 'L' suffixes are accepted. */
static int cur_shape(Cur *c, int *ndim, int64_t *shape) {
    if (!cur_eat(c, '(')) return cur_fail(c, "shape must be a tuple");
    int n = 0;
    cur_ws(c);
    while (!cur_eat(c, ')')) {
        cur_ws(c);
        if (c->p < c->end && *c->p == '-')
            return zy_fail(c->err, "%s: malformed header: negative dimension in shape", c->label);
        if (c->p >= c->end || *c->p < '0' || *c->p > '9') return cur_fail(c, "expected an integer in shape");
        int64_t v = 0;
        while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
            int dig = *c->p++ - '0';
            if (v > (INT64_MAX - dig) / 10)
                return zy_fail(c->err, "%s: malformed header: dimension too large in shape", c->label);
            v = v * 10 + dig;
        }
        if (c->p < c->end && (*c->p == 'L' || *c->p == 'l')) c->p++;
        if (n >= ZY_MAX_DIMS)
            return zy_fail(c->err, "%s: shape has more than %d dimensions", c->label, ZY_MAX_DIMS);
        shape[n++] = v;
        if (cur_eat(c, ',')) continue;
        if (cur_eat(c, ')')) break;
        return cur_fail(c, "expected ',' or ')' in shape");
    }
    *ndim = n;
    return 0;
}

static int npy_parse_header(Cur *c, char *descr, size_t descr_cap, int *fortran, int *ndim, int64_t *shape) {
    int seen_descr = 0, seen_fortran = 0, seen_shape = 0;
    if (!cur_eat(c, '{')) return cur_fail(c, "expected '{'");
    while (!cur_eat(c, '}')) {
        char key[32];
        if (cur_string(c, key, sizeof key, "expected a quoted key") != 0) return -1;
        if (!cur_eat(c, ':')) return cur_fail(c, "expected ':' after key");
        int *seen;
        if (strcmp(key, "descr") == 0) {
            seen = &seen_descr;
            cur_ws(c);
            if (c->p < c->end && (*c->p == '[' || *c->p == '{'))
                return zy_fail(c->err, "%s: structured dtypes are not supported", c->label);
            if (cur_string(c, descr, descr_cap, "descr must be a string") != 0) return -1;
        } else if (strcmp(key, "fortran_order") == 0) {
            seen = &seen_fortran;
            if (cur_bool(c, fortran) != 0) return -1;
        } else if (strcmp(key, "shape") == 0) {
            seen = &seen_shape;
            if (cur_shape(c, ndim, shape) != 0) return -1;
        } else {
            return zy_fail(c->err, "%s: malformed header: unexpected key '%s'", c->label, key);
        }
        if (*seen) return zy_fail(c->err, "%s: malformed header: duplicate key '%s'", c->label, key);
        *seen = 1;
        if (cur_eat(c, ',')) continue;
        if (cur_eat(c, '}')) break;
        return cur_fail(c, "expected ',' or '}'");
    }
    cur_ws(c);
    if (c->p != c->end) return cur_fail(c, "unexpected text after the dict");
    if (!seen_descr) return zy_fail(c->err, "%s: malformed header: missing key 'descr'", c->label);
    if (!seen_fortran) return zy_fail(c->err, "%s: malformed header: missing key 'fortran_order'", c->label);
    if (!seen_shape) return zy_fail(c->err, "%s: malformed header: missing key 'shape'", c->label);
    return 0;
}

int npy_parse(const void *buf, size_t len, const char *label, NpyArray *out, ZyErr *err) {
    memset(out, 0, sizeof *out);
    if (!label) label = "<buffer>";
    const uint8_t *b = buf;
    if (!b && len > 0) return zy_fail(err, "%s: NULL buffer", label);
    if (len < 10) return zy_fail(err, "%s: file is %zu bytes, too short for a .npy preamble", label, len);
    if (memcmp(b, "\x93NUMPY", 6) != 0) return zy_fail(err, "%s: not a .npy file (bad magic)", label);
    int major = b[6], minor = b[7];
    if ((major != 1 && major != 2 && major != 3) || minor != 0)
        return zy_fail(err, "%s: unsupported .npy version %d.%d", label, major, minor);
    size_t hlen, hstart;
    if (major == 1) {
        hlen = (size_t)b[8] | (size_t)b[9] << 8;
        hstart = 10;
    } else {
        if (len < 12) return zy_fail(err, "%s: file is %zu bytes, too short for a .npy preamble", label, len);
        hlen = (size_t)b[8] | (size_t)b[9] << 8 | (size_t)b[10] << 16 | (size_t)b[11] << 24;
        hstart = 12;
    }
    if (hlen > len - hstart)
        return zy_fail(err, "%s: header length %zu runs past the end of the file (%zu bytes)", label, hlen, len);

    char descr[32];
    int fortran = 0, ndim = 0;
    int64_t shape[ZY_MAX_DIMS];
    Cur c = {(const char *)b + hstart, (const char *)b + hstart + hlen, label, err};
    if (npy_parse_header(&c, descr, sizeof descr, &fortran, &ndim, shape) != 0) return -1;
    ZyDtype dt = ZY_DT_F32;
    if (npy_descr_parse(descr, label, &dt, err) != 0) return -1;
    if (fortran) return zy_fail(err, "%s: fortran_order True is not supported (C order only)", label);
    size_t numel = 1, nbytes;
    for (int d = 0; d < ndim; d++) {
        if ((uint64_t)shape[d] > SIZE_MAX || zy_mul_size(numel, (size_t)shape[d], &numel) != 0)
            return zy_fail(err, "%s: element count of the shape overflows", label);
    }
    if (zy_mul_size(numel, zy_dtype_size(dt), &nbytes) != 0)
        return zy_fail(err, "%s: byte size of the shape overflows", label);
    size_t have = len - hstart - hlen;
    if (have < nbytes)
        return zy_fail(err, "%s: data is truncated: %zu bytes, shape and dtype %s need %zu", label, have, descr,
                       nbytes);
    if (have > nbytes)
        return zy_fail(err, "%s: %zu trailing bytes after the data (shape and dtype %s need %zu)", label,
                       have - nbytes, descr, nbytes);
    void *data = zy_calloc(nbytes);
    if (!data) return zy_fail(err, "%s: out of memory (%zu bytes)", label, nbytes);
    if (nbytes) memcpy(data, b + hstart + hlen, nbytes);
    out->dtype = dt;
    out->ndim = ndim;
    memcpy(out->shape, shape, (size_t)ndim * sizeof *shape);
    out->numel = numel;
    out->data = data;
    return 0;
}

int npy_read(const char *path, NpyArray *out, ZyErr *err) {
    memset(out, 0, sizeof *out);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return zy_fail(err, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return zy_fail(err, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return zy_fail(err, "%s: not a regular file", path);
    }
    size_t len = (size_t)sb.st_size;
    if (len == 0) {
        close(fd);
        return npy_parse("", 0, path, out, err);
    }
    /* mmap rather than read, so a large token file is not held twice while it is copied out */
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED) return zy_fail(err, "%s: mmap failed: %s", path, strerror(e));
    int rc = npy_parse(map, len, path, out, err);
    munmap(map, len);
    return rc;
}

void npy_free(NpyArray *a) {
    if (!a) return;
    zy_free(a->data);
    memset(a, 0, sizeof *a);
}

int npy_read_tokens(const char *path, int32_t **tokens, int *ndim, int64_t shape[ZY_MAX_DIMS], ZyErr *err) {
    *tokens = NULL;
    NpyArray a;
    if (npy_read(path, &a, err) != 0) return -1;
    if (a.dtype != ZY_DT_I32 && a.dtype != ZY_DT_I64) {
        zy_fail(err, "%s: token ids must be int32 or int64, got dtype %s", path, npy_descr_name(a.dtype));
        npy_free(&a);
        return -1;
    }
    if (a.ndim < 1) {
        npy_free(&a);
        return zy_fail(err, "%s: token ids must have at least 1 dimension, got a scalar", path);
    }
    if (a.dtype == ZY_DT_I64) {
        /* narrow in place: element i is written at byte 4i, never past the 8i it was read from */
        uint8_t *p = a.data;
        for (size_t i = 0; i < a.numel; i++) {
            int64_t v;
            memcpy(&v, p + 8 * i, 8);
            if (v < INT32_MIN || v > INT32_MAX) {
                zy_fail(err, "%s: token id %lld at index %zu is outside the int32 range", path, (long long)v, i);
                npy_free(&a);
                return -1;
            }
            int32_t w = (int32_t)v;
            memcpy(p + 4 * i, &w, 4);
        }
    }
    *tokens = a.data;
    *ndim = a.ndim;
    memcpy(shape, a.shape, sizeof a.shape);
    return 0;
}

int npy_write(const char *path, ZyDtype dtype, const void *data, int ndim, const int64_t *shape, ZyErr *err) {
    if (!path) return zy_fail(err, "npy_write: NULL path");
    if (dtype != ZY_DT_F32 && dtype != ZY_DT_I32)
        return zy_fail(err, "%s: npy_write supports F32 and I32, not %s", path, zy_dtype_name(dtype));
    if (ndim < 0 || ndim > ZY_MAX_DIMS) return zy_fail(err, "%s: ndim %d outside [0, %d]", path, ndim, ZY_MAX_DIMS);
    if (ndim > 0 && !shape) return zy_fail(err, "%s: NULL shape", path);

    /* Python's repr of the header dict, as numpy.save writes it */
    char hdr[512];
    int n = snprintf(hdr, sizeof hdr, "{'descr': '%s', 'fortran_order': False, 'shape': (",
                     dtype == ZY_DT_F32 ? "<f4" : "<i4");
    size_t numel = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0) return zy_fail(err, "%s: negative shape[%d] = %lld", path, d, (long long)shape[d]);
        if ((uint64_t)shape[d] > SIZE_MAX || zy_mul_size(numel, (size_t)shape[d], &numel) != 0)
            return zy_fail(err, "%s: element count overflows", path);
        n += snprintf(hdr + n, sizeof hdr - (size_t)n, d ? ", %lld" : "%lld", (long long)shape[d]);
    }
    n += snprintf(hdr + n, sizeof hdr - (size_t)n, "%s), }", ndim == 1 ? "," : "");
    size_t nbytes;
    if (zy_mul_size(numel, 4, &nbytes) != 0) return zy_fail(err, "%s: byte size overflows", path);
    if (!data && nbytes > 0) return zy_fail(err, "%s: NULL data", path);
    /* pad with spaces and a final newline so magic + header is a multiple of 64 bytes */
    size_t total = (10 + (size_t)n + 1 + 63) / 64 * 64;
    size_t hlen = total - 10;
    memset(hdr + n, ' ', hlen - 1 - (size_t)n);
    hdr[hlen - 1] = '\n';
    uint8_t pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (uint8_t)(hlen & 0xff), (uint8_t)(hlen >> 8)};

    size_t tmp_len = strlen(path) + 32;
    char *tmp = malloc(tmp_len);
    if (!tmp) return zy_fail(err, "%s: out of memory", path);
    snprintf(tmp, tmp_len, "%s.tmp.%ld", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        zy_fail(err, "%s: cannot create: %s", tmp, strerror(errno));
        free(tmp);
        return -1;
    }
    int rc = 0;
    if (zy_write_all(fd, pre, sizeof pre) != 0 || zy_write_all(fd, hdr, hlen) != 0 ||
        (nbytes && zy_write_all(fd, data, nbytes) != 0))
        rc = zy_fail(err, "%s: write failed: %s", tmp, strerror(errno));
    else if (fsync(fd) != 0)
        rc = zy_fail(err, "%s: fsync failed: %s", tmp, strerror(errno));
    if (close(fd) != 0 && rc == 0) rc = zy_fail(err, "%s: close failed: %s", tmp, strerror(errno));
    if (rc == 0 && rename(tmp, path) != 0) rc = zy_fail(err, "%s: rename failed: %s", path, strerror(errno));
    if (rc != 0) unlink(tmp);
    free(tmp);
    return rc;
}

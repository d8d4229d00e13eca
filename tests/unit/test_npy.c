/* .npy reader/writer: round trips, header dict variants, every rejection class, bytes written by numpy,
 * token reading, and a deterministic mutation fuzz loop. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/npy.h"
#include "test.h"

/* Builds a .npy image: magic, version major.0, header length (u16 for v1, u32 otherwise), the header text
 * as given, then the data bytes. */
static uint8_t *mk_npy(int major, const char *hdr, const void *data, size_t data_len, size_t *len) {
    size_t hl = strlen(hdr), pre = major == 1 ? 10 : 12;
    *len = pre + hl + data_len;
    uint8_t *b = malloc(*len);
    memcpy(b, "\x93NUMPY", 6);
    b[6] = (uint8_t)major;
    b[7] = 0;
    for (size_t i = 0; i < pre - 8; i++) b[8 + i] = (uint8_t)(hl >> (8 * i));
    memcpy(b + pre, hdr, hl);
    if (data_len) memcpy(b + pre + hl, data, data_len);
    return b;
}

static int parse_hdr(int major, const char *hdr, const void *data, size_t data_len, NpyArray *a, ZyErr *err) {
    size_t len;
    uint8_t *b = mk_npy(major, hdr, data, data_len, &len);
    err->msg[0] = '\0';
    int rc = npy_parse(b, len, "hand.npy", a, err);
    free(b);
    return rc;
}

TEST(npy_roundtrip_write_read) {
    char dir[64], path[128];
    REQUIRE(zy_test_tmpdir(dir, sizeof dir, "npy") == 0);
    snprintf(path, sizeof path, "%s/a.npy", dir);
    float f[6] = {0.5f, -1.0f, 3.25f, 1e-20f, -0.0f, 7.0f};
    int64_t shape2[2] = {2, 3};
    ZyErr err;
    REQUIRE(npy_write(path, ZY_DT_F32, f, 2, shape2, &err) == 0);
    char *raw;
    size_t rlen;
    REQUIRE(zy_read_file(path, &raw, &rlen, &err) == 0);
    CHECK(rlen == 64 * 2 + 24 || rlen == 64 + 24);
    CHECK((rlen - 24) % 64 == 0);             /* header block is a multiple of 64 bytes */
    CHECK(memcmp(raw, "\x93NUMPY\x01\x00", 8) == 0);
    CHECK(raw[rlen - 25] == '\n');
    CHECK(strstr(raw + 10, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }") == raw + 10);
    free(raw);
    NpyArray a;
    REQUIRE(npy_read(path, &a, &err) == 0);
    CHECK(a.dtype == ZY_DT_F32 && a.ndim == 2 && a.shape[0] == 2 && a.shape[1] == 3 && a.numel == 6);
    CHECK(memcmp(a.data, f, sizeof f) == 0);
    npy_free(&a);
    CHECK(a.data == NULL);

    int32_t v[5] = {INT32_MIN, -1, 0, 1, INT32_MAX};
    int64_t shape1[1] = {5};
    REQUIRE(npy_write(path, ZY_DT_I32, v, 1, shape1, &err) == 0);
    REQUIRE(zy_read_file(path, &raw, &rlen, &err) == 0);
    CHECK(strstr(raw + 10, "'shape': (5,), }") != NULL); /* Python's 1-tuple spelling */
    free(raw);
    REQUIRE(npy_read(path, &a, &err) == 0);
    CHECK(a.dtype == ZY_DT_I32 && a.ndim == 1 && a.numel == 5 && memcmp(a.data, v, sizeof v) == 0);
    npy_free(&a);

    /* scalar and zero-size arrays */
    float s = 2.5f;
    REQUIRE(npy_write(path, ZY_DT_F32, &s, 0, NULL, &err) == 0);
    REQUIRE(zy_read_file(path, &raw, &rlen, &err) == 0);
    CHECK(strstr(raw + 10, "'shape': (), }") != NULL);
    free(raw);
    REQUIRE(npy_read(path, &a, &err) == 0);
    CHECK(a.ndim == 0 && a.numel == 1 && ((float *)a.data)[0] == 2.5f);
    npy_free(&a);
    int64_t shape0[2] = {0, 3};
    REQUIRE(npy_write(path, ZY_DT_I32, NULL, 2, shape0, &err) == 0);
    REQUIRE(npy_read(path, &a, &err) == 0);
    CHECK(a.ndim == 2 && a.numel == 0 && a.shape[0] == 0 && a.shape[1] == 3 && a.data != NULL);
    npy_free(&a);
    zy_test_rmtree(dir);
}

TEST(npy_write_rejects_bad_input) {
    char dir[64], path[128];
    REQUIRE(zy_test_tmpdir(dir, sizeof dir, "npy") == 0);
    snprintf(path, sizeof path, "%s/w.npy", dir);
    float f[2] = {1, 2};
    int64_t sh[1] = {2}, neg[1] = {-2};
    ZyErr err;
    CHECK(npy_write(path, ZY_DT_F64, f, 1, sh, &err) == -1);
    CHECK(strstr(err.msg, path) && strstr(err.msg, "F32 and I32, not F64"));
    CHECK(npy_write(path, ZY_DT_F32, NULL, 1, sh, &err) == -1);
    CHECK(strstr(err.msg, "NULL data") != NULL);
    CHECK(npy_write(path, ZY_DT_F32, f, 1, neg, &err) == -1);
    CHECK(strstr(err.msg, "negative shape[0] = -2") != NULL);
    CHECK(npy_write(path, ZY_DT_F32, f, 9, sh, &err) == -1);
    CHECK(strstr(err.msg, "ndim 9") != NULL);
    char bad[160];
    snprintf(bad, sizeof bad, "%s/missing/dir/x.npy", dir);
    CHECK(npy_write(bad, ZY_DT_F32, f, 1, sh, &err) == -1);
    CHECK(strstr(err.msg, "cannot create") != NULL);
    NpyArray a;
    CHECK(npy_read(path, &a, &err) == -1); /* nothing was written */
    CHECK(strstr(err.msg, path) && strstr(err.msg, "cannot open"));
    zy_test_rmtree(dir);
}

/* Exact bytes numpy 2.x writes for np.save(np.arange(6, dtype=np.float32).reshape(2, 3) * 0.5) and
 * np.save(np.array([3, -1, 2**31 - 1], dtype=np.int64)). */
TEST(npy_reads_numpy_bytes) {
    char hdr[200];
    snprintf(hdr, sizeof hdr, "%-117s\n", "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }");
    CHECK(strlen(hdr) == 118);
    float f[6] = {0, 0.5f, 1, 1.5f, 2, 2.5f};
    NpyArray a;
    ZyErr err;
    REQUIRE(parse_hdr(1, hdr, f, sizeof f, &a, &err) == 0);
    CHECK(a.dtype == ZY_DT_F32 && a.ndim == 2 && a.shape[0] == 2 && a.shape[1] == 3);
    CHECK(memcmp(a.data, f, sizeof f) == 0);
    npy_free(&a);
    snprintf(hdr, sizeof hdr, "%-117s\n", "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }");
    int64_t q[3] = {3, -1, 2147483647};
    REQUIRE(parse_hdr(1, hdr, q, sizeof q, &a, &err) == 0);
    CHECK(a.dtype == ZY_DT_I64 && a.ndim == 1 && a.shape[0] == 3 && memcmp(a.data, q, sizeof q) == 0);
    npy_free(&a);
}

TEST(npy_header_variants) {
    struct {
        int major;
        const char *hdr;
        ZyDtype dt;
        int ndim;
        int64_t d0;
    } ok[] = {
        {1, "{'shape': (4,), 'fortran_order': False, 'descr': '<i4'}", ZY_DT_I32, 1, 4},
        {1, "{\"descr\": \"<i4\", \"fortran_order\": False, \"shape\": (4,)}\n", ZY_DT_I32, 1, 4},
        {1, "{'descr':'<i4','fortran_order':False,'shape':(4)}", ZY_DT_I32, 1, 4},
        {1, "  {\n 'descr' : '=i4' ,\n 'fortran_order' : False ,\n 'shape' : ( 2 , 2 , ) ,\n }  \n", ZY_DT_I32, 2, 2},
        {1, "{'descr': '<i4', 'fortran_order': False, 'shape': (4L,), }", ZY_DT_I32, 1, 4},
        {2, "{'descr': '<u2', 'fortran_order': False, 'shape': (8,), }", ZY_DT_U16, 1, 8},
        {3, "{'descr': '|u1', 'fortran_order': False, 'shape': (2, 8), }", ZY_DT_U8, 2, 2},
        {1, "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }", ZY_DT_F64, 1, 2},
        {1, "{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }", ZY_DT_I64, 1, 2},
        {1, "{'descr': '<i2', 'fortran_order': False, 'shape': (8,), }", ZY_DT_I16, 1, 8},
        {1, "{'descr': '|i1', 'fortran_order': False, 'shape': (16,), }", ZY_DT_I8, 1, 16},
        {1, "{'descr': '<u4', 'fortran_order': False, 'shape': (4,), }", ZY_DT_U32, 1, 4},
        {1, "{'descr': '<u8', 'fortran_order': False, 'shape': (2,), }", ZY_DT_U64, 1, 2},
        {1, "{'descr': '|b1', 'fortran_order': False, 'shape': (4, 4), }", ZY_DT_BOOL, 2, 4},
        {1, "{'descr': '=f4', 'fortran_order': False, 'shape': (4,), }", ZY_DT_F32, 1, 4},
        {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (), }", ZY_DT_F32, 0, 0},
    };
    uint8_t data[16];
    for (int i = 0; i < 16; i++) data[i] = (uint8_t)(i * 13);
    for (size_t i = 0; i < ZY_ARRAY_LEN(ok); i++) {
        NpyArray a;
        ZyErr err;
        size_t n = ok[i].ndim == 0 ? 4 : 16;
        int rc = parse_hdr(ok[i].major, ok[i].hdr, data, n, &a, &err);
        CHECK_MSG(rc == 0, "case %zu (%s): %s", i, ok[i].hdr, err.msg);
        if (rc != 0) continue;
        CHECK_MSG(a.dtype == ok[i].dt && a.ndim == ok[i].ndim, "case %zu: dtype %d ndim %d", i, a.dtype, a.ndim);
        CHECK(ok[i].ndim == 0 || a.shape[0] == ok[i].d0);
        CHECK(a.numel * zy_dtype_size(a.dtype) == n && memcmp(a.data, data, n) == 0);
        npy_free(&a);
    }
}

typedef struct {
    const char *hdr;
    size_t data_len;
    const char *expect;
} BadNpy;

#define NPY_HDR(descr, fortran, shape) "{'descr': '" descr "', 'fortran_order': " fortran ", 'shape': " shape ", }"

static const BadNpy bad_npy[] = {
    {NPY_HDR(">f4", "False", "(2,)"), 8, "big-endian descr '>f4' is not supported"},
    {NPY_HDR(">i8", "False", "(2,)"), 16, "big-endian descr '>i8'"},
    {NPY_HDR("<f4", "True", "(2, 2)"), 16, "fortran_order True is not supported"},
    {NPY_HDR("|O", "False", "(2,)"), 16, "object dtype '|O' is not supported"},
    {NPY_HDR("<c8", "False", "(2,)"), 16, "unsupported descr '<c8'"},
    {NPY_HDR("<U10", "False", "(2,)"), 80, "unsupported descr '<U10'"},
    {NPY_HDR("<f2", "False", "(2,)"), 4, "unsupported descr '<f2'"},
    {NPY_HDR("|i4", "False", "(2,)"), 8, "unsupported descr '|i4'"},
    {NPY_HDR("<M8[ns]", "False", "(2,)"), 16, "unsupported descr"},
    {"{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }", 8, "structured dtypes are not supported"},
    {NPY_HDR("<f4", "False", "(2, 3)"), 20, "data is truncated: 20 bytes, shape and dtype <f4 need 24"},
    {NPY_HDR("<f4", "False", "(2, 3)"), 28, "4 trailing bytes after the data"},
    {NPY_HDR("<f4", "False", "()"), 0, "data is truncated"},
    {"{'descr': '<f4', 'fortran_order': False}", 4, "missing key 'shape'"},
    {"{'fortran_order': False, 'shape': ()}", 4, "missing key 'descr'"},
    {"{'descr': '<f4', 'shape': ()}", 4, "missing key 'fortran_order'"},
    {"{'descr': '<f4', 'fortran_order': False, 'shape': (), 'extra': 1}", 4, "unexpected key 'extra'"},
    {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': ()}", 4, "duplicate key 'descr'"},
    {NPY_HDR("<f4", "False", "(2, -3)"), 0, "negative dimension in shape"},
    {NPY_HDR("<f4", "False", "(1, 1, 1, 1, 1, 1, 1, 1, 1)"), 4, "shape has more than 8 dimensions"},
    {NPY_HDR("|u1", "False", "(4294967296, 4294967296, 4294967296)"), 0, "element count of the shape overflows"},
    {NPY_HDR("<f8", "False", "(2147483648, 2147483648)"), 0, "byte size of the shape overflows"},
    {NPY_HDR("<f4", "False", "(99999999999999999999,)"), 0, "dimension too large in shape"},
    {NPY_HDR("<f4", "False", "[2, 3]"), 24, "shape must be a tuple"},
    {NPY_HDR("<f4", "False", "(2, x)"), 8, "expected an integer in shape"},
    {NPY_HDR("<f4", "False", "(2 3)"), 24, "expected ',' or ')' in shape"},
    {NPY_HDR("<f4", "False", "(,)"), 0, "expected an integer in shape"},
    {NPY_HDR("<f4", "false", "(2,)"), 8, "fortran_order must be True or False"},
    {NPY_HDR("<f4", "0", "(2,)"), 8, "fortran_order must be True or False"},
    {"['descr', '<f4']", 0, "expected '{'"},
    {"", 0, "expected '{' (got end of header)"},
    {"{'descr': '<f4', 'fortran_order': False, 'shape': (), } x", 4, "unexpected text after the dict"},
    {"{'descr': '<f4' 'fortran_order': False, 'shape': ()}", 4, "expected ',' or '}'"},
    {"{'descr' '<f4', 'fortran_order': False, 'shape': ()}", 4, "expected ':' after key"},
    {"{descr: '<f4', 'fortran_order': False, 'shape': ()}", 4, "expected a quoted key"},
    {"{'descr': '<f4, 'fortran_order': False, 'shape': ()}", 4, "malformed header"},
    {"{'descr': '<f4", 4, "unterminated string"},
    {"{'de\\x63r': '<f4', 'fortran_order': False, 'shape': ()}", 4, "escape sequences are not supported"},
    {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,", 8, "end of header"},
    {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,)", 8, "expected ',' or '}' (got end of header)"},
};

TEST(npy_rejects_malformed) {
    for (size_t i = 0; i < ZY_ARRAY_LEN(bad_npy); i++) {
        uint8_t data[128] = {0};
        NpyArray a;
        ZyErr err;
        int rc = parse_hdr(1, bad_npy[i].hdr, data, bad_npy[i].data_len, &a, &err);
        CHECK_MSG(rc == -1, "case %zu (%s) was accepted", i, bad_npy[i].hdr);
        if (rc == 0) npy_free(&a);
        CHECK_MSG(strstr(err.msg, bad_npy[i].expect) != NULL, "case %zu (%s): message '%s' lacks '%s'", i,
                  bad_npy[i].hdr, err.msg, bad_npy[i].expect);
        CHECK_MSG(strncmp(err.msg, "hand.npy: ", 10) == 0, "case %zu: '%s' does not name the file", i, err.msg);
        CHECK(a.data == NULL);
    }
}

TEST(npy_rejects_bad_preamble) {
    NpyArray a;
    ZyErr err;
    CHECK(npy_parse("\x93NUMPY\x01", 7, "p.npy", &a, &err) == -1);
    CHECK(strstr(err.msg, "p.npy: file is 7 bytes, too short") != NULL);
    CHECK(npy_parse(NULL, 0, "p.npy", &a, &err) == -1);
    CHECK(strstr(err.msg, "too short") != NULL);
    const char *hdr = NPY_HDR("<f4", "False", "()");
    size_t len;
    uint8_t *b = mk_npy(1, hdr, "abcd", 4, &len);
    b[0] = 'X';
    CHECK(npy_parse(b, len, "p.npy", &a, &err) == -1);
    CHECK(strstr(err.msg, "p.npy: not a .npy file (bad magic)") != NULL);
    b[0] = 0x93;
    b[6] = 4;
    CHECK(npy_parse(b, len, "p.npy", &a, &err) == -1);
    CHECK(strstr(err.msg, "unsupported .npy version 4.0") != NULL);
    b[6] = 1, b[7] = 1;
    CHECK(npy_parse(b, len, "p.npy", &a, &err) == -1);
    CHECK(strstr(err.msg, "unsupported .npy version 1.1") != NULL);
    b[7] = 0;
    CHECK(npy_parse(b, len, "p.npy", &a, &err) == 0);
    npy_free(&a);
    b[8] = 0xff, b[9] = 0xff;
    CHECK(npy_parse(b, len, "p.npy", &a, &err) == -1);
    CHECK(strstr(err.msg, "p.npy: header length 65535 runs past the end of the file") != NULL);
    free(b);
    b = mk_npy(2, hdr, "abcd", 4, &len);
    b[11] = 0x80;
    CHECK(npy_parse(b, len, "p.npy", &a, &err) == -1);
    CHECK(strstr(err.msg, "runs past the end") != NULL);
    CHECK(npy_parse(b, 11, "p.npy", &a, &err) == -1); /* v2 needs 12 preamble bytes */
    CHECK(strstr(err.msg, "file is 11 bytes, too short") != NULL);
    free(b);
}

TEST(npy_read_tokens_int32_int64) {
    char dir[64], path[128];
    REQUIRE(zy_test_tmpdir(dir, sizeof dir, "npy") == 0);
    snprintf(path, sizeof path, "%s/t.npy", dir);
    ZyErr err;
    int32_t *tok;
    int ndim;
    int64_t shape[ZY_MAX_DIMS];

    int32_t v[6] = {0, 1, 2, 50000, -1, INT32_MAX};
    int64_t sh[2] = {2, 3};
    REQUIRE(npy_write(path, ZY_DT_I32, v, 2, sh, &err) == 0);
    REQUIRE(npy_read_tokens(path, &tok, &ndim, shape, &err) == 0);
    CHECK(ndim == 2 && shape[0] == 2 && shape[1] == 3 && memcmp(tok, v, sizeof v) == 0);
    zy_free(tok);

    /* int64 tokens, as numpy writes by default: narrowed in place */
    char hdr[128];
    snprintf(hdr, sizeof hdr, "%-117s\n", NPY_HDR("<i8", "False", "(5,)"));
    int64_t q[5] = {7, 0, INT32_MIN, INT32_MAX, 123456789};
    size_t len;
    uint8_t *b = mk_npy(1, hdr, q, sizeof q, &len);
    REQUIRE(zy_write_file_atomic(path, b, len, &err) == 0);
    REQUIRE(npy_read_tokens(path, &tok, &ndim, shape, &err) == 0);
    CHECK(ndim == 1 && shape[0] == 5);
    for (int i = 0; i < 5; i++) CHECK(tok[i] == (int32_t)q[i]);
    zy_free(tok);
    free(b);

    q[3] = (int64_t)INT32_MAX + 1;
    b = mk_npy(1, hdr, q, sizeof q, &len);
    REQUIRE(zy_write_file_atomic(path, b, len, &err) == 0);
    tok = (int32_t *)&err; /* must be reset to NULL on failure */
    CHECK(npy_read_tokens(path, &tok, &ndim, shape, &err) == -1);
    CHECK(tok == NULL);
    CHECK(strstr(err.msg, path) && strstr(err.msg, "2147483648 at index 3 is outside the int32 range"));
    free(b);

    float f[2] = {1, 2};
    int64_t s1[1] = {2};
    REQUIRE(npy_write(path, ZY_DT_F32, f, 1, s1, &err) == 0);
    CHECK(npy_read_tokens(path, &tok, &ndim, shape, &err) == -1);
    CHECK(strstr(err.msg, path) && strstr(err.msg, "must be int32 or int64, got dtype <f4"));
    int32_t one = 5;
    REQUIRE(npy_write(path, ZY_DT_I32, &one, 0, NULL, &err) == 0);
    CHECK(npy_read_tokens(path, &tok, &ndim, shape, &err) == -1);
    CHECK(strstr(err.msg, "at least 1 dimension") != NULL);

    b = mk_npy(1, NPY_HDR("|u1", "False", "(4,)"), "abcd", 4, &len);
    REQUIRE(zy_write_file_atomic(path, b, len, &err) == 0);
    CHECK(npy_read_tokens(path, &tok, &ndim, shape, &err) == -1);
    CHECK(strstr(err.msg, "got dtype |u1") != NULL);
    free(b);
    REQUIRE(zy_write_file_atomic(path, "", 0, &err) == 0);
    CHECK(npy_read_tokens(path, &tok, &ndim, shape, &err) == -1);
    CHECK(strstr(err.msg, path) && strstr(err.msg, "too short"));
    zy_test_rmtree(dir);
}

TEST(npy_mutation_fuzz) {
    char hdr[128];
    snprintf(hdr, sizeof hdr, "%-53s\n", NPY_HDR("<i8", "False", "(2,)"));
    int64_t q[2] = {1, -2};
    size_t base_len;
    uint8_t *base = mk_npy(1, hdr, q, sizeof q, &base_len);
    size_t hl = strlen(hdr);
    static const char tokens[] = "{}()[],:'\" 0123456789-<|=>fiubTFL\n";
    ZyRng rng;
    zy_rng_seed(&rng, 99);
    int accepted = 0, rejected = 0;
    for (int it = 0; it < 10000; it++) {
        size_t len = base_len;
        uint8_t *b = malloc(base_len);
        memcpy(b, base, base_len);
        int op = (int)(zy_rng_next(&rng) % 5);
        int k = 1 + (int)(zy_rng_next(&rng) % 3);
        for (int j = 0; j < k; j++) {
            if (op == 0)
                b[zy_rng_next(&rng) % len] = (uint8_t)zy_rng_next(&rng);
            else if (op == 1)
                b[10 + zy_rng_next(&rng) % hl] = (uint8_t)tokens[zy_rng_next(&rng) % (sizeof tokens - 1)];
            else if (op == 2)
                len = zy_rng_next(&rng) % (len + 1);
            else if (op == 3)
                b[8 + zy_rng_next(&rng) % 2] = (uint8_t)zy_rng_next(&rng);
            else
                b[10 + zy_rng_next(&rng) % hl] ^= (uint8_t)(1u << (zy_rng_next(&rng) % 8));
        }
        uint8_t *c = malloc(len ? len : 1); /* exactly sized so ASan sees any over-read */
        memcpy(c, b, len);
        free(b);
        NpyArray a;
        ZyErr err;
        err.msg[0] = '\0';
        if (npy_parse(c, len, "fuzz", &a, &err) == 0) {
            accepted++;
            size_t numel = 1;
            for (int d = 0; d < a.ndim; d++) numel *= (size_t)a.shape[d];
            CHECK(a.ndim >= 0 && a.ndim <= ZY_MAX_DIMS && numel == a.numel && a.data != NULL);
            volatile uint8_t sink = 0;
            for (size_t i = 0; i < a.numel * zy_dtype_size(a.dtype); i++) sink ^= ((uint8_t *)a.data)[i];
            (void)sink;
            npy_free(&a);
        } else {
            rejected++;
            CHECK_MSG(strncmp(err.msg, "fuzz: ", 6) == 0 && strlen(err.msg) > 6, "iteration %d: '%s'", it, err.msg);
        }
        free(c);
    }
    CHECK(accepted > 0 && rejected > 0);
    free(base);
}

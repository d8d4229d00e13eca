/* safetensors reader/writer: round trips, hand-built malformed headers (one per rejection class), a
 * bytes-exact file written by the Python safetensors library, and a deterministic mutation fuzz loop. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/safetensors.h"
#include "test.h"

/* ---- helpers ---- */

/* Number of entries in dir other than . and .. (to prove no temp file was left behind). */
static int dir_count(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

/* Builds an image: u64 header length, the header text as given, then data_len bytes (a byte pattern). */
static uint8_t *mk_image(const char *json, size_t json_len, size_t data_len, size_t *len) {
    *len = 8 + json_len + data_len;
    uint8_t *b = malloc(*len ? *len : 1);
    uint64_t h = json_len;
    memcpy(b, &h, 8);
    memcpy(b + 8, json, json_len);
    for (size_t i = 0; i < data_len; i++) b[8 + json_len + i] = (uint8_t)(i * 7 + 1);
    return b;
}

/* Opens json + data_len bytes; returns st_open_buffer's result and leaves the message in err. */
static int open_json(const char *json, size_t data_len, ZyErr *err) {
    size_t len;
    uint8_t *b = mk_image(json, strlen(json), data_len, &len);
    StFile f;
    err->msg[0] = '\0';
    int rc = st_open_buffer(&f, b, len, "hand.st", err);
    if (rc == 0) st_close(&f);
    free(b);
    return rc;
}

/* ---- round trips ---- */

TEST(st_roundtrip_f32) {
    char dir[64], path[128];
    REQUIRE(zy_test_tmpdir(dir, sizeof dir, "st") == 0);
    snprintf(path, sizeof path, "%s/a.safetensors", dir);
    float w[6] = {1.0f, -2.5f, 3.25f, 1e-30f, -0.0f, 12345.678f};
    float s = 42.0f;
    StWriteTensor t[2] = {
        {.name = "layer.0.weight", .ndim = 2, .shape = {2, 3}, .src_dtype = ZY_DT_F32, .out_dtype = ZY_DT_F32, .data = w},
        {.name = "scalar", .ndim = 0, .src_dtype = ZY_DT_F32, .out_dtype = ZY_DT_F32, .data = &s},
    };
    const char *meta[] = {"format", "pt", "note", "quote \" and \\ and \n", NULL};
    ZyErr err;
    REQUIRE(st_write(path, t, 2, meta, &err) == 0);
    CHECK(dir_count(dir) == 1); /* temp file renamed away */

    StFile f;
    REQUIRE(st_open(&f, path, &err) == 0);
    CHECK(f.n_entries == 2);
    CHECK(f.map != NULL);
    CHECK(((size_t)(f.data - (const uint8_t *)f.map)) % 8 == 0); /* data area 8-byte aligned */
    CHECK(f.data_len == 28);
    /* entries keep the order they were written in */
    CHECK(strcmp(f.entries[0].name, "layer.0.weight") == 0);
    CHECK(strcmp(f.entries[1].name, "scalar") == 0);
    const StEntry *e = st_find(&f, "layer.0.weight");
    REQUIRE(e != NULL);
    CHECK(e->dtype == ZY_DT_F32 && e->ndim == 2 && e->shape[0] == 2 && e->shape[1] == 3);
    CHECK(e->numel == 6 && e->offset == 0 && e->nbytes == 24);
    float out[6];
    REQUIRE(st_read_f32(&f, e, out, &err) == 0);
    CHECK(memcmp(out, w, sizeof w) == 0);
    e = st_find(&f, "scalar");
    REQUIRE(e != NULL);
    CHECK(e->ndim == 0 && e->numel == 1 && e->offset == 24);
    REQUIRE(st_read_f32(&f, e, out, &err) == 0);
    CHECK(out[0] == 42.0f);
    CHECK(st_find(&f, "missing") == NULL);
    REQUIRE(f.metadata_json != NULL);
    CHECK(strstr(f.metadata_json, "\"format\":\"pt\"") != NULL);
    CHECK(strstr(f.metadata_json, "quote \\\" and \\\\ and \\n") != NULL);
    st_close(&f);
    zy_test_rmtree(dir);
}

TEST(st_roundtrip_bf16_rounding) {
    char dir[64], path[128];
    REQUIRE(zy_test_tmpdir(dir, sizeof dir, "st") == 0);
    snprintf(path, sizeof path, "%s/b.safetensors", dir);
    /* hand-computed: f32 bits -> bf16 bits with round-to-nearest-even */
    float in[8];
    uint32_t bits[8] = {
        0x3F800000u, /* 1.0 -> 0x3F80 exact */
        0x3F808000u, /* 1 + 2^-8: tie, round to even -> 0x3F80 (1.0) */
        0x3F818000u, /* 1 + 3*2^-8: tie, round to even -> 0x3F82 (1.015625) */
        0x40490FDBu, /* pi: low half 0x0FDB < 0x8000 -> 0x4049 (3.140625) */
        0xC02DF854u, /* -e: low half 0xF854 > 0x8000 -> 0xC02E (-2.71875) */
        0x3F808001u, /* just above the tie -> 0x3F81 */
        0x7F800000u, /* +inf stays inf */
        0x7FC00000u, /* NaN stays NaN */
    };
    uint16_t want[8] = {0x3F80, 0x3F80, 0x3F82, 0x4049, 0xC02E, 0x3F81, 0x7F80, 0x7FC0};
    memcpy(in, bits, sizeof in);
    StWriteTensor t = {.name = "x", .ndim = 1, .shape = {8}, .src_dtype = ZY_DT_F32, .out_dtype = ZY_DT_BF16,
                       .data = in};
    ZyErr err;
    REQUIRE(st_write(path, &t, 1, NULL, &err) == 0);
    StFile f;
    REQUIRE(st_open(&f, path, &err) == 0);
    CHECK(f.metadata_json == NULL);
    const StEntry *e = st_find(&f, "x");
    REQUIRE(e != NULL);
    CHECK(e->dtype == ZY_DT_BF16 && e->nbytes == 16);
    for (int i = 0; i < 8; i++) {
        uint16_t h;
        memcpy(&h, f.data + e->offset + 2 * i, 2);
        CHECK_MSG(h == want[i], "element %d: got 0x%04x want 0x%04x", i, h, want[i]);
    }
    float out[8];
    REQUIRE(st_read_f32(&f, e, out, &err) == 0);
    CHECK(out[0] == 1.0f && out[1] == 1.0f && out[2] == 1.015625f && out[3] == 3.140625f);
    CHECK(out[4] == -2.71875f && out[5] == 1.0078125f && isinf(out[6]) && isnan(out[7]));
    st_close(&f);
    zy_test_rmtree(dir);
}

/* More elements than the writer's conversion chunk, so the chunk loop and its tail are exercised. */
TEST(st_bf16_large_chunks) {
    char dir[64], path[128];
    REQUIRE(zy_test_tmpdir(dir, sizeof dir, "st") == 0);
    snprintf(path, sizeof path, "%s/big.safetensors", dir);
    size_t n = 2 * 65536 + 4; /* divisible by 3, and not by the chunk size */
    float *in = malloc(n * sizeof *in);
    float *out = malloc(n * sizeof *out);
    REQUIRE(in && out);
    ZyRng rng;
    zy_rng_seed(&rng, 7);
    for (size_t i = 0; i < n; i++) in[i] = (float)zy_rng_normal(&rng);
    StWriteTensor t[2] = {
        {.name = "a", .ndim = 2, .shape = {3, (int64_t)n / 3}, .src_dtype = ZY_DT_F32, .out_dtype = ZY_DT_BF16, .data = in},
        {.name = "b", .ndim = 1, .shape = {5}, .src_dtype = ZY_DT_F32, .out_dtype = ZY_DT_F32, .data = in},
    };
    ZyErr err;
    REQUIRE(st_write(path, t, 2, NULL, &err) == 0);
    StFile f;
    REQUIRE(st_open(&f, path, &err) == 0);
    const StEntry *e = st_find(&f, "a");
    REQUIRE(e && e->numel == n);
    REQUIRE(st_read_f32(&f, e, out, &err) == 0);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        if (out[i] != zy_bf16_to_f32(zy_f32_to_bf16(in[i]))) bad++;
    CHECK(bad == 0);
    /* st_read_f32 hands the mapped pages it read back to the system: reading the tensor again gets the same */
    memset(out, 0, n * sizeof *out);
    REQUIRE(st_read_f32(&f, e, out, &err) == 0);
    for (size_t i = 0; i < n; i++) bad += out[i] != zy_round_bf16(in[i]);
    CHECK(bad == 0);
    e = st_find(&f, "b");
    REQUIRE(e && e->offset == 2 * n);
    REQUIRE(st_read_f32(&f, e, out, &err) == 0);
    CHECK(memcmp(out, in, 5 * sizeof(float)) == 0);
    st_close(&f);
    free(in);
    free(out);
    zy_test_rmtree(dir);
}

TEST(st_roundtrip_i32) {
    char dir[64], path[128];
    REQUIRE(zy_test_tmpdir(dir, sizeof dir, "st") == 0);
    snprintf(path, sizeof path, "%s/i.safetensors", dir);
    int32_t v[4] = {INT32_MIN, -1, 0, INT32_MAX};
    StWriteTensor t = {.name = "ids", .ndim = 2, .shape = {2, 2}, .src_dtype = ZY_DT_I32, .out_dtype = ZY_DT_I32,
                       .data = v};
    ZyErr err;
    REQUIRE(st_write(path, &t, 1, NULL, &err) == 0);
    StFile f;
    REQUIRE(st_open(&f, path, &err) == 0);
    const StEntry *e = st_find(&f, "ids");
    REQUIRE(e && e->dtype == ZY_DT_I32);
    int32_t out[4];
    REQUIRE(st_read_i32(&f, e, out, &err) == 0);
    CHECK(memcmp(out, v, sizeof v) == 0);
    float fo[4];
    CHECK(st_read_f32(&f, e, fo, &err) == -1);
    CHECK(strstr(err.msg, "'ids'") && strstr(err.msg, "I32") && strstr(err.msg, path));
    st_close(&f);

    /* overwriting an existing file replaces it whole */
    int32_t v2[1] = {5};
    StWriteTensor t2 = {.name = "other", .ndim = 1, .shape = {1}, .src_dtype = ZY_DT_I32, .out_dtype = ZY_DT_I32,
                        .data = v2};
    REQUIRE(st_write(path, &t2, 1, NULL, &err) == 0);
    REQUIRE(st_open(&f, path, &err) == 0);
    CHECK(f.n_entries == 1 && st_find(&f, "ids") == NULL && st_find(&f, "other") != NULL);
    st_close(&f);
    CHECK(dir_count(dir) == 1);
    zy_test_rmtree(dir);
}

/* F16, BF16, F64 and I64 read from unaligned offsets (the reader must memcpy, UBSan checks it). */
TEST(st_read_f16_unaligned) {
    const char *json = "{\"pad\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                       "\"h\":{\"dtype\":\"F16\",\"shape\":[5],\"data_offsets\":[1,11]},"
                       "\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[11,15]},"
                       "\"d\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[15,23]},"
                       "\"q\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[23,39]}}";
    size_t len;
    uint8_t *b = mk_image(json, strlen(json), 39, &len);
    uint8_t *d = b + 8 + strlen(json);
    uint16_t h[5] = {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x3555}; /* 1, -2, 65504, 2^-24, 0.333251953125 */
    memcpy(d + 1, h, sizeof h);
    uint16_t bf[2] = {0x3F80, 0xC0A0}; /* 1, -5 */
    memcpy(d + 11, bf, sizeof bf);
    double x = -0.125;
    memcpy(d + 15, &x, 8);
    int64_t q[2] = {-3, (int64_t)1 << 31};
    memcpy(d + 23, q, sizeof q);
    StFile f;
    ZyErr err;
    REQUIRE(st_open_buffer(&f, b, len, "unaligned", &err) == 0);
    CHECK(f.map == NULL);
    float out[5];
    REQUIRE(st_read_f32(&f, st_find(&f, "h"), out, &err) == 0);
    CHECK(out[0] == 1.0f && out[1] == -2.0f && out[2] == 65504.0f);
    CHECK(out[3] == ldexpf(1.0f, -24) && out[4] == 0.333251953125f);
    REQUIRE(st_read_f32(&f, st_find(&f, "b"), out, &err) == 0);
    CHECK(out[0] == 1.0f && out[1] == -5.0f);
    REQUIRE(st_read_f32(&f, st_find(&f, "d"), out, &err) == 0);
    CHECK(out[0] == -0.125f);
    int32_t io[2];
    CHECK(st_read_i32(&f, st_find(&f, "q"), io, &err) == -1); /* 2^31 does not fit */
    CHECK(strstr(err.msg, "'q'") && strstr(err.msg, "index 1") && strstr(err.msg, "int32"));
    CHECK(st_read_i32(&f, st_find(&f, "h"), io, &err) == -1);
    CHECK(strstr(err.msg, "'h'") && strstr(err.msg, "F16"));
    CHECK(st_read_f32(&f, st_find(&f, "pad"), out, &err) == -1);
    CHECK(strstr(err.msg, "U8") != NULL);
    st_close(&f);
    q[1] = -7;
    memcpy(d + 23, q, sizeof q);
    REQUIRE(st_open_buffer(&f, b, len, "unaligned", &err) == 0);
    REQUIRE(st_read_i32(&f, st_find(&f, "q"), io, &err) == 0);
    CHECK(io[0] == -3 && io[1] == -7);
    st_close(&f);
    free(b);
}

/* Exact bytes of safetensors.numpy.save({"w": f32 [1.5, -2.25], "ids": i64 [1, -7, 2^40],
 * "h": f16 [1, -0.5, 65504]}, metadata={"format": "np"}) from the Python safetensors 0.8 library. */
TEST(st_reads_python_file) {
    const char *json = "{\"__metadata__\":{\"format\":\"np\"},\"ids\":{\"dtype\":\"I64\",\"shape\":[3],"
                       "\"data_offsets\":[0,24]},\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[24,32]},"
                       "\"h\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[32,38]}}  ";
    static const uint8_t data[38] = {0x01, 0, 0, 0, 0, 0, 0, 0, 0xf9, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                                     0, 0, 0, 0, 0, 0x01, 0, 0, 0, 0, 0xc0, 0x3f, 0, 0, 0x10, 0xc0,
                                     0, 0x3c, 0, 0xb8, 0xff, 0x7b};
    CHECK(strlen(json) == 200);
    size_t len;
    uint8_t *b = mk_image(json, strlen(json), 38, &len);
    memcpy(b + 8 + 200, data, 38);
    StFile f;
    ZyErr err;
    REQUIRE(st_open_buffer(&f, b, len, "python.st", &err) == 0);
    CHECK(f.n_entries == 3);
    CHECK(f.metadata_json && strcmp(f.metadata_json, "{\"format\":\"np\"}") == 0);
    float out[3];
    REQUIRE(st_read_f32(&f, st_find(&f, "w"), out, &err) == 0);
    CHECK(out[0] == 1.5f && out[1] == -2.25f);
    REQUIRE(st_read_f32(&f, st_find(&f, "h"), out, &err) == 0);
    CHECK(out[0] == 1.0f && out[1] == -0.5f && out[2] == 65504.0f);
    int32_t io[3];
    CHECK(st_read_i32(&f, st_find(&f, "ids"), io, &err) == -1);
    CHECK(strstr(err.msg, "1099511627776") && strstr(err.msg, "index 2"));
    st_close(&f);
    free(b);
}

TEST(st_zero_size_tensors) {
    const char *json = "{\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]},"
                       "\"z\":{\"dtype\":\"BF16\",\"shape\":[2,0,3],\"data_offsets\":[0,0]},"
                       "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                       "\"end\":{\"dtype\":\"I32\",\"shape\":[0],\"data_offsets\":[8,8]}}";
    size_t len;
    uint8_t *b = mk_image(json, strlen(json), 8, &len);
    StFile f;
    ZyErr err;
    REQUIRE(st_open_buffer(&f, b, len, "zero", &err) == 0);
    CHECK(f.n_entries == 4);
    const StEntry *e = st_find(&f, "z");
    REQUIRE(e);
    CHECK(e->numel == 0 && e->nbytes == 0 && e->ndim == 3);
    float out[1];
    CHECK(st_read_f32(&f, e, out, &err) == 0);
    int32_t io[1];
    CHECK(st_read_i32(&f, st_find(&f, "end"), io, &err) == 0);
    st_close(&f);
    free(b);

    /* an empty header object and no data is a valid (empty) file */
    CHECK(open_json("{}", 0, &err) == 0);
    CHECK(open_json("{\"__metadata__\":{}}    ", 0, &err) == 0);
    CHECK(open_json("{\"__metadata__\":null}  ", 0, &err) == 0); /* as mlx.core.save_safetensors writes it */
}

/* ---- malformed inputs: every rejection class, with the expected words in the message ---- */

typedef struct {
    const char *json;
    size_t data_len;
    const char *expect;
} BadCase;

#define T1(name, dt, shape, offs) "\"" name "\":{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":" offs "}"

static const BadCase bad_cases[] = {
    {"{\"a\":", 0, "not valid JSON"},
    {"nonsense", 0, "not valid JSON"},
    {"[1,2]", 0, "not a JSON object"},
    {"\"str\"", 0, "not a JSON object"},
    {"{} x", 0, "trailing data"},
    {"{}{}", 0, "trailing data"},
    {"{\"a\":5}", 0, "tensor 'a': entry is not a JSON object"},
    {"{\"a\":[1]}", 0, "tensor 'a': entry is not a JSON object"},
    {"{" T1("t", "F8_E4M3", "[1]", "[0,1]") "}", 1, "tensor 't': unsupported dtype 'F8_E4M3'"},
    {"{" T1("t", "f32", "[1]", "[0,4]") "}", 4, "unsupported dtype 'f32'"},
    {"{\"t\":{\"dtype\":3,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor 't': dtype is not a string"},
    {"{\"t\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor 't': missing field \"dtype\""},
    {"{\"t\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, "tensor 't': missing field \"shape\""},
    {"{\"t\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "tensor 't': missing field \"data_offsets\""},
    {"{\"t\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "duplicate field \"dtype\""},
    {"{" T1("t", "F32", "3", "[0,12]") "}", 12, "tensor 't': shape is not an array"},
    {"{" T1("t", "F32", "[1.5]", "[0,4]") "}", 4, "tensor 't': shape[0] is not a non-negative integer"},
    {"{" T1("t", "F32", "[2,-1]", "[0,4]") "}", 4, "tensor 't': shape[1] is not a non-negative integer"},
    {"{" T1("t", "F32", "[\"2\"]", "[0,8]") "}", 8, "shape[0] is not a non-negative integer"},
    {"{" T1("t", "F32", "[1.0]", "[0,4]") "}", 4, "header number '1.0' at offset 29 is not an integer literal"},
    {"{" T1("t", "F32", "[1]", "[0,4e0]") "}", 4, "header number '4e0' at offset 50 is not an integer literal"},
    {"{" T1("t", "F32", "[null]", "[0,8]") "}", 8, "shape[0] is not a non-negative integer"},
    {"{" T1("t", "F32", "[1e400]", "[0,8]") "}", 8, "shape[0] is not a non-negative integer"},
    {"{" T1("t", "U8", "[9007199254740993]", "[0,1]") "}", 1, "below 2^53"},
    {"{" T1("t", "U8", "[9007199254740992]", "[0,1]") "}", 1, "below 2^53"},
    {"{" T1("t", "U8", "[1,1,1,1,1,1,1,1,1]", "[0,1]") "}", 1, "tensor 't': shape has 9 dims, more than the maximum 8"},
    {"{" T1("t", "U8", "[4294967296,4294967296,4294967296]", "[0,1]") "}", 1, "tensor 't': element count overflows"},
    {"{" T1("t", "F64", "[2147483648,2147483648]", "[0,1]") "}", 1, "tensor 't': byte size overflows"},
    {"{" T1("t", "F32", "[1]", "{\"a\":0}") "}", 4, "tensor 't': data_offsets is not a [begin, end] array"},
    {"{" T1("t", "F32", "[1]", "[0]") "}", 4, "data_offsets is not a [begin, end] array"},
    {"{" T1("t", "F32", "[1]", "[0,4,8]") "}", 8, "data_offsets is not a [begin, end] array"},
    {"{" T1("t", "F32", "[1]", "[0,4.5]") "}", 8, "data_offsets are not non-negative integers"},
    {"{" T1("t", "F32", "[1]", "[-4,0]") "}", 8, "data_offsets are not non-negative integers"},
    {"{" T1("t", "F32", "[1]", "[0,9007199254740996]") "}", 8, "data_offsets are not non-negative integers below 2^53"},
    {"{" T1("t", "F32", "[0]", "[8,4]") "}", 8, "tensor 't': data_offsets begin 8 > end 4"},
    {"{" T1("t", "F32", "[4]", "[0,16]") "}", 8, "tensor 't': data_offsets end 16 is past the data area (8 bytes)"},
    {"{" T1("t", "F32", "[2]", "[0,4]") "}", 8, "tensor 't': data_offsets span 4 bytes but shape and dtype F32 need 8"},
    {"{" T1("t", "BF16", "[2]", "[0,8]") "}", 8, "span 8 bytes but shape and dtype BF16 need 4"},
    {"{" T1("a", "F32", "[2]", "[0,8]") "," T1("b", "F32", "[2]", "[4,12]") "}", 12,
     "tensors 'a' [0, 8) and 'b' [4, 12) overlap"},
    {"{" T1("a", "U8", "[4]", "[2,6]") "," T1("b", "U8", "[1]", "[3,4]") "}", 8, "overlap"},
    {"{" T1("a", "U8", "[1]", "[0,1]") "," T1("a", "U8", "[1]", "[1,2]") "}", 2, "duplicate tensor name 'a'"},
    {"{" T1("x", "U8", "[1]", "[0,1]") ",\"__metadata__\":[1]}", 1, "\"__metadata__\" is not a JSON object"},
    {"{\"__metadata__\":{\"k\":1}}", 0, "\"__metadata__\" value of 'k' is not a string"},
    {"{\"__metadata__\":{\"k\":{}}}", 0, "value of 'k' is not a string"},
    {"{\"__metadata__\":{\"k\":\"a\",\"k\":\"b\"}}", 0, "\"__metadata__\" has duplicate key 'k'"},
    {"{\"__metadata__\":{},\"__metadata__\":{}}", 0, "duplicate \"__metadata__\" entry"},
    {"{\"\xff\":1}", 0, "not valid UTF-8"},
    {"{\"\xc0\x80\":1}", 0, "not valid UTF-8"}, /* overlong NUL */
};

TEST(st_rejects_malformed_headers) {
    for (size_t i = 0; i < ZY_ARRAY_LEN(bad_cases); i++) {
        ZyErr err;
        int rc = open_json(bad_cases[i].json, bad_cases[i].data_len, &err);
        CHECK_MSG(rc == -1, "case %zu (%s) was accepted", i, bad_cases[i].json);
        CHECK_MSG(strstr(err.msg, bad_cases[i].expect) != NULL, "case %zu (%s): message '%s' lacks '%s'", i,
                  bad_cases[i].json, err.msg, bad_cases[i].expect);
        CHECK_MSG(strncmp(err.msg, "hand.st: ", 9) == 0, "case %zu: message '%s' does not name the file", i,
                  err.msg);
    }
}

TEST(st_rejects_bad_lengths) {
    StFile f;
    ZyErr err;
    uint8_t small[5] = {1, 0, 0, 0, 0};
    CHECK(st_open_buffer(&f, small, sizeof small, "short.st", &err) == -1);
    CHECK(strstr(err.msg, "short.st") && strstr(err.msg, "shorter than the 8-byte"));
    CHECK(st_open_buffer(&f, NULL, 0, "empty.st", &err) == -1);
    CHECK(strstr(err.msg, "empty.st") && strstr(err.msg, "shorter"));

    uint8_t b[64] = {0};
    memcpy(b + 8, "{}", 2);
    CHECK(st_open_buffer(&f, b, sizeof b, "zero.st", &err) == -1); /* length field is 0 */
    CHECK(strstr(err.msg, "zero.st: header length is 0") != NULL);

    uint64_t h = ((uint64_t)100 << 20) + 1;
    memcpy(b, &h, 8);
    CHECK(st_open_buffer(&f, b, sizeof b, "huge.st", &err) == -1);
    CHECK(strstr(err.msg, "huge.st") && strstr(err.msg, "exceeds the 100 MiB limit"));
    h = UINT64_MAX;
    memcpy(b, &h, 8);
    CHECK(st_open_buffer(&f, b, sizeof b, "huge.st", &err) == -1);
    CHECK(strstr(err.msg, "exceeds the 100 MiB limit") != NULL);
    h = 57; /* one byte past the end of a 64-byte file */
    memcpy(b, &h, 8);
    CHECK(st_open_buffer(&f, b, sizeof b, "past.st", &err) == -1);
    CHECK(strstr(err.msg, "past.st") && strstr(err.msg, "header length 57 runs past the end of the file"));

    /* a NUL inside the header would truncate names in C: rejected outright */
    const char json[] = "{\"a\0b\":{}}";
    size_t len;
    uint8_t *img = mk_image(json, sizeof json - 1, 0, &len);
    CHECK(st_open_buffer(&f, img, len, "nul.st", &err) == -1);
    CHECK(strstr(err.msg, "nul.st") && strstr(err.msg, "NUL byte at offset 3"));
    free(img);
}

TEST(st_open_errors_name_the_path) {
    char dir[64], path[128];
    REQUIRE(zy_test_tmpdir(dir, sizeof dir, "st") == 0);
    snprintf(path, sizeof path, "%s/none.safetensors", dir);
    StFile f;
    ZyErr err;
    CHECK(st_open(&f, path, &err) == -1);
    CHECK(strstr(err.msg, path) && strstr(err.msg, "cannot open"));
    CHECK(f.entries == NULL && f.map == NULL);
    st_close(&f); /* harmless after a failed open */
    snprintf(path, sizeof path, "%s/short.safetensors", dir);
    ZyErr e2;
    REQUIRE(zy_write_file_atomic(path, "abc", 3, &e2) == 0);
    CHECK(st_open(&f, path, &err) == -1);
    CHECK(strstr(err.msg, path) && strstr(err.msg, "shorter"));
    /* a malformed header through the mmap path: the map is released and the message names the file */
    char img[16] = {8, 0, 0, 0, 0, 0, 0, 0, '[', ']', ' ', ' ', ' ', ' ', ' ', ' '};
    REQUIRE(zy_write_file_atomic(path, img, sizeof img, &e2) == 0);
    CHECK(st_open(&f, path, &err) == -1);
    CHECK(strstr(err.msg, path) && strstr(err.msg, "not a JSON object"));
    CHECK(f.map == NULL);
    zy_test_rmtree(dir);
}

TEST(st_write_rejects_bad_input) {
    char dir[64], path[128];
    REQUIRE(zy_test_tmpdir(dir, sizeof dir, "st") == 0);
    snprintf(path, sizeof path, "%s/w.safetensors", dir);
    float x[4] = {1, 2, 3, 4};
    ZyErr err;
    StWriteTensor dup[2] = {
        {.name = "a", .ndim = 1, .shape = {2}, .src_dtype = ZY_DT_F32, .out_dtype = ZY_DT_F32, .data = x},
        {.name = "a", .ndim = 1, .shape = {2}, .src_dtype = ZY_DT_F32, .out_dtype = ZY_DT_BF16, .data = x},
    };
    CHECK(st_write(path, dup, 2, NULL, &err) == -1);
    CHECK(strstr(err.msg, "duplicate tensor name 'a'") && strstr(err.msg, path));

    StWriteTensor t = {.name = "t", .ndim = 1, .shape = {4}, .src_dtype = ZY_DT_I32, .out_dtype = ZY_DT_BF16, .data = x};
    CHECK(st_write(path, &t, 1, NULL, &err) == -1);
    CHECK(strstr(err.msg, "cannot write I32 data as BF16") != NULL);
    t.src_dtype = ZY_DT_F32, t.out_dtype = ZY_DT_I32;
    CHECK(st_write(path, &t, 1, NULL, &err) == -1);
    CHECK(strstr(err.msg, "cannot write F32 data as I32") != NULL);
    t.src_dtype = ZY_DT_BF16, t.out_dtype = ZY_DT_F32; /* only F32 converts; anything else is written as it is */
    CHECK(st_write(path, &t, 1, NULL, &err) == -1);
    CHECK(strstr(err.msg, "cannot write BF16 data as F32") != NULL);

    t.src_dtype = ZY_DT_F32, t.out_dtype = ZY_DT_F32, t.data = NULL;
    CHECK(st_write(path, &t, 1, NULL, &err) == -1);
    CHECK(strstr(err.msg, "tensor 't': NULL data") != NULL);
    t.data = x, t.ndim = 9;
    CHECK(st_write(path, &t, 1, NULL, &err) == -1);
    CHECK(strstr(err.msg, "ndim 9") != NULL);
    t.ndim = 2, t.shape[0] = 2, t.shape[1] = -2;
    CHECK(st_write(path, &t, 1, NULL, &err) == -1);
    CHECK(strstr(err.msg, "invalid shape[1] = -2") != NULL);
    t.ndim = 1, t.shape[0] = 4, t.name = "__metadata__";
    CHECK(st_write(path, &t, 1, NULL, &err) == -1);
    CHECK(strstr(err.msg, "reserved") != NULL);
    t.name = NULL;
    CHECK(st_write(path, &t, 1, NULL, &err) == -1);
    CHECK(strstr(err.msg, "no name") != NULL);
    t.name = "t";
    const char *odd[] = {"k", NULL, NULL};
    CHECK(st_write(path, &t, 1, odd, &err) == -1);
    CHECK(strstr(err.msg, "metadata key 'k' has no value") != NULL);
    const char *dupm[] = {"k", "1", "j", "2", "k", "3", NULL};
    CHECK(st_write(path, &t, 1, dupm, &err) == -1);
    CHECK(strstr(err.msg, "duplicate metadata key 'k'") != NULL);
    CHECK(st_write(path, &t, -1, NULL, &err) == -1);
    CHECK(dir_count(dir) == 0); /* nothing written, no temp file left */

    /* a directory that does not exist: clean failure naming the temp path */
    char bad[160];
    snprintf(bad, sizeof bad, "%s/no/such/dir.st", dir);
    CHECK(st_write(bad, &t, 1, NULL, &err) == -1);
    CHECK(strstr(err.msg, "cannot create") != NULL);

    /* NULL data is fine for a zero-size tensor, and so are zero tensors with metadata only */
    StWriteTensor z = {.name = "z", .ndim = 2, .shape = {0, 5}, .src_dtype = ZY_DT_F32, .out_dtype = ZY_DT_BF16,
                       .data = NULL};
    CHECK(st_write(path, &z, 1, NULL, &err) == 0);
    const char *meta[] = {"only", "metadata", NULL};
    CHECK(st_write(path, NULL, 0, meta, &err) == 0);
    StFile f;
    REQUIRE(st_open(&f, path, &err) == 0);
    CHECK(f.n_entries == 0 && f.metadata_json && strcmp(f.metadata_json, "{\"only\":\"metadata\"}") == 0);
    st_close(&f);
    zy_test_rmtree(dir);
}

/* Names needing JSON escapes survive the round trip. */
TEST(st_write_escapes_names) {
    char dir[64], path[128];
    REQUIRE(zy_test_tmpdir(dir, sizeof dir, "st") == 0);
    snprintf(path, sizeof path, "%s/e.safetensors", dir);
    int32_t v[1] = {9};
    const char *names[3] = {"q\"uote", "back\\slash", "tab\tnl\n\xc3\xa9"};
    StWriteTensor t[3];
    for (int i = 0; i < 3; i++)
        t[i] = (StWriteTensor){.name = names[i], .ndim = 1, .shape = {1}, .src_dtype = ZY_DT_I32,
                               .out_dtype = ZY_DT_I32, .data = v};
    ZyErr err;
    REQUIRE(st_write(path, t, 3, NULL, &err) == 0);
    StFile f;
    REQUIRE(st_open(&f, path, &err) == 0);
    for (int i = 0; i < 3; i++) CHECK_MSG(st_find(&f, names[i]) != NULL, "name %d lost", i);
    st_close(&f);
    zy_test_rmtree(dir);
}

/* ---- deterministic mutation fuzz over a valid image ---- */

static void check_opened(const StFile *f, int *zy_test_failed_) {
    float *fo = NULL;
    int32_t *io = NULL;
    for (int i = 0; i < f->n_entries; i++) {
        const StEntry *e = &f->entries[i];
        CHECK(e->name != NULL);
        CHECK(e->offset <= f->data_len && e->nbytes <= f->data_len - e->offset);
        CHECK(e->nbytes == e->numel * zy_dtype_size(e->dtype));
        CHECK(st_find(f, e->name) != NULL);
        fo = realloc(fo, (e->numel + 1) * sizeof *fo);
        io = realloc(io, (e->numel + 1) * sizeof *io);
        ZyErr err;
        err.msg[0] = '\0';
        if (st_read_f32(f, e, fo, &err) != 0) CHECK(err.msg[0] != '\0');
        err.msg[0] = '\0';
        if (st_read_i32(f, e, io, &err) != 0) CHECK(err.msg[0] != '\0');
    }
    free(fo);
    free(io);
}

TEST(st_mutation_fuzz) {
    const char *json = "{\"__metadata__\":{\"format\":\"pt\"},"
                       T1("emb", "BF16", "[2,3]", "[0,12]") "," T1("w", "F32", "[3]", "[12,24]") ","
                       T1("ids", "I64", "[2]", "[24,40]") "," T1("h", "F16", "[1]", "[40,42]") ","
                       T1("z", "F32", "[0,4]", "[42,42]") "}";
    size_t base_len;
    uint8_t *base = mk_image(json, strlen(json), 42, &base_len);
    size_t hdr_len = strlen(json);
    ZyRng rng;
    zy_rng_seed(&rng, 12345);
    int accepted = 0, rejected = 0;
    static const char tokens[] = "{}[],:\"0123456789-.e ";
    for (int it = 0; it < 10000; it++) {
        size_t len = base_len;
        uint8_t *b = malloc(base_len); /* exactly sized, so ASan sees any over-read */
        memcpy(b, base, base_len);
        int op = (int)(zy_rng_next(&rng) % 6);
        int k = 1 + (int)(zy_rng_next(&rng) % 4);
        for (int j = 0; j < k; j++) {
            if (op == 0) { /* random byte anywhere */
                b[zy_rng_next(&rng) % len] = (uint8_t)zy_rng_next(&rng);
            } else if (op == 1) { /* JSON-ish token inside the header */
                b[8 + zy_rng_next(&rng) % hdr_len] = (uint8_t)tokens[zy_rng_next(&rng) % (sizeof tokens - 1)];
            } else if (op == 2) { /* truncate */
                len = zy_rng_next(&rng) % (len + 1);
            } else if (op == 3) { /* header length nudged or replaced */
                uint64_t h = hdr_len;
                if (zy_rng_next(&rng) % 2)
                    h += (uint64_t)(int64_t)((int)(zy_rng_next(&rng) % 17) - 8);
                else
                    h = zy_rng_next(&rng) >> (zy_rng_next(&rng) % 64);
                memcpy(b, &h, 8);
            } else if (op == 4) { /* digit change inside the header (offsets, shapes) */
                b[8 + zy_rng_next(&rng) % hdr_len] = (uint8_t)('0' + zy_rng_next(&rng) % 10);
            } else { /* bit flip in the header */
                b[8 + zy_rng_next(&rng) % hdr_len] ^= (uint8_t)(1u << (zy_rng_next(&rng) % 8));
            }
        }
        uint8_t *c = malloc(len ? len : 1);
        memcpy(c, b, len);
        free(b);
        StFile f;
        ZyErr err;
        err.msg[0] = '\0';
        if (st_open_buffer(&f, len ? c : NULL, len, "fuzz", &err) == 0) {
            accepted++;
            check_opened(&f, zy_test_failed_);
            st_close(&f);
        } else {
            rejected++;
            CHECK_MSG(strncmp(err.msg, "fuzz: ", 6) == 0 && strlen(err.msg) > 6, "iteration %d: bad message '%s'",
                      it, err.msg);
        }
        free(c);
    }
    CHECK(accepted > 0 && rejected > 0);
    free(base);
}

/* Tensors written as they are (zaya quantize: U32 codes, BF16/F16 scales), from memory and from a byte callback. */
static int count_bytes(void *ctx, size_t first, size_t n, void *out) {
    (void)ctx;
    for (size_t i = 0; i < n; i++) ((uint8_t *)out)[i] = (uint8_t)((first + i) * 7);
    return 0;
}

TEST(safetensors_writes_any_dtype_as_it_is) {
    char dir[256], path[300];
    REQUIRE(zy_test_tmpdir(dir, sizeof dir, "st_raw") == 0);
    snprintf(path, sizeof path, "%s/raw.safetensors", dir);
    const uint16_t h[3] = {0x3c00, 0xc000, 0x7bff};
    const int64_t big = 300000; /* more than one 256 KiB chunk of the byte callback */
    StWriteTensor t[2] = {
        {.name = "half", .ndim = 1, .shape = {3}, .src_dtype = ZY_DT_F16, .out_dtype = ZY_DT_F16, .data = h},
        {.name = "codes", .ndim = 2, .shape = {2, big / 2}, .src_dtype = ZY_DT_U32, .out_dtype = ZY_DT_U32,
         .fill_bytes = count_bytes},
    };
    ZyErr err;
    REQUIRE(st_write(path, t, 2, NULL, &err) == 0);
    StFile f;
    REQUIRE(st_open(&f, path, &err) == 0);
    const StEntry *a = st_find(&f, "half"), *b = st_find(&f, "codes");
    REQUIRE(a && b);
    CHECK(a->dtype == ZY_DT_F16 && memcmp(f.data + a->offset, h, sizeof h) == 0);
    CHECK(b->dtype == ZY_DT_U32 && b->nbytes == (size_t)big * 4);
    int bad = 0;
    for (size_t i = 0; i < b->nbytes; i++) bad += f.data[b->offset + i] != (uint8_t)(i * 7);
    CHECK(bad == 0);
    st_close(&f);
    t[1].src_dtype = ZY_DT_F32; /* a byte callback writes the tensor as it is: no conversion */
    t[1].out_dtype = ZY_DT_BF16;
    CHECK(st_write(path, t, 2, NULL, &err) == -1 && strstr(err.msg, "byte fill callback"));
    zy_test_rmtree(dir);
}

/* util: errors, checked allocation, deterministic RNG, small helpers shared by every module. */
#ifndef ZAYA_UTIL_H
#define ZAYA_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Library code never exits: a failing function fills a ZyErr and returns a non-zero status. */
typedef struct {
    char msg[1024];
} ZyErr;

/* Formats the message into err (if non-NULL) and returns -1, so callers can `return zy_fail(...)`. */
int zy_fail(ZyErr *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prepends "context: " to an existing error message; returns -1. */
int zy_wrap(ZyErr *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* 64-byte aligned, zero-filled allocation; NULL on failure (or on n == 0 returns a valid pointer). */
void *zy_calloc(size_t n_bytes);
/* The same, zeroed now: for memory that is read before it is written (optimizer state). A lazily zeroed page read
 * first maps the shared zero page, and the write after it faults again and flushes the TLB of every core (on a VM,
 * an IPI each: ~2 s at the first AdamW step of a 116 M-parameter model). */
void *zy_calloc_resident(size_t n_bytes);
void zy_free(void *p);

/* Overflow-checked size arithmetic: returns 0 and sets *out, or -1 on overflow. */
int zy_mul_size(size_t a, size_t b, size_t *out);
/* Appends n bytes to the NUL-terminated string *s (*len bytes, *cap allocated; NULL/0/0 to start), growing it by
 * doubling. 0, or -1 (*s unchanged) when memory runs out. */
int zy_str_append(char **s, size_t *len, size_t *cap, const char *add, size_t n);

/* Reads a whole file into a malloc'ed, NUL-terminated buffer. */
int zy_read_file(const char *path, char **data, size_t *len, ZyErr *err);
/* The same for a text file parsed as a C string: one holding a NUL byte is refused, not cut short. */
int zy_read_text_file(const char *path, char **text, ZyErr *err);
/* Writes all len bytes to fd, retrying short writes and EINTR; -1 with errno set on failure. */
int zy_write_all(int fd, const void *data, size_t len);
/* Writes data to path via a temporary file + fsync + rename, so a reader never sees a half-written file. */
int zy_write_file_atomic(const char *path, const void *data, size_t len, ZyErr *err);
/* rm -rf (symbolic links removed, not followed); -1 if something could not be removed */
int zy_remove_tree(const char *path);
/* mkdir -p */
int zy_mkdirs(const char *path, ZyErr *err);
/* Joins dir and name into out (size cap); returns -1 if it does not fit. */
int zy_path_join(char *out, size_t cap, const char *dir, const char *name, ZyErr *err);

/* Deterministic RNG (xoshiro256**, seeded by splitmix64): identical streams on every platform. */
typedef struct {
    uint64_t s[4];
} ZyRng;
void zy_rng_seed(ZyRng *rng, uint64_t seed);
uint64_t zy_rng_next(ZyRng *rng);
double zy_rng_uniform(ZyRng *rng);              /* [0, 1) */
double zy_rng_normal(ZyRng *rng);               /* standard normal (Box-Muller, no cached spare) */
double zy_normal_of(double u1, double u2);       /* zy_rng_normal's transform of its two uniforms */
/* splitmix64: advances *x and returns its next well-mixed 64-bit value (the RNG's seeding; a hash step). */
uint64_t zy_splitmix64(uint64_t *x);

/* Element types of tensors in files (safetensors, npy) and in memory. */
typedef enum {
    ZY_DT_F64, ZY_DT_F32, ZY_DT_F16, ZY_DT_BF16,
    ZY_DT_I64, ZY_DT_I32, ZY_DT_I16, ZY_DT_I8,
    ZY_DT_U64, ZY_DT_U32, ZY_DT_U16, ZY_DT_U8, ZY_DT_BOOL,
    ZY_DT_COUNT
} ZyDtype;
size_t zy_dtype_size(ZyDtype dt);
const char *zy_dtype_name(ZyDtype dt); /* safetensors spelling: "F32", "BF16", ... */

#define ZY_MAX_DIMS 8

/* bf16/f16 <-> f32 conversions (bf16 rounding: nearest-even, NaN kept quiet). */
/* Gives the whole pages inside [p, p + bytes) back to the system: in a heap block they read as zero if touched
 * again (the block stays allocated and is freed as usual: for memory nothing will read any more); in a read-only
 * file mapping they are read from the file again. */
void zy_release_pages(void *p, size_t bytes);
static inline float zy_bf16_to_f32(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static inline uint16_t zy_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline float zy_round_bf16(float f) { return zy_bf16_to_f32(zy_f32_to_bf16(f)); }
float zy_f16_to_f32(uint16_t h);

/* CRC-32 as zlib's crc32() computes it (zy_crc32(0, data, len) of a whole file is its manifest checksum), at memory
 * speed where the CPU has carry-less multiplies (crc32.c); combine: the CRC of A followed by B (len2 bytes). */
uint32_t zy_crc32(uint32_t crc, const void *data, size_t len);
/* The same while copying the bytes to dst (one pass over them). */
uint32_t zy_crc32_copy(uint32_t crc, void *dst, const void *src, size_t len);
uint32_t zy_crc32_combine(uint32_t crc1, uint32_t crc2, uint64_t len2);

double zy_now_seconds(void);
/* qsort's comparison of two doubles (ascending), and the median of x[0..n-1] (n >= 1; sorts x in place, so its
 * percentiles can be read after): the benchmarks' timings. */
int zy_cmp_double(const void *a, const void *b);
double zy_median(double *x, long n);

/* Carving one allocation into named buffers: a sizing pass with base = NULL counts the bytes, then a pass over
 * the allocated block hands out 64-byte-aligned pointers in the same order. */
typedef struct {
    char *base;
    size_t used;
} ZyCarver;
void *zy_carve(ZyCarver *c, size_t n_elems, size_t elem_size);
#define ZY_CARVE_F(c, n) ((float *)zy_carve((c), (size_t)(n), sizeof(float)))
#define ZY_CARVE_I(c, n) ((int32_t *)zy_carve((c), (size_t)(n), sizeof(int32_t)))

#define ZY_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* The most memory this process has held resident (/proc/self/status VmHWM, mapped file pages it touched included),
 * and what the system could give it now (/proc/meminfo MemAvailable), in bytes; 0 where unreadable. */
double zy_peak_resident_bytes(void);
double zy_available_memory_bytes(void);

#endif

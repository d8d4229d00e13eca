#define _POSIX_C_SOURCE 200809L
#include "util/util.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int zy_fail(ZyErr *err, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return -1;
}

int zy_wrap(ZyErr *err, const char *fmt, ...) {
    if (err) {
        char prefix[512], old[sizeof err->msg];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(prefix, sizeof prefix, fmt, ap);
        va_end(ap);
        memcpy(old, err->msg, sizeof old);
        size_t n = strlen(prefix);
        if (n > sizeof err->msg - 3) n = sizeof err->msg - 3;
        memcpy(err->msg, prefix, n);
        err->msg[n] = ':';
        err->msg[n + 1] = ' ';
        size_t room = sizeof err->msg - n - 3;
        size_t m = strnlen(old, sizeof old);
        if (m > room) m = room;
        memcpy(err->msg + n + 2, old, m);
        err->msg[n + 2 + m] = '\0';
    }
    return -1;
}

void *zy_calloc(size_t n_bytes) {
    size_t rounded = (n_bytes + 63) & ~(size_t)63;
    if (rounded < n_bytes) return NULL;
    if (rounded == 0) rounded = 64;
    void *p = aligned_alloc(64, rounded);
    if (!p) return NULL;
    /* A large block is zeroed lazily: its partial pages at both ends by hand, the whole pages in between handed
     * back to the system, which maps them as zeros on first touch. Parts of an arena nothing writes (a gradient
     * arena in inference, weights loaded straight into bf16) then never become resident. */
    const long page = sysconf(_SC_PAGESIZE);
    if (page > 0 && rounded >= (size_t)page * 16) {
        const uintptr_t mask = (uintptr_t)page - 1, start = (uintptr_t)p, stop = start + rounded;
        const uintptr_t begin = (start + mask) & ~mask, end = stop & ~mask;
        memset(p, 0, begin - start);
        memset((void *)end, 0, stop - end);
        if (madvise((void *)begin, end - begin, MADV_DONTNEED) != 0) memset((void *)begin, 0, end - begin);
    } else {
        memset(p, 0, rounded);
    }
    return p;
}

void *zy_calloc_resident(size_t n_bytes) {
    size_t rounded = (n_bytes + 63) & ~(size_t)63;
    if (rounded < n_bytes) return NULL;
    if (rounded == 0) rounded = 64;
    void *p = aligned_alloc(64, rounded);
    if (p) memset(p, 0, rounded);
    return p;
}

void zy_free(void *p) { free(p); }

void zy_release_pages(void *p, size_t bytes) {
    const long page = sysconf(_SC_PAGESIZE);
    if (page <= 0 || bytes == 0) return;
    const uintptr_t mask = (uintptr_t)page - 1, begin = ((uintptr_t)p + mask) & ~mask;
    const uintptr_t end = ((uintptr_t)p + bytes) & ~mask;
    if (end > begin) madvise((void *)begin, end - begin, MADV_DONTNEED); /* advice: failure only keeps the pages */
}

int zy_mul_size(size_t a, size_t b, size_t *out) {
    if (a != 0 && b > SIZE_MAX / a) return -1;
    *out = a * b;
    return 0;
}

int zy_str_append(char **s, size_t *len, size_t *cap, const char *add, size_t n) {
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap : 64;
        while (*len + n + 1 > c) c *= 2;
        char *g = realloc(*s, c);
        if (!g) return -1;
        *s = g;
        *cap = c;
    }
    if (n) memcpy(*s + *len, add, n);
    *len += n;
    (*s)[*len] = 0;
    return 0;
}

int zy_read_file(const char *path, char **data, size_t *len, ZyErr *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return zy_fail(err, "%s: cannot open: %s", path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        return zy_fail(err, "%s: cannot seek: %s", path, strerror(errno));
    }
    long size = ftell(f);
    if (size < 0) {
        fclose(f);
        return zy_fail(err, "%s: cannot tell size: %s", path, strerror(errno));
    }
    rewind(f);
    char *buf = malloc((size_t)size + 1);
    if (!buf) {
        fclose(f);
        return zy_fail(err, "%s: out of memory (%ld bytes)", path, size);
    }
    size_t got = fread(buf, 1, (size_t)size, f);
    fclose(f);
    if (got != (size_t)size) {
        free(buf);
        return zy_fail(err, "%s: short read (%zu of %ld bytes)", path, got, size);
    }
    buf[size] = '\0';
    *data = buf;
    *len = (size_t)size;
    return 0;
}

int zy_read_text_file(const char *path, char **text, ZyErr *err) {
    size_t len;
    if (zy_read_file(path, text, &len, err)) return -1;
    if (strlen(*text) != len) {
        free(*text);
        *text = NULL;
        return zy_fail(err, "%s: file contains a NUL byte", path);
    }
    return 0;
}

int zy_write_all(int fd, const void *data, size_t len) {
    const char *p = data;
    while (len > 0) {
        ssize_t w = write(fd, p, len);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

int zy_write_file_atomic(const char *path, const void *data, size_t len, ZyErr *err) {
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp)
        return zy_fail(err, "%s: path too long", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return zy_fail(err, "%s: cannot create: %s", tmp, strerror(errno));
    if (zy_write_all(fd, data, len) != 0) {
        int e = errno;
        close(fd);
        unlink(tmp);
        return zy_fail(err, "%s: write failed: %s", tmp, strerror(e));
    }
    if (fsync(fd) != 0 || close(fd) != 0) {
        int e = errno;
        unlink(tmp);
        return zy_fail(err, "%s: fsync/close failed: %s", tmp, strerror(e));
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return zy_fail(err, "%s: rename failed: %s", path, strerror(e));
    }
    return 0;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

int zy_remove_tree(const char *path) { return nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

int zy_mkdirs(const char *path, ZyErr *err) {
    char buf[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf) return zy_fail(err, "invalid directory path '%s'", path);
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] == '/' || buf[i] == '\0') {
            char c = buf[i];
            buf[i] = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                return zy_fail(err, "%s: cannot create directory: %s", buf, strerror(errno));
            buf[i] = c;
        }
    }
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) return zy_fail(err, "%s: not a directory", path);
    return 0;
}

int zy_path_join(char *out, size_t cap, const char *dir, const char *name, ZyErr *err) {
    int n = snprintf(out, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap) return zy_fail(err, "path too long: %s/%s", dir, name);
    return 0;
}

uint64_t zy_splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void zy_rng_seed(ZyRng *rng, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) rng->s[i] = zy_splitmix64(&x);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t zy_rng_next(ZyRng *rng) {
    uint64_t *s = rng->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double zy_rng_uniform(ZyRng *rng) { return (double)(zy_rng_next(rng) >> 11) * (1.0 / 9007199254740992.0); }

double zy_normal_of(double u1, double u2) {
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

double zy_rng_normal(ZyRng *rng) {
    const double u1 = zy_rng_uniform(rng), u2 = zy_rng_uniform(rng);
    return zy_normal_of(u1, u2);
}

float zy_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        if (mant == 0) {
            u = sign;
        } else { /* subnormal: renormalise */
            exp = 127 - 15 + 1;
            while (!(mant & 0x400u)) {
                mant <<= 1;
                exp--;
            }
            mant &= 0x3ffu;
            u = sign | (exp << 23) | (mant << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (mant << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

double zy_now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int zy_cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double zy_median(double *x, long n) {
    qsort(x, (size_t)n, sizeof *x, zy_cmp_double);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

static const struct {
    const char *name;
    size_t size;
} dtype_info[ZY_DT_COUNT] = {
    [ZY_DT_F64] = {"F64", 8}, [ZY_DT_F32] = {"F32", 4},  [ZY_DT_F16] = {"F16", 2},  [ZY_DT_BF16] = {"BF16", 2},
    [ZY_DT_I64] = {"I64", 8}, [ZY_DT_I32] = {"I32", 4},  [ZY_DT_I16] = {"I16", 2},  [ZY_DT_I8] = {"I8", 1},
    [ZY_DT_U64] = {"U64", 8}, [ZY_DT_U32] = {"U32", 4},  [ZY_DT_U16] = {"U16", 2},  [ZY_DT_U8] = {"U8", 1},
    [ZY_DT_BOOL] = {"BOOL", 1},
};

size_t zy_dtype_size(ZyDtype dt) { return (unsigned)dt < ZY_DT_COUNT ? dtype_info[dt].size : 0; }
const char *zy_dtype_name(ZyDtype dt) { return (unsigned)dt < ZY_DT_COUNT ? dtype_info[dt].name : "?"; }

void *zy_carve(ZyCarver *c, size_t n_elems, size_t elem_size) {
    size_t bytes = (n_elems * elem_size + 63) & ~(size_t)63;
    void *p = c->base ? c->base + c->used : NULL;
    c->used += bytes;
    return p;
}

/* A "Key: N kB" line of a /proc file, in bytes (0 where absent). */
static double proc_kb(const char *path, const char *format) {
    FILE *f = fopen(path, "r");
    char line[256];
    double kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, format, &kb) == 1) break;
    if (f) fclose(f);
    return kb * 1024;
}

double zy_peak_resident_bytes(void) { return proc_kb("/proc/self/status", "VmHWM: %lf kB"); }
double zy_available_memory_bytes(void) { return proc_kb("/proc/meminfo", "MemAvailable: %lf kB"); }

#include "io/ckpt_io.h"

#include <errno.h>
#include <fcntl.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

enum { ALIGN = 4096 };               /* O_DIRECT: offsets, lengths and buffers on the device's block boundaries */
#define IMAGE_ROUND ((size_t)2 << 20) /* images come in huge-page multiples */

static CkptIoConfig config = {.direct = 1, .threads = 8, .chunk_bytes = (size_t)8 << 20};

CkptIoConfig ckpt_io_config(void) { return config; }

void ckpt_io_configure(const CkptIoConfig *c) {
    config = *c;
    if (config.threads < 1) config.threads = 1;
    if (config.chunk_bytes < ALIGN) config.chunk_bytes = ALIGN;
    config.chunk_bytes -= config.chunk_bytes % ALIGN;
}

static size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

/* ---- images and the snapshot copy ----------------------------------------------------------------------- */

int ckpt_image_reserve(CkptImage *im, size_t len, ZyErr *err) {
    const size_t need = round_up(len > 0 ? len : 1, IMAGE_ROUND);
    if (im->cap >= need) return 0;
    ckpt_image_free(im);
    void *p = mmap(NULL, need, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return zy_fail(err, "out of memory for a %.1f MB checkpoint buffer", need / 1e6);
    madvise(p, need, MADV_HUGEPAGE); /* fewer faults, and O_DIRECT requests sent whole (jobs_worker); a hint only */
    /* every page faulted in now, by the threads that will copy into it, not at the first checkpoint's stall */
    const long blocks = (long)(need / IMAGE_ROUND);
#pragma omp parallel for schedule(static)
    for (long b = 0; b < blocks; b++) memset((uint8_t *)p + (size_t)b * IMAGE_ROUND, 0, IMAGE_ROUND);
    im->data = p;
    im->cap = need;
    return 0;
}

void ckpt_image_free(CkptImage *im) {
    if (im->data) munmap(im->data, im->cap);
    im->data = NULL;
    im->cap = 0;
}

#if defined(__SSE2__)
#include <immintrin.h>
/* memcpy whose stores bypass the caches: the image is not read again soon, and ordinary stores would first read
 * every destination line in (a third memory pass). */
static void copy_streaming(uint8_t *dst, const uint8_t *src, size_t len) {
    const size_t head = (16 - ((uintptr_t)dst & 15)) & 15;
    if (len < 256 || head >= len) {
        memcpy(dst, src, len);
        return;
    }
    memcpy(dst, src, head);
    dst += head, src += head, len -= head;
    size_t i = 0;
    for (; i + 64 <= len; i += 64) {
        const __m128i a = _mm_loadu_si128((const __m128i *)(src + i)), b = _mm_loadu_si128((const __m128i *)(src + i + 16));
        const __m128i c = _mm_loadu_si128((const __m128i *)(src + i + 32)), d = _mm_loadu_si128((const __m128i *)(src + i + 48));
        _mm_stream_si128((__m128i *)(dst + i), a);
        _mm_stream_si128((__m128i *)(dst + i + 16), b);
        _mm_stream_si128((__m128i *)(dst + i + 32), c);
        _mm_stream_si128((__m128i *)(dst + i + 48), d);
    }
    memcpy(dst + i, src + i, len - i);
}
#define STORE_FENCE() _mm_sfence()
#else
#define copy_streaming memcpy
#define STORE_FENCE() ((void)0)
#endif

void ckpt_copy_all(const CkptCopy *pieces, int n) {
    size_t total = 0;
    for (int i = 0; i < n; i++) total += pieces[i].len;
#pragma omp parallel
    {
        /* this thread's share of the pieces laid end to end, cut on page boundaries */
        const size_t t = (size_t)omp_get_thread_num(), nt = (size_t)omp_get_num_threads();
        const size_t lo = t == 0 ? 0 : total / nt * t / ALIGN * ALIGN, hi = t + 1 == nt ? total : total / nt * (t + 1) / ALIGN * ALIGN;
        size_t at = 0; /* where piece i starts in the concatenation */
        for (int i = 0; i < n && at < hi; at += pieces[i].len, i++) {
            const size_t a = lo > at ? lo - at : 0, b = hi - at < pieces[i].len ? hi - at : pieces[i].len;
            if (a < b) copy_streaming((uint8_t *)pieces[i].dst + a, (const uint8_t *)pieces[i].src + a, b - a);
        }
        STORE_FENCE(); /* the streamed stores are seen by the writer thread that reads the image next */
    }
}

/* ---- a few threads over numbered jobs ---------------------------------------------------------------------- */

typedef struct Jobs Jobs;
struct Jobs {
    long n;
    atomic_long next;
    atomic_int failed;
    size_t bounce_bytes; /* an aligned scratch buffer per thread (0: none) */
    int (*run)(Jobs *j, long job, uint8_t *bounce, ZyErr *err);
    void *ctx;
    pthread_mutex_t mu;
    ZyErr err; /* the first failure */
    pthread_t tid[64];
    int started;
};

static void *jobs_worker(void *arg) {
    Jobs *j = arg;
    uint8_t *bounce = NULL;
    ZyErr err;
    int rc = 0;
    /* in huge pages: a request's memory is then a few physically contiguous segments, so the block layer sends it
     * whole (up to the device's max_sectors_kb) instead of cutting it at the device's segment count (a virtio disk
     * takes 254: ~1 MiB of 4 KiB pages); on the VM measured that doubled O_DIRECT reads */
    if (j->bounce_bytes && posix_memalign((void **)&bounce, IMAGE_ROUND, round_up(j->bounce_bytes, IMAGE_ROUND)) != 0)
        rc = zy_fail(&err, "out of memory for a %.0f MB I/O buffer", j->bounce_bytes / 1e6);
    else if (bounce)
        madvise(bounce, round_up(j->bounce_bytes, IMAGE_ROUND), MADV_HUGEPAGE);
    while (!rc && !atomic_load(&j->failed)) {
        const long k = atomic_fetch_add(&j->next, 1);
        if (k >= j->n) break;
        rc = j->run(j, k, bounce, &err);
    }
    if (rc) {
        pthread_mutex_lock(&j->mu);
        if (!atomic_exchange(&j->failed, 1)) j->err = err;
        pthread_mutex_unlock(&j->mu);
    }
    free(bounce);
    return NULL;
}

/* Starts up to `threads` threads on the jobs and returns; jobs_wait joins them. */
static void jobs_start(Jobs *j, int threads) {
    atomic_init(&j->next, 0);
    atomic_init(&j->failed, 0);
    pthread_mutex_init(&j->mu, NULL);
    if (threads > j->n) threads = (int)j->n;
    for (j->started = 0; j->started < threads && j->started < 64; j->started++)
        if (pthread_create(&j->tid[j->started], NULL, jobs_worker, j) != 0) break; /* fewer threads: still correct */
}

/* Joins the threads, the caller working too if `help` (or if no thread started); the first failure stops the
 * rest. */
static int jobs_wait(Jobs *j, int help, ZyErr *err) {
    if (help || j->started == 0) jobs_worker(j);
    for (int i = 0; i < j->started; i++) pthread_join(j->tid[i], NULL);
    pthread_mutex_destroy(&j->mu);
    if (atomic_load(&j->failed)) {
        *err = j->err;
        return -1;
    }
    return 0;
}

/* Every job on up to `threads` threads, the caller's among them. */
static int jobs_run(Jobs *j, int threads, ZyErr *err) {
    jobs_start(j, threads - 1);
    return jobs_wait(j, 1, err);
}

static int pwrite_all(int fd, const uint8_t *p, size_t len, uint64_t off) {
    while (len > 0) {
        ssize_t k = pwrite(fd, p, len, (off_t)off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        p += k, len -= (size_t)k, off += (uint64_t)k;
    }
    return 0;
}

/* Reads at least `need` bytes (up to len) at off; -1 with errno, or 0 with *got set. */
static int pread_at_least(int fd, uint8_t *p, size_t len, size_t need, uint64_t off, size_t *got) {
    *got = 0;
    while (*got < need) {
        ssize_t k = pread(fd, p + *got, len - *got, (off_t)(off + *got));
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return -1;
        if (k == 0) {
            errno = 0; /* end of file before `need` */
            return -1;
        }
        *got += (size_t)k;
    }
    return 0;
}

/* ---- writes ---------------------------------------------------------------------------------------------- */

typedef struct {
    CkptFileOut *files;
    int n;
    int *fd_direct, *fd_plain; /* fd_direct -1: the file system refused O_DIRECT */
    atomic_int *padded;        /* a file's last chunk went out rounded up to ALIGN: truncate after */
    char (*tmp)[4200];
    long *first; /* [n + 1]: the first chunk job of each file */
    uint32_t *crc;
    size_t chunk;
} Writes;

static int write_chunk(Jobs *j, long k, uint8_t *bounce, ZyErr *err) {
    (void)bounce;
    Writes *w = j->ctx;
    int f = 0;
    while (k >= w->first[f + 1]) f++;
    const CkptFileOut *o = &w->files[f];
    const uint64_t off = (uint64_t)(k - w->first[f]) * w->chunk;
    const size_t len = o->len - off < w->chunk ? (size_t)(o->len - off) : w->chunk;
    w->crc[k] = zy_crc32(0, o->data + off, len); /* from memory, before the bytes leave */
    if (w->fd_direct[f] >= 0) {
        const size_t padded = round_up(len, ALIGN);
        if (pwrite_all(w->fd_direct[f], o->data + off, padded, off) == 0) {
            if (padded != len) atomic_store(&w->padded[f], 1);
            return 0;
        }
        if (errno != EINVAL) return zy_fail(err, "%s: write failed: %s", w->tmp[f], strerror(errno));
        /* EINVAL: this file system takes O_DIRECT opens but not these requests; the page cache it is */
    }
    if (pwrite_all(w->fd_plain[f], o->data + off, len, off) != 0)
        return zy_fail(err, "%s: write failed: %s", w->tmp[f], strerror(errno));
    return 0;
}

static void fsync_parent(const char *path) {
    char dir[4200];
    const char *slash = strrchr(path, '/');
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash == path ? 1 : slash - path) : 1, slash ? path : ".");
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

int ckpt_write_files(CkptFileOut *files, int n, ZyErr *err) {
    Writes w = {.files = files, .n = n, .chunk = config.chunk_bytes};
    w.fd_direct = malloc((size_t)n * sizeof *w.fd_direct);
    w.fd_plain = malloc((size_t)n * sizeof *w.fd_plain);
    w.padded = calloc((size_t)n, sizeof *w.padded);
    w.tmp = malloc((size_t)n * sizeof *w.tmp);
    w.first = malloc((size_t)(n + 1) * sizeof *w.first);
    int rc = 0, opened = 0;
    if (!w.fd_direct || !w.fd_plain || !w.padded || !w.tmp || !w.first) rc = zy_fail(err, "out of memory");
    else w.first[0] = 0;
    for (int f = 0; !rc && f < n; f++, opened++) {
        snprintf(w.tmp[f], sizeof w.tmp[f], "%s.tmp.%ld", files[f].path, (long)getpid());
        w.fd_plain[f] = open(w.tmp[f], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (w.fd_plain[f] < 0) {
            rc = zy_fail(err, "%s: cannot create: %s", w.tmp[f], strerror(errno));
            break;
        }
        w.fd_direct[f] = config.direct ? open(w.tmp[f], O_WRONLY | O_DIRECT | O_CLOEXEC) : -1;
        /* the whole file's blocks at once: one contiguous run instead of 8 MiB pieces in the order the threads
         * happened to write them, interleaved with the other files' (reads of such a file ran at half speed, and
         * the writes faster); a file system without fallocate just allocates as it goes */
        if (files[f].len > 0) fallocate(w.fd_plain[f], 0, 0, (off_t)files[f].len); /* not posix_: no emulation */
        w.first[f + 1] = w.first[f] + (long)((files[f].len + w.chunk - 1) / w.chunk);
    }
    if (!rc) {
        w.crc = malloc((size_t)(w.first[n] > 0 ? w.first[n] : 1) * sizeof *w.crc);
        if (!w.crc) rc = zy_fail(err, "out of memory");
    }
    if (!rc) {
        Jobs j = {.n = w.first[n], .run = write_chunk, .ctx = &w};
        rc = jobs_run(&j, config.threads, err);
    }
    for (int f = 0; !rc && f < n; f++) {
        if (atomic_load(&w.padded[f]) && ftruncate(w.fd_plain[f], (off_t)files[f].len) != 0)
            rc = zy_fail(err, "%s: truncate failed: %s", w.tmp[f], strerror(errno));
        else if (fsync(w.fd_plain[f]) != 0)
            rc = zy_fail(err, "%s: fsync failed: %s", w.tmp[f], strerror(errno));
        uint32_t crc = 0;
        for (long k = w.first[f]; k < w.first[f + 1]; k++) {
            const size_t len = k + 1 < w.first[f + 1] ? w.chunk : files[f].len - (size_t)(k - w.first[f]) * w.chunk;
            crc = zy_crc32_combine(crc, w.crc[k], len);
        }
        files[f].crc = crc;
    }
    for (int f = 0; f < opened; f++) {
        if (w.fd_direct[f] >= 0) close(w.fd_direct[f]);
        if (close(w.fd_plain[f]) != 0 && !rc) rc = zy_fail(err, "%s: close failed: %s", w.tmp[f], strerror(errno));
    }
    for (int f = 0; !rc && f < n; f++)
        if (rename(w.tmp[f], files[f].path) != 0) rc = zy_fail(err, "%s: rename failed: %s", files[f].path, strerror(errno));
    if (rc)
        for (int f = 0; f < opened; f++) unlink(w.tmp[f]); /* the renamed ones are gone from there already */
    for (int f = 0; !rc && f < n; f++) fsync_parent(files[f].path); /* the renames, durable */
    free(w.fd_direct), free(w.fd_plain), free(w.padded), free(w.tmp), free(w.first), free(w.crc);
    return rc;
}

/* ---- reads ----------------------------------------------------------------------------------------------- */

typedef struct {
    CkptFileIn *files;
    int n;
    int *fd_direct, *fd_plain;
    long *first_chunk; /* [n]: the chunk holding lo (chunk k: [k * chunk, (k + 1) * chunk) of the file) */
    long *first;       /* [n + 1]: the first job of each file */
    uint32_t *crc;     /* per job: the CRC of its part of [lo, hi) */
    size_t chunk;
} Reads;

/* Job k: its file, and its part [*a, *b) of the file's [lo, hi). */
static int read_job(const Reads *r, long k, uint64_t *a, uint64_t *b) {
    int f = 0;
    while (k >= r->first[f + 1]) f++;
    const CkptFileIn *in = &r->files[f];
    *a = (uint64_t)(r->first_chunk[f] + k - r->first[f]) * r->chunk, *b = *a + r->chunk;
    if (*a < in->lo) *a = in->lo;
    if (*b > in->hi) *b = in->hi;
    return f;
}

static int read_chunk(Jobs *j, long k, uint8_t *bounce, ZyErr *err) {
    Reads *r = j->ctx;
    uint64_t c0, b;
    const int f = read_job(r, k, &c0, &b);
    const CkptFileIn *in = &r->files[f];
    const uint64_t a = c0 / ALIGN * ALIGN; /* the read starts on the block boundary before the part */
    const size_t need = (size_t)(b - a);
    size_t got;
    int rc = -1;
    if (r->fd_direct[f] >= 0) rc = pread_at_least(r->fd_direct[f], bounce, round_up(need, ALIGN), need, a, &got);
    if (rc && (r->fd_direct[f] < 0 || errno == EINVAL)) /* no O_DIRECT here, or not for this request */
        rc = pread_at_least(r->fd_plain[f], bounce, need, need, a, &got);
    if (rc)
        return errno ? zy_fail(err, "%s: read failed: %s", in->path, strerror(errno))
                     : zy_fail(err, "%s: ends before byte %llu", in->path, (unsigned long long)b);
    /* one pass: the bytes between spans checksummed, the spans' checksummed as they are copied out */
    long s = 0, e = in->n_spans; /* the first span that ends after c0 */
    while (s < e) {
        long m = (s + e) / 2;
        if (in->spans[m].offset + in->spans[m].len <= c0) s = m + 1;
        else e = m;
    }
    uint32_t crc = 0;
    uint64_t at = c0;
    for (; s < in->n_spans && in->spans[s].offset < b; s++) {
        const CkptSpan *sp = &in->spans[s];
        const uint64_t x = sp->offset > at ? sp->offset : at, y = sp->offset + sp->len < b ? sp->offset + sp->len : b;
        crc = zy_crc32(crc, bounce + (at - a), (size_t)(x - at));
        crc = zy_crc32_copy(crc, (uint8_t *)sp->dst + (x - sp->offset), bounce + (x - a), (size_t)(y - x));
        at = y;
    }
    r->crc[k] = zy_crc32(crc, bounce + (at - a), (size_t)(b - at));
    return 0;
}

struct CkptReads {
    Reads r;
    Jobs j;
};

static void reads_free(CkptReads *h) {
    for (int f = 0; f < h->r.n; f++) {
        if (h->r.fd_direct[f] >= 0) close(h->r.fd_direct[f]);
        if (h->r.fd_plain[f] >= 0) close(h->r.fd_plain[f]);
    }
    free(h->r.fd_direct), free(h->r.fd_plain), free(h->r.first_chunk), free(h->r.first), free(h->r.crc);
    free(h);
}

/* Opens the files and lays out the chunks (the jobs); NULL on failure. */
static CkptReads *reads_open(CkptFileIn *files, int n, ZyErr *err) {
    CkptReads *h = calloc(1, sizeof *h);
    Reads *r = h ? &h->r : NULL;
    if (r) {
        *r = (Reads){.files = files, .n = 0, .chunk = config.chunk_bytes};
        r->fd_direct = malloc((size_t)(n + 1) * sizeof *r->fd_direct);
        r->fd_plain = malloc((size_t)(n + 1) * sizeof *r->fd_plain);
        r->first_chunk = malloc((size_t)(n + 1) * sizeof *r->first_chunk);
        r->first = malloc((size_t)(n + 1) * sizeof *r->first);
    }
    if (!h || !r->fd_direct || !r->fd_plain || !r->first_chunk || !r->first) {
        if (h) reads_free(h);
        zy_fail(err, "out of memory");
        return NULL;
    }
    r->first[0] = 0;
    for (int f = 0; f < n; f++, r->n++) {
        CkptFileIn *in = &files[f];
        in->crc = 0;
        r->fd_direct[f] = -1;
        r->fd_plain[f] = open(in->path, O_RDONLY | O_CLOEXEC);
        if (r->fd_plain[f] < 0) {
            zy_fail(err, "%s: cannot open: %s", in->path, strerror(errno));
            reads_free(h);
            return NULL;
        }
        if (config.direct) r->fd_direct[f] = open(in->path, O_RDONLY | O_DIRECT | O_CLOEXEC);
        if (r->fd_direct[f] < 0) posix_fadvise(r->fd_plain[f], (off_t)in->lo, (off_t)(in->hi - in->lo), POSIX_FADV_SEQUENTIAL);
        /* chunks on multiples of their size, as a dd of the file would read them */
        r->first_chunk[f] = (long)(in->lo / r->chunk);
        r->first[f + 1] = r->first[f] + (in->hi > in->lo ? (long)((in->hi - 1) / r->chunk) + 1 - r->first_chunk[f] : 0);
    }
    if (!(r->crc = malloc((size_t)(r->first[n] > 0 ? r->first[n] : 1) * sizeof *r->crc))) {
        zy_fail(err, "out of memory");
        reads_free(h);
        return NULL;
    }
    h->j = (Jobs){.n = r->first[n], .run = read_chunk, .ctx = r, .bounce_bytes = r->chunk};
    return h;
}

/* Joins the readers (the caller helping if `help`), combines each file's CRC, frees h. */
static int reads_finish(CkptReads *h, int help, ZyErr *err) {
    int rc = jobs_wait(&h->j, help, err);
    for (long k = 0; !rc && k < h->r.first[h->r.n]; k++) {
        uint64_t a, b;
        const int f = read_job(&h->r, k, &a, &b);
        h->r.files[f].crc = zy_crc32_combine(h->r.files[f].crc, h->r.crc[k], b - a);
    }
    reads_free(h);
    return rc;
}

int ckpt_read_files(CkptFileIn *files, int n, ZyErr *err) {
    CkptReads *h = reads_open(files, n, err);
    if (!h) return -1;
    jobs_start(&h->j, config.threads - 1); /* every file's chunks in one queue: no draining between files */
    return reads_finish(h, 1, err);
}

int ckpt_read_files_start(CkptReads **out, CkptFileIn *files, int n, ZyErr *err) {
    if (!(*out = reads_open(files, n, err))) return -1;
    jobs_start(&(*out)->j, config.threads);
    return 0;
}

int ckpt_read_files_wait(CkptReads *h, ZyErr *err) { return reads_finish(h, 0, err); }

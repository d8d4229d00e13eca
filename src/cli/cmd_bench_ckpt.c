/* zaya bench ckpt: how fast checkpoints are, against what the machine itself does, in one run. The model and
 * optimizer state of a config (ZeRO-1 blocks under mpirun, as `zaya train` lays them out; no training) go through
 * the trainer's own checkpoint path: the snapshot stall (ckpt_save_async), the background write to the publish
 * (ckpt_wait), and the restore (ckpt_load, every file checked) from a cold page cache. Each round also times a
 * multi-threaded memcpy of the snapshot's bytes and the disk (dd-like writes with fdatasync and reads, through the
 * page cache and with O_DIRECT, on a file of the checkpoint's size in the same directory). Medians over the rounds,
 * the slowest rank's time; rank 0 prints. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "args.h"
#include "commands.h"
#include "dist/distributed.h"
#include "io/checkpoint.h"
#include "io/ckpt_io.h"
#include "model/config.h"
#include "model/model.h"
#include "optim/optim.h"

enum { DISK_BUFFERED, DISK_DIRECT_1, DISK_DIRECT_N, DISK_METHODS };
static const char *const disk_method_name[DISK_METHODS] = {"page cache + fdatasync, 1 thread (dd conv=fdatasync)",
                                                           "O_DIRECT, 1 thread (dd oflag=direct)",
                                                           "O_DIRECT, the writer's threads"};
static const char *const disk_method_key[DISK_METHODS] = {"buffered", "direct_1", "direct_threads"};

/* The slowest rank's seconds. */
static double slowest(const Dist *d, double s) {
    int64_t ns = (int64_t)(s * 1e9);
    ZyErr ignore;
    dist_allreduce_max_i64(d, &ns, 1, &ignore);
    return ns / 1e9;
}

/* The processor as lscpu names it: model name, family, model. */
static void cpu_name(char *out, size_t cap) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512], name[256] = "unknown CPU";
    int family = -1, model = -1;
    while (f && fgets(line, sizeof line, f)) {
        char *v = strchr(line, ':');
        if (!v) continue;
        v += v[1] == ' ' ? 2 : 1;
        v[strcspn(v, "\n")] = '\0';
        if (strncmp(line, "model name", 10) == 0) snprintf(name, sizeof name, "%s", v);
        else if (strncmp(line, "cpu family", 10) == 0 && family < 0) family = atoi(v);
        else if (strncmp(line, "model\t", 6) == 0 && model < 0) model = atoi(v);
    }
    if (f) fclose(f);
    snprintf(out, cap, "%s (family %d model %d), %ld CPUs", name, family, model, sysconf(_SC_NPROCESSORS_ONLN));
}

/* The mount holding path: its device and file system type. */
static void mount_of(const char *path, char *out, size_t cap) {
    FILE *f = fopen("/proc/self/mounts", "r");
    char dev[512], mnt[1024], type[64], best[1700] = "unknown file system";
    size_t best_len = 0;
    while (f && fscanf(f, "%511s %1023s %63s %*[^\n]", dev, mnt, type) == 3) {
        size_t n = strlen(mnt);
        if (strncmp(path, mnt, n) == 0 && (n == 1 || path[n] == '/' || path[n] == '\0') && n >= best_len) {
            best_len = n;
            snprintf(best, sizeof best, "%s on %s (%s)", mnt, dev, type);
        }
    }
    if (f) fclose(f);
    snprintf(out, cap, "%s", best);
}

/* ---- the machine's own bandwidths ------------------------------------------------------------------------- */

/* Writes `bytes` of buf (an image: aligned, padded) to path as the method does, fdatasync'd, or reads them back
 * cold (the file's pages dropped first); seconds, or -1. */
static double disk_pass(const char *path, uint8_t *buf, size_t bytes, int method, int threads, size_t chunk, int write) {
    const int direct = method != DISK_BUFFERED;
    int fd = open(path, (write ? O_WRONLY | O_CREAT | O_TRUNC : O_RDONLY) | (direct ? O_DIRECT : 0), 0644);
    if (fd < 0) return -1;
    if (!write) posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    const long n = (long)((bytes + chunk - 1) / chunk);
    int bad = 0;
    const double t0 = zy_now_seconds();
#pragma omp parallel for schedule(dynamic, 1) num_threads(method == DISK_DIRECT_N ? threads : 1) reduction(| : bad)
    for (long k = 0; k < n; k++) {
        const size_t off = (size_t)k * chunk, len = bytes - off < chunk ? bytes - off : chunk;
        const size_t io = direct ? (len + 4095) / 4096 * 4096 : len; /* O_DIRECT: whole blocks, like dd */
        const ssize_t got = write ? pwrite(fd, buf + off, io, (off_t)off) : pread(fd, buf + off, io, (off_t)off);
        bad |= got < (ssize_t)len;
    }
    if (write) bad |= fdatasync(fd) != 0;
    const double t = zy_now_seconds() - t0;
    close(fd);
    return bad ? -1 : t;
}

/* Drops the page cache of every file in dir (posix_fadvise DONTNEED: they were fsynced) and returns the fraction
 * of their pages still resident after it (mincore), or -1 if it cannot tell. */
static double drop_pages(const char *dir) {
    DIR *dh = opendir(dir);
    if (!dh) return -1;
    const long page = sysconf(_SC_PAGESIZE);
    double resident = 0, pages = 0;
    int unknown = 0;
    struct dirent *e;
    while ((e = readdir(dh))) {
        char path[4400];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size == 0) continue;
        int fd = open(path, O_RDONLY);
        if (fd < 0) continue;
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        const size_t np = ((size_t)st.st_size + (size_t)page - 1) / (size_t)page;
        void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
        unsigned char *vec = malloc(np);
        if (map != MAP_FAILED && vec && mincore(map, (size_t)st.st_size, vec) == 0) {
            for (size_t i = 0; i < np; i++) resident += vec[i] & 1;
            pages += (double)np;
        } else {
            unknown = 1;
        }
        free(vec);
        if (map != MAP_FAILED) munmap(map, (size_t)st.st_size);
        close(fd);
    }
    closedir(dh);
    return unknown || pages == 0 ? -1 : resident / pages;
}

/* ---- the command ----------------------------------------------------------------------------------------- */

typedef struct {
    const char *config, *dir, *json, *io;
    int rounds, keep, io_threads, chunk_mib;
} CkptBenchArgs;

static int bench_ckpt_run(const CkptBenchArgs *a, const Dist *d, ZyErr *err);

int bench_ckpt(int argc, char **argv) {
    CkptBenchArgs a = {.dir = "/tmp", .io = "direct", .rounds = 3, .io_threads = 0, .chunk_mib = 0};
    ArgSpec specs[] = {
        {"--config", ARG_STRING, 1, &a.config, "model config.json (its parameters and optimizer state are saved)", 0},
        {"--dir", ARG_STRING, 0, &a.dir, "where the checkpoints and the disk probe go (default /tmp), in a fresh "
                                          "subdirectory removed at the end", 0},
        {"--rounds", ARG_INT, 0, &a.rounds, "rounds of save, restore and probes; medians reported (default 3)", 0},
        {"--json", ARG_STRING, 0, &a.json, "also write the results as JSON to FILE", 0},
        {"--keep", ARG_SWITCH, 0, &a.keep, "keep the last checkpoint (bench/vs_torch_ckpt.py takes its tensors' shapes)", 0},
        {"--io", ARG_STRING, 0, &a.io, "direct (O_DIRECT where the file system takes it; default) or buffered", 0},
        {"--io-threads", ARG_INT, 0, &a.io_threads, "I/O threads of one write or read (default 8)", 0},
        {"--chunk-mib", ARG_INT, 0, &a.chunk_mib, "MiB per I/O request (default 8)", 0},
    };
    for (int i = 3; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0) {
            args_usage("bench ckpt", "--config CFG.json [--dir D --rounds N --json FILE --keep --io direct|buffered "
                       "--io-threads K --chunk-mib M]   (mpirun -np N zaya bench ckpt ...: N ranks)", specs,
                       ZY_ARRAY_LEN(specs));
            return 0;
        }
    ZyErr err = {{0}};
    int bad = args_parse(argc, argv, 3, specs, ZY_ARRAY_LEN(specs), NULL, 0, NULL, "bench ckpt", &err);
    if (!bad && (a.rounds < 1 || a.io_threads < 0 || a.io_threads > 64 || a.chunk_mib < 0))
        bad = zy_fail(&err, "bench ckpt: --rounds must be positive, --io-threads in [0, 64], --chunk-mib not negative");
    if (!bad && strcmp(a.io, "direct") != 0 && strcmp(a.io, "buffered") != 0)
        bad = zy_fail(&err, "bench ckpt: --io must be direct or buffered, not \"%s\"", a.io);
    /* MPI first, then one message from rank 0 (as bench comm does) */
    Dist d;
    if (dist_init(&d, &err)) {
        fprintf(stderr, "zaya: %s\n", err.msg);
        return 1;
    }
    if (bad) {
        if (d.rank == 0) fprintf(stderr, "zaya: %s\n", err.msg);
        fflush(stderr);
        ZyErr ignored;
        dist_barrier(&d, &ignored);
        dist_finalize(&d);
        return 1;
    }
    CkptIoConfig io = ckpt_io_config();
    io.direct = strcmp(a.io, "direct") == 0;
    if (a.io_threads) io.threads = a.io_threads;
    if (a.chunk_mib) io.chunk_bytes = (size_t)a.chunk_mib << 20;
    ckpt_io_configure(&io);
    if (bench_ckpt_run(&a, &d, &err)) {
        fprintf(stderr, "zaya: bench ckpt (rank %d): %s\n", d.rank, err.msg);
        dist_abort(&d, 1); /* the others may wait in a collective */
        dist_finalize(&d);
        return 1;
    }
    dist_finalize(&d);
    return 0;
}

static void fill_random(uint8_t *p, size_t n, uint64_t seed) {
    const long words = (long)(n / 8);
#pragma omp parallel for schedule(static)
    for (long i = 0; i < words; i++) {
        uint64_t x = (seed + (uint64_t)i) * 0x9e3779b97f4a7c15ull; /* splitmix64 */
        x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
        x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
        x ^= x >> 31;
        memcpy(p + 8 * (size_t)i, &x, 8);
    }
}

/* The reference: the C library's memcpy, the bytes split evenly over all OpenMP threads. */
static void parallel_memcpy(uint8_t *dst, const uint8_t *src, size_t n) {
#pragma omp parallel
    {
        const size_t t = (size_t)omp_get_thread_num(), nt = (size_t)omp_get_num_threads();
        const size_t lo = n / nt * t, hi = t + 1 == nt ? n : n / nt * (t + 1);
        memcpy(dst + lo, src + lo, hi - lo);
    }
}

/* The CRC-32 of everything a checkpoint holds of m and o: every parameter, the owned tensors' moments. */
static uint32_t saved_state_crc(const Model *m, const Optimizer *o) {
    uint32_t crc = 0;
    for (int i = 0; i < m->params.count; i++) {
        const ParamInfo *p = &m->params.info[i];
        crc = zy_crc32(crc, m->params.data + p->offset, p->numel * sizeof(float));
        if (!param_trainable(p) || !o->owned[i]) continue;
        crc = zy_crc32(crc, optim_state(o, p, 0), p->numel * sizeof(float));
        if (p->kind != PARAM_MUON) crc = zy_crc32(crc, optim_state(o, p, 1), p->numel * sizeof(float));
    }
    return crc;
}

static double median_of(const double *x, int n) {
    double tmp[256];
    for (int i = 0; i < n; i++) tmp[i] = x[i];
    return zy_median(tmp, n);
}

static double best_of(const double *mb_s, int n) {
    double b = 0;
    for (int i = 0; i < n; i++)
        if (mb_s[i] > b) b = mb_s[i];
    return b;
}

static int bench_ckpt_run(const CkptBenchArgs *a, const Dist *d, ZyErr *err) {
    const int R = a->rounds > 256 ? 256 : a->rounds, lead = d->rank == 0;
    const CkptIoConfig io = ckpt_io_config();
    ZayaConfig cfg;
    Model m;
    Optimizer o;
    if (config_load(&cfg, a->config, err) || model_create(&m, &cfg, err)) return -1;
    model_init_weights(&m, 1);
    size_t *bounds = calloc((size_t)d->size + 1, sizeof *bounds);
    if (!bounds) return zy_fail(err, "out of memory");
    zero1_partition(&m.params, d->size, bounds);
    OptimConfig oc;
    optim_config_default(&oc);
    if (optim_create_block(&o, &m.params, &oc, bounds[d->rank], bounds[d->rank + 1], err)) return -1;
    /* optimizer state as a trained run has it: every value different */
    const long block = (long)(o.end - o.begin);
#pragma omp parallel for schedule(static)
    for (long j = 0; j < block; j++) {
        const float w = m.params.data[o.begin + (size_t)j];
        o.exp_avg[j] = 0.01f * w + 1e-7f * (float)(j % 977);
        o.exp_avg_sq[j] = w * w + 1e-9f * (float)(j % 983);
    }
    const uint32_t saved_crc = saved_state_crc(&m, &o);
    /* a fresh directory, named by rank 0 */
    char run_dir[4096] = "", root[4200], probe[4200];
    if (lead) {
        snprintf(run_dir, sizeof run_dir, "%s/zaya-bench-ckpt.%ld", a->dir, (long)getpid());
        if (zy_mkdirs(run_dir, err)) return -1;
        char resolved[4096]; /* PATH_MAX */
        if (realpath(run_dir, resolved)) memcpy(run_dir, resolved, sizeof run_dir);
    }
    if (dist_bcast(d, run_dir, sizeof run_dir, 0, err)) return -1;
    snprintf(root, sizeof root, "%s/checkpoints", run_dir);
    snprintf(probe, sizeof probe, "%s/disk-probe.bin", run_dir);
    /* the writer's images, ready as a training run makes them at start-up */
    CkptWriter *w = NULL;
    if (ckpt_writer_prepare(&w, &m, &o, d, err)) return -1;
    /* this rank's snapshot bytes (its shard; rank 0 the model too), and the checkpoint's */
    size_t shard_bytes = 0;
    for (int i = 0; i < m.params.count; i++) {
        const ParamInfo *p = &m.params.info[i];
        if (param_trainable(p) && o.owned[i]) shard_bytes += p->numel * 4 * (p->kind == PARAM_MUON ? 1 : 2);
    }
    const size_t model_bytes = lead ? params_count(&m.params, 0) * 4 : 0;
    int64_t total_i = (int64_t)(shard_bytes + model_bytes);
    if (dist_allreduce_i64(d, &total_i, 1, err)) return -1;
    const size_t my_bytes = shard_bytes + model_bytes, total = (size_t)total_i;
    CkptImage src = {0}, dst = {0}, disk = {0};
    if (ckpt_image_reserve(&src, my_bytes, err) || ckpt_image_reserve(&dst, my_bytes, err)) return -1;
    if (lead && ckpt_image_reserve(&disk, total, err)) return -1;
    /* bytes as incompressible as the checkpoint's: a storage layer that compresses or skips zeros must not make the
     * probes look faster than any real state could be */
    fill_random(src.data, my_bytes, 11 + (uint64_t)d->rank);
    if (lead) fill_random(disk.data, total, 5);
    double stall[256], write[256], restore[256], mem[256], dw[DISK_METHODS][256], dr[DISK_METHODS][256];
    double resident = -1, ckpt_bytes = 0;
    int identical = 1, direct_ok = 1;
    char published[700] = "";
    for (int r = 0; r < R; r++) {
        /* memcpy: every rank its snapshot's bytes with its threads, at once */
        if (dist_barrier(d, err)) return -1;
        double t0 = zy_now_seconds();
        parallel_memcpy(dst.data, src.data, my_bytes);
        mem[r] = slowest(d, zy_now_seconds() - t0);
        /* the disk, rank 0 alone: a file of the checkpoint's size */
        for (int k = 0; k < DISK_METHODS; k++) {
            dw[k][r] = dr[k][r] = 0;
            if (!lead) continue;
            const double tw = disk_pass(probe, disk.data, total, k, io.threads, io.chunk_bytes, 1);
            const double tr = tw > 0 ? disk_pass(probe, disk.data, total, k, io.threads, io.chunk_bytes, 0) : -1;
            if (k != DISK_BUFFERED && (tw < 0 || tr < 0)) direct_ok = 0;
            dw[k][r] = tw > 0 ? total / tw / 1e6 : 0;
            dr[k][r] = tr > 0 ? total / tr / 1e6 : 0;
            unlink(probe);
        }
        /* the checkpoint: snapshot, background write to the publish, cold restore */
        const char *state = "{\"bench\": \"ckpt\"}";
        CheckpointContent c = {.model = &m, .optim = &o, .trainer_state_json = state, .run_json = NULL};
        if (dist_barrier(d, err)) return -1;
        t0 = zy_now_seconds();
        if (ckpt_save_async(&w, root, r + 1, &c, d, 1, err)) return -1;
        stall[r] = slowest(d, zy_now_seconds() - t0);
        double seconds = 0;
        if (ckpt_wait(w, d, published, sizeof published, &seconds, err)) return -1;
        write[r] = slowest(d, seconds);
        if (lead) {
            resident = drop_pages(published);
            struct stat st;
            char path[800];
            DIR *dh = opendir(published);
            struct dirent *e;
            ckpt_bytes = 0;
            while (dh && (e = readdir(dh)))
                if (snprintf(path, sizeof path, "%s/%s", published, e->d_name) < (int)sizeof path && stat(path, &st) == 0 &&
                    S_ISREG(st.st_mode))
                    ckpt_bytes += (double)st.st_size;
            if (dh) closedir(dh);
        }
        /* the arenas overwritten, so the restore must put back every saved byte (NaN patterns: 0xff) */
        memset(m.params.data, 0xff, m.params.total * sizeof(float));
        memset(o.exp_avg, 0xff, (size_t)block * sizeof(float));
        memset(o.exp_avg_sq, 0xff, (size_t)block * sizeof(float));
        if (dist_barrier(d, err)) return -1;
        char *state_back = NULL;
        t0 = zy_now_seconds();
        if (ckpt_load(published, &m, &o, &state_back, d, err)) return -1;
        restore[r] = slowest(d, zy_now_seconds() - t0);
        int64_t differs = strcmp(state_back, state) != 0 || saved_state_crc(&m, &o) != saved_crc;
        free(state_back);
        if (dist_allreduce_max_i64(d, &differs, 1, err)) return -1;
        if (differs) identical = 0;
    }
    if (dist_bcast(d, &ckpt_bytes, sizeof ckpt_bytes, 0, err)) return -1;
    ckpt_writer_free(w);
    ckpt_image_free(&src), ckpt_image_free(&dst), ckpt_image_free(&disk);
    if (lead && !a->keep && zy_remove_tree(run_dir) != 0) fprintf(stderr, "zaya: bench ckpt: could not remove %s\n", run_dir);
    /* the report */
    double best_w[DISK_METHODS], best_r[DISK_METHODS];
    for (int k = 0; k < DISK_METHODS; k++) best_w[k] = median_of(dw[k], R), best_r[k] = median_of(dr[k], R);
    const double disk_w = best_of(best_w, DISK_METHODS), disk_r = best_of(best_r, DISK_METHODS);
    const double s_stall = median_of(stall, R), s_write = median_of(write, R), s_restore = median_of(restore, R),
                 s_mem = median_of(mem, R);
    const double mb = ckpt_bytes / 1e6, write_mb_s = mb / s_write, restore_mb_s = mb / s_restore;
    const size_t n_params = params_count(&m.params, 0);
    optim_free(&o);
    model_free(&m);
    free(bounds);
    if (!lead) return 0;
    char cpu[512], fs[2000];
    cpu_name(cpu, sizeof cpu);
    mount_of(run_dir, fs, sizeof fs);
    const int threads = omp_get_max_threads();
    printf("model        %s: %zu parameters; %d rank%s x %d threads; rounds %d (medians; the slowest rank)\n", a->config,
           n_params, d->size, d->size > 1 ? "s" : "", threads, R);
    printf("checkpoint   %.1f MB (model.safetensors %.1f MB, optimizer shards %.1f MB, the rest JSON)\n", mb,
           n_params * 4 / 1e6, (total - n_params * 4) / 1e6);
    printf("machine      %s\n", cpu);
    printf("directory    %s: %s\n", run_dir, fs);
    printf("checkpoint I/O  %s, %d threads, %zu MiB requests%s\n", io.direct ? "O_DIRECT" : "page cache", io.threads,
           io.chunk_bytes >> 20, io.direct && !direct_ok ? " (this file system refused O_DIRECT: page cache)" : "");
    printf("\n%-34s %10s %10s %10s %12s\n", "", "median s", "min s", "max s", "MB/s");
#define ROW(label, x, bytes)                                                                                           \
    do {                                                                                                             \
        double lo = x[0], hi = x[0];                                                                                 \
        for (int i = 1; i < R; i++) lo = x[i] < lo ? x[i] : lo, hi = x[i] > hi ? x[i] : hi;                          \
        const double med = median_of(x, R);                                                                          \
        printf("%-34s %10.4f %10.4f %10.4f %12.0f\n", label, med, lo, hi, (bytes) / 1e6 / med);                      \
    } while (0)
    ROW("snapshot stall", stall, ckpt_bytes);
    ROW("background write (to publish)", write, ckpt_bytes);
    ROW("restore, cold (load + verify)", restore, ckpt_bytes);
    ROW("memcpy of the snapshot's bytes", mem, (double)total);
#undef ROW
    printf("\ndisk (a %.1f MB file in the same directory)   write MB/s   read MB/s (cold)\n", total / 1e6);
    for (int k = 0; k < DISK_METHODS; k++)
        printf("  %-52s %10.0f %11.0f\n", disk_method_name[k], best_w[k], best_r[k]);
    printf("  %-52s %10.0f %11.0f\n", "best (the targets' reference)", disk_w, disk_r);
    if (resident < 0) printf("\ncold restore: posix_fadvise(DONTNEED) issued; mincore could not tell what stayed cached\n");
    else printf("\ncold restore: posix_fadvise(DONTNEED) after fsync left %.1f%% of the checkpoint's pages cached%s\n",
                100 * resident, resident < 0.01 ? " (it worked)" : " (it did not fully work: reads may be warm)");
    printf("restored state bit-identical to the saved one: %s\n", identical ? "yes" : "NO");
    const double r_stall = s_stall / s_mem, r_write = write_mb_s / disk_w, r_restore = restore_mb_s / disk_r;
    printf("\ntargets\n");
    printf("  snapshot stall / memcpy of the same bytes      %6.2f   (target <= 2)   %s\n", r_stall, r_stall <= 2 ? "met" : "NOT met");
    printf("  background write / disk write bandwidth       %6.2f   (target >= 0.8) %s\n", r_write, r_write >= 0.8 ? "met" : "NOT met");
    printf("  restore / disk read bandwidth                 %6.2f   (target >= 0.8) %s\n", r_restore, r_restore >= 0.8 ? "met" : "NOT met");
    if (a->keep) printf("\nkept: %s\n", published);
    if (a->json) {
        FILE *f = fopen(a->json, "w");
        if (!f) return zy_fail(err, "%s: cannot write: %s", a->json, strerror(errno));
        fprintf(f, "{\"config\": \"%s\", \"ranks\": %d, \"threads\": %d, \"rounds\": %d, \"cpu\": \"%s\", \"dir\": \"%s\",\n"
                   " \"io\": {\"direct\": %d, \"direct_ok\": %d, \"threads\": %d, \"chunk_mib\": %zu},\n"
                   " \"checkpoint_bytes\": %.0f, \"snapshot_bytes\": %zu,\n"
                   " \"snapshot_stall_s\": %.9g, \"write_s\": %.9g, \"write_mb_s\": %.6g, \"restore_s\": %.9g, "
                   "\"restore_mb_s\": %.6g, \"memcpy_s\": %.9g, \"memcpy_gb_s\": %.6g,\n",
                a->config, d->size, threads, R, cpu, run_dir, io.direct, direct_ok, io.threads, io.chunk_bytes >> 20,
                ckpt_bytes, total, s_stall, s_write, write_mb_s, s_restore, restore_mb_s, s_mem, total / s_mem / 1e9);
        for (int rw = 0; rw < 2; rw++) {
            fprintf(f, " \"disk_%s_mb_s\": {", rw ? "read" : "write");
            for (int k = 0; k < DISK_METHODS; k++) fprintf(f, "\"%s\": %.6g, ", disk_method_key[k], rw ? best_r[k] : best_w[k]);
            fprintf(f, "\"best\": %.6g},\n", rw ? disk_r : disk_w);
        }
        fprintf(f, " \"cold_resident_fraction\": %.4f, \"restored_identical\": %s,\n"
                   " \"ratios\": {\"stall_over_memcpy\": %.6g, \"write_over_disk\": %.6g, \"restore_over_disk\": %.6g}}\n",
                resident, identical ? "true" : "false", r_stall, r_write, r_restore);
        if (fclose(f) != 0) return zy_fail(err, "%s: write failed", a->json);
    }
    return identical ? 0 : zy_fail(err, "the restored state differs from the saved one");
}

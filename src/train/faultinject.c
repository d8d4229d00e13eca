#include "train/faultinject.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char *const kind_names[FAULT_KIND_COUNT] = {"crash", "hang", "nan", "corrupt", "truncate"};

const char *fault_kind_name(FaultKind k) { return k >= 0 && k < FAULT_KIND_COUNT ? kind_names[k] : "?"; }

static int parse_int(const char *s, size_t n, long long max, long long *out) {
    if (n == 0 || n > 18) return -1;
    long long v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        v = v * 10 + (s[i] - '0');
    }
    if (v > max) return -1;
    *out = v;
    return 0;
}

int fault_parse(const char *text, FaultPlan *plan, ZyErr *err) {
    const char *p = text;
    for (;;) {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        char item[128];
        if (n == 0 || n >= sizeof item)
            return zy_fail(err, "ZAYA_FAULT \"%s\": empty or overlong item (expected KIND@STEP[:RANK], comma-separated)", text);
        memcpy(item, p, n);
        item[n] = '\0';
        char *at = strchr(item, '@');
        if (!at) return zy_fail(err, "ZAYA_FAULT item \"%s\": expected KIND@STEP[:RANK]", item);
        *at = '\0';
        int kind = -1;
        for (int k = 0; k < FAULT_KIND_COUNT; k++)
            if (strcmp(item, kind_names[k]) == 0) kind = k;
        if (kind < 0)
            return zy_fail(err, "ZAYA_FAULT item \"%s@%s\": unknown kind \"%s\" (crash, hang, nan, corrupt, truncate)", item,
                           at + 1, item);
        char *colon = strchr(at + 1, ':');
        long long step, rank = 0;
        if (parse_int(at + 1, colon ? (size_t)(colon - at - 1) : strlen(at + 1), (long long)1e15, &step) || step < 1)
            return zy_fail(err, "ZAYA_FAULT item \"%s@%s\": the step must be a positive integer", item, at + 1);
        if (colon && parse_int(colon + 1, strlen(colon + 1), 1 << 20, &rank))
            return zy_fail(err, "ZAYA_FAULT item \"%s@%s\": the rank must be a non-negative integer", item, at + 1);
        if (plan->count >= FAULT_MAX) return zy_fail(err, "ZAYA_FAULT: more than %d faults", FAULT_MAX);
        plan->f[plan->count++] = (FaultSpec){.kind = (FaultKind)kind, .step = step, .rank = (int)rank};
        if (!end) break;
        p = end + 1;
    }
    return 0;
}

int fault_plan_from_env(FaultPlan *plan, const char *out_dir, int rank, ZyErr *err) {
    memset(plan, 0, sizeof *plan);
    plan->rank = rank;
    if (snprintf(plan->marker_dir, sizeof plan->marker_dir, "%s/faults-fired", out_dir) >= (int)sizeof plan->marker_dir)
        return zy_fail(err, "%s: path too long", out_dir);
    const char *spec = getenv("ZAYA_FAULT");
    if (!spec || !spec[0]) return 0;
    return fault_parse(spec, plan, err);
}

int fault_claim(FaultPlan *plan, FaultKind kind, int64_t step) {
    for (int i = 0; i < plan->count; i++) {
        const FaultSpec *f = &plan->f[i];
        if (f->kind != kind || f->step != step || f->rank != plan->rank) continue;
        ZyErr ignore;
        if (zy_mkdirs(plan->marker_dir, &ignore)) return 0;
        char path[4300];
        snprintf(path, sizeof path, "%s/%s@%lld:%d", plan->marker_dir, kind_names[kind], (long long)step, f->rank);
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
        if (fd < 0) return 0; /* fired before (or cannot record it: then do not fire, it could repeat forever) */
        close(fd);
        fprintf(stderr, "zaya: rank %d: ZAYA_FAULT: injecting %s at step %lld\n", plan->rank, kind_names[kind],
                (long long)step);
        return 1;
    }
    return 0;
}

void fault_after_step(FaultPlan *plan, int64_t step) {
    if (!plan->count) return;
    if (fault_claim(plan, FAULT_CRASH, step)) raise(SIGKILL);
    if (fault_claim(plan, FAULT_HANG, step))
        for (;;) { /* a hung rank: alive, never advancing; SIGTERM only sets the stop flag, so SIGKILL ends it */
            struct timespec ts = {1, 0};
            nanosleep(&ts, NULL);
        }
}

int fault_after_publish(FaultPlan *plan, int64_t step, const char *dir, ZyErr *err) {
    if (!plan->count) return 0;
    char path[4300];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (fault_claim(plan, FAULT_CORRUPT, step)) {
        FILE *f = fopen(path, "r+b");
        if (!f) return zy_fail(err, "%s: fault injection cannot open: %s", path, strerror(errno));
        /* a byte in the middle of the tensor data, so the header still parses and only the checksum notices */
        struct stat st;
        long at = stat(path, &st) == 0 ? (long)(st.st_size / 2) : 0;
        int c = fseek(f, at, SEEK_SET) == 0 ? fgetc(f) : EOF;
        int ok = c != EOF && fseek(f, at, SEEK_SET) == 0 && fputc(c ^ 0x5a, f) != EOF;
        if (fclose(f) != 0 || !ok) return zy_fail(err, "%s: fault injection could not flip a byte", path);
    }
    if (fault_claim(plan, FAULT_TRUNCATE, step)) {
        struct stat st;
        if (stat(path, &st) != 0 || truncate(path, st.st_size / 2) != 0)
            return zy_fail(err, "%s: fault injection could not truncate: %s", path, strerror(errno));
    }
    return 0;
}

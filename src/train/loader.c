#include "train/loader.h"

#include <stdio.h>
#include <string.h>

uint64_t hash3(uint64_t seed, uint64_t a, uint64_t b) {
    uint64_t z = seed ^ (a * 0x9E3779B97F4A7C15ull) ^ (b * 0xC2B2AE3D27D4EB4Full);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

int loader_open(Loader *l, int n, const char *const *names, const char *const *dirs, uint64_t seed, int verify_crc,
                ZyErr *err) {
    memset(l, 0, sizeof *l);
    if (n < 1 || n > LOADER_MAX_DATASETS) return zy_fail(err, "between 1 and %d datasets are supported", LOADER_MAX_DATASETS);
    l->seed = seed;
    for (int i = 0; i < n; i++) {
        if (shardset_open(&l->train[i], dirs[i], "train", verify_crc, err)) {
            zy_wrap(err, "dataset \"%s\"", names[i]);
            loader_close(l);
            return -1;
        }
        l->n_datasets = i + 1;
        snprintf(l->names[i], sizeof l->names[i], "%s", names[i]);
    }
    return 0;
}

void loader_close(Loader *l) {
    for (int i = 0; i < l->n_datasets; i++) shardset_close(l->train[i]);
    l->n_datasets = 0;
}

int loader_plan(Loader *l, uint64_t step, int batch, int seq_len, const double *weights, BatchRow *rows, ZyErr *err) {
    double total = 0;
    for (int d = 0; d < l->n_datasets; d++) total += weights[d] > 0 ? weights[d] : 0;
    if (!(total > 0)) return zy_fail(err, "the phase's mixture has no positive weight");
    const uint64_t window = (uint64_t)seq_len + 1;
    for (int i = 0; i < batch; i++) {
        /* 53 random bits → a uniform draw in [0, total) */
        double u = (double)(hash3(l->seed, step, (uint64_t)i) >> 11) * (1.0 / 9007199254740992.0) * total;
        int d = -1;
        double acc = 0;
        for (int k = 0; k < l->n_datasets; k++) {
            if (!(weights[k] > 0)) continue;
            acc += weights[k];
            d = k;
            if (u < acc) break;
        }
        uint64_t n_tok = shardset_num_tokens(l->train[d]);
        if (n_tok < window)
            return zy_fail(err, "dataset \"%s\" has %llu training tokens, fewer than one window of %llu", l->names[d],
                           (unsigned long long)n_tok, (unsigned long long)window);
        if (l->cursor[d] + window > n_tok) { /* wrap: next pass over the dataset */
            l->cursor[d] = 0;
            l->epoch[d]++;
        }
        rows[i].dataset = d;
        rows[i].offset = l->cursor[d];
        l->cursor[d] += window;
    }
    return 0;
}

void loader_split_windows(const int32_t *w, int rows, int T, int32_t *inputs, int32_t *targets) {
    for (int r = 0; r < rows; r++) {
        memcpy(inputs + (size_t)r * T, w + (size_t)r * (T + 1), (size_t)T * sizeof(int32_t));
        memcpy(targets + (size_t)r * T, w + (size_t)r * (T + 1) + 1, (size_t)T * sizeof(int32_t));
    }
}

int loader_read(Loader *l, const BatchRow *rows, int first, int count, int seq_len, int32_t *tokens, ZyErr *err) {
    for (int i = 0; i < count; i++) {
        const BatchRow *r = &rows[first + i];
        if (shardset_read(l->train[r->dataset], r->offset, (size_t)seq_len + 1, tokens + (size_t)i * (seq_len + 1), err))
            return zy_wrap(err, "dataset \"%s\"", l->names[r->dataset]);
    }
    return 0;
}

double loader_scatter_factor(const Loader *l) {
    uint64_t read = 0, needed = 0;
    for (int d = 0; d < l->n_datasets; d++) {
        uint64_t pr, pn, br;
        shardset_io_stats(l->train[d], &pr, &pn, &br);
        read += pr;
        needed += pn;
    }
    return needed ? (double)read / (double)needed : 1.0;
}

/* ---- data skip windows ------------------------------------------------------------------------------------ */

static int parse_index(const char *s, const char *end, uint64_t *out) {
    if (s == end || *s < '0' || *s > '9') return -1;
    uint64_t v = 0;
    for (; s < end; s++) {
        if (*s < '0' || *s > '9' || v > (UINT64_MAX - 9) / 10) return -1;
        v = v * 10 + (uint64_t)(*s - '0');
    }
    *out = v;
    return 0;
}

int skip_window_parse(const char *text, DataWindow *out, ZyErr *err) {
    const char *colon = strchr(text, ':'), *end = text + strlen(text);
    DataWindow w;
    if (parse_index(text, colon ? colon : end, &w.first) || (colon && parse_index(colon + 1, end, &w.last)))
        return zy_fail(err, "skip window \"%s\": expected A:B with non-negative integer data indices", text);
    if (!colon) w.last = w.first;
    if (w.last < w.first)
        return zy_fail(err, "skip window \"%s\": the last index is before the first", text);
    *out = w;
    return 0;
}

int skip_windows_add(SkipWindows *s, DataWindow w, ZyErr *err) {
    if (w.last < w.first) return zy_fail(err, "skip window %llu:%llu is empty", (unsigned long long)w.first,
                                         (unsigned long long)w.last);
    /* absorb every window that overlaps or touches w, then insert w in order */
    int out = 0;
    for (int i = 0; i < s->count; i++) {
        DataWindow v = s->w[i];
        int touches = v.first <= (w.last == UINT64_MAX ? w.last : w.last + 1) &&
                      w.first <= (v.last == UINT64_MAX ? v.last : v.last + 1);
        if (touches) {
            if (v.first < w.first) w.first = v.first;
            if (v.last > w.last) w.last = v.last;
        } else {
            s->w[out++] = v;
        }
    }
    s->count = out;
    if (s->count >= LOADER_MAX_SKIP_WINDOWS) return zy_fail(err, "more than %d skip windows", LOADER_MAX_SKIP_WINDOWS);
    int pos = s->count;
    while (pos > 0 && s->w[pos - 1].first > w.first) {
        s->w[pos] = s->w[pos - 1];
        pos--;
    }
    s->w[pos] = w;
    s->count++;
    return 0;
}

int skip_windows_contains(const SkipWindows *s, uint64_t index) {
    for (int i = 0; i < s->count; i++)
        if (s->w[i].first <= index && index <= s->w[i].last) return 1;
    return 0;
}

uint64_t skip_windows_next_trained(const SkipWindows *s, uint64_t index) {
    /* windows are sorted and disjoint (not touching), so one pass suffices */
    for (int i = 0; i < s->count; i++)
        if (s->w[i].first <= index && index <= s->w[i].last && s->w[i].last != UINT64_MAX) index = s->w[i].last + 1;
    return index;
}

#include "model/params.h"

#include <stdlib.h>
#include <string.h>

int params_add(ParamTable *t, const char *name, ParamKind kind, ParamInit init, int ndim, const int64_t *shape,
               ZyErr *err) {
    if (t->data) return zy_fail(err, "params_add(%s): layout already allocated", name);
    if (ndim < 1 || ndim > 4) return zy_fail(err, "params_add(%s): bad ndim %d", name, ndim);
    if (strlen(name) >= sizeof t->info[0].name) return zy_fail(err, "params_add: name too long: %s", name);
    if (params_find(t, name) >= 0) return zy_fail(err, "params_add: duplicate tensor %s", name);
    if (t->count == t->cap) {
        int cap = t->cap ? 2 * t->cap : 64;
        ParamInfo *p = realloc(t->info, (size_t)cap * sizeof *p);
        if (!p) return zy_fail(err, "out of memory");
        t->info = p;
        t->cap = cap;
    }
    ParamInfo *p = &t->info[t->count];
    memset(p, 0, sizeof *p);
    strcpy(p->name, name);
    p->ndim = ndim;
    p->kind = kind;
    p->init = init;
    size_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] <= 0 || zy_mul_size(numel, (size_t)shape[i], &numel))
            return zy_fail(err, "params_add(%s): bad shape", name);
        p->shape[i] = shape[i];
    }
    p->numel = numel;
    p->offset = t->total;
    size_t padded = (numel + 15) & ~(size_t)15;
    if (t->total + padded < t->total) return zy_fail(err, "params_add(%s): arena size overflow", name);
    t->total += padded;
    return t->count++;
}

int params_alloc(ParamTable *t, ZyErr *err) {
    size_t bytes;
    if (zy_mul_size(t->total, sizeof(float), &bytes)) return zy_fail(err, "parameter arena too large");
    t->data = zy_calloc(bytes);
    t->grad = zy_calloc(bytes);
    if (!t->data || !t->grad) {
        zy_free(t->data);
        zy_free(t->grad);
        t->data = t->grad = NULL;
        return zy_fail(err, "out of memory allocating %zu MB of parameters and gradients", 2 * bytes >> 20);
    }
    return 0;
}

void params_free(ParamTable *t) {
    zy_free(t->data);
    zy_free(t->grad);
    free(t->info);
    memset(t, 0, sizeof *t);
}

int params_find(const ParamTable *t, const char *name) {
    for (int i = 0; i < t->count; i++)
        if (strcmp(t->info[i].name, name) == 0) return i;
    return -1;
}

void params_zero_grad(ParamTable *t) {
    if (t->grad) memset(t->grad, 0, t->total * sizeof(float));
}

size_t params_count(const ParamTable *t, int trainable_only) {
    size_t n = 0;
    for (int i = 0; i < t->count; i++)
        if (!trainable_only || param_trainable(&t->info[i])) n += t->info[i].numel;
    return n;
}

/* params: every model tensor lives in one contiguous float arena, described by a table of named tensors
 * (Hugging Face names and shapes). Gradients live in a parallel arena with the same layout, so optimizers are
 * one loop over the table and weight I/O is one table walk. */
#ifndef ZAYA_PARAMS_H
#define ZAYA_PARAMS_H

#include <stddef.h>
#include <stdint.h>

#include "util/util.h"

/* Which optimizer updates a tensor (docs/system.md): Muon for the 2-D matrices inside the blocks (a 3-D expert
 * stack is E separate matrices), AdamW for the rest; buffers (balancing biases) are not trained. */
typedef enum { PARAM_BUFFER, PARAM_ADAMW, PARAM_MUON } ParamKind;

/* How `zaya init` fills a tensor when training from scratch (docs/model.md, tensors). */
typedef enum { INIT_ZERO, INIT_ONE, INIT_NORMAL, INIT_BALANCING_BIAS } ParamInit;

typedef struct {
    char name[128];
    int ndim;
    int64_t shape[4];
    size_t numel;
    size_t offset; /* in floats, from the arena start; 16-float (64-byte) aligned */
    ParamKind kind;
    ParamInit init;
} ParamInfo;

typedef struct {
    ParamInfo *info;
    int count, cap;
    size_t total;  /* floats in each arena, including alignment padding */
    float *data;   /* parameters (and buffers) */
    float *grad;   /* gradients, same layout; buffer slots stay zero */
} ParamTable;

/* Appends a tensor to the layout (before allocation). Returns its index, or -1 on error. */
int params_add(ParamTable *t, const char *name, ParamKind kind, ParamInit init, int ndim, const int64_t *shape,
               ZyErr *err);
/* Allocates both arenas (zero-filled) for the registered layout. */
int params_alloc(ParamTable *t, ZyErr *err);
void params_free(ParamTable *t);
int params_find(const ParamTable *t, const char *name);
static inline int param_trainable(const ParamInfo *p) { return p->kind != PARAM_BUFFER; }
void params_zero_grad(ParamTable *t);
/* Number of elements, trainable only or all. */
size_t params_count(const ParamTable *t, int trainable_only);

#endif

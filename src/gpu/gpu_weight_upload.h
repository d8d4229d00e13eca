/* gpu_weight_upload: which bytes of a host model go to a GPU, tensor by tensor, from where the host holds them. A
 * bf16 release loaded mapped (model_load_dir_as with bf16) has no fp32 arena: its bf16 matrices go up straight from
 * the mapped files and are widened on the device, so the device copy is the only full one. Plain host code, built in
 * every build (the unit tests walk it with a recording sink). */
#ifndef ZAYA_GPU_WEIGHT_UPLOAD_H
#define ZAYA_GPU_WEIGHT_UPLOAD_H

#include <stddef.h>
#include <stdint.h>

#include "model/model.h"
#include "util/util.h"

/* Where the uploads land: offsets are in elements of the table's layout (ParamInfo.offset), n values each. f32 puts
 * fp32 values in the device's fp32 arena; bf16 puts bf16 values in its bf16 arena and leaves their fp32 widening
 * (exact) in the fp32 arena at the same offset. Each returns 0 or -1 (err). */
typedef struct {
    void *ctx;
    int (*f32)(void *ctx, size_t offset, const float *src, size_t n, ZyErr *err);
    int (*bf16)(void *ctx, size_t offset, const uint16_t *src, size_t n, ZyErr *err);
} WeightSink;

/* Every tensor of m's table once, in table order, from where m holds it (model_tensor_source): fp32 tensors through
 * sink->f32, bf16 matrices through sink->bf16. Errors: a tensor m holds neither way (named), or the sink's. */
int gpu_upload_weights(const Model *m, const WeightSink *sink, ZyErr *err);

/* Whether m has the whole fp32 arena (model_create / model_load_dir): one copy of it then does. */
int gpu_weights_in_one_arena(const Model *m);

#endif

/* A host model's weights onto a GPU, tensor by tensor (gpu_weight_upload.h). */
#include "gpu/gpu_weight_upload.h"

#include "io/model_io.h"

int gpu_weights_in_one_arena(const Model *m) { return m->params.data && !m->bf16 && !m->owner; }

int gpu_upload_weights(const Model *m, const WeightSink *sink, ZyErr *err) {
    for (int i = 0; i < m->params.count; i++) {
        const ParamInfo *p = &m->params.info[i];
        const float *f32;
        const uint16_t *bf16;
        if (model_tensor_source(m, i, &f32, &bf16, err)) return -1;
        if (f32 ? sink->f32(sink->ctx, p->offset, f32, p->numel, err)
                : sink->bf16(sink->ctx, p->offset, bf16, p->numel, err))
            return zy_wrap(err, "uploading \"%s\"", p->name);
    }
    return 0;
}

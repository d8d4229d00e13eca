/* zaya eval on a GPU: an EvalRunner (infer/eval.h) over the GPU model. Task scoring decodes through a GPU KV cache
 * (which has no rewind, so each multiple-choice option decodes its context again); held-out windows run
 * gpu_model_forward and gpu_model_loss; routing statistics come back per window. */
#ifndef ZAYA_GPU_EVAL_H
#define ZAYA_GPU_EVAL_H
#include "infer/eval.h"
#include "model/model.h"
#include "util/util.h"

typedef struct GpuEvalRunner GpuEvalRunner;

/* Uploads m (fp32 host weights) to GPU `device` (-1: the default); bf16: bf16 products. *run is the runner to pass to
 * eval_task_file_on / eval_token_loss_on / eval_shard_loss_on while *out lives. */
int gpu_eval_runner_create(GpuEvalRunner **out, EvalRunner *run, const Model *m, int device, int bf16, ZyErr *err);
void gpu_eval_runner_free(GpuEvalRunner *r);
const char *gpu_eval_runner_device(const GpuEvalRunner *r);

#endif

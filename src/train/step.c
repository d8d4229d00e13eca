/* What zaya train and zaya bench train share around a StepBackend (step.h): the gradient accumulation of one
 * optimizer step and training's data source, so the benchmark times the training run's own step. */
#include "train/step.h"

static int loader_read_micro(void *x, int k, int32_t *inputs, int32_t *targets, ZyErr *err) {
    StepLoaderData *s = x;
    const int mb = s->micro_batch, T = s->T;
    if (loader_read(s->loader, s->rows, s->first_row + k * mb, mb, T, s->window, err)) return -1;
    loader_split_windows(s->window, mb, T, inputs, targets);
    if (model_check_tokens(s->model, inputs, mb, T, err) || model_check_tokens(s->model, targets, mb, T, err))
        return zy_wrap(err, "training data at step %lld", (long long)s->step);
    return 0;
}

StepData step_data_loader(StepLoaderData *src) { return (StepData){.ctx = src, .read = loader_read_micro}; }

int step_accumulate(const StepBackend *be, const StepData *data, int n_micro, int32_t *inputs, int32_t *targets,
                    RoutingCounts *routes, int nan_fault, double *loss, double *sumsq, double *comm_seconds,
                    double *fwd_bwd_seconds, ZyErr *err) {
    const double t0 = zy_now_seconds();
    be->begin(be->ctx);
    routing_counts_reset(routes);
    for (int k = 0; k < n_micro; k++)
        if (data->read(data->ctx, k, inputs, targets, err) || be->micro(be->ctx, inputs, targets, routes, err))
            return -1;
    if (fwd_bwd_seconds) {
        if (be->sync && be->sync(be->ctx, err)) return -1;
        *fwd_bwd_seconds = zy_now_seconds() - t0;
    }
    return be->reduce(be->ctx, n_micro, nan_fault, loss, sumsq, comm_seconds, err);
}

/* optim: Muon for the 2-D matrices inside the blocks, AdamW for everything else (SYSTEM.md), global-norm
 * gradient clipping, learning-rate schedules, and the expert-balancing controller. */
#ifndef ZAYA_OPTIM_H
#define ZAYA_OPTIM_H

#include <stdint.h>

#include "params.h"
#include "util.h"

typedef struct {
    double weight_decay;   /* decoupled; shared by Muon and AdamW thanks to Muon's RMS matching */
    double beta1, beta2, eps; /* AdamW */
    double muon_momentum;  /* μ = 0.95 */
    int muon_ns_steps;     /* 5 */
} OptimConfig;

void optim_config_default(OptimConfig *c);

/* Optimizer state lives in arenas with the parameter table's layout: exp_avg (AdamW m, or Muon momentum) and
 * exp_avg_sq (AdamW v; unused for Muon tensors). `owned` marks the tensors this process updates (all of them
 * in one process; a ZeRO-1 shard under MPI). */
typedef struct {
    OptimConfig cfg;
    int64_t step;          /* optimizer steps taken (AdamW bias correction) */
    float *exp_avg, *exp_avg_sq;
    size_t total;          /* floats in each state arena (= params total) */
    unsigned char *owned;  /* [params count] */
    float *ns_work;        /* Newton–Schulz workspace, sized for the largest matrix */
    size_t ns_work_floats;
} Optimizer;

int optim_create(Optimizer *o, const ParamTable *t, const OptimConfig *cfg, ZyErr *err);
void optim_free(Optimizer *o);
/* One update of every owned trainable tensor with learning rate lr (gradients already clipped/averaged). */
void optim_step(Optimizer *o, ParamTable *t, double lr);

/* Muon's orthogonalisation: X ← NS5(G / (‖G‖_F + 1e-7)) on the wide orientation, written into out [m, n].
 * work: at least muon_workspace_floats(m, n) floats. */
void newton_schulz5(float *out, const float *G, int m, int n, int steps, float *work);
size_t muon_workspace_floats(int m, int n);

/* Global L2 norm of all trainable gradients (accumulated in double, in table order: deterministic). */
double grad_global_norm(const ParamTable *t);
/* Scales gradients by min(1, max_norm / (norm + 1e-6)), as torch.nn.utils.clip_grad_norm_. Returns the scale. */
double grad_clip(ParamTable *t, double max_norm, double norm);
/* Multiplies every trainable gradient by s (averaging over micro-batches). */
void grad_scale(ParamTable *t, double s);

/* Learning-rate schedules: linear warmup to peak, then WSD (stable, then a linear decay over the last
 * decay_fraction of the steps to min_ratio·peak) or cosine (from peak down to min_ratio·peak). */
typedef enum { SCHEDULE_WSD, SCHEDULE_COSINE, SCHEDULE_CONSTANT } ScheduleType;
typedef struct {
    ScheduleType type;
    double peak_lr;
    int64_t warmup_steps, total_steps;
    double decay_fraction; /* WSD */
    double min_ratio;
} Schedule;
double schedule_lr(const Schedule *s, int64_t step); /* step counts from 0 */

/* The expert-balancing controller (SYSTEM.md): after each step, for each MoE layer, f_e = fraction of the
 * step's tokens routed to real expert e (global batch), g_e = f_e − 1/E drives an AdamW-style update of
 * balancing_biases[e] (no weight decay); the skip expert's bias is held. */
typedef struct {
    int num_layers, num_experts;
    double lr, beta1, beta2, eps;
    int64_t step;
    double *exp_avg, *exp_avg_sq; /* [L, E] */
} Balancer;

int balancer_create(Balancer *b, int num_layers, int num_experts, double lr, ZyErr *err);
void balancer_free(Balancer *b);
/* counts [L, E+1]: tokens routed to each expert (index E = skip) this step; biases[l] points to layer l's
 * balancing_biases [E+1]. Updates the biases in place. */
void balancer_update(Balancer *b, const int64_t *counts, float *const *biases);
/* Normalised routing entropy H(p)/ln E of the real experts' share p_e = n_e / Σ n (1.0 = balanced). */
double routing_entropy(const int64_t *counts, int num_experts);

#endif

/* Calibration for activation-aware quantization (infer/calibrate.h): the forward's saved activations are the inputs
 * of the products, so the statistics are read from them after each window, without hooks in the forward. m's layout
 * is bound to tags (tags + i for tensor i) so that the fields the forward reads name the tensor they belong to. */
#include "infer/calibrate.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    const float *tags;
    QuantImportance *imp;
    double *sums; /* [widest] scratch */
    double *gram; /* [widest²] scratch (with Gram matrices) */
} Gather;

/* The statistics of rows [r0, r1) of x [.., cols], the input of each tensor in mats (NULL entries skipped; block:
 * the expert of a stack) */
static void add_input(const Gather *g, float *const *mats, int n_mats, int block, const float *x, long r0, long r1,
                      int cols) {
    int any = 0;
    for (int k = 0; k < n_mats; k++) any |= mats[k] != NULL;
    if (!any) return;
    double *sums = g->sums, *gram = g->gram;
    if (!g->imp->gram) {
        memset(sums, 0, (size_t)cols * sizeof *sums);
        for (long r = r0; r < r1; r++) {
            const float *row = x + r * cols;
            for (int j = 0; j < cols; j++) sums[j] += (double)row[j] * row[j];
        }
    } else { /* Σ x xᵀ, the upper triangle (mirrored when done); its diagonal is the sums */
#pragma omp parallel for schedule(dynamic, 16) if ((r1 - r0) * (long)cols * cols > (1L << 20))
        for (int i = 0; i < cols; i++) {
            double *gi = gram + (size_t)i * cols;
            memset(gi + i, 0, (size_t)(cols - i) * sizeof *gi);
            for (long r = r0; r < r1; r++) {
                const float *row = x + r * cols;
                const double xi = row[i];
                for (int j = i; j < cols; j++) gi[j] += xi * row[j];
            }
        }
        for (int j = 0; j < cols; j++) sums[j] = gram[(size_t)j * cols + j];
    }
    for (int k = 0; k < n_mats; k++) {
        if (!mats[k]) continue;
        const int i = (int)(mats[k] - g->tags);
        float *acc = g->imp->of_tensor[i] + (size_t)block * cols;
        for (int j = 0; j < cols; j++) acc[j] += (float)sums[j];
        if (!g->imp->gram) continue;
        double *ga = g->imp->gram[i] + (size_t)block * cols * cols;
        for (int a = 0; a < cols; a++)
            for (int b = a; b < cols; b++) ga[(size_t)a * cols + b] += gram[(size_t)a * cols + b];
    }
}

/* One window's product inputs, for every matrix (w: m's layout bound to the tags). */
static void accumulate(const Gather *g, const ZayaConfig *c, const Weights *w, const Activations *a, long *routed) {
    const long N = (long)a->B * a->T;
    const int D = c->hidden_size, Cq = cfg_q_channels(c), R = c->router_hidden_size, I = c->moe_intermediate_size;
    const int E = c->moe == ZY_MOE_DENSE ? 1 : c->num_experts;
    for (int l = 0; l < c->num_layers; l++) {
        const LayerWeights *W = &w->layers[l];
        const LayerActs *L = &a->layers[l];
        /* the attention projections that read u = RMSNorm(x) (CCA's four, or MHA's three), then o_proj */
        float *const reads_u[] = {W->w_q, W->w_k, W->w_v_current, W->w_v_delayed, W->w_v};
        add_input(g, reads_u, 5, 0, L->u_attn, 0, N, D);
        add_input(g, &W->w_o, 1, 0, L->attn_out, 0, N, Cq);
        /* the router: its down projection (or the linear router) reads the MoE input, its MLP layers their own */
        float *const reads_moe_in[] = {W->router_down_w, W->router_w};
        add_input(g, reads_moe_in, 2, 0, L->u_mlp, 0, N, D);
        if (W->router_fc1_w) {
            add_input(g, &W->router_fc1_w, 1, 0, L->router_zn, 0, N, R);
            add_input(g, &W->router_fc2_w, 1, 0, L->router_h1, 0, N, R);
            add_input(g, &W->router_out_w, 1, 0, L->router_h2, 0, N, R);
        }
        /* each expert over the rows routed to it (expert_in and expert_act are grouped by expert) */
        for (int e = 0; e < E; e++) {
            const long r0 = L->expert_offset[e], r1 = L->expert_offset[e + 1];
            routed[(size_t)l * E + e] += r1 - r0;
            add_input(g, &W->expert_gate_up, 1, e, L->expert_in, r0, r1, D);
            add_input(g, &W->expert_down, 1, e, L->expert_act, r0, r1, I);
        }
    }
    /* the head (when tied, the embedding's rows: the head is where its error reaches the logits) */
    add_input(g, &w->lm_head, 1, 0, a->final_normed, 0, N, D);
}

/* Each block's weights: the sums (a column's mean square times the block's token count; the count does not change a
 * row's least-squares fit) floored at QUANT_IMPORTANCE_FLOOR of their mean; a block no token reached, uniform. Gram
 * matrices mirrored to full. */
static void finish(QuantImportance *imp, const ParamTable *t) {
    for (int i = 0; i < imp->count; i++) {
        float *w = imp->of_tensor[i];
        if (!w) continue;
        const ParamInfo *p = &t->info[i];
        const int cols = (int)p->shape[p->ndim - 1], blocks = p->ndim == 3 ? (int)p->shape[0] : 1;
        for (int b = 0; b < blocks; b++) {
            float *row = w + (size_t)b * cols;
            double mean = 0;
            for (int j = 0; j < cols; j++) mean += row[j];
            mean /= cols;
            for (int j = 0; j < cols; j++) row[j] = mean > 0 ? row[j] + QUANT_IMPORTANCE_FLOOR * (float)mean : 1.0f;
            double *gb = imp->gram ? imp->gram[i] + (size_t)b * cols * cols : NULL;
            for (int a = 0; gb && a < cols; a++)
                for (int c = a + 1; c < cols; c++) gb[(size_t)c * cols + a] = gb[(size_t)a * cols + c];
        }
    }
}

/* Bytes of Gram matrices a model needs (every quantizable tensor's blocks × cols²). */
static double gram_bytes(const ParamTable *t) {
    double bytes = 0;
    for (int i = 0; i < t->count; i++) {
        const ParamInfo *p = &t->info[i];
        if (!quant_holds(p)) continue;
        const double cols = (double)p->shape[p->ndim - 1], blocks = p->ndim == 3 ? (double)p->shape[0] : 1;
        bytes += blocks * cols * cols * sizeof(double);
    }
    return bytes;
}

int calibrate_importance(Model *m, ShardSet *data, int seq_len, long tokens, int with_gram, QuantImportance *imp,
                         CalibrationReport *rep, ZyErr *err) {
    const ZayaConfig *c = &m->cfg;
    memset(rep, 0, sizeof *rep);
    memset(imp, 0, sizeof *imp);
    const double t0 = zy_now_seconds();
    const uint64_t avail = shardset_num_tokens(data);
    const ParamTable *t = &m->params;
    if (seq_len < 1 || seq_len > c->max_position_embeddings)
        return zy_fail(err, "calibration: the window length %d must be 1..%d (the model's max_position_embeddings)",
                       seq_len, c->max_position_embeddings);
    if (shardset_vocab_size(data) > c->vocab_size)
        return zy_fail(err, "calibration: the data's vocabulary (%d) is larger than the model's (%d)",
                       shardset_vocab_size(data), c->vocab_size);
    if (avail < (uint64_t)seq_len)
        return zy_fail(err, "calibration: the data's train split holds %llu tokens, fewer than one window of %d",
                       (unsigned long long)avail, seq_len);
    if (with_gram && gram_bytes(t) > CALIBRATION_GRAM_MAX_BYTES)
        return zy_fail(err, "calibration: GPTQ's input statistics (a width² matrix per matrix and expert) need %.1f GB "
                       "for this model, more than the %.0f GB allowed; use --method mse",
                       gram_bytes(t) / 1e9, CALIBRATION_GRAM_MAX_BYTES / 1e9);
    long windows = tokens / seq_len;
    if (windows < 1) windows = 1;
    if ((uint64_t)windows > avail / (uint64_t)seq_len) windows = (long)(avail / (uint64_t)seq_len);
    const uint64_t stride = windows > 1 ? (avail - (uint64_t)seq_len) / (uint64_t)(windows - 1) : 0;

    imp->count = t->count;
    imp->of_tensor = calloc((size_t)t->count, sizeof *imp->of_tensor);
    imp->gram = with_gram ? calloc((size_t)t->count, sizeof *imp->gram) : NULL;
    float *tags = calloc((size_t)t->count, sizeof *tags);
    float **ptrs = calloc((size_t)t->count, sizeof *ptrs);
    Weights w = {.layers = calloc((size_t)c->num_layers, sizeof(LayerWeights))};
    int32_t *tok = malloc((size_t)seq_len * sizeof *tok);
    const int E = c->moe == ZY_MOE_DENSE ? 1 : c->num_experts;
    long *routed = calloc((size_t)c->num_layers * E, sizeof *routed);
    int rc = imp->of_tensor && (imp->gram || !with_gram) && tags && ptrs && w.layers && tok && routed
                 ? 0 : zy_fail(err, "out of memory");
    int widest = 1;
    for (int i = 0; i < t->count && !rc; i++) {
        const ParamInfo *p = &t->info[i];
        if (!quant_holds(p)) continue;
        const int cols = (int)p->shape[p->ndim - 1], blocks = p->ndim == 3 ? (int)p->shape[0] : 1;
        widest = cols > widest ? cols : widest;
        ptrs[i] = tags + i;
        if (!(imp->of_tensor[i] = calloc((size_t)blocks * cols, sizeof(float))) ||
            (with_gram && !(imp->gram[i] = calloc((size_t)blocks * cols * cols, sizeof(double)))))
            rc = zy_fail(err, "out of memory");
    }
    Gather g = {.tags = tags, .imp = imp};
    if (!rc && (!(g.sums = malloc((size_t)widest * sizeof(double))) ||
                (with_gram && !(g.gram = malloc((size_t)widest * widest * sizeof(double))))))
        rc = zy_fail(err, "out of memory");
    Activations a;
    int have_a = 0;
    if (!rc && !(rc = acts_create(&a, c, 1, seq_len, err))) have_a = 1;
    if (!rc) model_bind_tensors(m, ptrs, &w);
    for (long k = 0; k < windows && !rc; k++) {
        if ((rc = shardset_read(data, (uint64_t)k * stride, (size_t)seq_len, tok, err))) break;
        model_forward(m, &a, tok);
        accumulate(&g, c, &w, &a, routed);
        rep->windows++, rep->tokens += seq_len;
    }
    if (!rc) finish(imp, t);
    for (long k = 0; !rc && k < (long)c->num_layers * E; k++) rep->experts_unseen += routed[k] == 0;
    if (have_a) acts_free(&a);
    free(g.sums), free(g.gram), free(tok), free(routed), free(w.layers), free(tags), free(ptrs);
    if (rc) quant_importance_free(imp);
    rep->seconds = zy_now_seconds() - t0;
    return rc;
}

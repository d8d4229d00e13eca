/* Calibration for activation-aware quantization (infer/calibrate.h): the forward's saved activations are the inputs
 * of the products, so the sums are read from them after each window, without hooks in the forward. */
#include "infer/calibrate.h"

#include <stdlib.h>
#include <string.h>

/* sums[j] = Σ_r x[r][j]² over rows [r0, r1) of x [.., cols]. */
static void column_squares(double *sums, const float *x, long r0, long r1, int cols) {
    memset(sums, 0, (size_t)cols * sizeof *sums);
    for (long r = r0; r < r1; r++) {
        const float *row = x + r * cols;
        for (int j = 0; j < cols; j++) sums[j] += (double)row[j] * row[j];
    }
}

static void add_sums(float *acc, const double *sums, int cols) {
    if (!acc) return;
    for (int j = 0; j < cols; j++) acc[j] += (float)sums[j];
}

/* Adds the squares of one window's product inputs to every matrix's accumulator (acc: m's layout bound to them). */
static void accumulate(const ZayaConfig *c, const Weights *acc, const Activations *a, double *sums, long *routed) {
    const long N = (long)a->B * a->T;
    const int D = c->hidden_size, Cq = cfg_q_channels(c), R = c->router_hidden_size, I = c->moe_intermediate_size;
    const int E = c->moe == ZY_MOE_DENSE ? 1 : c->num_experts;
    for (int l = 0; l < c->num_layers; l++) {
        const LayerWeights *W = &acc->layers[l];
        const LayerActs *L = &a->layers[l];
        /* the attention projections that read u = RMSNorm(x) (CCA's four, or MHA's three), then o_proj */
        column_squares(sums, L->u_attn, 0, N, D);
        float *const reads_u[] = {W->w_q, W->w_k, W->w_v_current, W->w_v_delayed, W->w_v};
        for (size_t k = 0; k < ZY_ARRAY_LEN(reads_u); k++) add_sums(reads_u[k], sums, D);
        column_squares(sums, L->attn_out, 0, N, Cq);
        add_sums(W->w_o, sums, Cq);
        /* the router: its down projection (or the linear router) reads the MoE input, its MLP layers their own */
        if (W->router_down_w || W->router_w) {
            column_squares(sums, L->u_mlp, 0, N, D);
            add_sums(W->router_down_w ? W->router_down_w : W->router_w, sums, D);
        }
        if (W->router_fc1_w) {
            const float *in[] = {L->router_zn, L->router_h1, L->router_h2};
            float *const mat[] = {W->router_fc1_w, W->router_fc2_w, W->router_out_w};
            for (int k = 0; k < 3; k++) column_squares(sums, in[k], 0, N, R), add_sums(mat[k], sums, R);
        }
        /* each expert over the rows routed to it (expert_in and expert_act are grouped by expert) */
        for (int e = 0; e < E; e++) {
            const long r0 = L->expert_offset[e], r1 = L->expert_offset[e + 1];
            routed[(size_t)l * E + e] += r1 - r0;
            column_squares(sums, L->expert_in, r0, r1, D);
            add_sums(W->expert_gate_up + (size_t)e * D, sums, D);
            column_squares(sums, L->expert_act, r0, r1, I);
            add_sums(W->expert_down + (size_t)e * I, sums, I);
        }
    }
    /* the head (when tied, the embedding's rows: the head is where its error reaches the logits) */
    column_squares(sums, a->final_normed, 0, N, D);
    add_sums(acc->lm_head, sums, D);
}

/* Each block's weights: the sums (a column's mean square times the block's token count; the count does not change a
 * row's least-squares fit) floored at QUANT_IMPORTANCE_FLOOR of their mean; a block no token reached, uniform. */
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
        }
    }
}

int calibrate_importance(Model *m, ShardSet *data, int seq_len, long tokens, QuantImportance *imp,
                         CalibrationReport *rep, ZyErr *err) {
    const ZayaConfig *c = &m->cfg;
    memset(rep, 0, sizeof *rep);
    memset(imp, 0, sizeof *imp);
    const double t0 = zy_now_seconds();
    const uint64_t avail = shardset_num_tokens(data);
    if (seq_len < 1 || seq_len > c->max_position_embeddings)
        return zy_fail(err, "calibration: the window length %d must be 1..%d (the model's max_position_embeddings)",
                       seq_len, c->max_position_embeddings);
    if (shardset_vocab_size(data) > c->vocab_size)
        return zy_fail(err, "calibration: the data's vocabulary (%d) is larger than the model's (%d)",
                       shardset_vocab_size(data), c->vocab_size);
    if (avail < (uint64_t)seq_len)
        return zy_fail(err, "calibration: the data's train split holds %llu tokens, fewer than one window of %d",
                       (unsigned long long)avail, seq_len);
    long windows = tokens / seq_len;
    if (windows < 1) windows = 1;
    if ((uint64_t)windows > avail / (uint64_t)seq_len) windows = (long)(avail / (uint64_t)seq_len);
    const uint64_t stride = windows > 1 ? (avail - (uint64_t)seq_len) / (uint64_t)(windows - 1) : 0;

    const ParamTable *t = &m->params;
    imp->count = t->count;
    imp->of_tensor = calloc((size_t)t->count, sizeof *imp->of_tensor);
    Weights acc = {.layers = calloc((size_t)c->num_layers, sizeof(LayerWeights))};
    int32_t *tok = malloc((size_t)seq_len * sizeof *tok);
    const int E = c->moe == ZY_MOE_DENSE ? 1 : c->num_experts;
    long *routed = calloc((size_t)c->num_layers * E, sizeof *routed);
    int widest = c->vocab_size;
    int rc = imp->of_tensor && acc.layers && tok && routed ? 0 : zy_fail(err, "out of memory");
    for (int i = 0; i < t->count && !rc; i++) {
        const ParamInfo *p = &t->info[i];
        if (!quant_holds(p)) continue;
        const int cols = (int)p->shape[p->ndim - 1], blocks = p->ndim == 3 ? (int)p->shape[0] : 1;
        widest = cols > widest ? cols : widest;
        if (!(imp->of_tensor[i] = calloc((size_t)blocks * cols, sizeof(float)))) rc = zy_fail(err, "out of memory");
    }
    double *sums = rc ? NULL : malloc((size_t)widest * sizeof *sums);
    if (!rc && !sums) rc = zy_fail(err, "out of memory");
    Activations a;
    int have_a = 0;
    if (!rc && !(rc = acts_create(&a, c, 1, seq_len, err))) have_a = 1;
    if (!rc) model_bind_tensors(m, imp->of_tensor, &acc);
    for (long w = 0; w < windows && !rc; w++) {
        if ((rc = shardset_read(data, (uint64_t)w * stride, (size_t)seq_len, tok, err))) break;
        model_forward(m, &a, tok);
        accumulate(c, &acc, &a, sums, routed);
        rep->windows++, rep->tokens += seq_len;
    }
    if (!rc) finish(imp, t);
    for (long k = 0; !rc && k < (long)c->num_layers * E; k++) rep->experts_unseen += routed[k] == 0;
    if (have_a) acts_free(&a);
    free(sums), free(tok), free(routed), free(acc.layers);
    if (rc) quant_importance_free(imp);
    rep->seconds = zy_now_seconds() - t0;
    return rc;
}

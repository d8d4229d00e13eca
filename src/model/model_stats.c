/* Parameter and cache accounting over the model's own tensor table. */
#include "model/model_stats.h"

#include <string.h>

#include "model/model.h"
#include "model/params.h"

int model_stats_of(ModelStats *s, const ZayaConfig *cfg, int seq_len, ZyErr *err) {
    memset(s, 0, sizeof *s);
    ParamTable t;
    if (model_param_table(&t, cfg, err)) return -1;
    const int moe = cfg->moe != ZY_MOE_DENSE, E = cfg->num_experts;
    for (int i = 0; i < t.count; i++) {
        const ParamInfo *p = &t.info[i];
        if (!param_trainable(p)) continue;
        const int64_t n = (int64_t)p->numel;
        s->total += n;
        /* a routed token passes through one of the E experts (none when skipped: active is an upper bound) */
        s->active += moe && strstr(p->name, ".mlp.experts.") ? n / E : n;
        if (!strcmp(p->name, "model.embed_tokens.weight") || !strcmp(p->name, "lm_head.weight")) s->embedding += n;
    }
    params_free(&t);
    s->kv_bytes_per_token = (int64_t)2 * cfg->num_layers * cfg_k_channels(cfg) * 2;
    s->train_flops_per_token = model_train_flops_per_token(cfg, seq_len);
    return 0;
}

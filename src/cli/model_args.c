#include "model_args.h"

#include <stdio.h>
#include <string.h>

#include "infer/decode.h"
#include "io/model_io.h"
#include "train/runconfig.h"

int model_args_dtype(ModelArgs *a, ZyErr *err) {
    char flag[64];
    snprintf(flag, sizeof flag, "%s: --dtype", a->command);
    a->bf16 = a->dir ? model_resolve_dtype(a->dtype, flag, a->dir, err)
                     : model_parse_dtype(strcmp(a->dtype, "auto") ? a->dtype : "f32", flag, err);
    return a->bf16 < 0 ? -1 : 0;
}

int model_args_device(ModelArgs *a, ZyErr *err) {
    if (runconfig_parse_device(a->device, &a->gpu, &a->gpu_index, err)) return zy_wrap(err, "%s: --device", a->command);
    return 0;
}

int model_args_kv_dtype(ModelArgs *a, ZyErr *err) {
    char flag[64];
    snprintf(flag, sizeof flag, "%s: --kv-dtype", a->command);
    a->kv_bf16 = kv_dtype_resolve(a->kv_dtype, a->bf16, a->gpu, flag, err);
    return a->kv_bf16 < 0 ? -1 : 0;
}

int model_args_load(const ModelArgs *a, Model *m, ZyErr *err) {
    if (model_load_dir_as(m, a->dir, a->gpu ? 0 : a->bf16, err)) return -1;
    model_drop_grads(m); /* inference: no backward */
    return 0;
}

int model_args_tokenizer(const ModelArgs *a, const char *path, const Model *m, Tokenizer **tok, ZyErr *err) {
    if (tokenizer_load(path, tok, err)) return -1;
    if (tokenizer_vocab_size(*tok) > m->cfg.vocab_size)
        return zy_fail(err, "%s: %s has %d tokens, more than the model's vocabulary of %d", a->command, path,
                       tokenizer_vocab_size(*tok), m->cfg.vocab_size);
    return 0;
}

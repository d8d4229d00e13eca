#include "model_args.h"

#include <stdio.h>
#include <string.h>

#include "infer/decode.h"
#include "kernels/quant_many.h"
#include "io/model_io.h"
#include "train/runconfig.h"

int model_args_dtype(ModelArgs *a, ZyErr *err) {
    char flag[64];
    snprintf(flag, sizeof flag, "%s: --dtype", a->command);
    const int d = a->dir ? model_resolve_dtype(a->dtype, flag, a->dir, err)
                         : model_parse_dtype(strcmp(a->dtype, "auto") ? a->dtype : "f32", flag, err);
    a->bf16 = d == MODEL_DTYPE_BF16;
    a->quant_bits = d == MODEL_DTYPE_Q8 || d == MODEL_DTYPE_Q4 ? d : 0;
    return d < 0 ? -1 : 0;
}

int model_args_device(ModelArgs *a, ZyErr *err) {
    if (runconfig_parse_device(a->device, &a->gpu, &a->gpu_index, err)) return zy_wrap(err, "%s: --device", a->command);
    return 0;
}

int model_args_kv_dtype(ModelArgs *a, ZyErr *err) {
    char flag[64];
    snprintf(flag, sizeof flag, "%s: --kv-dtype", a->command);
    /* weights already rounded to bf16 or to 8/4-bit codes: k and v in bf16 too (half the cache's bytes a step reads) */
    a->kv_bf16 = kv_dtype_resolve(a->kv_dtype, a->bf16 || a->quant_bits, flag, err);
    return a->kv_bf16 < 0 ? -1 : 0;
}

int model_args_quant_device(const ModelArgs *a, ZyErr *err) {
    if (a->gpu && a->quant_bits)
        return zy_fail(err, "%s: --device %s: quantized weights (--dtype q%d, %s) run on the CPU only for now "
                       "(--device cpu; or --dtype f32 to load them dequantized)", a->command, a->device, a->quant_bits,
                       a->dir);
    return 0;
}

int model_args_load(const ModelArgs *a, Model *m, ZyErr *err) {
    if (model_args_quant_device(a, err)) return -1;
    /* on a GPU, bf16 loads mapped too: its matrices go up from the files (gpu_weight_upload.h), no fp32 host copy */
    if (model_load_dir_as(m, a->dir, a->quant_bits ? a->quant_bits : a->bf16, err)) return -1;
    model_drop_grads(m); /* inference: no backward */
    return 0;
}

const char *model_args_dtype_name(const ModelArgs *a) {
    return a->quant_bits == 8 ? "q8" : a->quant_bits == 4 ? "q4" : a->bf16 ? "bf16" : "f32";
}

void model_args_print_quant(const ModelArgs *a, const Model *m) {
    if (!a->quant_bits) return;
    size_t mapped, copied;
    model_weight_bytes(m, &mapped, &copied);
    fprintf(stderr, "weights           q%d (%d-bit codes read in place from the mapped files, groups of %d): %.1f MB "
            "mapped, %.1f MB copied\n", a->quant_bits, a->quant_bits, m->cfg.quant_group_size, mapped / 1e6, copied / 1e6);
    char many[256];
    zy_quant_many_describe(zy_quant_many(), many, sizeof many);
    fprintf(stderr, "quant kernels     %s, %s; more than %d rows: %s\n", zy_quant_kernel_name(zy_quant_kernel_for_level()),
            zy_quant_way_describe(zy_quant_way()), ZY_QUANT_MAX_ROWS, many);
}

int model_args_tokenizer(const ModelArgs *a, const char *path, const Model *m, Tokenizer **tok, ZyErr *err) {
    if (tokenizer_load(path, tok, err)) return -1;
    if (tokenizer_vocab_size(*tok) > m->cfg.vocab_size)
        return zy_fail(err, "%s: %s has %d tokens, more than the model's vocabulary of %d", a->command, path,
                       tokenizer_vocab_size(*tok), m->cfg.vocab_size);
    return 0;
}

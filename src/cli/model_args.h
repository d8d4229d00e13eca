/* model_args: the options of the commands that run a model (--model, --dtype, --device, --kv-dtype), resolved and
 * loaded one way, their errors naming the command's flag ("generate: --dtype: ..."). */
#ifndef ZAYA_CLI_MODEL_ARGS_H
#define ZAYA_CLI_MODEL_ARGS_H

#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "util/util.h"

/* Made once the flags are parsed: {.command = "generate", .dir = model_dir, .dtype = dtype, ...}. */
typedef struct {
    const char *command;                         /* "generate": what errors start with */
    const char *dir, *dtype, *device, *kv_dtype; /* the flags' values (kv_dtype NULL: the command has none) */
    int bf16, gpu, gpu_index, kv_bf16;           /* what they resolve to */
    int quant_bits; /* --dtype q8|q4 (or auto on a quantized folder): 8 or 4, the codes read in place; else 0 */
} ModelArgs;

/* Each flag on its own, so a command keeps the order its checks are made in. --dtype: f32, bf16, q8, q4 or auto (a
 * quantized folder's bits; bf16 when every matrix the model directory stores is bf16; f32 without a directory). */
int model_args_dtype(ModelArgs *a, ZyErr *err);
/* --device: cpu, cuda or cuda:N. */
int model_args_device(ModelArgs *a, ZyErr *err);
/* --kv-dtype for the resolved weights on the resolved device. */
int model_args_kv_dtype(ModelArgs *a, ZyErr *err);
/* Quantized weights on a GPU: an error naming the command, --device and the folder (no GPU kernels read them). */
int model_args_quant_device(const ModelArgs *a, ZyErr *err);
/* The model for inference, without gradients, as --dtype says on either device: bf16 is the mapped load (no fp32
 * host arena; a GPU uploads the bf16 matrices from the files and widens them itself), and quantized weights are
 * refused on a GPU (the quantized kernels are the CPU's). */
int model_args_load(const ModelArgs *a, Model *m, ZyErr *err);
/* The tokenizer at path for m: one with more tokens than the model's vocabulary is refused (*tok is set either way:
 * the caller frees it). */
/* The resolved weights' name: "q8", "q4", "bf16" or "f32". */
const char *model_args_dtype_name(const ModelArgs *a);
/* The start-up line of quantized weights: "weights  q4 (4-bit codes read in place, groups of 64): 150.2 MB mapped;
 * kernels avx2, int8 (...)" on stderr; nothing for others. */
void model_args_print_quant(const ModelArgs *a, const Model *m);
int model_args_tokenizer(const ModelArgs *a, const char *path, const Model *m, Tokenizer **tok, ZyErr *err);

#endif

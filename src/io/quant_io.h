/* quant_io: model folders whose matrices are quantized in MLX's affine layout (kernels/quant.h), as mlx-lm writes
 * them: config.json's "quantization" {"group_size", "bits", "mode": "affine"} (copied to "quantization_config"), and
 * for each quantized tensor T of the model's layout, T itself as the packed U32 codes [..., cols·bits/32] and, with
 * B = T less a trailing ".weight", B.scales and B.biases [..., cols/group_size] (BF16, F16 or F32, as the matrix
 * was). Every other tensor keeps its name, shape and dtype. A matrix may also stay unquantized (mlx-lm's per-module
 * `false`): then it has no B.scales. */
#ifndef ZAYA_QUANT_IO_H
#define ZAYA_QUANT_IO_H

#include <stddef.h>

#include "io/quant_plan.h"
#include "model/model.h"
#include "util/util.h"

/* For a command that needs unquantized weights (what: "train", "ckpt export", "convert"): 0 when DIR is not
 * quantized, else an error naming the command, the folder and its quantization. */
int quant_dir_refuse(const char *dir, const char *what, ZyErr *err);

/* The tensors zaya quantize quantizes: every matrix a product reads (model_holds_bf16: projections, router
 * matrices, experts, the embedding / head). */
int quant_holds(const ParamInfo *p);
/* B of a tensor name: the name less a trailing ".weight" (the module's path, as mlx names scales and biases). */
void quant_base_name(char *out, size_t cap, const char *name);

/* Activation-aware quantization (infer/calibrate.h): for each tensor i of the model's table, NULL (every column's
 * error weighs the same) or the weight of each column's squared error, one row of cols values per block of rows —
 * k blocks for a tensor [k, rows/k, cols] of 3 dimensions (an expert stack: a row per expert), 1 for a matrix. */
typedef struct {
    float **of_tensor;
    double **gram; /* NULL, or per tensor NULL or [blocks][cols][cols]: the inputs' Σ x xᵀ, for --method gptq */
    int count;
} QuantImportance;
/* Importance is floored at this share of its row's mean, so that columns no calibration input reached still count. */
#define QUANT_IMPORTANCE_FLOOR 0.05f
void quant_importance_free(QuantImportance *imp);
/* Whether a method and what calibration gives go together: mlx's rule takes no importance, gptq needs the Gram
 * matrices (have_gram). An error naming the method otherwise. */
int quant_calibration_check(ZyQuantMethod method, int have_importance, int have_gram, ZyErr *err);

typedef struct {
    int matrices;                  /* tensors quantized */
    double values;                 /* their elements */
    double bytes_in, bytes_out;    /* the source's tensor bytes, the output's */
    double quant_bytes;            /* the output's bytes of quantized tensors (codes, scales, biases) */
    int shards;
} QuantizeReport;
/* zaya quantize: SRC (a bf16, f16 or fp32 model folder, native layout) into OUT, each matrix in the plan's format
 * (io/quant_plan.h; a class's own format is a per-module entry in config.json), tensor by tensor from the mapped
 * source (one tensor's output in memory at a time), in shards of at most shard_bytes with an index; config.json is
 * SRC's with "quantization" added, and the tokenizer files are copied. importance (NULL: none) weights the mse
 * method's error per column (it needs plan->method == ZY_QUANT_MSE; its count must be the table's). Bad input is an
 * error naming the tensor (a width the group size does not divide, a value that is not finite). */
int quant_model_dir(const char *src, const char *out, const QuantPlan *plan, const QuantImportance *importance,
                    size_t shard_bytes, QuantizeReport *rep, ZyErr *err);

/* Loads a quantized folder for inference, every tensor checked against the config — the codes U32 and [...,
 * cols·bits/32] (a shorter row is a truncated weight), scales and biases of one float dtype and [..., cols/group_size]
 * — with errors naming the tensor. in_place (`--dtype q8|q4`): the matrices are read where they lie in the mapped
 * files (ZyWeights' quantized view: no dequantized copy), the tensors left unquantized are fp32 copies; else fp32
 * weights (each matrix dequantized: s·q + b in fp32, the values every quantized kernel multiplies by: `--dtype f32`).
 * model_load_dir_as reads quantized folders through it. */
int quant_load(Model *m, const char *dir, int in_place, ZyErr *err);
/* For a model quant_load read in place: 1, the bytes of its codes, scales and biases used where they lie in the
 * mapped files, and of its fp32 copies; else 0 (not such a model). */
int quant_weight_bytes(const Model *m, size_t *mapped, size_t *copied);

#endif

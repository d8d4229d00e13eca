/* zaya quantize: a bf16 / fp32 model folder into MLX's affine 8- or 4-bit layout (io/quant_io.h), each class of
 * matrices in the format io/quant_plan.h gives it. */
#include <stdio.h>
#include <string.h>

#include "args.h"
#include "commands.h"
#include "infer/calibrate.h"
#include "io/model_io.h"
#include "io/quant_io.h"
#include "io/quant_plan.h"

/* --method NAME over the plan's default for its bits (NULL: the default). */
static int plan_set_method(QuantPlan *plan, const char *name, ZyErr *err) {
    if (!name) return 0;
    const int m = zy_quant_method_parse(name);
    if (m < 0) return zy_fail(err, "quantize: --method must be mlx, mse or gptq (got \"%s\")", name);
    plan->method = (ZyQuantMethod)m;
    return 0;
}

/* --calibration DATA: the model run over DATA's train split, each matrix's column importance (infer/calibrate.h). */
static int calibrate(const char *model_dir, const char *data_dir, long tokens, int seq_len, int with_gram,
                     QuantImportance *imp, ZyErr *err) {
    Model m;
    ShardSet *data = NULL;
    CalibrationReport rep;
    const int dtype = model_resolve_dtype("auto", "--model", model_dir, err);
    if (dtype < 0 || model_load_dir_as(&m, model_dir, dtype, err)) return -1;
    if (seq_len <= 0) seq_len = m.cfg.max_position_embeddings < 512 ? m.cfg.max_position_embeddings : 512;
    int rc = shardset_open(&data, data_dir, "train", 0, err);
    if (!rc) rc = calibrate_importance(&m, data, seq_len, tokens, with_gram, imp, &rep, err);
    if (!rc)
        printf("calibrated on %ld tokens of %s (%d windows of %d), %.1f s%s\n", rep.tokens, data_dir, rep.windows,
               seq_len, rep.seconds, rep.experts_unseen ? "" : "; every expert saw tokens");
    if (!rc && rep.experts_unseen)
        printf("  %d (layer, expert) pairs saw no calibration token: their columns weigh the same\n",
               rep.experts_unseen);
    if (data) shardset_close(data);
    model_free(&m);
    return rc;
}

int cmd_quantize(int argc, char **argv) {
    const char *model_dir = NULL, *out = NULL, *keep_float = NULL, *method = NULL, *calibration = NULL;
    int bits = 0, group_size = 64, router_bits = QUANT_ROUTER_BITS, calib_seq_len = 0;
    uint64_t calib_tokens = 16384;
    double shard_mb = 5000;
    ArgSpec specs[] = {
        {"--model", ARG_STRING, 1, &model_dir, "the model folder to quantize (bf16, f16 or f32; native layout)", 0},
        {"--out", ARG_STRING, 1, &out, "output folder (MLX's affine layout: U32 codes, scales, biases)", 0},
        {"--bits", ARG_INT, 1, &bits, "8 or 4", 0},
        {"--group-size", ARG_INT, 0, &group_size, "columns sharing a scale and a bias: 32, 64 (default) or 128", 0},
        {"--router-bits", ARG_INT, 0, &router_bits,
         "the router's matrices (mlp.gate.*): 8 (default; with --bits 4 in groups of 64, as mlx-lm keeps MoE gates) "
         "or 4 (like the rest)", 0},
        {"--keep-float", ARG_STRING, 0, &keep_float,
         "classes of matrices left unquantized, comma-separated: attention, router, experts, embedding", 0},
        {"--method", ARG_STRING, 0, &method,
         "how each group's scale and bias are chosen: mlx (mx.quantize's min/max rule, bit for bit), mse (least "
         "squared error of the dequantized values, same layout) or gptq (GPTQ's error compensation over the "
         "calibration inputs; needs --calibration); default mse at 4 bits, mlx at 8", 0},
        {"--calibration", ARG_STRING, 0, &calibration,
         "token shards (zaya data prepare's folder) whose train split the model runs over first: each matrix's error "
         "is then weighted by the mean square of its inputs (activation-aware; --method mse, the default with it, or gptq)", 0},
        {"--calibration-tokens", ARG_U64, 0, &calib_tokens, "tokens of calibration data to run (default 16384)", 0},
        {"--calibration-seq-len", ARG_INT, 0, &calib_seq_len,
         "tokens per calibration window (default 512, or the model's max_position_embeddings if fewer)", 0},
        {"--shard-size", ARG_FLOAT, 0, &shard_mb, "MB per safetensors shard (default 5000)", 0},
    };
    const int n = ZY_ARRAY_LEN(specs);
    if (args_help(argc, argv, 2, "quantize",
                  "--model DIR --out DIR --bits 8|4 [--group-size 32|64|128] [--router-bits 8|4] [--keep-float CLASSES] "
                  "[--method mlx|mse|gptq] [--calibration DATA [--calibration-tokens N] [--calibration-seq-len T]] [--shard-size MB]",
                  specs, n))
        return 0;
    ZyErr err = {{0}};
    QuantizeReport rep;
    QuantPlan plan;
    QuantImportance importance = {0};
    const double t0 = zy_now_seconds();
    if (args_parse(argc, argv, 2, specs, n, NULL, 0, NULL, "quantize", &err) ||
        (!(shard_mb * 1e6 >= 1) && zy_fail(&err, "quantize: --shard-size must be a positive number of MB (got %g)", shard_mb)) ||
        quant_plan_make(&plan, bits, group_size, router_bits, keep_float, &err) ||
        plan_set_method(&plan, calibration && !method ? "mse" : method, &err) ||
        quant_calibration_check(plan.method, calibration != NULL, calibration != NULL, &err) ||
        (calibration && (calib_tokens < 1 || calib_tokens > (1ull << 40)) &&
         zy_fail(&err, "quantize: --calibration-tokens must be 1..2^40 (got %llu)", (unsigned long long)calib_tokens)) ||
        (calibration && quant_dir_refuse(model_dir, "quantize", &err)) ||
        (calibration && calibrate(model_dir, calibration, (long)calib_tokens, calib_seq_len, plan.method == ZY_QUANT_GPTQ,
                                  &importance, &err)) ||
        quant_model_dir(model_dir, out, &plan, calibration ? &importance : NULL, (size_t)(shard_mb * 1e6), &rep, &err)) {
        fprintf(stderr, "zaya: %s\n", err.msg);
        quant_importance_free(&importance);
        return 1;
    }
    quant_importance_free(&importance);
    char except[256];
    quant_plan_describe(&plan, except, sizeof except);
    printf("quantized %s -> %s: %d matrices (%.4g M values) to %d-bit codes in groups of %d%s%s%s, %.2f bits per value "
           "with scales and biases (%s%s); %.1f MB of tensors from %.1f MB, %d shard%s, %.1f s\n",
           model_dir, out, rep.matrices, rep.values / 1e6, bits, group_size, except[0] ? " (" : "", except,
           except[0] ? ")" : "", rep.values > 0 ? 8 * rep.quant_bytes / rep.values : 0.0,
           zy_quant_method_name(plan.method), calibration ? ", calibrated" : "", rep.bytes_out / 1e6, rep.bytes_in / 1e6, rep.shards, rep.shards > 1 ? "s" : "", zy_now_seconds() - t0);
    return 0;
}

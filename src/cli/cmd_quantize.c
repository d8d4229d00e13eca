/* zaya quantize: a bf16 / fp32 model folder into MLX's affine 8- or 4-bit layout (io/quant_io.h), each class of
 * matrices in the format io/quant_plan.h gives it. */
#include <stdio.h>
#include <string.h>

#include "args.h"
#include "commands.h"
#include "io/quant_io.h"
#include "io/quant_plan.h"

/* --method NAME over the plan's default for its bits (NULL: the default). */
static int plan_set_method(QuantPlan *plan, const char *name, ZyErr *err) {
    if (!name) return 0;
    const int m = zy_quant_method_parse(name);
    if (m < 0) return zy_fail(err, "quantize: --method must be mlx or mse (got \"%s\")", name);
    plan->method = (ZyQuantMethod)m;
    return 0;
}

int cmd_quantize(int argc, char **argv) {
    const char *model_dir = NULL, *out = NULL, *keep_float = NULL, *method = NULL;
    int bits = 0, group_size = 64, router_bits = QUANT_ROUTER_BITS;
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
         "how each group's scale and bias are chosen: mlx (mx.quantize's min/max rule, bit for bit) or mse (least "
         "squared error of the dequantized values, same layout); default mse at 4 bits, mlx at 8", 0},
        {"--shard-size", ARG_FLOAT, 0, &shard_mb, "MB per safetensors shard (default 5000)", 0},
    };
    const int n = ZY_ARRAY_LEN(specs);
    if (args_help(argc, argv, 2, "quantize",
                  "--model DIR --out DIR --bits 8|4 [--group-size 32|64|128] [--router-bits 8|4] [--keep-float CLASSES] "
                  "[--method mlx|mse] [--shard-size MB]", specs, n))
        return 0;
    ZyErr err = {{0}};
    QuantizeReport rep;
    QuantPlan plan;
    const double t0 = zy_now_seconds();
    if (args_parse(argc, argv, 2, specs, n, NULL, 0, NULL, "quantize", &err) ||
        (!(shard_mb * 1e6 >= 1) && zy_fail(&err, "quantize: --shard-size must be a positive number of MB (got %g)", shard_mb)) ||
        quant_plan_make(&plan, bits, group_size, router_bits, keep_float, &err) ||
        plan_set_method(&plan, method, &err) ||
        quant_model_dir(model_dir, out, &plan, (size_t)(shard_mb * 1e6), &rep, &err)) {
        fprintf(stderr, "zaya: %s\n", err.msg);
        return 1;
    }
    char except[256];
    quant_plan_describe(&plan, except, sizeof except);
    printf("quantized %s -> %s: %d matrices (%.4g M values) to %d-bit codes in groups of %d%s%s%s, %.2f bits per value "
           "with scales and biases (%s); %.1f MB of tensors from %.1f MB, %d shard%s, %.1f s\n",
           model_dir, out, rep.matrices, rep.values / 1e6, bits, group_size, except[0] ? " (" : "", except,
           except[0] ? ")" : "", rep.values > 0 ? 8 * rep.quant_bytes / rep.values : 0.0,
           zy_quant_method_name(plan.method), rep.bytes_out / 1e6, rep.bytes_in / 1e6, rep.shards, rep.shards > 1 ? "s" : "", zy_now_seconds() - t0);
    return 0;
}

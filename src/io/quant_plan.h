/* quant_plan: which matrices `zaya quantize` gives which format. The matrices fall into four classes by their role
 * (attention projections, the router, the experts / MLP, the embedding which is also the tied head); each class
 * gets the folder's default format, a format of its own, or stays unquantized. The default plan follows mlx-lm's
 * quant_predicate for MoE models (qwen3_moe.py: a path ending "mlp.gate" gets {"group_size": 64, "bits": 8}): at 4
 * bits the router stays at 8 bits, groups of 64 — measured: it is where 4-bit top-1 agreement is lost
 * (docs/quantization.md). A class's own format is written as mlx-lm's per-module entries in config.json. */
#ifndef ZAYA_QUANT_PLAN_H
#define ZAYA_QUANT_PLAN_H

#include "kernels/quant_mse.h"
#include "util/util.h"

typedef enum {
    QUANT_CLASS_ATTENTION, /* self_attn.* projections */
    QUANT_CLASS_ROUTER,    /* mlp.gate.* (the router MLP's matrices, or a linear router) */
    QUANT_CLASS_EXPERTS,   /* mlp.experts.* stacks (or a dense variant's MLP) */
    QUANT_CLASS_EMBEDDING, /* model.embed_tokens (gathered; the tied head) and an untied lm_head */
    QUANT_CLASS_COUNT
} QuantClass;

typedef struct {
    int bits; /* 8 or 4; 0: left unquantized (mlx-lm's per-module false) */
    int group_size;
} QuantFormat;

typedef struct {
    QuantFormat defaults;                   /* config.json's "quantization" {"bits", "group_size"} */
    QuantFormat of_class[QUANT_CLASS_COUNT]; /* what each class gets */
    ZyQuantMethod method;                   /* how groups' scales and biases are chosen (--method) */
} QuantPlan;

/* The default --method at BITS bits: the one measured closer to the unquantized model (docs/quantization.md). */
ZyQuantMethod quant_method_default(int bits);

/* The router's format when it differs from a 4-bit default: mlx-lm's MoE gate entry. */
enum { QUANT_ROUTER_BITS = 8, QUANT_ROUTER_GROUP_SIZE = 64 };

/* The class of a matrix by its tensor name (a parameter that quant_holds). */
QuantClass quant_class_of(const char *name);
/* "attention", "router", "experts", "embedding" */
const char *quant_class_name(QuantClass c);

/* The plan for `zaya quantize --bits B --group-size G [--router-bits R] [--keep-float CLASSES]`: every class at B in
 * groups of G, except the router at R bits (R == B: like the rest; else groups of QUANT_ROUTER_GROUP_SIZE), and the
 * classes named in keep_float (comma-separated class names; NULL or "" for none) left unquantized. Errors name the
 * option and the bad value. */
int quant_plan_make(QuantPlan *plan, int bits, int group_size, int router_bits, const char *keep_float, ZyErr *err);

/* The format of one matrix (by name, cols wide) under the plan: its class's, in the folder's groups where the class's
 * own do not divide cols. */
QuantFormat quant_plan_format(const QuantPlan *plan, const char *name, int cols);

/* What differs from the defaults, for a report line: "router 8-bit in groups of 64, embedding unquantized" ("" when
 * nothing does). */
void quant_plan_describe(const QuantPlan *plan, char *out, size_t cap);

#endif

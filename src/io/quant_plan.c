#include "io/quant_plan.h"

#include <stdio.h>
#include <string.h>

#include "kernels/quant.h"

static const char *const class_names[QUANT_CLASS_COUNT] = {"attention", "router", "experts", "embedding"};

const char *quant_class_name(QuantClass c) { return c >= 0 && c < QUANT_CLASS_COUNT ? class_names[c] : "?"; }

QuantClass quant_class_of(const char *name) {
    if (strstr(name, ".self_attn.")) return QUANT_CLASS_ATTENTION;
    if (strstr(name, ".mlp.gate.")) return QUANT_CLASS_ROUTER; /* not ".mlp.gate_up_proj": the dense MLP */
    if (strstr(name, ".mlp.")) return QUANT_CLASS_EXPERTS;
    return QUANT_CLASS_EMBEDDING; /* model.embed_tokens.weight, lm_head.weight: the only other matrices */
}

int quant_plan_make(QuantPlan *plan, int bits, int group_size, int router_bits, const char *keep_float, ZyErr *err) {
    if (zy_quant_format_check(bits, group_size, err)) return zy_wrap(err, "quantize");
    if (router_bits != 8 && router_bits != 4)
        return zy_fail(err, "quantize: --router-bits %d: the router is quantized to 8 or 4 bits", router_bits);
    plan->defaults = (QuantFormat){bits, group_size};
    plan->method = quant_method_default(bits);
    for (int c = 0; c < QUANT_CLASS_COUNT; c++) plan->of_class[c] = plan->defaults;
    if (router_bits != bits) plan->of_class[QUANT_CLASS_ROUTER] = (QuantFormat){router_bits, QUANT_ROUTER_GROUP_SIZE};
    for (const char *p = keep_float ? keep_float : ""; *p;) {
        const size_t n = strcspn(p, ",");
        int found = 0;
        for (int c = 0; c < QUANT_CLASS_COUNT && !found; c++)
            if (n == strlen(class_names[c]) && strncmp(p, class_names[c], n) == 0)
                plan->of_class[c] = (QuantFormat){0, 0}, found = 1;
        if (!found)
            return zy_fail(err, "quantize: --keep-float \"%s\": \"%.*s\" is not a class of matrices (attention, router, "
                           "experts, embedding)", keep_float, (int)n, p);
        p += n + (p[n] == ',');
    }
    return 0;
}

ZyQuantMethod quant_method_default(int bits) { return bits == 4 ? ZY_QUANT_MSE : ZY_QUANT_MLX; }

QuantFormat quant_plan_format(const QuantPlan *plan, const char *name, int cols) {
    QuantFormat f = plan->of_class[quant_class_of(name)];
    /* a class's own groups that do not divide this width fall back to the folder's (a 32-wide router at --group-size
     * 32): the folder's group size is what the user chose to fit the widths */
    if (f.bits && cols % f.group_size != 0) f.group_size = plan->defaults.group_size;
    return f;
}

void quant_plan_describe(const QuantPlan *plan, char *out, size_t cap) {
    out[0] = '\0';
    for (int c = 0; c < QUANT_CLASS_COUNT; c++) {
        const QuantFormat f = plan->of_class[c];
        const size_t len = strlen(out);
        if (f.bits == plan->defaults.bits && f.group_size == plan->defaults.group_size) continue;
        if (f.bits)
            snprintf(out + len, cap - len, "%s%s %d-bit in groups of %d", len ? ", " : "", class_names[c], f.bits,
                     f.group_size);
        else
            snprintf(out + len, cap - len, "%s%s unquantized", len ? ", " : "", class_names[c]);
    }
}

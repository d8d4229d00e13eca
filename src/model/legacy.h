/* legacy: Zyphra's legacy (Megatron-style) ZAYA1 checkpoints — ZAYA1-base, ZAYA1-8B-legacy — read directly
 * (RELEASES.md): their config schemas become the native one, and their tensor names map onto the native
 * layout (one native layer per legacy attention + MoE pair; per-expert tensors into the stacked ones). */
#ifndef ZAYA_LEGACY_H
#define ZAYA_LEGACY_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "util/util.h"

/* 1 when a config.json object is in a legacy schema (ffn_hidden_size / zaya_layers / norm_epsilon and no
 * moe_intermediate_size). */
int legacy_config_detect(const cJSON *root);
/* A native config object for a legacy one (malloc'ed cJSON; NULL with err naming the key). Sliding-window layers
 * ("swa_layers" / "layer_types", "swa_rotary_base") become native "hybrid_sliding" layers (config.h); settings zaya
 * does not implement (zaya_use_eda false, cca false, ...) are refused. */
cJSON *legacy_config_to_native(const cJSON *root, const char *label, ZyErr *err);

/* The native name of a legacy tensor (num_layers = native layers); *expert = the expert index for a per-expert
 * tensor (its native tensor is the stack [E, ...]), else -1. Returns 0, or -1 with err for a name that has no
 * native place. Also maps the native router-norm alias (mlp.gate.router_mlp.rmsnorm_eda). */
int legacy_tensor_name(const char *name, int num_layers, char *out, size_t cap, int *expert, ZyErr *err);
/* The native alias only (for native checkpoints): 1 and the new name in out when name is an alias, else 0. */
int native_alias_name(const char *name, char *out, size_t cap);

#endif

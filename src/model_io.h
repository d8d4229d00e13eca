/* model_io: a model directory in the Hugging Face layout — config.json + model.safetensors (or the sharded
 * model.safetensors.index.json form) — to and from a Model. */
#ifndef ZAYA_MODEL_IO_H
#define ZAYA_MODEL_IO_H

#include "model.h"
#include "util.h"

/* Loads DIR/config.json and the weights. Every tensor of the layout must be present with its exact shape
 * and a float dtype (F32, BF16, F16); an unknown tensor is an error too. */
int model_load_dir(Model *m, const char *dir, ZyErr *err);
/* The same with bf16 weights when bf16 is set (model_use_bf16's result), converting each tensor as it is read so
 * the fp32 copy of the whole model never exists: resident memory peaks near the bf16 size. */
int model_load_dir_as(Model *m, const char *dir, int bf16, ZyErr *err);
/* Loads weights for an already-created model from a safetensors file or an index. */
int model_load_weights(Model *m, const char *dir, ZyErr *err);
/* Writes DIR/config.json and DIR/model.safetensors (parameters in `dtype`: ZY_DT_F32 or ZY_DT_BF16;
 * balancing biases always F32). Creates DIR if needed. */
int model_save_dir(const Model *m, const char *dir, ZyDtype dtype, ZyErr *err);

/* DIR/generation_config.json, as transformers' GenerationConfig reads it: the stop ids and the sampling defaults a
 * release ships. Keys zaya does not use are ignored; a key it uses with the wrong type is an error naming it. */
#define GEN_MAX_EOS 16
typedef struct {
    int present;               /* the file exists */
    int n_eos;                 /* eos_token_id: an integer or a list */
    int32_t eos[GEN_MAX_EOS];
    int has_do_sample, do_sample;
    int has_temperature, has_top_k, has_top_p;
    double temperature, top_p;
    int top_k;
} GenerationConfig;
/* 0 with gc->present = 0 when the file is absent. */
int generation_config_load(GenerationConfig *gc, const char *dir, ZyErr *err);

#endif

/* model_io: a model directory in the Hugging Face layout — config.json + model.safetensors (or the sharded
 * model.safetensors.index.json form) — to and from a Model. */
#ifndef ZAYA_MODEL_IO_H
#define ZAYA_MODEL_IO_H

#include "model/model.h"
#include "util/util.h"

/* Loads DIR/config.json and the weights. Every tensor of the layout must be present with its exact shape
 * and a float dtype (F32, BF16, F16); an unknown tensor is an error too. */
int model_load_dir(Model *m, const char *dir, ZyErr *err);
/* The same with bf16 inference weights when bf16 is set (the values of model_load_dir + model_use_bf16): no fp32
 * arena at all (model_create_views). Matrices stored bf16 are used where the memory-mapped shards hold them (zero
 * copy: resident memory is the file pages a run touches, backed by the page cache); a matrix stored F32/F16 gets its
 * own bf16 copy; vectors and the convolution kernels are fp32 copies (small). Inference only: no gradients, no
 * optimizer (training from a bf16 release loads fp32 master weights with model_load_dir). */
/* dtype is a ModelDtype (0 and 1: f32 and bf16, as above). A quantized folder (config.json "quantization") loads
 * with MODEL_DTYPE_Q8 or Q4 matching its bits (its codes read in place: quant_load) or f32 (dequantized); bf16 on it,
 * or q8/q4 on a folder that is not quantized (or holds the other bits), is an error naming the folder. */
int model_load_dir_as(Model *m, const char *dir, int dtype, ZyErr *err);
/* The share (0..1, by element count) of the matrices bf16 inference holds in bf16 that DIR stores as BF16: 1 for
 * a bf16 release (`--dtype auto` then runs it in bf16). Reads only the headers. */
int model_dir_bf16_share(const char *dir, double *share, ZyErr *err);
/* A --dtype value as a ModelDtype: f32/bf16 as model_parse_dtype, "q8"/"q4", or "auto": a quantized folder's bits,
 * else bf16 when every matrix DIR stores is BF16 (a bf16 release stays bf16), else f32; -1 with an error. */
int model_resolve_dtype(const char *s, const char *flag, const char *dir, ZyErr *err);
/* Where m's weights are: bytes used in place in the mapped shards, and bytes of copies (fp32 vectors, bf16 copies
 * of matrices stored otherwise; for a model not loaded mapped, its arenas). */
void model_weight_bytes(const Model *m, size_t *mapped, size_t *copied);
/* Where m holds tensor i of its table for a copy elsewhere (a GPU's upload): its fp32 values (*f32) or, for a
 * matrix bf16 inference keeps in bf16, its bf16 values (*bf16; the mapped file itself where it was stored bf16): the
 * other is NULL. An fp32 arena without bf16 twins gives fp32 for every tensor. -1 with an error naming the tensor
 * when m holds it neither way (a quantized folder read in place). */
int model_tensor_source(const Model *m, int i, const float **f32, const uint16_t **bf16, ZyErr *err);
/* zaya init without the model in memory: cfg's tensors initialised as model_init_weights(seed) would (the same
 * values, bit for bit, before rounding to dtype F32 or BF16; balancing biases F32) are made and written one chunk at
 * a time, in shards of at most shard_bytes (0: one file) named as transformers names them
 * (model-00001-of-0000N.safetensors + model.safetensors.index.json; one shard = model.safetensors), with config.json.
 * *n_shards (may be NULL) gets the number of files. */
int model_init_streamed(const ZayaConfig *cfg, uint64_t seed, const char *dir, ZyDtype dtype, size_t shard_bytes,
                        int *n_shards, ZyErr *err);
/* The weight files of DIR: model.safetensors, or the shards its model.safetensors.index.json names (each must exist;
 * errors name the index). Free with model_weight_files_free. */
int model_weight_files(const char *dir, char ***files, int *n_files, ZyErr *err);
void model_weight_files_free(char **files, int n_files);
/* Shard file names as transformers writes them: model.safetensors alone, else model-0000k-of-0000n.safetensors
 * (shard 0-based). */
void model_shard_name(char *out, size_t cap, int shard, int n_shards);
/* DIR/model.safetensors.index.json (n_shards > 1; nothing otherwise): total_size and each tensor's shard; a stale
 * DIR/model.safetensors is removed (it would be read in the shards' place). */
int model_write_index(const char *dir, const char *const *names, const int *shard_of, int n, int n_shards,
                      double total_bytes, ZyErr *err);
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
/* The ids generation stops at: config.json's eos_token_id, the tokenizer's eos (tokenizer_eos; -1 for none), and
 * generation_config.json's (gc may be NULL), in that order without repeats; out holds GEN_MAX_STOPS. Returns the
 * count. */
#define GEN_MAX_STOPS (2 + GEN_MAX_EOS)
int generation_stop_ids(int32_t *out, int model_eos, int tokenizer_eos, const GenerationConfig *gc);

#endif

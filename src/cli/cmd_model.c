/* zaya init / forward / convert: create, run and rewrite model directories. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "commands.h"
#include "model_args.h"
#include "model/config.h"
#include "gpu/gpu_model.h"
#include "model/model.h"
#include "io/model_io.h"
#include "io/npy.h"
#include "io/quant_io.h"
#include "train/runconfig.h"
#include "io/safetensors.h"

int cmd_init(int argc, char **argv) {
    const char *config_path = NULL, *out = NULL, *dtype = "f32";
    uint64_t seed = 0;
    double shard_mb = 5000;
    ArgSpec specs[] = {
        {"--config", ARG_STRING, 1, &config_path, "model config.json (Hugging Face ZAYA keys)", 0},
        {"--out", ARG_STRING, 1, &out, "output model directory", 0},
        {"--seed", ARG_U64, 0, &seed, "initialisation seed (default 0)", 0},
        {"--dtype", ARG_STRING, 0, &dtype, "f32 (default) or bf16: the f32 values rounded to nearest even", 0},
        {"--shard-size", ARG_FLOAT, 0, &shard_mb,
         "MB per safetensors shard (default 5000; a larger model gets model-0000k-of-0000n files and an index)", 0},
    };
    const int n = ZY_ARRAY_LEN(specs);
    if (args_help(argc, argv, 2, "init", "--config CFG.json --out DIR [--seed N] [--dtype f32|bf16] [--shard-size MB]", specs, n))
        return 0;
    ZyErr err = {{0}};
    ZayaConfig cfg;
    ParamTable t;
    int bf16 = 0, n_shards = 0;
    if (args_parse(argc, argv, 2, specs, n, NULL, 0, NULL, "init", &err) ||
        (bf16 = model_parse_dtype(dtype, "init: --dtype", &err)) < 0 || config_load(&cfg, config_path, &err) ||
        model_param_table(&t, &cfg, &err)) {
        fprintf(stderr, "zaya: %s\n", err.msg);
        return 1;
    }
    const size_t total = params_count(&t, 0), trainable = params_count(&t, 1);
    params_free(&t);
    if (!(shard_mb * 1e6 >= 1)) {
        fprintf(stderr, "zaya: init: --shard-size must be a positive number of MB (got %g)\n", shard_mb);
        return 1;
    }
    /* streamed: each tensor is made and written in chunks, so an 8B model needs no 35 GB of memory */
    if (model_init_streamed(&cfg, seed, out, bf16 ? ZY_DT_BF16 : ZY_DT_F32, (size_t)(shard_mb * 1e6), &n_shards,
                            &err)) {
        fprintf(stderr, "zaya: %s\n", err.msg);
        return 1;
    }
    printf("initialised %s: %zu parameters (%zu trainable), seed %llu, %s", out, total, trainable,
           (unsigned long long)seed, bf16 ? "bf16" : "f32");
    if (n_shards > 1) printf(", %d shards + model.safetensors.index.json", n_shards);
    printf("\n");
    return 0;
}

static int write_grads(const Model *m, const Activations *a, const char *path, ZyErr *err) {
    const ParamTable *t = &m->params;
    int n = 0;
    StWriteTensor *ts = calloc((size_t)(t->count + m->cfg.num_layers), sizeof *ts);
    char(*names)[32] = calloc((size_t)m->cfg.num_layers, sizeof *names);
    if (!ts || !names) {
        free(ts);
        free(names);
        return zy_fail(err, "out of memory");
    }
    for (int i = 0; i < t->count; i++) {
        const ParamInfo *p = &t->info[i];
        if (!param_trainable(p)) continue;
        StWriteTensor *w = &ts[n++];
        w->name = p->name;
        w->ndim = p->ndim;
        for (int k = 0; k < p->ndim; k++) w->shape[k] = p->shape[k];
        w->src_dtype = w->out_dtype = ZY_DT_F32;
        w->data = t->grad + p->offset;
    }
    for (int l = 0; l < m->cfg.num_layers; l++) {
        snprintf(names[l], sizeof names[l], "routing.layer%d", l);
        StWriteTensor *w = &ts[n++];
        w->name = names[l];
        w->ndim = 2;
        w->shape[0] = a->B;
        w->shape[1] = a->T;
        w->src_dtype = w->out_dtype = ZY_DT_I32;
        w->data = a->layers[l].choice;
    }
    int rc = st_write(path, ts, n, NULL, err);
    free(ts);
    free(names);
    return rc;
}

/* zaya forward --device cuda: the same outputs from the GPU model (gpu_model.h), fp32. Returns 0 or 1. */
static int forward_gpu(Model *m, int gpu_index, const int32_t *tokens, int B, int T, const char *logits_out,
                       const char *grads_out, ZyErr *err) {
    const size_t N = (size_t)B * T, V = (size_t)m->cfg.vocab_size;
    const int L = m->cfg.num_layers;
    GpuModel *gm = NULL;
    int rc = 1;
    int32_t *targets = malloc(N * sizeof *targets), *choice = calloc(N * (size_t)L, sizeof *choice);
    float *logits = logits_out ? malloc(N * V * sizeof *logits) : NULL;
    LayerActs *layers = calloc((size_t)L, sizeof *layers);
    if (!targets || !choice || (logits_out && !logits) || !layers) {
        zy_fail(err, "out of memory");
        goto done;
    }
    make_next_token_targets(targets, tokens, B, T);
    double loss = 0;
    if (gpu_model_create(&gm, m, gpu_index, B, T, 0, grads_out != NULL, err) || gpu_model_forward(gm, tokens, err))
        goto done;
    if (grads_out) {
        if (gpu_model_backward(gm, targets, err) || gpu_model_download_grads(gm, m, err)) goto done;
        for (int l = 0; cfg_router_classes(&m->cfg) && l < L; l++)
            if (gpu_model_routing(gm, l, choice + (size_t)l * N, NULL, NULL, err)) goto done;
        /* the dense variant routes every row to its one MLP (expert 0), as the CPU writes it */
        for (int l = 0; l < L; l++) layers[l].choice = choice + (size_t)l * N;
        Activations a = {.B = B, .T = T, .layers = layers};
        if (write_grads(m, &a, grads_out, err)) goto done;
    } else if (gpu_model_loss(gm, targets, err)) {
        goto done;
    }
    if (gpu_model_take_loss(gm, &loss, err)) goto done;
    if (logits_out) {
        int64_t lshape[3] = {B, T, (int64_t)V};
        if (gpu_model_logits(gm, logits, err) || npy_write(logits_out, ZY_DT_F32, logits, 3, lshape, err)) goto done;
    }
    printf("loss %#.10g\n", loss);
    rc = 0;
done:
    gpu_model_free(gm);
    free(targets), free(choice), free(logits), free(layers);
    return rc;
}

int cmd_forward(int argc, char **argv) {
    const char *model_dir = NULL, *tokens_path = NULL, *logits_out = NULL, *grads_out = NULL, *device = "cpu";
    const char *dtype = "f32";
    ArgSpec specs[] = {
        {"--model", ARG_STRING, 1, &model_dir, "model directory (config.json + model.safetensors)", 0},
        {"--tokens", ARG_STRING, 1, &tokens_path, "token ids, .npy int32/int64 [B, T]", 0},
        {"--logits-out", ARG_STRING, 0, &logits_out, "write float32 logits [B, T, V] as .npy", 0},
        {"--grads-out", ARG_STRING, 0, &grads_out, "write float32 gradients + routing as .safetensors (--dtype f32)", 0},
        {"--device", ARG_STRING, 0, &device, "cpu (default), cuda or cuda:N (fp32 on the GPU, no TF32)", 0},
        {"--dtype", ARG_STRING, 0, &dtype, "weights: f32 (default), bf16, q8 or q4 (a quantized folder read in place), "
                                           "or auto (the folder's); all but f32 without gradients", 0},
    };
    const int n = ZY_ARRAY_LEN(specs);
    if (args_help(argc, argv, 2, "forward", "--model DIR --tokens TOK.npy [--logits-out L.npy] [--grads-out G.safetensors] "
                  "[--device cuda] [--dtype f32|bf16|q8|q4|auto]", specs, n))
        return 0;
    ZyErr err = {{0}};
    Model m;
    Activations a;
    int32_t *tokens = NULL, *targets = NULL;
    int ndim, rc = 1, have_model = 0, have_acts = 0;
    int64_t shape[ZY_MAX_DIMS];
    if (args_parse(argc, argv, 2, specs, n, NULL, 0, NULL, "forward", &err)) goto fail;
    /* fp32 keeps its gradients (--grads-out): model_load_dir rather than model_args_load */
    ModelArgs ma = {.command = "forward", .dir = model_dir, .dtype = dtype, .device = device};
    if (model_args_dtype(&ma, &err) || model_args_device(&ma, &err)) goto fail;
    if (grads_out && (ma.bf16 || ma.quant_bits)) {
        zy_fail(&err, "forward: --grads-out needs --dtype f32 (%s weights are for inference: no gradients)", dtype);
        goto fail;
    }
    /* on a GPU forward runs fp32 products over the fp32 weights (what the oracle checks), --dtype bf16 or not */
    if ((ma.bf16 && !ma.gpu) || ma.quant_bits ? model_args_load(&ma, &m, &err) : model_load_dir(&m, model_dir, &err))
        goto fail;
    have_model = 1;
    if (npy_read_tokens(tokens_path, &tokens, &ndim, shape, &err)) goto fail;
    if (ndim == 1) { /* a single sequence */
        shape[1] = shape[0];
        shape[0] = 1;
    } else if (ndim != 2) {
        zy_fail(&err, "%s: tokens must have shape [B, T] (got %d dimensions)", tokens_path, ndim);
        goto fail;
    }
    if (shape[0] <= 0 || shape[1] <= 0 || shape[0] * shape[1] > (1 << 26)) {
        zy_fail(&err, "%s: token array shape [%lld, %lld] is empty or too large", tokens_path, (long long)shape[0],
                (long long)shape[1]);
        goto fail;
    }
    const int B = (int)shape[0], T = (int)shape[1];
    if (model_check_tokens(&m, tokens, B, T, &err)) {
        zy_wrap(&err, "%s", tokens_path);
        goto fail;
    }
    if (ma.gpu) {
        rc = forward_gpu(&m, ma.gpu_index, tokens, B, T, logits_out, grads_out, &err);
        goto fail;
    }
    if (acts_create(&a, &m.cfg, B, T, &err)) goto fail;
    have_acts = 1;
    targets = malloc((size_t)B * T * sizeof *targets);
    if (!targets) {
        zy_fail(&err, "out of memory");
        goto fail;
    }
    make_next_token_targets(targets, tokens, B, T);
    model_forward(&m, &a, tokens);
    double loss;
    if (grads_out) {
        params_zero_grad(&m.params);
        loss = model_backward(&m, &a, targets);
        if (write_grads(&m, &a, grads_out, &err)) goto fail;
    } else {
        loss = model_loss(&m, &a, targets);
    }
    if (logits_out) {
        int64_t lshape[3] = {B, T, m.cfg.vocab_size};
        if (npy_write(logits_out, ZY_DT_F32, a.logits, 3, lshape, &err)) goto fail;
    }
    printf("loss %#.10g\n", loss); /* "#": trailing zeros kept, always 10 significant digits */
    rc = 0;
fail:
    if (rc) fprintf(stderr, "zaya: %s\n", err.msg);
    if (have_acts) acts_free(&a);
    if (have_model) model_free(&m);
    free(tokens);
    free(targets);
    return rc;
}

int cmd_convert(int argc, char **argv) {
    const char *model_dir = NULL, *out = NULL, *dtype = "f32", *to = "native";
    ArgSpec specs[] = {
        {"--model", ARG_STRING, 1, &model_dir, "input model directory (native or legacy layout)", 0},
        {"--out", ARG_STRING, 1, &out, "output model directory", 0},
        {"--dtype", ARG_STRING, 0, &dtype, "f32 (default) or bf16", 0},
        {"--to", ARG_STRING, 0, &to, "layout written: native (the only one; what transformers loads)", 0},
    };
    const int n = ZY_ARRAY_LEN(specs);
    if (args_help(argc, argv, 2, "convert", "--model DIR --out DIR2 [--dtype f32|bf16] [--to native]", specs, n))
        return 0;
    ZyErr err = {{0}};
    Model m;
    if (args_parse(argc, argv, 2, specs, n, NULL, 0, NULL, "convert", &err)) goto fail_noload;
    ZyDtype dt;
    if (strcmp(dtype, "f32") == 0)
        dt = ZY_DT_F32;
    else if (strcmp(dtype, "bf16") == 0)
        dt = ZY_DT_BF16;
    else {
        zy_fail(&err, "convert: --dtype must be f32 or bf16 (got \"%s\")", dtype);
        goto fail_noload;
    }
    if (strcmp(to, "native") != 0) {
        zy_fail(&err, "convert: --to must be native (got \"%s\"); zaya reads legacy checkpoints but writes only the "
                      "native layout", to);
        goto fail_noload;
    }
    if (quant_dir_refuse(model_dir, "convert", &err) || model_load_dir(&m, model_dir, &err)) goto fail_noload;
    const int was_legacy = m.cfg.legacy_layout;
    int rc = model_save_dir(&m, out, dt, &err);
    model_free(&m);
    if (rc) goto fail_noload;
    printf("wrote %s (%s, native layout%s)\n", out, dtype, was_legacy ? ", converted from the legacy one" : "");
    return 0;
fail_noload:
    fprintf(stderr, "zaya: %s\n", err.msg);
    return 1;
}

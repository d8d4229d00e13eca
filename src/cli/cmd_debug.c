/* zaya debug: developer entry points that expose one library piece to the Python oracle tests.
 *   zaya debug optim --in IN.safetensors --out OUT.safetensors --steps K --lr LR [optimizer flags]
 * IN holds parameters "muon/NAME" (2-D or stacked 3-D) and "adamw/NAME", and per-step gradients
 * "grad{k}/muon/NAME", "grad{k}/adamw/NAME" for k < K. Each step optionally clips the gradients to a global
 * norm, then applies one optimizer step. OUT holds the final parameters under their IN names. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "commands.h"
#include "optim/optim.h"
#include "model/params.h"
#include "io/safetensors.h"

static int debug_optim(int argc, char **argv) {
    const char *in = NULL, *out = NULL;
    int steps = 1;
    double lr = 1e-3, wd = 0.0, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, momentum = 0.95, clip = 0.0;
    ArgSpec specs[] = {
        {"--in", ARG_STRING, 1, &in, "input safetensors (params + per-step grads)", 0},
        {"--out", ARG_STRING, 1, &out, "output safetensors (final params)", 0},
        {"--steps", ARG_INT, 0, &steps, "number of steps", 0},
        {"--lr", ARG_FLOAT, 0, &lr, "learning rate", 0},
        {"--weight-decay", ARG_FLOAT, 0, &wd, "decoupled weight decay", 0},
        {"--beta1", ARG_FLOAT, 0, &beta1, "AdamW beta1", 0},
        {"--beta2", ARG_FLOAT, 0, &beta2, "AdamW beta2", 0},
        {"--eps", ARG_FLOAT, 0, &eps, "AdamW eps", 0},
        {"--momentum", ARG_FLOAT, 0, &momentum, "Muon momentum", 0},
        {"--clip", ARG_FLOAT, 0, &clip, "global-norm clip (0 = off)", 0},
    };
    ZyErr err = {{0}};
    StFile f;
    ParamTable t = {0};
    Optimizer o;
    int rc = 1, have_file = 0, have_opt = 0;
    StWriteTensor *ws = NULL;
    if (args_parse(argc, argv, 3, specs, ZY_ARRAY_LEN(specs), NULL, 0, NULL, "debug optim", &err)) goto done;
    if (st_open(&f, in, &err)) goto done;
    have_file = 1;
    for (int i = 0; i < f.n_entries; i++) {
        const StEntry *e = &f.entries[i];
        ParamKind kind;
        if (strncmp(e->name, "muon/", 5) == 0)
            kind = PARAM_MUON;
        else if (strncmp(e->name, "adamw/", 6) == 0)
            kind = PARAM_ADAMW;
        else
            continue;
        if (params_add(&t, e->name, kind, INIT_ZERO, e->ndim, e->shape, &err) < 0) goto done;
    }
    if (params_alloc(&t, &err)) goto done;
    for (int i = 0; i < t.count; i++)
        if (st_read_f32(&f, st_find(&f, t.info[i].name), t.data + t.info[i].offset, &err)) goto done;
    OptimConfig cfg = {.weight_decay = wd, .beta1 = beta1, .beta2 = beta2, .eps = eps, .muon_momentum = momentum,
                       .muon_ns_steps = 5};
    if (optim_create(&o, &t, &cfg, &err)) goto done;
    have_opt = 1;
    for (int k = 0; k < steps; k++) {
        for (int i = 0; i < t.count; i++) {
            char name[160];
            snprintf(name, sizeof name, "grad%d/%s", k, t.info[i].name);
            const StEntry *e = st_find(&f, name);
            if (!e) {
                zy_fail(&err, "%s: missing tensor %s", in, name);
                goto done;
            }
            if (e->numel != t.info[i].numel) {
                zy_fail(&err, "%s: %s has %zu elements, expected %zu", in, name, e->numel, t.info[i].numel);
                goto done;
            }
            if (st_read_f32(&f, e, t.grad + t.info[i].offset, &err)) goto done;
        }
        if (clip > 0) grad_clip(&t, clip, grad_global_norm(&t));
        optim_step(&o, &t, lr);
    }
    ws = calloc((size_t)t.count, sizeof *ws);
    for (int i = 0; i < t.count; i++) {
        ws[i].name = t.info[i].name;
        ws[i].ndim = t.info[i].ndim;
        memcpy(ws[i].shape, t.info[i].shape, sizeof t.info[i].shape);
        ws[i].src_dtype = ws[i].out_dtype = ZY_DT_F32;
        ws[i].data = t.data + t.info[i].offset;
    }
    if (st_write(out, ws, t.count, NULL, &err)) goto done;
    rc = 0;
done:
    if (rc) fprintf(stderr, "zaya: %s\n", err.msg);
    free(ws);
    if (have_opt) optim_free(&o);
    params_free(&t);
    if (have_file) st_close(&f);
    return rc;
}

int cmd_debug(int argc, char **argv) {
    if (argc >= 3 && strcmp(argv[2], "optim") == 0) return debug_optim(argc, argv);
    fprintf(stderr, "usage: zaya debug optim --in IN.safetensors --out OUT.safetensors --steps K --lr LR ...\n");
    return 2;
}

/* zaya ckpt inspect DIR | zaya ckpt export DIR --out HFDIR [--dtype f32|bf16] */
#include <stdio.h>
#include <string.h>

#include "args.h"
#include "io/checkpoint.h"
#include "commands.h"
#include "io/model_io.h"
#include "io/quant_io.h"

static int ckpt_usage(FILE *f) {
    fprintf(f, "usage: zaya ckpt inspect DIR                        contents, world size, step, checksum status\n"
               "       zaya ckpt export DIR --out HFDIR [--dtype f32|bf16]   a plain Hugging Face model directory\n"
               "DIR is a checkpoint directory (step-NNNNNNNN) or a run's checkpoints/ (its latest).\n");
    return f == stdout ? 0 : 1;
}

int cmd_ckpt(int argc, char **argv) {
    if (argc < 3 || strcmp(argv[2], "--help") == 0 || strcmp(argv[2], "-h") == 0) return ckpt_usage(argc < 3 ? stderr : stdout);
    ZyErr err = {{0}};
    if (strcmp(argv[2], "inspect") == 0) {
        if (argc != 4) return ckpt_usage(stderr);
        if (ckpt_inspect(argv[3], stdout, &err)) {
            fprintf(stderr, "zaya: %s\n", err.msg);
            return 1;
        }
        return 0;
    }
    if (strcmp(argv[2], "export") == 0) {
        const char *out = NULL, *dtype = "f32", *positional[1] = {NULL};
        int n_pos = 0;
        ArgSpec specs[] = {
            {"--out", ARG_STRING, 1, &out, "output model directory", 0},
            {"--dtype", ARG_STRING, 0, &dtype, "f32 (default) or bf16", 0},
        };
        if (args_parse(argc, argv, 3, specs, ZY_ARRAY_LEN(specs), positional, 1, &n_pos, "ckpt export", &err) ||
            (n_pos != 1 && zy_fail(&err, "ckpt export: give one checkpoint directory")) ||
            (strcmp(dtype, "f32") != 0 && strcmp(dtype, "bf16") != 0 &&
             zy_fail(&err, "ckpt export: --dtype must be f32 or bf16 (got \"%s\")", dtype))) {
            fprintf(stderr, "zaya: %s\n", err.msg);
            return 1;
        }
        char dir[4096];
        snprintf(dir, sizeof dir, "%s", positional[0]);
        if (quant_dir_refuse(dir, "ckpt export", &err)) {
            fprintf(stderr, "zaya: %s\n", err.msg);
            return 1;
        }
        char probe[4200];
        snprintf(probe, sizeof probe, "%s/manifest.json", dir);
        FILE *pf = fopen(probe, "r");
        if (pf)
            fclose(pf);
        else if (ckpt_latest(positional[0], dir, sizeof dir, &err)) {
            fprintf(stderr, "zaya: %s\n", err.msg);
            return 1;
        }
        Model m;
        if (ckpt_verify(dir, &err) || model_load_dir(&m, dir, &err)) {
            fprintf(stderr, "zaya: %s\n", err.msg);
            return 1;
        }
        if (!cfg_is_zaya1(&m.cfg)) { /* the research variants have tensors ZayaForCausalLM does not know */
            fprintf(stderr,
                    "zaya: ckpt export: %s is a research variant (zaya_attention \"%s\", zaya_router \"%s\", "
                    "zaya_moe \"%s\", zaya_residual_scaling %s); transformers' ZayaForCausalLM loads only ZAYA1 "
                    "models, so there is nothing to export (zaya generate/eval read the checkpoint directly)\n",
                    dir, cfg_attention_name(m.cfg.attention), cfg_router_name(m.cfg.router), cfg_moe_name(m.cfg.moe),
                    m.cfg.no_residual_scaling ? "false" : "true");
            model_free(&m);
            return 1;
        }
        int rc = model_save_dir(&m, out, strcmp(dtype, "bf16") == 0 ? ZY_DT_BF16 : ZY_DT_F32, &err);
        model_free(&m);
        if (rc) {
            fprintf(stderr, "zaya: %s\n", err.msg);
            return 1;
        }
        printf("exported %s -> %s (%s; loads with transformers.ZayaForCausalLM.from_pretrained)\n", dir, out, dtype);
        return 0;
    }
    fprintf(stderr, "zaya: ckpt: unknown subcommand \"%s\"\n", argv[2]);
    return ckpt_usage(stderr);
}

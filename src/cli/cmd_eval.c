/* zaya eval: downstream tasks (JSONL) and held-out loss (shards or a token file); logic in eval.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "commands.h"
#include "model_args.h"
#include "gpu/gpu_eval.h"
#include "infer/eval.h"
#include "model/model.h"
#include "io/model_io.h"
#include "io/npy.h"
#include "io/shards.h"
#include "tokenizer/tokenizer.h"

#define MAX_TASKS 64

typedef struct {
    const int32_t *tok;
    uint64_t n;
} ArraySource;

static int array_read(void *ctx, uint64_t off, size_t n, int32_t *out, ZyErr *err) {
    const ArraySource *s = ctx;
    if (off > s->n || n > s->n - off) return zy_fail(err, "read of %zu tokens at %llu past the end", n, (unsigned long long)off);
    memcpy(out, s->tok + off, n * sizeof *out);
    return 0;
}

int cmd_eval(int argc, char **argv) {
    const char *model_dir = NULL, *tok_path = NULL, *task = NULL, *shards = NULL, *split = "val", *tokens_path = NULL;
    const char *json_out = NULL, *dtype = "f32", *device = "cpu";
    int limit = 0, seq_len = 0;
    uint64_t max_tokens = 0;
    ArgSpec specs[] = {
        {"--model", ARG_STRING, 1, &model_dir, "model directory (config.json + model.safetensors)", 0},
        {"--tokenizer", ARG_STRING, 0, &tok_path, "tokenizer.json (needed for --task)", 0},
        {"--task", ARG_STRING, 0, &task, "task file(s) .jsonl: multiple choice or exact match; more may follow", 0},
        {"--limit", ARG_INT, 0, &limit, "score only the first N examples of each task", 0},
        {"--shards", ARG_STRING, 0, &shards, "shard directory for the held-out loss", 0},
        {"--split", ARG_STRING, 0, &split, "shard split (default val)", 0},
        {"--tokens", ARG_STRING, 0, &tokens_path, "held-out tokens from an int32/int64 .npy instead of shards", 0},
        {"--max-tokens", ARG_U64, 0, &max_tokens, "held-out predictions at most (default: all)", 0},
        {"--seq-len", ARG_INT, 0, &seq_len, "held-out window length (default: min(1024, max positions))", 0},
        {"--json", ARG_STRING, 0, &json_out, "also write the results as JSON", 0},
        {"--dtype", ARG_STRING, 0, &dtype, "weights: f32 (default), bf16 (matrices rounded to bf16, read as bf16 when decoding; on a GPU: bf16 products), q8 or q4 (a quantized folder read in place), or auto (the folder's)", 0},
        {"--device", ARG_STRING, 0, &device, "cpu (default), cuda or cuda:N", 0},
    };
    const int n = ZY_ARRAY_LEN(specs);
    if (args_help(argc, argv, 2, "eval",
                  "--model DIR [--tokenizer T --task FILE.jsonl ...] [--limit N] "
                  "[--shards DIR [--split val] | --tokens TOK.npy] [--max-tokens N] [--seq-len T] [--json OUT] "
                  "[--dtype f32|bf16|q8|q4|auto] [--device cpu|cuda|cuda:N]",
                  specs, n))
        return 0;
    ZyErr err = {{0}};
    const char *tasks[MAX_TASKS];
    int n_tasks = 0, rc = 1, have_model = 0;
    Model m;
    Tokenizer *tok = NULL;
    ShardSet *ss = NULL;
    EvalResult *results = NULL;
    int32_t *held = NULL;
    double loss = NAN;
    uint64_t n_scored = 0;
    char held_name[300] = "";
    RoutingWindow routes, *routes_ptr = NULL;
    GpuEvalRunner *gr = NULL;
    EvalRunner gpu_run, *run = NULL; /* NULL: the CPU */
    if (args_parse(argc, argv, 2, specs, n, tasks + 1, MAX_TASKS - 1, &n_tasks, "eval", &err)) goto fail;
    if (n_tasks > 0 && !task) {
        zy_fail(&err, "eval: unexpected argument \"%s\"", tasks[1]);
        goto fail;
    }
    if (task) tasks[0] = task, n_tasks++;
    const char **task_list = task ? tasks : NULL;
    if (!task && !shards && !tokens_path) {
        zy_fail(&err, "eval: nothing to evaluate: give --task, --shards or --tokens");
        goto fail;
    }
    if (shards && tokens_path) {
        zy_fail(&err, "eval: --shards and --tokens are alternatives");
        goto fail;
    }
    if (task && !tok_path) {
        zy_fail(&err, "eval: --task needs --tokenizer");
        goto fail;
    }
    if (limit < 0 || seq_len < 0) {
        zy_fail(&err, "eval: --limit and --seq-len must be >= 0");
        goto fail;
    }
    ModelArgs ma = {.command = "eval", .dir = model_dir, .dtype = dtype, .device = device};
    if (model_args_dtype(&ma, &err) || model_args_device(&ma, &err) || model_args_load(&ma, &m, &err)) goto fail;
    have_model = 1;
    if (ma.gpu) {
        if (gpu_eval_runner_create(&gr, &gpu_run, &m, ma.gpu_index, ma.bf16, &err)) goto fail;
        run = &gpu_run;
        fprintf(stderr, "device            GPU %s%s\n", gpu_eval_runner_device(gr), ma.bf16 ? ", bf16 products" : "");
    } else if (ma.bf16) {
        fprintf(stderr, "weights           bf16 (matrices in bf16; vectors, activations and sums in fp32)\n");
    }
    model_args_print_quant(&ma, &m);
    if (tok_path) {
        if (model_args_tokenizer(&ma, tok_path, &m, &tok, &err)) goto fail;
    }
    results = calloc((size_t)(n_tasks > 0 ? n_tasks : 1), sizeof *results);
    if (!results) {
        zy_fail(&err, "out of memory");
        goto fail;
    }
    for (int i = 0; i < n_tasks; i++) {
        EvalTokenizer et;
        eval_tokenizer_from(&et, tok, &m.cfg);
        if (eval_task_file_on(run, &m, &et, task_list[i], limit, &results[i], &err)) goto fail;
        fprintf(stderr, "%s: %d examples in %.2f s\n", task_list[i], results[i].n, results[i].seconds);
    }
    if (seq_len == 0) seq_len = m.cfg.max_position_embeddings < 1024 ? m.cfg.max_position_embeddings : 1024;
    /* the held-out pass also reports how the model routes those tokens (not for a dense model) */
    if ((tokens_path || shards) && cfg_router_classes(&m.cfg)) {
        if (routing_window_create(&routes, m.cfg.num_layers, m.cfg.num_experts, &err)) goto fail;
        routes_ptr = &routes;
    }
    if (tokens_path) {
        int ndim;
        int64_t shape[ZY_MAX_DIMS];
        if (npy_read_tokens(tokens_path, &held, &ndim, shape, &err)) goto fail;
        uint64_t total = 1;
        for (int d = 0; d < ndim; d++) total *= (uint64_t)shape[d];
        ArraySource as = {held, total};
        EvalTokenSource src = {&as, total, array_read};
        if (eval_token_loss_on(run, &m, &src, seq_len, max_tokens, routes_ptr, &loss, &n_scored, &err)) {
            zy_wrap(&err, "%s", tokens_path);
            goto fail;
        }
        const char *base = strrchr(tokens_path, '/');
        snprintf(held_name, sizeof held_name, "%s", base ? base + 1 : tokens_path);
    } else if (shards) {
        /* headers, sizes and every id are checked on open/read; the payload CRCs are not re-read here */
        if (shardset_open(&ss, shards, split, 0, &err)) goto fail;
        if (eval_shard_loss_on(run, &m, ss, seq_len, max_tokens, routes_ptr, &loss, &n_scored, &err)) {
            zy_wrap(&err, "%s (%s)", shards, split);
            goto fail;
        }
        snprintf(held_name, sizeof held_name, "%s", split);
    }
    eval_print_table(stdout, results, n_tasks, held_name, loss, n_scored);
    eval_print_routing(stdout, routes_ptr);
    if (json_out && eval_write_json(json_out, results, n_tasks, held_name, loss, n_scored, routes_ptr,
                                    model_args_dtype_name(&ma), &err))
        goto fail;
    rc = 0;
fail:
    if (rc) fprintf(stderr, "zaya: %s\n", err.msg);
    free(results);
    free(held);
    tokenizer_free(tok);
    if (ss) shardset_close(ss);
    if (routes_ptr) routing_window_free(routes_ptr);
    gpu_eval_runner_free(gr);
    if (have_model) model_free(&m);
    return rc;
}

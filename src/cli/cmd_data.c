/* zaya data synth / prepare / info: the synthetic curriculum corpus and token shards. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "args.h"
#include "commands.h"
#include "data/data_prepare.h"
#include "io/shards.h"
#include "data/synth.h"
#include "tokenizer/tokenizer.h"

static void data_usage(FILE *f) {
    fprintf(f, "usage: zaya data <synth|prepare|info> [options]   (zaya data <sub> --help)\n\n"
               "  synth    write the synthetic three-phase curriculum corpus and held-out eval tasks (JSONL)\n"
               "  prepare  tokenize .txt / .jsonl files into token shards (train / val splits)\n"
               "  info     describe a shard directory, optionally verifying every checksum\n");
}

static int cmd_synth(int argc, char **argv) {
    const char *out = NULL;
    uint64_t seed = 0;
    double scale = 1.0;
    ArgSpec specs[] = {
        {"--out", ARG_STRING, 1, &out, "output directory", 0},
        {"--seed", ARG_U64, 0, &seed, "generator seed (default 0)", 0},
        {"--scale", ARG_FLOAT, 0, &scale, "size factor in (0, 100]; 1.0: about 4 + 3 + 3 MB of training text", 0},
    };
    const int n = ZY_ARRAY_LEN(specs);
    if (args_help(argc, argv, 3, "data synth", "--out DIR [--seed N] [--scale F]", specs, n)) return 0;
    ZyErr err = {{0}};
    SynthReport rep;
    if (args_parse(argc, argv, 3, specs, n, NULL, 0, NULL, "data synth", &err) ||
        synth_generate(out, seed, scale, &rep, &err)) {
        fprintf(stderr, "zaya: %s\n", err.msg);
        return 1;
    }
    uint64_t total = 0;
    for (int i = 0; i < rep.n_files; i++) {
        printf("%-24s %8llu records %10.2f MB\n", rep.files[i].name, (unsigned long long)rep.files[i].records,
               rep.files[i].bytes / 1e6);
        total += rep.files[i].bytes;
    }
    printf("wrote %s (seed %llu, scale %g): %.2f MB in %.2f s\n", out, (unsigned long long)seed, scale, total / 1e6,
           rep.seconds);
    return 0;
}

/* Per-thread tokenizer caches: tokenizer_encode itself is not thread-safe. */
typedef struct {
    const Tokenizer *tok;
    TokenizerCache **caches;
} TokCtx;

static int tok_encode(void *ctx, int thread, const char *text, size_t len, int32_t **ids, size_t *n_ids, ZyErr *err) {
    TokCtx *c = ctx;
    return tokenizer_encode_with(c->tok, c->caches[thread], text, len, ids, n_ids, err);
}

static int file_crc(const char *path, uint32_t *crc, ZyErr *err) {
    char *d;
    size_t n;
    if (zy_read_file(path, &d, &n, err)) return -1;
    *crc = zy_crc32(0, d, n);
    free(d);
    return 0;
}

static void print_split(const char *name, const PrepareReport *r, int s) {
    double mb = r->bytes[s] / 1e6, secs = r->seconds[s];
    printf("%-5s %10llu documents %12llu tokens %9.2f MB %8.2f s %8.2f MB/s  (%d shard%s)\n", name,
           (unsigned long long)r->documents[s], (unsigned long long)r->tokens[s], mb, secs, secs > 0 ? mb / secs : 0.0,
           r->shards[s], r->shards[s] == 1 ? "" : "s");
}

static int cmd_prepare(int argc, char **argv) {
    const char *tok_path = NULL, *input = NULL, *out = NULL;
    double val_fraction = 0.01;
    uint64_t seed = 0, shard_tokens = 0;
    int strict = 0, force = 0, threads = 0, bos = 0;
    ArgSpec specs[] = {
        {"--tokenizer", ARG_STRING, 1, &tok_path, "tokenizer.json, or a model folder holding it (and tokenizer_config.json)", 0},
        {"--input", ARG_STRING, 1, &input, ".txt / .jsonl files or directories; more may follow", 0},
        {"--out", ARG_STRING, 1, &out, "shard directory to create", 0},
        {"--val-fraction", ARG_FLOAT, 0, &val_fraction, "share of documents for the val split (default 0.01)", 0},
        {"--seed", ARG_U64, 0, &seed, "seed of the train/val assignment (default 0)", 0},
        {"--strict", ARG_SWITCH, 0, &strict, "fail on a malformed input line instead of skipping it", 0},
        {"--force", ARG_SWITCH, 0, &force, "replace the shards of a non-empty output directory", 0},
        {"--shard-tokens", ARG_U64, 0, &shard_tokens, "tokens per shard (default 67108864)", 0},
        {"--threads", ARG_INT, 0, &threads, "tokenizer threads (default: all)", 0},
        {"--bos", ARG_SWITCH, 0, &bos, "also put the BOS token before every document (zaya eval puts one before prompts)", 0},
    };
    const int n = ZY_ARRAY_LEN(specs);
    if (args_help(argc, argv, 3, "data prepare",
                  "--tokenizer T --input FILES|DIRS... --out DIR [--val-fraction f] [--seed N] [--strict] [--force] "
                  "[--bos]",
                  specs, n))
        return 0;
    ZyErr err = {{0}};
    const char **inputs = calloc((size_t)argc + 1, sizeof *inputs);
    Tokenizer *tok = NULL;
    TokCtx ctx = {0};
    int n_pos = 0, rc = 1;
    if (!inputs) {
        fprintf(stderr, "zaya: out of memory\n");
        return 1;
    }
    if (args_parse(argc, argv, 3, specs, n, inputs + 1, argc, &n_pos, "data prepare", &err)) goto done;
    inputs[0] = input;
    if (threads < 0) {
        zy_fail(&err, "data prepare: --threads must be at least 1");
        goto done;
    }
    if (threads == 0) threads = omp_get_max_threads();
    uint32_t tok_crc;
    struct stat st;
    int is_dir = stat(tok_path, &st) == 0 && S_ISDIR(st.st_mode);
    char tok_file[4096];
    snprintf(tok_file, sizeof tok_file, is_dir ? "%s/tokenizer.json" : "%s", tok_path);
    if (file_crc(tok_file, &tok_crc, &err) || tokenizer_load(tok_path, &tok, &err)) goto done;
    int32_t eos, bos_id = -1;
    ZyErr e2;
    if (tokenizer_special_id(tok, TOK_SPECIAL_EOS, &eos, &e2)) { /* every document ends with it */
        zy_fail(&err, "%s: %s", tok_path, e2.msg);
        goto done;
    }
    if (bos && tokenizer_special_id(tok, TOK_SPECIAL_BOS, &bos_id, &e2)) {
        zy_fail(&err, "%s: --bos: %s", tok_path, e2.msg);
        goto done;
    }
    ctx.tok = tok;
    ctx.caches = calloc((size_t)threads, sizeof *ctx.caches);
    if (!ctx.caches) {
        zy_fail(&err, "out of memory");
        goto done;
    }
    for (int i = 0; i < threads; i++)
        if (!(ctx.caches[i] = tokenizer_cache_new())) {
            zy_fail(&err, "out of memory");
            goto done;
        }
    const char *base = strrchr(tok_file, '/');
    PrepareOptions opt = {inputs, n_pos + 1, out, val_fraction, seed, strict, force, shard_tokens,
                          base ? base + 1 : tok_file, tok_crc, threads, stderr};
    PrepareEncoder enc = {tok_encode, &ctx, tokenizer_vocab_size(tok), eos, bos_id};
    PrepareReport rep;
    if (data_prepare(&opt, &enc, &rep, &err)) goto done;
    print_split("train", &rep, SHARD_TRAIN);
    print_split("val", &rep, SHARD_VAL);
    double mb = (rep.bytes[0] + rep.bytes[1]) / 1e6;
    printf("total %10llu documents %12llu tokens %9.2f MB %8.2f s %8.2f MB/s  (wall, %d thread%s, %llu file%s)\n",
           (unsigned long long)(rep.documents[0] + rep.documents[1]), (unsigned long long)(rep.tokens[0] + rep.tokens[1]),
           mb, rep.wall_seconds, rep.wall_seconds > 0 ? mb / rep.wall_seconds : 0.0, rep.threads,
           rep.threads == 1 ? "" : "s", (unsigned long long)rep.files, rep.files == 1 ? "" : "s");
    if (rep.malformed_lines)
        printf("skipped %llu malformed line%s (reported above)\n", (unsigned long long)rep.malformed_lines,
               rep.malformed_lines == 1 ? "" : "s");
    if (rep.empty_documents)
        printf("skipped %llu empty document%s\n", (unsigned long long)rep.empty_documents,
               rep.empty_documents == 1 ? "" : "s");
    printf("wrote %s (vocab %d, %s)\n", out, enc.vocab_size, enc.vocab_size <= 65536 ? "uint16" : "uint32");
    rc = 0;
done:
    if (rc) fprintf(stderr, "zaya: %s\n", err.msg);
    if (ctx.caches)
        for (int i = 0; i < threads; i++) tokenizer_cache_free(ctx.caches[i]);
    free(ctx.caches);
    tokenizer_free(tok);
    free(inputs);
    return rc;
}

static int cmd_info(int argc, char **argv) {
    const char *dir = NULL;
    int verify = 0;
    ArgSpec specs[] = {
        {"--dir", ARG_STRING, 1, &dir, "shard directory", 0},
        {"--verify", ARG_SWITCH, 0, &verify, "read every shard and check its payload CRC", 0},
    };
    const int n = ZY_ARRAY_LEN(specs);
    if (args_help(argc, argv, 3, "data info", "--dir DIR [--verify]", specs, n)) return 0;
    ZyErr err = {{0}};
    if (args_parse(argc, argv, 3, specs, n, NULL, 0, NULL, "data info", &err)) goto fail;
    double t0 = zy_now_seconds();
    for (int s = 0; s < SHARD_NUM_SPLITS; s++) {
        ShardSet *set;
        if (shardset_open(&set, dir, shard_split_name((ShardSplit)s), verify, &err)) goto fail;
        printf("%-5s %12llu tokens %10llu documents  vocab %d  %s\n", shard_split_name((ShardSplit)s),
               (unsigned long long)shardset_num_tokens(set), (unsigned long long)shardset_num_documents(set),
               shardset_vocab_size(set), shardset_token_width(set) == 2 ? "uint16" : "uint32");
        shardset_close(set);
    }
    if (verify) printf("verified every shard's header and payload CRC in %.2f s\n", zy_now_seconds() - t0);
    return 0;
fail:
    fprintf(stderr, "zaya: %s\n", err.msg);
    return 1;
}

int cmd_data(int argc, char **argv) {
    if (argc < 3 || strcmp(argv[2], "--help") == 0 || strcmp(argv[2], "-h") == 0) {
        data_usage(argc < 3 ? stderr : stdout);
        return argc < 3 ? 2 : 0;
    }
    if (strcmp(argv[2], "synth") == 0) return cmd_synth(argc, argv);
    if (strcmp(argv[2], "prepare") == 0) return cmd_prepare(argc, argv);
    if (strcmp(argv[2], "info") == 0) return cmd_info(argc, argv);
    fprintf(stderr, "zaya: data: unknown subcommand \"%s\"\n\n", argv[2]);
    data_usage(stderr);
    return 2;
}

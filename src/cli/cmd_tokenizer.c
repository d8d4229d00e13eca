/* zaya tokenizer train / encode / decode: byte-level BPE in Hugging Face tokenizer.json format. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "commands.h"
#include "npy.h"
#include "tokenizer.h"

static int wants_help(int argc, char **argv) {
    for (int i = 3; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) return 1;
    return 0;
}

static void tokenizer_usage(FILE *f) {
    fprintf(f, "usage: zaya tokenizer <train|encode|decode> [options]   (zaya tokenizer <sub> --help)\n\n"
               "  train    learn a byte-level BPE tokenizer from text / .jsonl files\n"
               "  encode   text -> token ids (printed, or an int32 .npy)\n"
               "  decode   token ids -> raw bytes\n");
}

static int cmd_train(int argc, char **argv) {
    const char *input = NULL, *out = NULL;
    int vocab_size = 0, split_digits = 0;
    ArgSpec specs[] = {
        {"--input", ARG_STRING, 1, &input, "text files; .jsonl files give the \"text\" of each line; more files may follow", 0},
        {"--vocab-size", ARG_INT, 1, &vocab_size, "tokens in all: 3 specials + 256 bytes + merges", 0},
        {"--out", ARG_STRING, 1, &out, "tokenizer.json to write", 0},
        {"--split-digits", ARG_SWITCH, 0, &split_digits, "one token per digit: no merge joins two digits (like Gemma 3)", 0},
    };
    const int n = ZY_ARRAY_LEN(specs);
    if (wants_help(argc, argv)) {
        args_usage("tokenizer train", "--input FILE [FILE...] --vocab-size N --out tokenizer.json [--split-digits]", specs, n);
        return 0;
    }
    ZyErr err = {{0}};
    const char **files = calloc((size_t)argc + 1, sizeof *files);
    int n_pos = 0, rc = 1;
    Tokenizer *t = NULL;
    TokenizerTrainStats st = {0};
    if (!files) {
        fprintf(stderr, "zaya: out of memory\n");
        return 1;
    }
    if (args_parse(argc, argv, 3, specs, n, files + 1, argc, &n_pos, "tokenizer train", &err)) goto done;
    files[0] = input;
    if (tokenizer_train(files, n_pos + 1, vocab_size, split_digits, &t, &st, &err) || tokenizer_save(t, out, &err)) goto done;
    printf("read %.2f MB in %.2f s (%.2f MB/s; counting %.2f s, %.2f MB/s): %lld unique words\n", st.input_mb, st.seconds,
           st.seconds > 0 ? st.input_mb / st.seconds : 0.0, st.count_seconds,
           st.count_seconds > 0 ? st.input_mb / st.count_seconds : 0.0, (long long)st.words);
    printf("%d merges, vocab size %d -> %s\n", st.merges, tokenizer_vocab_size(t), out);
    if (tokenizer_vocab_size(t) < vocab_size)
        printf("note: the text ran out of pairs before reaching vocab size %d\n", vocab_size);
    rc = 0;
done:
    if (rc) fprintf(stderr, "zaya: %s\n", err.msg);
    tokenizer_free(t);
    free(files);
    return rc;
}

/* Writes s as a JSON string. */
static void put_json_string(FILE *f, const char *s, size_t n) {
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

/* The pre-tokens as HF's pre_tokenizer.pre_tokenize_str shows them: a JSON list of byte-level strings. */
static int print_pieces(const char *text, size_t len, ZyErr *err) {
    size_t *ends, n;
    if (tokenizer_pretokenize(text, len, &ends, &n, err)) return -1;
    char *bl = NULL;
    size_t cap = 0;
    fputc('[', stdout);
    for (size_t i = 0, a = 0; i < n; a = ends[i], i++) {
        size_t m = 0;
        if (cap < 2 * (ends[i] - a)) {
            cap = 2 * (ends[i] - a);
            char *q = realloc(bl, cap);
            if (!q) {
                free(bl);
                free(ends);
                return zy_fail(err, "out of memory");
            }
            bl = q;
        }
        for (size_t k = a; k < ends[i]; k++) { /* GPT-2's byte -> character map */
            unsigned b = (unsigned char)text[k], cp;
            if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)
                cp = b;
            else
                cp = b <= 0x20 ? 0x100 + b : b <= 0xA0 ? b + 162 : 0x143;
            if (cp < 0x80) {
                bl[m++] = (char)cp;
            } else {
                bl[m++] = (char)(0xC0 | cp >> 6);
                bl[m++] = (char)(0x80 | (cp & 0x3F));
            }
        }
        if (i) fputs(", ", stdout);
        put_json_string(stdout, bl, m);
    }
    fputs("]\n", stdout);
    free(bl);
    free(ends);
    return 0;
}

static int cmd_encode(int argc, char **argv) {
    const char *tok_path = NULL, *text = NULL, *input = NULL, *out = NULL;
    int pieces = 0;
    ArgSpec specs[] = {
        {"--tokenizer", ARG_STRING, 0, &tok_path, "tokenizer.json (required unless --pieces)", 0},
        {"--text", ARG_STRING, 0, &text, "text to encode", 0},
        {"--input", ARG_STRING, 0, &input, "file to encode (any bytes)", 0},
        {"--out", ARG_STRING, 0, &out, "write the ids as an int32 .npy instead of printing them", 0},
        {"--pieces", ARG_SWITCH, 0, &pieces, "print the pre-tokens (byte-level, as HF's pre_tokenize_str) instead", 0},
    };
    const int n = ZY_ARRAY_LEN(specs);
    if (wants_help(argc, argv)) {
        args_usage("tokenizer encode", "--tokenizer T (--text STR | --input FILE) [--out ids.npy] | --pieces", specs, n);
        return 0;
    }
    ZyErr err = {{0}};
    Tokenizer *t = NULL;
    char *data = NULL;
    int32_t *ids = NULL;
    size_t len = 0, n_ids = 0;
    int rc = 1;
    if (args_parse(argc, argv, 3, specs, n, NULL, 0, NULL, "tokenizer encode", &err)) goto done;
    if (!text == !input) {
        zy_fail(&err, "tokenizer encode: give exactly one of --text and --input");
        goto done;
    }
    if (input) {
        if (zy_read_file(input, &data, &len, &err)) goto done;
        text = data;
    } else {
        len = strlen(text);
    }
    if (pieces) {
        rc = print_pieces(text, len, &err) ? 1 : 0;
        goto done;
    }
    if (!tok_path) {
        zy_fail(&err, "tokenizer encode: missing required option --tokenizer");
        goto done;
    }
    if (tokenizer_load(tok_path, &t, &err)) goto done;
    double t0 = zy_now_seconds();
    if (tokenizer_encode(t, text, len, &ids, &n_ids, &err)) goto done;
    double sec = zy_now_seconds() - t0;
    if (out) {
        int64_t shape[1] = {(int64_t)n_ids};
        if (npy_write(out, ZY_DT_I32, ids, 1, shape, &err)) goto done;
        printf("encoded %.2f MB into %zu tokens in %.3f s (%.1f MB/s, %.2f bytes/token) -> %s\n", (double)len / 1e6, n_ids, sec,
               sec > 0 ? (double)len / 1e6 / sec : 0.0, n_ids ? (double)len / (double)n_ids : 0.0, out);
    } else {
        for (size_t i = 0; i < n_ids; i++) printf(i ? " %d" : "%d", ids[i]);
        printf("\n");
    }
    rc = 0;
done:
    if (rc) fprintf(stderr, "zaya: %s\n", err.msg);
    tokenizer_free(t);
    free(data);
    free(ids);
    return rc;
}

/* Appends the ids in s (separated by spaces, commas or brackets). */
static int parse_ids(const char *s, int32_t **ids, size_t *n, size_t *cap, ZyErr *err) {
    while (*s) {
        if (isspace((unsigned char)*s) || *s == ',' || *s == '[' || *s == ']') {
            s++;
            continue;
        }
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (end == s || errno || v < INT32_MIN || v > INT32_MAX)
            return zy_fail(err, "tokenizer decode: --ids: \"%.20s\" is not a token id", s);
        if (*n == *cap) {
            size_t nc = *cap ? *cap * 2 : 256;
            int32_t *q = realloc(*ids, nc * sizeof *q);
            if (!q) return zy_fail(err, "out of memory");
            *ids = q;
            *cap = nc;
        }
        (*ids)[(*n)++] = (int32_t)v;
        s = end;
    }
    return 0;
}

static int cmd_decode(int argc, char **argv) {
    const char *tok_path = NULL, *ids_arg = NULL, *input = NULL, *out = NULL;
    ArgSpec specs[] = {
        {"--tokenizer", ARG_STRING, 1, &tok_path, "tokenizer.json", 0},
        {"--ids", ARG_STRING, 0, &ids_arg, "ids separated by spaces or commas; more may follow as arguments", 0},
        {"--input", ARG_STRING, 0, &input, "ids from an int32/int64 .npy (any shape, read in order)", 0},
        {"--out", ARG_STRING, 0, &out, "write the bytes to a file instead of stdout", 0},
    };
    const int n = ZY_ARRAY_LEN(specs);
    if (wants_help(argc, argv)) {
        args_usage("tokenizer decode", "--tokenizer T (--ids ID... | --input ids.npy) [--out FILE]", specs, n);
        return 0;
    }
    ZyErr err = {{0}};
    Tokenizer *t = NULL;
    int32_t *ids = NULL;
    char *bytes = NULL;
    size_t n_ids = 0, cap = 0, len = 0;
    int rc = 1, n_pos = 0;
    const char **pos = calloc((size_t)argc + 1, sizeof *pos);
    if (!pos) {
        fprintf(stderr, "zaya: out of memory\n");
        return 1;
    }
    if (args_parse(argc, argv, 3, specs, n, pos, argc, &n_pos, "tokenizer decode", &err)) goto done;
    if (!ids_arg == !input || (input && n_pos)) {
        zy_fail(&err, "tokenizer decode: give either --ids ID... or --input ids.npy");
        goto done;
    }
    if (ids_arg) {
        if (parse_ids(ids_arg, &ids, &n_ids, &cap, &err)) goto done;
        for (int i = 0; i < n_pos; i++)
            if (parse_ids(pos[i], &ids, &n_ids, &cap, &err)) goto done;
    } else {
        int ndim;
        int64_t shape[ZY_MAX_DIMS];
        if (npy_read_tokens(input, &ids, &ndim, shape, &err)) goto done;
        n_ids = 1;
        for (int d = 0; d < ndim; d++) n_ids *= (size_t)shape[d];
    }
    if (tokenizer_load(tok_path, &t, &err) || tokenizer_decode(t, ids, n_ids, &bytes, &len, &err)) goto done;
    if (out) {
        if (zy_write_file_atomic(out, bytes, len, &err)) goto done;
    } else if (fwrite(bytes, 1, len, stdout) != len || fflush(stdout)) {
        zy_fail(&err, "tokenizer decode: cannot write to stdout");
        goto done;
    }
    rc = 0;
done:
    if (rc) fprintf(stderr, "zaya: %s\n", err.msg);
    tokenizer_free(t);
    free(ids);
    free(bytes);
    free(pos);
    return rc;
}

int cmd_tokenizer(int argc, char **argv) {
    if (argc < 3) {
        tokenizer_usage(stderr);
        return 2;
    }
    const char *sub = argv[2];
    if (strcmp(sub, "--help") == 0 || strcmp(sub, "-h") == 0 || strcmp(sub, "help") == 0) {
        tokenizer_usage(stdout);
        return 0;
    }
    if (strcmp(sub, "train") == 0) return cmd_train(argc, argv);
    if (strcmp(sub, "encode") == 0) return cmd_encode(argc, argv);
    if (strcmp(sub, "decode") == 0) return cmd_decode(argc, argv);
    fprintf(stderr, "zaya: tokenizer: unknown subcommand \"%s\"\n\n", sub);
    tokenizer_usage(stderr);
    return 2;
}

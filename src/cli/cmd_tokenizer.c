/* zaya tokenizer train / encode / decode / bench: BPE in Hugging Face tokenizer.json format (zaya trains
 * byte-level BPE; encode, decode and bench also take the released pipelines, e.g. Gemma 3's). */
#define _POSIX_C_SOURCE 200809L
#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "commands.h"
#include "io/npy.h"
#include "tokenizer/tokenizer.h"
#include "util/lines.h"

static void tokenizer_usage(FILE *f) {
    fprintf(f, "usage: zaya tokenizer <train|encode|decode|bench|chat> [options]   (zaya tokenizer <sub> --help)\n\n"
               "  train    learn a byte-level BPE tokenizer from text / .jsonl files\n"
               "  encode   text -> token ids (printed, or an int32 .npy), as HF's Tokenizer.encode(text).ids\n"
               "  decode   token ids -> bytes, as HF's Tokenizer.decode(ids)\n"
               "  bench    load time and one-thread encode / decode speed of a tokenizer on a text file\n"
               "  chat     render a conversation with the model's chat template, as apply_chat_template\n");
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
    if (args_help(argc, argv, 3, "tokenizer train", "--input FILE [FILE...] --vocab-size N --out tokenizer.json [--split-digits]",
                  specs, n))
        return 0;
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

/* Bytes as a JSON string; bytes that are not UTF-8 become \udcXX (Python's surrogateescape reads them back). */
static void put_json_bytes(FILE *f, const char *s, size_t n) {
    fputc('"', f);
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t l = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        int ok = l > 0 && i + l <= n;
        for (size_t k = 1; ok && k < l; k++) ok = ((unsigned char)s[i + k] & 0xC0) == 0x80;
        if (ok && l == 3) { /* no overlongs or surrogates */
            unsigned char d = (unsigned char)s[i + 1];
            ok = !(c == 0xE0 && d < 0xA0) && !(c == 0xED && d > 0x9F);
        }
        if (ok && l == 4) {
            unsigned char d = (unsigned char)s[i + 1];
            ok = !(c == 0xF0 && d < 0x90) && !(c == 0xF4 && d > 0x8F);
        }
        if (!ok) {
            fprintf(f, "\\udc%02x", c);
            i++;
        } else if (c == '"' || c == '\\') {
            fprintf(f, "\\%c", c);
            i++;
        } else if (c < 0x20 || c == 0x7F) {
            fprintf(f, "\\u%04x", c);
            i++;
        } else {
            fwrite(s + i, 1, l, f);
            i += l;
        }
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
        put_json_bytes(stdout, bl, m); /* the byte-level characters are printable UTF-8 */
    }
    fputs("]\n", stdout);
    free(bl);
    free(ends);
    return 0;
}

static int hex4(const char *s, unsigned *v) {
    *v = 0;
    for (int i = 0; i < 4; i++) {
        int c = s[i], d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        *v = *v << 4 | (unsigned)d;
    }
    return 0;
}

/* A JSON string literal at s[0..n) (s[0] == '"') into out (malloc'ed, *len bytes, NUL-terminated): \u0000
 * included, and a lone \udc80..\udcff is that raw byte (Python's surrogateescape), so any bytes can be given. */
static int json_string_bytes(const char *s, size_t n, char **out, size_t *len) {
    char *o = malloc(n + 1);
    size_t k = 0, i = 1;
    if (!o) return -1;
    while (i < n && s[i] != '"') {
        unsigned char c = (unsigned char)s[i];
        if (c != '\\') {
            if (c < 0x20) break;
            o[k++] = (char)c;
            i++;
            continue;
        }
        if (i + 1 >= n) break;
        char e = s[i + 1];
        i += 2;
        const char *simple = strchr("\"\\/bfnrt", e);
        if (simple && e) {
            o[k++] = "\"\\/\b\f\n\r\t"[simple - "\"\\/bfnrt"];
            continue;
        }
        unsigned cp;
        if (e != 'u' || i + 4 > n || hex4(s + i, &cp)) break;
        i += 4;
        if (cp >= 0xD800 && cp <= 0xDBFF) { /* a surrogate pair */
            unsigned lo;
            if (i + 6 > n || s[i] != '\\' || s[i + 1] != 'u' || hex4(s + i + 2, &lo) || lo < 0xDC00 || lo > 0xDFFF) break;
            i += 6;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        } else if (cp >= 0xDC80 && cp <= 0xDCFF) {
            o[k++] = (char)(cp - 0xDC00);
            continue;
        } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            break;
        }
        if (cp < 0x80) {
            o[k++] = (char)cp;
        } else if (cp < 0x800) {
            o[k++] = (char)(0xC0 | cp >> 6);
            o[k++] = (char)(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            o[k++] = (char)(0xE0 | cp >> 12);
            o[k++] = (char)(0x80 | (cp >> 6 & 0x3F));
            o[k++] = (char)(0x80 | (cp & 0x3F));
        } else {
            o[k++] = (char)(0xF0 | cp >> 18);
            o[k++] = (char)(0x80 | (cp >> 12 & 0x3F));
            o[k++] = (char)(0x80 | (cp >> 6 & 0x3F));
            o[k++] = (char)(0x80 | (cp & 0x3F));
        }
    }
    size_t end = i + 1;
    while (end < n && isspace((unsigned char)s[end])) end++;
    if (i >= n || s[i] != '"' || end != n) {
        free(o);
        return 1;
    }
    o[k] = '\0';
    *out = o;
    *len = k;
    return 0;
}

/* The text of one --jsonl line: a JSON string (any bytes, see json_string_bytes), or an object's "text" string
 * (malloc'ed copy). */
static int jsonl_text(const ZyLines *r, char **text, size_t *len, ZyErr *err) {
    size_t k = 0;
    while (k < r->len && isspace((unsigned char)r->line[k])) k++;
    if (k < r->len && r->line[k] == '"') {
        int rc = json_string_bytes(r->line + k, r->len - k, text, len);
        if (rc < 0) return zy_fail(err, "out of memory");
        if (rc) return zy_lines_fail(r, err, "invalid JSON string");
        return 0;
    }
    cJSON *o = zy_lines_json(r, "a JSON string or an object with a \"text\" string", err);
    if (!o) return -1;
    const cJSON *tx = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, "text") : NULL;
    int rc = 0;
    if (!cJSON_IsString(tx)) {
        rc = zy_lines_fail(r, err, "expected a JSON string or an object with a \"text\" string");
    } else {
        *len = strlen(tx->valuestring);
        *text = malloc(*len + 1);
        if (!*text)
            rc = zy_fail(err, "out of memory");
        else
            memcpy(*text, tx->valuestring, *len + 1);
    }
    cJSON_Delete(o);
    return rc;
}

/* Calls fn on every non-blank line of a file. */
static int each_line(const char *path, int (*fn)(void *ctx, const ZyLines *r, ZyErr *err), void *ctx, ZyErr *err) {
    ZyLines r;
    if (zy_lines_open(&r, path, ZY_LINES_SKIP_BLANK, err)) return -1;
    int rc = 0, got = 0;
    while (!rc && (got = zy_lines_next(&r, err)) > 0) rc = fn(ctx, &r, err);
    zy_lines_close(&r);
    return rc || got < 0 ? -1 : 0;
}

typedef struct {
    const Tokenizer *t;
    TokenizerCache *cache;
    unsigned flags;
} EncodeLines;

static int encode_line(void *ctx, const ZyLines *r, ZyErr *err) {
    EncodeLines *c = ctx;
    char *text = NULL;
    size_t len = 0, n_ids = 0;
    int32_t *ids = NULL;
    if (jsonl_text(r, &text, &len, err)) return -1;
    int rc = tokenizer_encode_ex(c->t, c->cache, text, len, c->flags, &ids, &n_ids, err);
    free(text);
    if (rc) return zy_wrap(err, "%s:%ld", r->path, r->lineno);
    for (size_t i = 0; i < n_ids; i++) printf(i ? " %d" : "%d", ids[i]);
    printf("\n");
    free(ids);
    return 0;
}

static int cmd_encode(int argc, char **argv) {
    const char *tok_path = NULL, *text = NULL, *input = NULL, *jsonl = NULL, *out = NULL;
    int pieces = 0, no_special = 0;
    ArgSpec specs[] = {
        {"--tokenizer", ARG_STRING, 0, &tok_path, "tokenizer.json or a model folder holding it (required unless --pieces)", 0},
        {"--text", ARG_STRING, 0, &text, "text to encode", 0},
        {"--input", ARG_STRING, 0, &input, "file to encode (any bytes)", 0},
        {"--jsonl", ARG_STRING, 0, &jsonl, "encode each line, a JSON string (\\udc80-\\udcff: raw bytes) or {\"text\": ...}: a line of ids each", 0},
        {"--out", ARG_STRING, 0, &out, "write the ids as an int32 .npy instead of printing them", 0},
        {"--no-special", ARG_SWITCH, 0, &no_special, "no post-processor special tokens (HF's add_special_tokens=False)", 0},
        {"--pieces", ARG_SWITCH, 0, &pieces, "print the GPT-2 pre-tokens (byte-level, as HF's pre_tokenize_str) instead", 0},
    };
    const int n = ZY_ARRAY_LEN(specs);
    if (args_help(argc, argv, 3, "tokenizer encode",
                  "--tokenizer T (--text STR | --input FILE | --jsonl FILE) [--out ids.npy] [--no-special] | --pieces", specs, n))
        return 0;
    ZyErr err = {{0}};
    Tokenizer *t = NULL;
    TokenizerCache *cache = NULL;
    char *data = NULL;
    int32_t *ids = NULL;
    size_t len = 0, n_ids = 0;
    int rc = 1;
    if (args_parse(argc, argv, 3, specs, n, NULL, 0, NULL, "tokenizer encode", &err)) goto done;
    unsigned flags = no_special ? 0 : TOK_ENCODE_ADD_SPECIAL;
    if ((text != NULL) + (input != NULL) + (jsonl != NULL) != 1) {
        zy_fail(&err, "tokenizer encode: give exactly one of --text, --input and --jsonl");
        goto done;
    }
    if (jsonl && (out || pieces)) {
        zy_fail(&err, "tokenizer encode: --jsonl prints ids per line (no --out or --pieces)");
        goto done;
    }
    if (input) {
        if (zy_read_file(input, &data, &len, &err)) goto done;
        text = data;
    } else if (text) {
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
    if (!(cache = tokenizer_cache_new())) {
        zy_fail(&err, "out of memory");
        goto done;
    }
    if (jsonl) {
        EncodeLines c = {t, cache, flags};
        if (each_line(jsonl, encode_line, &c, &err)) goto done;
        rc = 0;
        goto done;
    }
    double t0 = zy_now_seconds();
    if (tokenizer_encode_ex(t, cache, text, len, flags, &ids, &n_ids, &err)) goto done;
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
    tokenizer_cache_free(cache);
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

typedef struct {
    const Tokenizer *t;
    unsigned flags;
} DecodeLines;

static int decode_line(void *ctx, const ZyLines *r, ZyErr *err) {
    DecodeLines *c = ctx;
    cJSON *arr = zy_lines_json(r, "a JSON array of ids", err);
    if (!arr) return -1;
    int rc = 0;
    size_t cnt = cJSON_IsArray(arr) ? (size_t)cJSON_GetArraySize(arr) : 0;
    int32_t *ids = malloc((cnt + 1) * sizeof *ids);
    if (!cJSON_IsArray(arr)) rc = zy_lines_fail(r, err, "expected a JSON array of ids");
    if (!rc && !ids) rc = zy_fail(err, "out of memory");
    size_t k = 0;
    for (const cJSON *x = arr->child; x && !rc; x = x->next) {
        if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) || fabs(x->valuedouble) > 2147483647.0)
            rc = zy_lines_fail(r, err, "element %zu is not a token id", k);
        else
            ids[k++] = (int32_t)x->valuedouble;
    }
    cJSON_Delete(arr);
    char *bytes = NULL;
    size_t len;
    if (!rc && tokenizer_decode_ex(c->t, ids, k, c->flags, &bytes, &len, err)) rc = zy_wrap(err, "%s:%ld", r->path, r->lineno);
    if (!rc) {
        put_json_bytes(stdout, bytes, len);
        fputc('\n', stdout);
    }
    free(bytes);
    free(ids);
    return rc;
}

static int cmd_decode(int argc, char **argv) {
    const char *tok_path = NULL, *ids_arg = NULL, *input = NULL, *jsonl = NULL, *out = NULL;
    int skip_special = 0, lossy = 0;
    ArgSpec specs[] = {
        {"--tokenizer", ARG_STRING, 1, &tok_path, "tokenizer.json or a model folder holding it", 0},
        {"--ids", ARG_STRING, 0, &ids_arg, "ids separated by spaces or commas; more may follow as arguments", 0},
        {"--input", ARG_STRING, 0, &input, "ids from an int32/int64 .npy (any shape, read in order)", 0},
        {"--jsonl", ARG_STRING, 0, &jsonl, "decode each line (a JSON array of ids) to one JSON string per line", 0},
        {"--out", ARG_STRING, 0, &out, "write the bytes to a file instead of stdout", 0},
        {"--skip-special", ARG_SWITCH, 0, &skip_special, "leave special tokens out (HF's skip_special_tokens=True)", 0},
        {"--lossy", ARG_SWITCH, 0, &lossy, "U+FFFD where bytes are not UTF-8, exactly as HF's decode (default: the bytes)", 0},
    };
    const int n = ZY_ARRAY_LEN(specs);
    if (args_help(argc, argv, 3, "tokenizer decode",
                  "--tokenizer T (--ids ID... | --input ids.npy | --jsonl FILE) [--out FILE] [--skip-special] [--lossy]", specs, n))
        return 0;
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
    unsigned flags = (skip_special ? TOK_DECODE_SKIP_SPECIAL : 0) | (lossy ? TOK_DECODE_LOSSY : 0);
    if ((ids_arg != NULL) + (input != NULL) + (jsonl != NULL) != 1 || (!ids_arg && n_pos) || (jsonl && out)) {
        zy_fail(&err, "tokenizer decode: give one of --ids ID..., --input ids.npy or --jsonl FILE (--jsonl prints, no --out)");
        goto done;
    }
    if (tokenizer_load(tok_path, &t, &err)) goto done;
    if (jsonl) {
        DecodeLines c = {t, flags};
        if (each_line(jsonl, decode_line, &c, &err)) goto done;
        rc = 0;
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
    if (tokenizer_decode_ex(t, ids, n_ids, flags, &bytes, &len, &err)) goto done;
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

typedef struct {
    char **text;
    size_t *len, n, cap, bytes;
} Texts;

/* Appends text (taking it over). */
static int add_text(Texts *c, char *text, size_t len, ZyErr *err) {
    if (c->n == c->cap) {
        size_t nc = c->cap ? c->cap * 2 : 1024;
        char **q = realloc(c->text, nc * sizeof *q);
        size_t *l = q ? realloc(c->len, nc * sizeof *l) : NULL;
        if (q) c->text = q;
        if (!l) {
            free(text);
            return zy_fail(err, "out of memory");
        }
        c->len = l;
        c->cap = nc;
    }
    c->text[c->n] = text;
    c->len[c->n++] = len;
    c->bytes += len;
    return 0;
}

static int collect_line(void *ctx, const ZyLines *r, ZyErr *err) {
    char *text;
    size_t len;
    return jsonl_text(r, &text, &len, err) || add_text(ctx, text, len, err) ? -1 : 0;
}

/* Load time and one-thread speed: encode passes over the text(s) (the first with an empty cache), then decode
 * of the ids. */
static int cmd_tok_bench(int argc, char **argv) {
    const char *tok_path = NULL, *input = NULL, *jsonl = NULL;
    int repeat = 3;
    ArgSpec specs[] = {
        {"--tokenizer", ARG_STRING, 1, &tok_path, "tokenizer.json or a model folder holding it", 0},
        {"--input", ARG_STRING, 0, &input, "a text file, encoded as one text", 0},
        {"--jsonl", ARG_STRING, 0, &jsonl, "texts, one per line (a JSON string or {\"text\": ...}), encoded one by one", 0},
        {"--repeat", ARG_INT, 0, &repeat, "encode passes (default 3): the first with an empty cache, then the best warm one", 0},
    };
    const int n = ZY_ARRAY_LEN(specs);
    if (args_help(argc, argv, 3, "tokenizer bench", "--tokenizer T (--input FILE | --jsonl FILE) [--repeat N]", specs, n)) return 0;
    ZyErr err = {{0}};
    Tokenizer *t = NULL;
    TokenizerCache *cache = NULL;
    Texts tx = {0};
    char *data = NULL, *back = NULL;
    int32_t *all = NULL;
    size_t n_all = 0, back_len = 0;
    int rc = 1;
    if (args_parse(argc, argv, 3, specs, n, NULL, 0, NULL, "tokenizer bench", &err)) goto done;
    if (repeat < 1 || !input == !jsonl) {
        zy_fail(&err, "tokenizer bench: give one of --input and --jsonl, and --repeat of at least 1");
        goto done;
    }
    if (input) {
        size_t len;
        if (zy_read_file(input, &data, &len, &err)) goto done;
        char *whole = data; /* the file itself as the one text */
        data = NULL;
        if (add_text(&tx, whole, len, &err)) goto done;
    } else if (each_line(jsonl, collect_line, &tx, &err)) {
        goto done;
    }
    double t0 = zy_now_seconds();
    if (tokenizer_load(tok_path, &t, &err)) goto done;
    double load_s = zy_now_seconds() - t0;
    if (!(cache = tokenizer_cache_new())) {
        zy_fail(&err, "out of memory");
        goto done;
    }
    double cold = 0, warm = 0;
    for (int r = 0; r < repeat; r++) {
        n_all = 0;
        t0 = zy_now_seconds();
        for (size_t i = 0; i < tx.n; i++) {
            int32_t *ids;
            size_t k;
            if (tokenizer_encode_ex(t, cache, tx.text[i], tx.len[i], 0, &ids, &k, &err)) goto done;
            if (r == 0 && k) { /* keep the ids for decoding */
                int32_t *q = realloc(all, (n_all + k) * sizeof *q);
                if (!q) {
                    free(ids);
                    zy_fail(&err, "out of memory");
                    goto done;
                }
                all = q;
                memcpy(all + n_all, ids, k * sizeof *ids);
            }
            n_all += k;
            free(ids);
        }
        double s = zy_now_seconds() - t0;
        if (r == 0)
            cold = s;
        else if (r == 1 || s < warm)
            warm = s;
    }
    t0 = zy_now_seconds();
    if (tokenizer_decode(t, all, n_all, &back, &back_len, &err)) goto done;
    double dec_s = zy_now_seconds() - t0;
    double mb = (double)tx.bytes / 1e6;
    printf("tokenizer: %s: %d ids, loaded in %.3f s\n", tok_path, tokenizer_vocab_size(t), load_s);
    printf("text: %s: %.2f MB in %zu text%s -> %zu tokens (%.2f bytes/token)\n", input ? input : jsonl, mb, tx.n,
           tx.n == 1 ? "" : "s", n_all, n_all ? (double)tx.bytes / (double)n_all : 0.0);
    printf("encode (one thread, empty cache): %.3f s, %.1f MB/s\n", cold, cold > 0 ? mb / cold : 0.0);
    if (repeat > 1) printf("encode (one thread, warm cache, best of %d): %.3f s, %.1f MB/s\n", repeat - 1, warm, warm > 0 ? mb / warm : 0.0);
    printf("decode: %.3f s, %.1f MB/s of text\n", dec_s, dec_s > 0 ? (double)back_len / 1e6 / dec_s : 0.0);
    rc = 0;
done:
    if (rc) fprintf(stderr, "zaya: %s\n", err.msg);
    tokenizer_cache_free(cache);
    tokenizer_free(t);
    for (size_t i = 0; i < tx.n; i++) free(tx.text[i]);
    free(tx.text);
    free(tx.len);
    free(data);
    free(all);
    free(back);
    return rc;
}

int cmd_tokenizer_chat(int argc, char **argv); /* src/cli/cmd_chat.c */

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
    if (strcmp(sub, "chat") == 0) return cmd_tokenizer_chat(argc, argv);
    if (strcmp(sub, "bench") == 0) return cmd_tok_bench(argc, argv);
    fprintf(stderr, "zaya: tokenizer: unknown subcommand \"%s\"\n\n", sub);
    tokenizer_usage(stderr);
    return 2;
}

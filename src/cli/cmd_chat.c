/* zaya tokenizer chat: renders a conversation with a model folder's chat template, as transformers'
 * apply_chat_template(messages, tokenize=False, ...) does, and prints the prompt byte for byte (no newline is
 * added: the output is exactly the template's). --jsonl renders many conversations, one JSON line each. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "tokenizer/chat_template.h"
#include "util/lines.h"

int cmd_tokenizer_chat(int argc, char **argv);

/* A file's bytes, or stdin's for "-". */
static int read_input(const char *path, char **data, size_t *len, ZyErr *err) {
    if (strcmp(path, "-") != 0) return zy_read_file(path, data, len, err);
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    if (!buf) return zy_fail(err, "out of memory");
    for (;;) {
        if (n + 1 >= cap) {
            char *g = cap > ((size_t)1 << 40) ? NULL : realloc(buf, cap * 2);
            if (!g) {
                free(buf);
                return zy_fail(err, "out of memory");
            }
            buf = g;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, stdin);
        n += got;
        if (got == 0) break;
    }
    if (ferror(stdin)) {
        free(buf);
        return zy_fail(err, "cannot read stdin");
    }
    buf[n] = '\0';
    *data = buf;
    *len = n;
    return 0;
}

/* s as a JSON string (the text is UTF-8: kept as is, control characters escaped). */
static void put_json_string(FILE *f, const char *s, size_t n) {
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c == '\n')
            fputs("\\n", f);
        else if (c < 0x20 || c == 0x7F)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

/* --jsonl: each non-blank line is {"messages": [...], "tools": ..., "add_generation_prompt": ..., NAME: value...};
 * each gives one line, the prompt as a JSON string, or {"error": "..."}. Returns the number of failed lines. */
static long render_jsonl(const ChatRenderer *c, const char *path, int gen_prompt, const ChatRenderOpts *opts, ZyErr *err) {
    ZyLines r;
    if (zy_lines_open(&r, path, ZY_LINES_SKIP_BLANK, err)) return -1;
    char *out = NULL;
    size_t out_len;
    long failed = 0;
    int got;
    while ((got = zy_lines_next(&r, err)) > 0) {
        ZyErr e = {{0}};
        if (chat_renderer_render_json(c, r.line, r.len, gen_prompt, opts, &out, &out_len, &e) == 0) {
            put_json_string(stdout, out, out_len);
        } else {
            char msg[sizeof e.msg + 64];
            snprintf(msg, sizeof msg, "line %ld: %s", r.lineno, e.msg);
            fputs("{\"error\": ", stdout);
            put_json_string(stdout, msg, strlen(msg));
            fputc('}', stdout);
            failed++;
        }
        fputc('\n', stdout);
        free(out);
        out = NULL;
    }
    zy_lines_close(&r);
    return got < 0 ? -1 : failed;
}

/* "YYYY-MM-DD" -> Unix seconds at midnight UTC */
static int parse_date(const char *s, int64_t *out) {
    int y, m, d;
    char tail;
    if (sscanf(s, "%4d-%2d-%2d%c", &y, &m, &d, &tail) != 3 || m < 1 || m > 12 || d < 1 || d > 31) return -1;
    /* days from civil (Howard Hinnant's algorithm): no timegm(), no TZ */
    y -= m <= 2;
    const int era = (y >= 0 ? y : y - 399) / 400;
    const unsigned yoe = (unsigned)(y - era * 400);
    const unsigned doy = (unsigned)((153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1);
    const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    *out = ((int64_t)era * 146097 + (int64_t)doe - 719468) * 86400;
    return 0;
}

int cmd_tokenizer_chat(int argc, char **argv) {
    const char *tok_path = NULL, *messages = NULL, *jsonl = NULL, *tools = NULL, *date = NULL;
    int gen_prompt = 0;
    ArgSpec specs[] = {
        {"--tokenizer", ARG_STRING, 1, &tok_path,
         "model folder, or a file in it (tokenizer.json, tokenizer_config.json) or a .jinja template", 0},
        {"--messages", ARG_STRING, 0, &messages, "JSON list of messages ({\"role\": ..., \"content\": ...}); - = stdin", 0},
        {"--jsonl", ARG_STRING, 0, &jsonl, "instead of --messages: one conversation per line, {\"messages\": [...], "
                                           "\"tools\": ..., NAME: value...}; prints one JSON string per line", 0},
        {"--add-generation-prompt", ARG_SWITCH, 0, &gen_prompt, "end with the header that starts the assistant's turn", 0},
        {"--tools", ARG_STRING, 0, &tools, "JSON list of tool schemas (the template sees tools = None without it)", 0},
        {"--set", ARG_STRING, 0, NULL, "NAME=VALUE template variable, VALUE parsed as JSON else taken as a string "
                                       "(e.g. enable_thinking=false); may repeat", 0},
        {"--date", ARG_STRING, 0, &date, "YYYY-MM-DD that strftime_now reports (midnight UTC; default: now, local time)", 0},
    };
    const int n = ZY_ARRAY_LEN(specs);
    if (args_help(argc, argv, 3, "tokenizer chat",
                  "--tokenizer DIR_OR_FILE (--messages FILE.json | --jsonl FILE) [--add-generation-prompt] "
                  "[--tools FILE.json] [--set NAME=VALUE ...] [--date YYYY-MM-DD]",
                  specs, n)) {
        printf("\nPrints the prompt exactly as transformers' apply_chat_template(..., tokenize=False) renders it,\n"
               "with no newline added. The template is DIR/chat_template.jinja, else tokenizer_config.json's\n"
               "chat_template; bos_token, eos_token, ... come from tokenizer_config.json. With --jsonl, a line\n"
               "that fails prints {\"error\": ...} and the exit status is 1.\n");
        return 0;
    }
    ZyErr err = {{0}};
    int rc = 1;
    char *msg_text = NULL, *tools_text = NULL, *out = NULL;
    size_t msg_len = 0, tools_len = 0, out_len = 0;
    ChatConfig cfg = {0};
    ChatRenderer *renderer = NULL;
    /* --set repeats, which args_parse refuses: collect those first */
    const char **sets = calloc((size_t)argc + 1, sizeof *sets);
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    int n_sets = 0, n_rest = 0;
    if (!sets || !rest) {
        fprintf(stderr, "zaya: out of memory\n");
        free(sets);
        free(rest);
        return 1;
    }
    for (int i = 0; i < argc; i++) {
        if (i >= 3 && strcmp(argv[i], "--set") == 0) {
            if (i + 1 >= argc) {
                zy_fail(&err, "tokenizer chat: option --set needs a value");
                goto done;
            }
            sets[n_sets++] = argv[++i];
        } else if (i >= 3 && strncmp(argv[i], "--set=", 6) == 0) {
            sets[n_sets++] = argv[i] + 6;
        } else {
            rest[n_rest++] = argv[i];
        }
    }
    if (args_parse(n_rest, rest, 3, specs, n, NULL, 0, NULL, "tokenizer chat", &err)) goto done;
    ChatRenderOpts opts = {0};
    if (date) {
        if (parse_date(date, &opts.now)) {
            zy_fail(&err, "tokenizer chat: --date \"%s\": YYYY-MM-DD expected", date);
            goto done;
        }
        opts.have_now = 1;
    }
    if (!messages == !jsonl || (jsonl && (tools || n_sets))) {
        zy_fail(&err, "tokenizer chat: give --messages or --jsonl (with --jsonl, tools and variables go in each line)");
        goto done;
    }
    if (chat_config_load(tok_path, &cfg, &err) || chat_renderer_new(&cfg, &renderer, &err)) goto done;
    if (jsonl) {
        long failed = render_jsonl(renderer, jsonl, gen_prompt, &opts, &err);
        if (failed < 0 || fflush(stdout)) goto done;
        rc = failed ? 1 : 0;
        if (failed) fprintf(stderr, "zaya: tokenizer chat: %ld conversation(s) failed\n", failed);
        goto cleanup;
    }
    if (read_input(messages, &msg_text, &msg_len, &err)) goto done;
    if (tools && zy_read_file(tools, &tools_text, &tools_len, &err)) goto done;
    ChatInput in = {msg_text, msg_len, tools_text, tools_len, gen_prompt, sets, n_sets};
    if (chat_renderer_render(renderer, &in, &opts, &out, &out_len, &err)) goto done;
    if (fwrite(out, 1, out_len, stdout) != out_len || fflush(stdout)) {
        zy_fail(&err, "tokenizer chat: cannot write to stdout");
        goto done;
    }
    rc = 0;
done:
    if (rc) fprintf(stderr, "zaya: tokenizer chat: %s\n", err.msg);
cleanup:
    chat_renderer_free(renderer);
    chat_config_free(&cfg);
    free(msg_text);
    free(tools_text);
    free(out);
    free(sets);
    free(rest);
    return rc;
}

#include "lines.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

int zy_lines_open(ZyLines *r, const char *path, unsigned flags, ZyErr *err) {
    memset(r, 0, sizeof *r);
    const int is_stdin = strcmp(path, "-") == 0;
    r->path = is_stdin ? "<stdin>" : path;
    r->eol = "";
    r->flags = flags;
    r->f = is_stdin ? stdin : fopen(path, "rb");
    if (!r->f) return zy_fail(err, "%s: cannot open: %s", path, strerror(errno));
    return 0;
}

static int is_blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r') return 0;
    return 1;
}

int zy_lines_next(ZyLines *r, ZyErr *err) {
    for (;;) {
        errno = 0;
        const ssize_t got = getline(&r->line, &r->cap, r->f);
        if (got < 0) {
            if (ferror(r->f)) return zy_fail(err, "%s: read error: %s", r->path, strerror(errno ? errno : EIO));
            return 0;
        }
        r->lineno++;
        char *s = r->line;
        size_t n = (size_t)got;
        if (r->lineno == 1 && (r->flags & ZY_LINES_SKIP_BOM) && n >= 3 && memcmp(s, "\xEF\xBB\xBF", 3) == 0) {
            memmove(s, s + 3, n - 3);
            n -= 3;
        }
        r->eol = "";
        if (n && s[n - 1] == '\n') n--, r->eol = "\n";
        if (n && s[n - 1] == '\r') n--, r->eol = *r->eol ? "\r\n" : "\r";
        s[n] = '\0';
        r->len = n;
        if (!(r->flags & ZY_LINES_SKIP_BLANK) || !is_blank(s, n)) return 1;
    }
}

void zy_lines_close(ZyLines *r) {
    free(r->line);
    if (r->f && r->f != stdin) fclose(r->f);
    r->line = NULL;
    r->f = NULL;
}

int zy_lines_fail(const ZyLines *r, ZyErr *err, const char *fmt, ...) {
    if (!err) return -1;
    char msg[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return zy_fail(err, "%s:%ld: %s", r->path, r->lineno, msg);
}

cJSON *zy_lines_json(const ZyLines *r, const char *expected, ZyErr *err) {
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(r->line, r->len, &end, 0);
    if (!j) {
        /* cJSON points at the byte where parsing failed (the last byte of a line that ends too soon) */
        const size_t col = end && end >= r->line && end <= r->line + r->len ? (size_t)(end - r->line) + 1 : 1;
        zy_lines_fail(r, err, "invalid JSON at column %zu%s%s%s", col, expected ? " (expected " : "", expected ? expected : "",
                      expected ? ")" : "");
    }
    return j;
}

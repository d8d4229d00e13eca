/* lines: a text file (or stdin) read line by line with 1-based line numbers, and JSON Lines on top of it, so every
 * reader of .jsonl / line files strips newlines, skips blank lines and names file:line in its errors the same way. */
#ifndef ZAYA_UTIL_LINES_H
#define ZAYA_UTIL_LINES_H

#include <cjson/cJSON.h>
#include <stdio.h>

#include "util/util.h"

enum {
    ZY_LINES_SKIP_BLANK = 1u, /* pass over lines of only spaces, tabs and CRs (JSONL's blank lines); still counted */
    ZY_LINES_SKIP_BOM = 2u,   /* drop a UTF-8 byte order mark at the start of the first line */
};

typedef struct {
    const char *path; /* the file as given, "<stdin>" for "-": what messages name */
    char *line;       /* the current line without its "\n" / "\r\n", NUL-terminated (it may hold NULs: use len) */
    size_t len;
    const char *eol;  /* what was stripped: "\n", "\r\n", "\r" or "" (a last line without one) */
    long lineno;      /* 1-based */
    /* private */
    FILE *f;
    size_t cap;
    unsigned flags;
} ZyLines;

/* Opens path ("-": stdin) for reading; flags: ZY_LINES_*. */
int zy_lines_open(ZyLines *r, const char *path, unsigned flags, ZyErr *err);
/* The next line into r->line: 1, or 0 at the end, -1 on a read error. */
int zy_lines_next(ZyLines *r, ZyErr *err);
void zy_lines_close(ZyLines *r);

/* An error about the current line: "path:N: " + the message; returns -1. */
int zy_lines_fail(const ZyLines *r, ZyErr *err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The current line parsed as JSON (any value; the caller checks its type and cJSON_Deletes it), or NULL with
 * "path:N: invalid JSON at column C (expected <expected>)" (expected may be NULL). As cJSON_ParseWithLength, text
 * after the value is not looked at. */
cJSON *zy_lines_json(const ZyLines *r, const char *expected, ZyErr *err);

#endif

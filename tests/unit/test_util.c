/* Helpers shared by the unit tests: scratch directories. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test.h"
#include "util/lines.h"
#include "util/util.h"

int zy_test_tmpdir(char *dir, size_t cap, const char *tag) {
    snprintf(dir, cap, "/tmp/zy_%s_XXXXXX", tag);
    return mkdtemp(dir) ? 0 : -1;
}

void zy_test_rmtree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[1024];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (unlink(p) != 0) zy_test_rmtree(p);
    }
    closedir(d);
    rmdir(dir);
}

/* zy_calloc zeroes large blocks lazily (pages handed back, zero on first touch): a block that reuses memory just
 * freed dirty is still all zeros, at both unaligned ends and inside; zy_release_pages keeps the partial pages. */
TEST(calloc_zeroes_reused_memory_and_release_keeps_partial_pages) {
    for (int round = 0; round < 4; round++) {
        const size_t n = (size_t)(1 << 20) + 64 * (size_t)round + 192; /* not a page multiple */
        unsigned char *dirty = zy_calloc(n);
        REQUIRE(dirty);
        memset(dirty, 0xA5, n);
        zy_free(dirty);
        unsigned char *p = zy_calloc(n);
        REQUIRE(p);
        size_t nonzero = 0;
        for (size_t i = 0; i < n; i++) nonzero += p[i] != 0;
        CHECK_MSG(nonzero == 0, "round %d: %zu non-zero bytes", round, nonzero);
        /* released interior pages read as zero; bytes outside whole pages keep their values */
        memset(p, 7, n);
        const size_t off = 100, len = n - 300;
        zy_release_pages(p + off, len);
        CHECK(p[0] == 7 && p[off] == 7 && p[n - 1] == 7 && p[off + len] == 7);
        const long page = sysconf(_SC_PAGESIZE);
        const size_t mid = (off + len / 2) & ~((size_t)page - 1);
        CHECK(p[mid] == 0);
        zy_free(p);
    }
}

/* Writes n bytes of text to a fresh file under dir; returns its path (static buffer). */
static const char *lines_file(const char *dir, const char *text, size_t n) {
    static char path[512];
    snprintf(path, sizeof path, "%s/t.jsonl", dir);
    FILE *f = fopen(path, "wb");
    if (f) {
        fwrite(text, 1, n, f);
        fclose(f);
    }
    return path;
}

/* Reads every line of path with flags into got[] ("line|eol|lineno"), returning how many (or -1 on an error). */
static int lines_read_all(const char *path, unsigned flags, char got[][64], int cap) {
    ZyLines r;
    ZyErr err;
    if (zy_lines_open(&r, path, flags, &err)) return -1;
    int n = 0, rc;
    while ((rc = zy_lines_next(&r, &err)) > 0 && n < cap)
        snprintf(got[n++], 64, "%.*s|%s|%ld", (int)r.len, r.line,
                 !*r.eol ? "" : r.eol[0] == '\n' ? "LF" : r.eol[1] ? "CRLF" : "CR", r.lineno);
    zy_lines_close(&r);
    return rc < 0 ? -1 : n;
}

/* The line reader: an empty file has no lines; a last line without a newline is still a line; "\r\n" and "\n" are
 * stripped (and said which); blank lines are skipped only on request but still counted; a BOM is dropped on request. */
TEST(lines_strip_newlines_count_lines_and_skip_blanks) {
    char dir[256];
    REQUIRE(zy_test_tmpdir(dir, sizeof dir, "lines") == 0);
    char got[8][64];
    CHECK(lines_read_all(lines_file(dir, "", 0), 0, got, 8) == 0);
    CHECK(lines_read_all(lines_file(dir, "", 0), ZY_LINES_SKIP_BLANK, got, 8) == 0);

    const char *p = lines_file(dir, "a\nb", 3);
    CHECK(lines_read_all(p, 0, got, 8) == 2 && !strcmp(got[0], "a|LF|1") && !strcmp(got[1], "b||2"));

    p = lines_file(dir, "a\r\n\r\n b\r\n\t\nc\r", 13);
    CHECK(lines_read_all(p, 0, got, 8) == 5);
    CHECK(!strcmp(got[0], "a|CRLF|1") && !strcmp(got[1], "|CRLF|2") && !strcmp(got[2], " b|CRLF|3") &&
          !strcmp(got[3], "\t|LF|4") && !strcmp(got[4], "c|CR|5"));
    CHECK(lines_read_all(p, ZY_LINES_SKIP_BLANK, got, 8) == 3);
    CHECK(!strcmp(got[0], "a|CRLF|1") && !strcmp(got[1], " b|CRLF|3") && !strcmp(got[2], "c|CR|5"));

    p = lines_file(dir, "\xEF\xBB\xBFx\n\xEF\xBB\xBFy\n", 10);
    CHECK(lines_read_all(p, ZY_LINES_SKIP_BOM, got, 8) == 2 && !strcmp(got[0], "x|LF|1") &&
          !strcmp(got[1], "\xEF\xBB\xBFy|LF|2")); /* only at the start of the file */
    CHECK(lines_read_all(p, 0, got, 8) == 2 && !strcmp(got[0], "\xEF\xBB\xBFx|LF|1"));

    ZyLines r;
    ZyErr err;
    char missing[300];
    snprintf(missing, sizeof missing, "%s/missing.jsonl", dir);
    CHECK(zy_lines_open(&r, missing, 0, &err) == -1 && strstr(err.msg, "missing.jsonl: cannot open"));
    zy_test_rmtree(dir);
}

/* A line longer than any fixed buffer (3 MB, no final newline) comes back whole; the next call ends the file. */
TEST(lines_read_a_very_long_line_whole) {
    char dir[256];
    REQUIRE(zy_test_tmpdir(dir, sizeof dir, "lines") == 0);
    const size_t n = (size_t)3 << 20;
    char *text = malloc(n + 16);
    REQUIRE(text);
    memcpy(text, "{\"text\": \"", 10);
    for (size_t i = 10; i < n - 2; i++) text[i] = (char)('a' + i % 26);
    memcpy(text + n - 2, "\"}", 2);
    const char *p = lines_file(dir, text, n);
    ZyLines r;
    ZyErr err;
    REQUIRE(zy_lines_open(&r, p, 0, &err) == 0);
    CHECK(zy_lines_next(&r, &err) == 1 && r.len == n && r.line[n] == '\0' && memcmp(r.line, text, n) == 0 &&
          r.lineno == 1 && !*r.eol);
    cJSON *j = zy_lines_json(&r, NULL, &err);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "text");
    CHECK(cJSON_IsString(t) && strlen(t->valuestring) == n - 12);
    cJSON_Delete(j);
    CHECK(zy_lines_next(&r, &err) == 0);
    zy_lines_close(&r);
    free(text);
    zy_test_rmtree(dir);
}

/* zy_lines_json: a good line parses (any JSON value); a bad one is an error naming file:line (blank lines counted)
 * and the column where parsing failed; zy_lines_fail names the same place. */
TEST(lines_json_errors_name_file_line_and_column) {
    char dir[256];
    REQUIRE(zy_test_tmpdir(dir, sizeof dir, "lines") == 0);
    const char text[] = "{\"a\": 1}\r\n\n[1, 2]\n{\"a\": tru}\n";
    const char *p = lines_file(dir, text, sizeof text - 1);
    ZyLines r;
    ZyErr err = {{0}};
    REQUIRE(zy_lines_open(&r, p, ZY_LINES_SKIP_BLANK, &err) == 0);
    REQUIRE(zy_lines_next(&r, &err) == 1);
    cJSON *j = zy_lines_json(&r, NULL, &err);
    CHECK(cJSON_IsObject(j) && cJSON_GetObjectItemCaseSensitive(j, "a")->valueint == 1);
    cJSON_Delete(j);
    REQUIRE(zy_lines_next(&r, &err) == 1 && r.lineno == 3);
    j = zy_lines_json(&r, NULL, &err);
    CHECK(cJSON_IsArray(j));
    cJSON_Delete(j);
    char want[600];
    snprintf(want, sizeof want, "%s:3: not an object", p);
    CHECK(zy_lines_fail(&r, &err, "not an %s", "object") == -1 && !strcmp(err.msg, want));
    REQUIRE(zy_lines_next(&r, &err) == 1 && r.lineno == 4);
    CHECK(zy_lines_json(&r, NULL, &err) == NULL);
    snprintf(want, sizeof want, "%s:4: invalid JSON at column ", p);
    CHECK_MSG(!strncmp(err.msg, want, strlen(want)) && atoi(err.msg + strlen(want)) >= 7, "%s", err.msg);
    CHECK(zy_lines_json(&r, "an object", &err) == NULL && strstr(err.msg, ":4: invalid JSON at column ") &&
          strstr(err.msg, " (expected an object)"));
    CHECK(zy_lines_next(&r, &err) == 0);
    zy_lines_close(&r);
    zy_test_rmtree(dir);
}

/* Helpers shared by the unit tests: scratch directories. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test.h"
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

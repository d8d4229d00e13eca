/* Helpers shared by the unit tests: scratch directories. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test.h"

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

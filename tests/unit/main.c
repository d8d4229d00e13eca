/* Unit-test runner: runs every registered TEST (optionally only those whose name contains argv[1]). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu.h"
#include "kernels/matmul.h"
#include "kernels/quant.h"
#include "kernels/quant_many.h"
#include "test.h"

#define MAX_TESTS 1024

typedef struct {
    const char *name, *file;
    ZyTestFn fn;
} Entry;

static Entry tests[MAX_TESTS];
static int n_tests;

void zy_test_register(const char *name, const char *file, ZyTestFn fn) {
    if (n_tests >= MAX_TESTS) {
        fprintf(stderr, "too many tests\n");
        abort();
    }
    tests[n_tests++] = (Entry){name, file, fn};
}

int main(int argc, char **argv) {
    const char *filter = argc > 1 ? argv[1] : NULL;
    int passed = 0, failed = 0;
    ZyErr err; /* the process's kernel level, as in zaya: ZAYA_CPU or the best this CPU runs */
    if (zy_cpu_init(getenv("ZAYA_CPU"), &err) != 0 || zy_bf16_weights_set(getenv("ZAYA_BF16_WEIGHTS"), &err) != 0 ||
        zy_quant_way_set(getenv("ZAYA_QUANT_WAY"), &err) != 0 ||
        zy_quant_many_set(getenv("ZAYA_QUANT_MANY"), &err) != 0) {
        fprintf(stderr, "zaya_tests: %s\n", err.msg);
        return 1;
    }
    printf("kernel level %s; bf16 weights %s\n", zy_cpu_level_name(zy_cpu_level()),
           zy_bf16_weights_describe(zy_bf16_weights()));
    for (int i = 0; i < n_tests; i++) {
        if (filter && !strstr(tests[i].name, filter)) continue;
        int f = 0;
        tests[i].fn(&f);
        printf("%s %s (%s)\n", f ? "FAIL" : "ok  ", tests[i].name, tests[i].file);
        fflush(stdout);
        if (f)
            failed++;
        else
            passed++;
    }
    printf("unit: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}

/* zaya: the ZAYA1 training system — command-line entry. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} Command;

static const Command commands[] = {
    {"init", cmd_init, "create a model directory initialised from scratch"},
    {"forward", cmd_forward, "run the model on token ids: loss, logits, gradients"},
    {"convert", cmd_convert, "re-write a model directory (f32 or bf16)"},
    {"debug", cmd_debug, "developer checks used by the test suite (debug optim ...)"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: zaya <command> [options]   (zaya <command> --help for its options)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
}

/* Debian's OpenBLAS 0.3.21 takes AVX-512 AMD CPUs (Zen 4/5) for Haswell and runs sgemm at half speed; it picks
 * its kernels when the library loads, before main, so the fix is to set OPENBLAS_CORETYPE and re-exec once.
 * A user's explicit OPENBLAS_CORETYPE always wins. */
static void fix_openblas_coretype(char **argv) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (getenv("OPENBLAS_CORETYPE") || !__builtin_cpu_is("amd") || !__builtin_cpu_supports("avx512f")) return;
    if (setenv("OPENBLAS_CORETYPE", "SkylakeX", 1) != 0) return;
    execv("/proc/self/exe", argv); /* on failure, carry on with the slower kernels */
    unsetenv("OPENBLAS_CORETYPE");
#else
    (void)argv;
#endif
}

int main(int argc, char **argv) {
    fix_openblas_coretype(argv);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(argv[1], commands[i].name) == 0) return commands[i].run(argc, argv);
    fprintf(stderr, "zaya: unknown command \"%s\"\n\n", argv[1]);
    usage(stderr);
    return 2;
}

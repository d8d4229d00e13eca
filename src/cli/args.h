/* args: "--flag value" / "--switch" parsing for the subcommands, with errors for unknown or malformed flags. */
#ifndef ZAYA_CLI_ARGS_H
#define ZAYA_CLI_ARGS_H

#include <stdint.h>

#include "util/util.h"

typedef enum { ARG_STRING, ARG_INT, ARG_U64, ARG_FLOAT, ARG_SWITCH } ArgType;

typedef struct {
    const char *flag;     /* "--model" */
    ArgType type;
    int required;
    void *out;            /* const char **, int *, uint64_t *, double *, int * (switch) */
    const char *help;
    int seen;
} ArgSpec;

/* Parses argv[first..argc) against specs; positional arguments are collected into positional (cap n). */
int args_parse(int argc, char **argv, int first, ArgSpec *specs, int n_specs, const char **positional,
               int max_positional, int *n_positional, const char *command, ZyErr *err);
void args_usage(const char *command, const char *synopsis, const ArgSpec *specs, int n_specs);
/* Whether argv[first..argc) asks for help (--help or -h), the usage printed (args_usage) if so. */
int args_help(int argc, char **argv, int first, const char *command, const char *synopsis, const ArgSpec *specs,
              int n_specs);

#endif

#include "args.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int parse_value(ArgSpec *s, const char *v, const char *command, ZyErr *err) {
    char *end;
    errno = 0;
    switch (s->type) {
    case ARG_STRING:
        *(const char **)s->out = v;
        return 0;
    case ARG_INT: {
        long x = strtol(v, &end, 10);
        if (errno || *end || end == v || x < -2147483647L || x > 2147483647L)
            return zy_fail(err, "%s: %s expects an integer, got \"%s\"", command, s->flag, v);
        *(int *)s->out = (int)x;
        return 0;
    }
    case ARG_U64: {
        if (v[0] == '-') return zy_fail(err, "%s: %s expects a non-negative integer, got \"%s\"", command, s->flag, v);
        unsigned long long x = strtoull(v, &end, 10);
        if (errno || *end || end == v)
            return zy_fail(err, "%s: %s expects a non-negative integer, got \"%s\"", command, s->flag, v);
        *(uint64_t *)s->out = (uint64_t)x;
        return 0;
    }
    case ARG_FLOAT: {
        double x = strtod(v, &end);
        if (errno || *end || end == v || !isfinite(x))
            return zy_fail(err, "%s: %s expects a number, got \"%s\"", command, s->flag, v);
        *(double *)s->out = x;
        return 0;
    }
    case ARG_SWITCH:
        break;
    }
    return zy_fail(err, "%s: internal error parsing %s", command, s->flag);
}

int args_parse(int argc, char **argv, int first, ArgSpec *specs, int n_specs, const char **positional,
               int max_positional, int *n_positional, const char *command, ZyErr *err) {
    int npos = 0;
    for (int i = first; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) != 0 || strcmp(a, "--") == 0) {
            if (npos >= max_positional) return zy_fail(err, "%s: unexpected argument \"%s\"", command, a);
            positional[npos++] = a;
            continue;
        }
        const char *eq = strchr(a, '=');
        size_t name_len = eq ? (size_t)(eq - a) : strlen(a);
        ArgSpec *s = NULL;
        for (int k = 0; k < n_specs; k++)
            if (strlen(specs[k].flag) == name_len && strncmp(specs[k].flag, a, name_len) == 0) s = &specs[k];
        if (!s) return zy_fail(err, "%s: unknown option \"%.*s\" (see 'zaya %s --help')", command, (int)name_len, a, command);
        if (s->seen) return zy_fail(err, "%s: option %s given twice", command, s->flag);
        s->seen = 1;
        if (s->type == ARG_SWITCH) {
            if (eq) return zy_fail(err, "%s: option %s takes no value", command, s->flag);
            *(int *)s->out = 1;
            continue;
        }
        const char *v = eq ? eq + 1 : NULL;
        if (!v) {
            if (i + 1 >= argc) return zy_fail(err, "%s: option %s needs a value", command, s->flag);
            v = argv[++i];
        }
        if (parse_value(s, v, command, err)) return -1;
    }
    for (int k = 0; k < n_specs; k++)
        if (specs[k].required && !specs[k].seen) return zy_fail(err, "%s: missing required option %s", command, specs[k].flag);
    if (n_positional) *n_positional = npos;
    return 0;
}

void args_usage(const char *command, const char *synopsis, const ArgSpec *specs, int n_specs) {
    printf("usage: zaya %s %s\n", command, synopsis);
    for (int k = 0; k < n_specs; k++)
        printf("  %-22s %s%s\n", specs[k].flag, specs[k].help, specs[k].required ? " (required)" : "");
}

int args_help(int argc, char **argv, int first, const char *command, const char *synopsis, const ArgSpec *specs,
              int n_specs) {
    for (int i = first; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            args_usage(command, synopsis, specs, n_specs);
            return 1;
        }
    return 0;
}

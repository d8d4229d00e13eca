/* jinja: the Jinja subset that Hugging Face chat templates use, rendered byte-for-byte as transformers'
 * apply_chat_template renders them (jinja2's ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the
 * loopcontrols extension, transformers' {% generation %} tag, and its globals raise_exception, strftime_now,
 * namespace, dict, and its tojson filter, which is json.dumps(ensure_ascii=False)).
 *
 * Values follow Python: ints, floats (printed with Python's shortest repr), strings of code points, lists, tuples,
 * ordered dicts, None, and jinja2's default Undefined (prints as "", iterates as empty, fails on attribute access or
 * arithmetic). Lists and dicts are immutable, as in the sandbox (list.append and the like are "unsafe" there too).
 *
 * Templates are untrusted input: parsing and rendering are bounded in nesting depth, evaluation steps, memory and
 * output size (JinjaOpts), and every failure is a ZyErr naming the line:column of the construct, e.g.
 * "chat template line 3:12: unsupported filter 'wordwrap'". Nothing here keeps global state or exits.
 *
 * The engine: jinja_value.c (the arena, values, str() / repr(), JSON read and written), jinja_parse.c (the lexer
 * and the parser, jinja2's grammar, into the syntax tree), jinja_eval.c (the evaluator: scopes, attribute access,
 * operators, methods, globals, macros, statements), jinja_filters.c (the filters and tests). This header is what a
 * caller with a template and JSON variables needs; jinja_value.h adds the values, for a caller that builds the
 * variables itself (tokenizer/chat_template.c); jinja_internal.h is what the engine's files share. Only util/ below
 * it. */
#ifndef ZAYA_JINJA_H
#define ZAYA_JINJA_H

#include <stddef.h>
#include <stdint.h>

#include "util/util.h"

typedef struct JinjaTemplate JinjaTemplate;

typedef struct {
    size_t max_output;    /* bytes of rendered text (0: 64 MiB) */
    size_t max_memory;    /* bytes held by values while rendering (0: 1 GiB) */
    int64_t max_steps;    /* expressions and statements evaluated (0: 100 million) */
    int have_now;         /* strftime_now reports `now` (Unix seconds) in UTC; else the local time now */
    int64_t now;
} JinjaOpts;

/* Parses a template (UTF-8; "\r\n" and "\r" read as "\n", one trailing newline dropped, as jinja2 does). A
 * construct outside the subset is an error naming it and its line:column. */
int jinja_parse(const char *src, size_t len, JinjaTemplate **out, ZyErr *err);
void jinja_free(JinjaTemplate *t);

/* Renders with the members of vars_json (a JSON object) as the template's variables. *out is malloc'ed and
 * NUL-terminated; *out_len excludes the NUL. opts may be NULL (defaults). */
int jinja_render_json(const JinjaTemplate *t, const char *vars_json, size_t vars_len, const JinjaOpts *opts,
                      char **out, size_t *out_len, ZyErr *err);

#endif

/* json_grammar: the JSON documents a JSON Schema allows, recognised byte by byte (structured output).
 *
 * A schema (the subset structured output uses: object with properties and required, array with items, minItems and
 * maxItems, enum, const, string, number, integer, boolean, null, anyOf and type lists whose alternatives start with
 * different bytes, $ref into $defs / definitions, nesting) compiles into a graph of nodes; a JgState is a pushdown
 * automaton over it: a stack of frames, one per value being written. The documents it accepts are a subset of what
 * the schema validates, written compactly enough to be generated under a token budget:
 *   - an object's properties come in the schema's order, each at most once; optional ones may be left out; no others;
 *   - no whitespace before the document or after it; inside, JSON's whitespace between tokens, at most
 *     JG_MAX_SPACE bytes in a row;
 *   - strings: any UTF-8 (checked: no overlong forms, surrogates or bytes past U+10FFFF), JSON's escapes, \u escapes
 *     other than surrogates;
 *   - numbers at most JG_MAX_NUMBER bytes.
 * jg_min_close says how many bytes at least still complete the document from a state, which bounds a generation:
 * the token mask (json_mask.h) lets a token through only if the document can still be completed in the tokens
 * that are left. Untrusted schemas: bounded sizes, every keyword checked (the descriptive ones ignored). */
#ifndef ZAYA_JSON_GRAMMAR_H
#define ZAYA_JSON_GRAMMAR_H

#include <stdint.h>

#include <cjson/cJSON.h>

#include "util/util.h"

#define JG_MAX_DEPTH 32     /* values nested in one another (json_object's free-form values included) */
#define JG_MAX_PROPS 64     /* properties of one object */
#define JG_MAX_ENUM 64      /* values of one enum */
#define JG_MAX_NODES 4096   /* nodes of one schema */
#define JG_MAX_LITERAL 4096 /* bytes of one enum/const value or property name, as JSON */
#define JG_MAX_NUMBER 24    /* bytes of one number */
#define JG_MAX_SPACE 24     /* whitespace bytes in a row between tokens (pretty-printing fits; endless blanks do not) */

typedef struct JsonGrammar JsonGrammar;

typedef struct {
    uint16_t node;
    uint8_t phase;
    uint8_t aux;
    uint32_t count; /* position in a literal, next property, items so far, bytes of a number */
    uint64_t cand;  /* literals or property names still matching */
} JgFrame;

typedef struct {
    int depth; /* frames in use; 0: the document is complete */
    int space; /* whitespace bytes just before (between tokens) */
    JgFrame f[JG_MAX_DEPTH];
} JgState;

/* Compiles a JSON Schema. Errors name the keyword and where it is, e.g.
 * "'pattern' is not supported (at properties.name)". */
int json_grammar_compile(const cJSON *schema, JsonGrammar **out, ZyErr *err);
/* Any JSON object (response_format json_object). */
int json_grammar_any_object(JsonGrammar **out, ZyErr *err);
void json_grammar_free(JsonGrammar *g);

/* The state before the first byte. */
void jg_start(const JsonGrammar *g, JgState *s);
/* Consumes one byte: 0, or -1 when no document has the bytes so far followed by c (s is then undefined). */
int jg_step(const JsonGrammar *g, JgState *s, uint8_t c);
/* 0 when every byte of p[0..n) is accepted in turn. */
int jg_feed(const JsonGrammar *g, JgState *s, const char *p, size_t n);
/* The bytes so far are a whole document (possibly one that may still grow: a number at the top level). */
int jg_complete(const JsonGrammar *g, const JgState *s);
/* Inside a string's characters, where a plain character (not a quote, backslash or control byte) leaves s as it is. */
int jg_in_string_chars(const JsonGrammar *g, const JgState *s);
/* p[0..n) are characters a string holds as they are (no quote, backslash or control byte; whole UTF-8 characters). */
int jg_plain_string(const char *p, size_t n);
/* The fewest bytes that complete the document from s (0 when complete). */
long jg_min_close(const JsonGrammar *g, const JgState *s);
/* Copies the frames in use only. */
static inline void jg_copy(JgState *dst, const JgState *src) {
    dst->depth = src->depth;
    dst->space = src->space;
    memcpy(dst->f, src->f, sizeof(JgFrame) * (size_t)src->depth);
}

#endif

/* json_mask: which tokens may come next in a JSON document a grammar allows (json_grammar.h): the token mask of
 * constrained decoding (structured output).
 *
 * A JsonVocab holds every token's bytes, sorted, so one walk steps the automaton through the vocabulary as through a
 * trie: a token starts from the state of the longest prefix it shares with the token walked before it, and every
 * token that shares a rejected prefix is rejected without a step. Inside a string, the tokens that are plain string
 * characters (no quote, backslash or control byte; whole UTF-8 characters) leave the state as it is, so they are
 * allowed without a walk.
 *
 * The budget rule: a token is allowed only if, after it, the document can still be completed within the tokens that
 * are left, counting one token per byte of jg_min_close (so a tokenizer needs a token for each single byte the
 * closing may need, as byte-level and byte-fallback vocabularies have). With one token left, only tokens that complete
 * the document remain. The end tokens (eos, stop ids) are allowed only when the document is complete. */
#ifndef ZAYA_JSON_MASK_H
#define ZAYA_JSON_MASK_H

#include <stddef.h>
#include <stdint.h>

#include "infer/json_grammar.h"
#include "tokenizer/tokenizer.h"
#include "util/util.h"

#define JSON_MASK_MAX_TOKEN 128 /* bytes: a longer token is never allowed */

typedef struct JsonVocab JsonVocab;

/* Token i is bytes[i][0 .. lens[i]) (NULL or empty: never allowed), for ids 0 .. V-1. */
int json_vocab_create(const char *const *bytes, const size_t *lens, int V, JsonVocab **out, ZyErr *err);
/* The tokenizer's tokens as they decode one by one, for a model of V logits; special tokens, ids past the tokenizer
 * and holes are never allowed. */
int json_vocab_from_tokenizer(const Tokenizer *t, int V, JsonVocab **out, ZyErr *err);
void json_vocab_free(JsonVocab *v);

/* Scratch for one walk over v (a state per prefix length, the allowed ids); NULL when memory runs out. */
typedef struct JsonMaskScratch JsonMaskScratch;
JsonMaskScratch *json_mask_scratch(const JsonVocab *v);
void json_mask_scratch_free(JsonMaskScratch *x);

/* Sets logits[id] = -INFINITY for every id in [0, n_logits) that may not come next from state s, tokens_left counting
 * this token and those after it that the budget allows. Returns how many remain allowed (0: none, not even an end
 * token: the document cannot be completed within the budget). */
int json_mask_apply(const JsonVocab *v, const JsonGrammar *g, const JgState *s, long tokens_left,
                    const int32_t *end_ids, int n_end, JsonMaskScratch *x, float *logits, int n_logits);
/* Advances s by token id's bytes: 0, or -1 when they are not allowed there. */
int json_mask_advance(const JsonVocab *v, const JsonGrammar *g, JgState *s, int32_t id);

#endif

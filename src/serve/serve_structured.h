/* serve_structured: response_format (structured output) for zaya serve. A request's json_object or json_schema
 * compiles into a grammar (infer/json_grammar.h) shared by its choices; each choice follows it with its own automaton
 * state and masks its logits before sampling (infer/json_mask.h) through the engine's ServeMaskOps, so every answer
 * is a document that parses and validates. The vocabulary's sorted token bytes are built once per server, at the
 * first structured request. */
#ifndef ZAYA_SERVE_STRUCTURED_H
#define ZAYA_SERVE_STRUCTURED_H

#include "serve/serve_engine.h"
#include "serve/serve_request.h"
#include "tokenizer/tokenizer.h"

typedef struct ServeStructured ServeStructured;   /* per server */
typedef struct ServeConstraint ServeConstraint; /* one request's grammar, shared by its choices */

/* The tokenizer must outlive it; V: the model's logits per row. NULL when memory runs out. */
ServeStructured *serve_structured_new(const Tokenizer *tok, int V);
void serve_structured_free(ServeStructured *s);

/* The request's response_format as a constraint; *out NULL for plain text. Errors: 400 naming response_format and,
 * for a schema, the keyword and where it is; 400 when max_tokens cannot hold the shortest document the schema allows
 * (each byte may take a token). */
int serve_constraint_new(ServeStructured *s, const ServeRequest *r, int max_tokens, ServeConstraint **out,
                         ServeError *e);
/* The creator's reference (each choice holds one of its own until it ends). */
void serve_constraint_release(ServeConstraint *c);

/* The engine's hooks: ServeJobSpec.mask = &serve_constraint_ops, .mask_arg = the constraint. */
extern const ServeMaskOps serve_constraint_ops;

#endif

/* response_format → a grammar and the engine's token mask (see serve_structured.h). */
#include "serve/serve_structured.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdlib.h>

#include "infer/json_grammar.h"
#include "infer/json_mask.h"

struct ServeStructured {
    const Tokenizer *tok;
    int V;
    pthread_mutex_t mu;
    JsonVocab *vocab; /* built at the first structured request, then read-only */
};

struct ServeConstraint {
    JsonGrammar *g;
    const JsonVocab *vocab;
    int refs;
};

typedef struct { /* one choice */
    ServeConstraint *c;
    JgState s;
    JsonMaskScratch *scratch;
} Follower;

ServeStructured *serve_structured_new(const Tokenizer *tok, int V) {
    ServeStructured *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->tok = tok;
    s->V = V;
    pthread_mutex_init(&s->mu, NULL);
    return s;
}

void serve_structured_free(ServeStructured *s) {
    if (!s) return;
    json_vocab_free(s->vocab);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

void serve_constraint_release(ServeConstraint *c) {
    if (c && __atomic_sub_fetch(&c->refs, 1, __ATOMIC_ACQ_REL) == 0) {
        json_grammar_free(c->g);
        free(c);
    }
}

int serve_constraint_new(ServeStructured *s, const ServeRequest *r, int max_tokens, ServeConstraint **out,
                         ServeError *e) {
    *out = NULL;
    if (r->response_format == SERVE_FORMAT_TEXT) return 0;
    ZyErr err = {{0}};
    JsonGrammar *g = NULL;
    if (r->response_format == SERVE_FORMAT_JSON_OBJECT) {
        if (json_grammar_any_object(&g, &err))
            return serve_error(e, 500, "server_error", "", "response_format: %s", err.msg);
    } else {
        cJSON *schema = cJSON_Parse(r->json_schema);
        int rc = schema ? json_grammar_compile(schema, &g, &err) : zy_fail(&err, "out of memory");
        cJSON_Delete(schema);
        if (rc) return serve_error(e, 400, "invalid_request_error", "response_format",
                                   "response_format.json_schema.schema: %s", err.msg);
    }
    JgState st;
    jg_start(g, &st);
    const long need = jg_min_close(g, &st);
    if (need > max_tokens) {
        json_grammar_free(g);
        return serve_error(e, 400, "invalid_request_error", "max_tokens",
                           "'max_tokens' is %d; the shortest document response_format allows is %ld bytes, and each "
                           "may take a token", max_tokens, need);
    }
    pthread_mutex_lock(&s->mu);
    if (!s->vocab && json_vocab_from_tokenizer(s->tok, s->V, &s->vocab, &err)) s->vocab = NULL;
    const JsonVocab *vocab = s->vocab;
    pthread_mutex_unlock(&s->mu);
    ServeConstraint *c = vocab ? calloc(1, sizeof *c) : NULL;
    if (!c) {
        json_grammar_free(g);
        return serve_error(e, 500, "server_error", "", "response_format: %s", vocab ? "out of memory" : err.msg);
    }
    c->g = g;
    c->vocab = vocab;
    c->refs = 1;
    *out = c;
    return 0;
}

static void *follower_open(void *arg) {
    ServeConstraint *c = arg;
    Follower *f = calloc(1, sizeof *f);
    if (f) f->scratch = json_mask_scratch(c->vocab);
    if (!f || !f->scratch) {
        free(f);
        return NULL;
    }
    __atomic_add_fetch(&c->refs, 1, __ATOMIC_ACQ_REL);
    f->c = c;
    jg_start(c->g, &f->s);
    return f;
}

static int follower_mask(void *state, float *logits, int V, long tokens_left, const int32_t *end_ids, int n_end) {
    Follower *f = state;
    return json_mask_apply(f->c->vocab, f->c->g, &f->s, tokens_left, end_ids, n_end, f->scratch, logits, V);
}

static int follower_accept(void *state, int32_t token) {
    Follower *f = state;
    if (json_mask_advance(f->c->vocab, f->c->g, &f->s, token)) return 1; /* cannot happen: the mask allowed it */
    return f->s.depth == 0;
}

static void follower_close(void *state) {
    Follower *f = state;
    serve_constraint_release(f->c);
    json_mask_scratch_free(f->scratch);
    free(f);
}

const ServeMaskOps serve_constraint_ops = {follower_open, follower_mask, follower_accept, follower_close};

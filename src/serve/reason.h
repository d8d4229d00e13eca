/* reason: Markovian RSA (recursive self-aggregation), ZAYA1's test-time method, over the serving engine. A
 * population of N traces: round 1 generates N traces from the problem (one submit with n = N, so the choices share
 * the prompt's KV blocks); each later round generates N new traces, trace i from an aggregation prompt holding K
 * traces sampled without replacement from the last round (seeded), each cut to its last τ tokens. A round's N
 * generations go to the engine together, so they decode as one batch; the aggregation prompt puts the problem first,
 * so the round's prompts share that prefix (what a prefix cache reuses). The answer is the majority vote over the
 * last round's extracted answers (rsa_extract_answer), else the last round's first trace.
 *
 * The aggregation prompt is a Jinja template (src/jinja, rendered as chat templates are) over the variables
 * problem (string), candidates (list of strings: the K tails), round (2 ..) and population; RSA_DEFAULT_TEMPLATE is
 * the default, and configs/rsa_aggregate.jinja its copy on disk (a unit test keeps them equal). The rendered text is
 * the user's turn: the caller's encoder turns it into prompt tokens (a chat's last user message, or raw text). */
#ifndef ZAYA_SERVE_REASON_H
#define ZAYA_SERVE_REASON_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "jinja/jinja.h"
#include "serve/serve_engine.h"
#include "serve/serve_request.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "util/util.h"

extern const char RSA_DEFAULT_TEMPLATE[];

/* N, K, T, τ against their bounds (serve_request.h's SERVE_RSA_*) and the engine's batch: 400 naming the field,
 * prefixed (e.g. "rsa." for the request extension, "--" for the command line). */
int rsa_shape_check(const ServeRsa *s, int max_batch, const char *prefix, ServeError *e);

/* The pieces (tested one by one). */
/* Where the last `tail` of n tokens start. */
int rsa_tail_start(int n, int tail);
/* k distinct indices of [0, n) in out, drawn without replacement (a partial Fisher-Yates shuffle). */
void rsa_sample_subset(ZyRng *rng, int n, int k, int *out);
/* A trace's answer (malloc'ed, or NULL when there is none): the content of its last \boxed{...} (braces balanced),
 * else the rest of its last line starting "Answer:" (any case, after spaces; markdown ** around it allowed);
 * trimmed of spaces and a trailing period. */
char *rsa_extract_answer(const char *text);
/* The index of the trace whose answer wins the vote (most traces with an equal answer; a tie goes to the answer
 * that appears first), and its votes in *votes; -1 when no trace has an answer. */
int rsa_vote(char *const *answers, int n, int *votes);

/* The problem's text in a chat request's JSON ({"messages": [...], ...}): its last user message's content (a
 * string). And the same JSON with that content replaced (malloc'ed). -1 with a 400 on "messages" otherwise. */
int rsa_chat_problem(const char *chat_json, char **problem, ServeError *e);
int rsa_chat_with_user_text(const char *chat_json, const char *text, char **out, ServeError *e);

/* Turns a round's user text into prompt tokens (malloc'ed into *ids). */
typedef struct {
    void *ctx;
    int (*encode)(void *ctx, const char *text, size_t len, int32_t **ids, int *n, ServeError *e);
    int (*cancelled)(void *cancel_ctx); /* NULL, or 1 once the answer is no longer wanted (a client gone) */
    void *cancel_ctx;
} RsaPrompter;

/* The encoder both surfaces use (RsaPrompter.encode = rsa_encode, ctx = an RsaEncoder): with chat_json, the
 * messages with the last user message's content replaced by the text, through the chat template
 * (add_generation_prompt) and encoded without special tokens (the template writes its own bos), as
 * /v1/chat/completions; else the raw text with bos first (bos_id >= 0), as /v1/completions and zaya generate. */
typedef struct {
    const Tokenizer *tok;
    const ChatRenderer *chat;
    const char *chat_json;
    int32_t bos_id;
} RsaEncoder;
int rsa_encode(void *rsa_encoder, const char *text, size_t len, int32_t **ids, int *n, ServeError *e);

typedef struct {
    ServeRsa shape;
    const JinjaTemplate *aggregate; /* the aggregation template (parsed) */
    const Tokenizer *tok;
    int max_tokens;                 /* per trace, capped by what the context leaves after its prompt */
    int max_context;
    /* what every trace's job shares: sampling, penalties, stop ids (the model's eos ...) and strings, skip_special;
     * rsa_run sets the prompt, n, seed, max_tokens, logprobs and wake */
    ServeJobSpec base;
    uint64_t seed;                  /* trace i of round r samples with seed + r * N + i; subsets from seed too */
    int keep_prompts;               /* keep each trace's aggregation text (reports with traces) */
    const char *field_prefix;       /* how errors name the shape's fields: "rsa." (a request), "--" (flags) */
} RsaOpts;

typedef struct {
    char *text;       /* the generated text */
    int32_t *ids;     /* its tokens (without a final eos) */
    int n_ids;
    char *answer;     /* rsa_extract_answer's, or NULL */
    int *sources;     /* round > 1: the K traces of the last round it aggregates */
    char *prompt;     /* round > 1 with keep_prompts: the aggregation text */
    int prompt_tokens;
    const char *finish;
} RsaTrace;

typedef struct {
    RsaTrace *traces;       /* N */
    long tokens_generated, prompt_tokens;
    long prefix_cache_hits; /* -1: the engine has no prefix cache counter */
    double seconds;
} RsaRound;

typedef struct {
    ServeRsa shape;
    RsaRound *rounds;  /* shape.rounds of them */
    int chosen;        /* the answer's trace in the last round */
    int votes;         /* traces that gave its answer (0: none had an answer, the first trace is chosen) */
} RsaResult;

/* Prompt tokens the prefix cache has served so far (the engine's zaya_prefix_cache_hit_tokens_total; 0 with the
 * cache off), -1 if the engine exports no such counter. */
long rsa_prefix_cache_hits(ServeEngine *e);

/* Runs the rounds on the engine (blocking; any thread). Errors are ServeErrors (400 for a prompt the context cannot
 * hold, the engine's 503, 499 when cancelled). */
int rsa_run(ServeEngine *e, const RsaOpts *o, const RsaPrompter *p, const char *problem, RsaResult *out,
            ServeError *err);
void rsa_result_free(RsaResult *r);
/* The chosen trace. */
const RsaTrace *rsa_chosen(const RsaResult *r);
/* The report: shape, answer, votes, and per round tokens generated, prompt tokens, prefix-cache hits (null: n/a),
 * seconds, tokens/s; with_traces adds every trace (text, answer, sources, tail token ids, aggregation prompt). */
cJSON *rsa_report_json(const RsaResult *r, int with_traces);

#endif

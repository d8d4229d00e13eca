/* Evaluation: held-out loss over token windows, multiple-choice log-likelihood and exact-match generation. */
#include "infer/eval.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "infer/decode.h"
#include "infer/sampling.h"
#include "util/lines.h"

/* ---- task files ----------------------------------------------------------------------------------------------- */

typedef struct {
    int line;
    char *context;         /* mc: context; exact: prompt */
    char **choices;        /* mc */
    int n_choices;
    int answer;            /* mc */
    char *answer_text;     /* exact */
    /* tokenized */
    int32_t *prefix;       /* [bos] + context tokens (cut from the left to fit) */
    int n_prefix;
    int32_t **cont;        /* mc: each choice's continuation tokens */
    int *n_cont;
} Example;

typedef struct {
    const char *path;
    EvalTaskType type;
    Example *ex;
    int n;
} TaskFile;

static char *dup_string(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

static void free_task(TaskFile *t) {
    for (int i = 0; i < t->n; i++) {
        Example *e = &t->ex[i];
        free(e->context);
        for (int c = 0; c < e->n_choices; c++) {
            free(e->choices[c]);
            if (e->cont) free(e->cont[c]);
        }
        free(e->choices);
        free(e->cont);
        free(e->n_cont);
        free(e->answer_text);
        free(e->prefix);
    }
    free(t->ex);
    memset(t, 0, sizeof *t);
}

static const char *str_item(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* One JSON line into e (type already known). */
static int parse_example(const cJSON *o, EvalTaskType type, const char *path, int line, Example *e, ZyErr *err) {
    e->line = line;
    if (type == EVAL_TASK_EXACT) {
        const char *prompt = str_item(o, "prompt"), *answer = str_item(o, "answer");
        if (!prompt || !answer)
            return zy_fail(err, "%s:%d: an exact-match line needs \"prompt\" and \"answer\" strings", path, line);
        e->context = dup_string(prompt);
        e->answer_text = dup_string(answer);
        return e->context && e->answer_text ? 0 : zy_fail(err, "out of memory");
    }
    const char *context = str_item(o, "context");
    const cJSON *choices = cJSON_GetObjectItemCaseSensitive(o, "choices");
    const cJSON *answer = cJSON_GetObjectItemCaseSensitive(o, "answer");
    if (!context) return zy_fail(err, "%s:%d: a multiple-choice line needs a \"context\" string", path, line);
    if (!cJSON_IsArray(choices) || cJSON_GetArraySize(choices) < 1)
        return zy_fail(err, "%s:%d: \"choices\" must be a non-empty array of strings", path, line);
    const int n = cJSON_GetArraySize(choices);
    if (!cJSON_IsNumber(answer) || answer->valuedouble != floor(answer->valuedouble) || answer->valuedouble < 0 ||
        answer->valuedouble >= n)
        return zy_fail(err, "%s:%d: \"answer\" must be an integer index into the %d choices", path, line, n);
    e->context = dup_string(context);
    e->choices = calloc((size_t)n, sizeof *e->choices);
    if (!e->context || !e->choices) return zy_fail(err, "out of memory");
    e->n_choices = n;
    e->answer = (int)answer->valuedouble;
    for (int c = 0; c < n; c++) {
        const cJSON *ch = cJSON_GetArrayItem(choices, c);
        if (!cJSON_IsString(ch)) return zy_fail(err, "%s:%d: choice %d is not a string", path, line, c);
        if (!(e->choices[c] = dup_string(ch->valuestring))) return zy_fail(err, "out of memory");
    }
    return 0;
}

/* Reads and validates every line; the first non-blank line's keys decide the task type. */
static int load_task(const char *path, TaskFile *t, ZyErr *err) {
    memset(t, 0, sizeof *t);
    ZyLines r;
    if (zy_lines_open(&r, path, ZY_LINES_SKIP_BLANK, err)) return -1;
    t->path = r.path;
    int cap = 0, rc = 0, got = 0, typed = 0;
    while (rc == 0 && (got = zy_lines_next(&r, err)) > 0) {
        const int line = (int)r.lineno;
        cJSON *o = zy_lines_json(&r, "a JSON object", err);
        if (!o) {
            rc = -1;
            break;
        }
        if (!cJSON_IsObject(o)) {
            cJSON_Delete(o);
            rc = zy_lines_fail(&r, err, "not a JSON object");
            break;
        }
        if (!typed) {
            if (cJSON_HasObjectItem(o, "choices") || cJSON_HasObjectItem(o, "context")) {
                t->type = EVAL_TASK_MC;
            } else if (cJSON_HasObjectItem(o, "prompt")) {
                t->type = EVAL_TASK_EXACT;
            } else {
                cJSON_Delete(o);
                rc = zy_lines_fail(&r, err, "unknown task line: want {\"context\", \"choices\", \"answer\"} (multiple "
                                            "choice) or {\"prompt\", \"answer\"} (exact match)");
                break;
            }
            typed = 1;
        }
        if (t->n == cap) {
            cap = cap ? 2 * cap : 64;
            Example *grown = realloc(t->ex, (size_t)cap * sizeof *grown);
            if (!grown) {
                cJSON_Delete(o);
                rc = zy_fail(err, "out of memory");
                break;
            }
            t->ex = grown;
        }
        Example *e = &t->ex[t->n++];
        memset(e, 0, sizeof *e);
        rc = parse_example(o, t->type, t->path, line, e, err);
        cJSON_Delete(o);
    }
    zy_lines_close(&r);
    if (rc == 0 && got < 0) rc = -1;
    if (rc == 0 && t->n == 0) rc = zy_fail(err, "%s: no examples", t->path);
    if (rc) free_task(t);
    return rc;
}

/* ---- tokenization ---------------------------------------------------------------------------------------------- */

static int tok_encode(void *ctx, const char *text, size_t len, int32_t **ids, size_t *n, ZyErr *err) {
    return tokenizer_encode(ctx, text, len, ids, n, err);
}

static int tok_decode(void *ctx, const int32_t *ids, size_t n, char **bytes, size_t *len, ZyErr *err) {
    return tokenizer_decode(ctx, ids, n, bytes, len, err);
}

void eval_tokenizer_from(EvalTokenizer *et, const Tokenizer *t, const ZayaConfig *cfg) {
    et->ctx = (void *)t; /* handed back to tokenizer_encode/decode, which take it as const */
    et->encode = tok_encode;
    et->decode = tok_decode;
    ZyErr ignored; /* a token the tokenizer does not name falls back to the model config's id */
    if (tokenizer_special_id(t, TOK_SPECIAL_BOS, &et->bos_id, &ignored)) et->bos_id = -1;
    if (tokenizer_special_id(t, TOK_SPECIAL_EOS, &et->eos_id, &ignored)) et->eos_id = -1;
    et->vocab_size = tokenizer_vocab_size(t);
    if (et->bos_id < 0) et->bos_id = cfg->bos_token_id >= 0 && cfg->bos_token_id < cfg->vocab_size ? cfg->bos_token_id : -1;
    if (et->eos_id < 0) et->eos_id = cfg->eos_token_id >= 0 && cfg->eos_token_id < cfg->vocab_size ? cfg->eos_token_id : -1;
}

static int encode(const EvalTokenizer *tok, const char *text, size_t len, int32_t **ids, int *n, ZyErr *err) {
    size_t nn = 0;
    if (tok->encode(tok->ctx, text, len, ids, &nn, err)) return -1;
    if (nn > (size_t)1 << 30) {
        free(*ids);
        return zy_fail(err, "text of %zu tokens", nn);
    }
    *n = (int)nn;
    return 0;
}

/* prefix = [bos] + ids, keeping only the last `keep` context tokens. */
static int make_prefix(const EvalTokenizer *tok, const int32_t *ids, int n, int keep, Example *e, ZyErr *err) {
    const int has_bos = tok->bos_id >= 0, skip = n > keep ? n - keep : 0;
    e->n_prefix = has_bos + n - skip;
    e->prefix = malloc(sizeof(int32_t) * (size_t)(e->n_prefix > 0 ? e->n_prefix : 1));
    if (!e->prefix) return zy_fail(err, "out of memory");
    if (has_bos) e->prefix[0] = tok->bos_id;
    memcpy(e->prefix + has_bos, ids + skip, sizeof(int32_t) * (size_t)(n - skip));
    return 0;
}

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

/* Multiple choice, as lm-evaluation-harness: the context's trailing whitespace moves to the front of each choice;
 * the continuation is tokens(context + choice) after the first len(tokens(context)) tokens. */
static int tokenize_mc(const EvalTokenizer *tok, const Model *m, TaskFile *t, int n_use, int *max_len, int *max_cont,
                       ZyErr *err) {
    const int max_pos = m->cfg.max_position_embeddings;
    for (int i = 0; i < n_use; i++) {
        Example *e = &t->ex[i];
        size_t clen = strlen(e->context);
        while (clen > 0 && is_space(e->context[clen - 1])) clen--;
        int32_t *ctx_ids = NULL;
        int n_ctx = 0;
        if (encode(tok, e->context, clen, &ctx_ids, &n_ctx, err)) return zy_wrap(err, "%s:%d", t->path, e->line);
        e->cont = calloc((size_t)e->n_choices, sizeof *e->cont);
        e->n_cont = calloc((size_t)e->n_choices, sizeof *e->n_cont);
        if (!e->cont || !e->n_cont) {
            free(ctx_ids);
            return zy_fail(err, "out of memory");
        }
        int longest = 0, rc = 0;
        for (int c = 0; c < e->n_choices && rc == 0; c++) {
            const size_t full = strlen(e->context), chl = strlen(e->choices[c]);
            char *whole = malloc(full + chl + 1);
            if (!whole) {
                rc = zy_fail(err, "out of memory");
                break;
            }
            memcpy(whole, e->context, full);
            memcpy(whole + full, e->choices[c], chl + 1);
            int32_t *w = NULL;
            int nw = 0;
            rc = encode(tok, whole, full + chl, &w, &nw, err);
            free(whole);
            if (rc) {
                zy_wrap(err, "%s:%d", t->path, e->line);
                break;
            }
            if (nw <= n_ctx) {
                free(w);
                rc = zy_fail(err, "%s:%d: choice %d adds no tokens to the context", t->path, e->line, c);
                break;
            }
            e->n_cont[c] = nw - n_ctx;
            e->cont[c] = malloc(sizeof(int32_t) * (size_t)e->n_cont[c]);
            if (!e->cont[c]) {
                free(w);
                rc = zy_fail(err, "out of memory");
                break;
            }
            memcpy(e->cont[c], w + n_ctx, sizeof(int32_t) * (size_t)e->n_cont[c]);
            free(w);
            if (e->n_cont[c] > longest) longest = e->n_cont[c];
        }
        /* the last continuation token is never fed: the sequence needs prefix + longest - 1 positions; the context
         * keeps what fits */
        const int room = max_pos - (tok->bos_id >= 0) - (longest - 1);
        if (rc == 0 && room < 0)
            rc = zy_fail(err, "%s:%d: a choice of %d tokens does not fit max_position_embeddings %d", t->path, e->line,
                         longest, max_pos);
        if (rc == 0) rc = make_prefix(tok, ctx_ids, n_ctx, room, e, err);
        free(ctx_ids);
        if (rc) return -1;
        if (e->n_prefix == 0)
            return zy_fail(err, "%s:%d: empty context and no bos token: nothing predicts the first choice token",
                           t->path, e->line);
        for (int k = 0; k < e->n_prefix; k++)
            if (e->prefix[k] < 0 || e->prefix[k] >= m->cfg.vocab_size)
                return zy_fail(err, "%s:%d: token id %d outside the model's vocabulary", t->path, e->line, e->prefix[k]);
        for (int c = 0; c < e->n_choices; c++)
            for (int k = 0; k < e->n_cont[c]; k++)
                if (e->cont[c][k] < 0 || e->cont[c][k] >= m->cfg.vocab_size)
                    return zy_fail(err, "%s:%d: token id %d outside the model's vocabulary", t->path, e->line,
                                   e->cont[c][k]);
        if (e->n_prefix + longest - 1 > *max_len) *max_len = e->n_prefix + longest - 1;
        if (longest > *max_cont) *max_cont = longest;
    }
    return 0;
}

/* log p(target) under softmax(logits), in double. */
static double log_prob(const float *logits, int V, int32_t target) {
    double mx = logits[0], sum = 0;
    for (int v = 1; v < V; v++) mx = logits[v] > mx ? logits[v] : mx;
    for (int v = 0; v < V; v++) sum += exp(logits[v] - mx);
    return logits[target] - mx - log(sum);
}

#define MC_PIECE 16 /* continuation tokens scored per decode call (bounds the logits buffer to 16 x V) */

static int score_mc(const EvalRunner *run, const Model *m, TaskFile *t, int n_use, int max_len, EvalResult *out,
                    ZyErr *err) {
    const int V = m->cfg.vocab_size;
    DecodeBackend be;
    if (run->open_cache(run->ctx, max_len, &be, err)) return -1;
    float *ctx_logits = malloc(sizeof(float) * V), *lg = malloc(sizeof(float) * (size_t)MC_PIECE * V);
    double *ll = NULL, n_acc = 0, n_norm = 0, gold_ll = 0, gold_tokens = 0;
    int max_choices = 1, rc = -1;
    for (int i = 0; i < n_use; i++) max_choices = t->ex[i].n_choices > max_choices ? t->ex[i].n_choices : max_choices;
    ll = malloc(sizeof(double) * max_choices);
    if (!ctx_logits || !lg || !ll) {
        zy_fail(err, "out of memory");
        goto done;
    }
    for (int i = 0; i < n_use; i++) {
        Example *e = &t->ex[i];
        be.reset(be.ctx);
        if (be.decode(be.ctx, e->prefix, e->n_prefix, ctx_logits, err)) goto fail_line;
        if (be.mark) be.mark(be.ctx);
        int best = 0, best_norm = 0;
        double best_norm_v = 0;
        for (int ch = 0; ch < e->n_choices; ch++) {
            const int32_t *cont = e->cont[ch];
            const int k = e->n_cont[ch];
            if (be.rewind) {
                be.rewind(be.ctx);
            } else if (ch > 0) { /* no rewind on this cache: the context again (its logits are already known) */
                be.reset(be.ctx);
                if (be.decode(be.ctx, e->prefix, e->n_prefix, lg, err)) goto fail_line;
            }
            double s = log_prob(ctx_logits, V, cont[0]);
            for (int j = 0; j < k - 1; j += MC_PIECE) { /* feed cont[j..] to score cont[j+1..] */
                const int n = k - 1 - j < MC_PIECE ? k - 1 - j : MC_PIECE;
                if (be.decode_all(be.ctx, cont + j, n, lg, err)) goto fail_line;
                for (int r = 0; r < n; r++) s += log_prob(lg + (long)r * V, V, cont[j + r + 1]);
            }
            ll[ch] = s;
            const size_t bytes = strlen(e->choices[ch]);
            const double norm = s / (double)(bytes > 0 ? bytes : 1);
            if (s > ll[best]) best = ch; /* first maximum, like numpy's argmax */
            if (ch == 0 || norm > best_norm_v) {
                best_norm = ch;
                best_norm_v = norm;
            }
        }
        n_acc += best == e->answer;
        n_norm += best_norm == e->answer;
        gold_ll += ll[e->answer];
        gold_tokens += e->n_cont[e->answer];
    }
    out->n = n_use;
    out->acc = n_acc / n_use;
    out->acc_norm = n_norm / n_use;
    out->exact_match = NAN;
    out->ppl = exp(-gold_ll / gold_tokens);
    rc = 0;
    goto done;
fail_line:
    zy_wrap(err, "%s", t->path);
done:
    free(ctx_logits);
    free(lg);
    free(ll);
    run->close_cache(run->ctx);
    return rc;
}

/* ---- exact match ---------------------------------------------------------------------------------------------- */

typedef struct {
    const EvalTokenizer *tok;
    int32_t ids[EVAL_MAX_ANSWER_TOKENS];
    int n;
} AnswerBuf;

/* Collects the answer and stops once its text holds a newline. */
static int on_answer_token(void *ctx, int32_t token, ZyErr *err) {
    AnswerBuf *a = ctx;
    if (token == a->tok->eos_id) return 0; /* generate() stops on it; not part of the text */
    a->ids[a->n++] = token;
    char *text = NULL;
    size_t len = 0;
    if (a->tok->decode(a->tok->ctx, a->ids, (size_t)a->n, &text, &len, err)) return -1;
    int stop = memchr(text, '\n', len) != NULL;
    free(text);
    return stop;
}

/* Trims ASCII whitespace in place: returns the start, writes the length. */
static const char *strip(const char *s, size_t len, size_t *out_len) {
    while (len > 0 && is_space(*s)) s++, len--;
    while (len > 0 && is_space(s[len - 1])) len--;
    *out_len = len;
    return s;
}

static int score_exact(const EvalRunner *run, const Model *m, const EvalTokenizer *tok, TaskFile *t, int n_use,
                       EvalResult *out, ZyErr *err) {
    const int max_pos = m->cfg.max_position_embeddings, A = EVAL_MAX_ANSWER_TOKENS;
    int max_len = 1;
    for (int i = 0; i < n_use; i++) {
        Example *e = &t->ex[i];
        int32_t *ids = NULL;
        int n = 0;
        if (encode(tok, e->context, strlen(e->context), &ids, &n, err)) return zy_wrap(err, "%s:%d", t->path, e->line);
        int room = max_pos - (tok->bos_id >= 0) - (A - 1);
        int rc = make_prefix(tok, ids, n, room > 0 ? room : 0, e, err);
        free(ids);
        if (rc) return -1;
        if (e->n_prefix == 0) return zy_fail(err, "%s:%d: empty prompt and no bos token", t->path, e->line);
        if (model_check_tokens(m, e->prefix, 1, e->n_prefix, err)) return zy_wrap(err, "%s:%d", t->path, e->line);
        if (e->n_prefix + A - 1 > max_len) max_len = e->n_prefix + A - 1;
    }
    if (max_len > max_pos) max_len = max_pos;
    DecodeBackend be;
    Sampler s;
    if (run->open_cache(run->ctx, max_len, &be, err)) return -1;
    if (sampler_create(&s, m->cfg.vocab_size, err)) {
        run->close_cache(run->ctx);
        return -1;
    }
    if (tok->vocab_size > 0 && tok->vocab_size < s.V) s.n_allowed = tok->vocab_size;
    SamplingParams greedy = {0, 0, 1, 0};
    ZyRng rng;
    zy_rng_seed(&rng, 0);
    int rc = 0, hits = 0;
    for (int i = 0; i < n_use && rc == 0; i++) {
        Example *e = &t->ex[i];
        AnswerBuf ans = {.tok = tok};
        GenerateStats st;
        const int32_t eos = tok->eos_id;
        if (generate_with(&be, &s, &greedy, &rng, e->prefix, e->n_prefix, A, &eos, eos >= 0, on_answer_token, &ans, &st,
                          err)) {
            rc = zy_wrap(err, "%s:%d", t->path, e->line);
            break;
        }
        char *text = NULL;
        size_t len = 0;
        if (tok->decode(tok->ctx, ans.ids, (size_t)ans.n, &text, &len, err)) {
            rc = zy_wrap(err, "%s:%d", t->path, e->line);
            break;
        }
        const char *nl = memchr(text, '\n', len);
        if (nl) len = (size_t)(nl - text);
        size_t gl, rl;
        const char *g = strip(text, len, &gl), *r = strip(e->answer_text, strlen(e->answer_text), &rl);
        hits += gl == rl && memcmp(g, r, gl) == 0;
        free(text);
    }
    sampler_free(&s);
    run->close_cache(run->ctx);
    if (rc) return -1;
    out->n = n_use;
    out->acc = out->acc_norm = out->ppl = NAN;
    out->exact_match = (double)hits / n_use;
    return 0;
}

/* ---- the CPU runner -------------------------------------------------------------------------------------------- */

typedef struct {
    const Model *m;
    Model *mw; /* the same model where windows run (eval_token_loss), else NULL */
    KVCache c;
    int have_cache;
    CpuDecode d;
    Activations a;
    int have_a, a_T;
} CpuRunner;

static int cpu_open_cache(void *x, int max_len, DecodeBackend *be, ZyErr *err) {
    CpuRunner *r = x;
    if (kvcache_create(&r->c, &r->m->cfg, 1, max_len, err)) return -1;
    r->have_cache = 1;
    *be = decode_backend_cpu(&r->d, r->m, &r->c);
    return 0;
}
static void cpu_close_cache(void *x) {
    CpuRunner *r = x;
    if (r->have_cache) kvcache_free(&r->c);
    r->have_cache = 0;
}
static int cpu_window(void *x, const int32_t *tokens, const int32_t *targets, int T, double *mean_loss, ZyErr *err) {
    CpuRunner *r = x;
    if (!r->have_a || r->a_T != T) { /* the windows' length; only the last may be shorter */
        if (r->have_a) acts_free(&r->a);
        r->have_a = 0;
        if (acts_create(&r->a, &r->m->cfg, 1, T, err)) return -1;
        r->have_a = 1, r->a_T = T;
    }
    model_forward(r->mw, &r->a, tokens);
    *mean_loss = model_loss(r->mw, &r->a, targets);
    return 0;
}
static int cpu_window_routing(void *x, int layer, const int32_t **choice, const float **gate, const float **probs,
                              ZyErr *err) {
    CpuRunner *r = x;
    *choice = r->a.layers[layer].choice, *gate = r->a.layers[layer].gate, *probs = r->a.layers[layer].router_probs;
    return 0;
}
static EvalRunner cpu_runner(CpuRunner *r, const Model *m, Model *mw) {
    memset(r, 0, sizeof *r);
    r->m = m, r->mw = mw;
    return (EvalRunner){.ctx = r, .open_cache = cpu_open_cache, .close_cache = cpu_close_cache,
                        .window = mw ? cpu_window : NULL, .window_routing = mw ? cpu_window_routing : NULL};
}
static void cpu_runner_free(CpuRunner *r) {
    cpu_close_cache(r);
    if (r->have_a) acts_free(&r->a);
    r->have_a = 0;
}

int eval_task_file_with(const Model *m, const EvalTokenizer *tok, const char *path, int limit, EvalResult *out,
                        ZyErr *err) {
    return eval_task_file_on(NULL, m, tok, path, limit, out, err);
}

int eval_task_file_on(const EvalRunner *run, const Model *m, const EvalTokenizer *tok, const char *path, int limit,
                      EvalResult *out, ZyErr *err) {
    CpuRunner cpu;
    EvalRunner on_cpu;
    if (!run) {
        on_cpu = cpu_runner(&cpu, m, NULL);
        run = &on_cpu;
    }
    memset(out, 0, sizeof *out);
    const double t0 = zy_now_seconds();
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t bl = strlen(base);
    if (bl > 6 && strcmp(base + bl - 6, ".jsonl") == 0) bl -= 6;
    if (bl >= sizeof out->name) bl = sizeof out->name - 1;
    memcpy(out->name, base, bl);
    out->name[bl] = 0;
    TaskFile t;
    if (load_task(path, &t, err)) return -1;
    out->type = t.type;
    const int n_use = limit > 0 && limit < t.n ? limit : t.n;
    int rc;
    if (t.type == EVAL_TASK_MC) {
        int max_len = 1, max_cont = 0;
        rc = tokenize_mc(tok, m, &t, n_use, &max_len, &max_cont, err);
        if (rc == 0) rc = score_mc(run, m, &t, n_use, max_len, out, err);
    } else {
        rc = score_exact(run, m, tok, &t, n_use, out, err);
    }
    free_task(&t);
    if (run == &on_cpu) cpu_runner_free(&cpu);
    out->seconds = zy_now_seconds() - t0;
    return rc;
}

int eval_task_file(const Model *m, const Tokenizer *tok, const char *path, int limit, EvalResult *out, ZyErr *err) {
    EvalTokenizer et;
    eval_tokenizer_from(&et, tok, &m->cfg);
    return eval_task_file_with(m, &et, path, limit, out, err);
}

/* ---- held-out loss -------------------------------------------------------------------------------------------- */

int eval_token_loss(Model *m, const EvalTokenSource *src, int seq_len, uint64_t max_tokens, RoutingWindow *routes,
                    double *loss, uint64_t *n_scored, ZyErr *err) {
    return eval_token_loss_on(NULL, m, src, seq_len, max_tokens, routes, loss, n_scored, err);
}

int eval_token_loss_on(const EvalRunner *run, Model *m, const EvalTokenSource *src, int seq_len, uint64_t max_tokens,
                       RoutingWindow *routes, double *loss, uint64_t *n_scored, ZyErr *err) {
    *loss = 0;
    *n_scored = 0;
    if (seq_len < 1 || seq_len > m->cfg.max_position_embeddings)
        return zy_fail(err, "eval: sequence length %d must be in [1, max_position_embeddings = %d]", seq_len,
                       m->cfg.max_position_embeddings);
    if (src->n_tokens < 2) return zy_fail(err, "eval: %llu tokens: need at least 2", (unsigned long long)src->n_tokens);
    uint64_t total = src->n_tokens - 1; /* predictions available */
    if (max_tokens > 0 && max_tokens < total) total = max_tokens;
    CpuRunner cpu;
    EvalRunner on_cpu;
    if (!run) {
        on_cpu = cpu_runner(&cpu, m, m);
        run = &on_cpu;
    }
    RoutingCounts window_routes = {0};
    const int classes = cfg_router_classes(&m->cfg);
    int rc = -1;
    if (routes && classes && routing_counts_create(&window_routes, m->cfg.num_layers, m->cfg.num_experts, err))
        return -1;
    double sum = 0;
    uint64_t done_n = 0;
    int32_t *buf = malloc(sizeof(int32_t) * ((size_t)seq_len + 1)), *targets = malloc(sizeof(int32_t) * seq_len);
    if (!buf || !targets) {
        zy_fail(err, "out of memory");
        goto done;
    }
    while (done_n < total) {
        const int T = total - done_n < (uint64_t)seq_len ? (int)(total - done_n) : seq_len;
        if (src->read(src->ctx, done_n, (size_t)T + 1, buf, err)) goto done;
        for (int i = 0; i <= T; i++)
            if (buf[i] < 0 || buf[i] >= m->cfg.vocab_size) {
                zy_fail(err, "eval: token id %d at offset %llu is outside the model's vocabulary [0, %d)", buf[i],
                        (unsigned long long)(done_n + i), m->cfg.vocab_size);
                goto done;
            }
        for (int i = 0; i < T; i++) targets[i] = buf[i + 1];
        double mean;
        if (run->window(run->ctx, buf, targets, T, &mean, err)) goto done;
        sum += mean * T;
        done_n += T;
        if (routes && classes) { /* each window is one "step" of the routing statistics */
            routing_counts_reset(&window_routes);
            for (int l = 0; l < m->cfg.num_layers; l++) {
                const int32_t *choice;
                const float *gate, *probs;
                if (run->window_routing(run->ctx, l, &choice, &gate, &probs, err)) goto done;
                routing_counts_add_layer(&window_routes, l, choice, gate, probs, classes, (size_t)T);
            }
            routing_window_add_step(routes, &window_routes);
        }
    }
    *loss = sum / (double)done_n;
    *n_scored = done_n;
    rc = 0;
done:
    if (run == &on_cpu) cpu_runner_free(&cpu);
    if (routes && classes) routing_counts_free(&window_routes);
    free(buf);
    free(targets);
    return rc;
}

static int shard_read(void *ctx, uint64_t offset, size_t n, int32_t *out, ZyErr *err) {
    return shardset_read(ctx, offset, n, out, err);
}

int eval_shard_loss(Model *m, ShardSet *shards, int seq_len, uint64_t max_tokens, RoutingWindow *routes, double *loss,
                    uint64_t *n_scored, ZyErr *err) {
    return eval_shard_loss_on(NULL, m, shards, seq_len, max_tokens, routes, loss, n_scored, err);
}

int eval_shard_loss_on(const EvalRunner *run, Model *m, ShardSet *shards, int seq_len, uint64_t max_tokens,
                       RoutingWindow *routes, double *loss, uint64_t *n_scored, ZyErr *err) {
    if (shardset_vocab_size(shards) > m->cfg.vocab_size)
        return zy_fail(err, "eval: the shards' vocabulary (%d) is larger than the model's (%d)",
                       shardset_vocab_size(shards), m->cfg.vocab_size);
    EvalTokenSource src = {shards, shardset_num_tokens(shards), shard_read};
    return eval_token_loss_on(run, m, &src, seq_len, max_tokens, routes, loss, n_scored, err);
}

/* ---- reporting ------------------------------------------------------------------------------------------------ */

static const char *type_name(EvalTaskType t) { return t == EVAL_TASK_MC ? "mc" : "exact"; }

int eval_write_json(const char *path, const EvalResult *results, int n_results, const char *heldout_name,
                    double heldout_loss, uint64_t n_heldout, const RoutingWindow *routes, const char *weights,
                    ZyErr *err) {
    cJSON *root = cJSON_CreateObject();
    if (weights) cJSON_AddStringToObject(root, "weights", weights);
    cJSON *tasks = cJSON_AddArrayToObject(root, "tasks");
    for (int i = 0; i < n_results; i++) {
        const EvalResult *r = &results[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "task", r->name);
        cJSON_AddStringToObject(o, "type", type_name(r->type));
        cJSON_AddNumberToObject(o, "n", r->n);
        if (r->type == EVAL_TASK_MC) {
            cJSON_AddNumberToObject(o, "acc", r->acc);
            cJSON_AddNumberToObject(o, "acc_norm", r->acc_norm);
            cJSON_AddNumberToObject(o, "ppl", r->ppl);
        } else {
            cJSON_AddNumberToObject(o, "exact_match", r->exact_match);
        }
        cJSON_AddNumberToObject(o, "seconds", r->seconds);
        cJSON_AddItemToArray(tasks, o);
    }
    if (n_heldout > 0) {
        cJSON *h = cJSON_AddObjectToObject(root, "heldout");
        cJSON_AddStringToObject(h, "name", heldout_name ? heldout_name : "");
        cJSON_AddNumberToObject(h, "tokens", (double)n_heldout);
        cJSON_AddNumberToObject(h, "loss", heldout_loss);
        cJSON_AddNumberToObject(h, "ppl", exp(heldout_loss));
    }
    if (routes && routes->steps > 0) {
        cJSON *ro = cJSON_AddObjectToObject(root, "routing");
        cJSON_AddNumberToObject(ro, "windows", (double)routes->steps);
        cJSON *layers = cJSON_AddArrayToObject(ro, "layers");
        for (int l = 0; l < routes->num_layers; l++) {
            const LayerRouting st = routing_window_layer(routes, l);
            const int64_t *c = routes->total.counts + (size_t)l * (routes->num_experts + 1);
            cJSON *o = cJSON_CreateObject();
            cJSON_AddNumberToObject(o, "layer", l);
            cJSON_AddNumberToObject(o, "tokens", (double)st.tokens);
            cJSON_AddNumberToObject(o, "entropy", st.entropy);
            cJSON_AddNumberToObject(o, "skip_rate", st.skip_rate);
            cJSON_AddNumberToObject(o, "max_load", st.max_load);
            cJSON_AddNumberToObject(o, "gate", st.gate);
            cJSON_AddNumberToObject(o, "p_skip", st.p_skip);
            cJSON *load = cJSON_AddArrayToObject(o, "load");
            for (int e = 0; e < routes->num_experts; e++)
                cJSON_AddItemToArray(load, cJSON_CreateNumber(st.tokens ? (double)c[e] / (double)st.tokens : 0.0));
            cJSON_AddItemToArray(layers, o);
        }
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text) return zy_fail(err, "out of memory");
    size_t len = strlen(text);
    int rc = zy_write_file_atomic(path, text, len, err);
    free(text);
    return rc;
}

static void cell(FILE *f, double v, int width) {
    if (isnan(v))
        fprintf(f, " %*s", width, "-");
    else
        fprintf(f, " %*.4f", width, v);
}

void eval_print_routing(FILE *f, const RoutingWindow *routes) {
    if (!routes || routes->steps == 0) return;
    fprintf(f, "\nrouting over %lld windows (entropy and max load: the mean of each window's value)\n",
            (long long)routes->steps);
    fprintf(f, "%-6s %10s %8s %9s %9s %7s %7s  load per expert\n", "layer", "tokens", "entropy", "skip rate",
            "max load", "gate", "p_skip");
    for (int l = 0; l < routes->num_layers; l++) {
        const LayerRouting st = routing_window_layer(routes, l);
        const int64_t *c = routes->total.counts + (size_t)l * (routes->num_experts + 1);
        fprintf(f, "%-6d %10lld %8.3f %8.1f%% %9.2f %7.3f %7.3f ", l, (long long)st.tokens, st.entropy,
                100 * st.skip_rate, st.max_load, st.gate, st.p_skip);
        for (int e = 0; e < routes->num_experts; e++)
            fprintf(f, " %.2f", st.tokens ? (double)c[e] / (double)st.tokens : 0.0);
        fprintf(f, "\n");
    }
}

void eval_print_table(FILE *f, const EvalResult *results, int n_results, const char *heldout_name,
                      double heldout_loss, uint64_t n_heldout) {
    fprintf(f, "%-24s %-6s %10s %8s %12s %10s\n", "task", "type", "n", "acc", "acc_norm/em", "ppl");
    for (int i = 0; i < n_results; i++) {
        const EvalResult *r = &results[i];
        fprintf(f, "%-24s %-6s %10d", r->name, type_name(r->type), r->n);
        cell(f, r->acc, 8);
        cell(f, r->type == EVAL_TASK_MC ? r->acc_norm : r->exact_match, 12);
        cell(f, r->ppl, 10);
        fprintf(f, "\n");
    }
    if (n_heldout > 0) {
        fprintf(f, "%-24s %-6s %10llu", heldout_name ? heldout_name : "heldout", "loss", (unsigned long long)n_heldout);
        cell(f, NAN, 8);
        cell(f, NAN, 12);
        cell(f, exp(heldout_loss), 10);
        fprintf(f, "   (loss %.6f)\n", heldout_loss);
    }
}

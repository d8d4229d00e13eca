/* Markovian RSA over the serving engine (reason.h). */
#include "serve/reason.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve/serve_utf8.h"

/* configs/rsa_aggregate.jinja holds the same text (test_reason checks). */
const char RSA_DEFAULT_TEMPLATE[] =
    "{{ problem }}\n"
    "\n"
    "Below are {{ candidates | length }} candidate solutions to the problem above; each may be cut to its last part.\n"
    "{% for c in candidates %}\n"
    "--- Candidate {{ loop.index }} ---\n"
    "{{ c }}\n"
    "{% endfor %}\n"
    "--- End of candidates ---\n"
    "\n"
    "Check the candidates' reasoning: keep what is right, fix what is wrong, and combine their best ideas. Then "
    "reason step by step to an improved solution of the problem, and give the final answer as \\boxed{ANSWER}.";

#define BAD(param, ...) serve_error(e, 400, "invalid_request_error", param, __VA_ARGS__)

static int bound(const char *prefix, const char *name, long v, long lo, long hi, const char *why, ServeError *e) {
    if (v >= lo && v <= hi) return 0;
    char param[64];
    snprintf(param, sizeof param, "%s%s", prefix, name);
    return BAD(param, "'%s' must be an integer from %ld to %ld%s (got %ld)", param, lo, hi, why, v);
}

int rsa_shape_check(const ServeRsa *s, int max_batch, const char *prefix, ServeError *e) {
    const int n_max = max_batch < SERVE_RSA_MAX_POPULATION ? max_batch : SERVE_RSA_MAX_POPULATION;
    const char *why = n_max < SERVE_RSA_MAX_POPULATION ? " (a round runs as one batch: at most --max-batch)" : "";
    const int bad = bound(prefix, "population", s->population, 1, n_max, why, e) ||
                    bound(prefix, "subset", s->subset, 1, s->population > 0 ? s->population : 1,
                          " (at most the population)", e) ||
                    bound(prefix, "rounds", s->rounds, 1, SERVE_RSA_MAX_ROUNDS, "", e) ||
                    bound(prefix, "tail", s->tail, 1, SERVE_RSA_MAX_TAIL, " tokens", e);
    return bad ? -1 : 0;
}

int rsa_tail_start(int n, int tail) { return n > tail ? n - tail : 0; }

void rsa_sample_subset(ZyRng *rng, int n, int k, int *out) {
    int *perm = malloc(sizeof(int) * (size_t)n);
    if (!perm) { /* no memory: the first k, still a valid subset */
        for (int i = 0; i < k; i++) out[i] = i;
        return;
    }
    for (int i = 0; i < n; i++) perm[i] = i;
    for (int i = 0; i < k; i++) {
        const int j = i + (int)(zy_rng_next(rng) % (uint64_t)(n - i));
        const int t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
        out[i] = perm[i];
    }
    free(perm);
}

/* s[0..n) without surrounding spaces and one trailing period, malloc'ed; NULL when nothing is left. */
static char *trimmed(const char *s, size_t n) {
    while (n && isspace((unsigned char)*s)) s++, n--;
    while (n && isspace((unsigned char)s[n - 1])) n--;
    if (n && s[n - 1] == '.') n--;
    while (n && isspace((unsigned char)s[n - 1])) n--;
    if (!n) return NULL;
    char *o = malloc(n + 1);
    if (o) {
        memcpy(o, s, n);
        o[n] = 0;
    }
    return o;
}

static const char *last_boxed(const char *text, size_t *len) {
    const char *found = NULL;
    for (const char *p = strstr(text, "\\boxed{"); p; p = strstr(p + 1, "\\boxed{")) {
        const char *b = p + 7;
        int depth = 1;
        const char *q = b;
        for (; *q && depth; q++) depth += *q == '{' ? 1 : *q == '}' ? -1 : 0;
        if (depth == 0) {
            found = b;
            *len = (size_t)(q - 1 - b);
        }
    }
    return found;
}

char *rsa_extract_answer(const char *text) {
    size_t len = 0;
    const char *b = last_boxed(text, &len);
    if (b) return trimmed(b, len);
    const char *ans = NULL;
    size_t ans_len = 0;
    for (const char *line = text; line && *line;) {
        const char *end = strchr(line, '\n');
        const size_t n = end ? (size_t)(end - line) : strlen(line);
        const char *p = line, *stop = line + n;
        while (p < stop && (isspace((unsigned char)*p) || *p == '*')) p++;
        if (stop - p >= 7 && strncasecmp(p, "answer:", 7) == 0) {
            p += 7;
            const char *q = stop;
            while (q > p && (isspace((unsigned char)q[-1]) || q[-1] == '*')) q--;
            while (p < q && (isspace((unsigned char)*p) || *p == '*')) p++;
            ans = p;
            ans_len = (size_t)(q - p);
        }
        line = end ? end + 1 : NULL;
    }
    return ans ? trimmed(ans, ans_len) : NULL;
}

int rsa_vote(char *const *answers, int n, int *votes) {
    int best = -1, best_votes = 0;
    for (int i = 0; i < n; i++) {
        if (!answers[i]) continue;
        int first = 1, v = 0;
        for (int j = 0; j < n; j++)
            if (answers[j] && strcmp(answers[i], answers[j]) == 0) {
                if (j < i) first = 0;
                v++;
            }
        if (first && v > best_votes) {
            best = i;
            best_votes = v;
        }
    }
    if (votes) *votes = best_votes;
    return best;
}

/* The last message with role "user" and string content in {"messages": [...]}. */
static cJSON *last_user(cJSON *root) {
    cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages"), *found = NULL;
    for (cJSON *m = msgs ? msgs->child : NULL; m; m = m->next) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (cJSON_IsString(role) && strcmp(role->valuestring, "user") == 0 &&
            cJSON_IsString(cJSON_GetObjectItemCaseSensitive(m, "content")))
            found = m;
    }
    return found;
}

int rsa_chat_problem(const char *chat_json, char **problem, ServeError *e) {
    cJSON *root = cJSON_Parse(chat_json);
    cJSON *u = root ? last_user(root) : NULL;
    if (!u) {
        cJSON_Delete(root);
        return BAD("messages", "RSA needs a user message whose content is a string (the problem)");
    }
    *problem = strdup(cJSON_GetObjectItemCaseSensitive(u, "content")->valuestring);
    cJSON_Delete(root);
    return *problem ? 0 : serve_error(e, 500, "server_error", "", "out of memory");
}

int rsa_chat_with_user_text(const char *chat_json, const char *text, char **out, ServeError *e) {
    cJSON *root = cJSON_Parse(chat_json);
    cJSON *u = root ? last_user(root) : NULL;
    if (!u) {
        cJSON_Delete(root);
        return BAD("messages", "RSA needs a user message whose content is a string (the problem)");
    }
    cJSON_ReplaceItemInObjectCaseSensitive(u, "content", cJSON_CreateString(text));
    *out = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return *out ? 0 : serve_error(e, 500, "server_error", "", "out of memory");
}

int rsa_encode(void *rsa_encoder, const char *text, size_t len, int32_t **ids, int *n, ServeError *e) {
    const RsaEncoder *c = rsa_encoder;
    ZyErr ze = {{0}};
    char *json = NULL, *rendered = NULL;
    int32_t *body = NULL;
    size_t nb = 0, rl = 0;
    if (c->chat_json) {
        if (rsa_chat_with_user_text(c->chat_json, text, &json, e)) return -1;
        const int bad = chat_renderer_render_json(c->chat, json, strlen(json), 1, NULL, &rendered, &rl, &ze);
        free(json);
        if (bad) return BAD("messages", "the chat template failed: %s", ze.msg);
        text = rendered;
        len = rl;
    }
    const int bad = tokenizer_encode_with(c->tok, NULL, text, len, &body, &nb, &ze);
    free(rendered);
    if (bad) return BAD(c->chat_json ? "messages" : "prompt", "%s", ze.msg);
    const int bos = !c->chat_json && c->bos_id >= 0;
    if (!(*ids = malloc(sizeof(int32_t) * (nb + (size_t)bos + 1)))) {
        free(body);
        return serve_error(e, 500, "server_error", "", "out of memory");
    }
    if (bos) (*ids)[0] = c->bos_id;
    if (nb) memcpy(*ids + bos, body, sizeof(int32_t) * nb);
    *n = (int)nb + bos;
    free(body);
    if (*n == 0) {
        free(*ids);
        *ids = NULL;
        return BAD(c->chat_json ? "messages" : "prompt", "the prompt is empty");
    }
    return 0;
}

long rsa_prefix_cache_hits(ServeEngine *e) {
    static const char NAME[] = "zaya_prefix_cache_hit_tokens_total"; /* tokens, not requests */
    char *m = serve_engine_metrics(e);
    long hits = -1;
    for (const char *p = m; p && (p = strstr(p, NAME)); p += sizeof NAME - 1)
        if ((p == m || p[-1] == '\n') && (p[sizeof NAME - 1] == ' ' || p[sizeof NAME - 1] == '{')) {
            const char *v = strchr(p, ' ');
            hits = (hits < 0 ? 0 : hits) + (v ? strtol(v + 1, NULL, 10) : 0);
        }
    free(m);
    return hits;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int is_stop(const RsaOpts *o, int32_t id) {
    for (int i = 0; i < o->base.n_stop_ids; i++)
        if (o->base.stop_ids[i] == id) return 1;
    return 0;
}

/* Submits one round's N prompts (prompts[i]; one prompt with n = N when same) and collects the traces. */
static int run_round(ServeEngine *e, const RsaOpts *o, const RsaPrompter *p, int32_t *const *prompts,
                     const int *n_prompt, int same, uint64_t seed, RsaRound *rd, ServeError *err) {
    const int N = o->shape.population;
    ServeJob **jobs = calloc((size_t)N, sizeof *jobs);
    size_t *len = calloc((size_t)N, sizeof *len), *cap = calloc((size_t)N, sizeof *cap);
    int *ids_cap = calloc((size_t)N, sizeof *ids_cap), *done = calloc((size_t)N, sizeof *done);
    int rc = -1;
    if (!jobs || !len || !cap || !ids_cap || !done) {
        serve_error(err, 500, "server_error", "", "out of memory");
        goto out;
    }
    for (int i = 0; i < (same ? 1 : N); i++) {
        const int room = o->max_context - n_prompt[i];
        if (room < 1) {
            char tail[32];
            snprintf(tail, sizeof tail, "%stail", o->field_prefix ? o->field_prefix : "");
            serve_error(err, 400, "invalid_request_error", same ? "messages" : tail,
                        "the %s prompt has %d tokens and the context holds %d: %s", same ? "problem's" : "aggregation",
                        n_prompt[i], o->max_context,
                        same ? "shorten the problem" : "lower the tail or the subset (K tails of tail tokens each)");
            snprintf(err->code, sizeof err->code, "context_length_exceeded");
            goto out;
        }
        ServeJobSpec spec = o->base;
        spec.prompt = prompts[i];
        spec.n_prompt = n_prompt[i];
        spec.max_tokens = o->max_tokens < room ? o->max_tokens : room;
        spec.seed = seed + (uint64_t)i;
        spec.logprobs = 0; /* the tokens come with their log-probabilities: the tails need them */
        spec.prompt_logprobs = 0;
        spec.n = same ? N : 1;
        spec.wake = i > 0 ? jobs[0] : NULL;
        if (serve_engine_submit(e, &spec, jobs + i, err)) goto out;
        rd->prompt_tokens += n_prompt[i] * (same ? N : 1);
        if (same)
            for (int t = 0; t < N; t++) rd->traces[t].prompt_tokens = n_prompt[i];
        else
            rd->traces[i].prompt_tokens = n_prompt[i];
    }
    for (int left = N; left > 0;) {
        const int news = serve_jobs_wait(jobs, N, 100);
        if (p->cancelled && p->cancelled(p->cancel_ctx)) { /* each wake: a busy round never times out */
            serve_error(err, 499, "server_error", "", "the client went away");
            goto out;
        }
        if (!news) continue;
        for (int i = 0; i < N; i++) {
            if (done[i]) continue;
            ServeDelta d = {0};
            if (serve_job_take(jobs[i], &d)) {
                serve_error(err, 500, "server_error", "", "out of memory");
                goto out;
            }
            RsaTrace *t = &rd->traces[i];
            int ok = 1;
            if (d.len) {
                if (len[i] + d.len + 1 > cap[i]) {
                    cap[i] = 2 * (len[i] + d.len + 1);
                    char *b = realloc(t->text, cap[i]);
                    ok = b != NULL;
                    if (ok) t->text = b;
                }
                if (ok) {
                    memcpy(t->text + len[i], d.text, d.len);
                    len[i] += d.len;
                    t->text[len[i]] = 0;
                }
            }
            for (int k = 0; ok && k < d.n_logprobs; k++) {
                if (t->n_ids == ids_cap[i]) {
                    ids_cap[i] = 2 * ids_cap[i] + 16;
                    int32_t *b = realloc(t->ids, sizeof(int32_t) * (size_t)ids_cap[i]);
                    ok = b != NULL;
                    if (ok) t->ids = b;
                }
                if (ok) t->ids[t->n_ids++] = d.logprobs[k].token;
            }
            if (d.finished) {
                done[i] = 1;
                left--;
                t->finish = d.finish;
                rd->tokens_generated += d.completion_tokens;
                if (t->n_ids && is_stop(o, t->ids[t->n_ids - 1])) t->n_ids--; /* the eos: not part of the trace */
                if (!t->text && (t->text = malloc(1))) t->text[0] = 0;
                ok = ok && t->text;
            }
            serve_delta_free(&d);
            if (!ok) {
                serve_error(err, 500, "server_error", "", "out of memory");
                goto out;
            }
        }
    }
    for (int i = 0; i < N; i++)
        if (rd->traces[i].finish && strcmp(rd->traces[i].finish, "abort") == 0) {
            serve_error(err, 503, "server_error", "", "the generation was aborted (the server is shutting down)");
            goto out;
        }
    rc = 0;
out:
    for (int i = 0; jobs && i < N; i++)
        if (jobs[i]) {
            if (!done[i]) serve_job_cancel(jobs[i]);
            serve_job_release(jobs[i]);
        }
    free(jobs);
    free(len);
    free(cap);
    free(ids_cap);
    free(done);
    return rc;
}

/* The aggregation text for one new trace: the template over the problem and its sources' tails. */
static int aggregate(const RsaOpts *o, const char *problem, const RsaRound *last, const int *sources, int round,
                     char **out, ServeError *err) {
    cJSON *vars = cJSON_CreateObject();
    cJSON *cands = cJSON_AddArrayToObject(vars, "candidates");
    cJSON_AddStringToObject(vars, "problem", problem);
    cJSON_AddNumberToObject(vars, "round", round);
    cJSON_AddNumberToObject(vars, "population", o->shape.population);
    for (int k = 0; k < o->shape.subset; k++) {
        const RsaTrace *t = &last->traces[sources[k]];
        const int from = rsa_tail_start(t->n_ids, o->shape.tail);
        char *b = NULL, *s = NULL;
        size_t bl = 0, sl = 0;
        ZyErr ze = {{0}};
        if (tokenizer_decode_ex(o->tok, t->ids + from, (size_t)(t->n_ids - from), TOK_DECODE_LOSSY, &b, &bl, &ze) == 0)
            s = serve_utf8_sanitize(b ? b : "", bl, &sl);
        free(b);
        size_t w = 0; /* NUL bytes (a token can decode to one) dropped: the template's strings end at a NUL */
        for (size_t i = 0; s && i < sl; i++)
            if (s[i]) s[w++] = s[i];
        if (s) s[w] = 0;
        cJSON_AddItemToArray(cands, cJSON_CreateString(s ? s : ""));
        free(s);
    }
    char *json = cJSON_PrintUnformatted(vars);
    cJSON_Delete(vars);
    if (!json) return serve_error(err, 500, "server_error", "", "out of memory");
    size_t len = 0;
    ZyErr ze = {{0}};
    const int rc = jinja_render_json(o->aggregate, json, strlen(json), NULL, out, &len, &ze);
    free(json);
    return rc ? serve_error(err, 400, "invalid_request_error", "template", "the aggregation template failed: %s",
                            ze.msg)
              : 0;
}

int rsa_run(ServeEngine *e, const RsaOpts *o, const RsaPrompter *p, const char *problem, RsaResult *out,
            ServeError *err) {
    const int N = o->shape.population, K = o->shape.subset, T = o->shape.rounds;
    memset(out, 0, sizeof *out);
    out->shape = o->shape;
    int32_t **prompts = calloc((size_t)N, sizeof *prompts);
    int *n_prompt = calloc((size_t)N, sizeof *n_prompt);
    out->rounds = calloc((size_t)T, sizeof *out->rounds);
    int rc = -1;
    if (!prompts || !n_prompt || !out->rounds) {
        serve_error(err, 500, "server_error", "", "out of memory");
        goto done;
    }
    ZyRng rng;
    zy_rng_seed(&rng, o->seed ^ 0x5253415f73756273ULL); /* the subsets' own stream ("RSA_subs") */
    for (int r = 0; r < T; r++) {
        RsaRound *rd = &out->rounds[r];
        if (!(rd->traces = calloc((size_t)N, sizeof *rd->traces))) {
            serve_error(err, 500, "server_error", "", "out of memory");
            goto done;
        }
        const double t0 = now_s();
        const long hits0 = rsa_prefix_cache_hits(e);
        for (int i = 0; i < N; i++) {
            free(prompts[i]);
            prompts[i] = NULL;
        }
        if (r == 0) {
            if (p->encode(p->ctx, problem, strlen(problem), &prompts[0], &n_prompt[0], err)) goto done;
        } else {
            for (int i = 0; i < N; i++) {
                RsaTrace *t = &rd->traces[i];
                char *text = NULL;
                if (!(t->sources = malloc(sizeof(int) * (size_t)K))) {
                    serve_error(err, 500, "server_error", "", "out of memory");
                    goto done;
                }
                rsa_sample_subset(&rng, N, K, t->sources);
                if (aggregate(o, problem, &out->rounds[r - 1], t->sources, r + 1, &text, err)) goto done;
                const int bad = p->encode(p->ctx, text, strlen(text), &prompts[i], &n_prompt[i], err);
                if (o->keep_prompts)
                    t->prompt = text;
                else
                    free(text);
                if (bad) goto done;
            }
        }
        if (run_round(e, o, p, prompts, n_prompt, r == 0, o->seed + (uint64_t)r * (uint64_t)N, rd, err)) goto done;
        for (int i = 0; i < N; i++) rd->traces[i].answer = rsa_extract_answer(rd->traces[i].text);
        const long hits1 = rsa_prefix_cache_hits(e);
        rd->prefix_cache_hits = hits0 >= 0 && hits1 >= 0 ? hits1 - hits0 : -1;
        rd->seconds = now_s() - t0;
    }
    char **answers = malloc(sizeof(char *) * (size_t)N);
    if (!answers) {
        serve_error(err, 500, "server_error", "", "out of memory");
        goto done;
    }
    for (int i = 0; i < N; i++) answers[i] = out->rounds[T - 1].traces[i].answer;
    const int won = rsa_vote(answers, N, &out->votes);
    out->chosen = won >= 0 ? won : 0;
    free(answers);
    rc = 0;
done:
    for (int i = 0; prompts && i < N; i++) free(prompts[i]);
    free(prompts);
    free(n_prompt);
    if (rc) rsa_result_free(out);
    return rc;
}

void rsa_result_free(RsaResult *r) {
    for (int k = 0; r->rounds && k < r->shape.rounds; k++) {
        for (int i = 0; r->rounds[k].traces && i < r->shape.population; i++) {
            RsaTrace *t = &r->rounds[k].traces[i];
            free(t->text);
            free(t->ids);
            free(t->answer);
            free(t->sources);
            free(t->prompt);
        }
        free(r->rounds[k].traces);
    }
    free(r->rounds);
    memset(r, 0, sizeof *r);
}

const RsaTrace *rsa_chosen(const RsaResult *r) { return &r->rounds[r->shape.rounds - 1].traces[r->chosen]; }

cJSON *rsa_report_json(const RsaResult *r, int with_traces) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "population", r->shape.population);
    cJSON_AddNumberToObject(o, "subset", r->shape.subset);
    cJSON_AddNumberToObject(o, "rounds", r->shape.rounds);
    cJSON_AddNumberToObject(o, "tail", r->shape.tail);
    const RsaTrace *c = rsa_chosen(r);
    if (c->answer)
        cJSON_AddStringToObject(o, "answer", c->answer);
    else
        cJSON_AddNullToObject(o, "answer");
    cJSON_AddNumberToObject(o, "votes", r->votes);
    cJSON_AddNumberToObject(o, "chosen", r->chosen);
    cJSON *rounds = cJSON_AddArrayToObject(o, "round_reports");
    long tokens = 0;
    double seconds = 0;
    for (int k = 0; k < r->shape.rounds; k++) {
        const RsaRound *rd = &r->rounds[k];
        cJSON *x = cJSON_CreateObject();
        cJSON_AddNumberToObject(x, "round", k + 1);
        cJSON_AddNumberToObject(x, "tokens_generated", (double)rd->tokens_generated);
        cJSON_AddNumberToObject(x, "prompt_tokens", (double)rd->prompt_tokens);
        if (rd->prefix_cache_hits >= 0)
            cJSON_AddNumberToObject(x, "prefix_cache_hits", (double)rd->prefix_cache_hits);
        else
            cJSON_AddNullToObject(x, "prefix_cache_hits");
        cJSON_AddNumberToObject(x, "seconds", rd->seconds);
        cJSON_AddNumberToObject(x, "tokens_per_second", rd->seconds > 0 ? rd->tokens_generated / rd->seconds : 0);
        tokens += rd->tokens_generated;
        seconds += rd->seconds;
        if (with_traces) {
            cJSON *ts = cJSON_AddArrayToObject(x, "traces");
            for (int i = 0; i < r->shape.population; i++) {
                const RsaTrace *t = &rd->traces[i];
                cJSON *y = cJSON_CreateObject();
                cJSON_AddStringToObject(y, "text", t->text ? t->text : "");
                if (t->answer)
                    cJSON_AddStringToObject(y, "answer", t->answer);
                else
                    cJSON_AddNullToObject(y, "answer");
                cJSON_AddStringToObject(y, "finish_reason", t->finish ? t->finish : "");
                cJSON_AddNumberToObject(y, "prompt_tokens", t->prompt_tokens);
                cJSON_AddItemToObject(y, "ids", cJSON_CreateIntArray(t->ids, t->n_ids));
                const int from = rsa_tail_start(t->n_ids, r->shape.tail);
                cJSON_AddItemToObject(y, "tail_ids", cJSON_CreateIntArray(t->ids + from, t->n_ids - from));
                if (t->sources) cJSON_AddItemToObject(y, "sources", cJSON_CreateIntArray(t->sources, r->shape.subset));
                if (t->prompt) cJSON_AddStringToObject(y, "prompt", t->prompt);
                cJSON_AddItemToArray(ts, y);
            }
        }
        cJSON_AddItemToArray(rounds, x);
    }
    cJSON_AddNumberToObject(o, "tokens_generated", (double)tokens);
    cJSON_AddNumberToObject(o, "seconds", seconds);
    cJSON_AddNumberToObject(o, "tokens_per_second", seconds > 0 ? tokens / seconds : 0);
    return o;
}

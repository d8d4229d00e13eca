/* Continuous batching (see serve_engine.h). One mutex guards the queue, the running set, every job's output and the
 * metrics; the engine thread drops it only while the model runs a step, so a step never waits on a client and a
 * client never waits on more than a step's bookkeeping. */
#include "serve/serve_engine.h"

#include <errno.h>
#include <stdarg.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { JOB_QUEUED, JOB_RUNNING, JOB_DONE };

struct ServeJob {
    /* the request (immutable after submit) */
    int32_t *prompt;
    int n_prompt, max_tokens, need; /* need: tokens the cache must hold */
    SamplingParams sp;
    LogitsPenalties pen; /* its bias arrays owned below */
    int32_t *bias_ids;
    float *bias;
    ZyRng rng;
    int32_t *stop_ids;
    int n_stop_ids;
    char **stop;
    int n_stop;
    size_t max_stop;
    int include_stop_str, skip_special;
    int logprobs, prompt_lp; /* prompt_lp: the prompt's log-probabilities are recorded too */
    const ServeMaskOps *mask; /* constrained decoding, with this choice's state */
    void *mask_state;
    /* engine side */
    int state, slot, n_fed, n_gen;
    int32_t next_token;
    int32_t *gen; /* generated ids that make the text (stop ids excluded) */
    int n_text_ids, gen_cap;
    char *text;   /* the text so far (repaired UTF-8); bytes [0, ready) may be handed out */
    size_t text_len, ready, taken;
    ServeLogprob *lp;
    int n_lp, lp_cap, lp_taken;
    int finished, finish_taken, first_taken, cancelled;
    const char *finish;
    double t_submit, t_last;
    /* choices of one prompt: the first (the parent) prefills it; the others wait for that, then fork its cache */
    ServeJob *parent;    /* set while this choice waits for its parent's prompt */
    ServeJob **kids;     /* the choices waiting for this one's prompt */
    int n_kids;
    ServeJob *wake;      /* also woken with this job (a reference is held) */
    int refs;
    pthread_cond_t cv;
    ServeJob *next;
    ServeEngine *eng; /* its mutex guards everything above that changes */
};

/* A Prometheus histogram with fixed upper bounds. */
#define HIST_MAX 16
typedef struct {
    int n;
    double le[HIST_MAX];
    uint64_t count[HIST_MAX + 1]; /* per bucket; the last is +Inf */
    double sum;
    uint64_t total;
} Hist;

static void hist_init(Hist *h, const double *le, int n) {
    memset(h, 0, sizeof *h);
    h->n = n;
    memcpy(h->le, le, sizeof(double) * n);
}

static void hist_observe(Hist *h, double v) {
    int i = 0;
    while (i < h->n && v > h->le[i]) i++;
    h->count[i]++;
    h->sum += v;
    h->total++;
}

struct ServeEngine {
    const Model *m;
    const Tokenizer *tok;
    ServeEngineOpts o;
    ServeBackend be; /* the KV pool and the step */
    PrefixCache *pc; /* the backend's prefix cache, NULL when off */
    int n_blocks;
    Sampler smp;
    pthread_t thread;
    int thread_started, shut;
    pthread_mutex_t mu;
    pthread_cond_t wake;
    ServeJob *head, *tail;
    int n_queued, n_running;
    ServeJob **running; /* [max_batch] by slot */
    int stopping;
    double deadline;
    /* one step */
    float *logits;      /* [max_batch + prefill_chunk, V]: a row per sequence, and a prompt chunk's rows (echo) */
    int32_t *tokens;    /* [step_tokens] */
    DecodeSeq *seqs;    /* [max_batch] */
    ServeJob **jobs;    /* [max_batch] */
    int *logit_row;     /* [max_batch]: where each sequence's logits start */
    float *adjusted;    /* [V]: logits after a job's penalties */
    int32_t *counts;    /* [V]: zeros, the penalties' scratch */
    /* metrics */
    uint64_t prompt_tokens, prefill_tokens, generation_tokens, steps, finished_stop, finished_length, finished_abort;
    uint64_t rejected_full, rejected_too_long, rejected_shutdown, step_errors;
    int last_batch;
    Hist ttft, itl, batch, step_s;
};

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void abs_deadline(struct timespec *ts, int ms) {
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

static void job_unref(ServeJob *j);

static void job_free(ServeJob *j) {
    if (j->wake) job_unref(j->wake);
    if (j->mask_state) j->mask->close(j->mask_state);
    free(j->bias_ids);
    free(j->bias);
    free(j->kids);
    free(j->prompt);
    free(j->stop_ids);
    for (int i = 0; i < j->n_stop; i++) free(j->stop[i]);
    free(j->stop);
    free(j->gen);
    free(j->text);
    free(j->lp);
    pthread_cond_destroy(&j->cv);
    free(j);
}

/* Drops one reference (mutex held). */
static void job_unref(ServeJob *j) {
    if (--j->refs == 0) job_free(j);
}

/* ---- text ------------------------------------------------------------------------------------------------------ */

/* Wakes whoever waits on j. */
static void job_wake(ServeJob *j) {
    pthread_cond_broadcast(&j->cv);
    if (j->wake) pthread_cond_broadcast(&j->wake->cv);
}

/* The last token changed the text: decode it again, repair it, look for stop strings, move `ready`. The text is
 * repaired before the search, so a stop string holding U+FFFD matches where the client's text has one. */
static int update_text(ServeEngine *e, ServeJob *j, int final) {
    char *raw = NULL;
    size_t raw_len = 0;
    ZyErr err = {{0}};
    if (tokenizer_decode_ex(e->tok, j->gen, (size_t)j->n_text_ids, j->skip_special ? TOK_DECODE_SKIP_SPECIAL : 0, &raw,
                            &raw_len, &err))
        return -1;
    /* an unfinished character at the end is left out until it is settled (it may still become valid) */
    size_t len;
    char *full = serve_utf8_sanitize(raw ? raw : "", final ? raw_len : serve_utf8_complete(raw, raw_len), &len);
    free(raw);
    if (!full) return -1;
    free(j->text);
    j->text = full;
    j->text_len = len;
    size_t stable = len;
    if (j->n_stop) {
        size_t from = j->ready > j->max_stop ? j->ready - j->max_stop : 0, cut = (size_t)-1, cut_len = 0;
        for (int i = 0; i < j->n_stop; i++) {
            const size_t sl = strlen(j->stop[i]);
            const char *hit = memmem(full + from, stable > from ? stable - from : 0, j->stop[i], sl);
            if (hit && (size_t)(hit - full) < cut) cut = (size_t)(hit - full), cut_len = sl;
        }
        if (cut != (size_t)-1) {
            if (j->include_stop_str) cut += cut_len;
            j->text_len = cut > j->ready ? cut : j->ready;
            j->ready = j->text_len;
            return 1; /* a stop string: the text ends before it (or after it) */
        }
        if (!final) /* hold back what could be the start of a stop string */
            stable = serve_utf8_complete(full, stable > j->max_stop - 1 ? stable - (j->max_stop - 1) : 0);
    }
    if (stable > j->ready) j->ready = stable;
    return 0;
}

/* ---- the engine thread -------------------------------------------------------------------------------------- */

static void job_finish(ServeEngine *e, ServeJob *j, const char *reason) {
    if (j->finished) return;
    j->finished = 1;
    j->finish = reason;
    if (strcmp(reason, "stop") == 0) e->finished_stop++;
    else if (strcmp(reason, "length") == 0) e->finished_length++;
    else e->finished_abort++;
    if (j->parent) { /* a choice still waiting for its parent's prompt: off the parent's list */
        ServeJob *p = j->parent;
        for (int i = 0; i < p->n_kids; i++)
            if (p->kids[i] == j) p->kids[i] = p->kids[--p->n_kids];
        j->parent = NULL;
    }
    while (j->n_kids) job_finish(e, j->kids[0], "abort"); /* its prompt will not be read: neither will theirs */
    if (j->state == JOB_RUNNING) {
        e->be.seq_release(e->be.ctx, j->slot);
        e->running[j->slot] = NULL;
        e->n_running--;
    } else if (j->state == JOB_QUEUED) {
        e->n_queued--;
    }
    j->state = JOB_DONE;
    job_wake(j);
    job_unref(j); /* the engine's reference */
}

/* Log-probabilities of the model's distribution at this position: the chosen token's and the k largest (logits
 * NULL: a prompt's first token, which nothing predicts). */
static void record_logprobs(ServeJob *j, const float *logits, int V, int32_t tok) {
    if (j->n_lp == j->lp_cap) {
        int cap = j->lp_cap ? 2 * j->lp_cap : 16;
        ServeLogprob *g = realloc(j->lp, sizeof *g * cap);
        if (!g) return; /* out of memory: the entry is left out rather than failing the request */
        j->lp = g;
        j->lp_cap = cap;
    }
    ServeLogprob *r = &j->lp[j->n_lp++];
    memset(r, 0, sizeof *r);
    r->token = tok;
    if (!logits) {
        r->logprob = NAN;
        return;
    }
    double mx = -INFINITY, sum = 0;
    for (int i = 0; i < V; i++) mx = logits[i] > mx ? logits[i] : mx;
    for (int i = 0; i < V; i++) sum += exp((double)logits[i] - mx);
    const double lse = mx + log(sum);
    r->logprob = (float)(logits[tok] - lse);
    const int k = j->logprobs;
    for (int i = 0; k > 0 && i < V; i++) { /* insertion into the k best, ties to the lower id */
        int pos = r->n_top;
        while (pos > 0 && logits[i] > logits[r->top[pos - 1]]) pos--;
        if (pos >= k) continue;
        int last = r->n_top < k ? r->n_top : k - 1;
        for (int m = last; m > pos; m--) r->top[m] = r->top[m - 1];
        r->top[pos] = i;
        if (r->n_top < k) r->n_top++;
    }
    for (int i = 0; i < r->n_top; i++) r->top_logprob[i] = (float)(logits[r->top[i]] - lse);
}

/* The job's next token from these logits: its penalties and its mask on a copy, then its sampling. -1: the mask
 * left nothing. */
static int32_t pick(ServeEngine *e, ServeJob *j, const float *logits) {
    const int V = e->m->cfg.vocab_size;
    if (logits_penalties_active(&j->pen) || j->mask) {
        memcpy(e->adjusted, logits, sizeof(float) * V);
        if (logits_penalties_active(&j->pen))
            logits_apply_penalties(e->adjusted, V, &j->pen, j->prompt, j->n_prompt, j->gen, j->n_text_ids, e->counts);
        logits = e->adjusted;
    }
    if (j->mask && j->mask->mask(j->mask_state, e->adjusted, V, j->max_tokens - j->n_gen, j->stop_ids,
                                 j->n_stop_ids) == 0)
        return -1;
    return sample_next(&e->smp, &j->sp, logits, &j->rng);
}

/* A sampled token: record it, decide whether the job ends (mutex held). */
static void on_token(ServeEngine *e, ServeJob *j, int32_t tok, const float *logits) {
    if (tok < 0) { /* the mask allows nothing: the constrained document cannot go on */
        job_finish(e, j, update_text(e, j, 1) < 0 ? "abort" : "length");
        return;
    }
    const double t = now_s();
    hist_observe(j->n_gen == 0 ? &e->ttft : &e->itl, t - (j->n_gen == 0 ? j->t_submit : j->t_last));
    j->t_last = t;
    j->n_gen++;
    e->generation_tokens++;
    if (j->logprobs >= 0) record_logprobs(j, logits, e->m->cfg.vocab_size, tok);
    int stop = 0;
    for (int i = 0; i < j->n_stop_ids; i++) stop |= tok == j->stop_ids[i];
    if (!stop) {
        j->gen[j->n_text_ids++] = tok;
        const int done = j->mask && j->mask->accept(j->mask_state, tok); /* a complete constrained document */
        const int final = done || j->n_gen >= j->max_tokens || e->be.seq_len(e->be.ctx, j->slot) + 1 > e->o.max_context;
        int hit = update_text(e, j, final);
        if (hit < 0) {
            job_finish(e, j, "abort");
            return;
        }
        stop = hit || done;
    } else if (update_text(e, j, 1) < 0) {
        job_finish(e, j, "abort");
        return;
    }
    if (stop) {
        job_finish(e, j, "stop");
        return;
    }
    if (j->n_gen >= j->max_tokens || e->be.seq_len(e->be.ctx, j->slot) + 1 > e->o.max_context) {
        job_finish(e, j, "length");
        return;
    }
    j->next_token = tok;
    job_wake(j);
}

/* A prompt is in the cache and `logits` are its last row's: its waiting choices fork the cache (the prompt's
 * log-probabilities too), then each samples its first token from these logits (mutex held). */
static void prompt_done(ServeEngine *e, ServeJob *j, const float *logits) {
    ServeJob *kids[e->o.max_batch > 0 ? e->o.max_batch : 1];
    int n = 0;
    while (j->n_kids) {
        ServeJob *c = j->kids[--j->n_kids];
        c->parent = NULL;
        if (e->be.fork(e->be.ctx, j->slot, c->slot)) { /* cannot happen: admit reserved its blocks */
            job_finish(e, c, "abort");
            continue;
        }
        c->n_fed = c->n_prompt;
        if (j->n_lp && c->lp_cap >= j->n_lp) { /* the prompt's entries (submit sized c->lp for them) */
            memcpy(c->lp, j->lp, sizeof *c->lp * j->n_lp);
            c->n_lp = j->n_lp;
        }
        kids[n++] = c;
    }
    kids[n++] = j;
    for (int i = 0; i < n; i++) {
        if (kids[i]->max_tokens == 0) {
            job_finish(e, kids[i], "length");
            continue;
        }
        job_wake(kids[i]); /* the prompt's log-probabilities are news already */
        on_token(e, kids[i], pick(e, kids[i], logits), logits);
    }
}

/* Admits the queue's head and its waiting choices together, or nothing: a slot each, the head the blocks for its
 * whole length, each choice those it will not share (the prompt's full blocks are the head's). */
static void admit(ServeEngine *e) {
    while (e->head && e->n_running + 1 + e->head->n_kids <= e->o.max_batch) {
        ServeJob *j = e->head;
        const int bt = e->o.block_tokens, group = 1 + j->n_kids;
        const int own = (j->need + bt - 1) / bt - j->n_prompt / bt;
        int slots[group], taken = 0;
        for (int s = 0; s < e->o.max_batch && taken < group; s++)
            if (!e->running[s]) slots[taken++] = s;
        /* the head starts from the cached blocks its prompt begins with (not an echo: it needs every row's logits) */
        const int reused = e->pc && !j->prompt_lp ? prefix_cache_attach(e->pc, slots[0], j->prompt, j->n_prompt - 1) : 0;
        int got = 0;
        while (got < group) {
            if (!e->be.reserve(e->be.ctx, slots[got], got == 0 ? j->need : own * bt)) got++;
            else if (!e->pc || !prefix_cache_evict(e->pc)) break; /* blocks no request holds go back first */
        }
        if (got < group) { /* FIFO: the head waits for blocks */
            if (reused && !got) e->be.seq_release(e->be.ctx, slots[0]);
            while (got > 0) e->be.seq_release(e->be.ctx, slots[--got]);
            return;
        }
        if (e->pc && !j->prompt_lp) prefix_cache_count(e->pc, reused);
        j->n_fed = reused;
        e->head = j->next;
        if (!e->head) e->tail = NULL;
        for (int i = 0; i < group; i++) {
            ServeJob *q = i == 0 ? j : j->kids[i - 1];
            if (i > 0 || !reused) e->be.seq_reset(e->be.ctx, slots[i]);
            q->state = JOB_RUNNING;
            q->slot = slots[i];
            e->running[slots[i]] = q;
        }
        e->n_running += group;
        e->n_queued -= group;
    }
}

static void drop_cancelled(ServeEngine *e) {
    for (ServeJob **p = &e->head; *p;) {
        ServeJob *j = *p;
        for (int k = 0; k < j->n_kids;) { /* job_finish takes a choice off the list */
            if (j->kids[k]->cancelled || e->stopping) job_finish(e, j->kids[k], "abort");
            else k++;
        }
        if (!j->cancelled && !e->stopping) {
            p = &j->next;
            continue;
        }
        *p = j->next;
        job_finish(e, j, "abort");
    }
    e->tail = NULL;
    for (ServeJob *j = e->head; j; j = j->next) e->tail = j;
    for (int s = 0; s < e->o.max_batch; s++)
        if (e->running[s] && e->running[s]->cancelled) job_finish(e, e->running[s], "abort");
}

/* Lays out the next step: every decoding sequence's next token first, then prompt chunks while rows are left. A
 * prompt whose log-probabilities are wanted asks for every row's logits (one row at a time on a backend without
 * that), within the logits buffer's spare rows. Returns the sequences. */
static int plan_step(ServeEngine *e) {
    int n = 0, rows = 0, lrow = 0, spare = e->o.prefill_chunk; /* logits rows beyond one per sequence */
    for (int s = 0; s < e->o.max_batch; s++) {
        ServeJob *j = e->running[s];
        if (!j || j->parent || j->n_fed < j->n_prompt) continue;
        e->seqs[n] = (DecodeSeq){.slot = s, .n = 1, .logits = 1};
        e->logit_row[n] = lrow++;
        e->jobs[n++] = j;
        e->tokens[rows++] = j->next_token;
    }
    for (int s = 0; s < e->o.max_batch && rows < e->o.step_tokens; s++) {
        ServeJob *j = e->running[s];
        if (!j || j->parent || j->n_fed >= j->n_prompt) continue;
        int k = j->n_prompt - j->n_fed;
        k = k < e->o.prefill_chunk ? k : e->o.prefill_chunk;
        k = k < e->o.step_tokens - rows ? k : e->o.step_tokens - rows;
        int want = j->n_fed + k == j->n_prompt;
        if (j->prompt_lp) {
            if (!e->be.all_logits) k = 1;
            else if (k > spare + 1) k = spare + 1;
            spare -= k - 1;
            want = DECODE_LOGITS_ALL;
        }
        e->seqs[n] = (DecodeSeq){.slot = s, .n = k, .logits = want};
        e->logit_row[n] = lrow;
        lrow += want == DECODE_LOGITS_ALL ? k : 1;
        e->jobs[n++] = j;
        memcpy(e->tokens + rows, j->prompt + j->n_fed, sizeof(int32_t) * k);
        rows += k;
    }
    return n;
}

/* A step added n tokens to j's sequence: the blocks it filled join the prefix cache (mutex held). */
static void cache_new_blocks(ServeEngine *e, ServeJob *j, int n) {
    if (!e->pc) return;
    const int len = e->be.seq_len(e->be.ctx, j->slot), bt = e->o.block_tokens;
    if (len / bt > (len - n) / bt) prefix_cache_insert(e->pc, j->slot, j->prompt, j->n_prompt, j->gen, len);
}

/* Blocks a request could have now: the free ones and the cached ones no request holds (mutex held). */
static int blocks_available(ServeEngine *e) {
    return e->be.n_free(e->be.ctx) + (e->pc ? prefix_cache_stats(e->pc).idle : 0);
}

static void *engine_main(void *arg) {
    ServeEngine *e = arg;
    const int V = e->m->cfg.vocab_size;
    if (e->o.threads > 0) omp_set_num_threads(e->o.threads); /* this thread's teams (a new thread has the defaults) */
    pthread_mutex_lock(&e->mu);
    for (;;) {
        drop_cancelled(e);
        if (e->stopping && (e->n_running == 0 || now_s() >= e->deadline)) {
            for (int s = 0; s < e->o.max_batch; s++)
                if (e->running[s]) job_finish(e, e->running[s], "abort");
            break;
        }
        admit(e);
        const int n = e->n_running ? plan_step(e) : 0;
        if (n == 0) { /* nothing to run (or only choices waiting for a prompt: not possible without their parent) */
            pthread_cond_wait(&e->wake, &e->mu);
            continue;
        }
        e->last_batch = n;
        hist_observe(&e->batch, n);
        pthread_mutex_unlock(&e->mu);
        ZyErr err = {{0}};
        const double t0 = now_s();
        int rc = e->be.step(e->be.ctx, e->seqs, n, e->tokens, e->logits, &err);
        const double dt = now_s() - t0;
        pthread_mutex_lock(&e->mu);
        e->steps++;
        hist_observe(&e->step_s, dt);
        if (rc) { /* a bug or a bad id that slipped through: those requests end, the server goes on */
            fprintf(stderr, "zaya serve: step failed: %s\n", err.msg);
            e->step_errors++;
            for (int i = 0; i < n; i++) job_finish(e, e->jobs[i], "abort");
            continue;
        }
        for (int i = 0; i < n; i++) /* before any job ends and gives its blocks back */
            cache_new_blocks(e, e->jobs[i], e->seqs[i].n);
        for (int i = 0; i < n; i++) {
            ServeJob *j = e->jobs[i];
            const float *lg = e->logits + (size_t)e->logit_row[i] * V;
            if (j->n_fed < j->n_prompt) { /* a prompt chunk */
                const int from = j->n_fed, k = e->seqs[i].n;
                j->n_fed += k;
                e->prefill_tokens += (uint64_t)k;
                if (j->cancelled) continue;
                if (j->prompt_lp) { /* row r predicts prompt token from + r + 1 */
                    if (from == 0) record_logprobs(j, NULL, V, j->prompt[0]);
                    for (int r = 0; r < k && from + r + 1 < j->n_prompt; r++)
                        record_logprobs(j, lg + (size_t)r * V, V, j->prompt[from + r + 1]);
                    lg += (size_t)(k - 1) * V; /* the last row's */
                    job_wake(j);
                }
                if (j->n_fed == j->n_prompt) prompt_done(e, j, lg);
                continue;
            }
            if (!j->cancelled) on_token(e, j, pick(e, j, lg), lg);
        }
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

/* ---- set-up and the client side ------------------------------------------------------------------------------ */

/* The CPU backend: KVPool and model_decode_step. */
typedef struct {
    const Model *m;
    KVPool pool;
    PrefixCache pc; /* pc.blocks is NULL until asked for */
} CpuServe;
static int cpu_step(void *x, const DecodeSeq *seqs, int n_seqs, const int32_t *tokens, float *logits, ZyErr *err) {
    CpuServe *c = x;
    return model_decode_step(c->m, &c->pool, seqs, n_seqs, tokens, logits, err);
}
static int cpu_reserve(void *x, int slot, int tokens) { return kvpool_reserve(&((CpuServe *)x)->pool, slot, tokens); }
static void cpu_seq_reset(void *x, int slot) { kvpool_seq_reset(&((CpuServe *)x)->pool, slot); }
static void cpu_seq_release(void *x, int slot) { kvpool_seq_release(&((CpuServe *)x)->pool, slot); }
static int cpu_seq_len(void *x, int slot) { return ((CpuServe *)x)->pool.blocks.len[slot]; }
static int cpu_n_free(void *x) { return ((CpuServe *)x)->pool.blocks.n_free; }
static int cpu_fork(void *x, int parent, int child) { return kvpool_fork(&((CpuServe *)x)->pool, parent, child); }
static PrefixCache *cpu_prefix_cache(void *x, ZyErr *err) {
    CpuServe *c = x;
    if (!c->pc.blocks && prefix_cache_init_kvpool(&c->pc, &c->pool, err)) return NULL;
    return &c->pc;
}
static void cpu_destroy(void *x) {
    CpuServe *c = x;
    prefix_cache_free(&c->pc);
    kvpool_free(&c->pool);
    free(c);
}

static int cpu_open(ServeBackend *be, void *arg, const Model *m, int max_seqs, int max_len, int n_blocks,
                    int block_tokens, int max_rows, int chunk, int kv_bf16, ZyErr *err) {
    CpuServe *c = calloc(1, sizeof *c);
    if (!c) return zy_fail(err, "out of memory");
    c->m = m;
    if (kvpool_create(&c->pool, &m->cfg, max_seqs, max_len, n_blocks, block_tokens, max_rows, chunk, kv_bf16, err)) {
        free(c);
        return -1;
    }
    *be = (ServeBackend){.ctx = c, .step = cpu_step, .reserve = cpu_reserve, .seq_reset = cpu_seq_reset,
                         .seq_release = cpu_seq_release, .seq_len = cpu_seq_len, .n_free = cpu_n_free,
                         .destroy = cpu_destroy, .fork = cpu_fork, .all_logits = 1, .prefix_cache = cpu_prefix_cache};
    return 0;
}

int serve_engine_create(ServeEngine **out, const Model *m, const Tokenizer *tok, const ServeEngineOpts *opts,
                        ZyErr *err) {
    return serve_engine_create_with(out, m, tok, opts, cpu_open, NULL, err);
}

int serve_engine_create_with(ServeEngine **out, const Model *m, const Tokenizer *tok, const ServeEngineOpts *opts,
                             ServeBackendOpen open, void *arg, ZyErr *err) {
    *out = NULL;
    ServeEngineOpts o = *opts;
    const ZayaConfig *cfg = &m->cfg;
    if (o.max_batch <= 0 || o.max_batch > 4096) return zy_fail(err, "serve: --max-batch must be 1..4096 (got %d)", o.max_batch);
    if (o.max_context <= 1 || o.max_context > cfg->max_position_embeddings)
        return zy_fail(err, "serve: --max-context must be 2..%d, the model's max_position_embeddings (got %d)",
                       cfg->max_position_embeddings, o.max_context);
    if (o.block_tokens <= 0 || o.block_tokens > 4096)
        return zy_fail(err, "serve: --block-tokens must be 1..4096 (got %d)", o.block_tokens);
    if (o.prefill_chunk <= 0) return zy_fail(err, "serve: --prefill-chunk must be positive (got %d)", o.prefill_chunk);
    /* default: every running sequence's token plus a few prompt chunks, so a burst of new requests gets its first
     * tokens within a few steps */
    if (o.step_tokens <= 0) o.step_tokens = o.max_batch + 4 * o.prefill_chunk;
    if (o.step_tokens < o.max_batch) return zy_fail(err, "serve: --step-tokens must be at least --max-batch");
    if (o.max_queue < 0) return zy_fail(err, "serve: --max-queue must be >= 0 (got %d)", o.max_queue);
    if (o.threads < 0) return zy_fail(err, "serve: --threads must be >= 0 (got %d)", o.threads);
    if (o.prefill_chunk > o.max_context) o.prefill_chunk = o.max_context;
    /* with the prefix cache each block also keeps the CCA state at its end, and --kv-memory counts it */
    const size_t block_bytes = kvpool_block_bytes(cfg, o.block_tokens, o.kv_bf16) +
                               (o.no_prefix_cache ? 0 : kvpool_state_bytes(cfg));
    const int per_seq = (o.max_context + o.block_tokens - 1) / o.block_tokens;
    size_t n_blocks = o.kv_memory ? o.kv_memory / block_bytes : (size_t)per_seq * o.max_batch;
    if (n_blocks < (size_t)per_seq)
        return zy_fail(err, "serve: --kv-memory %zu bytes holds %zu blocks of %d tokens (%zu bytes each); one %d-token "
                       "sequence needs %d", o.kv_memory, n_blocks, o.block_tokens, block_bytes, o.max_context, per_seq);
    if (n_blocks > (size_t)1 << 30) n_blocks = (size_t)1 << 30;
    ServeEngine *e = calloc(1, sizeof *e);
    if (!e) return zy_fail(err, "out of memory");
    e->m = m;
    e->tok = tok;
    if (open(&e->be, arg, m, o.max_batch, o.max_context, (int)n_blocks, o.block_tokens, o.step_tokens,
             o.prefill_chunk, o.kv_bf16, err)) {
        free(e);
        return -1;
    }
    e->n_blocks = (int)n_blocks;
    if (!o.no_prefix_cache && e->be.prefix_cache && !(e->pc = e->be.prefix_cache(e->be.ctx, err))) {
        e->be.destroy(e->be.ctx);
        free(e);
        return -1;
    }
    o.no_prefix_cache = !e->pc;
    e->o = o;
    e->o.kv_memory = n_blocks * block_bytes;
    if (sampler_create(&e->smp, cfg->vocab_size, err)) {
        e->be.destroy(e->be.ctx);
        free(e);
        return -1;
    }
    e->smp.n_allowed = tokenizer_vocab_size(tok) < cfg->vocab_size ? tokenizer_vocab_size(tok) : cfg->vocab_size;
    e->logits = malloc(sizeof(float) * (size_t)(o.max_batch + o.prefill_chunk) * cfg->vocab_size);
    e->tokens = malloc(sizeof(int32_t) * o.step_tokens);
    e->seqs = malloc(sizeof *e->seqs * o.max_batch);
    e->jobs = malloc(sizeof *e->jobs * o.max_batch);
    e->logit_row = malloc(sizeof *e->logit_row * o.max_batch);
    e->adjusted = malloc(sizeof(float) * cfg->vocab_size);
    e->counts = calloc(cfg->vocab_size, sizeof *e->counts);
    e->running = calloc(o.max_batch, sizeof *e->running);
    static const double ttft_le[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
    static const double itl_le[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5};
    static const double batch_le[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};
    hist_init(&e->ttft, ttft_le, ZY_ARRAY_LEN(ttft_le));
    hist_init(&e->itl, itl_le, ZY_ARRAY_LEN(itl_le));
    hist_init(&e->batch, batch_le, ZY_ARRAY_LEN(batch_le));
    hist_init(&e->step_s, itl_le, ZY_ARRAY_LEN(itl_le));
    pthread_mutex_init(&e->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&e->wake, &ca);
    pthread_condattr_destroy(&ca);
    if (!e->logits || !e->tokens || !e->seqs || !e->jobs || !e->logit_row || !e->adjusted || !e->counts || !e->running) {
        serve_engine_free(e);
        return zy_fail(err, "out of memory");
    }
    if (pthread_create(&e->thread, NULL, engine_main, e)) {
        serve_engine_free(e);
        return zy_fail(err, "serve: cannot start the engine thread");
    }
    e->thread_started = 1;
    *out = e;
    return 0;
}

void serve_engine_shutdown(ServeEngine *e, double grace_s) {
    if (!e || e->shut) return;
    e->shut = 1;
    pthread_mutex_lock(&e->mu);
    e->stopping = 1;
    e->deadline = now_s() + (grace_s > 0 ? grace_s : 0);
    pthread_cond_broadcast(&e->wake);
    pthread_mutex_unlock(&e->mu);
    if (e->thread_started) pthread_join(e->thread, NULL);
    e->thread_started = 0;
}

void serve_engine_free(ServeEngine *e) {
    if (!e) return;
    serve_engine_shutdown(e, 0);
    free(e->logits);
    free(e->tokens);
    free(e->seqs);
    free(e->jobs);
    free(e->logit_row);
    free(e->adjusted);
    free(e->counts);
    free(e->running);
    sampler_free(&e->smp);
    e->be.destroy(e->be.ctx);
    pthread_cond_destroy(&e->wake);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

void serve_engine_info(const ServeEngine *e, ServeEngineOpts *opts, int *n_blocks, size_t *block_bytes) {
    if (opts) *opts = e->o;
    if (n_blocks) *n_blocks = e->n_blocks;
    if (block_bytes)
        *block_bytes = kvpool_block_bytes(&e->m->cfg, e->o.block_tokens, e->o.kv_bf16) +
                       (e->pc ? kvpool_state_bytes(&e->m->cfg) : 0);
}

/* One choice of a request, with its own copies of what it reads; NULL when memory runs out. */
static ServeJob *job_new(ServeEngine *e, const ServeJobSpec *sp, int choice) {
    ServeJob *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&j->cv, &ca);
    pthread_condattr_destroy(&ca);
    const long need = (long)sp->n_prompt + (sp->max_tokens > 0 ? sp->max_tokens - 1 : 0); /* the last is never fed */
    j->need = need < e->o.max_context ? (int)need : e->o.max_context;
    j->n_prompt = sp->n_prompt;
    j->max_tokens = sp->max_tokens;
    j->sp = sp->sampling;
    j->pen = sp->penalties;
    zy_rng_seed(&j->rng, sp->seed + (uint64_t)choice);
    j->logprobs = sp->logprobs > SERVE_MAX_TOP_LOGPROBS ? SERVE_MAX_TOP_LOGPROBS : sp->logprobs;
    j->prompt_lp = sp->prompt_logprobs && sp->logprobs >= 0;
    j->include_stop_str = sp->include_stop_str;
    j->skip_special = sp->skip_special;
    j->mask = sp->mask;
    j->prompt = malloc(sizeof(int32_t) * sp->n_prompt);
    j->gen_cap = sp->max_tokens < e->o.max_context ? sp->max_tokens : e->o.max_context;
    j->gen = malloc(sizeof(int32_t) * (j->gen_cap + 1));
    j->stop_ids = malloc(sizeof(int32_t) * (sp->n_stop_ids + 1));
    j->stop = calloc(sp->n_stop + 1, sizeof *j->stop);
    j->bias_ids = malloc(sizeof(int32_t) * (sp->penalties.n_bias + 1));
    j->bias = malloc(sizeof(float) * (sp->penalties.n_bias + 1));
    if (j->prompt_lp) { /* the prompt's entries, allocated now: a choice copies its parent's */
        j->lp_cap = sp->n_prompt + 16;
        j->lp = malloc(sizeof *j->lp * j->lp_cap);
    }
    if (sp->mask) j->mask_state = sp->mask->open(sp->mask_arg);
    int ok = j->prompt && j->gen && j->stop_ids && j->stop && j->bias_ids && j->bias && (!j->prompt_lp || j->lp) &&
             (!sp->mask || j->mask_state);
    for (int i = 0; ok && i < sp->n_stop; i++) {
        ok = (j->stop[i] = strdup(sp->stop[i])) != NULL;
        j->n_stop += ok;
        size_t l = strlen(sp->stop[i]);
        if (l > j->max_stop) j->max_stop = l;
    }
    if (!ok) {
        job_free(j);
        return NULL;
    }
    memcpy(j->prompt, sp->prompt, sizeof(int32_t) * sp->n_prompt);
    if (sp->n_stop_ids) memcpy(j->stop_ids, sp->stop_ids, sizeof(int32_t) * sp->n_stop_ids);
    j->n_stop_ids = sp->n_stop_ids;
    if (sp->penalties.n_bias) {
        memcpy(j->bias_ids, sp->penalties.bias_ids, sizeof(int32_t) * sp->penalties.n_bias);
        memcpy(j->bias, sp->penalties.bias, sizeof(float) * sp->penalties.n_bias);
    }
    j->pen.bias_ids = j->bias_ids;
    j->pen.bias = j->bias;
    j->refs = 2;
    j->eng = e;
    j->state = JOB_QUEUED;
    j->t_submit = now_s();
    return j;
}

int serve_engine_submit(ServeEngine *e, const ServeJobSpec *sp, ServeJob **out, ServeError *err) {
    const int n = sp->n > 0 ? sp->n : 1;
    for (int c = 0; c < n; c++) out[c] = NULL;
    if (sp->n_prompt <= 0) return serve_error(err, 400, "invalid_request_error", "prompt", "the prompt is empty");
    if (sp->n_prompt > e->o.max_context || (sp->n_prompt == e->o.max_context && sp->max_tokens > 0)) {
        pthread_mutex_lock(&e->mu);
        e->rejected_too_long++;
        pthread_mutex_unlock(&e->mu);
        serve_error(err, 400, "invalid_request_error", "prompt",
                    "This model's maximum context length is %d tokens. However, your prompt has %d tokens, which "
                    "leaves no room for the completion.", e->o.max_context, sp->n_prompt);
        snprintf(err->code, sizeof err->code, "context_length_exceeded");
        return -1;
    }
    for (int i = 0; i < sp->n_prompt; i++)
        if (sp->prompt[i] < 0 || sp->prompt[i] >= e->m->cfg.vocab_size)
            return serve_error(err, 400, "invalid_request_error", "prompt",
                               "token id %d at prompt position %d is outside the vocabulary [0, %d)", sp->prompt[i], i,
                               e->m->cfg.vocab_size);
    if (sp->max_tokens < 0 || (sp->max_tokens == 0 && !(sp->prompt_logprobs && sp->logprobs >= 0)))
        return serve_error(err, 400, "invalid_request_error", "max_tokens", "'max_tokens' must be >= 1");
    if (n > e->o.max_batch)
        return serve_error(err, 400, "invalid_request_error", "n", "'n' is %d; this server runs at most %d sequences "
                           "at once (--max-batch), and a prompt's choices run together", n, e->o.max_batch);
    for (int c = 0; c < n; c++)
        if (!(out[c] = job_new(e, sp, c))) {
            while (c > 0) job_free(out[--c]);
            return serve_error(err, 500, "server_error", "", "out of memory");
        }
    /* the choices share the prompt's blocks when the backend forks; else each is a request of its own */
    const int share = n > 1 && e->be.fork;
    ServeJob *head = out[0];
    if (share && !(head->kids = malloc(sizeof *head->kids * (n - 1)))) {
        for (int c = 0; c < n; c++) job_free(out[c]);
        return serve_error(err, 500, "server_error", "", "out of memory");
    }
    pthread_mutex_lock(&e->mu);
    int rc = 0;
    const int bt = e->o.block_tokens;
    const int blocks = (head->need + bt - 1) / bt, own = blocks - head->n_prompt / bt;
    const int need_blocks = share ? blocks + (n - 1) * own : n * blocks; /* <= the pool: one max_context sequence */
    if (e->stopping) {
        e->rejected_shutdown++;
        rc = serve_error(err, 503, "server_error", "", "the server is shutting down");
    } else if (e->n_queued + n > e->o.max_queue && (e->head || e->n_running + n > e->o.max_batch ||
                                                    need_blocks > blocks_available(e))) {
        e->rejected_full++;
        rc = serve_error(err, 503, "server_error", "", "the server is at capacity (%d running, %d waiting); retry "
                         "later", e->n_running, e->n_queued);
    }
    if (rc) {
        pthread_mutex_unlock(&e->mu);
        for (int c = 0; c < n; c++) job_free(out[c]), out[c] = NULL;
        return -1;
    }
    for (int c = 0; c < n; c++) {
        ServeJob *j = out[c];
        if ((j->wake = c == 0 ? sp->wake : sp->wake ? sp->wake : head)) j->wake->refs++;
        if (share && c > 0) {
            j->parent = head;
            head->kids[head->n_kids++] = j;
            continue;
        }
        if (e->tail) e->tail->next = j;
        else e->head = j;
        e->tail = j;
    }
    e->n_queued += n;
    e->prompt_tokens += (uint64_t)sp->n_prompt * (share ? 1 : n);
    pthread_cond_broadcast(&e->wake);
    pthread_mutex_unlock(&e->mu);
    return 0;
}

static int has_news(const ServeJob *j) {
    return j->ready > j->taken || j->n_lp > j->lp_taken || (j->finished && !j->finish_taken);
}

static pthread_mutex_t *job_mutex(ServeJob *j) { return &j->eng->mu; }

static int any_news(ServeJob *const *jobs, int n) {
    for (int i = 0; i < n; i++)
        if (has_news(jobs[i])) return 1;
    return 0;
}

int serve_jobs_wait(ServeJob *const *jobs, int n, int timeout_ms) {
    pthread_mutex_t *mu = job_mutex(jobs[0]);
    struct timespec ts;
    abs_deadline(&ts, timeout_ms);
    pthread_mutex_lock(mu);
    int rc = 0;
    while (!(rc = any_news(jobs, n)))
        if (pthread_cond_timedwait(&jobs[0]->cv, mu, &ts) == ETIMEDOUT) {
            rc = any_news(jobs, n);
            break;
        }
    pthread_mutex_unlock(mu);
    return rc;
}

int serve_job_wait(ServeJob *j, int timeout_ms) { return serve_jobs_wait(&j, 1, timeout_ms); }

int serve_job_take(ServeJob *j, ServeDelta *d) {
    pthread_mutex_t *mu = job_mutex(j);
    memset(d, 0, sizeof *d);
    pthread_mutex_lock(mu);
    int rc = 0;
    if (j->ready > j->taken) { /* already repaired UTF-8 (update_text) */
        d->len = j->ready - j->taken;
        if (!(d->text = malloc(d->len + 1))) {
            rc = -1;
        } else {
            memcpy(d->text, j->text + j->taken, d->len);
            d->text[d->len] = 0;
            j->taken = j->ready;
        }
    }
    if (rc == 0 && j->n_lp > j->lp_taken) {
        const int k = j->n_lp - j->lp_taken;
        if ((d->logprobs = malloc(sizeof *d->logprobs * k))) {
            memcpy(d->logprobs, j->lp + j->lp_taken, sizeof *d->logprobs * k);
            d->n_logprobs = k;
            j->lp_taken = j->n_lp;
        } else
            rc = -1;
    }
    d->first = !j->first_taken && (d->len || d->n_logprobs || j->finished);
    if (d->first) j->first_taken = 1;
    d->prompt_tokens = j->n_prompt;
    d->completion_tokens = j->n_gen;
    if (j->finished && j->ready == j->taken && j->n_lp == j->lp_taken) {
        d->finished = 1;
        d->finish = j->finish;
        j->finish_taken = 1;
    }
    pthread_mutex_unlock(mu);
    return rc;
}

void serve_delta_free(ServeDelta *d) {
    free(d->text);
    free(d->logprobs);
    memset(d, 0, sizeof *d);
}

void serve_job_cancel(ServeJob *j) {
    ServeEngine *e = j->eng;
    pthread_mutex_lock(&e->mu);
    if (!j->finished) {
        j->cancelled = 1;
        pthread_cond_broadcast(&e->wake);
    }
    pthread_mutex_unlock(&e->mu);
}

void serve_job_release(ServeJob *j) {
    if (!j) return;
    ServeEngine *e = j->eng;
    pthread_mutex_lock(&e->mu);
    if (!j->finished) { /* a caller walking away cancels */
        j->cancelled = 1;
        pthread_cond_broadcast(&e->wake);
    }
    job_unref(j);
    pthread_mutex_unlock(&e->mu);
}

void serve_engine_load(ServeEngine *e, int *running, int *queued, int *blocks_used) {
    pthread_mutex_lock(&e->mu);
    if (running) *running = e->n_running;
    if (queued) *queued = e->n_queued;
    if (blocks_used) *blocks_used = e->n_blocks - blocks_available(e);
    pthread_mutex_unlock(&e->mu);
}

/* ---- /metrics --------------------------------------------------------------------------------------------------- */

typedef struct {
    char *s;
    size_t n, cap;
    int oom;
} Out;

static void outf(Out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void outf(Out *o, const char *fmt, ...) {
    if (o->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(o->s + o->n, o->cap - o->n, fmt, ap);
        va_end(ap);
        if (k < 0) {
            o->oom = 1;
            return;
        }
        if ((size_t)k < o->cap - o->n) {
            o->n += k;
            return;
        }
        size_t cap = 2 * o->cap + k + 1;
        char *g = realloc(o->s, cap);
        if (!g) {
            o->oom = 1;
            return;
        }
        o->s = g;
        o->cap = cap;
    }
}

static void metric(Out *o, const char *name, const char *type, const char *help, double v) {
    outf(o, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

static void hist_out(Out *o, const char *name, const char *help, const Hist *h) {
    outf(o, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < h->n; i++) {
        cum += h->count[i];
        outf(o, "%s_bucket{le=\"%g\"} %llu\n", name, h->le[i], (unsigned long long)cum);
    }
    outf(o, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.17g\n%s_count %llu\n", name, (unsigned long long)h->total, name,
         h->sum, name, (unsigned long long)h->total);
}

char *serve_engine_metrics(ServeEngine *e) {
    Out o = {.s = malloc(4096), .cap = 4096};
    if (!o.s) return NULL;
    o.s[0] = 0;
    pthread_mutex_lock(&e->mu);
    const int used = e->n_blocks - blocks_available(e);
    const PrefixCacheStats pcs = e->pc ? prefix_cache_stats(e->pc) : (PrefixCacheStats){0};
    metric(&o, "zaya_requests_running", "gauge", "Requests in the running batch.", e->n_running);
    metric(&o, "zaya_requests_waiting", "gauge", "Requests queued for a slot or KV blocks.", e->n_queued);
    metric(&o, "zaya_batch_size", "gauge", "Sequences in the last decoding step.", e->last_batch);
    metric(&o, "zaya_kv_blocks_total", "gauge", "KV-cache blocks in the pool.", e->n_blocks);
    metric(&o, "zaya_kv_blocks_used", "gauge", "KV-cache blocks held by running requests.", used);
    metric(&o, "zaya_prefix_cache_blocks", "gauge", "KV-cache blocks kept by the prefix cache (some also held by "
           "running requests).", pcs.cached);
    metric(&o, "zaya_kv_cache_usage_ratio", "gauge", "Fraction of the KV-cache pool in use.",
           (double)used / e->n_blocks);
    metric(&o, "zaya_kv_block_tokens", "gauge", "Tokens per KV-cache block.", e->o.block_tokens);
    metric(&o, "zaya_prompt_tokens_total", "counter", "Prompt tokens of accepted requests.", (double)e->prompt_tokens);
    metric(&o, "zaya_prefill_tokens_total", "counter", "Prompt tokens computed (not taken from the prefix cache).",
           (double)e->prefill_tokens);
    metric(&o, "zaya_prefix_cache_queries_total", "counter", "Prompts looked up in the prefix cache.",
           (double)pcs.queries);
    metric(&o, "zaya_prefix_cache_hits_total", "counter", "Prompts that reused cached KV blocks.", (double)pcs.hits);
    metric(&o, "zaya_prefix_cache_hit_tokens_total", "counter", "Prompt tokens taken from the prefix cache.",
           (double)pcs.hit_tokens);
    metric(&o, "zaya_prefix_cache_evictions_total", "counter", "Cached KV blocks given back to the pool.",
           (double)pcs.evictions);
    metric(&o, "zaya_generation_tokens_total", "counter", "Tokens generated.", (double)e->generation_tokens);
    metric(&o, "zaya_steps_total", "counter", "Decoding steps run.", (double)e->steps);
    metric(&o, "zaya_step_errors_total", "counter", "Decoding steps that failed.", (double)e->step_errors);
    outf(&o, "# HELP zaya_requests_finished_total Requests ended, by reason.\n# TYPE zaya_requests_finished_total counter\n");
    outf(&o, "zaya_requests_finished_total{reason=\"stop\"} %llu\n", (unsigned long long)e->finished_stop);
    outf(&o, "zaya_requests_finished_total{reason=\"length\"} %llu\n", (unsigned long long)e->finished_length);
    outf(&o, "zaya_requests_finished_total{reason=\"abort\"} %llu\n", (unsigned long long)e->finished_abort);
    outf(&o, "# HELP zaya_requests_rejected_total Requests refused at submission, by reason.\n"
             "# TYPE zaya_requests_rejected_total counter\n");
    outf(&o, "zaya_requests_rejected_total{reason=\"queue_full\"} %llu\n", (unsigned long long)e->rejected_full);
    outf(&o, "zaya_requests_rejected_total{reason=\"too_long\"} %llu\n", (unsigned long long)e->rejected_too_long);
    outf(&o, "zaya_requests_rejected_total{reason=\"shutting_down\"} %llu\n", (unsigned long long)e->rejected_shutdown);
    hist_out(&o, "zaya_time_to_first_token_seconds", "From submission to the first generated token.", &e->ttft);
    hist_out(&o, "zaya_inter_token_latency_seconds", "Between consecutive tokens of one request.", &e->itl);
    hist_out(&o, "zaya_step_seconds", "Time of one decoding step.", &e->step_s);
    hist_out(&o, "zaya_step_batch_size", "Sequences per decoding step.", &e->batch);
    pthread_mutex_unlock(&e->mu);
    if (o.oom) {
        free(o.s);
        return NULL;
    }
    return o.s;
}

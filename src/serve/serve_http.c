/* The HTTP front (see serve_http.h). Each connection has its own thread (libmicrohttpd's thread-per-connection
 * mode): a request is parsed, tokenized and submitted there, then the thread either waits for the whole answer or
 * streams it chunk by chunk, checking the socket for a hang-up while it waits so that a client that goes away stops
 * its generation within one step. */
#include "serve/serve_http.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "jinja/jinja.h"
#include "serve/reason.h"
#include "serve/serve_request.h"
#include "serve/serve_structured.h"

#define MAX_BODY ((size_t)32 << 20)
#define WAIT_MS 50 /* how often a waiting thread looks at its socket */

/* HTTP responses by route and status for /metrics. */
enum { R_COMPLETIONS, R_CHAT, R_TOKENIZE, R_DETOKENIZE, R_MODELS, R_HEALTH, R_METRICS, R_MODEL, R_OTHER, N_ROUTES };
static const char *const ROUTE_NAMES[N_ROUTES] = {"/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize",
                                                  "/v1/models", "/health", "/metrics", "/v1/models/{id}", "other"};
enum { S_2XX, S_4XX, S_5XX, N_CLASSES };

struct ServeHttp {
    ServeEngine *eng;
    ServeHttpOpts o;
    ServeStructured *structured; /* response_format's vocabulary */
    char *model_name, *api_key;
    struct MHD_Daemon *d;
    int port;
    pthread_mutex_t mu;
    uint64_t next_id;
    uint64_t responses[N_ROUTES][N_CLASSES];
    uint64_t disconnects;
    int draining;        /* shutting down: new connections are still accepted, and answered 503 */
    int active;          /* requests begun and not yet completed (their last byte handed to the socket, or dropped) */
    pthread_cond_t idle; /* signalled when active falls to 0 */
    time_t started;
};

/* One choice of an answer (prompt p's j-th of n has index p n + j) and what it has said so far. */
typedef struct {
    ServeJob *job;
    int prompt;
    char *text;          /* the whole text (not streamed) */
    size_t len, cap;
    cJSON *lp;           /* its logprobs (not streamed) */
    long text_chars;     /* characters of the token texts so far: the next text_offset */
    int sent_first, done;
    const char *finish;
    int completion_tokens;
    ToolParser *tools;   /* chat with tools: the calls parsed out of its text (NULL: none) */
} Choice;

typedef struct {
    ServeHttp *h;
    int route;
    char *body;
    size_t len, cap;
    int too_big;
    /* a generation */
    ServeKind kind;
    Choice *ch;
    ServeJob **jobs;     /* the choices' jobs, for serve_jobs_wait */
    int n_ch;
    char **echo;         /* per prompt: its text, put before each of its choices' (echo) */
    int n_prompts, prompt_tokens; /* prompt_tokens: of all prompts, for usage */
    int stream, include_usage, logprobs;
    char id[48];
    long created;
    int fd;
    /* streaming state */
    char *out;
    size_t out_len, out_off, out_cap;
    int ended;
    int refs; /* the connection and the streaming response each hold one */
} Conn;

static void conn_unref(Conn *c) {
    if (__atomic_sub_fetch(&c->refs, 1, __ATOMIC_ACQ_REL) > 0) return;
    for (int i = 0; i < c->n_ch; i++) {
        serve_job_release(c->ch[i].job);
        free(c->ch[i].text);
        cJSON_Delete(c->ch[i].lp);
        tool_parser_free(c->ch[i].tools);
    }
    for (int p = 0; c->echo && p < c->n_prompts; p++) free(c->echo[p]);
    free(c->echo);
    free(c->ch);
    free(c->jobs);
    free(c->body);
    free(c->out);
    free(c);
}

static void count_response(ServeHttp *h, int route, int status) {
    pthread_mutex_lock(&h->mu);
    h->responses[route][status < 400 ? S_2XX : status < 500 ? S_4XX : S_5XX]++;
    pthread_mutex_unlock(&h->mu);
}

static enum MHD_Result send_text(struct MHD_Connection *conn, Conn *c, int status, const char *type, const char *text,
                                 size_t len, int retry_after) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)text, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    if (retry_after) MHD_add_response_header(r, "Retry-After", "1");
    pthread_mutex_lock(&c->h->mu);
    if (c->h->draining) MHD_add_response_header(r, "Connection", "close"); /* shutting down: no keep-alive */
    pthread_mutex_unlock(&c->h->mu);
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    enum MHD_Result rc = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    count_response(c->h, c->route, status);
    return rc;
}

static enum MHD_Result send_json(struct MHD_Connection *conn, Conn *c, int status, cJSON *obj, int retry_after) {
    char *s = obj ? cJSON_PrintUnformatted(obj) : NULL;
    cJSON_Delete(obj);
    if (!s) return send_text(conn, c, 500, "text/plain", "out of memory\n", 14, 0);
    enum MHD_Result rc = send_text(conn, c, status, "application/json", s, strlen(s), retry_after);
    free(s);
    return rc;
}

static cJSON *error_body(const ServeError *e) {
    cJSON *root = cJSON_CreateObject(), *err = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(err, "message", e->message);
    cJSON_AddStringToObject(err, "type", e->type);
    if (e->param[0]) cJSON_AddStringToObject(err, "param", e->param);
    else cJSON_AddNullToObject(err, "param");
    if (e->code[0]) cJSON_AddStringToObject(err, "code", e->code);
    else cJSON_AddNullToObject(err, "code");
    return root;
}

static enum MHD_Result send_error(struct MHD_Connection *conn, Conn *c, const ServeError *e) {
    return send_json(conn, c, e->status, error_body(e), e->status == 503);
}

/* ---- one generation --------------------------------------------------------------------------------------------- */

/* Has the client hung up? (Only a hang-up or an error: data it sends ahead on a kept-alive connection is not.) */
static int client_gone(int fd) {
    if (fd < 0) return 0;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

static long utf8_chars(const char *s, size_t n) {
    long k = 0;
    for (size_t i = 0; i < n; i++) k += ((unsigned char)s[i] & 0xC0) != 0x80;
    return k;
}

/* One token's text for logprobs (valid UTF-8: an incomplete byte becomes U+FFFD as in OpenAI's responses). */
static char *token_text(const ServeHttp *h, int32_t id, size_t *len) {
    char *b = NULL;
    size_t n = 0;
    ZyErr err = {{0}};
    if (tokenizer_decode_ex(h->o.tok, &id, 1, TOK_DECODE_LOSSY, &b, &n, &err)) {
        b = strdup("");
        n = 0;
    }
    *len = n;
    return b;
}

/* Adds one delta's logprobs to `into` (completions: the four parallel lists; chat: content entries). A prompt's first
 * token (NAN) has null for its logprob and top_logprobs, as vLLM and OpenAI's legacy echo give it. */
static void add_logprobs(Conn *c, Choice *ch, cJSON *into, const ServeDelta *d) {
    const ServeHttp *h = c->h;
    if (c->kind == SERVE_COMPLETION) {
        cJSON *toks = cJSON_GetObjectItem(into, "tokens"), *lps = cJSON_GetObjectItem(into, "token_logprobs");
        cJSON *tops = cJSON_GetObjectItem(into, "top_logprobs"), *offs = cJSON_GetObjectItem(into, "text_offset");
        for (int i = 0; i < d->n_logprobs; i++) {
            const ServeLogprob *p = &d->logprobs[i];
            size_t n;
            char *t = token_text(h, p->token, &n);
            cJSON_AddItemToArray(toks, cJSON_CreateString(t ? t : ""));
            if (isnan(p->logprob)) {
                cJSON_AddItemToArray(lps, cJSON_CreateNull());
                cJSON_AddItemToArray(tops, cJSON_CreateNull());
            } else {
                cJSON_AddItemToArray(lps, cJSON_CreateNumber(p->logprob));
                cJSON *top = cJSON_CreateObject();
                for (int k = 0; k < p->n_top; k++) {
                    size_t m;
                    char *tt = token_text(h, p->top[k], &m);
                    if (tt && !cJSON_GetObjectItemCaseSensitive(top, tt))
                        cJSON_AddNumberToObject(top, tt, p->top_logprob[k]);
                    free(tt);
                }
                cJSON_AddItemToArray(tops, top);
            }
            cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)ch->text_chars));
            ch->text_chars += t ? utf8_chars(t, n) : 0;
            free(t);
        }
        return;
    }
    cJSON *content = cJSON_GetObjectItem(into, "content");
    for (int i = 0; i < d->n_logprobs; i++) {
        const ServeLogprob *p = &d->logprobs[i];
        for (int k = -1; k < p->n_top; k++) {
            const int32_t id = k < 0 ? p->token : p->top[k];
            size_t n;
            char *t = token_text(h, id, &n);
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "token", t ? t : "");
            cJSON_AddNumberToObject(e, "logprob", k < 0 ? p->logprob : p->top_logprob[k]);
            cJSON *bytes = cJSON_AddArrayToObject(e, "bytes");
            for (size_t b = 0; t && b < n; b++) cJSON_AddItemToArray(bytes, cJSON_CreateNumber((unsigned char)t[b]));
            free(t);
            if (k < 0) {
                cJSON_AddArrayToObject(e, "top_logprobs");
                cJSON_AddItemToArray(content, e);
            } else {
                cJSON *last = cJSON_GetArrayItem(content, cJSON_GetArraySize(content) - 1);
                cJSON_AddItemToArray(cJSON_GetObjectItem(last, "top_logprobs"), e);
            }
        }
    }
}

static cJSON *new_logprobs(ServeKind kind) {
    cJSON *o = cJSON_CreateObject();
    if (kind == SERVE_COMPLETION) {
        cJSON_AddArrayToObject(o, "tokens");
        cJSON_AddArrayToObject(o, "token_logprobs");
        cJSON_AddArrayToObject(o, "top_logprobs");
        cJSON_AddArrayToObject(o, "text_offset");
    } else {
        cJSON_AddArrayToObject(o, "content");
    }
    return o;
}

static cJSON *usage(int prompt, int completion) {
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", completion);
    cJSON_AddNumberToObject(u, "total_tokens", prompt + completion);
    return u;
}

static cJSON *conn_usage(const Conn *c) {
    int completion = 0;
    for (int i = 0; i < c->n_ch; i++) completion += c->ch[i].completion_tokens;
    return usage(c->prompt_tokens, completion);
}

static cJSON *response_head(Conn *c, const char *object) {
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "id", c->id);
    cJSON_AddStringToObject(r, "object", object);
    cJSON_AddNumberToObject(r, "created", (double)c->created);
    cJSON_AddStringToObject(r, "model", c->h->model_name);
    return r;
}

/* The client went away: stop every choice's generation (their blocks free within a step). */
static void conn_abandon(Conn *c) {
    pthread_mutex_lock(&c->h->mu);
    c->h->disconnects++;
    pthread_mutex_unlock(&c->h->mu);
    for (int i = 0; i < c->n_ch; i++) serve_job_cancel(c->ch[i].job);
    c->ended = 1;
}

/* Appends bytes to a choice's text; -1 when memory runs out. */
static int choice_append(Choice *ch, const char *s, size_t n) {
    return zy_str_append(&ch->text, &ch->len, &ch->cap, s, n);
}

/* A choice's finish reason: "tool_calls" once it has called a tool (unless cancelled), as OpenAI and vLLM say. */
static const char *finish_reason(const Choice *ch, const char *finish) {
    if (!finish) return "abort";
    return ch->tools && tool_parser_calls(ch->tools) > 0 && strcmp(finish, "abort") != 0 ? "tool_calls" : finish;
}

/* A whole chat answer with tools: its text parsed into content (null when none) and tool_calls. */
static int tool_message(Choice *ch, cJSON *msg) {
    ToolEvents ev = {0};
    Choice text = {0};
    cJSON *calls = cJSON_CreateArray();
    int rc = tool_parser_feed(ch->tools, ch->text ? ch->text : "", ch->len, 1, &ev) || !calls;
    for (int k = 0; !rc && k < ev.n; k++)
        if (ev.ev[k].is_call) cJSON_AddItemToArray(calls, tool_call_json(&ev.ev[k].call, ev.ev[k].index, TOOL_JSON_WHOLE));
        else rc = choice_append(&text, ev.ev[k].text, ev.ev[k].len);
    if (text.len) cJSON_AddStringToObject(msg, "content", text.text);
    else cJSON_AddNullToObject(msg, "content");
    if (cJSON_GetArraySize(calls) > 0) cJSON_AddItemToObject(msg, "tool_calls", calls);
    else cJSON_Delete(calls);
    free(text.text);
    tool_events_free(&ev);
    return rc;
}

/* Waits for every choice to end, then sends them as one JSON object. */
static enum MHD_Result answer_whole(struct MHD_Connection *conn, Conn *c) {
    int left = c->n_ch, failed = 0;
    for (int i = 0; i < c->n_ch; i++) {
        Choice *ch = &c->ch[i];
        if (c->echo) failed |= choice_append(ch, c->echo[ch->prompt], strlen(c->echo[ch->prompt]));
        if (c->logprobs >= 0) ch->lp = new_logprobs(c->kind);
    }
    while (left > 0 && !failed) {
        if (!serve_jobs_wait(c->jobs, c->n_ch, WAIT_MS)) {
            if (client_gone(c->fd)) { /* nobody to answer: stop the generations, free their blocks */
                conn_abandon(c);
                return MHD_NO;
            }
            continue;
        }
        for (int i = 0; i < c->n_ch && !failed; i++) {
            Choice *ch = &c->ch[i];
            ServeDelta d;
            if (ch->done) continue;
            if (serve_job_take(ch->job, &d)) {
                failed = 1;
                break;
            }
            if (d.len) failed |= choice_append(ch, d.text, d.len);
            if (ch->lp) add_logprobs(c, ch, ch->lp, &d);
            ch->completion_tokens = d.completion_tokens;
            if (d.finished) {
                ch->done = 1;
                ch->finish = d.finish;
                left--;
            }
            serve_delta_free(&d);
        }
    }
    if (failed) {
        ServeError e;
        serve_error(&e, 500, "server_error", "", "out of memory");
        return send_error(conn, c, &e);
    }
    cJSON *r = response_head(c, c->kind == SERVE_CHAT ? "chat.completion" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(r, "choices");
    for (int i = 0; i < c->n_ch; i++) {
        Choice *ch = &c->ch[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddItemToArray(choices, o);
        cJSON_AddNumberToObject(o, "index", i);
        if (c->kind == SERVE_CHAT) {
            cJSON *msg = cJSON_AddObjectToObject(o, "message");
            cJSON_AddStringToObject(msg, "role", "assistant");
            if (!ch->tools) cJSON_AddStringToObject(msg, "content", ch->text ? ch->text : "");
            else if (tool_message(ch, msg)) failed = 1;
        } else {
            cJSON_AddStringToObject(o, "text", ch->text ? ch->text : "");
        }
        if (ch->lp) cJSON_AddItemToObject(o, "logprobs", ch->lp);
        else cJSON_AddNullToObject(o, "logprobs");
        ch->lp = NULL;
        cJSON_AddStringToObject(o, "finish_reason", finish_reason(ch, ch->finish));
    }
    if (failed) {
        cJSON_Delete(r);
        ServeError e;
        serve_error(&e, 500, "server_error", "", "out of memory");
        return send_error(conn, c, &e);
    }
    cJSON_AddItemToObject(r, "usage", conn_usage(c));
    return send_json(conn, c, 200, r, 0);
}

int serve_sse_append(char **buf, size_t *len, size_t *cap, const char *payload) {
    static const char head[] = "data: ", tail[] = "\n\n";
    const size_t n = strlen(payload), need = *len + (sizeof head - 1) + n + (sizeof tail - 1);
    if (need > *cap) {
        char *g = realloc(*buf, need * 2);
        if (!g) return -1;
        *buf = g;
        *cap = need * 2;
    }
    memcpy(*buf + *len, head, sizeof head - 1);
    memcpy(*buf + *len + sizeof head - 1, payload, n);
    memcpy(*buf + *len + sizeof head - 1 + n, tail, sizeof tail - 1);
    *len = need;
    return 0;
}

/* Appends "data: <json>\n\n" to the connection's outgoing bytes. */
static int queue_event(Conn *c, cJSON *obj) {
    char *s = obj ? cJSON_PrintUnformatted(obj) : NULL;
    cJSON_Delete(obj);
    if (!s) return -1;
    const int rc = serve_sse_append(&c->out, &c->out_len, &c->out_cap, s);
    free(s);
    return rc;
}

/* One streamed chunk of choice i: text (its first also carries the echoed prompt and, in chat, the role),
 * logprobs, finish reason or null. */
static cJSON *chunk(Conn *c, int i, const ServeDelta *d, const char *finish) {
    Choice *ch = &c->ch[i];
    cJSON *r = response_head(c, c->kind == SERVE_CHAT ? "chat.completion.chunk" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(r, "choices"), *o = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, o);
    cJSON_AddNumberToObject(o, "index", i);
    const char *text = d && d->text ? d->text : "";
    const int first = !ch->sent_first;
    ch->sent_first = 1;
    if (c->kind == SERVE_CHAT) {
        cJSON *delta = cJSON_AddObjectToObject(o, "delta");
        if (first) cJSON_AddStringToObject(delta, "role", "assistant");
        if (!finish || *text) cJSON_AddStringToObject(delta, "content", text);
    } else if (first && c->echo) {
        const char *echo = c->echo[ch->prompt];
        const size_t el = strlen(echo), tl = strlen(text);
        char *both = malloc(el + tl + 1);
        if (both) {
            memcpy(both, echo, el);
            memcpy(both + el, text, tl + 1);
        }
        cJSON_AddStringToObject(o, "text", both ? both : text);
        free(both);
    } else {
        cJSON_AddStringToObject(o, "text", text);
    }
    if (d && d->n_logprobs && c->logprobs >= 0) {
        cJSON *lp = new_logprobs(c->kind);
        add_logprobs(c, ch, lp, d);
        cJSON_AddItemToObject(o, "logprobs", lp);
    } else {
        cJSON_AddNullToObject(o, "logprobs");
    }
    if (finish) cJSON_AddStringToObject(o, "finish_reason", finish);
    else cJSON_AddNullToObject(o, "finish_reason");
    return r;
}

/* Chat with tools, streamed: the parser's content as content deltas, and each call as two tool_calls deltas (index,
 * id, type and name with arguments "", then the arguments), as OpenAI streams them; logprobs in a delta of their own
 * (the parser may hold text back, so they need not line up with the text beside them). */
static int stream_tools(Conn *c, int i, const ServeDelta *d) {
    Choice *ch = &c->ch[i];
    ToolEvents ev = {0};
    int rc = tool_parser_feed(ch->tools, d->text ? d->text : "", d->len, d->finished, &ev);
    for (int k = 0; !rc && k < ev.n; k++) {
        const ToolEvent *x = &ev.ev[k];
        ServeDelta t = {.text = x->text, .len = x->len};
        for (int part = 0; !rc && part < (x->is_call ? 2 : 1); part++) {
            cJSON *r = chunk(c, i, &t, NULL);
            if (x->is_call) {
                cJSON *delta = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "choices"), 0), "delta");
                cJSON_DeleteItemFromObject(delta, "content");
                cJSON_AddItemToArray(cJSON_AddArrayToObject(delta, "tool_calls"),
                                     tool_call_json(&x->call, x->index,
                                                    part ? TOOL_JSON_STREAM_ARGUMENTS : TOOL_JSON_STREAM_FIRST));
            }
            rc = queue_event(c, r);
        }
    }
    tool_events_free(&ev);
    if (!rc && (d->n_logprobs || !ch->sent_first)) /* chat's first chunk says the role, whether or not more came */
        rc = queue_event(c, chunk(c, i, &(ServeDelta){.logprobs = d->logprobs, .n_logprobs = d->n_logprobs}, NULL));
    return rc;
}

/* Queues what choice i has new: a chunk, and its finish chunk once it ends. 1: it has ended. */
static int stream_choice(Conn *c, int i, int *failed) {
    Choice *ch = &c->ch[i];
    ServeDelta d;
    if (serve_job_take(ch->job, &d)) {
        *failed = 1;
        return 0;
    }
    int rc = 0; /* chat's first chunk says the role, an echo's first the prompt, whether or not there is more */
    if (ch->tools) rc = stream_tools(c, i, &d);
    else if (d.len || d.n_logprobs || (!ch->sent_first && (c->kind == SERVE_CHAT || c->echo)))
        rc = queue_event(c, chunk(c, i, &d, NULL));
    ch->completion_tokens = d.completion_tokens;
    if (!rc && d.finished) {
        ServeDelta none = {0};
        rc = queue_event(c, chunk(c, i, &none, finish_reason(ch, d.finish)));
        ch->done = 1;
    }
    serve_delta_free(&d);
    *failed |= rc != 0;
    return ch->done;
}

/* libmicrohttpd asks for the next bytes of the event stream: block until a choice has something (or the client is
 * gone), then hand out chunks; after the last choice's end, the usage chunk (if asked) and "data: [DONE]". */
static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    Conn *c = cls;
    while (c->out_off == c->out_len) {
        c->out_off = c->out_len = 0;
        if (c->ended) return MHD_CONTENT_READER_END_OF_STREAM;
        if (!serve_jobs_wait(c->jobs, c->n_ch, WAIT_MS)) {
            if (client_gone(c->fd)) {
                conn_abandon(c); /* counted here, not again when the connection closes */
                return MHD_CONTENT_READER_END_WITH_ERROR;
            }
            continue;
        }
        int failed = 0, left = 0;
        for (int i = 0; i < c->n_ch && !failed; i++)
            if (!c->ch[i].done) left += !stream_choice(c, i, &failed);
        if (!failed && left == 0) {
            if (c->include_usage) {
                cJSON *u = response_head(c, c->kind == SERVE_CHAT ? "chat.completion.chunk" : "text_completion");
                cJSON_AddArrayToObject(u, "choices");
                cJSON_AddItemToObject(u, "usage", conn_usage(c));
                failed = queue_event(c, u) != 0;
            }
            if (!failed) failed = serve_sse_append(&c->out, &c->out_len, &c->out_cap, "[DONE]") != 0;
            c->ended = 1;
        }
        if (failed) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = c->out_len - c->out_off < max ? c->out_len - c->out_off : max;
    memcpy(buf, c->out + c->out_off, n);
    c->out_off += n;
    return (ssize_t)n;
}

static void stream_free(void *cls) { conn_unref(cls); }

/* A prompt's token ids: text encoded with bos first (as zaya generate), or the ids given. */
static int prompt_ids(ServeHttp *h, ServePrompt *p, int add_bos, int32_t **ids, size_t *n, ServeError *e) {
    if (!p->text) {
        *ids = p->ids;
        *n = (size_t)p->n_ids;
        p->ids = NULL;
        return 0;
    }
    ZyErr err = {{0}};
    int32_t *body = NULL;
    size_t nb = 0;
    if (tokenizer_encode_with(h->o.tok, NULL, p->text, p->len, &body, &nb, &err))
        return serve_error(e, 400, "invalid_request_error", "prompt", "%s", err.msg);
    const int bos = add_bos && h->o.bos_id >= 0;
    if (!(*ids = malloc(sizeof(int32_t) * (nb + bos + 1)))) {
        free(body);
        return serve_error(e, 500, "server_error", "", "out of memory");
    }
    if (bos) (*ids)[0] = h->o.bos_id;
    if (nb) memcpy(*ids + bos, body, sizeof(int32_t) * nb);
    *n = nb + bos;
    free(body);
    return 0;
}

/* The messages through the model's chat template, encoded without special tokens (the template writes its own bos),
 * as apply_chat_template(tokenize=True). */
static int chat_ids(ServeHttp *h, const ServeRequest *r, const char *suffix, int32_t **ids, size_t *n, ServeError *e) {
    if (!h->o.chat)
        return serve_error(e, 400, "invalid_request_error", "messages", "the model has no chat template "
                           "(chat_template.jinja or tokenizer_config.json's chat_template, or zaya serve "
                           "--chat-template FILE); use /v1/completions");
    ZyErr err = {{0}};
    char *prompt = NULL;
    size_t plen = 0;
    if (chat_renderer_render_json(h->o.chat, r->chat_json, strlen(r->chat_json), r->add_generation_prompt, NULL,
                                  &prompt, &plen, &err))
        return serve_error(e, 400, "invalid_request_error", "messages", "the chat template failed: %s", err.msg);
    if (suffix) { /* a forced tool call's opening (serve_tools.h) */
        const size_t sl = strlen(suffix);
        char *g = realloc(prompt, plen + sl + 1);
        if (!g) {
            free(prompt);
            return serve_error(e, 500, "server_error", "", "out of memory");
        }
        memcpy(g + plen, suffix, sl + 1);
        prompt = g;
        plen += sl;
    }
    int rc = tokenizer_encode_with(h->o.tok, NULL, prompt, plen, ids, n, &err);
    free(prompt);
    return rc ? serve_error(e, 400, "invalid_request_error", "messages", "%s", err.msg) : 0;
}

/* Checks ids against the vocabulary (param names the field). */
static int check_ids(const ServeHttp *h, const int32_t *ids, size_t n, const char *param, ServeError *e) {
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= h->o.vocab_size)
            return serve_error(e, 400, "invalid_request_error", param, "token id %d at %s position %zu is outside the "
                               "vocabulary [0, %d)", ids[i], param, i, h->o.vocab_size);
    return 0;
}

/* The model a request names: 404 unless it is this server's. */
static int check_model(const ServeHttp *h, const char *model, ServeError *e) {
    if (!model || strcmp(model, h->model_name) == 0) return 0;
    serve_error(e, 404, "not_found_error", "model", "The model '%.100s' does not exist; this server has '%.100s'",
                model, h->model_name);
    snprintf(e->code, sizeof e->code, "model_not_found");
    return -1;
}

static int draining(ServeHttp *h) {
    pthread_mutex_lock(&h->mu);
    const int d = h->draining;
    pthread_mutex_unlock(&h->mu);
    return d;
}

/* What a request asks of each of its jobs (the prompt, max_tokens, n and wake are the caller's). */
static ServeJobSpec request_spec(const ServeHttp *h, const ServeRequest *r, const int32_t *stops, int n_stops,
                                 uint64_t serial, int p) {
    return (ServeJobSpec){
        .sampling = {.temperature = isnan(r->temperature) ? h->o.temperature : r->temperature,
                     .top_k = r->top_k >= 0 ? r->top_k : h->o.top_k,
                     .top_p = isnan(r->top_p) ? h->o.top_p : r->top_p,
                     .min_p = r->min_p},
        .penalties = {.presence = r->presence_penalty, .frequency = r->frequency_penalty,
                      .repetition = r->repetition_penalty, .bias_ids = r->bias_ids, .bias = r->bias,
                      .n_bias = r->n_bias},
        .seed = r->has_seed ? r->seed : (uint64_t)time(NULL) * 6364136223846793005ULL + serial * 1000003ULL + p,
        .stop_ids = stops,
        .n_stop_ids = n_stops,
        .stop = r->stop,
        .n_stop = r->n_stop,
        .include_stop_str = r->include_stop_str,
        .skip_special = r->skip_special_tokens > 0,
        .logprobs = r->logprobs,
        .prompt_logprobs = r->echo,
    };
}

static int rsa_client_gone(void *c) { return client_gone(((Conn *)c)->fd); }

/* A chat request with "rsa" (serve/reason.h): the rounds run on this connection's thread, each as one batch in the
 * engine; the answer is the chosen trace as the one message, and "rsa" the rounds' report. */
static enum MHD_Result answer_rsa(struct MHD_Connection *conn, Conn *c, const ServeRequest *r, ServeJobSpec base) {
    ServeHttp *h = c->h;
    ServeEngineOpts eo;
    serve_engine_info(h->eng, &eo, &(int){0}, &(size_t){0});
    ServeError e;
    if (!h->o.chat) {
        serve_error(&e, 400, "invalid_request_error", "messages", "'rsa' runs on the model's chat template, and this "
                    "server has none (zaya serve --chat-template FILE)");
        return send_error(conn, c, &e);
    }
    char *problem = NULL;
    if (rsa_shape_check(&r->rsa, eo.max_batch, "rsa.", &e) || rsa_chat_problem(r->chat_json, &problem, &e))
        return send_error(conn, c, &e);
    JinjaTemplate *tmpl = NULL;
    ZyErr ze = {{0}};
    if (jinja_parse(RSA_DEFAULT_TEMPLATE, strlen(RSA_DEFAULT_TEMPLATE), &tmpl, &ze)) {
        free(problem);
        serve_error(&e, 500, "server_error", "", "the aggregation template: %s", ze.msg);
        return send_error(conn, c, &e);
    }
    RsaEncoder enc = {.tok = h->o.tok, .chat = h->o.chat, .chat_json = r->chat_json, .bos_id = h->o.bos_id};
    const RsaPrompter prompter = {.ctx = &enc, .encode = rsa_encode, .cancelled = rsa_client_gone, .cancel_ctx = c};
    RsaOpts ro = {.shape = r->rsa, .aggregate = tmpl, .tok = h->o.tok, .base = base, .seed = base.seed,
                  .max_tokens = r->max_tokens > 0 ? r->max_tokens : h->o.max_context, .max_context = h->o.max_context,
                  .field_prefix = "rsa."};
    RsaResult res;
    const int bad = rsa_run(h->eng, &ro, &prompter, problem, &res, &e);
    jinja_free(tmpl);
    free(problem);
    if (bad) return send_error(conn, c, &e);
    const RsaTrace *t = rsa_chosen(&res);
    long prompt_tokens = 0, completion_tokens = 0;
    for (int k = 0; k < res.shape.rounds; k++) {
        prompt_tokens += res.rounds[k].prompt_tokens;
        completion_tokens += res.rounds[k].tokens_generated;
    }
    cJSON *body = response_head(c, "chat.completion");
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(body, "choices"), ch);
    cJSON_AddNumberToObject(ch, "index", 0);
    cJSON *msg = cJSON_AddObjectToObject(ch, "message");
    cJSON_AddStringToObject(msg, "role", "assistant");
    cJSON_AddStringToObject(msg, "content", t->text);
    cJSON_AddNullToObject(ch, "logprobs");
    cJSON_AddStringToObject(ch, "finish_reason", t->finish ? t->finish : "abort");
    cJSON_AddItemToObject(body, "usage", usage((int)prompt_tokens, (int)completion_tokens));
    cJSON_AddItemToObject(body, "rsa", rsa_report_json(&res, 0));
    rsa_result_free(&res);
    return send_json(conn, c, 200, body, 0);
}

/* POST /v1/completions and /v1/chat/completions: every prompt (one for chat) with its n choices. */
static enum MHD_Result complete(struct MHD_Connection *conn, Conn *c, ServeKind kind) {
    ServeHttp *h = c->h;
    ServeRequest r;
    ServeError e;
    if (draining(h)) { /* before anything else: a new request during shutdown gets its answer at once */
        serve_error(&e, 503, "server_error", "", "the server is shutting down");
        return send_error(conn, c, &e);
    }
    if (serve_request_parse(c->body ? c->body : "", c->len, kind, &r, &e)) return send_error(conn, c, &e);
    enum MHD_Result res;
    const int n_prompts = kind == SERVE_CHAT ? 1 : r.n_prompts, n = r.n;
    int32_t **ids = calloc((size_t)n_prompts, sizeof *ids);
    size_t *n_ids = calloc((size_t)n_prompts, sizeof *n_ids);
    int *max_tokens = calloc((size_t)n_prompts, sizeof *max_tokens);
    int32_t *stops = malloc(sizeof(int32_t) * (h->o.n_stop_ids + r.n_stop_ids + 1));
    ServeConstraint *constraint = NULL;
    char *forced = NULL; /* a forced tool call's opening, put after the prompt */
    c->n_prompts = n_prompts;
    c->ch = calloc((size_t)n_prompts * n, sizeof *c->ch);
    c->jobs = calloc((size_t)n_prompts * n, sizeof *c->jobs);
    c->echo = r.echo ? calloc((size_t)n_prompts, sizeof *c->echo) : NULL;
    if (!ids || !n_ids || !max_tokens || !stops || !c->ch || !c->jobs || (r.echo && !c->echo)) {
        serve_error(&e, 500, "server_error", "", "out of memory");
        goto fail;
    }
    if (check_model(h, r.model, &e)) goto fail;
    const ToolFormat *tools = NULL; /* chat: the format its answers' tool calls are parsed in */
    if (kind == SERVE_CHAT && serve_tools_plan(h->o.tool_format, &r, &tools, &forced, &e)) goto fail;
    if (check_ids(h, r.bias_ids, (size_t)r.n_bias, "logit_bias", &e) ||
        check_ids(h, r.stop_ids, (size_t)r.n_stop_ids, "stop_token_ids", &e))
        goto fail;
    /* the model's eos ids (unless ignore_eos) and the request's stop_token_ids */
    int n_stops = 0;
    for (int i = 0; !r.ignore_eos && i < h->o.n_stop_ids; i++) stops[n_stops++] = h->o.stop_ids[i];
    for (int i = 0; i < r.n_stop_ids; i++) stops[n_stops++] = r.stop_ids[i];
    pthread_mutex_lock(&h->mu);
    const uint64_t serial = ++h->next_id;
    pthread_mutex_unlock(&h->mu);
    snprintf(c->id, sizeof c->id, "%s-%lx%06llx", kind == SERVE_CHAT ? "chatcmpl" : "cmpl", (unsigned long)h->started,
             (unsigned long long)serial);
    c->created = (long)time(NULL);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    c->fd = ci ? ci->connect_fd : -1;
    if (r.rsa.population > 0) {
        res = answer_rsa(conn, c, &r, request_spec(h, &r, stops, n_stops, serial, 0));
        goto done;
    }
    const char *what = kind == SERVE_CHAT ? "messages" : "prompt";
    for (int p = 0; p < n_prompts; p++) {
        if (kind == SERVE_CHAT ? chat_ids(h, &r, forced, &ids[p], &n_ids[p], &e)
                               : prompt_ids(h, &r.prompts[p], 1, &ids[p], &n_ids[p], &e))
            goto fail;
        if (n_ids[p] == 0) {
            serve_error(&e, 400, "invalid_request_error", what, "the prompt is empty");
            goto fail;
        }
        if (check_ids(h, ids[p], n_ids[p], "prompt", &e)) goto fail;
        const long room = (long)h->o.max_context - (long)n_ids[p];
        max_tokens[p] = r.max_tokens >= 0 ? r.max_tokens : kind == SERVE_COMPLETION ? 16 : (int)(room > 0 ? room : 1);
        if ((long)n_ids[p] + max_tokens[p] > h->o.max_context) {
            const int prompt_at_fault = r.max_tokens < 0 || room <= 0; /* the prompt alone leaves no room */
            serve_error(&e, 400, "invalid_request_error", prompt_at_fault ? what : "max_tokens",
                        "This model's maximum context length is %d tokens. However, you requested %ld tokens (%zu in "
                        "the %s, %d in the completion). Please reduce the length of the %s or the completion.",
                        h->o.max_context, (long)n_ids[p] + max_tokens[p], n_ids[p], what, max_tokens[p], what);
            snprintf(e.code, sizeof e.code, "context_length_exceeded");
            goto fail;
        }
        c->prompt_tokens += (int)n_ids[p];
        if (c->echo) { /* the prompt's text: as given, or its ids decoded */
            if (r.prompts[p].text) {
                c->echo[p] = serve_utf8_sanitize(r.prompts[p].text, r.prompts[p].len, &(size_t){0});
            } else {
                char *b = NULL;
                size_t bl = 0;
                ZyErr err = {{0}};
                if (tokenizer_decode_ex(h->o.tok, ids[p], n_ids[p], TOK_DECODE_LOSSY |
                                        (r.skip_special_tokens > 0 ? TOK_DECODE_SKIP_SPECIAL : 0), &b, &bl, &err) == 0)
                    c->echo[p] = serve_utf8_sanitize(b ? b : "", bl, &(size_t){0});
                free(b);
            }
            if (!c->echo[p]) {
                serve_error(&e, 500, "server_error", "", "out of memory");
                goto fail;
            }
        }
    }
    int least_tokens = INT_MAX; /* response_format must fit every prompt's max_tokens */
    for (int p = 0; p < n_prompts; p++) least_tokens = max_tokens[p] < least_tokens ? max_tokens[p] : least_tokens;
    if (serve_constraint_new(h->structured, &r, least_tokens, &constraint, &e)) goto fail;
    for (int p = 0; p < n_prompts; p++) {
        ServeJobSpec spec = request_spec(h, &r, stops, n_stops, serial, p);
        spec.prompt = ids[p];
        spec.n_prompt = (int)n_ids[p];
        spec.max_tokens = max_tokens[p];
        spec.n = n;
        spec.wake = p > 0 ? c->jobs[0] : NULL;
        spec.skip_special = r.skip_special_tokens > 0 && !tools; /* a call's tags may be special tokens (vLLM too) */
        spec.mask = constraint ? &serve_constraint_ops : NULL;
        spec.mask_arg = constraint;
        if (serve_engine_submit(h->eng, &spec, c->jobs + (size_t)p * n, &e)) goto fail;
        for (int j = 0; j < n; j++) {
            Choice *ch = &c->ch[p * n + j];
            ch->job = c->jobs[p * n + j];
            ch->prompt = p;
            c->n_ch++;
            char call_ids[64]; /* unique on this server: call_<start><serial>_<choice>_<call> */
            snprintf(call_ids, sizeof call_ids, "call_%lx%06llx_%d_", (unsigned long)h->started,
                     (unsigned long long)serial, p * n + j);
            if (tools && !(ch->tools = tool_parser_new(tools, r.tools_json, forced, call_ids))) {
                serve_error(&e, 500, "server_error", "", "out of memory");
                goto fail;
            }
        }
    }
    c->kind = kind;
    c->stream = r.stream;
    c->include_usage = r.include_usage;
    c->logprobs = r.logprobs;
    if (!c->stream) {
        res = answer_whole(conn, c);
        goto done;
    }
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_reader, c,
                                                                  stream_free);
    if (!resp) {
        res = MHD_NO;
        goto done;
    }
    __atomic_add_fetch(&c->refs, 1, __ATOMIC_ACQ_REL);
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    res = MHD_queue_response(conn, 200, resp);
    MHD_destroy_response(resp);
    count_response(h, c->route, 200);
    goto done;
fail:
    for (int i = 0; i < c->n_ch; i++) serve_job_cancel(c->ch[i].job); /* prompts already queued: withdrawn */
    c->ended = 1;
    res = send_error(conn, c, &e);
done:
    for (int p = 0; ids && p < n_prompts; p++) free(ids[p]);
    free(ids);
    free(n_ids);
    free(max_tokens);
    free(stops);
    serve_constraint_release(constraint);
    free(forced);
    serve_request_free(&r);
    return res;
}

/* POST /tokenize and /detokenize, in vLLM's shapes: {"count", "max_model_len", "tokens", "token_strs"} and
 * {"prompt"}. A prompt is encoded as /v1/completions encodes it (add_special_tokens, default true: its bos first);
 * messages as /v1/chat/completions renders them (add_special_tokens default false: the template writes its own). */
static enum MHD_Result tokenize(struct MHD_Connection *conn, Conn *c, ServeKind kind) {
    ServeHttp *h = c->h;
    ServeRequest r;
    ServeError e;
    if (serve_request_parse(c->body ? c->body : "", c->len, kind, &r, &e)) return send_error(conn, c, &e);
    int32_t *ids = NULL;
    size_t n = 0;
    cJSON *out = NULL;
    if (check_model(h, r.model, &e)) goto fail;
    if (kind == SERVE_DETOKENIZE) {
        if (check_ids(h, r.prompts[0].ids, (size_t)r.prompts[0].n_ids, "tokens", &e)) goto fail;
        char *b = NULL;
        size_t bl = 0;
        ZyErr err = {{0}};
        if (tokenizer_decode_ex(h->o.tok, r.prompts[0].ids, (size_t)r.prompts[0].n_ids, TOK_DECODE_LOSSY, &b, &bl,
                                &err)) {
            serve_error(&e, 400, "invalid_request_error", "tokens", "%s", err.msg);
            goto fail;
        }
        size_t tl;
        char *text = serve_utf8_sanitize(b ? b : "", bl, &tl);
        free(b);
        out = cJSON_CreateObject();
        cJSON_AddStringToObject(out, "prompt", text ? text : "");
        free(text);
        serve_request_free(&r);
        return send_json(conn, c, 200, out, 0);
    }
    if (r.chat_json) {
        int32_t *body = NULL;
        size_t nb = 0;
        if (chat_ids(h, &r, NULL, &body, &nb, &e)) goto fail;
        const int bos = r.add_special_tokens > 0 && h->o.bos_id >= 0;
        if (!(ids = malloc(sizeof(int32_t) * (nb + 1)))) {
            free(body);
            serve_error(&e, 500, "server_error", "", "out of memory");
            goto fail;
        }
        if (bos) ids[0] = h->o.bos_id;
        if (nb) memcpy(ids + bos, body, sizeof(int32_t) * nb);
        n = nb + bos;
        free(body);
    } else if (prompt_ids(h, &r.prompts[0], r.add_special_tokens != 0, &ids, &n, &e)) {
        goto fail;
    }
    out = cJSON_CreateObject();
    cJSON_AddNumberToObject(out, "count", (double)n);
    cJSON_AddNumberToObject(out, "max_model_len", h->o.max_context);
    cJSON *list = cJSON_AddArrayToObject(out, "tokens");
    for (size_t i = 0; i < n; i++) cJSON_AddItemToArray(list, cJSON_CreateNumber(ids[i]));
    if (r.return_token_strs) {
        cJSON *strs = cJSON_AddArrayToObject(out, "token_strs");
        for (size_t i = 0; i < n; i++) {
            const char *t = tokenizer_token_text(h->o.tok, ids[i]);
            cJSON_AddItemToArray(strs, t ? cJSON_CreateString(t) : cJSON_CreateNull());
        }
    } else {
        cJSON_AddNullToObject(out, "token_strs");
    }
    free(ids);
    serve_request_free(&r);
    return send_json(conn, c, 200, out, 0);
fail:
    free(ids);
    serve_request_free(&r);
    return send_error(conn, c, &e);
}

/* ---- the other routes ---------------------------------------------------------------------------------------- */

static cJSON *model_card(const ServeHttp *h) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", h->model_name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)h->started);
    cJSON_AddStringToObject(m, "owned_by", "zaya");
    cJSON_AddNumberToObject(m, "max_model_len", h->o.max_context);
    return m;
}

static enum MHD_Result models(struct MHD_Connection *conn, Conn *c) {
    cJSON *r = cJSON_CreateObject(), *data = cJSON_CreateArray();
    cJSON_AddStringToObject(r, "object", "list");
    cJSON_AddItemToObject(r, "data", data);
    cJSON_AddItemToArray(data, model_card(c->h));
    return send_json(conn, c, 200, r, 0);
}

/* GET /v1/models/{id}: this server's model, or 404. */
static enum MHD_Result model(struct MHD_Connection *conn, Conn *c, const char *id) {
    ServeError e;
    if (strcmp(id, c->h->model_name) != 0) {
        serve_error(&e, 404, "not_found_error", "model", "The model '%.100s' does not exist; this server has '%.100s'",
                    id, c->h->model_name);
        snprintf(e.code, sizeof e.code, "model_not_found");
        return send_error(conn, c, &e);
    }
    return send_json(conn, c, 200, model_card(c->h), 0);
}

static enum MHD_Result health(struct MHD_Connection *conn, Conn *c) {
    int running, queued, used;
    serve_engine_load(c->h->eng, &running, &queued, &used);
    pthread_mutex_lock(&c->h->mu);
    const int draining = c->h->draining;
    pthread_mutex_unlock(&c->h->mu);
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "status", draining ? "shutting down" : "ok");
    cJSON_AddNumberToObject(r, "running", running);
    cJSON_AddNumberToObject(r, "waiting", queued);
    cJSON_AddNumberToObject(r, "kv_blocks_used", used);
    return send_json(conn, c, draining ? 503 : 200, r, 0);
}

static enum MHD_Result metrics(struct MHD_Connection *conn, Conn *c) {
    ServeHttp *h = c->h;
    count_response(h, c->route, 200); /* this response counts itself */
    char *eng = serve_engine_metrics(h->eng);
    size_t cap = (eng ? strlen(eng) : 0) + 4096;
    char *s = malloc(cap);
    if (!s) {
        free(eng);
        return send_text(conn, c, 500, "text/plain", "out of memory\n", 14, 0);
    }
    size_t n = (size_t)snprintf(s, cap, "%s", eng ? eng : "");
    free(eng);
    pthread_mutex_lock(&h->mu);
    n += (size_t)snprintf(s + n, cap - n, "# HELP zaya_http_responses_total HTTP responses by route and status class.\n"
                                          "# TYPE zaya_http_responses_total counter\n");
    static const char *const cls[N_CLASSES] = {"2xx", "4xx", "5xx"};
    for (int r = 0; r < N_ROUTES; r++)
        for (int k = 0; k < N_CLASSES; k++)
            n += (size_t)snprintf(s + n, cap - n, "zaya_http_responses_total{route=\"%s\",status=\"%s\"} %llu\n",
                                  ROUTE_NAMES[r], cls[k], (unsigned long long)h->responses[r][k]);
    n += (size_t)snprintf(s + n, cap - n, "# HELP zaya_client_disconnects_total Requests whose client went away "
                                          "before the end.\n# TYPE zaya_client_disconnects_total counter\n"
                                          "zaya_client_disconnects_total %llu\n", (unsigned long long)h->disconnects);
    pthread_mutex_unlock(&h->mu);
    struct MHD_Response *r = MHD_create_response_from_buffer(n < cap ? n : cap - 1, s, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(s);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "text/plain; version=0.0.4");
    enum MHD_Result rc = MHD_queue_response(conn, 200, r);
    MHD_destroy_response(r);
    return rc;
}

static int route_of(const char *url) {
    for (int r = 0; r < R_MODEL; r++)
        if (strcmp(url, ROUTE_NAMES[r]) == 0) return r;
    return strncmp(url, "/v1/models/", 11) == 0 && url[11] ? R_MODEL : R_OTHER;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    ServeHttp *h = cls;
    Conn *c = *con_cls;
    if (!c) { /* the headers are in: set up, and ask for the body */
        if (!(c = calloc(1, sizeof *c))) return MHD_NO;
        c->h = h;
        c->route = route_of(url);
        c->refs = 1;
        c->logprobs = -1;
        c->fd = -1;
        *con_cls = c;
        pthread_mutex_lock(&h->mu);
        h->active++;
        pthread_mutex_unlock(&h->mu);
        return MHD_YES;
    }
    if (*upload_size) { /* a piece of the body */
        if (!c->too_big && c->len + *upload_size > MAX_BODY) c->too_big = 1;
        if (!c->too_big) {
            if (c->len + *upload_size + 1 > c->cap) {
                size_t cap = (c->len + *upload_size + 1) * 2;
                char *g = realloc(c->body, cap);
                if (!g) return MHD_NO;
                c->body = g;
                c->cap = cap;
            }
            memcpy(c->body + c->len, upload, *upload_size);
            c->len += *upload_size;
            c->body[c->len] = 0;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    ServeError e;
    const int is_post = strcmp(method, "POST") == 0, is_get = strcmp(method, "GET") == 0;
    const int gen = c->route == R_COMPLETIONS || c->route == R_CHAT || c->route == R_TOKENIZE ||
                    c->route == R_DETOKENIZE; /* the POST routes */
    if (c->route == R_OTHER) {
        serve_error(&e, 404, "not_found_error", "", "no route %.6s %.200s (zaya serve has POST /v1/completions, POST "
                    "/v1/chat/completions, POST /tokenize, POST /detokenize, GET /v1/models, GET /v1/models/{id}, "
                    "GET /health, GET /metrics)", method, url);
        return send_error(conn, c, &e);
    }
    if ((gen && !is_post) || (!gen && !is_get)) {
        serve_error(&e, 405, "invalid_request_error", "", "%.200s takes %s, not %.10s", url, gen ? "POST" : "GET", method);
        return send_error(conn, c, &e);
    }
    if (h->api_key && strncmp(url, "/v1/", 4) == 0) {
        const char *auth = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
        if (!auth || strncmp(auth, "Bearer ", 7) != 0 || strcmp(auth + 7, h->api_key) != 0) {
            serve_error(&e, 401, "authentication_error", "", auth ? "Incorrect API key provided" :
                        "Missing API key: send it as 'Authorization: Bearer KEY'");
            snprintf(e.code, sizeof e.code, "invalid_api_key");
            return send_error(conn, c, &e);
        }
    }
    if (c->too_big) {
        serve_error(&e, 413, "invalid_request_error", "", "the request body is larger than %zu bytes", MAX_BODY);
        return send_error(conn, c, &e);
    }
    switch (c->route) {
    case R_COMPLETIONS: return complete(conn, c, SERVE_COMPLETION);
    case R_CHAT: return complete(conn, c, SERVE_CHAT);
    case R_TOKENIZE: return tokenize(conn, c, SERVE_TOKENIZE);
    case R_DETOKENIZE: return tokenize(conn, c, SERVE_DETOKENIZE);
    case R_MODELS: return models(conn, c);
    case R_MODEL: return model(conn, c, url + 11);
    case R_HEALTH: return health(conn, c);
    default: return metrics(conn, c);
    }
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe) {
    Conn *c = *con_cls;
    if (!c) return;
    *con_cls = NULL;
    if (c->n_ch && toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && !c->ended) /* the client went away mid-answer */
        conn_abandon(c);
    ServeHttp *h = c->h;
    conn_unref(c);
    pthread_mutex_lock(&h->mu);
    if (--h->active == 0) pthread_cond_broadcast(&h->idle);
    pthread_mutex_unlock(&h->mu);
}

int serve_http_start(ServeHttp **out, ServeEngine *e, const ServeHttpOpts *o, ZyErr *err) {
    *out = NULL;
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)o->port)};
    if (o->port < 0 || o->port > 65535) return zy_fail(err, "serve: --port must be 0..65535 (got %d)", o->port);
    if (inet_pton(AF_INET, o->host, &addr.sin_addr) != 1)
        return zy_fail(err, "serve: --host \"%s\" is not an IPv4 address (e.g. 127.0.0.1 or 0.0.0.0)", o->host);
    ServeHttp *h = calloc(1, sizeof *h);
    if (!h) return zy_fail(err, "out of memory");
    h->eng = e;
    h->o = *o;
    h->model_name = strdup(o->model_name);
    h->api_key = o->api_key ? strdup(o->api_key) : NULL;
    h->started = time(NULL);
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->idle, NULL);
    if (!(h->structured = serve_structured_new(o->tok, o->vocab_size))) {
        serve_http_stop(h);
        return zy_fail(err, "out of memory");
    }
    h->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ITC |
                                MHD_USE_AUTO | MHD_USE_ERROR_LOG,
                            0, NULL, NULL, on_request, h, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, h, MHD_OPTION_CONNECTION_LIMIT,
                            (unsigned)(o->max_connections > 0 ? o->max_connections : 512),
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)600, MHD_OPTION_END);
    if (!h->d) {
        serve_http_stop(h);
        return zy_fail(err, "serve: cannot listen on %s:%d (in use, or not allowed)", o->host, o->port);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = di ? di->port : o->port;
    *out = h;
    return 0;
}

int serve_http_port(const ServeHttp *h) { return h->port; }

void serve_http_quiesce(ServeHttp *h) {
    /* the listening socket stays open: a client that connects now gets a 503 it can act on, not a reset */
    pthread_mutex_lock(&h->mu);
    h->draining = 1;
    pthread_mutex_unlock(&h->mu);
}

int serve_http_drain(ServeHttp *h, double seconds) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    const double end = until.tv_sec + until.tv_nsec * 1e-9 + (seconds > 0 ? seconds : 0);
    until.tv_sec = (time_t)end;
    until.tv_nsec = (long)((end - (double)until.tv_sec) * 1e9);
    pthread_mutex_lock(&h->mu);
    while (h->active > 0 && pthread_cond_timedwait(&h->idle, &h->mu, &until) == 0) {
    }
    const int left = h->active;
    pthread_mutex_unlock(&h->mu);
    return left;
}

void serve_http_stop(ServeHttp *h) {
    if (!h) return;
    if (h->d) MHD_stop_daemon(h->d);
    pthread_cond_destroy(&h->idle);
    pthread_mutex_destroy(&h->mu);
    free(h->model_name);
    free(h->api_key);
    serve_structured_free(h->structured);
    free(h);
}

/* OpenAI request bodies → ServeRequest. Strict like OpenAI's own API: a field of the wrong type or out of range is
 * a 400 naming it, an unknown field too (a misspelt "max_token" silently ignored would be worse), and the options
 * zaya does not implement (n > 1, echo, penalties, logit_bias ...) are refused by name rather than ignored. */
#include "serve/serve_request.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int serve_error(ServeError *e, int status, const char *type, const char *param, const char *fmt, ...) {
    e->status = status;
    snprintf(e->type, sizeof e->type, "%s", type);
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    e->code[0] = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

#define BAD(param, ...) serve_error(e, 400, "invalid_request_error", param, __VA_ARGS__)

/* A short JSON rendering of a bad value for messages. */
static void show(const cJSON *v, char *out, size_t cap) {
    char *s = cJSON_PrintUnformatted(v);
    snprintf(out, cap, "%.60s%s", s ? s : "?", s && strlen(s) > 60 ? "..." : "");
    free(s);
}

static int get_int(const cJSON *v, const char *name, long lo, long hi, long *out, ServeError *e) {
    char b[80];
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < lo || v->valuedouble > hi) {
        show(v, b, sizeof b);
        return BAD(name, "'%s' must be an integer from %ld to %ld (got %s)", name, lo, hi, b);
    }
    *out = (long)v->valuedouble;
    return 0;
}

static int get_num(const cJSON *v, const char *name, double lo, double hi, int lo_open, double *out, ServeError *e) {
    char b[80];
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble > hi || v->valuedouble < lo ||
        (lo_open && v->valuedouble == lo)) {
        show(v, b, sizeof b);
        return BAD(name, "'%s' must be a number %s %g and <= %g (got %s)", name, lo_open ? ">" : ">=", lo, hi, b);
    }
    *out = v->valuedouble;
    return 0;
}

static int get_bool(const cJSON *v, const char *name, int *out, ServeError *e) {
    char b[80];
    if (!cJSON_IsBool(v)) {
        show(v, b, sizeof b);
        return BAD(name, "'%s' must be true or false (got %s)", name, b);
    }
    *out = cJSON_IsTrue(v);
    return 0;
}

static int dup_string(const cJSON *v, const char *name, size_t max, char **out, size_t *len, ServeError *e) {
    char b[80];
    if (!cJSON_IsString(v)) {
        show(v, b, sizeof b);
        return BAD(name, "'%s' must be a string (got %s)", name, b);
    }
    size_t n = strlen(v->valuestring);
    if (n > max) return BAD(name, "'%s' is longer than %zu bytes", name, max);
    if (!(*out = malloc(n + 1))) return serve_error(e, 500, "server_error", name, "out of memory");
    memcpy(*out, v->valuestring, n + 1);
    if (len) *len = n;
    return 0;
}

static int parse_stop(const cJSON *v, ServeRequest *r, ServeError *e) {
    if (cJSON_IsString(v)) {
        if (!v->valuestring[0]) return BAD("stop", "'stop' strings must not be empty");
        r->n_stop = 1;
        return dup_string(v, "stop", SERVE_MAX_STOP_BYTES, &r->stop[0], NULL, e);
    }
    if (!cJSON_IsArray(v)) return BAD("stop", "'stop' must be a string or a list of up to %d strings", SERVE_MAX_STOP);
    if (cJSON_GetArraySize(v) > SERVE_MAX_STOP)
        return BAD("stop", "'stop' has %d strings; at most %d are allowed", cJSON_GetArraySize(v), SERVE_MAX_STOP);
    const cJSON *s;
    cJSON_ArrayForEach(s, v) {
        if (!cJSON_IsString(s) || !s->valuestring[0]) return BAD("stop", "'stop' must hold non-empty strings");
        if (dup_string(s, "stop", SERVE_MAX_STOP_BYTES, &r->stop[r->n_stop], NULL, e)) return -1;
        r->n_stop++;
    }
    return 0;
}

/* "prompt": a string, a list of one string, a list of token ids, or a list of one such list. */
static int parse_prompt(const cJSON *v, ServeRequest *r, ServeError *e) {
    if (cJSON_IsArray(v) && cJSON_GetArraySize(v) == 1 &&
        (cJSON_IsString(v->child) || cJSON_IsArray(v->child)))
        v = v->child; /* a batch of one */
    if (cJSON_IsString(v)) return dup_string(v, "prompt", (size_t)64 << 20, &r->prompt, &r->prompt_len, e);
    if (!cJSON_IsArray(v))
        return BAD("prompt", "'prompt' must be a string or a list of token ids (a list of several prompts is not "
                             "supported: n and batches are 1)");
    const int n = cJSON_GetArraySize(v);
    if (n == 0) return BAD("prompt", "'prompt' is empty");
    if (n > (1 << 24)) return BAD("prompt", "'prompt' has too many token ids (%d)", n);
    if (!(r->prompt_ids = malloc(sizeof(int32_t) * n))) return serve_error(e, 500, "server_error", "prompt", "out of memory");
    const cJSON *t;
    cJSON_ArrayForEach(t, v) {
        long id;
        if (get_int(t, "prompt", 0, INT32_MAX, &id, e)) {
            snprintf(e->message, sizeof e->message, "'prompt' as a list must hold token ids (integers >= 0) or be a "
                                                    "list of one string");
            return -1;
        }
        r->prompt_ids[r->n_prompt_ids++] = (int32_t)id;
    }
    return 0;
}

static const char *const ROLES[] = {"system", "user", "assistant", "tool", "developer", "function"};

/* Checks the messages and builds the chat renderer's input: content given as a list of text parts is joined into
 * one string (as vLLM does for string-content templates). */
static int parse_messages(const cJSON *v, cJSON *out, ServeError *e) {
    char b[80];
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) == 0)
        return BAD("messages", "'messages' must be a non-empty list of message objects");
    cJSON *list = cJSON_AddArrayToObject(out, "messages");
    int i = 0;
    for (const cJSON *m = v->child; m; m = m->next, i++) {
        char p[48];
        snprintf(p, sizeof p, "messages[%d]", i);
        if (!cJSON_IsObject(m)) return BAD(p, "'%s' must be an object with a role and content", p);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        int known = 0;
        for (size_t k = 0; k < sizeof ROLES / sizeof *ROLES; k++)
            known |= cJSON_IsString(role) && strcmp(role->valuestring, ROLES[k]) == 0;
        if (!known) {
            show(role ? role : m, b, sizeof b);
            return BAD(p, "'%s.role' must be one of system, user, assistant, tool, developer (got %s)", p, b);
        }
        cJSON *copy = cJSON_Duplicate(m, 1);
        if (!copy) return serve_error(e, 500, "server_error", p, "out of memory");
        cJSON_AddItemToArray(list, copy);
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!content || cJSON_IsNull(content) || cJSON_IsString(content)) continue;
        if (!cJSON_IsArray(content)) {
            show(content, b, sizeof b);
            return BAD(p, "'%s.content' must be a string, null or a list of text parts (got %s)", p, b);
        }
        size_t total = 0;
        const cJSON *part;
        cJSON_ArrayForEach(part, content) {
            const cJSON *ty = cJSON_GetObjectItemCaseSensitive(part, "type");
            const cJSON *tx = cJSON_GetObjectItemCaseSensitive(part, "text");
            if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "text") != 0 || !cJSON_IsString(tx))
                return BAD(p, "'%s.content' parts must be {\"type\": \"text\", \"text\": ...} (images and audio are "
                              "not supported)", p);
            total += strlen(tx->valuestring) + 1;
        }
        char *joined = malloc(total + 1), *w = joined;
        if (!joined) return serve_error(e, 500, "server_error", p, "out of memory");
        cJSON_ArrayForEach(part, content) {
            const char *tx = cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring;
            if (w != joined) *w++ = '\n';
            size_t n = strlen(tx);
            memcpy(w, tx, n);
            w += n;
        }
        *w = 0;
        cJSON_ReplaceItemInObjectCaseSensitive(copy, "content", cJSON_CreateString(joined));
        free(joined);
    }
    return 0;
}

/* Fields accepted and ignored: they change nothing about the output. */
static const char *const IGNORED[] = {"user", "metadata", "parallel_tool_calls", "store", "service_tier"};

int serve_request_parse(const char *body, size_t len, ServeKind kind, ServeRequest *r, ServeError *e) {
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->max_tokens = -1;
    r->temperature = r->top_p = NAN;
    r->top_k = -1;
    r->logprobs = -1;
    r->add_generation_prompt = 1;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (!root) {
        long at = end ? (long)(end - body) : 0;
        return BAD("", "the request body is not valid JSON (error near byte %ld)", at);
    }
    int rc = -1, logprobs_bool = 0, top_logprobs = -1, has_stream_options = 0;
    cJSON *chat = NULL;
    if (!cJSON_IsObject(root)) {
        BAD("", "the request body must be a JSON object");
        goto done;
    }
    if (kind == SERVE_CHAT && !(chat = cJSON_CreateObject())) {
        serve_error(e, 500, "server_error", "", "out of memory");
        goto done;
    }
    if (cJSON_GetArraySize(root) > 64) { /* the known fields are fewer; this bounds the duplicate check below */
        BAD("", "the request has %d fields; at most 64 are allowed", cJSON_GetArraySize(root));
        goto done;
    }
    const cJSON *prompt = NULL, *messages = NULL;
    for (const cJSON *f = root->child; f; f = f->next) {
        const char *k = f->string;
        long iv;
        double dv;
        for (const cJSON *g = root->child; g != f; g = g->next)
            if (strcmp(g->string, k) == 0) {
                BAD(k, "field '%.40s' appears twice", k);
                goto done;
            }
        int ignored = 0;
        for (size_t i = 0; i < sizeof IGNORED / sizeof *IGNORED; i++) ignored |= strcmp(k, IGNORED[i]) == 0;
        if (ignored) continue;
        if (cJSON_IsNull(f) && strcmp(k, "model") != 0 && strcmp(k, "prompt") != 0 && strcmp(k, "messages") != 0)
            continue; /* null = not given, as in OpenAI's API */
        if (strcmp(k, "model") == 0) {
            if (dup_string(f, "model", 256, &r->model, NULL, e)) goto done;
        } else if (strcmp(k, "max_tokens") == 0 || (kind == SERVE_CHAT && strcmp(k, "max_completion_tokens") == 0)) {
            if (get_int(f, k, 1, 1 << 30, &iv, e)) goto done;
            r->max_tokens = (int)iv;
        } else if (strcmp(k, "temperature") == 0) {
            if (get_num(f, k, 0, 2, 0, &r->temperature, e)) goto done;
        } else if (strcmp(k, "top_p") == 0) {
            if (get_num(f, k, 0, 1, 1, &r->top_p, e)) goto done;
        } else if (strcmp(k, "top_k") == 0) { /* vLLM's extension: -1 or 0 = off */
            if (get_int(f, k, -1, 1 << 30, &iv, e)) goto done;
            r->top_k = iv < 0 ? 0 : (int)iv;
        } else if (strcmp(k, "stop") == 0) {
            if (parse_stop(f, r, e)) goto done;
        } else if (strcmp(k, "seed") == 0) {
            char b[80];
            if (!cJSON_IsNumber(f) || f->valuedouble != floor(f->valuedouble) || fabs(f->valuedouble) > 9.007199254740992e15) {
                show(f, b, sizeof b);
                BAD(k, "'seed' must be an integer (got %s)", b);
                goto done;
            }
            r->has_seed = 1;
            r->seed = (uint64_t)(int64_t)f->valuedouble;
        } else if (strcmp(k, "n") == 0 || strcmp(k, "best_of") == 0) {
            if (get_int(f, k, 1, 1 << 30, &iv, e)) goto done;
            if (iv != 1) {
                BAD(k, "'%s' must be 1: zaya serve returns one choice per request", k);
                goto done;
            }
        } else if (strcmp(k, "ignore_eos") == 0) {
            if (get_bool(f, k, &r->ignore_eos, e)) goto done;
        } else if (strcmp(k, "stream") == 0) {
            if (get_bool(f, k, &r->stream, e)) goto done;
        } else if (strcmp(k, "stream_options") == 0) {
            const cJSON *u = cJSON_GetObjectItemCaseSensitive(f, "include_usage");
            if (!cJSON_IsObject(f) || (f->child && (!u || cJSON_GetArraySize(f) != 1))) {
                BAD(k, "'stream_options' must be an object with only 'include_usage'");
                goto done;
            }
            if (u && get_bool(u, "stream_options.include_usage", &r->include_usage, e)) goto done;
            has_stream_options = 1;
        } else if (strcmp(k, "presence_penalty") == 0 || strcmp(k, "frequency_penalty") == 0) {
            if (get_num(f, k, -2, 2, 0, &dv, e)) goto done;
            if (dv != 0) {
                BAD(k, "'%s' is not supported by zaya serve (only 0)", k);
                goto done;
            }
        } else if (strcmp(k, "logit_bias") == 0) {
            if (!cJSON_IsObject(f) || f->child) {
                BAD(k, "'logit_bias' is not supported by zaya serve (only an empty object)");
                goto done;
            }
        } else if (kind == SERVE_COMPLETION && strcmp(k, "prompt") == 0) {
            prompt = f;
        } else if (kind == SERVE_COMPLETION && strcmp(k, "logprobs") == 0) {
            if (get_int(f, k, 0, SERVE_MAX_LOGPROBS, &iv, e)) goto done;
            r->logprobs = (int)iv;
        } else if (kind == SERVE_COMPLETION && strcmp(k, "echo") == 0) {
            int echo;
            if (get_bool(f, k, &echo, e)) goto done;
            if (echo) {
                BAD(k, "'echo' is not supported by zaya serve");
                goto done;
            }
        } else if (kind == SERVE_COMPLETION && strcmp(k, "suffix") == 0) {
            BAD(k, "'suffix' is not supported by zaya serve");
            goto done;
        } else if (kind == SERVE_CHAT && strcmp(k, "messages") == 0) {
            messages = f;
        } else if (kind == SERVE_CHAT && strcmp(k, "logprobs") == 0) {
            if (get_bool(f, k, &logprobs_bool, e)) goto done;
        } else if (kind == SERVE_CHAT && strcmp(k, "top_logprobs") == 0) {
            if (get_int(f, k, 0, SERVE_MAX_TOP_LOGPROBS, &iv, e)) goto done;
            top_logprobs = (int)iv;
        } else if (kind == SERVE_CHAT && strcmp(k, "tools") == 0) {
            if (!cJSON_IsArray(f)) {
                BAD(k, "'tools' must be a list of tool schemas");
                goto done;
            }
            cJSON_AddItemToObject(chat, "tools", cJSON_Duplicate(f, 1));
        } else if (kind == SERVE_CHAT && strcmp(k, "tool_choice") == 0) {
            if (!cJSON_IsString(f) || (strcmp(f->valuestring, "auto") != 0 && strcmp(f->valuestring, "none") != 0)) {
                BAD(k, "'tool_choice' must be \"auto\" or \"none\" (zaya serve does not force tool calls)");
                goto done;
            }
        } else if (kind == SERVE_CHAT && strcmp(k, "response_format") == 0) {
            const cJSON *ty = cJSON_GetObjectItemCaseSensitive(f, "type");
            if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "text") != 0) {
                BAD(k, "'response_format' must be {\"type\": \"text\"} (structured output is not supported)");
                goto done;
            }
        } else if (kind == SERVE_CHAT && strcmp(k, "add_generation_prompt") == 0) {
            if (get_bool(f, k, &r->add_generation_prompt, e)) goto done;
        } else if (kind == SERVE_CHAT && strcmp(k, "chat_template_kwargs") == 0) {
            if (!cJSON_IsObject(f)) {
                BAD(k, "'chat_template_kwargs' must be an object of template variables");
                goto done;
            }
            for (const cJSON *kv = f->child; kv; kv = kv->next) {
                if (strcmp(kv->string, "messages") == 0 || strcmp(kv->string, "tools") == 0 ||
                    strcmp(kv->string, "add_generation_prompt") == 0) {
                    BAD(k, "'chat_template_kwargs' must not set '%s'", kv->string);
                    goto done;
                }
                cJSON_AddItemToObject(chat, kv->string, cJSON_Duplicate(kv, 1));
            }
        } else {
            BAD(k, "unknown field '%.40s' for %s", k, kind == SERVE_CHAT ? "/v1/chat/completions" : "/v1/completions");
            goto done;
        }
    }
    if (!r->model) {
        BAD("model", "'model' is required");
        goto done;
    }
    if (has_stream_options && !r->stream) {
        BAD("stream_options", "'stream_options' is only allowed with stream: true");
        goto done;
    }
    if (kind == SERVE_COMPLETION) {
        if (!prompt || cJSON_IsNull(prompt)) {
            BAD("prompt", "'prompt' is required");
            goto done;
        }
        if (parse_prompt(prompt, r, e)) goto done;
    } else {
        if (!messages) {
            BAD("messages", "'messages' is required");
            goto done;
        }
        if (top_logprobs >= 0 && !logprobs_bool) {
            BAD("top_logprobs", "'top_logprobs' needs 'logprobs': true");
            goto done;
        }
        if (logprobs_bool) r->logprobs = top_logprobs > 0 ? top_logprobs : 0;
        if (parse_messages(messages, chat, e)) goto done;
        if (!(r->chat_json = cJSON_PrintUnformatted(chat))) {
            serve_error(e, 500, "server_error", "", "out of memory");
            goto done;
        }
    }
    rc = 0;
done:
    cJSON_Delete(chat);
    cJSON_Delete(root);
    if (rc) serve_request_free(r);
    return rc;
}

void serve_request_free(ServeRequest *r) {
    free(r->model);
    free(r->prompt);
    free(r->prompt_ids);
    free(r->chat_json);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    memset(r, 0, sizeof *r);
    r->max_tokens = -1;
    r->logprobs = -1;
}

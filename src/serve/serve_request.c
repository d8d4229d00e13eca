/* OpenAI (and vLLM) request bodies → ServeRequest. Strict like OpenAI's own API: a body that is not one JSON value in
 * UTF-8 is a 400, so is a field of the wrong type or out of range, naming it, and an unknown field too (a misspelt
 * "max_token" silently ignored would be worse); the options zaya does not implement (suffix, best_of > 1, images ...)
 * are refused by name rather than ignored. */
#include "serve/serve_request.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/serve_tools.h"
#include "serve/serve_utf8.h"

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
    if (cJSON_IsNumber(v) && !isfinite(v->valuedouble)) { /* 1e309: cJSON holds inf and would print null */
        snprintf(out, cap, "a number too large to represent");
        return;
    }
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

static int oom(ServeError *e, const char *param) { return serve_error(e, 500, "server_error", param, "out of memory"); }

/* A list of token ids into p (param names the field in messages). */
static int parse_ids(const cJSON *v, const char *param, int allow_empty, ServePrompt *p, ServeError *e) {
    const int n = cJSON_GetArraySize(v);
    if (n == 0 && !allow_empty) return BAD(param, "'%s' is empty", param);
    if (n > (1 << 24)) return BAD(param, "'%s' has too many token ids (%d)", param, n);
    if (!(p->ids = malloc(sizeof(int32_t) * (n ? n : 1)))) return oom(e, param);
    const cJSON *t;
    cJSON_ArrayForEach(t, v) {
        long id = 0;
        if (get_int(t, param, 0, INT32_MAX, &id, e)) {
            snprintf(e->message, sizeof e->message, "'%s' must hold token ids (integers >= 0)", param);
            return -1;
        }
        p->ids[p->n_ids++] = (int32_t)id;
    }
    return 0;
}

/* "prompt": a string, a list of token ids, or a batch: a list of strings or of token-id lists (one choice set per
 * prompt, in order). */
static int parse_prompt(const cJSON *v, ServeRequest *r, ServeError *e) {
    static const char *const what = "'prompt' must be a string, a list of token ids, or a list of strings or of "
                                    "token-id lists";
    const int batch = cJSON_IsArray(v) && v->child && (cJSON_IsString(v->child) || cJSON_IsArray(v->child));
    const int n = batch ? cJSON_GetArraySize(v) : 1;
    if (!cJSON_IsString(v) && !cJSON_IsArray(v)) return BAD("prompt", "%s", what);
    if (n > SERVE_MAX_PROMPTS) return BAD("prompt", "'prompt' holds %d prompts; at most %d are allowed", n, SERVE_MAX_PROMPTS);
    if (!(r->prompts = calloc((size_t)n, sizeof *r->prompts))) return oom(e, "prompt");
    r->n_prompts = n;
    const cJSON *one = batch ? v->child : v;
    for (int i = 0; i < n; i++, one = one->next) {
        ServePrompt *p = &r->prompts[i];
        if (batch && !(cJSON_IsString(one) ? cJSON_IsString(v->child) : cJSON_IsArray(one) && cJSON_IsArray(v->child)))
            return BAD("prompt", "%s (not a mix)", what);
        if (cJSON_IsString(one)) {
            if (dup_string(one, "prompt", (size_t)64 << 20, &p->text, &p->len, e)) return -1;
        } else if (parse_ids(one, "prompt", 0, p, e)) {
            return -1;
        }
    }
    return 0;
}

/* "logit_bias": {"token id": bias in [-100, 100], ...}. */
static int parse_logit_bias(const cJSON *v, ServeRequest *r, ServeError *e) {
    if (!cJSON_IsObject(v)) return BAD("logit_bias", "'logit_bias' must be an object mapping token ids to biases");
    const int n = cJSON_GetArraySize(v);
    if (n > SERVE_MAX_LOGIT_BIAS)
        return BAD("logit_bias", "'logit_bias' has %d entries; at most %d are allowed", n, SERVE_MAX_LOGIT_BIAS);
    if (!(r->bias_ids = malloc(sizeof(int32_t) * (n ? n : 1))) || !(r->bias = malloc(sizeof(float) * (n ? n : 1))))
        return oom(e, "logit_bias");
    for (const cJSON *b = v->child; b; b = b->next) {
        char *end;
        const long id = strtol(b->string, &end, 10);
        if (!b->string[0] || *end || id < 0 || id > INT32_MAX || b->string[0] == '-' || b->string[0] == '+')
            return BAD("logit_bias", "'logit_bias' keys must be token ids (got \"%.40s\")", b->string);
        double bias;
        if (get_num(b, "logit_bias", -100, 100, 0, &bias, e)) return -1;
        r->bias_ids[r->n_bias] = (int32_t)id;
        r->bias[r->n_bias++] = (float)bias;
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
        if (serve_tools_message(copy, p, e)) return -1;
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

static int is(const char *k, const char *name) { return strcmp(k, name) == 0; }

/* "chat_template_kwargs": template variables beside the messages. */
static int parse_template_kwargs(const cJSON *f, cJSON *chat, ServeError *e) {
    if (!cJSON_IsObject(f)) return BAD(f->string, "'chat_template_kwargs' must be an object of template variables");
    for (const cJSON *kv = f->child; kv; kv = kv->next) {
        if (is(kv->string, "messages") || is(kv->string, "tools") || is(kv->string, "add_generation_prompt"))
            return BAD(f->string, "'chat_template_kwargs' must not set '%s'", kv->string);
        cJSON_AddItemToObject(chat, kv->string, cJSON_Duplicate(kv, 1));
    }
    return 0;
}

/* "rsa": {"population", "subset", "rounds", "tail"}, each optional (8, 4, 3, 1024), K <= N; the server checks N
 * against its --max-batch (serve/reason.h's rsa_shape_check). */
static int parse_rsa(const cJSON *f, ServeRsa *rsa, ServeError *e) {
    if (!cJSON_IsObject(f))
        return BAD("rsa", "'rsa' must be an object: {\"population\": N, \"subset\": K, \"rounds\": T, \"tail\": "
                   "tokens}");
    *rsa = (ServeRsa){.population = 8, .subset = 4, .rounds = 3, .tail = 1024};
    const cJSON *subset = NULL;
    for (const cJSON *v = f->child; v; v = v->next) {
        char name[64];
        snprintf(name, sizeof name, "rsa.%.40s", v->string);
        for (const cJSON *w = f->child; w != v; w = w->next)
            if (is(w->string, v->string)) return BAD(name, "field '%s' appears twice", name);
        long iv;
        if (is(v->string, "population")) {
            if (get_int(v, name, 1, SERVE_RSA_MAX_POPULATION, &iv, e)) return -1;
            rsa->population = (int)iv;
        } else if (is(v->string, "subset")) {
            subset = v; /* checked against the population, which may come after it */
        } else if (is(v->string, "rounds")) {
            if (get_int(v, name, 1, SERVE_RSA_MAX_ROUNDS, &iv, e)) return -1;
            rsa->rounds = (int)iv;
        } else if (is(v->string, "tail")) {
            if (get_int(v, name, 1, SERVE_RSA_MAX_TAIL, &iv, e)) return -1;
            rsa->tail = (int)iv;
        } else {
            return BAD(name, "unknown field '%s' (rsa takes population, subset, rounds, tail)", name);
        }
    }
    long k = rsa->subset < rsa->population ? rsa->subset : rsa->population; /* the default K, if N is smaller */
    if (subset && get_int(subset, "rsa.subset", 1, rsa->population, &k, e)) return -1;
    rsa->subset = (int)k;
    return 0;
}

/* One field of a completions or chat request (the sampling and output options both take). 1: not such a field. */
static int parse_generation_field(const cJSON *f, ServeRequest *r, int *has_stream_options, ServeError *e) {
    const char *k = f->string;
    const ServeKind kind = r->kind;
    long iv;
    if (is(k, "max_tokens") || (kind == SERVE_CHAT && is(k, "max_completion_tokens"))) {
        if (get_int(f, k, kind == SERVE_COMPLETION ? 0 : 1, 1 << 30, &iv, e)) return -1; /* 0: with echo */
        r->max_tokens = (int)iv;
    } else if (is(k, "temperature")) {
        return get_num(f, k, 0, 2, 0, &r->temperature, e);
    } else if (is(k, "top_p")) {
        return get_num(f, k, 0, 1, 1, &r->top_p, e);
    } else if (is(k, "top_k")) { /* vLLM's extension: -1 or 0 = off */
        if (get_int(f, k, -1, 1 << 30, &iv, e)) return -1;
        r->top_k = iv < 0 ? 0 : (int)iv;
    } else if (is(k, "min_p")) {
        return get_num(f, k, 0, 1, 0, &r->min_p, e);
    } else if (is(k, "presence_penalty")) {
        return get_num(f, k, -2, 2, 0, &r->presence_penalty, e);
    } else if (is(k, "frequency_penalty")) {
        return get_num(f, k, -2, 2, 0, &r->frequency_penalty, e);
    } else if (is(k, "repetition_penalty")) {
        return get_num(f, k, 0, 10, 1, &r->repetition_penalty, e);
    } else if (is(k, "logit_bias")) {
        return parse_logit_bias(f, r, e);
    } else if (is(k, "stop")) {
        return parse_stop(f, r, e);
    } else if (is(k, "stop_token_ids")) {
        if (!cJSON_IsArray(f) || cJSON_GetArraySize(f) > SERVE_MAX_STOP_IDS)
            return BAD(k, "'stop_token_ids' must be a list of up to %d token ids", SERVE_MAX_STOP_IDS);
        ServePrompt ids = {0};
        if (parse_ids(f, k, 1, &ids, e)) {
            free(ids.ids);
            return -1;
        }
        r->stop_ids = ids.ids;
        r->n_stop_ids = ids.n_ids;
    } else if (is(k, "include_stop_str_in_output")) {
        return get_bool(f, k, &r->include_stop_str, e);
    } else if (is(k, "skip_special_tokens")) {
        return get_bool(f, k, &r->skip_special_tokens, e);
    } else if (is(k, "seed")) {
        char b[80];
        if (!cJSON_IsNumber(f) || f->valuedouble != floor(f->valuedouble) || fabs(f->valuedouble) > 9.007199254740992e15) {
            show(f, b, sizeof b);
            return BAD(k, "'seed' must be an integer (got %s)", b);
        }
        r->has_seed = 1;
        r->seed = (uint64_t)(int64_t)f->valuedouble;
    } else if (is(k, "n")) {
        if (get_int(f, k, 1, SERVE_MAX_N, &iv, e)) return -1;
        r->n = (int)iv;
    } else if (is(k, "best_of")) {
        if (get_int(f, k, 1, 1 << 30, &iv, e)) return -1;
        if (iv != 1) return BAD(k, "'best_of' must be 1: zaya serve returns every choice it samples (use n)");
    } else if (is(k, "ignore_eos")) {
        return get_bool(f, k, &r->ignore_eos, e);
    } else if (is(k, "stream")) {
        return get_bool(f, k, &r->stream, e);
    } else if (is(k, "stream_options")) {
        const cJSON *u = cJSON_GetObjectItemCaseSensitive(f, "include_usage");
        if (!cJSON_IsObject(f) || (f->child && (!u || cJSON_GetArraySize(f) != 1)))
            return BAD(k, "'stream_options' must be an object with only 'include_usage'");
        if (u && get_bool(u, "stream_options.include_usage", &r->include_usage, e)) return -1;
        *has_stream_options = 1;
    } else {
        return 1;
    }
    return 0;
}

/* response_format: {"type": "text"}, {"type": "json_object"} or {"type": "json_schema", "json_schema": {"name",
 * "description", "schema", "strict"}}; the schema itself is checked when the server compiles it. */
static int parse_response_format(const cJSON *f, ServeRequest *r, ServeError *e) {
    const char *k = "response_format";
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(f, "type");
    if (!cJSON_IsObject(f) || !cJSON_IsString(ty))
        return BAD(k, "'response_format' must be an object with a \"type\": \"text\", \"json_object\" or "
                   "\"json_schema\"");
    const cJSON *m;
    cJSON_ArrayForEach(m, f)
        if (!is(m->string, "type") && !(is(m->string, "json_schema") && is(ty->valuestring, "json_schema")))
            return BAD(k, "'response_format' has an unknown field '%s'", m->string);
    if (is(ty->valuestring, "text")) return 0;
    if (is(ty->valuestring, "json_object")) {
        r->response_format = SERVE_FORMAT_JSON_OBJECT;
        return 0;
    }
    if (!is(ty->valuestring, "json_schema"))
        return BAD(k, "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\" (got \"%.64s\")",
                   ty->valuestring);
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(f, "json_schema");
    if (!cJSON_IsObject(js)) return BAD(k, "'response_format.json_schema' must be an object with a \"schema\"");
    cJSON_ArrayForEach(m, js) {
        if (is(m->string, "name") || is(m->string, "description")) {
            if (!cJSON_IsString(m)) return BAD(k, "'response_format.json_schema.%s' must be a string", m->string);
        } else if (is(m->string, "strict")) { /* the output always follows the schema: strict or not */
            if (!cJSON_IsBool(m) && !cJSON_IsNull(m))
                return BAD(k, "'response_format.json_schema.strict' must be true or false");
        } else if (!is(m->string, "schema")) {
            return BAD(k, "'response_format.json_schema' has an unknown field '%s'", m->string);
        }
    }
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(js, "name");
    if (!name || !name->valuestring[0]) return BAD(k, "'response_format.json_schema.name' is required");
    const cJSON *schema = cJSON_GetObjectItemCaseSensitive(js, "schema");
    if (!cJSON_IsObject(schema)) return BAD(k, "'response_format.json_schema.schema' must be an object (a JSON Schema)");
    if (!(r->json_schema = cJSON_PrintUnformatted(schema))) return serve_error(e, 500, "server_error", "", "out of memory");
    r->response_format = SERVE_FORMAT_JSON_SCHEMA;
    return 0;
}

int serve_request_parse(const char *body, size_t len, ServeKind kind, ServeRequest *r, ServeError *e) {
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->max_tokens = -1;
    r->temperature = r->top_p = NAN;
    r->top_k = -1;
    r->repetition_penalty = 1;
    r->skip_special_tokens = -1;
    r->n = 1;
    r->logprobs = -1;
    r->add_generation_prompt = 1;
    r->add_special_tokens = -1;
    /* JSON text is UTF-8 (RFC 8259): raw bytes that are not, even inside a string, make it invalid */
    const size_t valid = serve_utf8_valid_len(body, len);
    if (valid < len) return BAD("", "the request body is not valid UTF-8 (byte %zu)", valid);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (!root) {
        long at = end ? (long)(end - body) : 0;
        return BAD("", "the request body is not valid JSON (error near byte %ld)", at);
    }
    int rc = -1, logprobs_bool = 0, top_logprobs = -1, has_stream_options = 0;
    cJSON *chat = NULL;
    while (end < body + len && (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r')) end++;
    if (end < body + len) {
        BAD("", "the request body is not valid JSON: more follows the JSON value (byte %ld)", (long)(end - body));
        goto done;
    }
    if (!cJSON_IsObject(root)) {
        BAD("", "the request body must be a JSON object");
        goto done;
    }
    if ((kind == SERVE_CHAT || kind == SERVE_TOKENIZE) && !(chat = cJSON_CreateObject())) {
        oom(e, "");
        goto done;
    }
    if (cJSON_GetArraySize(root) > 64) { /* the known fields are fewer; this bounds the duplicate check below */
        BAD("", "the request has %d fields; at most 64 are allowed", cJSON_GetArraySize(root));
        goto done;
    }
    static const char *const ROUTE[] = {"/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"};
    const int generates = kind == SERVE_COMPLETION || kind == SERVE_CHAT;
    const cJSON *prompt = NULL, *messages = NULL, *tokens = NULL, *tools = NULL, *tool_choice = NULL;
    for (const cJSON *f = root->child; f; f = f->next) {
        const char *k = f->string;
        long iv;
        for (const cJSON *g = root->child; g != f; g = g->next)
            if (is(g->string, k)) {
                BAD(k, "field '%.40s' appears twice", k);
                goto done;
            }
        int ignored = 0;
        for (size_t i = 0; i < sizeof IGNORED / sizeof *IGNORED; i++) ignored |= is(k, IGNORED[i]);
        if (ignored && generates) continue;
        if (cJSON_IsNull(f) && !is(k, "model") && !is(k, "prompt") && !is(k, "messages") && !is(k, "tokens"))
            continue; /* null = not given, as in OpenAI's API */
        int got = 1;
        if (is(k, "model")) {
            if (dup_string(f, "model", 256, &r->model, NULL, e)) goto done;
        } else if (generates && (got = parse_generation_field(f, r, &has_stream_options, e)) <= 0) {
            if (got < 0) goto done;
        } else if ((kind == SERVE_COMPLETION || kind == SERVE_TOKENIZE) && is(k, "prompt")) {
            prompt = f;
        } else if ((kind == SERVE_CHAT || kind == SERVE_TOKENIZE) && is(k, "messages")) {
            messages = f;
        } else if (kind == SERVE_DETOKENIZE && is(k, "tokens")) {
            tokens = f;
        } else if (kind == SERVE_COMPLETION && is(k, "logprobs")) {
            if (get_int(f, k, 0, SERVE_MAX_LOGPROBS, &iv, e)) goto done;
            r->logprobs = (int)iv;
        } else if (kind == SERVE_COMPLETION && is(k, "echo")) {
            if (get_bool(f, k, &r->echo, e)) goto done;
        } else if (kind == SERVE_COMPLETION && is(k, "suffix")) {
            BAD(k, "'suffix' is not supported by zaya serve");
            goto done;
        } else if (kind == SERVE_CHAT && is(k, "logprobs")) {
            if (get_bool(f, k, &logprobs_bool, e)) goto done;
        } else if (kind == SERVE_CHAT && is(k, "top_logprobs")) {
            if (get_int(f, k, 0, SERVE_MAX_TOP_LOGPROBS, &iv, e)) goto done;
            top_logprobs = (int)iv;
        } else if ((kind == SERVE_CHAT || kind == SERVE_TOKENIZE) && is(k, "tools")) {
            tools = f; /* checked with tool_choice below, whatever their order */
            cJSON_AddItemToObject(chat, "tools", cJSON_Duplicate(f, 1));
        } else if (kind == SERVE_CHAT && is(k, "tool_choice")) {
            tool_choice = f;
        } else if ((kind == SERVE_CHAT || kind == SERVE_COMPLETION) && is(k, "response_format")) {
            if (parse_response_format(f, r, e)) goto done;
        } else if (kind == SERVE_CHAT && is(k, "rsa")) {
            if (parse_rsa(f, &r->rsa, e)) goto done;
        } else if ((kind == SERVE_CHAT || kind == SERVE_TOKENIZE) && is(k, "add_generation_prompt")) {
            if (get_bool(f, k, &r->add_generation_prompt, e)) goto done;
        } else if ((kind == SERVE_CHAT || kind == SERVE_TOKENIZE) && is(k, "chat_template_kwargs")) {
            if (parse_template_kwargs(f, chat, e)) goto done;
        } else if (kind == SERVE_TOKENIZE && is(k, "add_special_tokens")) {
            if (get_bool(f, k, &r->add_special_tokens, e)) goto done;
        } else if (kind == SERVE_TOKENIZE && is(k, "return_token_strs")) {
            if (get_bool(f, k, &r->return_token_strs, e)) goto done;
        } else {
            BAD(k, "unknown field '%.40s' for %s", k, ROUTE[kind]);
            goto done;
        }
    }
    if (!r->model && generates) {
        BAD("model", "'model' is required");
        goto done;
    }
    if (has_stream_options && !r->stream) {
        BAD("stream_options", "'stream_options' is only allowed with stream: true");
        goto done;
    }
    if (kind == SERVE_TOKENIZE && !!prompt == !!messages) {
        BAD(prompt ? "messages" : "prompt", "/tokenize takes either 'prompt' or 'messages'");
        goto done;
    }
    if (kind == SERVE_COMPLETION || (kind == SERVE_TOKENIZE && prompt)) {
        if (!prompt || cJSON_IsNull(prompt)) {
            BAD("prompt", "'prompt' is required");
            goto done;
        }
        if (kind == SERVE_TOKENIZE && !cJSON_IsString(prompt)) {
            BAD("prompt", "/tokenize's 'prompt' must be a string");
            goto done;
        }
        if (parse_prompt(prompt, r, e)) goto done;
        if (r->max_tokens == 0 && !r->echo) {
            BAD("max_tokens", "'max_tokens' must be at least 1 (0 only with echo: true)");
            goto done;
        }
        if ((long)r->n_prompts * r->n > SERVE_MAX_CHOICES) {
            BAD("n", "%d prompts x n = %d choices; at most %d are allowed", r->n_prompts, r->n_prompts * r->n,
                SERVE_MAX_CHOICES);
            goto done;
        }
    } else if (kind == SERVE_DETOKENIZE) {
        if (!cJSON_IsArray(tokens)) {
            BAD("tokens", "'tokens' must be a list of token ids");
            goto done;
        }
        if (!(r->prompts = calloc(1, sizeof *r->prompts))) {
            oom(e, "tokens");
            goto done;
        }
        r->n_prompts = 1;
        if (parse_ids(tokens, "tokens", 1, &r->prompts[0], e)) goto done;
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
        if (r->rsa.population > 0 && (r->stream || r->n > 1 || logprobs_bool || tools ||
                                      r->response_format != SERVE_FORMAT_TEXT)) { /* RSA answers one whole trace */
            const char *f = r->stream ? "stream" : r->n > 1 ? "n" : logprobs_bool ? "logprobs" : tools ? "tools"
                                                                                         : "response_format";
            BAD(f, "'%s' is not supported with 'rsa' (the answer is one trace chosen after the last round)", f);
            goto done;
        }
        if (parse_messages(messages, chat, e) || serve_tools_parse_request(tools, tool_choice, r, e)) goto done;
        if (!(r->chat_json = cJSON_PrintUnformatted(chat))) {
            oom(e, "");
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
    for (int i = 0; i < r->n_prompts; i++) {
        free(r->prompts[i].text);
        free(r->prompts[i].ids);
    }
    free(r->prompts);
    free(r->bias_ids);
    free(r->bias);
    free(r->stop_ids);
    free(r->chat_json);
    free(r->json_schema);
    free(r->tools_json);
    free(r->tool_name);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    memset(r, 0, sizeof *r);
    r->max_tokens = -1;
    r->logprobs = -1;
}

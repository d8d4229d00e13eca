/* chat_template: Hugging Face chat templates for a model folder (see chat_template.h): where transformers finds the
 * template and the special tokens, and apply_chat_template's variables (the messages normalised as transformers
 * does, tools, documents, the special tokens, --set values), rendered by the Jinja engine in src/jinja/. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "tokenizer/chat_template.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "jinja/jinja.h"
#include "jinja/jinja_value.h"

/* ------------------------------------------------------------------------------------------------------------ */
/* Templates: the engine's */

int chat_template_parse(const char *src, size_t len, ChatTemplate **out, ZyErr *err) {
    return jinja_parse(src, len, out, err);
}

void chat_template_free(ChatTemplate *t) { jinja_free(t); }

int chat_template_render(const ChatTemplate *t, const char *vars_json, size_t vars_len, const ChatRenderOpts *opts,
                         char **out, size_t *out_len, ZyErr *err) {
    return jinja_render_json(t, vars_json, vars_len, opts, out, out_len, err);
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Model folders: where transformers finds the template and the special tokens */

const char *const chat_special_names[CHAT_N_SPECIAL] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                                        "pad_token", "cls_token", "mask_token"};

void chat_config_free(ChatConfig *cfg) {
    if (!cfg) return;
    free(cfg->source);
    free(cfg->tool_source);
    for (int k = 0; k < CHAT_N_SPECIAL; k++) free(cfg->special[k]);
    memset(cfg, 0, sizeof *cfg);
}

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static char *dup_str(const Str *s) {
    char *p = malloc(s->len + 1);
    if (p) memcpy(p, s->s, s->len + 1);
    return p;
}

/* Fills the special tokens still missing from a tokenizer_config.json / special_tokens_map.json image. */
static int read_specials(const Dict *d, ChatConfig *cfg, ZyErr *err) {
    for (int k = 0; k < CHAT_N_SPECIAL; k++) {
        if (cfg->special[k]) continue;
        Val *v = dict_get_s(d, chat_special_names[k], strlen(chat_special_names[k]));
        if (!v) continue;
        if (v->kind == V_DICT) v = dict_get_s(v->u.p, "content", 7); /* an AddedToken object */
        if (!v || v->kind != V_STR) continue;
        if (!(cfg->special[k] = dup_str(v->u.p))) return zy_fail(err, "out of memory");
    }
    return 0;
}

/* tokenizer_config.json's "chat_template" as a list of {name, template}: "default" and "tool_use". */
static int read_named_templates(const List *l, const char *config, ChatConfig *cfg, ZyErr *err) {
    char names[256] = "";
    for (size_t k = 0; k < l->n; k++) {
        if (l->v[k].kind != V_DICT) continue;
        Val *nm = dict_get_s(l->v[k].u.p, "name", 4), *tp = dict_get_s(l->v[k].u.p, "template", 8);
        if (!nm || nm->kind != V_STR || !tp || tp->kind != V_STR) continue;
        const char *name = ((Str *)nm->u.p)->s;
        if (strlen(names) + strlen(name) + 8 < sizeof names)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s'%s'", names[0] ? ", " : "", name);
        char **dst = !strcmp(name, "default") ? &cfg->source : !strcmp(name, "tool_use") ? &cfg->tool_source : NULL;
        size_t *dlen = dst == &cfg->source ? &cfg->source_len : &cfg->tool_source_len;
        if (!dst || *dst) continue;
        if (!(*dst = dup_str(tp->u.p))) return zy_fail(err, "out of memory");
        *dlen = ((Str *)tp->u.p)->len;
    }
    if (!cfg->source)
        return zy_fail(err, "%s: chat_template has several templates and none named 'default' (%s)", config, names);
    snprintf(cfg->origin, sizeof cfg->origin, "%.400s: chat_template 'default'", config);
    return 0;
}

/* chat_config_load, with the template from template_file instead of the folder's when it is not NULL. */
static int config_load(const char *path, const char *template_file, ChatConfig *cfg, ZyErr *err) {
    memset(cfg, 0, sizeof *cfg);
    char dir[4096], file[4200], jinja[4200] = "", config[4200];
    struct stat st;
    if (stat(path, &st) != 0) return zy_fail(err, "%s: %s", path, strerror(errno));
    size_t plen = strlen(path);
    if (plen >= sizeof dir) return zy_fail(err, "%s: path too long", path);
    if (S_ISDIR(st.st_mode)) {
        memcpy(dir, path, plen + 1);
    } else {
        const char *slash = strrchr(path, '/');
        if (plen > 6 && !strcmp(path + plen - 6, ".jinja")) snprintf(jinja, sizeof jinja, "%s", path);
        if (slash) {
            memcpy(dir, path, (size_t)(slash - path));
            dir[slash - path] = '\0';
            if (!dir[0]) snprintf(dir, sizeof dir, "/");
        } else {
            snprintf(dir, sizeof dir, ".");
        }
    }
    snprintf(config, sizeof config, "%s/tokenizer_config.json", dir);
    if (template_file) snprintf(jinja, sizeof jinja, "%s", template_file);
    if (!jinja[0]) {
        snprintf(file, sizeof file, "%s/chat_template.jinja", dir);
        if (file_exists(file)) snprintf(jinja, sizeof jinja, "%s", file);
    }
    R r;
    r_init(&r, NULL, err);
    int rc = -1;
    char *text = NULL;
    size_t len;
    if (jinja[0]) {
        if (zy_read_file(jinja, &cfg->source, &cfg->source_len, err)) goto done;
        snprintf(cfg->origin, sizeof cfg->origin, "%.500s", jinja);
        snprintf(file, sizeof file, "%s/additional_chat_templates/tool_use.jinja", dir);
        if (!template_file && file_exists(file) && zy_read_file(file, &cfg->tool_source, &cfg->tool_source_len, err))
            goto done;
    }
    const char *maps[2] = {config, NULL};
    char map2[4200];
    snprintf(map2, sizeof map2, "%s/special_tokens_map.json", dir);
    maps[1] = map2;
    for (int m = 0; m < 2; m++) {
        if (!file_exists(maps[m])) continue;
        Val v;
        if (zy_read_file(maps[m], &text, &len, err) || json_parse(&r, text, len, maps[m], &v)) goto done;
        free(text);
        text = NULL;
        if (v.kind != V_DICT) {
            zy_fail(err, "%s: a JSON object is required", maps[m]);
            goto done;
        }
        if (read_specials(v.u.p, cfg, err)) goto done;
        Val *t = m == 0 && !cfg->source ? dict_get_s(v.u.p, "chat_template", 13) : NULL;
        if (t && t->kind == V_STR) {
            if (!(cfg->source = dup_str(t->u.p))) {
                zy_fail(err, "out of memory");
                goto done;
            }
            cfg->source_len = ((Str *)t->u.p)->len;
            snprintf(cfg->origin, sizeof cfg->origin, "%.400s: chat_template", config);
        } else if (t && t->kind == V_LIST && read_named_templates(t->u.p, config, cfg, err)) {
            goto done;
        }
    }
    if (!cfg->source) {
        zy_fail(err, "%s: no chat template (neither chat_template.jinja nor a \"chat_template\" in tokenizer_config.json)", dir);
        goto done;
    }
    rc = 0;
done:
    free(text);
    r_free(&r);
    if (rc) chat_config_free(cfg);
    return rc;
}

int chat_config_load(const char *path, ChatConfig *cfg, ZyErr *err) { return config_load(path, NULL, cfg, err); }

int chat_config_load_template(const char *path, const char *template_file, ChatConfig *cfg, ZyErr *err) {
    return config_load(path, template_file, cfg, err);
}

/* ------------------------------------------------------------------------------------------------------------ */
/* apply_chat_template */

struct ChatRenderer {
    ChatTemplate *tpl, *tool_tpl; /* tool_tpl: transformers' "tool_use" template, used when tools are given */
    char origin[512];
    char *special[CHAT_N_SPECIAL];
};

void chat_renderer_free(ChatRenderer *c) {
    if (!c) return;
    chat_template_free(c->tpl);
    chat_template_free(c->tool_tpl);
    for (int k = 0; k < CHAT_N_SPECIAL; k++) free(c->special[k]);
    free(c);
}

int chat_renderer_new(const ChatConfig *cfg, ChatRenderer **out, ZyErr *err) {
    *out = NULL;
    ChatRenderer *c = calloc(1, sizeof *c);
    if (!c) return zy_fail(err, "out of memory");
    snprintf(c->origin, sizeof c->origin, "%s", cfg->origin);
    for (int k = 0; k < CHAT_N_SPECIAL; k++)
        if (cfg->special[k] && !(c->special[k] = strdup(cfg->special[k]))) {
            chat_renderer_free(c);
            return zy_fail(err, "out of memory");
        }
    if (chat_template_parse(cfg->source, cfg->source_len, &c->tpl, err) ||
        (cfg->tool_source && chat_template_parse(cfg->tool_source, cfg->tool_source_len, &c->tool_tpl, err))) {
        zy_wrap(err, "%s%s", cfg->origin, c->tpl ? " (tool_use)" : "");
        chat_renderer_free(c);
        return -1;
    }
    *out = c;
    return 0;
}

/* transformers' _normalize_chat_messages (drop None values) and _alias_reasoning_fields. */
static int normalize_messages(R *r, Val msgs, Val *out) {
    if (msgs.kind != V_LIST) return zy_fail(r->err, "messages: a JSON list of message objects is required");
    List *l = msgs.u.p, *o = list_new(r, l->n, LF_PLAIN);
    if (!o) return -1;
    if (l->n == 0) return zy_fail(r->err, "messages: the conversation is empty");
    static const char *const reasoning_keys[] = {"reasoning_content", "thinking", "reasoning"};
    for (size_t i = 0; i < l->n; i++) {
        if (l->v[i].kind != V_DICT) return zy_fail(r->err, "messages: message %zu is not a JSON object", i);
        Dict *m = l->v[i].u.p, *d = dict_new(r);
        if (!d) return -1;
        Val *reason = NULL;
        for (size_t k = 0; k < ZY_ARRAY_LEN(reasoning_keys) && !reason; k++) {
            Val *x = dict_get_s(m, reasoning_keys[k], strlen(reasoning_keys[k]));
            if (x && x->kind != V_NONE) reason = x;
        }
        Str *thinking = reason ? rstrz(r, "thinking") : NULL, *rc = reason ? rstrz(r, "reasoning_content") : NULL;
        if (reason && (!thinking || !rc || dict_set(r, d, v_ptr(V_STR, thinking), *reason))) return -1;
        for (size_t k = 0; k < m->n; k++)
            if (m->v[k].kind != V_NONE && dict_set(r, d, m->k[k], m->v[k])) return -1;
        if (reason && dict_set(r, d, v_ptr(V_STR, rc), *reason)) return -1;
        o->v[i] = v_ptr(V_DICT, d);
    }
    *out = v_ptr(V_LIST, o);
    return 0;
}

static int set_var(R *r, Dict *vars, const char *name, Val v) {
    Str *k = rstrz(r, name);
    return k ? dict_set(r, vars, v_ptr(V_STR, k), v) : -1;
}

static const char *const reserved_vars[] = {"messages", "tools", "documents", "add_generation_prompt"};

/* The variables of one apply_chat_template call: special tokens, then extra (the caller's kwargs, which win over
 * them), then messages / tools / documents / add_generation_prompt; renders with the template tools pick. */
static int render_chat(const ChatRenderer *c, R *r, Val msgs, Val tools, Val documents, Val agp, const Dict *extra,
                       char **out, size_t *out_len) {
    Dict *vars = dict_new(r);
    if (!vars) return -1;
    for (int k = 0; k < CHAT_N_SPECIAL; k++) {
        Str *s = c->special[k] ? rstrz(r, c->special[k]) : NULL;
        if (c->special[k] && (!s || set_var(r, vars, chat_special_names[k], v_ptr(V_STR, s)))) return -1;
    }
    for (size_t k = 0; extra && k < extra->n; k++) {
        Str *name = extra->k[k].u.p;
        for (size_t j = 0; j < ZY_ARRAY_LEN(reserved_vars); j++)
            if (!strcmp(name->s, reserved_vars[j]))
                return zy_fail(r->err, "the variable '%s' is set from the conversation itself", name->s);
        if (dict_set(r, vars, extra->k[k], extra->v[k])) return -1;
    }
    if (normalize_messages(r, msgs, &msgs) || set_var(r, vars, "messages", msgs)) return -1;
    if (tools.kind == V_LIST) {
        List *l = tools.u.p;
        for (size_t k = 0; k < l->n; k++)
            if (l->v[k].kind != V_DICT)
                return zy_fail(r->err, "tools: tool %zu is not a JSON object (a JSON schema is expected)", k);
    } else if (tools.kind != V_NONE) {
        return zy_fail(r->err, "tools: a JSON list of tool schemas is required");
    }
    if (documents.kind == V_LIST) {
        List *l = documents.u.p;
        for (size_t k = 0; k < l->n; k++)
            if (l->v[k].kind != V_DICT) return zy_fail(r->err, "documents: document %zu is not a JSON object", k);
    } else if (documents.kind != V_NONE) {
        return zy_fail(r->err, "documents: a JSON list of documents is required");
    }
    if (set_var(r, vars, "tools", tools) || set_var(r, vars, "documents", documents) ||
        set_var(r, vars, "add_generation_prompt", agp))
        return -1;
    r->need_pos = 0;
    const ChatTemplate *t = tools.kind != V_NONE && c->tool_tpl ? c->tool_tpl : c->tpl;
    return jinja_render_vars(t, r, vars, out, out_len);
}

int chat_renderer_render(const ChatRenderer *c, const ChatInput *in, const ChatRenderOpts *opts, char **out,
                         size_t *out_len, ZyErr *err) {
    *out = NULL;
    if (out_len) *out_len = 0;
    R r;
    r_init(&r, opts, err);
    int rc = -1;
    Val msgs, tools = v_none(), v;
    Dict *extra = dict_new(&r);
    if (!extra) goto done;
    for (int k = 0; k < in->n_sets; k++) { /* NAME=VALUE: JSON, else a string */
        const char *eq = strchr(in->sets[k], '=');
        if (!eq || eq == in->sets[k]) {
            zy_fail(err, "--set \"%s\": NAME=VALUE expected", in->sets[k]);
            goto done;
        }
        Str *name = rstr(&r, in->sets[k], (size_t)(eq - in->sets[k]));
        if (!name) goto done;
        for (size_t j = 0; j < ZY_ARRAY_LEN(reserved_vars); j++)
            if (!strcmp(name->s, reserved_vars[j])) {
                zy_fail(err, "--set %s: that variable is set from the command's own options", name->s);
                goto done;
            }
        size_t vlen = strlen(eq + 1), bad;
        if (!u8_valid(eq + 1, vlen, &bad)) {
            zy_fail(err, "--set %s: not valid UTF-8", name->s);
            goto done;
        }
        ZyErr quiet;
        r.err = &quiet;
        int not_json = json_parse(&r, eq + 1, vlen, "--set", &v);
        r.err = err;
        r.need_pos = 0;
        if (not_json) {
            Str *s = rstr(&r, eq + 1, vlen);
            if (!s) goto done;
            v = v_ptr(V_STR, s);
        }
        if (dict_set(&r, extra, v_ptr(V_STR, name), v)) goto done;
    }
    if (json_parse(&r, in->messages_json, in->messages_len, "messages", &msgs)) goto done;
    if (in->tools_json && json_parse(&r, in->tools_json, in->tools_len, "tools", &tools)) goto done;
    rc = render_chat(c, &r, msgs, tools, v_none(), v_bool(in->add_generation_prompt), extra, out, out_len);
done:
    r_free(&r);
    if (rc && !err->msg[0]) zy_fail(err, "chat template: failed");
    return rc;
}

int chat_renderer_render_json(const ChatRenderer *c, const char *json, size_t len, int add_generation_prompt,
                              const ChatRenderOpts *opts, char **out, size_t *out_len, ZyErr *err) {
    *out = NULL;
    if (out_len) *out_len = 0;
    R r;
    r_init(&r, opts, err);
    int rc = -1;
    Val obj;
    Dict *extra = dict_new(&r);
    if (!extra || json_parse(&r, json, len, "conversation", &obj)) goto done;
    if (obj.kind != V_DICT) {
        zy_fail(err, "conversation: a JSON object with \"messages\" is required");
        goto done;
    }
    Dict *d = obj.u.p;
    Val *msgs = dict_get_s(d, "messages", 8), *tools = dict_get_s(d, "tools", 5), *docs = dict_get_s(d, "documents", 9),
        *agp = dict_get_s(d, "add_generation_prompt", 21);
    if (!msgs) {
        zy_fail(err, "conversation: no \"messages\"");
        goto done;
    }
    for (size_t k = 0; k < d->n; k++) { /* every other member is a template variable */
        const Str *name = d->k[k].u.p;
        int reserved = 0;
        for (size_t j = 0; j < ZY_ARRAY_LEN(reserved_vars); j++) reserved |= !strcmp(name->s, reserved_vars[j]);
        if (!reserved && dict_set(&r, extra, d->k[k], d->v[k])) goto done;
    }
    rc = render_chat(c, &r, *msgs, tools ? *tools : v_none(), docs ? *docs : v_none(),
                     agp ? *agp : v_bool(add_generation_prompt), extra, out, out_len);
done:
    r_free(&r);
    if (rc && !err->msg[0]) zy_fail(err, "chat template: failed");
    return rc;
}

int chat_render(const ChatConfig *cfg, const ChatInput *in, const ChatRenderOpts *opts, char **out, size_t *out_len,
                ZyErr *err) {
    ChatRenderer *c;
    *out = NULL;
    if (chat_renderer_new(cfg, &c, err)) return -1;
    int rc = chat_renderer_render(c, in, opts, out, out_len, err);
    chat_renderer_free(c);
    return rc;
}

int chat_render_messages_file(const char *template_path, const char *messages_path, char **out, size_t *out_len,
                              ZyErr *err) {
    ChatConfig cfg;
    char *msgs = NULL;
    size_t len;
    *out = NULL;
    if (chat_config_load(template_path, &cfg, err)) return -1;
    if (zy_read_file(messages_path, &msgs, &len, err)) {
        chat_config_free(&cfg);
        return -1;
    }
    ChatInput in = {.messages_json = msgs, .messages_len = len, .add_generation_prompt = 1};
    int rc = chat_render(&cfg, &in, NULL, out, out_len, err);
    if (rc) zy_wrap(err, "%s", messages_path);
    free(msgs);
    chat_config_free(&cfg);
    return rc;
}

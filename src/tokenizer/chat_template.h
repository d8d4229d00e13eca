/* chat_template: Hugging Face chat templates as transformers' apply_chat_template applies them: a model folder's
 * template and special tokens, found where transformers finds them, and the variables of one conversation (the
 * messages normalised as transformers does, tools, documents, the special tokens, --set values). The templates are
 * parsed and rendered by the Jinja engine in src/jinja/ (jinja/jinja.h: the subset, the values, the limits, the
 * errors, each naming the line:column of the construct, e.g. "chat template line 3:12: unsupported filter
 * 'wordwrap'"). Nothing here keeps global state or exits. */
#ifndef ZAYA_CHAT_TEMPLATE_H
#define ZAYA_CHAT_TEMPLATE_H

#include <stddef.h>
#include <stdint.h>

#include "jinja/jinja.h"
#include "util/util.h"

typedef JinjaTemplate ChatTemplate;
typedef JinjaOpts ChatRenderOpts; /* max_output, max_memory, max_steps, have_now + now (jinja/jinja.h) */

/* The engine's jinja_parse, jinja_free and jinja_render_json: parses a template (UTF-8; "\r\n" and "\r" read as
 * "\n", one trailing newline dropped, as jinja2 does; a construct outside the subset is an error naming it and its
 * line:column), and renders it with the members of vars_json (a JSON object) as its variables. *out is malloc'ed
 * and NUL-terminated; *out_len excludes the NUL. opts may be NULL (defaults). */
int chat_template_parse(const char *src, size_t len, ChatTemplate **out, ZyErr *err);
void chat_template_free(ChatTemplate *t);
int chat_template_render(const ChatTemplate *t, const char *vars_json, size_t vars_len, const ChatRenderOpts *opts,
                         char **out, size_t *out_len, ZyErr *err);

/* A model folder's chat template and special tokens, found as transformers finds them. */
#define CHAT_N_SPECIAL 7 /* bos_token eos_token unk_token sep_token pad_token cls_token mask_token */
typedef struct {
    char *source;                  /* the template text ("default") */
    size_t source_len;
    char *tool_source;             /* the "tool_use" template, used when tools are given; NULL if none */
    size_t tool_source_len;
    char origin[512];              /* where it came from, for messages */
    char *special[CHAT_N_SPECIAL]; /* token strings, NULL where the folder sets none */
} ChatConfig;
extern const char *const chat_special_names[CHAT_N_SPECIAL];

/* path: a model/tokenizer folder, or a file in it (tokenizer.json, tokenizer_config.json), or a .jinja template.
 * The template is <dir>/chat_template.jinja (with additional_chat_templates/tool_use.jinja), else
 * tokenizer_config.json's "chat_template": a string, or a list of {name, template} ("default", and "tool_use").
 * Special tokens come from tokenizer_config.json (strings or {"content": ...} objects), then
 * special_tokens_map.json. */
int chat_config_load(const char *path, ChatConfig *cfg, ZyErr *err);
/* The same with the template read from template_file (a Jinja file, e.g. a server's --chat-template) instead of the
 * folder's, which need not have one; the special tokens are still the folder's. */
int chat_config_load_template(const char *path, const char *template_file, ChatConfig *cfg, ZyErr *err);
void chat_config_free(ChatConfig *cfg);

typedef struct {
    const char *messages_json; /* a JSON list of message objects */
    size_t messages_len;
    const char *tools_json;    /* a JSON list of tool schemas, or NULL (the template then sees tools = None) */
    size_t tools_len;
    int add_generation_prompt;
    const char *const *sets;   /* "NAME=VALUE" extra variables: VALUE parsed as JSON, else taken as a string */
    int n_sets;
} ChatInput;

/* A model folder's templates, parsed once for many conversations. */
typedef struct ChatRenderer ChatRenderer;
int chat_renderer_new(const ChatConfig *cfg, ChatRenderer **out, ZyErr *err);
void chat_renderer_free(ChatRenderer *c);

/* apply_chat_template(messages, tools=..., add_generation_prompt=..., tokenize=False, **sets): the messages are
 * normalised as transformers does (keys whose value is null dropped; reasoning_content / thinking / reasoning
 * aliased to each other), the special tokens are variables, --set values override them, and the "tool_use"
 * template renders when tools are given and the folder has one. *out is malloc'ed, NUL-terminated. */
int chat_renderer_render(const ChatRenderer *c, const ChatInput *in, const ChatRenderOpts *opts, char **out,
                         size_t *out_len, ZyErr *err);
/* The same from one JSON object: {"messages": [...], "tools": [...], "documents": [...], "add_generation_prompt":
 * bool, NAME: value...}, every other member a template variable; add_generation_prompt is the default for an
 * object that does not set it. */
int chat_renderer_render_json(const ChatRenderer *c, const char *json, size_t len, int add_generation_prompt,
                              const ChatRenderOpts *opts, char **out, size_t *out_len, ZyErr *err);
/* chat_renderer_new + chat_renderer_render + chat_renderer_free */
int chat_render(const ChatConfig *cfg, const ChatInput *in, const ChatRenderOpts *opts, char **out, size_t *out_len,
                ZyErr *err);

/* The whole path for generate: the template of template_path's folder, messages from a JSON file (a list of
 * messages), add_generation_prompt = true, no tools. */
int chat_render_messages_file(const char *template_path, const char *messages_path, char **out, size_t *out_len,
                              ZyErr *err);

#endif

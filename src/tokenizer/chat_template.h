/* chat_template: the Jinja subset that Hugging Face chat templates use, rendered byte-for-byte as transformers'
 * apply_chat_template renders them (jinja2's ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the
 * loopcontrols extension, transformers' {% generation %} tag, and its globals raise_exception, strftime_now,
 * namespace, dict, and its tojson filter, which is json.dumps(ensure_ascii=False)).
 *
 * Values follow Python: ints, floats (printed with Python's shortest repr), strings of code points, lists, tuples,
 * ordered dicts, None, and jinja2's default Undefined (prints as "", iterates as empty, fails on attribute access or
 * arithmetic). Lists and dicts are immutable, as in the sandbox (list.append and the like are "unsafe" there too).
 *
 * Templates are untrusted input: parsing and rendering are bounded in nesting depth, evaluation steps, memory and
 * output size (ChatRenderOpts), and every failure is a ZyErr naming the line:column of the construct, e.g.
 * "chat template line 3:12: unsupported filter 'wordwrap'". Nothing here keeps global state or exits. */
#ifndef ZAYA_CHAT_TEMPLATE_H
#define ZAYA_CHAT_TEMPLATE_H

#include <stddef.h>
#include <stdint.h>

#include "util/util.h"

typedef struct ChatTemplate ChatTemplate;

typedef struct {
    size_t max_output;    /* bytes of rendered text (0: 64 MiB) */
    size_t max_memory;    /* bytes held by values while rendering (0: 1 GiB) */
    int64_t max_steps;    /* expressions and statements evaluated (0: 100 million) */
    int have_now;         /* strftime_now reports `now` (Unix seconds) in UTC; else the local time now */
    int64_t now;
} ChatRenderOpts;

/* Parses a template (UTF-8; "\r\n" and "\r" read as "\n", one trailing newline dropped, as jinja2 does). A
 * construct outside the subset is an error naming it and its line:column. */
int chat_template_parse(const char *src, size_t len, ChatTemplate **out, ZyErr *err);
void chat_template_free(ChatTemplate *t);

/* Renders with the members of vars_json (a JSON object) as the template's variables. *out is malloc'ed and
 * NUL-terminated; *out_len excludes the NUL. opts may be NULL (defaults). */
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

/* serve_tools: tool calls in chat answers. The chat template renders the request's `tools` into the prompt; what the
 * model writes back is parsed here into OpenAI's `tool_calls` (id, type "function", function.name, and
 * function.arguments as a JSON string), with the text outside the calls left as content. A tool-call format is a row
 * of a small table (zaya serve --tool-call-parser NAME; by default the one the model's chat template writes):
 *   zaya_xml     ZAYA1's: <zyphra_tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n</function>\n
 *                </zyphra_tool_call> (Zyphra's vLLM parser of that name; the wrapper tags are special tokens)
 *   qwen3_coder  the same body inside <tool_call>...</tool_call> (Qwen3-Coder, Qwen3.5)
 *   hermes       <tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call> (Hermes 2/3, Qwen2.5/3)
 * The parser is incremental: fed the text as it streams, it hands out content as soon as it cannot belong to a call
 * and each call once its closing tag (or the end) has come, so any split of the text gives the same result as the
 * whole. A call that does not parse stays content, byte for byte. */
#ifndef ZAYA_SERVE_TOOLS_H
#define ZAYA_SERVE_TOOLS_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "serve/serve_request.h"

typedef struct {
    const char *name;        /* --tool-call-parser NAME */
    const char *open, *close; /* the tags around one call */
    int xml;                 /* body: 1 = <function=NAME><parameter=P>VALUE</parameter>...</function>,
                                      0 = one JSON object {"name", "arguments"} */
} ToolFormat;

/* The format called name, or NULL. */
const ToolFormat *tool_format_find(const char *name);
/* "zaya_xml, qwen3_coder, hermes", for messages. */
const char *tool_format_names(void);
/* The format a chat template writes calls in (its text is searched for the format's tags), or NULL. */
const ToolFormat *tool_format_of_template(const char *source);

/* A chat request's "tools" and "tool_choice" (either NULL when not given): every tool {"type": "function",
 * "function": {"name", "description"?, "parameters"?, "strict"?}} with a unique name of 1-64 letters, digits, '_',
 * '-' or '.'; tool_choice "none", "auto", "required" or {"type": "function", "function": {"name"}} naming one of
 * them. Sets r->tools_json, n_tools, tool_choice, tool_name; a 400 naming the field otherwise. */
int serve_tools_parse_request(const cJSON *tools, const cJSON *tool_choice, ServeRequest *r, ServeError *e);
/* How a chat request's tools are answered, on a server whose format is f (NULL: none known): *parse, the format its
 * answers are parsed in (NULL: not parsed: no tools, tool_choice "none" (the tools are still rendered, as vLLM
 * does), or no format and no tool_choice (the calls stay text, as before zaya parsed them)); *forced, the opening
 * put after the prompt for "required" and a named function (NULL: none; "required" with one tool names it). A 400
 * naming tool_choice when it asks for calls and no format is known. */
int serve_tools_plan(const ToolFormat *f, const ServeRequest *r, const ToolFormat **parse, char **forced,
                     ServeError *e);
/* An assistant message's "tool_calls" (p names the message): checked, and each function.arguments given as a JSON
 * string (as OpenAI's clients send it back) replaced by its object, which templates iterate over (as vLLM does). */
int serve_tools_message(cJSON *msg, const char *p, ServeError *e);

/* The text put after the rendered prompt when a call is forced ("required", or a named function): the format's
 * opening of a call, and with a name (NULL: the model picks) the call up to its arguments, so that whatever the
 * model writes next is read as that call. malloc'ed. Schema-constrained decoding would plug in after this: its
 * token mask would keep the model's arguments (and, for "required", the name) valid. */
char *tool_format_forced_opening(const ToolFormat *f, const char *name);

typedef struct {
    char *id, *name, *arguments; /* arguments: a JSON text (as the model wrote it for a forced JSON call that does
                                    not parse: OpenAI's arguments "may not be valid JSON") */
} ToolCall;

typedef struct {
    int is_call;
    char *text;              /* content (is_call 0) */
    size_t len;
    ToolCall call;           /* is_call 1; its index is ToolEvent.index */
    int index;
} ToolEvent;

typedef struct {
    ToolEvent *ev;
    int n, cap;
} ToolEvents;
void tool_events_free(ToolEvents *e);

typedef struct ToolParser ToolParser;

/* tools_json: the request's tools list (the declared parameter types convert the XML formats' values: "string" stays
 * text, other types are read as JSON where they parse, undeclared ones too); forced_opening: what
 * tool_format_forced_opening put at the prompt's end, or NULL; id_prefix: call ids are id_prefix + index. NULL when
 * memory runs out. */
ToolParser *tool_parser_new(const ToolFormat *f, const char *tools_json, const char *forced_opening,
                            const char *id_prefix);
void tool_parser_free(ToolParser *p);
/* Feeds the next n bytes of the model's text (final: nothing more will come) and appends what is now settled to
 * out. 0, or -1 when memory runs out. */
int tool_parser_feed(ToolParser *p, const char *s, size_t n, int final, ToolEvents *out);
/* Calls handed out so far. */
int tool_parser_calls(const ToolParser *p);

/* One call as OpenAI writes it in a tool_calls list: whole ({"id", "type", "function": {"name", "arguments"}},
 * non-streamed; streamed with its index when first is set and arguments ""), or a streamed continuation
 * ({"index", "function": {"arguments"}}). */
typedef enum { TOOL_JSON_WHOLE, TOOL_JSON_STREAM_FIRST, TOOL_JSON_STREAM_ARGUMENTS } ToolJsonPart;
cJSON *tool_call_json(const ToolCall *c, int index, ToolJsonPart part);

#endif

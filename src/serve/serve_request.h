/* serve_request: the OpenAI request bodies zaya serve accepts (POST /v1/completions and /v1/chat/completions),
 * parsed and checked field by field. Every problem is a ServeError: the HTTP status, OpenAI's error type, the
 * offending parameter and a message naming it, e.g. 400 invalid_request_error "temperature": "must be a number
 * between 0 and 2 (got \"hot\")". Untrusted input: bounded sizes, no global state (fuzzed: fuzz_serve_request). */
#ifndef ZAYA_SERVE_REQUEST_H
#define ZAYA_SERVE_REQUEST_H

#include <stddef.h>
#include <stdint.h>

/* The routes whose bodies are parsed here: POST /v1/completions, /v1/chat/completions, /tokenize, /detokenize. */
typedef enum { SERVE_COMPLETION, SERVE_CHAT, SERVE_TOKENIZE, SERVE_DETOKENIZE } ServeKind;

typedef struct {
    int status;        /* 400, 401, 404, 413, 503 ... */
    char type[40];     /* invalid_request_error, authentication_error, not_found_error, server_error ... */
    char param[64];    /* the request field at fault, "" if none */
    char code[48];     /* e.g. context_length_exceeded, "" if none */
    char message[512];
} ServeError;

/* Fills e and returns -1. */
int serve_error(ServeError *e, int status, const char *type, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

#define SERVE_MAX_STOP 4          /* stop strings, as OpenAI */
#define SERVE_MAX_STOP_BYTES 256  /* per stop string */
#define SERVE_MAX_LOGPROBS 5      /* completions' logprobs */
#define SERVE_MAX_TOP_LOGPROBS 20 /* chat's top_logprobs */
#define SERVE_MAX_PROMPTS 1024    /* prompts in one completions request */
#define SERVE_MAX_N 128           /* choices per prompt (the server also caps n at its --max-batch) */
#define SERVE_MAX_CHOICES 1024    /* prompts x n */
#define SERVE_MAX_LOGIT_BIAS 1024 /* logit_bias entries */
#define SERVE_MAX_STOP_IDS 64     /* stop_token_ids */
#define SERVE_MAX_TOOLS 128       /* tools, as OpenAI */

/* What tool_choice asks (serve_tools.h). */
typedef enum { TOOL_CHOICE_UNSET, TOOL_CHOICE_AUTO, TOOL_CHOICE_NONE, TOOL_CHOICE_REQUIRED, TOOL_CHOICE_NAMED } ToolChoice;

enum { SERVE_FORMAT_TEXT, SERVE_FORMAT_JSON_OBJECT, SERVE_FORMAT_JSON_SCHEMA }; /* response_format's type */

/* Markovian RSA, /v1/chat/completions' extension "rsa": {"population", "subset", "rounds", "tail"} (serve/reason.h):
 * N traces, K of them aggregated per new trace, T rounds, the last τ tokens of each carried. population 0: not asked. */
#define SERVE_RSA_MAX_POPULATION 64
#define SERVE_RSA_MAX_ROUNDS 16
#define SERVE_RSA_MAX_TAIL 65536
typedef struct {
    int population, subset, rounds, tail;
} ServeRsa;

/* One prompt: text (encoded by the server) or token ids. */
typedef struct {
    char *text;            /* NULL: given as ids */
    size_t len;
    int32_t *ids;
    int n_ids;
} ServePrompt;

typedef struct {
    ServeKind kind;
    char *model;           /* the model asked for (NULL: not given, allowed for /tokenize and /detokenize) */
    /* completions: one or more prompts; /tokenize: one (or messages); /detokenize: its "tokens" as one prompt */
    ServePrompt *prompts;
    int n_prompts;
    /* chat and /tokenize with messages: {"messages": [...], "tools": [...] if given, chat_template_kwargs
     * members...} for the chat renderer */
    char *chat_json;
    int add_generation_prompt;
    char *tools_json;      /* chat: the checked "tools" list (NULL: none); it is in chat_json for the template too */
    int n_tools;
    ToolChoice tool_choice;
    char *tool_name;       /* TOOL_CHOICE_NAMED: the function, one of the tools */
    int max_tokens;        /* -1: not given; 0 only with echo */
    double temperature;    /* NAN: not given */
    double top_p;          /* NAN: not given */
    int top_k;             /* -1: not given (0 = off) */
    double min_p;          /* 0 = off */
    double presence_penalty, frequency_penalty; /* 0 = off */
    double repetition_penalty;                  /* 1 = off */
    int32_t *bias_ids;     /* logit_bias: ids (checked against the vocabulary by the server) and their biases */
    float *bias;
    int n_bias;
    int32_t *stop_ids;     /* stop_token_ids (vLLM's extension) */
    int n_stop_ids;
    char *stop[SERVE_MAX_STOP];
    int n_stop;
    int include_stop_str;  /* include_stop_str_in_output (vLLM's extension) */
    int skip_special_tokens; /* vLLM's extension; -1: not given */
    int has_seed;
    uint64_t seed;
    int n;                 /* choices per prompt */
    int stream, include_usage;
    int ignore_eos;        /* vLLM's extension: generate max_tokens whatever the model says (benchmarks) */
    int logprobs;          /* -1: none; completions: the number of alternatives (0..5); chat: top_logprobs (0..20) */
    int echo;              /* completions: the prompt comes back before the completion (with its logprobs) */
    int add_special_tokens; /* /tokenize: -1 not given (then: prompt true, messages false) */
    int return_token_strs; /* /tokenize */
    int response_format;   /* SERVE_FORMAT_*: structured output */
    char *json_schema;     /* SERVE_FORMAT_JSON_SCHEMA: response_format.json_schema.schema as JSON text */
    ServeRsa rsa;          /* chat: Markovian RSA asked for (population > 0) */
} ServeRequest;

/* Parses body as a request of the given kind. On error r is left empty (nothing to free). */
int serve_request_parse(const char *body, size_t len, ServeKind kind, ServeRequest *r, ServeError *e);
void serve_request_free(ServeRequest *r);

#endif

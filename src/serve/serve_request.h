/* serve_request: the OpenAI request bodies zaya serve accepts (POST /v1/completions and /v1/chat/completions),
 * parsed and checked field by field. Every problem is a ServeError: the HTTP status, OpenAI's error type, the
 * offending parameter and a message naming it, e.g. 400 invalid_request_error "temperature": "must be a number
 * between 0 and 2 (got \"hot\")". Untrusted input: bounded sizes, no global state (fuzzed: fuzz_serve_request). */
#ifndef ZAYA_SERVE_REQUEST_H
#define ZAYA_SERVE_REQUEST_H

#include <stddef.h>
#include <stdint.h>

typedef enum { SERVE_COMPLETION, SERVE_CHAT } ServeKind;

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

typedef struct {
    ServeKind kind;
    char *model;           /* the model asked for */
    /* completions: the prompt as text, or as token ids */
    char *prompt;
    size_t prompt_len;
    int32_t *prompt_ids;
    int n_prompt_ids;
    /* chat: {"messages": [...], "tools": [...] if given, chat_template_kwargs members...} for the chat renderer */
    char *chat_json;
    int add_generation_prompt;
    int max_tokens;        /* -1: not given */
    double temperature;    /* NAN: not given */
    double top_p;          /* NAN: not given */
    int top_k;             /* -1: not given (0 = off) */
    char *stop[SERVE_MAX_STOP];
    int n_stop;
    int has_seed;
    uint64_t seed;
    int stream, include_usage;
    int ignore_eos;        /* vLLM's extension: generate max_tokens whatever the model says (benchmarks) */
    int logprobs;          /* -1: none; completions: the number of alternatives (0..5); chat: top_logprobs (0..20) */
} ServeRequest;

/* Parses body as a request of the given kind. On error r is left empty (nothing to free). */
int serve_request_parse(const char *body, size_t len, ServeKind kind, ServeRequest *r, ServeError *e);
void serve_request_free(ServeRequest *r);

#endif

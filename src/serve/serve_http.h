/* serve_http: the OpenAI-compatible HTTP front of zaya serve, on GNU libmicrohttpd (one thread per connection, so a
 * streaming response simply blocks on its jobs). Routes:
 *   POST /v1/completions, POST /v1/chat/completions   (stream: true → server-sent events in OpenAI's chunk format;
 *                                                      several prompts and n choices each: one job per choice)
 *   POST /tokenize, POST /detokenize                   (vLLM's shapes)
 *   GET  /v1/models, GET /v1/models/{id}, GET /health, GET /metrics (Prometheus text)
 * Errors are OpenAI-style bodies {"error": {"message", "type", "param", "code"}} with a 4xx/5xx status; a full
 * queue is 503 with Retry-After. A client that disconnects cancels its request, which frees its KV blocks. */
#ifndef ZAYA_SERVE_HTTP_H
#define ZAYA_SERVE_HTTP_H

#include <stdint.h>

#include "tokenizer/chat_template.h"
#include "serve/serve_engine.h"
#include "serve/serve_tools.h"
#include "tokenizer/tokenizer.h"

typedef struct {
    const char *host;          /* IPv4 address to bind ("127.0.0.1", "0.0.0.0") */
    int port;                  /* 0: any free port (serve_http_port says which) */
    const char *api_key;       /* NULL: no authentication */
    const char *model_name;    /* what /v1/models lists and requests must name */
    int max_connections;
    const Tokenizer *tok;
    const ChatRenderer *chat;  /* NULL: the model has no chat template (chat requests get 400) */
    int32_t bos_id;            /* put before completion prompts given as text (-1: none), as zaya generate does */
    const int32_t *stop_ids;   /* the model's end-of-sequence ids */
    int n_stop_ids;
    double temperature, top_p; /* defaults for requests that do not set them (generation_config.json or OpenAI's) */
    int top_k;
    int max_context, vocab_size;
    const ToolFormat *tool_format; /* how the model writes tool calls (NULL: no format known; calls stay text) */
} ServeHttpOpts;

typedef struct ServeHttp ServeHttp;

int serve_http_start(ServeHttp **out, ServeEngine *e, const ServeHttpOpts *o, ZyErr *err);
int serve_http_port(const ServeHttp *h);
/* Shutting down: new requests get 503 (new connections are still accepted, so that they get it rather than a reset);
 * those under way go on. */
void serve_http_quiesce(ServeHttp *h);
/* Waits up to `seconds` for the answers under way to be handed to their sockets (a stream whose generation has ended
 * still has its last events and [DONE] to write). The number still unfinished. */
int serve_http_drain(ServeHttp *h, double seconds);
/* Closes every connection and joins their threads (call after serve_engine_shutdown), then frees. */
void serve_http_stop(ServeHttp *h);

/* Appends one server-sent event, "data: <payload>\n\n", to a growing byte buffer (*buf of *len bytes in *cap; not
 * NUL-terminated). 0, or -1 (buffer unchanged) when memory runs out. */
int serve_sse_append(char **buf, size_t *len, size_t *cap, const char *payload);

#endif

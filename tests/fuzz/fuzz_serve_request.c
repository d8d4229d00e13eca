/* libFuzzer target for zaya serve's request parser (serve_request_parse): the first byte picks the endpoint
 * (even: /v1/completions, odd: /v1/chat/completions), the rest is the body (valid UTF-8 and one JSON value, else
 * refused). Invariants: a rejected body gets a 4xx
 * (or a 500 for out of memory) with a message and leaves nothing to free; an accepted one has a model, a prompt
 * (text or ids) or messages that the chat renderer can read back as JSON, at most SERVE_MAX_STOP non-empty stop
 * strings and every number in its documented range. Build and run: `make fuzz` or
 *   make build-fuzz/fuzz_serve_request && build-fuzz/fuzz_serve_request -max_total_time=60 /tmp/new tests/fuzz/corpus/serve_request
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/serve_request.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fail(const char *what) {
    fprintf(stderr, "fuzz_serve_request: %s\n", what);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const ServeKind kind = data[0] & 1 ? SERVE_CHAT : SERVE_COMPLETION;
    ServeRequest r;
    ServeError e;
    memset(&e, 0, sizeof e);
    if (serve_request_parse((const char *)data + 1, size - 1, kind, &r, &e)) {
        if (e.status < 400 || e.status > 599 || !e.message[0] || !e.type[0]) fail("an error without a status or message");
        if (r.model || r.prompts || r.chat_json || r.n_stop || r.bias_ids || r.stop_ids || r.json_schema)
            fail("a rejected request holds memory");
        return 0;
    }
    if (!r.model) fail("accepted without a model");
    if ((r.response_format == SERVE_FORMAT_JSON_SCHEMA) != (r.json_schema != NULL)) fail("a json_schema without its schema");
    if (r.json_schema) {
        cJSON *schema = cJSON_Parse(r.json_schema);
        if (!cJSON_IsObject(schema)) fail("response_format's schema does not parse back as an object");
        cJSON_Delete(schema);
    }
    if ((r.max_tokens == 0 && !r.echo) || r.max_tokens < -1) fail("max_tokens out of range");
    if (r.n < 1 || r.n > SERVE_MAX_N || (long)r.n * (r.n_prompts > 0 ? r.n_prompts : 1) > SERVE_MAX_CHOICES)
        fail("n out of range");
    if (!(r.min_p >= 0 && r.min_p <= 1) || !(r.repetition_penalty > 0) || fabs(r.presence_penalty) > 2 ||
        fabs(r.frequency_penalty) > 2)
        fail("a penalty out of range");
    for (int i = 0; i < r.n_bias; i++)
        if (r.bias_ids[i] < 0 || !(fabsf(r.bias[i]) <= 100)) fail("a bad logit_bias entry");
    for (int i = 0; i < r.n_stop_ids; i++)
        if (r.stop_ids[i] < 0) fail("a negative stop_token_id");
    if (!isnan(r.temperature) && !(r.temperature >= 0 && r.temperature <= 2)) fail("temperature out of range");
    if (!isnan(r.top_p) && !(r.top_p > 0 && r.top_p <= 1)) fail("top_p out of range");
    if (r.top_k < -1) fail("top_k out of range");
    if (r.n_stop < 0 || r.n_stop > SERVE_MAX_STOP) fail("too many stop strings");
    for (int i = 0; i < r.n_stop; i++)
        if (!r.stop[i] || !r.stop[i][0] || strlen(r.stop[i]) > SERVE_MAX_STOP_BYTES) fail("a bad stop string");
    if (kind == SERVE_COMPLETION) {
        if (r.n_prompts < 1 || r.n_prompts > SERVE_MAX_PROMPTS) fail("a completion without prompts");
        for (int p = 0; p < r.n_prompts; p++) {
            const ServePrompt *q = &r.prompts[p];
            if (!q->text == !q->ids) fail("a prompt needs exactly one of text and ids");
            if (q->ids && q->n_ids <= 0) fail("empty ids accepted");
            for (int i = 0; i < q->n_ids; i++)
                if (q->ids[i] < 0) fail("a negative id accepted");
        }
        if (r.logprobs < -1 || r.logprobs > SERVE_MAX_LOGPROBS) fail("logprobs out of range");
    } else {
        cJSON *c = r.chat_json ? cJSON_Parse(r.chat_json) : NULL;
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(c, "messages");
        if (!cJSON_IsArray(m) || cJSON_GetArraySize(m) == 0) fail("chat accepted without messages");
        const cJSON *msg;
        cJSON_ArrayForEach(msg, m) {
            const cJSON *content = cJSON_GetObjectItemCaseSensitive(msg, "content");
            if (content && !cJSON_IsString(content) && !cJSON_IsNull(content)) fail("content left as a list");
        }
        cJSON_Delete(c);
        if (r.logprobs < -1 || r.logprobs > SERVE_MAX_TOP_LOGPROBS) fail("top_logprobs out of range");
    }
    serve_request_free(&r);
    return 0;
}

/* libFuzzer target for the chat template engine (templates are untrusted input: they come with model folders).
 * The input is a template; if it holds a NUL byte, what follows is a JSON list of messages rendered through
 * chat_render (transformers' message normalisation, special tokens, --set values), otherwise the template renders
 * with a fixed set of variables. Parsing and rendering must succeed or fail with a message, within the limits
 * given (output size, memory, steps), without leaks or undefined behaviour. Build and run: `make fuzz` (every
 * target), or
 *   make build-fuzz/fuzz_chat_template && build-fuzz/fuzz_chat_template -max_total_time=60 /tmp/new tests/fuzz/corpus/chat_template
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/chat_template.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char vars_json[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": "
    "\"Hi <there> \\u00e9\\ud83d\\ude00\"}, {\"role\": \"assistant\", \"content\": \"\", \"reasoning_content\": \"hmm\", "
    "\"tool_calls\": [{\"id\": \"call_1\", \"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": "
    "{\"x\": 1.5, \"y\": [true, null, -3]}}}]}, {\"role\": \"tool\", \"content\": [{\"type\": \"text\", \"text\": \"42\"}]}], "
    "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": \"d\", \"parameters\": "
    "{\"type\": \"object\", \"properties\": {\"x\": {\"type\": \"number\"}}, \"required\": [\"x\"]}}}], "
    "\"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"enable_thinking\": false, "
    "\"n\": 7, \"f\": 2.5, \"e\": [], \"d\": {\"b\": 2, \"a\": 1}}";

static const ChatRenderOpts limits = {
    .max_output = 1 << 16, .max_memory = 64 << 20, .max_steps = 200000, .have_now = 1, .now = 1721952000};

static void check_result(int rc, const ZyErr *err, char *out, size_t len) {
    if (rc == 0) {
        if (!out || len > limits.max_output || out[len] != '\0') abort();
        free(out);
    } else if (out || err->msg[0] == '\0') {
        abort(); /* a failure always says why and hands nothing back */
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *s = (const char *)data;
    const char *nul = memchr(s, '\0', size);
    size_t tlen = nul ? (size_t)(nul - s) : size;
    ZyErr err = {{0}};
    char *out = NULL;
    size_t len = 0;
    if (nul) { /* template NUL messages-JSON: the apply_chat_template path */
        char *src = malloc(tlen + 1);
        if (!src) return 0;
        memcpy(src, s, tlen);
        src[tlen] = '\0';
        ChatConfig cfg = {.source = src, .source_len = tlen};
        snprintf(cfg.origin, sizeof cfg.origin, "fuzz");
        static char bos[] = "<s>", eos[] = "</s>";
        cfg.special[0] = bos;
        cfg.special[1] = eos;
        const char *sets[] = {"enable_thinking=false", "date_string=26 Jul 2024", "n={\"k\": [1, 2.5]}"};
        static const char tools[] = "[{\"type\": \"function\", \"function\": {\"name\": \"g\"}}]";
        ChatInput in = {nul + 1, size - tlen - 1, tools, sizeof tools - 1, 1, sets, 3};
        int rc = chat_render(&cfg, &in, &limits, &out, &len, &err);
        check_result(rc, &err, out, len);
        free(src);
        return 0;
    }
    ChatTemplate *t = NULL;
    if (chat_template_parse(s, tlen, &t, &err) != 0) {
        if (t || strncmp(err.msg, "chat template", 13) != 0) abort();
        return 0;
    }
    int rc = chat_template_render(t, vars_json, sizeof vars_json - 1, &limits, &out, &len, &err);
    check_result(rc, &err, out, len);
    chat_template_free(t);
    return 0;
}

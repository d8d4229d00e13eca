/* libFuzzer target for structured output's schema compiler and automaton (json_grammar_compile, jg_step): the input is
 * a JSON Schema, a NUL byte, then bytes fed to the compiled grammar. Invariants: a refused schema has a message; for
 * an accepted one, along the bytes it accepts the fewest closing bytes (jg_min_close) is exact: some byte always
 * brings it down by one, and following such bytes ends a document of exactly that many more bytes, which cJSON
 * parses (the budget rule of the token mask relies on this). Build and run: `make fuzz` or
 *   make build-fuzz/fuzz_json_schema && build-fuzz/fuzz_json_schema -max_total_time=60 /tmp/new tests/fuzz/corpus/json_schema
 */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "infer/json_grammar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fail(const char *what) {
    fprintf(stderr, "fuzz_json_schema: %s\n", what);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    const size_t schema_len = nul ? (size_t)(nul - data) : size;
    cJSON *schema = cJSON_ParseWithLength((const char *)data, schema_len);
    if (!schema) return 0;
    JsonGrammar *g = NULL;
    ZyErr err = {{0}};
    const int rc = json_grammar_compile(schema, &g, &err);
    cJSON_Delete(schema);
    if (rc) {
        if (!err.msg[0] || g) fail("a refused schema without a message");
        return 0;
    }
    const uint8_t *doc = nul ? nul + 1 : data + size;
    const size_t doc_len = (size_t)(data + size - doc);
    char *text = malloc(doc_len + 4096 + 1);
    JgState s;
    jg_start(g, &s);
    size_t n = 0;
    for (; n < doc_len && jg_step(g, &s, doc[n]) == 0; n++) text[n] = (char)doc[n];
    if (n < doc_len) jg_feed(g, (jg_start(g, &s), &s), (const char *)doc, n); /* the state before the refused byte */
    long need = jg_min_close(g, &s);
    if (need < 0 || need > 4096) { /* large only for schemas of many required properties */
        free(text);
        json_grammar_free(g);
        return 0;
    }
    while (need > 0) { /* the first byte that brings the closing one nearer */
        int found = 0;
        for (int c = 0; c < 256 && !found; c++) {
            JgState t;
            jg_copy(&t, &s);
            if (jg_step(g, &t, (uint8_t)c) == 0 && jg_min_close(g, &t) == need - 1) {
                s = t;
                text[n++] = (char)c;
                found = 1;
            }
        }
        if (!found) fail("no byte brings the document nearer its end");
        need--;
    }
    if (!jg_complete(g, &s)) fail("jg_min_close reached 0 on an incomplete document");
    text[n] = 0;
    cJSON *parsed = cJSON_ParseWithLength(text, n);
    if (!parsed) fail("a completed document that cJSON does not parse");
    cJSON_Delete(parsed);
    free(text);
    json_grammar_free(g);
    return 0;
}

/* libFuzzer target for the model config.json parser (config_parse). Invariants: a rejected input fails with a
 * message that starts with the label; an accepted config validates, and written back by config_to_json it parses
 * to the identical struct and serialises to the identical text. Build and run: `make fuzz` or
 *   make build-fuzz/fuzz_config && build-fuzz/fuzz_config -max_total_time=60 /tmp/new tests/fuzz/corpus/config
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fail(const char *what, const char *detail) {
    fprintf(stderr, "fuzz_config: %s: %s\n", what, detail);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    ZayaConfig c;
    ZyErr err;
    err.msg[0] = '\0';
    int rc = config_parse(&c, text, "fuzz.json", &err);
    free(text);
    if (rc != 0) {
        if (strncmp(err.msg, "fuzz.json: ", 11) != 0 || !err.msg[11]) fail("error does not name the file", err.msg);
        return 0;
    }
    if (config_validate(&c, "fuzz.json", &err)) fail("accepted config does not validate", err.msg);
    char *js = config_to_json(&c, "float32");
    if (!js) fail("config_to_json", "NULL");
    ZayaConfig c2;
    if (config_parse(&c2, js, "rewritten.json", &err)) fail("written config does not parse", err.msg);
    c.legacy_layout = 0; /* a legacy config is written in the native schema: the only intended difference */
    if (memcmp(&c, &c2, sizeof c) != 0) fail("written config parses differently", js);
    char *js2 = config_to_json(&c2, "float32");
    if (!js2 || strcmp(js, js2) != 0) fail("second serialisation differs", js);
    free(js);
    free(js2);
    return 0;
}

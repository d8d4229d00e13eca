/* libFuzzer target for the token-shard header and meta.json parsers (every input is tried as both). Build and
 * run: `make fuzz` (every target), or
 *   make build-fuzz/fuzz_shard_header && build-fuzz/fuzz_shard_header -max_total_time=60 /tmp/new \
 *     tests/fuzz/corpus/shard_header
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/shards.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ZyErr err;
    ShardHeader h;
    err.msg[0] = '\0';
    if (shard_header_parse(data, size, "fuzz", &h, &err) != 0) {
        if (strncmp(err.msg, "fuzz: ", 6) != 0) abort();
    } else {
        /* a header that parses re-encodes to the same 64 bytes */
        uint8_t b[SHARD_HEADER_SIZE];
        shard_header_encode(&h, b);
        if (size < SHARD_HEADER_SIZE || memcmp(b, data, SHARD_HEADER_SIZE) != 0) abort();
        if ((h.width != 2 && h.width != 4) || h.vocab_size == 0 || h.documents > h.tokens) abort();
    }
    ShardMeta m;
    err.msg[0] = '\0';
    if (shard_meta_parse((const char *)data, size, "fuzz", &m, &err) != 0) {
        if (strncmp(err.msg, "fuzz: ", 6) != 0) abort();
        return 0;
    }
    if (m.vocab_size < 1 || (m.token_width != 2 && m.token_width != 4)) abort();
    for (int s = 0; s < SHARD_NUM_SPLITS; s++) {
        uint64_t tokens = 0, docs = 0;
        for (int i = 0; i < m.split[s].n_shards; i++) {
            const ShardMetaEntry *e = &m.split[s].shards[i];
            if (strchr(e->file, '/') || e->tokens == 0 || e->documents > e->tokens) abort();
            tokens += e->tokens;
            docs += e->documents;
        }
        if (tokens != m.split[s].tokens || docs != m.split[s].documents) abort();
    }
    shard_meta_free(&m);
    return 0;
}

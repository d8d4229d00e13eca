/* libFuzzer target for the safetensors header validator. Build and run: `make fuzz` (every target), or
 *   make build-fuzz/fuzz_safetensors && build-fuzz/fuzz_safetensors -max_total_time=60 /tmp/new tests/fuzz/corpus/safetensors
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    StFile f;
    ZyErr err;
    if (st_open_buffer(&f, data, size, "fuzz", &err) != 0) {
        if (strncmp(err.msg, "fuzz: ", 6) != 0) abort(); /* every error names its source */
        return 0;
    }
    /* accepted entries must lie inside the data area and be readable */
    for (int i = 0; i < f.n_entries; i++) {
        const StEntry *e = &f.entries[i];
        if (e->offset > f.data_len || e->nbytes > f.data_len - e->offset) abort();
        if (e->nbytes != e->numel * zy_dtype_size(e->dtype)) abort();
        if (st_find(&f, e->name) == NULL) abort();
        float *fo = malloc((e->numel + 1) * sizeof *fo);
        int32_t *io = malloc((e->numel + 1) * sizeof *io);
        if (fo && io) {
            st_read_f32(&f, e, fo, &err);
            st_read_i32(&f, e, io, &err);
        }
        free(fo);
        free(io);
    }
    st_close(&f);
    return 0;
}

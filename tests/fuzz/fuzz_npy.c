/* libFuzzer target for the .npy parser. Build and run: `make fuzz` (every target), or
 *   make build-fuzz/fuzz_npy && build-fuzz/fuzz_npy -max_total_time=60 /tmp/new tests/fuzz/corpus/npy
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/npy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    NpyArray a;
    ZyErr err;
    if (npy_parse(data, size, "fuzz", &a, &err) != 0) {
        if (strncmp(err.msg, "fuzz: ", 6) != 0 || a.data != NULL) abort();
        return 0;
    }
    size_t numel = 1;
    for (int d = 0; d < a.ndim; d++) numel *= (size_t)a.shape[d];
    if (a.ndim < 0 || a.ndim > ZY_MAX_DIMS || numel != a.numel || !a.data) abort();
    /* touch every byte so ASan checks the allocation size */
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < a.numel * zy_dtype_size(a.dtype); i++) sink ^= ((const uint8_t *)a.data)[i];
    (void)sink;
    npy_free(&a);
    return 0;
}

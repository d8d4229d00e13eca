/* .npy arrays (NumPy format versions 1.0, 2.0 and 3.0, C order only): reading numeric arrays, writing float32
 * and int32. */
#ifndef ZAYA_NPY_H
#define ZAYA_NPY_H

#include <stddef.h>
#include <stdint.h>

#include "util/util.h"

typedef struct {
    ZyDtype dtype;  /* from descr: <f4 F32, <f8 F64, <i4 I32, <i8 I64, |u1 U8, <u2 U16, <u4 U32, ... */
    int ndim;
    int64_t shape[ZY_MAX_DIMS];
    size_t numel;
    void *data;     /* owned, numel * zy_dtype_size(dtype) bytes, native little-endian */
} NpyArray;

/* Parses a whole .npy file held in memory. Rejects: bad magic, unknown version, header length past the
 * end, malformed header dict, fortran_order True, big-endian or unsupported descr, negative/overflowing
 * shape, data size not matching the shape. label names the source in error messages. */
int npy_parse(const void *buf, size_t len, const char *label, NpyArray *out, ZyErr *err);
int npy_read(const char *path, NpyArray *out, ZyErr *err);
void npy_free(NpyArray *a);
/* Reads integer token ids (int32 or int64, any ndim >= 1) as int32; rejects values outside int32. */
int npy_read_tokens(const char *path, int32_t **tokens, int *ndim, int64_t shape[ZY_MAX_DIMS], ZyErr *err);
/* Writes an array atomically (version 1.0 header, padded to 64 bytes). dtype: ZY_DT_F32 or ZY_DT_I32. */
int npy_write(const char *path, ZyDtype dtype, const void *data, int ndim, const int64_t *shape, ZyErr *err);

#endif

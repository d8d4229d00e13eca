/* safetensors: reader (mmap, fully validated header) and streaming writer.
 * Format: u64 little-endian header length N, N bytes of JSON
 *   {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ..., "__metadata__": {str: str}}
 * then the data area; offsets are relative to the start of the data area. */
#ifndef ZAYA_SAFETENSORS_H
#define ZAYA_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "util/util.h"

typedef struct {
    char *name;
    ZyDtype dtype;
    int ndim;
    int64_t shape[ZY_MAX_DIMS];
    size_t numel;
    size_t offset; /* bytes from the start of the data area */
    size_t nbytes;
} StEntry;

typedef struct {
    char label[512];        /* file path (or caller's label for buffers), used in error messages */
    void *map;              /* mmap of the file, or NULL when opened from a caller's buffer */
    size_t map_len;
    const uint8_t *data;    /* start of the data area */
    size_t data_len;
    StEntry *entries;
    int n_entries;
    char *metadata_json;    /* the "__metadata__" object re-serialised, or NULL */
} StFile;

/* Opens and validates a file: header length, JSON, dtypes, shapes, offsets (in range, size = numel*dtype,
 * no overlaps), duplicate names. On error nothing stays open. */
int st_open(StFile *f, const char *path, ZyErr *err);
/* Same validation over a caller-owned buffer (kept borrowed until st_close); for tests and fuzzing. */
int st_open_buffer(StFile *f, const void *buf, size_t len, const char *label, ZyErr *err);
void st_close(StFile *f);
/* Maps every page of the opened files into the process now, when they fit in the memory available (together): weights
 * read in place are then touched without page faults from the first decoding step on (llama.cpp populates its
 * mappings too). Returns 1 when populated, 0 when they would not fit or the kernel lacks MADV_POPULATE_READ
 * (Linux < 5.14: a hint only, nothing fails). */
int st_populate(const StFile *files, int n_files);
const StEntry *st_find(const StFile *f, const char *name);
/* Converts an F32/BF16/F16 (also F64) tensor into float32 `out` (numel floats). */
int st_read_f32(const StFile *f, const StEntry *e, float *out, ZyErr *err);
/* Converts an F32/BF16/F16/F64 tensor into bf16 `out` (numel values; BF16 is copied, the others rounded to
 * nearest even from their float32 value), without a float32 copy of the whole tensor. */
int st_read_bf16(const StFile *f, const StEntry *e, uint16_t *out, ZyErr *err);
/* Copies an I32/I64 tensor into int32 `out` (range-checked). */
int st_read_i32(const StFile *f, const StEntry *e, int32_t *out, ZyErr *err);

typedef struct {
    const char *name;
    int ndim;
    int64_t shape[ZY_MAX_DIMS];
    ZyDtype src_dtype; /* the layout of `data` in memory: F32, or any dtype written as it is (out_dtype the same) */
    ZyDtype out_dtype; /* for F32 sources: ZY_DT_F32 or ZY_DT_BF16; for any other source: the same dtype */
    const void *data;
    /* instead of data (NULL): makes values [first, first + count) of an F32 source into out, called in order with
     * count <= 65536, so a tensor never needs to be in memory whole (zaya init of a large model); non-zero = fail */
    int (*fill)(void *ctx, size_t first, size_t count, float *out);
    /* or, for a tensor written as it is (src_dtype = out_dtype): bytes [first, first + n) of it, in order, n <= 256 KiB */
    int (*fill_bytes)(void *ctx, size_t first, size_t n, void *out);
    void *fill_ctx;
} StWriteTensor;

/* The bytes st_write puts before the tensors' data (the 8-byte length, the JSON padded so the data starts 8-byte
 * aligned), malloc'ed into *out (*out_len bytes); offsets (NULL, or n_tensors values): where each tensor's bytes
 * start in the file. The tensors' data follow back to back, in the given order. label names the file in errors. */
int st_header(const char *label, const StWriteTensor *tensors, int n_tensors, const char *const *metadata,
              uint8_t **out, size_t *out_len, uint64_t *offsets, ZyErr *err);
/* Writes the tensors (in the given order; names must be unique) to path atomically (temp file, fsync,
 * rename), streaming the data so memory stays small. metadata: NULL or pairs {key, value, key, value, ...,
 * NULL} of strings for "__metadata__". */
int st_write(const char *path, const StWriteTensor *tensors, int n_tensors, const char *const *metadata,
             ZyErr *err);

#endif

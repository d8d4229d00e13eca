/* ckpt_io: moving checkpoint bytes at the hardware's speed (docs/performance.md: checkpoints).
 * - A snapshot is a copy into file images: buffers that hold each file's bytes exactly as they will be written,
 *   allocated once, page-aligned and pre-faulted (no page faults per checkpoint), filled by every OpenMP thread.
 * - Writes go from those images in large aligned requests by several threads (O_DIRECT where the file system
 *   takes it: on the VMs measured, the page cache path reached a tenth of the disk), each chunk's CRC-32 computed
 *   from memory as it is written and combined, so nothing is read back; then fsync and an atomic rename.
 * - Reads take large aligned chunks of a byte range by several threads, checksum them, and copy the pieces that
 *   belong somewhere (a tensor's bytes) straight to their destinations. */
#ifndef ZAYA_CKPT_IO_H
#define ZAYA_CKPT_IO_H

#include <stddef.h>
#include <stdint.h>

#include "util/util.h"

typedef struct {
    int direct;         /* 1: O_DIRECT where the file system takes it (default); 0: through the page cache */
    int threads;        /* I/O threads of one write or read (default 8: they mostly wait for the device) */
    size_t chunk_bytes; /* one request, a multiple of 4096 (default 8 MiB) */
} CkptIoConfig;

CkptIoConfig ckpt_io_config(void);
/* For `zaya bench ckpt` (A/B runs): set before any checkpoint I/O of the process. */
void ckpt_io_configure(const CkptIoConfig *c);

/* A file image: page-aligned, pre-faulted, zero past what was written; grows, never shrinks. */
typedef struct {
    uint8_t *data;
    size_t cap;
} CkptImage;
int ckpt_image_reserve(CkptImage *im, size_t len, ZyErr *err);
void ckpt_image_free(CkptImage *im);

/* Copies every piece, the bytes split evenly over all OpenMP threads. */
typedef struct {
    void *dst;
    const void *src;
    size_t len;
} CkptCopy;
void ckpt_copy_all(const CkptCopy *pieces, int n);

/* Writes each file from data (readable up to len rounded up to 4096 bytes: a CkptImage) through a temporary name,
 * fsync and rename, all files' chunks by the configured threads; crc receives the CRC-32 of each file's len bytes. */
typedef struct {
    const char *path;
    const uint8_t *data;
    size_t len;
    uint32_t crc; /* out */
} CkptFileOut;
int ckpt_write_files(CkptFileOut *files, int n, ZyErr *err);

/* Reads bytes [lo, hi) of each file (which must hold them; nothing when hi <= lo) and sets crc to their CRC-32;
 * the file bytes [offset, offset + len) of each span (sorted by offset, inside [lo, hi), not overlapping) land at
 * dst. All files' chunks go through one queue of the configured threads. */
typedef struct {
    uint64_t offset, len;
    void *dst;
} CkptSpan;
typedef struct {
    const char *path;
    uint64_t lo, hi;
    const CkptSpan *spans;
    long n_spans;
    uint32_t crc; /* out */
} CkptFileIn;
int ckpt_read_files(CkptFileIn *files, int n, ZyErr *err);
/* The same in the background: start returns at once (files must stay put), wait joins and sets the CRCs. */
typedef struct CkptReads CkptReads;
int ckpt_read_files_start(CkptReads **reads, CkptFileIn *files, int n, ZyErr *err);
int ckpt_read_files_wait(CkptReads *reads, ZyErr *err);

#endif

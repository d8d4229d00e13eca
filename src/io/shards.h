/* Token shards: tokenized corpora as large, bundled binary files read sequentially by the training loop
 * (the ZAYA1 "scatter factor" σ = pages read / pages needed stays near 1).
 *
 * Shard file (all integers little-endian):
 *   offset  size  field
 *        0     8  magic "ZAYASHRD"
 *        8     4  u32 format version (1)
 *       12     4  u32 token width in bytes: 2 (u16 ids) or 4 (u32 ids)
 *       16     8  u64 token count N
 *       24     4  u32 CRC-32 (zlib) of the payload
 *       28     4  u32 vocabulary size (every id < this)
 *       32     8  u64 documents ending in this shard (a document may start in the previous shard)
 *       40    20  reserved, zero
 *       60     4  u32 CRC-32 of bytes 0..59
 *       64   N*w  the token ids
 * The file is exactly 64 + N*w bytes.
 *
 * Shard directory: train-00000.bin, train-00001.bin, ..., val-00000.bin, ... and meta.json:
 *   {"format": "zaya-shards", "format_version": 1, "vocab_size": V, "dtype": "uint16" | "uint32",
 *    "tokenizer": {"file": "tok.json", "crc32": C} (or null),
 *    "splits": {"train": {"tokens": N, "documents": D,
 *                         "shards": [{"file": "train-00000.bin", "tokens": n, "documents": d, "crc32": c}, ...]},
 *               "val": {...}}}
 * The splits' shards, in order, form one logical token stream per split. meta.json is written last, so a
 * directory without it is incomplete. */
#ifndef ZAYA_SHARDS_H
#define ZAYA_SHARDS_H

#include <stddef.h>
#include <stdint.h>

#include "util/util.h"

#define SHARD_MAGIC "ZAYASHRD"
#define SHARD_VERSION 1
#define SHARD_HEADER_SIZE 64
#define SHARD_DEFAULT_MAX_TOKENS (64ull << 20)
#define SHARD_PAGE_SIZE 4096

typedef enum { SHARD_TRAIN = 0, SHARD_VAL = 1, SHARD_NUM_SPLITS = 2 } ShardSplit;
const char *shard_split_name(ShardSplit s); /* "train", "val" */

typedef struct {
    uint32_t version, width, payload_crc, vocab_size;
    uint64_t tokens, documents;
} ShardHeader;

/* Encodes h (version, width, counts, payload CRC, vocab) into 64 bytes, computing the header CRC. */
void shard_header_encode(const ShardHeader *h, uint8_t out[SHARD_HEADER_SIZE]);
/* Validates and decodes a header: length, magic, version, width, reserved bytes, header CRC, vocab size
 * (width 2 allows at most 65536). label names the file in error messages. */
int shard_header_parse(const void *buf, size_t len, const char *label, ShardHeader *out, ZyErr *err);

typedef struct {
    char file[64];               /* bare name, "train-00000.bin" */
    uint64_t tokens, documents;
    uint32_t crc32;
} ShardMetaEntry;

typedef struct {
    uint64_t tokens, documents;
    int n_shards;
    ShardMetaEntry *shards;
} ShardMetaSplit;

typedef struct {
    int format_version;
    int vocab_size;
    int token_width;             /* 2 or 4, from "dtype" */
    int has_tokenizer;
    char tokenizer_file[256];
    uint32_t tokenizer_crc;
    ShardMetaSplit split[SHARD_NUM_SPLITS];
} ShardMeta;

/* Parses meta.json text (len bytes, need not be NUL-terminated) and checks it is self-consistent: known
 * format and version, dtype matching the vocabulary size, shard names "<split>-NNNNN.bin" of their own split
 * and unique, split totals equal to the sums over their shards. On error *out holds nothing to free. */
int shard_meta_parse(const char *json, size_t len, const char *label, ShardMeta *out, ZyErr *err);
void shard_meta_free(ShardMeta *m);

/* ---- Writer: streams tokens into shards of at most max_shard_tokens, each written to "<name>.tmp" and
 * renamed into place once complete; meta.json is written by shardwriter_finish, last. ---- */
typedef struct ShardWriter ShardWriter;

typedef struct {
    int vocab_size;              /* required, >= 1; ids must be < vocab_size */
    int token_width;             /* 0: 2 if vocab_size <= 65536, else 4 */
    uint64_t max_shard_tokens;   /* 0: SHARD_DEFAULT_MAX_TOKENS */
    const char *tokenizer_file;  /* recorded in meta.json (may be NULL) */
    uint32_t tokenizer_crc;
} ShardWriterOptions;

/* dir must exist. */
int shardwriter_open(ShardWriter **out, const char *dir, const ShardWriterOptions *opt, ZyErr *err);
/* Appends token ids to a split's stream; an id outside [0, vocab) is an error. */
int shardwriter_append(ShardWriter *w, ShardSplit split, const int32_t *tokens, size_t n, ZyErr *err);
/* Marks the end of the current document of a split (it must have at least one token). */
int shardwriter_end_document(ShardWriter *w, ShardSplit split, ZyErr *err);
/* append + end_document */
int shardwriter_add_document(ShardWriter *w, ShardSplit split, const int32_t *tokens, size_t n, ZyErr *err);
void shardwriter_counts(const ShardWriter *w, ShardSplit split, uint64_t *tokens, uint64_t *documents,
                        int *n_shards);
/* Completes the open shards and writes meta.json. The writer still has to be closed. */
int shardwriter_finish(ShardWriter *w, ZyErr *err);
/* Frees the writer; an unfinished writer's temporary files are removed (finished shards stay, but without
 * meta.json the directory does not open). NULL is allowed. */
void shardwriter_close(ShardWriter *w);

/* ---- Reader ---- */
typedef struct ShardSet ShardSet; /* one split of a shard directory, as one logical token stream */

/* Opens a split: parses meta.json, opens every listed shard and checks its header against meta.json and its
 * size against its token count; verify_crc also checks every payload CRC (reads all the data once). A split
 * with no shards opens as an empty stream. */
int shardset_open(ShardSet **out, const char *dir, const char *split /* "train" or "val" */, int verify_crc,
                  ZyErr *err);
uint64_t shardset_num_tokens(const ShardSet *s);
int shardset_vocab_size(const ShardSet *s);
uint64_t shardset_num_documents(const ShardSet *s);
int shardset_token_width(const ShardSet *s);
/* Reads tokens [offset, offset+n) of the split's stream (may cross shard boundaries) as int32 with pread; error if
 * past the end or a token id >= vocab size (naming the shard file and position). Safe to call from several
 * threads at once on the same set (the I/O statistics are then approximate). */
int shardset_read(ShardSet *s, uint64_t offset, size_t n, int32_t *out, ZyErr *err);
/* I/O accounting for the ZAYA1 scatter factor: pages (4 KiB) actually touched by reads vs pages the requested bytes
 * occupy. pages_read counts the file pages each pread spans, except a page the previous read of the same shard
 * ended on (still in the page cache); pages_needed = ceil(bytes requested / 4096); σ = pages_read / pages_needed.
 * Any pointer may be NULL. */
void shardset_io_stats(const ShardSet *s, uint64_t *pages_read, uint64_t *pages_needed, uint64_t *bytes_read);
void shardset_reset_io_stats(ShardSet *s);
void shardset_close(ShardSet *s);

#endif

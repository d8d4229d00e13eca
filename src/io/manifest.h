/* manifest: a checkpoint's manifest.json, parsed from memory and validated —
 *   {"format": "zaya-checkpoint", "version": 1, "step": S, "world_size": N (optional, default 1),
 *    "files": [{"name": "model.safetensors", "bytes": B, "crc32": C}, ...]}
 * the size and CRC-32 of every other file of the checkpoint directory (checkpoint.c writes and checks them).
 * Unknown keys are ignored (later versions may add some). */
#ifndef ZAYA_MANIFEST_H
#define ZAYA_MANIFEST_H

#include <stddef.h>
#include <stdint.h>

#include "util/util.h"

#define CKPT_MANIFEST_MAX_FILES 4096

typedef struct {
    char name[256]; /* a plain file name: no '/', not "." or "..", not manifest.json */
    uint64_t bytes; /* < 1e15 */
    uint32_t crc32;
} CkptManifestFile;

typedef struct {
    int64_t step;   /* >= 0 */
    int world_size; /* >= 1: ranks that wrote optimizer shards (1 when absent) */
    int n_files;    /* >= 1, names unique, model.safetensors among them */
    CkptManifestFile *files;
} CkptManifest;

/* Parses len bytes of text; errors start with label (the file's path). On success *m owns its files. */
int ckpt_manifest_parse(const char *text, size_t len, const char *label, CkptManifest *m, ZyErr *err);
void ckpt_manifest_free(CkptManifest *m);

#endif

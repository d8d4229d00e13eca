/* synth: a deterministic synthetic curriculum corpus for the three ZAYA1 phases at toy scale, plus held-out
 * evaluation tasks. Everything derives from the seed through ZyRng and integer arithmetic, so the same seed
 * gives the same bytes on every platform.
 *
 *   DIR/general.jsonl    phase 1: procedural prose (stories, descriptions, letters, diaries, news, dialogue)
 *   DIR/mathcode.jsonl   phase 2: arithmetic in many formats, word problems, small programs with their output
 *   DIR/longctx.jsonl    phase 3: long documents with key-value recall and multi-step reasoning chains
 *   DIR/eval/addition2.jsonl   {"prompt": "47+38=", "answer": "85"}: every held-out 2-digit pair, both orders
 *   DIR/eval/arith_mc.jsonl    {"context": "12+45=", "choices": [...], "answer": i} on held-out pairs
 *   DIR/eval/kv_recall.jsonl   {"prompt": long context + "Q: ... A:", "answer": "4821"}, held-out keys
 *   DIR/eval/general_mc.jsonl  {"context", "choices", "answer"}: grammatical / consistent continuation
 *   DIR/eval/code_exec.jsonl   {"prompt": program + "output:", "answer": "12"}, programs not in training
 *   DIR/README.txt
 * Training files hold one {"text": ...} object per line, one document per line.
 *
 * Held-out additions: a seeded 10% of the unordered pairs {a, b} of 2-digit numbers (10..99). No training
 * document states a+b=c for such a pair in any format or order, nor the inverse c-b=a: every generator checks
 * its operands, and a final guard rejects any document in which two held-out 2-digit numbers and their sum
 * occur among 5 consecutive numbers. */
#ifndef ZAYA_SYNTH_H
#define ZAYA_SYNTH_H

#include <stdint.h>

#include "util/util.h"

typedef struct {
    uint8_t held[100][100]; /* held[a][b] == held[b][a] == 1 for reserved pairs (a, b in 10..99) */
    int n_unordered;
} SynthHeldout;

void synth_heldout_init(SynthHeldout *h, uint64_t seed);
int synth_is_heldout(const SynthHeldout *h, long a, long b);

#define SYNTH_MAX_FILES 12

typedef struct {
    char name[32];     /* relative to DIR */
    uint64_t records;  /* lines (documents or eval items) */
    uint64_t bytes;
} SynthFileCount;

typedef struct {
    SynthFileCount files[SYNTH_MAX_FILES];
    int n_files;
    double seconds;
} SynthReport;

/* Training file sizes at scale 1.0, in bytes (each file stops at the first document past scale * target). */
#define SYNTH_GENERAL_BYTES (4u << 20)
#define SYNTH_MATHCODE_BYTES (3u << 20)
#define SYNTH_LONGCTX_BYTES (3u << 20)

/* Writes the corpus into dir (created if missing; existing files of the same names are replaced atomically).
 * scale in (0, 100]. */
int synth_generate(const char *dir, uint64_t seed, double scale, SynthReport *rep, ZyErr *err);

#endif

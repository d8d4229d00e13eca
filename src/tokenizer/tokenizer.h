/* tokenizer: BPE whose file format is Hugging Face `tokenizer.json`. zaya trains byte-level BPE (GPT-2
 * style) that the `tokenizers` library loads and encodes to the same ids, and loads the BPE pipelines HF
 * releases use (byte-level: GPT-2, Llama 3, Qwen; SentencePiece-converted: Gemma 3, Llama 2), encoding and
 * decoding id for id as `tokenizers` does. */
#ifndef ZAYA_TOKENIZER_H
#define ZAYA_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "util/util.h"

typedef struct Tokenizer Tokenizer;

/* Special tokens are fixed for tokenizers zaya trains: id 0 "<|pad|>", 1 "<|bos|>", 2 "<|eos|>"; then the 256
 * byte tokens (ordered by their GPT-2 byte-level character, as HF's trainer orders them); then merges.
 * A loaded HF file keeps its own ids: look specials up with tokenizer_token_id(). */
#define TOK_PAD_ID 0
#define TOK_BOS_ID 1
#define TOK_EOS_ID 2
#define TOK_PAD_TEXT "<|pad|>"
#define TOK_BOS_TEXT "<|bos|>"
#define TOK_EOS_TEXT "<|eos|>"

#define TOK_MIN_VOCAB 260        /* 3 specials + 256 bytes + at least one merge */
#define TOK_MAX_VOCAB (1 << 21)  /* anything larger is a mistake */

typedef struct {
    double seconds;        /* wall time of the whole training */
    double count_seconds;  /* of which reading and counting pre-tokens */
    double input_mb;       /* bytes of text read (after JSONL extraction), in MB (1e6 bytes) */
    int merges;            /* merges learned */
    int64_t words;         /* unique pre-tokens counted */
} TokenizerTrainStats;

/* Trains on plain-text files (each file is one text) and .jsonl files (the "text" string of every line).
 * Pre-tokenizes like encoding (special-token strings in the text are left out of the counts), then learns
 * merges with HF's BpeTrainer rule (most frequent adjacent pair, ties to the smallest (left id, right id))
 * until the vocabulary holds vocab_size tokens or no pair is left. Counting runs on OpenMP threads.
 * split_digits: never merge two pieces that both contain a digit, so every number is spelled one token per
 * digit (as Gemma 3's tokenizer, ZAYA1's, does); the file stays a plain BPE that HF encodes identically. */
int tokenizer_train(const char *const *files, int n_files, int vocab_size, int split_digits, Tokenizer **out,
                    TokenizerTrainStats *stats, ZyErr *err);
/* Same, on texts in memory (text i is lens[i] bytes). */
int tokenizer_train_texts(const char *const *texts, const size_t *lens, int n_texts, int vocab_size, int split_digits,
                          Tokenizer **out, TokenizerTrainStats *stats, ZyErr *err);

/* Loads a HF tokenizer.json with a BPE model (dropout null, byte_fallback, fuse_unk, ignore_merges,
 * merges as ["a","b"] pairs or "a b" strings) and these components:
 *   normalizer:     Replace (String or Regex pattern), Prepend, Sequence, null
 *   pre_tokenizer:  Split (String/Regex, every behavior, invert), Metaspace (prepend_scheme first/always/
 *                   never, split), ByteLevel (add_prefix_space false, use_regex; last in a Sequence), Sequence, null
 *   post_processor: TemplateProcessing, ByteLevel, Sequence, null
 *   decoder:        Replace, ByteFallback, Fuse, Strip, Metaspace, ByteLevel, Sequence, null
 *   added_tokens:   special or not, with single_word / lstrip / rstrip / normalized as HF applies them; an id
 *                   other than the one HF gives the token (its model.vocab id, else the next after the vocab)
 *                   is refused rather than renumbered.
 * Regex patterns run on PCRE2 (HF: Oniguruma; the same for the patterns released files use). Anything else
 * (NFC/NFKC normalizers, other models and components, truncation, padding) is refused with
 * "<file>: <field path>: <reason>". path is tokenizer.json itself or a model folder holding it; a
 * tokenizer_config.json next to it is applied (tokenizer_apply_config_json). */
int tokenizer_load(const char *path, Tokenizer **out, ZyErr *err);
/* Same from JSON text in memory (no tokenizer_config.json); label names it in errors. */
int tokenizer_load_json(const char *json, size_t len, const char *label, Tokenizer **out, ZyErr *err);
/* tokenizer_config.json as transformers 4's Llama/Gemma fast tokenizers apply it: when add_bos_token or
 * add_eos_token is there, the post-processor becomes [bos_token] $A [eos_token] (each only when its flag is
 * true; a true flag without its token is an error). transformers 5 ignores both keys next to a
 * tokenizer.json; in released files they agree with tokenizer.json's post-processor anyway. */
int tokenizer_apply_config_json(Tokenizer *t, const char *json, size_t len, const char *label, ZyErr *err);
/* Writes tokenizer.json atomically (temporary file + fsync + rename): the components as loaded (a
 * tokenizer_config.json is not written into it). */
int tokenizer_save(const Tokenizer *t, const char *path, ZyErr *err);
/* The JSON text tokenizer_save writes (malloc'ed, NUL-terminated). */
int tokenizer_to_json(const Tokenizer *t, char **json, size_t *len, ZyErr *err);

/* Encodes any bytes. Added/special token strings in the text map to their ids, as HF does; no
 * post-processor (HF's add_special_tokens=False). For valid UTF-8 the ids equal HF `tokenizers`'
 * Tokenizer.encode(text, add_special_tokens=False).ids for the same file. Invalid UTF-8: byte-level
 * pipelines encode every byte (decode gives it back); other pipelines encode it as U+FFFD (Python's
 * errors="replace"). Uses the tokenizer's own piece cache, so it is NOT thread-safe on one Tokenizer:
 * threads that share a Tokenizer use tokenizer_encode_with() and a cache each (or none). *ids is malloc'ed
 * (NULL when empty). */
int tokenizer_encode(const Tokenizer *t, const char *text, size_t len, int32_t **ids, size_t *n_ids, ZyErr *err);

typedef struct TokenizerCache TokenizerCache;
TokenizerCache *tokenizer_cache_new(void);
void tokenizer_cache_free(TokenizerCache *c);
/* Thread-safe given a cache per thread; cache may be NULL (no caching). */
int tokenizer_encode_with(const Tokenizer *t, TokenizerCache *cache, const char *text, size_t len, int32_t **ids,
                          size_t *n_ids, ZyErr *err);

#define TOK_ENCODE_ADD_SPECIAL 1u /* run the post-processor (HF's add_special_tokens=True, its default) */
/* tokenizer_encode_with with flags. */
int tokenizer_encode_ex(const Tokenizer *t, TokenizerCache *cache, const char *text, size_t len, unsigned flags,
                        int32_t **ids, size_t *n_ids, ZyErr *err);

/* HF's decode(ids, skip_special_tokens=False) through the file's decoders, as bytes (*bytes malloc'ed,
 * NUL-terminated for convenience); an id outside the vocabulary is an error (HF skips it). Where HF puts
 * U+FFFD for bytes that are not valid UTF-8 (ByteLevel, ByteFallback), zaya gives the bytes themselves, so
 * one token decodes to its own bytes; the result equals HF's whenever HF's has no such U+FFFD. (A Strip
 * decoder asked to cut more than a token holds makes HF panic; zaya gives an empty token.) For zaya's
 * byte-level tokenizers decode(encode(x)) == x for every byte string x. */
int tokenizer_decode(const Tokenizer *t, const int32_t *ids, size_t n, char **bytes, size_t *len, ZyErr *err);

#define TOK_DECODE_SKIP_SPECIAL 1u /* HF's skip_special_tokens=True */
#define TOK_DECODE_LOSSY 2u        /* U+FFFD for invalid UTF-8 exactly where HF puts it: HF's string, always */
int tokenizer_decode_ex(const Tokenizer *t, const int32_t *ids, size_t n, unsigned flags, char **bytes, size_t *len,
                        ZyErr *err);

/* Largest id + 1 (ids without a token are holes that decode refuses). */
int tokenizer_vocab_size(const Tokenizer *t);
/* Id of a token by its text in the file (added tokens and model vocab), or -1. */
int tokenizer_token_id(const Tokenizer *t, const char *token);
/* The beginning- / end-of-sequence token as transformers names it: tokenizer_config.json's bos_token / eos_token
 * (a string or {"content": ...}; read by tokenizer_load from the model folder, or next to tokenizer.json), else the
 * special token the post-processor's template puts before / after the text, else a special added token with a
 * usual name (<bos> <s> <|begin_of_text|> <|startoftext|> / <eos> </s> <|end_of_text|> <|endoftext|>), else the
 * legacy <|bos|> / <|eos|> (<|endoftext|> for eos). 0 with *id, or -1 with an error saying what was looked for
 * (the caller names the tokenizer's path). */
enum { TOK_SPECIAL_BOS, TOK_SPECIAL_EOS };
int tokenizer_special_id(const Tokenizer *t, int which, int32_t *id, ZyErr *err);
/* Text of a token as stored in the file (byte-level characters for model tokens), or NULL. */
const char *tokenizer_token_text(const Tokenizer *t, int id);
int tokenizer_n_merges(const Tokenizer *t);
/* Merge number `rank` as (left id, right id); -1 if out of range. */
int tokenizer_merge(const Tokenizer *t, int rank, int *left, int *right);
void tokenizer_free(Tokenizer *t);

/* Pre-tokenization alone (GPT-2 regex semantics, as HF's ByteLevel pre-tokenizer splits; special tokens are
 * not looked for): *ends[i] is the end offset of piece i. */
int tokenizer_pretokenize(const char *text, size_t len, size_t **ends, size_t *n, ZyErr *err);
/* The same split computed with PCRE2 (UTF + UCP) running the GPT-2 regex itself, for tests. PCRE2 10.42
 * knows Unicode 14 while HF (Oniguruma) and the built-in table know Unicode 16: returns 1 (and still the
 * split) when the text holds a code point the two classify differently, 0 when the results must agree. */
int tokenizer_pretokenize_pcre2(const char *text, size_t len, size_t **ends, size_t *n, ZyErr *err);

#endif

/* libFuzzer target for the tokenizer. An input that starts with '{' is loaded as tokenizer.json (it must load or
 * fail with "fuzz: ..."); a loaded tokenizer must decode what it encodes (with and without special tokens, raw,
 * lossy, skipping specials), and what tokenizer_to_json writes must load again and encode the same. Any other input
 * is text for two small fixed tokenizers: a byte-level one (decode(encode(x)) must be x, and the scanner's
 * pre-tokens must equal PCRE2's run of the GPT-2 regex whenever PCRE2's Unicode 14 classes agree with the built-in
 * Unicode 16 table) and a Gemma-3-style one (Replace normalizer, Split, byte_fallback, template; decode(encode(x))
 * must be x for valid UTF-8 without U+2581, which the normalizer makes of spaces), and one with the Unicode
 * normalizers (NFKC, Lowercase, NFD, StripAccents, Strip, NFC), Metaspace(first) and a normalized added token,
 * whose own ids must decode. Build and run: `make fuzz`
 * (every target), or
 *   make build-fuzz/fuzz_tokenizer && build-fuzz/fuzz_tokenizer -max_total_time=60 /tmp/new tests/fuzz/corpus/tokenizer
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char train_text[] =
    "The quick brown fox jumps over the lazy dog. Don't stop: it's 3.14159 and 1,000,000 tokens!\n"
    "\tdef f(x):\n\t\treturn x ** 2  # square\n\n"
    "Ελληνικά, русский, 日本語のテキスト, 한국어, नमस्ते, مرحبا 😀 👨‍👩‍👧 <|bos|> <|eos|>\n"
    "   trailing spaces   \n\n\nnew paragraph with the the the and and and of of of\n";

static Tokenizer *fixed_tokenizer(void) {
    static Tokenizer *t; /* the harness's own state, built once */
    if (!t) {
        const char *texts[1] = {train_text};
        size_t len = sizeof train_text - 1;
        ZyErr err;
        if (tokenizer_train_texts(texts, &len, 1, 330, 0, &t, NULL, &err)) abort();
    }
    return t;
}

/* Gemma 3's pipeline on a small vocabulary: specials, the 256 byte tokens, a few characters and merges. */
static Tokenizer *gemma_tokenizer(void) {
    static Tokenizer *t;
    if (t) return t;
    static const char head[] =
        "{\"added_tokens\": [{\"id\": 0, \"content\": \"<pad>\", \"special\": true}, {\"id\": 1, \"content\": \"<eos>\", "
        "\"special\": true}, {\"id\": 2, \"content\": \"<bos>\", \"special\": true}, {\"id\": 3, \"content\": \"<unk>\", "
        "\"special\": true}, {\"id\": 270, \"content\": \"a b\", \"normalized\": true}],"
        " \"normalizer\": {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\u2581\"},"
        " \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"String\": \" \"}, \"behavior\": \"MergedWithPrevious\", \"invert\": false},"
        " \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<bos>\", \"type_id\": 0}},"
        " {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], \"special_tokens\": {\"<bos>\": {\"id\": \"<bos>\", \"ids\": [2], \"tokens\": [\"<bos>\"]}}},"
        " \"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\", \"pattern\": {\"String\": \"\u2581\"}, \"content\": \" \"},"
        " {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}]},"
        " \"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"fuse_unk\": true, \"byte_fallback\": true, \"vocab\": {"
        "\"<pad>\": 0, \"<eos>\": 1, \"<bos>\": 2, \"<unk>\": 3";
    static const char tail[] =
        ", \"a\": 260, \"b\": 261, \"\u2581\": 262, \"\u2581a\": 263, \"ab\": 264, \"\u2581ab\": 265, \"e\": 266, \"\u00e9\": 267,"
        " \"\u2581\u2581\": 268, \"b\u2581\": 269}, \"merges\": [[\"\u2581\", \"a\"], [\"a\", \"b\"], [\"\u2581a\", \"b\"],"
        " [\"\u2581\", \"\u2581\"], [\"b\", \"\u2581\"]]}}";
    char *js = malloc(sizeof head + 256 * 20 + sizeof tail);
    if (!js) abort();
    size_t n = 0;
    memcpy(js, head, sizeof head - 1);
    n = sizeof head - 1;
    for (int b = 0; b < 256; b++) n += (size_t)sprintf(js + n, ", \"<0x%02X>\": %d", b, 4 + b);
    memcpy(js + n, tail, sizeof tail);
    n += sizeof tail - 1;
    ZyErr err;
    if (tokenizer_load_json(js, n, "gemma", &t, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        abort();
    }
    free(js);
    return t;
}

/* Every Unicode normalizer in one Sequence, Metaspace(first), byte_fallback, an added token matched on its
 * NFKC form ("ﬁx" -> "fix"). */
static Tokenizer *unicode_tokenizer(void) {
    static Tokenizer *t;
    if (t) return t;
    static const char head[] =
        "{\"added_tokens\": [{\"id\": 0, \"content\": \"<unk>\", \"special\": true}, {\"id\": 267, \"content\": \"\ufb01x\", "
        "\"normalized\": true}], \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFKC\"}, "
        "{\"type\": \"Lowercase\"}, {\"type\": \"NFD\"}, {\"type\": \"StripAccents\"}, {\"type\": \"Strip\", "
        "\"strip_left\": true, \"strip_right\": true}, {\"type\": \"NFC\"}]},"
        " \"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"\u2581\", \"prepend_scheme\": \"first\", \"split\": true},"
        " \"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"ByteFallback\"}, {\"type\": \"Metaspace\", "
        "\"replacement\": \"\u2581\", \"prepend_scheme\": \"first\"}]},"
        " \"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"byte_fallback\": true, \"vocab\": {\"<unk>\": 0";
    static const char tail[] =
        ", \"f\": 257, \"i\": 258, \"x\": 259, \"\u2581\": 260, \"fi\": 261, \"\u2581f\": 262, \"e\": 263, \"\u00e9\": 264,"
        " \"\u1100\": 265, \"\uac00\": 266}, \"merges\": [[\"f\", \"i\"], [\"\u2581\", \"f\"]]}}";
    char *js = malloc(sizeof head + 256 * 20 + sizeof tail);
    if (!js) abort();
    size_t n = sizeof head - 1;
    memcpy(js, head, n);
    for (int b = 0; b < 256; b++) n += (size_t)sprintf(js + n, ", \"<0x%02X>\": %d", b, 1 + b);
    memcpy(js + n, tail, sizeof tail);
    n += sizeof tail - 1;
    ZyErr err;
    if (tokenizer_load_json(js, n, "unicode", &t, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        abort();
    }
    free(js);
    return t;
}

static void check_roundtrip(const Tokenizer *t, const char *s, size_t n, unsigned flags, int must_match) {
    int32_t *ids;
    size_t n_ids, len;
    char *back;
    ZyErr err;
    if (tokenizer_encode_ex(t, NULL, s, n, flags, &ids, &n_ids, &err)) abort();
    if (tokenizer_decode(t, ids, n_ids, &back, &len, &err)) abort(); /* its own ids always decode */
    if (must_match && (len != n || memcmp(back, s, n) != 0)) abort();
    free(back);
    for (unsigned f = 1; f <= 3; f++) {
        if (tokenizer_decode_ex(t, ids, n_ids, f, &back, &len, &err)) abort();
        free(back);
    }
    free(ids);
}

static int valid_utf8_without_metaspace(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint8_t c = s[i];
        size_t l = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        if (!l || i + l > n) return 0;
        for (size_t k = 1; k < l; k++)
            if ((s[i + k] & 0xC0) != 0x80) return 0;
        if ((c == 0xE0 && s[i + 1] < 0xA0) || (c == 0xED && s[i + 1] > 0x9F) || (c == 0xF0 && s[i + 1] < 0x90) ||
            (c == 0xF4 && s[i + 1] > 0x8F))
            return 0;
        if (l == 3 && c == 0xE2 && s[i + 1] == 0x96 && s[i + 2] == 0x81) return 0; /* U+2581 */
        i += l - 1;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *s = (const char *)data;
    if (size > 0 && data[0] == '{') {
        Tokenizer *t = NULL;
        ZyErr err;
        if (tokenizer_load_json(s, size, "fuzz", &t, &err) != 0) {
            if (t || strncmp(err.msg, "fuzz: ", 6) != 0) abort();
            return 0;
        }
        static const char sample[] = "the model's <|bos|> tokens\n\n  123 \xc3\xa9\xff<|eos|> \xe2\x96\x81x <s>a b";
        check_roundtrip(t, sample, sizeof sample - 1, 0, 0);
        check_roundtrip(t, sample, sizeof sample - 1, TOK_ENCODE_ADD_SPECIAL, 0);
        /* what it writes loads again and encodes the same */
        char *json;
        size_t len;
        Tokenizer *u = NULL;
        if (tokenizer_to_json(t, &json, &len, &err) || tokenizer_load_json(json, len, "fuzz-again", &u, &err)) {
            fprintf(stderr, "written JSON does not load: %s\n", err.msg);
            abort();
        }
        int32_t *a, *b;
        size_t na, nb;
        if (tokenizer_encode_ex(t, NULL, sample, sizeof sample - 1, TOK_ENCODE_ADD_SPECIAL, &a, &na, &err) ||
            tokenizer_encode_ex(u, NULL, sample, sizeof sample - 1, TOK_ENCODE_ADD_SPECIAL, &b, &nb, &err) || na != nb ||
            (na && memcmp(a, b, na * sizeof *a) != 0))
            abort();
        free(a);
        free(b);
        static const char cfg[] = "{\"add_bos_token\": true, \"add_eos_token\": false, \"bos_token\": \"<s>\"}";
        if (tokenizer_apply_config_json(t, cfg, sizeof cfg - 1, "cfg", &err) == 0)
            check_roundtrip(t, sample, sizeof sample - 1, TOK_ENCODE_ADD_SPECIAL, 0);
        free(json);
        tokenizer_free(u);
        tokenizer_free(t);
        return 0;
    }
    check_roundtrip(fixed_tokenizer(), s, size, 0, 1);
    check_roundtrip(gemma_tokenizer(), s, size, 0, valid_utf8_without_metaspace(data, size));
    check_roundtrip(gemma_tokenizer(), s, size, TOK_ENCODE_ADD_SPECIAL, 0);
    check_roundtrip(unicode_tokenizer(), s, size, 0, 0);
    size_t *a, *b, na, nb;
    ZyErr err;
    if (tokenizer_pretokenize(s, size, &a, &na, &err)) abort();
    int rc = tokenizer_pretokenize_pcre2(s, size, &b, &nb, &err);
    if (rc < 0) abort();
    if (rc == 0 && (na != nb || (na && memcmp(a, b, na * sizeof *a) != 0))) abort();
    if (na && a[na - 1] != size) abort();
    free(a);
    free(b);
    return 0;
}

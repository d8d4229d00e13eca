/* libFuzzer target for the tokenizer. An input that starts with '{' is loaded as tokenizer.json (it must load or
 * fail with "fuzz: ..."; a loaded tokenizer must decode what it encodes). Any other input is text for a small
 * fixed tokenizer: decode(encode(x)) must be x, and the scanner's pre-tokens must equal PCRE2's run of the GPT-2
 * regex whenever PCRE2's Unicode 14 classes agree with the built-in Unicode 16 table. Build and run: `make fuzz`
 * (every target), or
 *   make build-fuzz/fuzz_tokenizer && build-fuzz/fuzz_tokenizer -max_total_time=60 /tmp/new tests/fuzz/corpus/tokenizer
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

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

static void check_roundtrip(const Tokenizer *t, const char *s, size_t n, int must_match) {
    int32_t *ids;
    size_t n_ids, len;
    char *back;
    ZyErr err;
    if (tokenizer_encode_with(t, NULL, s, n, &ids, &n_ids, &err)) abort();
    if (tokenizer_decode(t, ids, n_ids, &back, &len, &err)) abort(); /* its own ids always decode */
    if (must_match && (len != n || memcmp(back, s, n) != 0)) abort();
    free(ids);
    free(back);
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
        static const char sample[] = "the model's <|bos|> tokens\n\n  123 \xc3\xa9\xff<|eos|>";
        check_roundtrip(t, sample, sizeof sample - 1, 0);
        tokenizer_free(t);
        return 0;
    }
    check_roundtrip(fixed_tokenizer(), s, size, 1);
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

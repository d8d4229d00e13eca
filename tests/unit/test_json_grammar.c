/* Structured output: the schema grammar (byte strings accepted and refused, the fewest closing bytes, schema errors)
 * and the token mask (against a token-by-token brute force, the budget rule, end tokens). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "infer/json_grammar.h"
#include "infer/json_mask.h"
#include "test.h"

static JsonGrammar *compile_text(const char *schema, ZyErr *err) {
    cJSON *j = cJSON_Parse(schema);
    if (!j) return NULL;
    JsonGrammar *g = NULL;
    if (json_grammar_compile(j, &g, err)) g = NULL;
    cJSON_Delete(j);
    return g;
}

/* 1: the whole text is a document; 0: a prefix of one; -1: refused at some byte. */
static int judge(const JsonGrammar *g, const char *text, size_t n) {
    JgState s;
    jg_start(g, &s);
    if (jg_feed(g, &s, text, n)) return -1;
    return jg_complete(g, &s);
}
#define ACCEPTS(g, t) judge(g, t, strlen(t))

static const char *PERSON =
    "{\"type\": \"object\", \"title\": \"P\", \"properties\": {"
    "\"name\": {\"type\": \"string\", \"description\": \"who\"}, \"age\": {\"type\": \"integer\"},"
    "\"tags\": {\"type\": \"array\", \"items\": {\"enum\": [\"a\", \"bc\"]}, \"minItems\": 1, \"maxItems\": 2},"
    "\"ok\": {\"type\": \"boolean\"}, \"x\": {\"anyOf\": [{\"type\": \"number\"}, {\"type\": \"null\"}]},"
    "\"kind\": {\"const\": \"k\"}, \"more\": {\"type\": [\"object\", \"null\"], \"properties\": {\"z\": {}}}},"
    "\"required\": [\"name\", \"tags\"], \"additionalProperties\": false}";

TEST(json_grammar_accepts_and_refuses) {
    ZyErr err = {{0}};
    JsonGrammar *g = compile_text(PERSON, &err);
    REQUIRE(g);
    static const char *const good[] = {
        "{\"name\":\"Bob\",\"tags\":[\"a\"]}",
        "{ \"name\" : \"Zo\xc3\xab \\n\\u00e9\\\"\" ,\n\t\"age\": -12, \"tags\": [\"a\", \"bc\"], \"ok\": true, \"x\": null}",
        "{\"name\":\"\",\"tags\":[\"bc\"],\"x\":1.5e3,\"kind\":\"k\",\"more\":{\"z\":[1,{\"q\":false}]}}",
        "{\"name\":\"\xf0\x9f\x8e\x89\",\"tags\":[\"a\"],\"x\":0,\"more\":null}",
        "{\"name\":\"x\",\"age\":0,\"tags\":[\"a\"],\"x\":-0.25E-7,\"more\":{}}",
    };
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) CHECK_MSG(ACCEPTS(g, good[i]) == 1, "%s", good[i]);
    static const char *const prefix[] = {"{", "{\"name\":\"Bo", "{\"name\":\"x\",\"tags\":[\"a\"", "{\"name\":\"x\"",
                                         "{\"name\":\"x\",\"tags\":[\"a\"],\"x\":1"};
    for (size_t i = 0; i < sizeof prefix / sizeof *prefix; i++) CHECK_MSG(ACCEPTS(g, prefix[i]) == 0, "%s", prefix[i]);
    static const char *const bad[] = {
        "{\"tags\":[\"a\"],\"name\":\"x\"}",           /* out of the schema's order */
        "{\"name\":\"x\",\"tags\":[]}",                 /* minItems */
        "{\"name\":\"x\",\"tags\":[\"a\",\"a\",\"a\"]}", /* maxItems */
        "{\"name\":1",                                  /* a number for a string */
        "{\"name\":\"x\",\"age\":1.5",                  /* not an integer */
        "{\"name\":\"x\",\"age\":01",                   /* a leading zero */
        "{\"name\":\"x\",\"tags\":[\"c\"",              /* not in the enum */
        "{\"name\":\"x\",\"tags\":[\"a\"]} ",           /* after the document */
        " {",                                           /* before it */
        "{\"name\":\"x\",\"extra\":1",                  /* not a property */
        "{\"name\":\"x\",\"name\":\"y\"",               /* twice */
        "{\"name\":\"x\",\"tags\":[\"a\"],\"kind\":\"j\"", /* const */
        "{\"name\":\"\x01\"",                           /* a raw control character */
        "{\"name\":\"\xc0\x80\"",                       /* overlong UTF-8 */
        "{\"name\":\"\xed\xa0\x80\"",                   /* a UTF-16 surrogate in UTF-8 */
        "{\"name\":\"\\ud800\"",                        /* an escaped surrogate */
        "{\"name\":\"\\x\"",                            /* not an escape */
        "{\"name\":\"x\",\"tags\":[\"a\"],\"x\":\"s\"",   /* anyOf: neither */
        "{\"name\":\"x\",\"tags\":[\"a\"],}",           /* a trailing comma */
        "[]", "\"x\"", "",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK_MSG(ACCEPTS(g, bad[i]) == (bad[i][0] ? -1 : 0), "%s", bad[i]);
    /* the fewest closing bytes: the shortest document from the start, and along a document */
    JgState s;
    jg_start(g, &s);
    CHECK(jg_min_close(g, &s) == (long)strlen("{\"name\":\"\",\"tags\":[\"a\"]}"));
    const char *doc = good[1];
    for (size_t i = 0; doc[i]; i++) {
        CHECK(jg_step(g, &s, (uint8_t)doc[i]) == 0);
        CHECK((jg_min_close(g, &s) == 0) == (doc[i + 1] == 0));
    }
    json_grammar_free(g);
    /* a number at the top level is complete while it may still grow */
    g = compile_text("{\"type\": \"number\"}", &err);
    REQUIRE(g);
    CHECK(ACCEPTS(g, "12") == 1 && ACCEPTS(g, "12.") == 0 && ACCEPTS(g, "-") == 0 && ACCEPTS(g, "1e+9") == 1);
    CHECK(ACCEPTS(g, "1234567890123456789012345") == -1); /* past JG_MAX_NUMBER bytes */
    /* an 'e' (or '.', '-') only with room for the digit it needs (fuzz_json_schema: a 24th byte 'e' left the number
     * unable to end) */
    CHECK(ACCEPTS(g, "12345678901234567890123e") == -1 && ACCEPTS(g, "1234567890123456789012e") == 0);
    json_grammar_free(g);
}

TEST(json_grammar_any_object_and_refs) {
    ZyErr err = {{0}};
    JsonGrammar *g = NULL;
    REQUIRE(json_grammar_any_object(&g, &err) == 0);
    CHECK(ACCEPTS(g, "{}") == 1);
    CHECK(ACCEPTS(g, "{\"a\": [1, {\"b\": null}, true, \"s\", -2.5e1], \"c\": {\"d\": []}}") == 1);
    CHECK(ACCEPTS(g, "[]") == -1 && ACCEPTS(g, "\"x\"") == -1 && ACCEPTS(g, "{\"a\"}") == -1);
    CHECK(ACCEPTS(g, "{\"a\":tru}") == -1 && ACCEPTS(g, "{1:2}") == -1);
    /* (ACCEPTS evaluates its text twice: no strcat inside it) */
    char gap[64] = "{";
    for (int i = 0; i < JG_MAX_SPACE; i++) strcat(gap, i % 2 ? " " : "\n");
    strcat(gap, "}");
    CHECK(ACCEPTS(g, gap) == 1);
    gap[JG_MAX_SPACE + 1] = ' ';
    strcat(gap, "}");
    CHECK(ACCEPTS(g, gap) == -1); /* one blank too many */
    CHECK(ACCEPTS(g, "{\"                          \": 1}") == 1); /* a string's own blanks are not a gap */
    char deep[200] = "{\"a\":";
    for (int i = 0; i < 40; i++) strcat(deep, "[");
    CHECK(ACCEPTS(g, deep) == -1); /* nesting past JG_MAX_DEPTH */
    json_grammar_free(g);
    g = compile_text("{\"$defs\": {\"P\": {\"type\": \"object\", \"properties\": {\"x\": {\"type\": \"integer\"}},"
                     "\"required\": [\"x\"]}}, \"type\": \"object\", \"properties\": {\"p\": {\"$ref\": \"#/$defs/P\"},"
                     "\"q\": {\"type\": \"array\", \"items\": {\"$ref\": \"#/$defs/P\"}}}, \"required\": [\"p\"]}", &err);
    REQUIRE(g);
    CHECK(ACCEPTS(g, "{\"p\":{\"x\":1},\"q\":[{\"x\":2}]}") == 1);
    CHECK(ACCEPTS(g, "{\"p\":{}") == -1);
    json_grammar_free(g);
    g = compile_text("{\"type\": \"array\"}", &err); /* free-form items */
    REQUIRE(g);
    CHECK(ACCEPTS(g, "[1,\"a\",{}]") == 1 && ACCEPTS(g, "{}") == -1);
    json_grammar_free(g);
    g = compile_text("{\"enum\": [1, 12, \"a\", null, {\"k\": [true]}]}", &err);
    REQUIRE(g);
    CHECK(ACCEPTS(g, "1") == 1 && ACCEPTS(g, "12") == 1 && ACCEPTS(g, "13") == -1 && ACCEPTS(g, "\"a\"") == 1);
    CHECK(ACCEPTS(g, "{\"k\":[true]}") == 1 && ACCEPTS(g, "null") == 1 && ACCEPTS(g, "nul") == 0);
    json_grammar_free(g);
}

TEST(json_grammar_schema_errors) {
    static const struct {
        const char *schema, *want;
    } cases[] = {
        {"{\"type\": \"string\", \"pattern\": \"^a\"}", "'pattern' is not supported (at the top level)"},
        {"{\"properties\": {\"a\": {\"type\": \"string\", \"format\": \"date\"}}}", "'format' is not supported (at properties.a)"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"array\", \"items\": {\"minimum\": 1}}}}",
         "'minimum' is not supported (at properties.a.items)"},
        {"{\"anyOf\": [{\"type\": \"number\"}, {\"type\": \"integer\"}]}", "two alternatives can start with '-'"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {}}, \"required\": [\"b\"]}", "'required' names \"b\""},
        {"{\"type\": \"strin\"}", "'type' \"strin\" is not a JSON Schema type"},
        {"{\"type\": \"object\", \"additionalProperties\": {\"type\": \"string\"}}", "'additionalProperties' must be"},
        {"{\"$defs\": {\"N\": {\"type\": \"object\", \"properties\": {\"n\": {\"$ref\": \"#/$defs/N\"}}}}, \"$ref\": \"#/$defs/N\"}",
         "recursive"},
        {"{\"$ref\": \"#/$defs/missing\"}", "names nothing"},
        {"{\"type\": \"array\", \"minItems\": 3, \"maxItems\": 2}", "'minItems' (3) is above 'maxItems' (2)"},
        {"{\"enum\": []}", "'enum' must be a list"},
        {"{\"allOf\": [{}]}", "'allOf' is not supported"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        ZyErr err = {{0}};
        JsonGrammar *g = compile_text(cases[i].schema, &err);
        CHECK_MSG(!g && strstr(err.msg, cases[i].want), "%s: got \"%s\"", cases[i].schema, err.msg);
        json_grammar_free(g);
    }
}

/* Bytes generated at random under the budget rule always end as a whole document within the budget. */
TEST(json_grammar_budget_always_closes) {
    ZyErr err = {{0}};
    JsonGrammar *g = compile_text(PERSON, &err);
    REQUIRE(g);
    uint64_t rng = 12345;
    for (int trial = 0; trial < 300; trial++) {
        JgState s;
        jg_start(g, &s);
        const long budget = jg_min_close(g, &s) + trial % 40;
        char doc[256];
        long n = 0;
        while (!jg_complete(g, &s) || (s.depth && (rng >> 33) % 3)) {
            int opts[256], n_opts = 0;
            for (int c = 1; c < 256; c++) {
                JgState t;
                jg_copy(&t, &s);
                if (jg_step(g, &t, (uint8_t)c) == 0 && jg_min_close(g, &t) <= budget - n - 1) opts[n_opts++] = c;
            }
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            if (!n_opts) break;
            const int c = opts[(rng >> 33) % n_opts];
            jg_step(g, &s, (uint8_t)c);
            doc[n++] = (char)c;
        }
        doc[n] = 0;
        CHECK_MSG(jg_complete(g, &s) && n <= budget, "trial %d: %s", trial, doc);
        cJSON *parsed = cJSON_Parse(doc);
        CHECK_MSG(parsed && cJSON_GetObjectItemCaseSensitive(parsed, "tags"), "trial %d: %s", trial, doc);
        cJSON_Delete(parsed);
    }
    json_grammar_free(g);
}

/* A small vocabulary: pieces JSON is made of, an end token, then every printable ASCII byte on its own (the budget
 * rule counts on single-byte tokens). */
static const char *const PIECES[] = {"{", "}", "\"", "\"name", "\":", "ab", "\"a\"", "12", "]}", "true", "<eos>",
                                     "\xc3\xa9", "\xc3", "\xa9", "\"tags\":[", "x\"", "\"}", ",\"", "\n", "\"x\"",
                                     "bc", "\"bc\"", "5e", "null", "\t\t"};
#define N_PIECES ((int)(sizeof PIECES / sizeof *PIECES))
#define N_TOKENS (N_PIECES + 95)
#define EOS_ID 10
static char singles[95][2];

static const char *token(int i) {
    if (i < N_PIECES) return PIECES[i];
    singles[i - N_PIECES][0] = (char)(0x20 + i - N_PIECES);
    return singles[i - N_PIECES];
}

static JsonVocab *small_vocab(void) {
    const char *bytes[N_TOKENS];
    size_t lens[N_TOKENS];
    for (int i = 0; i < N_TOKENS; i++) bytes[i] = token(i), lens[i] = strlen(token(i));
    bytes[EOS_ID] = NULL; /* as json_vocab_from_tokenizer leaves a special token */
    JsonVocab *v = NULL;
    ZyErr err;
    return json_vocab_create(bytes, lens, N_TOKENS, &v, &err) ? NULL : v;
}

/* Whether token i may come next, one token at a time. */
static int brute_allowed(const JsonGrammar *g, const JgState *s, int i, long left) {
    if (i == EOS_ID) return jg_complete(g, s);
    JgState t;
    jg_copy(&t, s);
    return jg_feed(g, &t, token(i), strlen(token(i))) == 0 && jg_min_close(g, &t) <= left - 1;
}

TEST(json_mask_matches_brute_force) {
    ZyErr err = {{0}};
    JsonGrammar *g = compile_text(PERSON, &err);
    REQUIRE(g);
    JsonVocab *v = small_vocab();
    JsonMaskScratch *scratch = json_mask_scratch(v);
    REQUIRE(v && scratch);
    const int32_t end[] = {EOS_ID};
    uint64_t rng = 7;
    int steps = 0, completes = 0;
    for (int trial = 0; trial < 200; trial++) {
        JgState s;
        jg_start(g, &s);
        const long budget = jg_min_close(g, &s) + trial % 30;
        for (long used = 0; used < budget; used++) {
            float logits[N_TOKENS];
            for (int i = 0; i < N_TOKENS; i++) logits[i] = (float)i * 0.25f;
            const int n = json_mask_apply(v, g, &s, budget - used, end, 1, scratch, logits, N_TOKENS);
            int want = 0, ok = 1;
            for (int i = 0; i < N_TOKENS; i++) {
                const int a = brute_allowed(g, &s, i, budget - used);
                want += a;
                ok &= a ? logits[i] == (float)i * 0.25f : logits[i] == -INFINITY;
            }
            CHECK_MSG(ok && n == want, "trial %d at token %ld (%d allowed, %d by brute force)", trial, used, n, want);
            steps++;
            if (!ok || n == 0) break;
            int pick;
            do {
                rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                pick = (int)((rng >> 33) % N_TOKENS);
            } while (logits[pick] == -INFINITY);
            if (pick == EOS_ID) {
                completes++;
                break;
            }
            REQUIRE(json_mask_advance(v, g, &s, pick) == 0);
            if (s.depth == 0) {
                completes++;
                break;
            }
        }
        CHECK_MSG(jg_complete(g, &s), "trial %d ended incomplete", trial);
    }
    CHECK(steps > 1000 && completes == 200);
    /* the budget: one token left in `{"name":"x","tags":["a"` allows "]}" only; two allow "]" too */
    JgState s;
    jg_start(g, &s);
    const char *at = "{\"name\":\"x\",\"tags\":[\"a\"";
    REQUIRE(jg_feed(g, &s, at, strlen(at)) == 0);
    float logits[N_TOKENS] = {0};
    CHECK(json_mask_apply(v, g, &s, 1, end, 1, scratch, logits, N_TOKENS) == 1 && logits[8] == 0);
    memset(logits, 0, sizeof logits);
    CHECK(json_mask_apply(v, g, &s, 2, end, 1, scratch, logits, N_TOKENS) == 2 && logits[8] == 0 && logits[N_PIECES + ']' - 0x20] == 0);
    /* a padded lm_head: ids past the vocabulary are never drawn */
    float wide[N_TOKENS + 8] = {0};
    json_mask_apply(v, g, &s, 50, end, 1, scratch, wide, N_TOKENS + 8);
    for (int i = N_TOKENS; i < N_TOKENS + 8; i++) CHECK(wide[i] == -INFINITY);
    json_mask_scratch_free(scratch);
    json_vocab_free(v);
    json_grammar_free(g);
}

/* The mask over a Gemma-sized vocabulary (262,144 random tokens of 1-16 bytes) against the brute force, and its
 * cost: printed, for the record (docs/serving.md). */
TEST(json_mask_large_vocabulary) {
    enum { V = 262144 };
    char **bytes = malloc(sizeof *bytes * V);
    size_t *lens = malloc(sizeof *lens * V);
    REQUIRE(bytes && lens);
    static const char alphabet[] = "abcdefghijklmnopqrstuvwxyz   ,:{}[]\"\"0123456789.-\\\n\xc3\xa9";
    uint64_t rng = 99;
    for (int i = 0; i < V; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        lens[i] = i < 256 ? 1 : 1 + (rng >> 33) % 12;
        bytes[i] = malloc(lens[i] + 1);
        for (size_t k = 0; k < lens[i]; k++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            bytes[i][k] = i < 256 ? (char)i : alphabet[(rng >> 33) % (sizeof alphabet - 1)];
        }
    }
    ZyErr err = {{0}};
    JsonVocab *v = NULL;
    REQUIRE(json_vocab_create((const char *const *)bytes, lens, V, &v, &err) == 0);
    JsonGrammar *g = compile_text(PERSON, &err);
    JsonMaskScratch *scratch = json_mask_scratch(v);
    float *logits = malloc(sizeof(float) * V);
    REQUIRE(g && scratch && logits);
    static const char *const at[] = {"", "{", "{\"name\":\"Bo", "{\"name\":\"x\",\"tags\":[\"a\"", "{\"name\":\"x\",\"ta"};
    for (size_t a = 0; a < sizeof at / sizeof *at; a++) {
        JgState s;
        jg_start(g, &s);
        REQUIRE(jg_feed(g, &s, at[a], strlen(at[a])) == 0);
        const int reps = 5;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        int n = 0;
        for (int r = 0; r < reps; r++) {
            for (int i = 0; i < V; i++) logits[i] = 0;
            n = json_mask_apply(v, g, &s, 1000, NULL, 0, scratch, logits, V);
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        const double ms = ((t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) * 1e-6) / reps;
        int want = 0, same = 1;
        for (int i = 0; i < V; i++) {
            JgState t;
            jg_copy(&t, &s);
            const int ok = jg_feed(g, &t, bytes[i], lens[i]) == 0;
            want += ok;
            same &= ok == (logits[i] == 0);
        }
        CHECK_MSG(same && n == want, "at \"%s\": %d allowed, %d by brute force", at[a], n, want);
        printf("    mask over %d tokens after \"%s\": %d allowed, %.2f ms\n", V, at[a], n, ms);
    }
    free(logits);
    json_mask_scratch_free(scratch);
    json_grammar_free(g);
    json_vocab_free(v);
    for (int i = 0; i < V; i++) free(bytes[i]);
    free(bytes);
    free(lens);
}

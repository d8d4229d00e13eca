/* Synthetic corpus: determinism in the seed, held-out 2-digit additions absent from every training file in
 * every format (checked on the text, independently of the generator), varied prose, well-formed eval files. */
#define _POSIX_C_SOURCE 200809L
#include <cjson/cJSON.h>
#include <dirent.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/synth.h"
#include "test.h"

static const char *const TRAIN_FILES[] = {"general.jsonl", "mathcode.jsonl", "longctx.jsonl"};
static const char *const EVAL_FILES[] = {"eval/addition2.jsonl", "eval/arith_mc.jsonl", "eval/kv_recall.jsonl",
                                         "eval/general_mc.jsonl", "eval/code_exec.jsonl"};

static int gen_dir(char *dir, size_t cap, uint64_t seed, double scale) {
    snprintf(dir, cap, "/tmp/zy_synth_XXXXXX");
    if (!mkdtemp(dir)) return -1;
    SynthReport rep;
    ZyErr err;
    if (synth_generate(dir, seed, scale, &rep, &err) != 0) {
        fprintf(stderr, "    synth: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static char *slurp(const char *dir, const char *name, size_t *len) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    char *d;
    ZyErr err;
    if (zy_read_file(p, &d, len, &err) != 0) return NULL;
    return d;
}

/* Calls fn(json, ctx) for every line of a JSONL file; returns the number of lines or -1 on a bad line. */
static long each_line(const char *dir, const char *name, void (*fn)(const cJSON *, void *), void *ctx) {
    size_t len;
    char *d = slurp(dir, name, &len);
    if (!d) return -1;
    long n = 0;
    for (char *p = d, *nl; *p; p = nl + 1) {
        nl = strchr(p, '\n');
        if (!nl) {
            n = -1; /* every line ends with a newline */
            break;
        }
        cJSON *j = cJSON_ParseWithLength(p, (size_t)(nl - p));
        if (!j) {
            n = -1;
            break;
        }
        fn(j, ctx);
        cJSON_Delete(j);
        n++;
    }
    free(d);
    return n;
}

TEST(synth_deterministic_in_seed) {
    char a[64], b[64], c[64];
    REQUIRE(gen_dir(a, sizeof a, 5, 0.02) == 0);
    REQUIRE(gen_dir(b, sizeof b, 5, 0.02) == 0);
    REQUIRE(gen_dir(c, sizeof c, 6, 0.02) == 0);
    const char *all[] = {"general.jsonl", "mathcode.jsonl", "longctx.jsonl", "eval/addition2.jsonl",
                         "eval/arith_mc.jsonl", "eval/kv_recall.jsonl", "eval/general_mc.jsonl",
                         "eval/code_exec.jsonl", "README.txt"};
    for (size_t i = 0; i < ZY_ARRAY_LEN(all); i++) {
        size_t la, lb, lc;
        char *da = slurp(a, all[i], &la), *db = slurp(b, all[i], &lb), *dc = slurp(c, all[i], &lc);
        CHECK_MSG(da && db && dc, "%s missing", all[i]);
        if (da && db) CHECK_MSG(la == lb && memcmp(da, db, la) == 0, "%s differs for the same seed", all[i]);
        if (da && dc) CHECK_MSG(la != lc || memcmp(da, dc, la) != 0, "%s identical for different seeds", all[i]);
        free(da);
        free(db);
        free(dc);
    }
    /* sizes follow the scale */
    size_t lg;
    char *g = slurp(a, "general.jsonl", &lg);
    CHECK(g && lg >= (size_t)(0.02 * SYNTH_GENERAL_BYTES) && lg < (size_t)(0.02 * SYNTH_GENERAL_BYTES) + 20000);
    free(g);
    zy_test_rmtree(a);
    zy_test_rmtree(b);
    zy_test_rmtree(c);
}

typedef struct {
    uint8_t held[100][100];
    long n_pairs, bad;
} Held;

static void read_addition(const cJSON *j, void *ctx) {
    Held *h = ctx;
    const cJSON *p = cJSON_GetObjectItem(j, "prompt"), *a = cJSON_GetObjectItem(j, "answer");
    int x, y, n = 0;
    if (!cJSON_IsString(p) || !cJSON_IsString(a) || sscanf(p->valuestring, "%d+%d=%n", &x, &y, &n) != 2 ||
        p->valuestring[n] != '\0' || x < 10 || x > 99 || y < 10 || y > 99 || atoi(a->valuestring) != x + y) {
        h->bad++;
        return;
    }
    h->held[x][y] = 1;
    h->n_pairs++;
}

/* Numbers in the text with where they start and end. */
typedef struct {
    long v;
    size_t start, end;
} Num;

static size_t numbers(const char *s, Num *out, size_t cap) {
    size_t n = 0;
    for (size_t i = 0; s[i] && n < cap;) {
        if (s[i] < '0' || s[i] > '9') {
            i++;
            continue;
        }
        Num x = {0, i, i};
        int digits = 0;
        while (s[i] >= '0' && s[i] <= '9') {
            if (++digits <= 9) x.v = x.v * 10 + (s[i] - '0');
            i++;
        }
        x.end = i;
        if (digits > 9) x.v = -1;
        out[n++] = x;
    }
    return n;
}

typedef struct {
    const Held *h;
    long docs, leaks, adds2;
    char example[200];
} Scan;

static int is_held(const Held *h, long a, long b) { return a >= 10 && a <= 99 && b >= 10 && b <= 99 && h->held[a][b]; }

/* Two checks: (1) a held-out pair joined by any addition connector the corpus uses ("47+38", "47 + 38",
 * "47 plus 38", "sum of 47 and 38"), in either order; (2) two held-out numbers and their sum (or the inverse
 * subtraction) among 5 consecutive numbers, which covers word problems, programs and chains. */
static void scan_doc(const cJSON *j, void *ctx) {
    Scan *sc = ctx;
    const cJSON *t = cJSON_GetObjectItem(j, "text");
    if (!cJSON_IsString(t)) {
        sc->leaks++;
        return;
    }
    const char *s = t->valuestring;
    sc->docs++;
    static const char *const conn[] = {"+", " + ", " plus ", " and ", "+ ", " +"};
    size_t cap = strlen(s) / 2 + 1;
    Num *nums = malloc(cap * sizeof *nums);
    size_t n = numbers(s, nums, cap);
    for (size_t i = 0; i + 1 < n; i++) {
        size_t gap = nums[i + 1].start - nums[i].end;
        const char *mid = s + nums[i].end;
        int is_add = 0;
        for (size_t c = 0; c < ZY_ARRAY_LEN(conn); c++)
            is_add |= strlen(conn[c]) == gap && strncmp(mid, conn[c], gap) == 0;
        if (is_add && mid[1] == 'a') { /* " and ": only "sum of A and B", "Add A and B" */
            size_t st = nums[i].start;
            is_add = (st >= 7 && strncmp(s + st - 7, "sum of ", 7) == 0) || (st >= 4 && strncmp(s + st - 4, "Add ", 4) == 0);
        }
        if (is_add && nums[i].v >= 10 && nums[i].v <= 99 && nums[i + 1].v >= 10 && nums[i + 1].v <= 99 &&
            gap == 1 && mid[0] == '+' && nums[i + 2 < n ? i + 2 : i].v == nums[i].v + nums[i + 1].v)
            sc->adds2++;
        if (is_add && is_held(sc->h, nums[i].v, nums[i + 1].v)) {
            if (!sc->leaks) snprintf(sc->example, sizeof sc->example, "%.60s", s + nums[i].start);
            sc->leaks++;
        }
        for (size_t a = i; a < n && a < i + 5; a++)
            for (size_t b = i; b < n && b < i + 5; b++)
                for (size_t c = i; c < n && c < i + 5; c++) {
                    if (a == b || b == c || a == c || !is_held(sc->h, nums[a].v, nums[b].v)) continue;
                    if (nums[c].v == nums[a].v + nums[b].v) {
                        if (!sc->leaks) snprintf(sc->example, sizeof sc->example, "%.80s", s + nums[i].start);
                        sc->leaks++;
                    }
                }
    }
    free(nums);
}

TEST(synth_heldout_additions_never_in_training) {
    char dir[64];
    REQUIRE(gen_dir(dir, sizeof dir, 1, 0.3) == 0);
    Held *h = calloc(1, sizeof *h);
    CHECK(each_line(dir, "eval/addition2.jsonl", read_addition, h) > 0);
    CHECK(h->bad == 0);
    /* a seeded tenth of the 4095 unordered pairs, in both orders */
    CHECK(h->n_pairs > 780 && h->n_pairs < 830);
    int asym = 0;
    for (int a = 10; a <= 99; a++)
        for (int b = 10; b <= 99; b++) asym += h->held[a][b] != h->held[b][a];
    CHECK(asym == 0);
    SynthHeldout ho;
    synth_heldout_init(&ho, 1);
    int same = 1;
    for (int a = 10; a <= 99; a++)
        for (int b = 10; b <= 99; b++) same &= synth_is_heldout(&ho, a, b) == h->held[a][b];
    CHECK(same);
    for (size_t f = 0; f < ZY_ARRAY_LEN(TRAIN_FILES); f++) {
        Scan sc = {h, 0, 0, 0, ""};
        CHECK(each_line(dir, TRAIN_FILES[f], scan_doc, &sc) > 0);
        CHECK_MSG(sc.leaks == 0, "%s: %ld held-out additions, e.g. \"%s\"", TRAIN_FILES[f], sc.leaks, sc.example);
        /* plentiful "a+b=c" 2-digit additions in phase 2 */
        if (f == 1) CHECK_MSG(sc.adds2 > 15000, "only %ld 2-digit a+b=c lines", sc.adds2);
    }
    free(h);
    zy_test_rmtree(dir);
}

/* Sentence skeletons: function words kept, every other word replaced by "w". */
typedef struct {
    char **shapes;
    long *count;
    long n_shapes, cap, n_sent;
    char **words;
    long n_words, cap_words;
} Shapes;

static int is_function_word(const char *w, size_t n) {
    static const char *const fw[] = {"the", "a", "an", "and", "to", "of", "in", "on", "at", "was", "is", "with",
                                     "he", "she", "his", "her", "him", "it", "i", "you", "that", "who", "for",
                                     "by", "so", "but", "when", "while", "because", "then", "there", "were",
                                     "not", "from", "nor", "neither", "my", "are", "said", "asked", "some", "had"};
    char low[32];
    if (n >= sizeof low) return 0;
    for (size_t i = 0; i < n; i++) low[i] = (char)(w[i] >= 'A' && w[i] <= 'Z' ? w[i] - 'A' + 'a' : w[i]);
    low[n] = '\0';
    for (size_t i = 0; i < ZY_ARRAY_LEN(fw); i++)
        if (strcmp(low, fw[i]) == 0) return 1;
    return 0;
}

static void add_str(char ***arr, long **cnt, long *n, long *cap, const char *s) {
    for (long i = 0; i < *n; i++)
        if (strcmp((*arr)[i], s) == 0) {
            if (cnt) (*cnt)[i]++;
            return;
        }
    if (*n == *cap) {
        *cap = *cap ? *cap * 2 : 256;
        *arr = realloc(*arr, (size_t)*cap * sizeof **arr);
        if (cnt) *cnt = realloc(*cnt, (size_t)*cap * sizeof **cnt);
    }
    (*arr)[*n] = strdup(s);
    if (cnt) (*cnt)[*n] = 1;
    (*n)++;
}

static void shape_doc(const cJSON *j, void *ctx) {
    Shapes *sh = ctx;
    if (sh->n_sent > 6000) return;
    const char *s = cJSON_GetObjectItem(j, "text")->valuestring;
    char shape[512];
    size_t sp = 0;
    for (const char *p = s; *p;) {
        if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z')) {
            const char *q = p;
            while ((*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z')) q++;
            size_t n = (size_t)(q - p);
            char word[64];
            if (n < sizeof word && sh->n_words < 5000) {
                memcpy(word, p, n);
                word[n] = '\0';
                add_str(&sh->words, NULL, &sh->n_words, &sh->cap_words, word);
            }
            const char *put = is_function_word(p, n) ? NULL : "w";
            size_t len = put ? 1 : n;
            if (sp + len + 2 < sizeof shape) {
                if (sp && shape[sp - 1] != ' ' && shape[sp - 1] != '"') shape[sp++] = ' ';
                memcpy(shape + sp, put ? put : p, len);
                sp += len;
            }
            p = q;
            continue;
        }
        char c = *p++;
        if (c == '.' || c == '!' || c == '?' || c == '\n') {
            if (c != '\n' && sp + 1 < sizeof shape) shape[sp++] = c;
            shape[sp] = '\0';
            if (sp > 2) {
                add_str(&sh->shapes, &sh->count, &sh->n_shapes, &sh->cap, shape);
                sh->n_sent++;
            }
            sp = 0;
        } else if ((c == ',' || c == '"' || c == ':') && sp + 1 < sizeof shape) {
            shape[sp++] = c;
        }
    }
}

TEST(synth_prose_is_varied) {
    char dir[64];
    REQUIRE(gen_dir(dir, sizeof dir, 2, 0.05) == 0);
    Shapes sh = {0};
    CHECK(each_line(dir, "general.jsonl", shape_doc, &sh) > 100);
    long top = 0;
    for (long i = 0; i < sh.n_shapes; i++)
        if (sh.count[i] > top) top = sh.count[i];
    CHECK_MSG(sh.n_shapes >= 120, "only %ld sentence shapes in %ld sentences", sh.n_shapes, sh.n_sent);
    CHECK_MSG(top * 20 < sh.n_sent, "one shape covers %ld of %ld sentences", top, sh.n_sent);
    CHECK_MSG(sh.n_words >= 500, "only %ld distinct words", sh.n_words);
    /* dialogue is present */
    size_t len;
    char *g = slurp(dir, "general.jsonl", &len);
    CHECK(g && strstr(g, ",\\\" ") != NULL && strstr(g, "?\\\" asked") != NULL);
    free(g);
    for (long i = 0; i < sh.n_shapes; i++) free(sh.shapes[i]);
    for (long i = 0; i < sh.n_words; i++) free(sh.words[i]);
    free(sh.shapes);
    free(sh.count);
    free(sh.words);
    zy_test_rmtree(dir);
}

typedef struct {
    long bad, n;
    const char *field; /* "prompt" or "context" */
    int mc;
    size_t max_len;
} EvalCheck;

static void check_eval_item(const cJSON *j, void *ctx) {
    EvalCheck *ec = ctx;
    ec->n++;
    const cJSON *p = cJSON_GetObjectItem(j, ec->field);
    if (!cJSON_IsString(p) || !p->valuestring[0]) {
        ec->bad++;
        return;
    }
    if (strlen(p->valuestring) > ec->max_len) ec->max_len = strlen(p->valuestring);
    const cJSON *a = cJSON_GetObjectItem(j, "answer");
    if (ec->mc) {
        const cJSON *c = cJSON_GetObjectItem(j, "choices");
        int nc = cJSON_IsArray(c) ? cJSON_GetArraySize(c) : 0;
        if (nc < 2 || !cJSON_IsNumber(a) || a->valueint < 0 || a->valueint >= nc) ec->bad++;
        for (int i = 0; i < nc; i++)
            for (int k = 0; k < i; k++)
                if (strcmp(cJSON_GetArrayItem(c, i)->valuestring, cJSON_GetArrayItem(c, k)->valuestring) == 0) ec->bad++;
    } else {
        size_t n = strlen(p->valuestring);
        if (!cJSON_IsString(a) || !a->valuestring[0] || a->valuestring[0] == ' ' || p->valuestring[n - 1] == ' ')
            ec->bad++;
    }
}

typedef struct {
    char keys[64][32];
    int n;
    const char *train; /* longctx.jsonl text */
    long leaked;
} KvKeys;

static void kv_key(const cJSON *j, void *ctx) {
    KvKeys *k = ctx;
    const char *p = cJSON_GetObjectItem(j, "prompt")->valuestring;
    const char *q = strstr(p, "Q: What is the code for ");
    char key[32];
    if (!q || sscanf(q + 24, "%31[a-z]", key) != 1) {
        k->leaked++;
        return;
    }
    char fact[64];
    snprintf(fact, sizeof fact, "the code for %s is", key);
    if (strstr(p, fact) == NULL && strstr(p, fact + 4) == NULL) k->leaked++; /* the fact is in the context */
    snprintf(fact, sizeof fact, "code for %s ", key);
    if (strstr(k->train, fact)) k->leaked++;
    snprintf(fact, sizeof fact, "code for %s?", key);
    if (strstr(k->train, fact)) k->leaked++;
}

typedef struct {
    const char *train;
    long found, n;
} ProgCheck;

static void prog_not_trained(const cJSON *j, void *ctx) {
    ProgCheck *pc = ctx;
    const char *p = cJSON_GetObjectItem(j, "prompt")->valuestring;
    const char *end = strstr(p, "\noutput:");
    if (!end) {
        pc->found++;
        return;
    }
    /* the program as it appears inside a JSON string in the training file, with the output marker */
    char esc[2048];
    size_t e = 0;
    for (const char *s = p; s < end && e + 4 < sizeof esc; s++) {
        if (*s == '\n') {
            esc[e++] = '\\';
            esc[e++] = 'n';
        } else {
            esc[e++] = *s;
        }
    }
    memcpy(esc + e, "\\noutput:", 10);
    /* preceded by the start of a document or a blank line, so a longer program ending the same way is fine */
    char a[2100], b[2100];
    snprintf(a, sizeof a, "{\"text\": \"%s", esc);
    snprintf(b, sizeof b, "\\n\\n%s", esc);
    if (strstr(pc->train, a) || strstr(pc->train, b)) pc->found++;
    pc->n++;
}

TEST(synth_eval_files_well_formed_and_held_out) {
    char dir[64];
    REQUIRE(gen_dir(dir, sizeof dir, 3, 0.1) == 0);
    const char *fields[] = {"prompt", "context", "prompt", "context", "prompt"};
    const int mc[] = {0, 1, 0, 1, 0};
    const long min_items[] = {780, 400, 200, 300, 300};
    for (size_t i = 0; i < ZY_ARRAY_LEN(EVAL_FILES); i++) {
        EvalCheck ec = {0, 0, fields[i], mc[i], 0};
        long n = each_line(dir, EVAL_FILES[i], check_eval_item, &ec);
        CHECK_MSG(n >= min_items[i] && ec.bad == 0, "%s: %ld lines, %ld bad", EVAL_FILES[i], n, ec.bad);
        if (i == 2) CHECK(ec.max_len > 600); /* a context, not just the question */
    }
    size_t len;
    KvKeys kv = {.n = 0};
    kv.train = slurp(dir, "longctx.jsonl", &len);
    REQUIRE(kv.train != NULL);
    CHECK(strstr(kv.train, "Q: What is the code for ") != NULL);
    CHECK(each_line(dir, "eval/kv_recall.jsonl", kv_key, &kv) == 200);
    CHECK_MSG(kv.leaked == 0, "%ld kv_recall keys also in training", kv.leaked);
    free((char *)kv.train);
    ProgCheck pc = {NULL, 0, 0};
    pc.train = slurp(dir, "mathcode.jsonl", &len);
    REQUIRE(pc.train != NULL);
    CHECK(each_line(dir, "eval/code_exec.jsonl", prog_not_trained, &pc) == 300);
    CHECK_MSG(pc.found == 0, "%ld eval programs in training", pc.found);
    CHECK(strstr(pc.train, "\\noutput: ") != NULL);
    free((char *)pc.train);
    char *readme = slurp(dir, "README.txt", &len);
    CHECK(readme && strstr(readme, "addition2.jsonl") && strstr(readme, "general.jsonl"));
    free(readme);
    SynthReport rep;
    ZyErr err;
    CHECK(synth_generate(dir, 0, 0.0, &rep, &err) != 0 && strstr(err.msg, "scale"));
    CHECK(synth_generate("/proc/zy_no_such_dir/x", 0, 0.01, &rep, &err) != 0);
    zy_test_rmtree(dir);
}

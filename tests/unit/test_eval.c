/* Eval: multiple-choice scores and exact match against brute-force recomputation with the full forward, held-out
 * loss against cached decoding, and the task-file errors (file:line). A toy character tokenizer keeps every text
 * plain ASCII: ids 3..28 'a'..'z', 29 ' ', 30 '\n', 31..39 '1'..'9'; bos 1, eos 2. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/config.h"
#include "infer/decode.h"
#include "infer/eval.h"
#include "model/model.h"
#include "test.h"

static int char_id(char ch) {
    if (ch >= 'a' && ch <= 'z') return 3 + (ch - 'a');
    if (ch == ' ') return 29;
    if (ch == '\n') return 30;
    if (ch >= '1' && ch <= '9') return 31 + (ch - '1');
    return -1;
}

static char id_char(int32_t id) {
    if (id >= 3 && id <= 28) return (char)('a' + id - 3);
    if (id == 29) return ' ';
    if (id == 30) return '\n';
    if (id >= 31 && id <= 39) return (char)('1' + id - 31);
    return '?';
}

static int toy_encode(void *ctx, const char *text, size_t len, int32_t **ids, size_t *n, ZyErr *err) {
    *ids = malloc(sizeof(int32_t) * (len + 1));
    for (size_t i = 0; i < len; i++)
        if (((*ids)[i] = char_id(text[i])) < 0) {
            free(*ids);
            return zy_fail(err, "toy tokenizer: byte %d", text[i]);
        }
    *n = len;
    return 0;
}

static int toy_decode(void *ctx, const int32_t *ids, size_t n, char **bytes, size_t *len, ZyErr *err) {
    *bytes = malloc(n + 1);
    for (size_t i = 0; i < n; i++) (*bytes)[i] = id_char(ids[i]);
    (*bytes)[n] = 0;
    *len = n;
    return 0;
}

static const EvalTokenizer toy = {NULL, toy_encode, toy_decode, 1, 2, 40};

static int toy_model(Model *m, ZyErr *err) {
    ZayaConfig c = {.vocab_size = 40, .hidden_size = 24, .num_layers = 2, .num_heads = 4, .num_kv_heads = 2,
                    .head_dim = 8, .num_experts = 3, .moe_intermediate_size = 12, .router_hidden_size = 8,
                    .cca_time0 = 2, .cca_time1 = 2, .rms_norm_eps = 1e-5f, .tie_word_embeddings = 0,
                    .max_position_embeddings = 64, .rope_theta = 10000.0f, .partial_rotary_factor = 0.5f,
                    .initializer_range = 0.4f, .bos_token_id = 1, .eos_token_id = 2, .pad_token_id = 0};
    if (model_create(m, &c, err)) return -1;
    model_init_weights(m, 77); /* a large init range: peaked distributions, no near-ties */
    return 0;
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

/* Σ log p(cont | [bos] + ctx) with one full forward over the whole sequence. */
static double brute_ll(Model *m, const char *ctx, const char *cont) {
    const int nc = (int)strlen(ctx), nk = (int)strlen(cont), T = 1 + nc + nk, V = m->cfg.vocab_size;
    int32_t *tok = malloc(sizeof(int32_t) * T);
    tok[0] = 1;
    for (int i = 0; i < nc; i++) tok[1 + i] = char_id(ctx[i]);
    for (int i = 0; i < nk; i++) tok[1 + nc + i] = char_id(cont[i]);
    Activations a;
    ZyErr err;
    if (acts_create(&a, &m->cfg, 1, T, &err)) abort();
    model_forward(m, &a, tok);
    double s = 0;
    for (int t = nc; t < T - 1; t++) {
        const float *l = a.logits + (long)t * V;
        double mx = l[0], sum = 0;
        for (int v = 1; v < V; v++) mx = fmax(mx, l[v]);
        for (int v = 0; v < V; v++) sum += exp(l[v] - mx);
        s += l[tok[t + 1]] - mx - log(sum);
    }
    acts_free(&a);
    free(tok);
    return s;
}

TEST(eval_multiple_choice_matches_brute_force) {
    ZyErr err = {{0}};
    Model m;
    REQUIRE(toy_model(&m, &err) == 0);
    char dir[] = "/tmp/zaya_eval_XXXXXX", path[64];
    REQUIRE(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/mc_toy.jsonl", dir);
    /* trailing context whitespace moves to the choices, as in lm-evaluation-harness */
    static const char *ctx[3] = {"the cat sat on the", "two plus two is ", "abc"};
    static const char *ch[3][3] = {{"mat", "dog", "hat"}, {"four", "five", "x"}, {"d", "defgh", "zz"}};
    int answer[3];
    double acc = 0, acc_norm = 0, gold = 0, gold_tok = 0;
    for (int i = 0; i < 3; i++) {
        char c[64];
        size_t cl = strlen(ctx[i]);
        while (cl > 0 && ctx[i][cl - 1] == ' ') cl--;
        memcpy(c, ctx[i], cl);
        c[cl] = 0;
        const char *ws = ctx[i] + cl;
        int best = 0, best_n = 0;
        double ll[3], bn = -INFINITY;
        for (int k = 0; k < 3; k++) {
            char cont[64];
            snprintf(cont, sizeof cont, "%s%s", ws, ch[i][k]);
            ll[k] = brute_ll(&m, c, cont);
            if (ll[k] > ll[best]) best = k;
            if (ll[k] / strlen(ch[i][k]) > bn) {
                bn = ll[k] / strlen(ch[i][k]);
                best_n = k;
            }
        }
        answer[i] = i == 1 ? (best + 1) % 3 : best; /* two right, one wrong */
        acc += best == answer[i];
        acc_norm += best_n == answer[i];
        gold += ll[answer[i]];
        gold_tok += strlen(ws) + strlen(ch[i][answer[i]]);
    }
    char text[1024];
    snprintf(text, sizeof text,
             "{\"context\": \"the cat sat on the\", \"choices\": [\"mat\", \"dog\", \"hat\"], \"answer\": %d}\n"
             "\n"
             "{\"context\": \"two plus two is \", \"choices\": [\"four\", \"five\", \"x\"], \"answer\": %d}\r\n"
             "  {\"answer\": %d, \"choices\": [\"d\", \"defgh\", \"zz\"], \"context\": \"abc\"}\n",
             answer[0], answer[1], answer[2]);
    write_text(path, text);
    EvalResult r;
    REQUIRE(eval_task_file_with(&m, &toy, path, 0, &r, &err) == 0);
    CHECK(r.type == EVAL_TASK_MC && r.n == 3 && strcmp(r.name, "mc_toy") == 0);
    CHECK(acc == 2);
    CHECK_NEAR(r.acc, acc / 3, 1e-12);
    CHECK_NEAR(r.acc_norm, acc_norm / 3, 1e-12);
    CHECK_NEAR(r.ppl, exp(-gold / gold_tok), 1e-5);
    CHECK(isnan(r.exact_match));
    /* --limit */
    REQUIRE(eval_task_file_with(&m, &toy, path, 2, &r, &err) == 0);
    CHECK(r.n == 2);
    unlink(path);
    rmdir(dir);
    model_free(&m);
}

/* Greedy answer by full-forward argmax, stopping at a newline, eos or the token cap. */
static void brute_answer(Model *m, const char *prompt, int n_allowed, char *out) {
    const int V = m->cfg.vocab_size, np = (int)strlen(prompt);
    int32_t tok[128];
    int T = 1 + np, n = 0;
    tok[0] = 1;
    for (int i = 0; i < np; i++) tok[1 + i] = char_id(prompt[i]);
    while (n < EVAL_MAX_ANSWER_TOKENS) {
        Activations a;
        ZyErr err;
        if (acts_create(&a, &m->cfg, 1, T, &err)) abort();
        model_forward(m, &a, tok);
        const float *l = a.logits + (long)(T - 1) * V;
        int best = 0;
        for (int v = 1; v < n_allowed && v < V; v++)
            if (l[v] > l[best]) best = v;
        acts_free(&a);
        if (best == 2) break;
        tok[T++] = best;
        if (id_char(best) == '\n') break;
        out[n++] = id_char(best);
    }
    out[n] = 0;
}

TEST(eval_exact_match_greedy) {
    ZyErr err = {{0}};
    Model m;
    REQUIRE(toy_model(&m, &err) == 0);
    char dir[] = "/tmp/zaya_eval_XXXXXX", path[64], a1[64], a2[64], text[512];
    REQUIRE(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/qa.jsonl", dir);
    EvalResult r;
    for (int pass = 0; pass < 2; pass++) { /* the whole vocabulary, then a tokenizer knowing only ids < 20 */
        EvalTokenizer tk = toy;
        tk.vocab_size = pass ? 20 : 40;
        brute_answer(&m, "what is one", tk.vocab_size, a1);
        brute_answer(&m, "name a color", tk.vocab_size, a2);
        CHECK(strlen(a1) > 0);
        /* the first reference matches after stripping whitespace, the second does not */
        snprintf(text, sizeof text, "{\"prompt\": \"what is one\", \"answer\": \"  %s \"}\n"
                                    "{\"prompt\": \"name a color\", \"answer\": \"%sq\"}\n", a1, a2);
        write_text(path, text);
        REQUIRE(eval_task_file_with(&m, &tk, path, 0, &r, &err) == 0);
        CHECK(r.type == EVAL_TASK_EXACT && r.n == 2);
        CHECK_NEAR(r.exact_match, 0.5, 1e-12);
        CHECK(isnan(r.acc) && isnan(r.ppl));
    }
    /* JSON report and table */
    char jpath[80];
    snprintf(jpath, sizeof jpath, "%s/out.json", dir);
    REQUIRE(eval_write_json(jpath, &r, 1, "val", 2.5, 100, NULL, "f32", &err) == 0);
    char *data;
    size_t len;
    REQUIRE(zy_read_file(jpath, &data, &len, &err) == 0);
    cJSON *j = cJSON_Parse(data);
    const cJSON *t0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "tasks"), 0);
    CHECK(t0 && strcmp(cJSON_GetObjectItem(t0, "type")->valuestring, "exact") == 0);
    CHECK(t0 && cJSON_GetObjectItem(t0, "exact_match")->valuedouble == 0.5 && !cJSON_GetObjectItem(t0, "acc"));
    const cJSON *wt = cJSON_GetObjectItem(j, "weights");
    CHECK(cJSON_IsString(wt) && strcmp(wt->valuestring, "f32") == 0);
    const cJSON *h = cJSON_GetObjectItem(j, "heldout");
    CHECK(h && fabs(cJSON_GetObjectItem(h, "ppl")->valuedouble - exp(2.5)) < 1e-9);
    cJSON_Delete(j);
    free(data);
    unlink(jpath);
    unlink(path);
    rmdir(dir);
    model_free(&m);
}

TEST(eval_task_file_errors_name_file_and_line) {
    ZyErr err = {{0}};
    Model m;
    REQUIRE(toy_model(&m, &err) == 0);
    char dir[] = "/tmp/zaya_eval_XXXXXX", path[64];
    REQUIRE(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/bad.jsonl", dir);
    static const struct {
        const char *text, *want;
    } cases[] = {
        {"{\"context\": \"ab\", \"choices\": [\"c\"], \"answer\": 0}\n{\"context\": \"ab\", \"choices\": [\"c\"", ":2: invalid JSON at column"},
        {"\n\n{\"context\": \"ab\", \"choices\": [\"c\", \"d\"], \"answer\": 2}\n", ":3: \"answer\" must be an integer"},
        {"{\"context\": \"ab\", \"choices\": [\"c\", \"d\"], \"answer\": 0.5}\n", ":1: \"answer\" must be an integer"},
        {"{\"context\": \"ab\", \"choices\": [], \"answer\": 0}\n", ":1: \"choices\" must be a non-empty array"},
        {"{\"context\": \"ab\", \"choices\": [\"c\", 3], \"answer\": 0}\n", ":1: choice 1 is not a string"},
        {"{\"context\": \"ab\", \"choices\": [\"c\"], \"answer\": 0}\n{\"prompt\": \"x\", \"answer\": \"y\"}\n",
         ":2: a multiple-choice line needs a \"context\""},
        {"{\"prompt\": \"x\", \"answer\": \"y\"}\n{\"prompt\": \"x\", \"answer\": 3}\n", ":2: an exact-match line needs"},
        {"{\"question\": \"x\"}\n", ":1: unknown task line"},
        {"[1, 2]\n", ":1: not a JSON object"},
        {"\n  \n", ": no examples"},
        {"{\"context\": \"ab\", \"choices\": [\"\"], \"answer\": 0}\n", ":1: choice 0 adds no tokens"},
        {"{\"context\": \"AB\", \"choices\": [\"c\"], \"answer\": 0}\n", ":1: toy tokenizer"},
    };
    for (size_t i = 0; i < ZY_ARRAY_LEN(cases); i++) {
        write_text(path, cases[i].text);
        EvalResult r;
        int rc = eval_task_file_with(&m, &toy, path, 0, &r, &err);
        CHECK_MSG(rc == -1 && strstr(err.msg, path) && strstr(err.msg, cases[i].want), "case %zu: %s", i,
                  rc ? err.msg : "no error");
    }
    unlink(path);
    EvalResult r;
    CHECK(eval_task_file_with(&m, &toy, path, 0, &r, &err) == -1); /* missing file */
    rmdir(dir);
    model_free(&m);
}

typedef struct {
    const int32_t *tok;
    uint64_t n;
} MemSource;

static int mem_read(void *ctx, uint64_t off, size_t n, int32_t *out, ZyErr *err) {
    const MemSource *s = ctx;
    if (off + n > s->n) return zy_fail(err, "read past the end");
    memcpy(out, s->tok + off, n * sizeof(int32_t));
    return 0;
}

/* Windows of seq_len+1 tokens with stride seq_len, checked against cached decoding restarted per window. */
TEST(eval_token_loss_windows) {
    ZyErr err = {{0}};
    Model m;
    REQUIRE(toy_model(&m, &err) == 0);
    const int V = m.cfg.vocab_size, S = 8, N = 2 * S + 4; /* windows of 8, 8 and 3 predictions */
    int32_t tok[20];
    ZyRng rng;
    zy_rng_seed(&rng, 4);
    for (int i = 0; i < N; i++) tok[i] = (int32_t)(zy_rng_next(&rng) % V);
    MemSource ms = {tok, N};
    EvalTokenSource src = {&ms, N, mem_read};
    KVCache c;
    REQUIRE(kvcache_create(&c, &m.cfg, 1, S, &err) == 0);
    float lg[8 * 40];
    double sum = 0, sum_first9 = 0;
    int count = 0;
    for (int off = 0; off < N - 1; off += S) {
        const int T = N - 1 - off < S ? N - 1 - off : S;
        kvcache_reset(&c);
        REQUIRE(model_decode(&m, &c, tok + off, T, lg, 0, &err) == 0);
        for (int t = 0; t < T; t++) {
            const float *l = lg + t * V;
            double mx = l[0], s = 0;
            for (int v = 1; v < V; v++) mx = fmax(mx, l[v]);
            for (int v = 0; v < V; v++) s += exp(l[v] - mx);
            const double nll = mx + log(s) - l[tok[off + t + 1]];
            sum += nll;
            if (count < 9) sum_first9 += nll;
            count++;
        }
    }
    double loss;
    uint64_t n;
    REQUIRE(eval_token_loss(&m, &src, S, 0, NULL, &loss, &n, &err) == 0);
    CHECK(n == (uint64_t)N - 1);
    CHECK_NEAR(loss, sum / count, 1e-5);
    REQUIRE(eval_token_loss(&m, &src, S, 9, NULL, &loss, &n, &err) == 0); /* max_tokens: 8 + 1 predictions */
    CHECK(n == 9);
    CHECK_NEAR(loss, sum_first9 / 9, 1e-5);
    CHECK(eval_token_loss(&m, &src, 0, 0, NULL, &loss, &n, &err) == -1);
    CHECK(eval_token_loss(&m, &src, 65, 0, NULL, &loss, &n, &err) == -1 && strstr(err.msg, "max_position_embeddings"));
    tok[11] = V;
    CHECK(eval_token_loss(&m, &src, S, 0, NULL, &loss, &n, &err) == -1 && strstr(err.msg, "offset 11"));
    kvcache_free(&c);
    model_free(&m);
}

/* Markovian RSA's pieces (src/serve/reason.h): the tail cut, subsets drawn without replacement, answer extraction,
 * the vote, the default aggregation template (and its copy in configs/), the chat problem, the shape's checks. The
 * rounds on the engine: tests/cli/test_reason.sh and tests/oracle/test_serve_rsa.py. */
#include <stdlib.h>
#include <string.h>

#include "jinja/jinja.h"
#include "serve/reason.h"
#include "test.h"

TEST(rsa_tail_cut_is_the_last_tokens) {
    CHECK(rsa_tail_start(10, 4) == 6);
    CHECK(rsa_tail_start(4, 4) == 0);
    CHECK(rsa_tail_start(3, 4) == 0);
    CHECK(rsa_tail_start(0, 1) == 0);
    CHECK(rsa_tail_start(100, 1) == 99);
}

TEST(rsa_subsets_are_distinct_seeded_and_cover_the_population) {
    enum { N = 8, K = 4, DRAWS = 400 };
    ZyRng a, b;
    zy_rng_seed(&a, 11);
    zy_rng_seed(&b, 11);
    int seen[N] = {0};
    for (int d = 0; d < DRAWS; d++) {
        int x[K], y[K];
        rsa_sample_subset(&a, N, K, x);
        rsa_sample_subset(&b, N, K, y);
        CHECK(memcmp(x, y, sizeof x) == 0); /* the same seed draws the same subsets */
        for (int i = 0; i < K; i++) {
            CHECK(x[i] >= 0 && x[i] < N);
            for (int j = 0; j < i; j++) CHECK(x[i] != x[j]); /* without replacement */
            seen[x[i]]++;
        }
    }
    /* each index is drawn with probability K/N per draw: 200 expected of 400, far from 0 or 400 */
    for (int i = 0; i < N; i++) CHECK_MSG(seen[i] > 140 && seen[i] < 260, "index %d drawn %d times", i, seen[i]);
    int all[N];
    rsa_sample_subset(&a, N, N, all); /* K = N: a permutation */
    int mask = 0;
    for (int i = 0; i < N; i++) mask |= 1 << all[i];
    CHECK(mask == (1 << N) - 1);
}

static int answer_is(const char *text, const char *want) {
    char *got = rsa_extract_answer(text);
    const int ok = want ? got && strcmp(got, want) == 0 : got == NULL;
    if (!ok) fprintf(stderr, "    extract(\"%s\") = %s, want %s\n", text, got ? got : "NULL", want ? want : "NULL");
    free(got);
    return ok;
}

TEST(rsa_answer_extraction) {
    CHECK(answer_is("so x = \\boxed{42}.", "42"));
    CHECK(answer_is("first \\boxed{1} then \\boxed{\\frac{1}{2}} done", "\\frac{1}{2}")); /* the last, braces nested */
    CHECK(answer_is("\\boxed{ 7 } and an unclosed \\boxed{8", "7"));
    CHECK(answer_is("Answer: 12\nthinking more\nanswer: 13.\nbye", "13"));          /* the last Answer line */
    CHECK(answer_is("steps\n  **Answer:** x + 1  \n", "x + 1"));
    CHECK(answer_is("Answer: 5\n\\boxed{6}", "6"));                                /* \boxed first */
    CHECK(answer_is("no answer here; the answer is 5", NULL));
    CHECK(answer_is("Answer:   \n", NULL));
    CHECK(answer_is("", NULL));
}

TEST(rsa_majority_vote) {
    char *a[] = {"3", NULL, "4", "4", "3", "4"};
    int votes = 0;
    CHECK(rsa_vote(a, 6, &votes) == 2 && votes == 3);
    char *tie[] = {NULL, "b", "a", "a", "b"}; /* 2 each: the answer seen first wins, at its first trace */
    CHECK(rsa_vote(tie, 5, &votes) == 1 && votes == 2);
    char *none[] = {NULL, NULL};
    CHECK(rsa_vote(none, 2, &votes) == -1 && votes == 0);
    char *one[] = {NULL, "x"};
    CHECK(rsa_vote(one, 2, &votes) == 1 && votes == 1);
}

TEST(rsa_default_template_renders_problem_then_candidates) {
    char *file = NULL;
    ZyErr err = {{0}};
    REQUIRE(zy_read_text_file("configs/rsa_aggregate.jinja", &file, &err) == 0);
    size_t n = strlen(file);
    if (n && file[n - 1] == '\n') file[--n] = 0; /* jinja drops one trailing newline too */
    CHECK_MSG(strcmp(file, RSA_DEFAULT_TEMPLATE) == 0, "configs/rsa_aggregate.jinja differs from the built-in one");
    free(file);
    JinjaTemplate *t = NULL;
    REQUIRE(jinja_parse(RSA_DEFAULT_TEMPLATE, strlen(RSA_DEFAULT_TEMPLATE), &t, &err) == 0);
    const char *vars = "{\"problem\": \"What is 2+2?\", \"candidates\": [\"... so 4\", \"... so 5\"], \"round\": 2}";
    char *out = NULL;
    size_t len = 0;
    REQUIRE(jinja_render_json(t, vars, strlen(vars), NULL, &out, &len, &err) == 0);
    const char *c1 = strstr(out, "--- Candidate 1 ---\n... so 4\n");
    const char *c2 = strstr(out, "--- Candidate 2 ---\n... so 5\n");
    CHECK_MSG(strncmp(out, "What is 2+2?\n\n", 14) == 0 && c1 && c2 && c1 < c2 && !strstr(out, "Candidate 3") &&
                  strstr(out, "\\boxed{ANSWER}") > c2,
              "%s", out);
    free(out);
    jinja_free(t);
}

TEST(rsa_chat_problem_and_its_replacement) {
    const char *chat = "{\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},{\"role\":\"user\",\"content\":"
                       "\"old\"},{\"role\":\"assistant\",\"content\":\"a\"},{\"role\":\"user\",\"content\":\"2+2?\"}],"
                       "\"enable_thinking\":false}";
    char *problem = NULL, *out = NULL;
    ServeError e;
    REQUIRE(rsa_chat_problem(chat, &problem, &e) == 0);
    CHECK(strcmp(problem, "2+2?") == 0);
    REQUIRE(rsa_chat_with_user_text(chat, "AGG", &out, &e) == 0);
    CHECK_MSG(strstr(out, "\"content\":\"old\"") && strstr(out, "{\"role\":\"user\",\"content\":\"AGG\"}") &&
                  !strstr(out, "2+2?") && strstr(out, "\"enable_thinking\":false"),
              "%s", out);
    free(problem);
    free(out);
    CHECK(rsa_chat_problem("{\"messages\":[{\"role\":\"system\",\"content\":\"x\"}]}", &problem, &e) == -1 &&
          e.status == 400 && strcmp(e.param, "messages") == 0);
}

TEST(rsa_shape_checks_name_the_field) {
    ServeError e;
    ServeRsa ok = {.population = 8, .subset = 4, .rounds = 3, .tail = 16};
    CHECK(rsa_shape_check(&ok, 32, "rsa.", &e) == 0);
    ServeRsa big_k = {.population = 4, .subset = 5, .rounds = 1, .tail = 1};
    CHECK(rsa_shape_check(&big_k, 32, "rsa.", &e) == -1 && e.status == 400 && strcmp(e.param, "rsa.subset") == 0);
    ServeRsa over_batch = {.population = 16, .subset = 1, .rounds = 1, .tail = 1};
    CHECK(rsa_shape_check(&over_batch, 8, "rsa.", &e) == -1 && strcmp(e.param, "rsa.population") == 0 &&
          strstr(e.message, "--max-batch"));
    ServeRsa no_rounds = {.population = 2, .subset = 1, .rounds = 0, .tail = 1};
    CHECK(rsa_shape_check(&no_rounds, 8, "--", &e) == -1 && strcmp(e.param, "--rounds") == 0);
    ServeRsa no_tail = {.population = 2, .subset = 1, .rounds = 2, .tail = 0};
    CHECK(rsa_shape_check(&no_tail, 8, "rsa.", &e) == -1 && strcmp(e.param, "rsa.tail") == 0);
}

TEST(rsa_request_extension_parses_and_refuses) {
    ServeRequest r;
    ServeError e;
    const char *msgs = "\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]";
    char body[512];
    snprintf(body, sizeof body, "{%s,\"rsa\":{\"population\":6,\"subset\":3,\"rounds\":2,\"tail\":64}}", msgs);
    REQUIRE(serve_request_parse(body, strlen(body), SERVE_CHAT, &r, &e) == 0);
    CHECK(r.rsa.population == 6 && r.rsa.subset == 3 && r.rsa.rounds == 2 && r.rsa.tail == 64);
    serve_request_free(&r);
    snprintf(body, sizeof body, "{%s,\"rsa\":{}}", msgs); /* the defaults */
    REQUIRE(serve_request_parse(body, strlen(body), SERVE_CHAT, &r, &e) == 0);
    CHECK(r.rsa.population == 8 && r.rsa.subset == 4 && r.rsa.rounds == 3 && r.rsa.tail == 1024);
    serve_request_free(&r);
    static const struct {
        const char *rsa, *param;
    } bad[] = {
        {"\"rsa\":{\"population\":4,\"subset\":5}", "rsa.subset"},
        {"\"rsa\":{\"subset\":5,\"population\":4}", "rsa.subset"},
        {"\"rsa\":{\"population\":0}", "rsa.population"},
        {"\"rsa\":{\"population\":65}", "rsa.population"},
        {"\"rsa\":{\"rounds\":0}", "rsa.rounds"},
        {"\"rsa\":{\"rounds\":2.5}", "rsa.rounds"},
        {"\"rsa\":{\"tail\":-1}", "rsa.tail"},
        {"\"rsa\":{\"tail\":\"64\"}", "rsa.tail"},
        {"\"rsa\":{\"taill\":64}", "rsa.taill"},
        {"\"rsa\":{\"tail\":4,\"tail\":5}", "rsa.tail"},
        {"\"rsa\":8", "rsa"},
        {"\"rsa\":{},\"stream\":true", "stream"},
        {"\"rsa\":{},\"n\":2", "n"},
        {"\"rsa\":{},\"logprobs\":true", "logprobs"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(body, sizeof body, "{%s,%s}", msgs, bad[i].rsa);
        CHECK_MSG(serve_request_parse(body, strlen(body), SERVE_CHAT, &r, &e) == -1 && e.status == 400 &&
                      strcmp(e.param, bad[i].param) == 0,
                  "%s: param \"%s\": %s", bad[i].rsa, e.param, e.message);
    }
    /* completions has no such field */
    const char *comp = "{\"model\":\"m\",\"prompt\":\"q\",\"rsa\":{}}";
    CHECK(serve_request_parse(comp, strlen(comp), SERVE_COMPLETION, &r, &e) == -1 && strcmp(e.param, "rsa") == 0);
}

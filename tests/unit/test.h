/* Minimal unit-test harness: TEST(name) registers itself at load time; CHECK records failures without
 * aborting the test, REQUIRE returns from it. The runner prints one line per test and a final
 * "N passed, N failed" line. */
#ifndef ZAYA_TEST_H
#define ZAYA_TEST_H

#include <math.h>
#include <stdio.h>

#include <stddef.h>

typedef void (*ZyTestFn)(int *failed);

/* Scratch directories (tests/unit/test_util.c): a fresh /tmp/zy_<tag>_XXXXXX, and recursive removal. */
int zy_test_tmpdir(char *dir, size_t cap, const char *tag);
void zy_test_rmtree(const char *dir);
void zy_test_register(const char *name, const char *file, ZyTestFn fn);

#define TEST(name)                                                                   \
    static void test_##name(int *zy_test_failed_);                                   \
    __attribute__((constructor)) static void register_##name(void) {                 \
        zy_test_register(#name, __FILE__, test_##name);                              \
    }                                                                                \
    static void test_##name(int *zy_test_failed_)

#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "    %s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            *zy_test_failed_ = 1;                                                    \
        }                                                                            \
    } while (0)

#define CHECK_MSG(cond, ...)                                                         \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "    %s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                            \
            fprintf(stderr, "\n");                                                   \
            *zy_test_failed_ = 1;                                                    \
        }                                                                            \
    } while (0)

#define REQUIRE(cond)                                                                \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "    %s:%d: REQUIRE failed: %s\n", __FILE__, __LINE__, #cond); \
            *zy_test_failed_ = 1;                                                    \
            return;                                                                  \
        }                                                                            \
    } while (0)

/* |a-b| <= tol * max(1, |b|) */
#define CHECK_NEAR(a, b, tol)                                                        \
    do {                                                                             \
        double a_ = (a), b_ = (b), t_ = (tol) * fmax(1.0, fabs(b_));                 \
        if (!(fabs(a_ - b_) <= t_)) {                                                \
            fprintf(stderr, "    %s:%d: CHECK_NEAR failed: %s = %.10g vs %s = %.10g (tol %.3g)\n", \
                    __FILE__, __LINE__, #a, a_, #b, b_, t_);                         \
            *zy_test_failed_ = 1;                                                    \
        }                                                                            \
    } while (0)

#endif

// test.h: a minimal test harness. A test binary exits 0 when every check
// passed, 1 when one failed, and 77 when it was skipped (tests/run.sh counts).
#ifndef TRIDENT_TEST_H
#define TRIDENT_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static int test_failures;
static int test_checks;

#define EXPECT(cond, ...)                                                      \
    do {                                                                       \
        test_checks++;                                                         \
        if (!(cond)) {                                                         \
            test_failures++;                                                   \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);    \
            fprintf(stderr, __VA_ARGS__);                                      \
            fputc('\n', stderr);                                               \
        }                                                                      \
    } while (0)

// Relative error ||a - b|| / ||b|| over n doubles read through get(i).
#define REL_ERR(n, A, B)                                                       \
    ({                                                                         \
        double num_ = 0, den_ = 0;                                             \
        for (size_t i_ = 0; i_ < (size_t)(n); i_++) {                          \
            double a_ = (double)(A)[i_], b_ = (double)(B)[i_];                 \
            num_ += (a_ - b_) * (a_ - b_);                                     \
            den_ += b_ * b_;                                                   \
        }                                                                      \
        den_ > 0 ? sqrt(num_ / den_) : sqrt(num_);                             \
    })

// Expect relative error of n elements of A against reference B <= tol.
#define EXPECT_REL(n, A, B, tol, what)                                         \
    do {                                                                       \
        double e_ = REL_ERR(n, A, B);                                          \
        EXPECT(e_ <= (tol), "%s: relative error %.3e > %.1e", what, e_, (double)(tol)); \
        if (getenv("TEST_VERBOSE")) printf("  %-40s rel err %.3e\n", what, e_); \
    } while (0)

static inline int test_finish(const char *name) {
    if (test_failures) {
        printf("%s: %d of %d checks failed\n", name, test_failures, test_checks);
        return 1;
    }
    printf("%s: %d checks passed\n", name, test_checks);
    return 0;
}

#define TEST_SKIP(...)                                                         \
    do {                                                                       \
        printf("skipped: " __VA_ARGS__);                                       \
        putchar('\n');                                                         \
        exit(77);                                                              \
    } while (0)

#endif

/* ctest.h: a very small unit-test harness for the C core (no Python). Each test file defines
 * `void test_<name>(void)` functions and lists them in tests/c/main.c. CHECK records a failure and goes
 * on; the runner exits non-zero if any check failed. */
#ifndef FUSER_CTEST_H
#define FUSER_CTEST_H

#include <stdio.h>
#include <string.h>

extern int ctest_failures;
extern int ctest_checks;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        ctest_checks++;                                                                            \
        if (!(cond)) {                                                                             \
            ctest_failures++;                                                                      \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);               \
        }                                                                                          \
    } while (0)

/* CHECK that a fuser_err holds `code` and its message contains `text`. */
#define CHECK_ERR(errp, want_code, text)                                                           \
    do {                                                                                           \
        ctest_checks++;                                                                            \
        if ((errp)->code != (want_code) || !strstr((errp)->msg, (text))) {                         \
            ctest_failures++;                                                                      \
            fprintf(stderr, "%s:%d: expected error %d containing \"%s\", got %d: %s\n", __FILE__,  \
                    __LINE__, (int)(want_code), (text), (errp)->code, (errp)->msg);                \
        }                                                                                          \
    } while (0)

#endif /* FUSER_CTEST_H */

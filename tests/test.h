/*
 * test.h: the tiny harness every test file uses.
 *
 * A test group is a function `void test_NAME(void)` listed in the table in
 * tests/test.c. CHECK records a pass or a failure (with file:line and the
 * failed expression, plus an optional printf-style explanation) and goes on,
 * so one run reports every failure. The runner ends with the line
 * "N passed, N failed".
 */
#ifndef KILN_TEST_H
#define KILN_TEST_H

#include <stdio.h>

extern int test_n_pass, test_n_fail;
void test_fail_at(const char *file, int line, const char *expr, const char *fmt, ...);

/* CHECK(cond) or CHECK(cond, "fmt", args...) */
#define CHECK(cond, ...)                                                       \
    do {                                                                       \
        if (cond)                                                              \
            test_n_pass++;                                                     \
        else                                                                   \
            test_fail_at(__FILE__, __LINE__, #cond, "" __VA_ARGS__);           \
    } while (0)

/* Where the fixtures live, relative to the repository root (tests run there). */
#define FIXTURES "tests/fixtures"

/* Skips the rest of a group with a note (counted neither pass nor fail). */
void test_skip(const char *why);

#endif

/* ctest.h - a tiny test harness for the C core.
 *
 *   TEST(name) { CHECK(x == 1); CHECK_OK(some_call()); }
 *   int main(void) { RUN(name); return ctest_finish(); }
 *
 * Every CHECK counts as one passed or failed check; a failure prints the
 * file, line and expression and the test carries on.  ctest_finish prints
 * "N passed, N failed" on its own line and returns non-zero on failure. */
#ifndef TP_CTEST_H
#define TP_CTEST_H

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "status.h"

static int ctest_passed, ctest_failed;

static inline void ctest_record(int ok, const char *file, int line,
                                const char *expr, const char *detail) {
  if (ok) {
    ctest_passed++;
    return;
  }
  ctest_failed++;
  fprintf(stderr, "FAIL %s:%d: %s%s%s\n", file, line, expr,
          detail ? " -- " : "", detail ? detail : "");
}

#define TEST(name) static void name(void)

#define RUN(name)                                   \
  do {                                              \
    int ctest_before = ctest_failed;                \
    fprintf(stderr, "-- %s\n", #name);              \
    name();                                         \
    if (ctest_failed != ctest_before)               \
      fprintf(stderr, "   %s FAILED\n", #name);     \
  } while (0)

#define CHECK(cond) ctest_record(!!(cond), __FILE__, __LINE__, #cond, NULL)

#define CHECK_EQ_INT(a, b)                                                  \
  do {                                                                      \
    long long ctest_a = (long long)(a), ctest_b = (long long)(b);           \
    char ctest_msg[96];                                                     \
    snprintf(ctest_msg, sizeof ctest_msg, "%lld != %lld", ctest_a, ctest_b); \
    ctest_record(ctest_a == ctest_b, __FILE__, __LINE__, #a " == " #b,      \
                 ctest_msg);                                                \
  } while (0)

#define CHECK_STR_EQ(a, b)                                                 \
  do {                                                                     \
    const char *ctest_a = (a), *ctest_b = (b);                             \
    int ctest_ok = ctest_a && ctest_b && strcmp(ctest_a, ctest_b) == 0;    \
    ctest_record(ctest_ok, __FILE__, __LINE__, #a " == " #b,               \
                 ctest_ok ? NULL : (ctest_a ? ctest_a : "(null)"));        \
  } while (0)

#define CHECK_CONTAINS(haystack, needle)                                   \
  do {                                                                     \
    const char *ctest_h = (haystack), *ctest_n = (needle);                 \
    ctest_record(ctest_h && ctest_n && strstr(ctest_h, ctest_n) != NULL,   \
                 __FILE__, __LINE__, #haystack " contains " #needle,       \
                 ctest_h ? ctest_h : "(null)");                            \
  } while (0)

/* Expect success; on failure print the status message.  Frees the status. */
#define CHECK_OK(expr)                                                     \
  do {                                                                     \
    tp_status *ctest_st = (expr);                                          \
    ctest_record(ctest_st == NULL, __FILE__, __LINE__, #expr " is OK",     \
                 ctest_st ? tp_status_message(ctest_st) : NULL);           \
    tp_status_free(ctest_st);                                              \
  } while (0)

/* Expect an error with `code` and a non-empty message.  Frees the status. */
#define CHECK_ERR(expr, code)                                              \
  do {                                                                     \
    tp_status *ctest_st = (expr);                                          \
    char ctest_msg[160];                                                   \
    snprintf(ctest_msg, sizeof ctest_msg, "got code %d: %s",               \
             (int)tp_status_code(ctest_st), tp_status_message(ctest_st));  \
    ctest_record(ctest_st != NULL && tp_status_code(ctest_st) == (code) && \
                     tp_status_message(ctest_st)[0] != '\0',               \
                 __FILE__, __LINE__, #expr " fails with " #code,           \
                 ctest_msg);                                               \
    tp_status_free(ctest_st);                                              \
  } while (0)

static inline int ctest_finish(void) {
  printf("%d passed, %d failed\n", ctest_passed, ctest_failed);
  fflush(stdout);
  return ctest_failed ? 1 : 0;
}

#endif

/* status.c - heap-allocated error values (see status.h).
 *
 * A status is one malloc'd block: the struct followed by its message.  When
 * that allocation itself fails we hand out a static out-of-memory status,
 * which tp_status_free recognises and leaves alone. */
#include "status.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct tp_status {
  tp_code code;
  const char *message; /* points just past the struct, or to a literal */
};

static tp_status oom_status = {TP_RESOURCE_EXHAUSTED,
                               "out of host memory while reporting an error"};

/* A new status with `code` and a copy of `prefix` + `rest` (either may be
 * NULL).  Returns NULL only when out of memory. */
static tp_status *status_new(tp_code code, const char *prefix,
                             const char *rest) {
  size_t plen = prefix ? strlen(prefix) : 0;
  size_t rlen = rest ? strlen(rest) : 0;
  tp_status *st = malloc(sizeof(tp_status) + plen + rlen + 1);
  if (!st) return NULL;
  char *msg = (char *)(st + 1);
  if (plen) memcpy(msg, prefix, plen);
  if (rlen) memcpy(msg + plen, rest, rlen);
  msg[plen + rlen] = '\0';
  st->code = code;
  st->message = msg;
  return st;
}

/* vsnprintf into a fresh malloc'd string; NULL when out of memory. */
static char *format_message(const char *fmt, va_list ap) {
  va_list ap2;
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap2);
  va_end(ap2);
  if (n < 0) n = 0;
  char *s = malloc((size_t)n + 1);
  if (!s) return NULL;
  vsnprintf(s, (size_t)n + 1, fmt, ap);
  return s;
}

tp_status *tp_error(tp_code code, const char *fmt, ...) {
  if (code == TP_OK) code = TP_INTERNAL; /* an error is never OK */
  va_list ap;
  va_start(ap, fmt);
  char *msg = format_message(fmt, ap);
  va_end(ap);
  if (!msg) return &oom_status;
  tp_status *st = status_new(code, NULL, msg);
  free(msg);
  return st ? st : &oom_status;
}

tp_status *tp_error_wrap(tp_status *st, const char *fmt, ...) {
  if (!st) return NULL; /* wrapping success is success */
  va_list ap;
  va_start(ap, fmt);
  char *ctx = format_message(fmt, ap);
  va_end(ap);
  if (!ctx) return st; /* keep the original error rather than lose it */
  size_t clen = strlen(ctx);
  char *prefix = malloc(clen + 3);
  tp_status *wrapped = NULL;
  if (prefix) {
    memcpy(prefix, ctx, clen);
    memcpy(prefix + clen, ": ", 3);
    wrapped = status_new(st->code, prefix, st->message);
    free(prefix);
  }
  free(ctx);
  if (!wrapped) return st;
  tp_status_free(st);
  return wrapped;
}

tp_code tp_status_code(const tp_status *st) { return st ? st->code : TP_OK; }

const char *tp_status_message(const tp_status *st) {
  return st ? st->message : "OK";
}

void tp_status_free(tp_status *st) {
  if (st && st != &oom_status) free(st);
}

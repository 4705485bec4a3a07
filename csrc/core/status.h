/* status.h - explicit error values for the torch-pjrt C core.
 *
 * A function that can fail returns `tp_status *`: NULL means success, anything
 * else is an owned error object the caller must free with tp_status_free (or
 * pass upward).  Nothing in the core aborts the process on bad input.
 */
#ifndef TP_STATUS_H
#define TP_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tp_code {
  TP_OK = 0,
  TP_INVALID_ARGUMENT = 1, /* bad shape, dtype, index: maps to ValueError/RuntimeError */
  TP_NOT_FOUND = 2,        /* missing plugin file or symbol */
  TP_UNIMPLEMENTED = 3,    /* no lowering for an op: maps to NotImplementedError */
  TP_INTERNAL = 4,         /* plugin or compiler failure */
  TP_RESOURCE_EXHAUSTED = 5,
  TP_FAILED_PRECONDITION = 6, /* e.g. incompatible plugin API version */
  TP_OUT_OF_RANGE = 7,        /* index out of range: maps to IndexError */
} tp_code;

typedef struct tp_status tp_status;

/* printf-style constructor; never returns NULL (falls back to a static
 * out-of-memory status that tp_status_free ignores). */
tp_status *tp_error(tp_code code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Prefix more context to an existing status ("while compiling add: ...").
 * Consumes `st`, returns the new status. */
tp_status *tp_error_wrap(tp_status *st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

tp_code tp_status_code(const tp_status *st);
const char *tp_status_message(const tp_status *st);
void tp_status_free(tp_status *st);

#define TP_RETURN_IF_ERROR(expr)        \
  do {                                  \
    tp_status *tp__st = (expr);         \
    if (tp__st) return tp__st;          \
  } while (0)

#ifdef __cplusplus
}
#endif
#endif

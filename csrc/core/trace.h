/* trace.h - device events for a profiler.
 *
 * While a profiler session records (tp_trace_start .. tp_trace_stop), the
 * runtime notes every program execution, host<->device copy, compile and
 * disk-cache load as an event: what ran, on which device, when, how many
 * bytes, and the correlation id of the host op that launched it (the id the
 * profiler pushed on the launching thread, tp_trace_push_correlation).
 * When no session records, the cost is one relaxed atomic load per
 * execution or copy.
 *
 * Device time.  PJRT runs programs asynchronously; an execution's end is
 * when its completion event fires.  Programs on one device run in launch
 * order, so tp_trace_take places each device event on its device's
 * timeline: it starts at its launch or at the previous event's end,
 * whichever is later.  Device events on one device therefore never overlap.
 *
 * Clock: CLOCK_REALTIME nanoseconds, the clock PyTorch's profiler uses. */
#ifndef TP_TRACE_H
#define TP_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  TP_TRACE_EXECUTE = 0, /* a program ran on the device */
  TP_TRACE_H2D,         /* host -> device copy */
  TP_TRACE_D2H,         /* device -> host copy */
  TP_TRACE_D2D,         /* device -> device copy */
  TP_TRACE_COMPILE,     /* host: XLA compiled a program */
  TP_TRACE_CACHE_LOAD,  /* host: a program was loaded from the disk cache */
} tp_trace_kind;

/* Whether the kind happens on the device timeline (else on the host). */
int tp_trace_kind_on_device(tp_trace_kind k);

typedef struct {
  tp_trace_kind kind;
  int device;
  int64_t start_ns, end_ns;
  /* Device events: the host call that launched it (an asynchronous launch
   * returns before the device finishes; a copy's call is the copy). */
  int64_t launch_start_ns, launch_end_ns;
  int64_t bytes;        /* copies: bytes moved; executions: output bytes */
  uint64_t correlation; /* the launching host op's id; 0 if none */
  uint64_t thread;      /* the launching host thread (its kernel tid) */
  char name[96];
} tp_trace_event;

/* Start a session: forget earlier events and record new ones.  A second
 * start while one records is refused. */
tp_status *tp_trace_start(void);
/* Stop recording; events stay until tp_trace_take or the next start. */
void tp_trace_stop(void);
int tp_trace_on(void);

/* The calling thread's current host op (a stack: ops nest). */
void tp_trace_push_correlation(uint64_t id);
void tp_trace_pop_correlation(void);

/* Recording, for the runtime: an event begins now (NULL when no session
 * records or the buffer is full) and ends at tp_trace_end, which may be
 * called from any thread (a completion callback). */
typedef struct tp_trace_rec tp_trace_rec;
tp_trace_rec *tp_trace_begin(tp_trace_kind kind, int device, const char *name, int64_t bytes);
void tp_trace_end(tp_trace_rec *r);
/* The launching call returned (for events that end later, asynchronously);
 * an event without it was launched until it ended. */
void tp_trace_launched(tp_trace_rec *r);
/* Run `release(arg)` once the record is freed, which is after it ended
 * (e.g. to destroy the completion event that ends it). */
void tp_trace_attach(tp_trace_rec *r, void (*release)(void *), void *arg);

/* The recorded events, in begin order, device events placed on their
 * device's timeline.  Waits (up to `wait_ms`) for executions still
 * running; one that has not finished by then ends when the wait did.
 * `*dropped` counts events not recorded because the buffer was full.
 * The caller frees `*out`.  Afterwards the buffer is empty. */
tp_status *tp_trace_take(int wait_ms, tp_trace_event **out, size_t *n, size_t *dropped);

/* Most events one session keeps (later ones are counted as dropped). */
#define TP_TRACE_MAX_EVENTS (1u << 20)

#ifdef __cplusplus
}
#endif

#endif

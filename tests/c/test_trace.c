/* test_trace.c - the profiler's event buffer (csrc/core/trace.h): recording
 * on and off, correlation stacks per thread, the device timeline, ends
 * stamped from other threads and after a take, and release callbacks. */
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "ctest.h"
#include "trace.h"

static void sleep_us(long us) {
  struct timespec t = {us / 1000000, (us % 1000000) * 1000};
  nanosleep(&t, NULL);
}

static tp_trace_event *take(size_t *n, int wait_ms) {
  tp_trace_event *ev = NULL;
  size_t dropped = 99;
  CHECK_OK(tp_trace_take(wait_ms, &ev, n, &dropped));
  CHECK_EQ_INT(dropped, 0);
  return ev;
}

TEST(test_off_records_nothing) {
  CHECK(!tp_trace_on());
  CHECK(tp_trace_begin(TP_TRACE_EXECUTE, 0, "x", 0) == NULL);
  tp_trace_end(NULL); /* a no-op */
  size_t n = 7;
  tp_trace_event *ev = take(&n, 0);
  CHECK_EQ_INT(n, 0);
  free(ev);
}

TEST(test_events_in_order_with_correlation) {
  CHECK_OK(tp_trace_start());
  CHECK(tp_trace_on());
  CHECK_ERR(tp_trace_start(), TP_FAILED_PRECONDITION);
  tp_trace_rec *a = tp_trace_begin(TP_TRACE_COMPILE, 0, "aten::add", 10); /* no op on the stack */
  tp_trace_end(a);
  tp_trace_push_correlation(5);
  tp_trace_push_correlation(9); /* nested: the inner op launches */
  tp_trace_rec *b = tp_trace_begin(TP_TRACE_EXECUTE, 1, "aten::mm", 64);
  tp_trace_end(b);
  tp_trace_pop_correlation();
  tp_trace_rec *c = tp_trace_begin(TP_TRACE_D2H, 1, "copy", 32);
  tp_trace_end(c);
  tp_trace_pop_correlation();
  tp_trace_pop_correlation(); /* one pop too many is harmless */
  tp_trace_stop();
  CHECK(!tp_trace_on());
  CHECK(tp_trace_begin(TP_TRACE_EXECUTE, 0, "late", 0) == NULL);
  size_t n = 0;
  tp_trace_event *ev = take(&n, 0);
  CHECK_EQ_INT(n, 3);
  if (n == 3) {
    CHECK_EQ_INT(ev[0].kind, TP_TRACE_COMPILE);
    CHECK_EQ_INT(ev[0].correlation, 0);
    CHECK_STR_EQ(ev[0].name, "aten::add");
    CHECK_EQ_INT(ev[0].bytes, 10);
    CHECK_EQ_INT(ev[1].correlation, 9);
    CHECK_EQ_INT(ev[1].device, 1);
    CHECK_EQ_INT(ev[2].correlation, 5);
    for (size_t i = 0; i < n; i++) CHECK(ev[i].end_ns > ev[i].start_ns && ev[i].thread != 0);
  }
  free(ev);
}

/* Device events on one device do not overlap: a later launch starts when
 * the earlier one ended.  Host events and other devices are not moved. */
TEST(test_device_timeline) {
  CHECK_OK(tp_trace_start());
  tp_trace_rec *a = tp_trace_begin(TP_TRACE_EXECUTE, 0, "long", 0);
  tp_trace_rec *b = tp_trace_begin(TP_TRACE_EXECUTE, 0, "queued", 0);
  tp_trace_rec *h = tp_trace_begin(TP_TRACE_COMPILE, 0, "host", 0);
  tp_trace_rec *o = tp_trace_begin(TP_TRACE_EXECUTE, 1, "other device", 0);
  sleep_us(2000);
  tp_trace_end(a);
  tp_trace_end(h);
  tp_trace_end(o);
  sleep_us(500);
  tp_trace_end(b);
  tp_trace_stop();
  size_t n = 0;
  tp_trace_event *ev = take(&n, 0);
  CHECK_EQ_INT(n, 4);
  if (n == 4) {
    CHECK(ev[1].start_ns == ev[0].end_ns);
    CHECK(ev[1].end_ns > ev[1].start_ns);
    CHECK(ev[2].start_ns < ev[0].end_ns); /* host event keeps its start */
    CHECK(ev[3].start_ns < ev[0].end_ns); /* device 1 has its own timeline */
  }
  free(ev);
}

static void *end_later(void *arg) {
  sleep_us(3000);
  tp_trace_end(arg);
  return NULL;
}

static int g_released;
static void count_release(void *arg) { g_released += *(int *)arg; }

/* An execution ends on another thread (its completion callback); take
 * waits for it.  One still running when the wait runs out ends at the
 * take, and its record lives on until it really ends. */
TEST(test_end_from_other_thread_and_after_take) {
  static int one = 1;
  g_released = 0;
  CHECK_OK(tp_trace_start());
  tp_trace_rec *a = tp_trace_begin(TP_TRACE_EXECUTE, 0, "async", 0);
  tp_trace_attach(a, count_release, &one);
  pthread_t t;
  CHECK(pthread_create(&t, NULL, end_later, a) == 0);
  tp_trace_stop();
  size_t n = 0;
  tp_trace_event *ev = take(&n, 1000);
  CHECK_EQ_INT(n, 1);
  if (n == 1) CHECK(ev[0].end_ns - ev[0].start_ns >= 2000000);
  free(ev);
  pthread_join(t, NULL);
  CHECK_EQ_INT(g_released, 1);

  /* Not waited for: ends at the take; the late end writes into a retired
   * record (ASan would flag a freed one), released at the next start. */
  g_released = 0;
  CHECK_OK(tp_trace_start());
  tp_trace_rec *b = tp_trace_begin(TP_TRACE_EXECUTE, 0, "still running", 0);
  tp_trace_attach(b, count_release, &one);
  tp_trace_stop();
  ev = take(&n, 0);
  CHECK_EQ_INT(n, 1);
  if (n == 1) CHECK(ev[0].end_ns > ev[0].start_ns);
  free(ev);
  CHECK_EQ_INT(g_released, 0);
  tp_trace_end(b);
  CHECK_OK(tp_trace_start());
  CHECK_EQ_INT(g_released, 1);
  tp_trace_stop();
  ev = take(&n, 0);
  CHECK_EQ_INT(n, 0);
  free(ev);
}

static void *launch_on_thread(void *arg) {
  (void)arg;
  tp_trace_push_correlation(77);
  tp_trace_end(tp_trace_begin(TP_TRACE_EXECUTE, 0, "thread", 0));
  tp_trace_pop_correlation();
  return NULL;
}

/* The correlation stack is the launching thread's own. */
TEST(test_correlation_per_thread) {
  CHECK_OK(tp_trace_start());
  tp_trace_push_correlation(3);
  pthread_t t;
  CHECK(pthread_create(&t, NULL, launch_on_thread, NULL) == 0);
  pthread_join(t, NULL);
  tp_trace_end(tp_trace_begin(TP_TRACE_EXECUTE, 0, "main", 0));
  tp_trace_pop_correlation();
  tp_trace_stop();
  size_t n = 0;
  tp_trace_event *ev = take(&n, 0);
  CHECK_EQ_INT(n, 2);
  if (n == 2) {
    CHECK_EQ_INT(ev[0].correlation, 77);
    CHECK_EQ_INT(ev[1].correlation, 3);
    CHECK(ev[0].thread != ev[1].thread);
  }
  free(ev);
}

int main(void) {
  RUN(test_off_records_nothing);
  RUN(test_events_in_order_with_correlation);
  RUN(test_device_timeline);
  RUN(test_end_from_other_thread_and_after_take);
  RUN(test_correlation_per_thread);
  return ctest_finish();
}

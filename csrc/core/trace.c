/* trace.c - device events for a profiler (see trace.h). */
#include "trace.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

struct tp_trace_rec {
  tp_trace_event ev;
  _Atomic int64_t end;      /* 0 until tp_trace_end */
  _Atomic int64_t launched; /* 0 until tp_trace_launched */
  void (*release)(void *);
  void *arg;
};

#define BLOCK 4096
typedef struct block {
  struct block *next;
  size_t used;
  tp_trace_rec recs[BLOCK];
} block;

/* Everything below is guarded by g_lock, except g_on (read without it on
 * the hot path) and the recs' `end` (written by completion callbacks). */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int g_on;
static block *g_head, *g_tail;
static size_t g_count, g_dropped;
/* Blocks of an earlier session with an execution still running when it was
 * taken: its callback will write into them, so they are freed only once
 * every one of their events has ended. */
static block *g_retired;

/* The calling thread's host-op stack. */
#define CORR_DEPTH 64
static _Thread_local uint64_t t_corr[CORR_DEPTH];
static _Thread_local int t_depth;

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int tp_trace_kind_on_device(tp_trace_kind k) {
  return k == TP_TRACE_EXECUTE || k == TP_TRACE_H2D || k == TP_TRACE_D2H || k == TP_TRACE_D2D;
}

static int all_ended(const block *b) {
  for (; b; b = b->next)
    for (size_t i = 0; i < b->used; i++)
      if (atomic_load(&b->recs[i].end) == 0) return 0;
  return 1;
}

static void free_blocks(block *b) {
  while (b) {
    block *n = b->next;
    for (size_t i = 0; i < b->used; i++)
      if (b->recs[i].release) b->recs[i].release(b->recs[i].arg);
    free(b);
    b = n;
  }
}

/* Free the retired blocks whose events have all ended (g_lock held). */
static void sweep_retired(void) {
  if (g_retired && all_ended(g_retired)) {
    free_blocks(g_retired);
    g_retired = NULL;
  }
}

/* Hand the current blocks to the caller or retire them (g_lock held). */
static block *detach(void) {
  block *b = g_head;
  g_head = g_tail = NULL;
  g_count = 0;
  return b;
}

static void retire(block *b) {
  if (!b) return;
  if (all_ended(b)) {
    free_blocks(b);
    return;
  }
  block *t = b;
  while (t->next) t = t->next;
  t->next = g_retired;
  g_retired = b;
}

tp_status *tp_trace_start(void) {
  pthread_mutex_lock(&g_lock);
  if (atomic_load(&g_on)) {
    pthread_mutex_unlock(&g_lock);
    return tp_error(TP_FAILED_PRECONDITION, "a device trace is already recording");
  }
  retire(detach());
  sweep_retired();
  g_dropped = 0;
  atomic_store(&g_on, 1);
  pthread_mutex_unlock(&g_lock);
  return NULL;
}

void tp_trace_stop(void) { atomic_store(&g_on, 0); }

int tp_trace_on(void) { return atomic_load_explicit(&g_on, memory_order_relaxed); }

void tp_trace_push_correlation(uint64_t id) {
  if (t_depth < CORR_DEPTH) t_corr[t_depth] = id;
  t_depth++;
}

void tp_trace_pop_correlation(void) {
  if (t_depth > 0) t_depth--;
}

tp_trace_rec *tp_trace_begin(tp_trace_kind kind, int device, const char *name, int64_t bytes) {
  if (!atomic_load_explicit(&g_on, memory_order_relaxed)) return NULL;
  pthread_mutex_lock(&g_lock);
  tp_trace_rec *r = NULL;
  if (!atomic_load(&g_on)) goto done;
  if (g_count >= TP_TRACE_MAX_EVENTS) {
    g_dropped++;
    goto done;
  }
  if (!g_tail || g_tail->used == BLOCK) {
    block *b = malloc(sizeof *b);
    if (!b) {
      g_dropped++;
      goto done;
    }
    b->next = NULL;
    b->used = 0;
    if (g_tail) g_tail->next = b;
    else g_head = b;
    g_tail = b;
  }
  r = &g_tail->recs[g_tail->used++];
  g_count++;
  memset(&r->ev, 0, sizeof r->ev);
  r->ev.kind = kind;
  r->ev.device = device;
  r->ev.bytes = bytes;
  int d = t_depth < CORR_DEPTH ? t_depth : CORR_DEPTH;
  r->ev.correlation = d > 0 ? t_corr[d - 1] : 0;
  r->ev.thread = (uint64_t)syscall(SYS_gettid);
  snprintf(r->ev.name, sizeof r->ev.name, "%s", name ? name : "");
  atomic_store(&r->end, 0);
  atomic_store(&r->launched, 0);
  r->release = NULL;
  r->arg = NULL;
  r->ev.start_ns = now_ns();
done:
  pthread_mutex_unlock(&g_lock);
  return r;
}

void tp_trace_end(tp_trace_rec *r) {
  if (!r) return;
  int64_t t = now_ns();
  if (t <= r->ev.start_ns) t = r->ev.start_ns + 1;
  atomic_store(&r->end, t);
}

void tp_trace_launched(tp_trace_rec *r) {
  if (r) atomic_store(&r->launched, now_ns());
}

void tp_trace_attach(tp_trace_rec *r, void (*release)(void *), void *arg) {
  if (!r) return;
  r->release = release;
  r->arg = arg;
}

#define MAX_TIMELINES 64

tp_status *tp_trace_take(int wait_ms, tp_trace_event **out, size_t *n, size_t *dropped) {
  if (!out || !n) return tp_error(TP_INVALID_ARGUMENT, "tp_trace_take: NULL argument");
  *out = NULL;
  *n = 0;
  pthread_mutex_lock(&g_lock);
  block *b = detach();
  if (dropped) *dropped = g_dropped;
  g_dropped = 0;
  pthread_mutex_unlock(&g_lock);

  /* Executions still running end by themselves; wait for them. */
  for (int waited = 0; !all_ended(b) && waited < wait_ms; waited++) {
    struct timespec ms = {0, 1000000};
    nanosleep(&ms, NULL);
  }
  size_t count = 0;
  for (block *x = b; x; x = x->next) count += x->used;
  tp_trace_event *ev = malloc(sizeof *ev * (count ? count : 1));
  if (!ev) {
    pthread_mutex_lock(&g_lock);
    retire(b);
    pthread_mutex_unlock(&g_lock);
    return tp_error(TP_RESOURCE_EXHAUSTED, "out of host memory taking %zu trace events", count);
  }
  int64_t cut = now_ns();
  int64_t last_end[MAX_TIMELINES] = {0};
  size_t k = 0;
  for (block *x = b; x; x = x->next)
    for (size_t i = 0; i < x->used; i++) {
      tp_trace_event e = x->recs[i].ev;
      int64_t end = atomic_load(&x->recs[i].end);
      e.end_ns = end ? end : cut;
      int64_t launched = atomic_load(&x->recs[i].launched);
      e.launch_start_ns = e.start_ns;
      e.launch_end_ns = launched ? launched : e.end_ns;
      if (e.launch_end_ns <= e.launch_start_ns) e.launch_end_ns = e.launch_start_ns + 1;
      if (tp_trace_kind_on_device(e.kind) && e.device >= 0 && e.device < MAX_TIMELINES) {
        int64_t *le = &last_end[e.device];
        if (e.start_ns < *le) e.start_ns = *le;
        if (e.end_ns <= e.start_ns) e.end_ns = e.start_ns + 1;
        *le = e.end_ns;
      }
      ev[k++] = e;
    }
  pthread_mutex_lock(&g_lock);
  retire(b);
  sweep_retired();
  pthread_mutex_unlock(&g_lock);
  *out = ev;
  *n = k;
  return NULL;
}

/* storage.c - tp_storage: the device memory behind one PyTorch storage. */
#include "storage.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

struct tp_storage {
  struct tp_storage *prev, *next; /* live list, for tp_storage_await_all */
  int device;
  size_t nbytes;
  tp_buffer *buf; /* flat rank-1 buffer covering nbytes, or NULL (zeros) */
  void *host;     /* tp_storage_set_host_copy's bytes of buf, or NULL */
  tp_dtype host_dt;
};

/* Recursive: the engine holds it across a whole op, during which a storage
 * may also be freed (e.g. a temporary). */
static pthread_mutex_t g_lock;
static tp_storage *g_live; /* guarded by g_lock */
static pthread_once_t g_lock_once = PTHREAD_ONCE_INIT;

static void init_lock(void) {
  pthread_mutexattr_t a;
  pthread_mutexattr_init(&a);
  pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
  pthread_mutex_init(&g_lock, &a);
  pthread_mutexattr_destroy(&a);
}

void tp_storage_lock(void) {
  pthread_once(&g_lock_once, init_lock);
  pthread_mutex_lock(&g_lock);
}

void tp_storage_unlock(void) { pthread_mutex_unlock(&g_lock); }

tp_storage *tp_storage_new(int device, size_t nbytes) {
  tp_storage *s = calloc(1, sizeof(*s));
  if (!s) return NULL;
  s->device = device;
  s->nbytes = nbytes;
  tp_storage_lock();
  s->next = g_live;
  if (g_live) g_live->prev = s;
  g_live = s;
  tp_storage_unlock();
  return s;
}

void tp_storage_free(tp_storage *s) {
  if (!s) return;
  tp_storage_lock();
  tp_buffer_free(s->buf);
  s->buf = NULL;
  free(s->host);
  if (s->prev) s->prev->next = s->next;
  else g_live = s->next;
  if (s->next) s->next->prev = s->prev;
  tp_storage_unlock();
  free(s);
}

int tp_storage_device(const tp_storage *s) { return s->device; }
size_t tp_storage_nbytes(const tp_storage *s) { return s->nbytes; }
tp_buffer *tp_storage_buffer(const tp_storage *s) { return s->buf; }

void tp_storage_set_buffer(tp_storage *s, tp_buffer *b) {
  tp_storage_lock();
  if (s->buf != b) tp_buffer_free(s->buf);
  s->buf = b;
  free(s->host); /* whatever wrote b, the host's copy is not b's */
  s->host = NULL;
  tp_storage_unlock();
}

void tp_storage_set_host_copy(tp_storage *s, tp_dtype dt, const void *host) {
  tp_storage_lock();
  free(s->host);
  s->host = s->buf ? malloc(s->nbytes ? s->nbytes : 1) : NULL;
  if (s->host) memcpy(s->host, host, s->nbytes);
  s->host_dt = dt;
  tp_storage_unlock();
}

const void *tp_storage_host_copy(const tp_storage *s, tp_dtype *dt) {
  *dt = s->host_dt;
  return s->host;
}

/* Resizing is rare (out= arguments of the wrong size, resize_), so it goes
 * through the host: read the old bytes, keep the prefix, upload as uint8. */
tp_status *tp_storage_resize(tp_storage *s, size_t nbytes) {
  tp_status *st = NULL;
  tp_storage_lock();
  if (nbytes == s->nbytes) goto done;
  if (!s->buf) {
    s->nbytes = nbytes;
    goto done;
  }
  tp_plugin *p = tp_runtime_plugin();
  if (!p) {
    st = tp_error(TP_FAILED_PRECONDITION, "tpu runtime is not initialised");
    goto done;
  }
  size_t old = tp_buffer_nbytes(s->buf);
  unsigned char *host = calloc(1, (nbytes > old ? nbytes : old) + 1);
  if (!host) {
    st = tp_error(TP_RESOURCE_EXHAUSTED, "out of host memory resizing a storage to %zu bytes", nbytes);
    goto done;
  }
  st = tp_buffer_to_host(s->buf, host, old);
  if (!st) {
    if (nbytes > old) memset(host + old, 0, nbytes - old);
    int64_t dims[1] = {(int64_t)nbytes};
    tp_buffer *nb = NULL;
    st = tp_buffer_from_host(p, s->device, TP_U8, dims, 1, host, &nb);
    if (!st) {
      tp_buffer_free(s->buf);
      s->buf = nb;
      s->nbytes = nbytes;
      free(s->host);
      s->host = NULL;
    }
  }
  free(host);
done:
  tp_storage_unlock();
  return st;
}

tp_status *tp_storage_await_all(int device) {
  tp_status *st = NULL;
  tp_storage_lock();
  for (tp_storage *s = g_live; s && !st; s = s->next)
    if (s->buf && (device < 0 || s->device == device)) st = tp_buffer_await(s->buf);
  tp_storage_unlock();
  return st;
}

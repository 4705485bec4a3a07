/* runtime.c - the process-wide plugin and per-device state. */
#include "runtime.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static tp_plugin *g_plugin;     /* guarded by g_mu; never reset once set */
static int g_ndev;
static uint64_t *g_seed;        /* [g_ndev] */
static uint64_t *g_offset;      /* [g_ndev] */
static int64_t *g_capacity;     /* [g_ndev] bytes */

#define TP_DEFAULT_SEED 67280421310721ull /* PyTorch's default_rng_seed_val */

/* The XLA CPU plugin's buffers are host memory from malloc.  glibc serves
 * an allocation above its mmap threshold (128 KiB at first) with fresh
 * pages, and returns the top of the heap to the system once more than its
 * trim threshold is free there; an eager op on a tensor of a megabyte then
 * pays page faults for each output (a 262144-float negate: 180-260 us,
 * with these settings 86-91 us).  So with the CPU plugin, allocations up to
 * 32 MiB come from the heap, and up to 256 MiB of freed heap is kept for
 * reuse, as PyTorch's CUDA allocator keeps freed blocks;
 * torch.tpu.empty_cache() returns it (tp_runtime_release_host_memory).
 * Not when the user set glibc's own malloc variables, nor with
 * TORCH_PJRT_HOST_MALLOC=default. */
static void tune_host_malloc(const tp_plugin *p) {
#ifdef __GLIBC__
  const char *mode = getenv("TORCH_PJRT_HOST_MALLOC");
  if ((mode && strcmp(mode, "default") == 0) || !tp_plugin_is_cpu(p)) return;
  if (getenv("MALLOC_MMAP_THRESHOLD_") || getenv("MALLOC_TRIM_THRESHOLD_") || getenv("GLIBC_TUNABLES")) return;
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
#else
  (void)p;
#endif
}

void tp_runtime_release_host_memory(void) {
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

tp_status *tp_runtime_init(const tp_runtime_config *cfg) {
  tp_status *st = NULL;
  pthread_mutex_lock(&g_mu);
  if (g_plugin) goto done;
  if (!cfg || !cfg->plugin_path || !cfg->plugin_path[0]) {
    st = tp_error(TP_INVALID_ARGUMENT, "no PJRT plugin path given");
    goto done;
  }
  tp_plugin_options o = {.cpu_device_count = cfg->cpu_device_count > 0 ? cfg->cpu_device_count : 1,
                         .asynchronous = 1};
  tp_plugin *p = NULL;
  st = tp_plugin_load(cfg->plugin_path, &o, &p);
  if (st) goto done;
  int n = tp_plugin_device_count(p);
  uint64_t *seed = calloc(n > 0 ? n : 1, sizeof(uint64_t));
  uint64_t *off = calloc(n > 0 ? n : 1, sizeof(uint64_t));
  int64_t *cap = calloc(n > 0 ? n : 1, sizeof(int64_t));
  if (!seed || !off || !cap) {
    free(seed);
    free(off);
    free(cap);
    tp_plugin_destroy(p);
    st = tp_error(TP_RESOURCE_EXHAUSTED, "out of host memory");
    goto done;
  }
  /* Plugins that do not report device memory (the XLA CPU plugin) hold
   * buffers in host memory. */
  int64_t host = (int64_t)sysconf(_SC_PHYS_PAGES) * (int64_t)sysconf(_SC_PAGE_SIZE);
  for (int i = 0; i < n; i++) {
    seed[i] = TP_DEFAULT_SEED;
    int64_t total = 0, fr = 0;
    tp_status *ms = tp_plugin_device_memory(p, i, &total, &fr);
    if (ms) {
      tp_status_free(ms);
      total = host > 0 ? host : 0;
    }
    cap[i] = total;
  }
  g_capacity = cap;
  g_seed = seed;
  g_offset = off;
  g_ndev = n;
  g_plugin = p;
  tune_host_malloc(p);
done:
  pthread_mutex_unlock(&g_mu);
  return st;
}

int64_t tp_runtime_device_capacity(int device) {
  pthread_mutex_lock(&g_mu);
  int64_t c = (device >= 0 && device < g_ndev) ? g_capacity[device] : 0;
  pthread_mutex_unlock(&g_mu);
  return c;
}

tp_plugin *tp_runtime_plugin(void) {
  pthread_mutex_lock(&g_mu);
  tp_plugin *p = g_plugin;
  pthread_mutex_unlock(&g_mu);
  return p;
}

int tp_runtime_device_count(void) {
  pthread_mutex_lock(&g_mu);
  int n = g_ndev;
  pthread_mutex_unlock(&g_mu);
  return n;
}

void tp_runtime_manual_seed(int device, uint64_t seed) {
  pthread_mutex_lock(&g_mu);
  if (device >= 0 && device < g_ndev) {
    g_seed[device] = seed;
    g_offset[device] = 0;
  }
  pthread_mutex_unlock(&g_mu);
}

uint64_t tp_runtime_initial_seed(int device) {
  pthread_mutex_lock(&g_mu);
  uint64_t s = (device >= 0 && device < g_ndev) ? g_seed[device] : TP_DEFAULT_SEED;
  pthread_mutex_unlock(&g_mu);
  return s;
}

void tp_runtime_rng_advance(int device, uint64_t n, uint64_t *seed, uint64_t *offset) {
  pthread_mutex_lock(&g_mu);
  if (device >= 0 && device < g_ndev) {
    *seed = g_seed[device];
    *offset = g_offset[device];
    g_offset[device] += n;
  } else {
    *seed = TP_DEFAULT_SEED;
    *offset = 0;
  }
  pthread_mutex_unlock(&g_mu);
}

/* eager.c - one-op programs: build, cache, execute (see eager.h). */
#include "eager.h"
#include "trace.h"

#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "diskcache.h"
#include "runtime.h"

/* ---- small growable byte buffer for cache keys --------------------------- */

typedef struct kbuf {
  unsigned char *p;
  size_t len, cap;
  int oom;
  unsigned char inline_buf[1024];
} kbuf;

static void kb_init(kbuf *k) {
  k->p = k->inline_buf;
  k->len = 0;
  k->cap = sizeof k->inline_buf;
  k->oom = 0;
}

static void kb_free(kbuf *k) {
  if (k->p != k->inline_buf) free(k->p);
}

static void kb_put(kbuf *k, const void *d, size_t n) {
  if (k->oom) return;
  if (k->len + n > k->cap) {
    size_t nc = k->cap * 2;
    while (nc < k->len + n) nc *= 2;
    unsigned char *np = malloc(nc);
    if (!np) {
      k->oom = 1;
      return;
    }
    memcpy(np, k->p, k->len);
    if (k->p != k->inline_buf) free(k->p);
    k->p = np;
    k->cap = nc;
  }
  memcpy(k->p + k->len, d, n);
  k->len += n;
}

static void kb_i64(kbuf *k, int64_t v) { kb_put(k, &v, sizeof v); }

/* FNV-1a over 8-byte words (keys are mostly int64 fields), then the tail
 * bytes: a compiled graph's key covers hundreds of tensors, and a byte at a
 * time cost a fifth of its call.  Collisions only cost a memcmp. */
static uint64_t hash_bytes(const unsigned char *p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    memcpy(&w, p + i, 8);
    h ^= w ^ (w >> 29);
    h *= 1099511628211ull;
  }
  for (; i < n; i++) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  /* A multiply carries no high bits down, so keys that differ only above
   * their low bits (view offsets of a row loop, multiples of the row size)
   * would share the low bits tables index by: murmur3's finalizer mixes them. */
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  return h ^ (h >> 33);
}

/* The key bytes of a non-tensor argument, shared by the program key and the
 * output-spec key: a runtime scalar by its dtype (and wrapping) only, an
 * integer argument the rule takes at run time (TP_RUNTIME) by its count,
 * every other value in full. */
static void key_value_arg(kbuf *k, const tp_arg *a, int runtime) {
  if (runtime && (a->kind == TP_ARG_INT || a->kind == TP_ARG_INTS)) { /* TP_RUNTIME: the count only */
    kb_i64(k, a->kind == TP_ARG_INTS ? a->n : -1);
    return;
  }
  switch (a->kind) {
    case TP_ARG_SCALAR: kb_i64(k, a->sdt * 2 + (a->wrapped != 0)); break;
    case TP_ARG_INT: case TP_ARG_BOOL: kb_i64(k, a->i); break;
    case TP_ARG_FLOAT: kb_put(k, &a->f, sizeof a->f); break;
    case TP_ARG_INTS: kb_i64(k, a->n); kb_put(k, a->ints, sizeof(int64_t) * (size_t)a->n); break;
    case TP_ARG_STR: kb_put(k, a->s, strlen(a->s) + 1); break;
    case TP_ARG_TENSOR: case TP_ARG_TENSORS: case TP_ARG_NONE: break;
  }
}

/* ---- program cache ----------------------------------------------------------- */

typedef enum { SRC_STORAGE, SRC_SCALAR, SRC_RNG, SRC_CHECK, SRC_OFFSET, SRC_INT } src_kind;

typedef struct param_src {
  src_kind kind;
  int idx;     /* storage index, argument index, or (OFFSET) the view's ordinal (ref_at) */
  int sub;     /* INT: the element of argument idx */
  tp_dtype dt; /* SCALAR: dtype to upload */
  tp_val val;  /* while building: the parameter's value */
} param_src;

/* A range the program's rule declared on the values of a tensor argument
 * (tp_node.host_check), checked on the host before each launch where the
 * host knows the values. */
typedef struct host_check {
  int arg;
  int64_t lo, hi;
  tp_code code;
  char msg[256];
} host_check;

typedef struct entry {
  struct entry *next;
  struct entry *lru_prev, *lru_next; /* most recently used first */
  uint64_t hash;
  unsigned char *key;
  size_t keylen;
  tp_exec *exec;
  int nparams;
  param_src *params;
  int nres;
  int *res_storage; /* result j replaces the buffer of storage res_storage[j] */
  unsigned char *donate; /* per parameter: 1 if its buffer is donated to its result */
  uint64_t rng_count;
  int check_storage;   /* index of the device's check flag among the storages, -1: no checks */
  int64_t check_base;  /* id of the program's first check (SRC_CHECK parameter) */
  host_check *hchecks;
  int nhchecks;
} entry;

/* Everything below is guarded by tp_storage_lock(), which the engine holds
 * for a whole op. */
static entry **g_buckets;
static size_t g_nbuckets, g_nentries;
/* Least-recently-used order, and the cap on cached programs: each loaded
 * XLA:CPU executable holds memory mappings (~4.5 for a small one, ~20 for
 * an index_put with its checks), and a process that reaches Linux's
 * vm.max_map_count (65530) fails its next compile ("LLVM compilation error:
 * Cannot allocate memory") and then crashes in the plugin.  So the cap
 * (TORCH_PJRT_PROGRAM_CACHE_SIZE, default 4096) also shrinks to what the
 * mappings allow: every MAPS_CHECK_EVERY inserts the engine counts the
 * process's mappings, and past 60% of the limit it evicts a quarter of the
 * programs and keeps the cap there (maps_guard).  An evicted program comes
 * back from the disk cache when needed. */
static entry *g_lru_head, *g_lru_tail;
static size_t g_cap;
static tp_eager_stats g_stats;
static tp_diskcache *g_disk; /* persistent cache, NULL when off */
static char g_disk_err[512]; /* last disk cache warning */

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}


static void entry_free(entry *en) {
  if (!en) return;
  tp_exec_free(en->exec);
  free(en->key);
  free(en->params);
  free(en->res_storage);
  free(en->donate);
  free(en->hchecks);
  free(en);
}

static void lru_unlink(entry *en) {
  if (en->lru_prev) en->lru_prev->lru_next = en->lru_next;
  else g_lru_head = en->lru_next;
  if (en->lru_next) en->lru_next->lru_prev = en->lru_prev;
  else g_lru_tail = en->lru_prev;
  en->lru_prev = en->lru_next = NULL;
}

static void lru_push_front(entry *en) {
  en->lru_prev = NULL;
  en->lru_next = g_lru_head;
  if (g_lru_head) g_lru_head->lru_prev = en;
  g_lru_head = en;
  if (!g_lru_tail) g_lru_tail = en;
}

static size_t cache_cap(void) {
  if (!g_cap) {
    const char *v = getenv("TORCH_PJRT_PROGRAM_CACHE_SIZE");
    long n = v && *v ? strtol(v, NULL, 10) : 0;
    g_cap = n > 0 ? (size_t)n : 4096;
  }
  return g_cap;
}

#define MAPS_CHECK_EVERY 64

/* Lines of /proc/self/maps; -1 where there is none (not Linux). */
static long count_maps(void) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f) return -1;
  long n = 0;
  char buf[65536];
  size_t got;
  while ((got = fread(buf, 1, sizeof buf, f)) > 0)
    for (size_t i = 0; i < got; i++) n += buf[i] == '\n';
  fclose(f);
  return n;
}

static long max_maps(void) {
  static long limit;
  if (!limit) {
    limit = 65530; /* Linux's default */
    FILE *f = fopen("/proc/sys/vm/max_map_count", "r");
    if (f) {
      if (fscanf(f, "%ld", &limit) != 1 || limit <= 0) limit = 65530;
      fclose(f);
    }
  }
  return limit;
}

static void cache_evict_lru(void);

static void maps_guard(void) {
  static unsigned inserts;
  if (++inserts % MAPS_CHECK_EVERY) return;
  long n = count_maps();
  if (n < 0 || n < max_maps() / 10 * 6 || g_nentries < 16) return;
  size_t keep = g_nentries / 4 * 3;
  while (g_nentries > keep && g_lru_tail != g_lru_head) cache_evict_lru();
  g_cap = keep; /* and no more from now on */
}

/* Drop the least recently used program (it is not the one being run: that
 * one was just used).  PJRT keeps what an in-flight execution needs. */
static void cache_evict_lru(void) {
  entry *en = g_lru_tail;
  if (!en) return;
  lru_unlink(en);
  for (entry **pp = &g_buckets[en->hash % g_nbuckets]; *pp; pp = &(*pp)->next)
    if (*pp == en) {
      *pp = en->next;
      break;
    }
  g_nentries--;
  entry_free(en);
}

static entry *cache_find(const kbuf *k, uint64_t h) {
  if (!g_nbuckets) return NULL;
  for (entry *en = g_buckets[h % g_nbuckets]; en; en = en->next)
    if (en->hash == h && en->keylen == k->len && !memcmp(en->key, k->p, k->len)) {
      lru_unlink(en);
      lru_push_front(en);
      return en;
    }
  return NULL;
}

static void cache_insert(entry *en) {
  if (g_nentries + 1 > g_nbuckets) {
    size_t nb = g_nbuckets ? g_nbuckets * 2 : 256;
    entry **b = calloc(nb, sizeof(entry *));
    if (b) {
      for (size_t i = 0; i < g_nbuckets; i++)
        for (entry *en2 = g_buckets[i], *nx; en2; en2 = nx) {
          nx = en2->next;
          en2->next = b[en2->hash % nb];
          b[en2->hash % nb] = en2;
        }
      free(g_buckets);
      g_buckets = b;
      g_nbuckets = nb;
    }
  }
  if (!g_nbuckets) { /* could not allocate: run uncached */
    entry_free(en);
    return;
  }
  en->next = g_buckets[en->hash % g_nbuckets];
  g_buckets[en->hash % g_nbuckets] = en;
  g_nentries++;
  lru_push_front(en);
  while (g_nentries > cache_cap() && g_lru_tail != en) cache_evict_lru();
  maps_guard();
}

static void specs_clear_locked(void);
static void recompiles_clear_locked(void);

void tp_eager_clear_cache(void) {
  tp_storage_lock();
  for (size_t i = 0; i < g_nbuckets; i++)
    for (entry *en = g_buckets[i], *nx; en; en = nx) {
      nx = en->next;
      entry_free(en);
    }
  free(g_buckets);
  g_buckets = NULL;
  g_nbuckets = g_nentries = 0;
  g_lru_head = g_lru_tail = NULL;
  specs_clear_locked();
  recompiles_clear_locked();
  tp_storage_unlock();
}

void tp_eager_get_stats(tp_eager_stats *out) {
  tp_storage_lock();
  *out = g_stats;
  out->cached_programs = (int64_t)g_nentries;
  if (g_disk) {
    tp_diskcache_stats ds;
    tp_diskcache_get_stats(g_disk, &ds);
    out->disk_corrupt = ds.corrupt_dropped;
  }
  tp_storage_unlock();
}

/* ---- output specs by argument signature (see eager.h) ---------------------------------- */

typedef struct spec_entry {
  struct spec_entry *next;
  uint64_t hash;
  size_t keylen;
  tp_op_specs specs;
  unsigned char key[];
} spec_entry;

static spec_entry **g_spec_buckets;
static size_t g_spec_nbuckets, g_spec_n;
static int g_spec_ctx = TP_F32;

/* 0 if the signature cannot be a key (tensor lists). */
static int spec_key(kbuf *k, const char *op, const tp_eager_arg *args, int nargs, int by_value) {
  unsigned flags = 0; /* runtime integer arguments do not shape the outputs; looked up only where there are
                       * integers (the hot path's elementwise ops have none) */
  for (int i = 0; i < nargs && i < 16; i++)
    if (args[i].a.kind == TP_ARG_INT || args[i].a.kind == TP_ARG_INTS) {
      tp_lower_find_ex(op, &flags);
      break;
    }
  kb_put(k, op, strlen(op) + 1);
  for (int i = 0; i < nargs; i++) {
    const tp_arg *a = &args[i].a;
    kb_i64(k, a->kind);
    if (a->kind == TP_ARG_TENSORS) return 0;
    if (a->kind == TP_ARG_TENSOR) {
      const tp_tensor_ref *r = args[i].t;
      kb_i64(k, r->dt);
      kb_i64(k, r->rank);
      kb_put(k, r->sizes, sizeof(int64_t) * (size_t)r->rank);
      kb_put(k, r->strides, sizeof(int64_t) * (size_t)r->rank);
    }
    key_value_arg(k, a, i < 16 && (flags & TP_RUNTIME(i)));
    if (a->kind == TP_ARG_SCALAR && by_value) {
      kb_i64(k, a->i);
      kb_put(k, &a->f, sizeof a->f);
      kb_put(k, &a->fi, sizeof a->fi);
    }
  }
  return !k->oom;
}

static void specs_clear_locked(void) {
  for (size_t i = 0; i < g_spec_nbuckets; i++)
    for (spec_entry *en = g_spec_buckets[i], *nx; en; en = nx) {
      nx = en->next;
      free(en);
    }
  free(g_spec_buckets);
  g_spec_buckets = NULL;
  g_spec_nbuckets = g_spec_n = 0;
}

void tp_eager_specs_context(int ctx) {
  tp_storage_lock();
  if (ctx != g_spec_ctx) {
    specs_clear_locked();
    g_spec_ctx = ctx;
  }
  tp_storage_unlock();
}

int tp_eager_specs_find(const char *op, const tp_eager_arg *args, int nargs, int numbers_by_value, int ctx,
                        tp_op_specs *out) {
  kbuf k;
  kb_init(&k);
  int found = 0;
  if (spec_key(&k, op, args, nargs, numbers_by_value)) {
    uint64_t h = hash_bytes(k.p, k.len);
    tp_storage_lock();
    for (spec_entry *en = g_spec_nbuckets && ctx == g_spec_ctx ? g_spec_buckets[h % g_spec_nbuckets] : NULL; en;
         en = en->next)
      if (en->hash == h && en->keylen == k.len && !memcmp(en->key, k.p, k.len)) {
        *out = en->specs;
        found = 1;
        break;
      }
    tp_storage_unlock();
  }
  kb_free(&k);
  return found;
}

static size_t spec_cap(void) {
  const char *v = getenv("TORCH_PJRT_SPEC_CACHE_SIZE");
  long long n = v && *v ? atoll(v) : 0;
  return n > 0 ? (size_t)n : 65536;
}

void tp_eager_specs_record(const char *op, const tp_eager_arg *args, int nargs, int numbers_by_value,
                           const tp_op_specs *specs) {
  if (specs->n < 0 || specs->n > TP_SPEC_MAX_OUTS) return;
  kbuf k;
  kb_init(&k);
  if (!spec_key(&k, op, args, nargs, numbers_by_value)) {
    kb_free(&k);
    return;
  }
  uint64_t h = hash_bytes(k.p, k.len);
  tp_storage_lock();
  int present = 0;
  for (spec_entry *en = g_spec_nbuckets ? g_spec_buckets[h % g_spec_nbuckets] : NULL; en && !present; en = en->next)
    present = en->hash == h && en->keylen == k.len && !memcmp(en->key, k.p, k.len);
  if (!present && g_spec_n >= spec_cap()) specs_clear_locked();
  if (!present && g_spec_n + 1 > g_spec_nbuckets) {
    size_t nb = g_spec_nbuckets ? g_spec_nbuckets * 2 : 256;
    spec_entry **b = calloc(nb, sizeof *b);
    if (b) {
      for (size_t i = 0; i < g_spec_nbuckets; i++)
        for (spec_entry *en = g_spec_buckets[i], *nx; en; en = nx) {
          nx = en->next;
          en->next = b[en->hash % nb];
          b[en->hash % nb] = en;
        }
      free(g_spec_buckets);
      g_spec_buckets = b;
      g_spec_nbuckets = nb;
    }
  }
  spec_entry *en = present || !g_spec_nbuckets ? NULL : malloc(sizeof *en + k.len);
  if (en) {
    en->hash = h;
    en->keylen = k.len;
    en->specs = *specs;
    memcpy(en->key, k.p, k.len);
    en->next = g_spec_buckets[h % g_spec_nbuckets];
    g_spec_buckets[h % g_spec_nbuckets] = en;
    g_spec_n++;
  }
  tp_storage_unlock();
  kb_free(&k);
}

void tp_eager_number_f64(tp_arg *a, double v) {
  a->kind = TP_ARG_SCALAR;
  a->wrapped = 1;
  a->sdt = TP_F64;
  a->f = v;
  /* the integer view of a float scalar (integer ops read .i); NaN, inf and
   * huge values have none */
  a->i = v > -9.2e18 && v < 9.2e18 ? (int64_t)v : 0;
}

void tp_eager_number_int(tp_arg *a, int64_t v, int is_bool) {
  a->kind = TP_ARG_SCALAR;
  a->wrapped = 1;
  a->sdt = is_bool ? TP_BOOL : TP_I64;
  a->i = v;
  a->f = (double)v;
}

/* ---- the op being run ----------------------------------------------------------- */

#define ST_LINEAR 16 /* up to this many storages, storage_index searches linearly; past it, st_slot */

/* The per-storage tables grow with the op (a compiled graph's call may touch
 * thousands of storages: every parameter, gradient and optimizer state). */
struct tp_lower_ctx {
  const tp_eager_arg *args;
  int nargs;
  const tp_tensor_ref *outs;
  int nouts;
  unsigned flags; /* the rule's (lower.h) */
  int nst, capst;
  tp_storage **st;
  int *st_slot;       /* index + 1 of the storage hashed there, 0: empty; NSLOTS(c) of them */
  tp_dtype *st_dt;    /* dtype of the storage's buffer */
  int64_t *st_numel;
  tp_val *st_param;   /* flat parameter, -1 until used */
  tp_val *st_cur;     /* flat value after writes, -1 if unwritten */
  char *st_read;      /* the program reads the storage's buffer */
  char *st_zero;      /* ... which does not exist yet: it reads as zeros */
  param_src *params;
  int nparams, capparams;
  int rng_used;
  tp_rng_state *rng; /* a user generator's state, or NULL: the device's */
  int device;
  /* index checks (tp_node.check) the program being built makes */
  int nchecks, capchecks;
  struct pending_check *checks;
  /* host checks of the program being built: handed to its entry */
  int nhchecks;
  struct host_check *hchecks;
};

#define NSLOTS(c) ((size_t)(c)->capst * 4) /* a power of two, > 2 * capst */

static size_t st_hash(const tp_lower_ctx *c, const tp_storage *s) {
  uint64_t v = (uint64_t)(uintptr_t)s;
  v ^= v >> 17;
  v *= 0x9E3779B97F4A7C15ull;
  return (size_t)(v >> 32) & (NSLOTS(c) - 1);
}

static void st_slot_put(tp_lower_ctx *c, int i) {
  size_t h = st_hash(c, c->st[i]);
  while (c->st_slot[h]) h = (h + 1) & (NSLOTS(c) - 1);
  c->st_slot[h] = i + 1;
}

static void free_tables(tp_lower_ctx *c) {
  free(c->st);
  free(c->st_slot);
  free(c->st_dt);
  free(c->st_numel);
  free(c->st_param);
  free(c->st_cur);
  free(c->st_read);
  free(c->st_zero);
}

#define GROW(field, n)                                             \
  do {                                                             \
    void *np_ = realloc(c->field, sizeof(*c->field) * (size_t)(n)); \
    if (!np_) return -1;                                           \
    c->field = np_;                                                \
  } while (0)

/* Room for twice as many storages; the hashed ones are placed anew. */
static int grow_tables(tp_lower_ctx *c) {
  int cap = c->capst ? c->capst * 2 : 64;
  GROW(st, cap);
  GROW(st_dt, cap);
  GROW(st_numel, cap);
  GROW(st_param, cap);
  GROW(st_cur, cap);
  GROW(st_read, cap);
  GROW(st_zero, cap);
  int *slots = calloc((size_t)cap * 4, sizeof(int));
  if (!slots) return -1;
  free(c->st_slot);
  c->st_slot = slots;
  c->capst = cap;
  if (c->nst > ST_LINEAR)
    for (int j = 0; j < c->nst; j++) st_slot_put(c, j);
  return 0;
}
#undef GROW

/* The storage's index in the op's table, added if new (-1: out of host
 * memory).  An eager op has a few storages; a compiled graph's call
 * hundreds or thousands, found through st_slot. */
static int storage_index(tp_lower_ctx *c, tp_storage *s) {
  if (c->nst <= ST_LINEAR) {
    for (int i = 0; i < c->nst; i++)
      if (c->st[i] == s) return i;
  } else {
    for (size_t h = st_hash(c, s); c->st_slot[h]; h = (h + 1) & (NSLOTS(c) - 1))
      if (c->st[c->st_slot[h] - 1] == s) return c->st_slot[h] - 1;
  }
  if (c->nst == c->capst && grow_tables(c) < 0) return -1;
  int i = c->nst++;
  c->st[i] = s;
  c->st_param[i] = -1;
  c->st_cur[i] = -1;
  c->st_read[i] = 0;
  c->st_zero[i] = 0;
  if (c->nst == ST_LINEAR + 1)
    for (int j = 0; j < c->nst; j++) st_slot_put(c, j);
  else if (c->nst > ST_LINEAR + 1)
    st_slot_put(c, i);
  return i;
}

/* Empty the table for the next op (its arrays stay for reuse). */
static void clear_tables(tp_lower_ctx *c) {
  if (c->nst > ST_LINEAR) /* the op hashed its storages: clear just their slots */
    for (int j = 0; j < c->nst; j++) {
      size_t h = st_hash(c, c->st[j]);
      while (c->st_slot[h] != j + 1) h = (h + 1) & (NSLOTS(c) - 1);
      c->st_slot[h] = 0;
    }
  c->nst = 0;
}

static int push_param(tp_lower_ctx *c, src_kind k, int idx, tp_dtype dt) {
  if (c->nparams == c->capparams) {
    int nc = c->capparams ? c->capparams * 2 : 8;
    param_src *np = realloc(c->params, sizeof(param_src) * (size_t)nc);
    if (!np) return -1;
    c->params = np;
    c->capparams = nc;
  }
  c->params[c->nparams].kind = k;
  c->params[c->nparams].idx = idx;
  c->params[c->nparams].dt = dt;
  c->params[c->nparams].sub = 0;
  c->params[c->nparams].val = -1;
  return c->nparams++;
}

static tp_val storage_param(tp_emit *e, tp_lower_ctx *c, int s) {
  if (c->st_param[s] < 0) {
    tp_type t = tp_type_make(c->st_dt[s], 1, &c->st_numel[s]);
    if (c->st_zero[s]) return c->st_param[s] = em_full(e, 0, &t); /* a constant: nothing to upload */
    if (push_param(c, SRC_STORAGE, s, c->st_dt[s]) < 0) return em_fail(e, TP_RESOURCE_EXHAUSTED, "out of memory");
    c->st_param[s] = em_param(e, &t);
  }
  return c->st_param[s];
}

static tp_val cb_scalar(tp_emit *e, const tp_node *n, int i, tp_dtype dt) {
  tp_lower_ctx *c = n->ctx;
  if (i < 0 || i >= c->nargs || c->args[i].a.kind != TP_ARG_SCALAR)
    return em_fail(e, TP_INTERNAL, "%s: argument %d is not a scalar", n->op, i);
  if (!tp_dtype_is_complex(dt) && c->args[i].a.fi != 0) return tp_scalar_to_real(e, dt);
  /* float8 scalars travel as f32 (their bytes are not worth a converter here) */
  if (tp_dtype_is_f8(dt)) return em_convert(e, cb_scalar(e, n, i, TP_F32), dt);
  /* One parameter per (argument, dtype). */
  for (int k = 0; k < c->nparams; k++)
    if (c->params[k].kind == SRC_SCALAR && c->params[k].idx == i && c->params[k].dt == dt) return c->params[k].val;
  int k = push_param(c, SRC_SCALAR, i, dt);
  if (k < 0) return em_fail(e, TP_RESOURCE_EXHAUSTED, "out of memory");
  tp_type t = tp_type_make(dt, 0, NULL);
  return c->params[k].val = em_param(e, &t);
}

/* Integers a rule takes at run time (TP_RUNTIME): one rank-0 i64 operand per element. */
static int is_runtime_int(const tp_lower_ctx *c, int i) {
  return i >= 0 && i < 16 && i < c->nargs && (c->flags & TP_RUNTIME(i)) &&
         (c->args[i].a.kind == TP_ARG_INT || c->args[i].a.kind == TP_ARG_INTS);
}

static tp_val cb_runtime_int(tp_emit *e, const tp_node *n, int i, int j) {
  tp_lower_ctx *c = n->ctx;
  if (!is_runtime_int(c, i) || j < 0 || j >= (c->args[i].a.kind == TP_ARG_INTS ? c->args[i].a.n : 1))
    return em_fail(e, TP_INTERNAL, "%s: argument %d element %d is not a runtime integer", n->op, i, j);
  for (int k = 0; k < c->nparams; k++)
    if (c->params[k].kind == SRC_INT && c->params[k].idx == i && c->params[k].sub == j) return c->params[k].val;
  int k = push_param(c, SRC_INT, i, TP_I64);
  if (k < 0) return em_fail(e, TP_RESOURCE_EXHAUSTED, "out of memory");
  c->params[k].sub = j;
  tp_type t = tp_type_make(TP_I64, 0, NULL);
  return c->params[k].val = em_param(e, &t);
}

static tp_val cb_rng_key(tp_emit *e, const tp_node *n) {
  tp_lower_ctx *c = n->ctx;
  if (push_param(c, SRC_RNG, 0, TP_U64) < 0) return em_fail(e, TP_RESOURCE_EXHAUSTED, "out of memory");
  c->rng_used++;
  int64_t two = 2;
  tp_type t = tp_type_make(TP_U64, 1, &two);
  return em_param(e, &t);
}

/* ---- index checks ----------------------------------------------------------------
 *
 * PyTorch checks indices on the host before it indexes; a program cannot
 * raise.  A rule declares the range its indices must lie in (tp_node.check);
 * the program then also updates the device's check flag, a storage holding
 * two i64 values: the id of the first check that failed since the flag was
 * last read (0: none) and the offending index.  When a checking program ran
 * since the last look, synchronizing reads the flag, and so does reading a
 * tensor once the flag is computed (a read never waits for more than its
 * tensor); the check's error is raised there, like CUDA's device-side
 * asserts but recoverable: the flag is cleared.  TORCH_PJRT_LAUNCH_BLOCKING=1 reads
 * it after every checking op instead, so the error names the op where it
 * happened.
 *
 * A check's id is its message's index in a process-wide table.  A program's
 * checks get consecutive ids from a base that is a runtime parameter, so a
 * program loaded from the disk cache reports this process's messages.  All
 * of this is guarded by tp_storage_lock(). */

typedef struct pending_check {
  tp_val bad;   /* i1 rank 0: some index is out of range */
  tp_val value; /* i64 rank 0: the first offending index */
  tp_code code;
  char msg[512];
} pending_check;

typedef struct check_msg {
  tp_code code;
  char *op;
  char *msg;
} check_msg;

#define MAX_CHECK_MSGS (1 << 20)
static check_msg *g_msgs; /* id i is g_msgs[i - 1] */
static int64_t g_nmsgs, g_capmsgs;
static tp_storage **g_flag; /* per device, created on first use */
static char *g_flag_dirty;
static int g_nflag;

static void cb_check(tp_emit *e, const tp_node *n, tp_val idx, int64_t lo, int64_t hi, tp_code code,
                     const char *msg) {
  tp_lower_ctx *c = n->ctx;
  if (em_failed(e)) return;
  if (c->nchecks == c->capchecks) {
    int nc = c->capchecks ? c->capchecks * 2 : 4;
    pending_check *np = realloc(c->checks, sizeof(pending_check) * (size_t)nc);
    if (!np) {
      em_fail(e, TP_RESOURCE_EXHAUSTED, "out of host memory");
      return;
    }
    c->checks = np;
    c->capchecks = nc;
  }
  /* flat i64 indices; the first offending one (row-major), as PyTorch's
   * host-side checks report */
  tp_val v = em_convert(e, idx, TP_I64);
  int64_t nel = tp_type_numel(em_type(e, v)), zero = 0;
  v = em_reshape(e, v, 1, &nel);
  tp_type t = tp_type_make(TP_I64, 1, &nel);
  tp_val bad = em_binary(e, "stablehlo.or", em_compare(e, "LT", v, em_bcast_to(e, em_const_i(e, lo, TP_I64), 1, &nel)),
                         em_compare(e, "GE", v, em_bcast_to(e, em_const_i(e, hi, TP_I64), 1, &nel)));
  tp_val first = em_reduce(e, em_select(e, bad, em_iota(e, &t, 0), em_full(e, (double)nel, &t)),
                           em_const_i(e, nel, TP_I64), &zero, 1, "stablehlo.minimum");
  bad = em_compare(e, "LT", first, em_const_i(e, nel, TP_I64));
  tp_val at = em_binary(e, "stablehlo.minimum", first, em_const_i(e, nel - 1, TP_I64));
  int64_t one = 1;
  tp_val value = em_reshape(e, em_dyn_slice(e, v, &at, &one), 0, NULL);
  pending_check *pc = &c->checks[c->nchecks++];
  pc->bad = bad;
  pc->value = value;
  pc->code = code;
  snprintf(pc->msg, sizeof pc->msg, "%s", msg);
}

static void cb_host_check(tp_emit *e, const tp_node *n, int arg, int64_t lo, int64_t hi, tp_code code,
                          const char *msg) {
  tp_lower_ctx *c = n->ctx;
  if (em_failed(e) || arg < 0 || arg >= c->nargs || c->args[arg].a.kind != TP_ARG_TENSOR) return;
  host_check *nh = realloc(c->hchecks, sizeof(host_check) * (size_t)(c->nhchecks + 1));
  if (!nh) {
    em_fail(e, TP_RESOURCE_EXHAUSTED, "out of host memory");
    return;
  }
  c->hchecks = nh;
  host_check *h = &nh[c->nhchecks++];
  h->arg = arg;
  h->lo = lo;
  h->hi = hi;
  h->code = code;
  snprintf(h->msg, sizeof h->msg, "%s", msg);
}

/* A check's message with "{}" replaced by the offending value and "{{" by "{". */
static void check_text(const char *msg, int64_t value, char *text, size_t cap) {
  char num[32];
  snprintf(num, sizeof num, "%" PRId64, value);
  size_t q = 0;
  for (const char *s = msg; *s && q + 1 < cap; s++) {
    if (s[0] == '{' && s[1] == '{') { /* "{{": a literal "{" (lw_check_text) */
      text[q++] = '{';
      s++;
    } else if (s[0] == '{' && s[1] == '}') {
      q += (size_t)snprintf(text + q, cap - q, "%s", num);
      if (q >= cap) q = cap - 1;
      s++;
    } else {
      text[q++] = *s;
    }
  }
  text[q] = 0;
}

/* The id of the first of k messages, added to the table unless the same run
 * of messages is there already. */
static int64_t check_ids(const char *op, const pending_check *pc, int k) {
  for (int64_t b = 0; b + k <= g_nmsgs; b++) {
    int same = 1;
    for (int j = 0; same && j < k; j++)
      same = g_msgs[b + j].code == pc[j].code && !strcmp(g_msgs[b + j].op, op) && !strcmp(g_msgs[b + j].msg, pc[j].msg);
    if (same) return b + 1;
  }
  if (g_nmsgs + k > MAX_CHECK_MSGS) return -1;
  if (g_nmsgs + k > g_capmsgs) {
    int64_t nc = g_capmsgs ? g_capmsgs * 2 : 64;
    while (nc < g_nmsgs + k) nc *= 2;
    check_msg *nm = realloc(g_msgs, sizeof(check_msg) * (size_t)nc);
    if (!nm) return -1;
    g_msgs = nm;
    g_capmsgs = nc;
  }
  int64_t base = g_nmsgs + 1;
  for (int j = 0; j < k; j++) {
    check_msg *m = &g_msgs[g_nmsgs];
    m->code = pc[j].code;
    m->op = strdup(op);
    m->msg = strdup(pc[j].msg);
    if (!m->op || !m->msg) {
      free(m->op);
      free(m->msg);
      return -1;
    }
    g_nmsgs++;
  }
  return base;
}

/* The device's check flag (two i64 zeros at first); NULL if out of memory. */
static tp_storage *flag_storage(tp_plugin *p, int device, tp_status **st) {
  *st = NULL;
  if (device >= g_nflag) {
    int nn = device + 1;
    tp_storage **nf = realloc(g_flag, sizeof(tp_storage *) * (size_t)nn);
    if (!nf) return NULL;
    g_flag = nf;
    char *nd = realloc(g_flag_dirty, (size_t)nn);
    if (!nd) return NULL;
    g_flag_dirty = nd;
    for (int i = g_nflag; i < nn; i++) g_flag[i] = NULL, g_flag_dirty[i] = 0;
    g_nflag = nn;
  }
  if (!g_flag[device]) {
    tp_storage *fs = tp_storage_new(device, 2 * sizeof(int64_t));
    if (!fs) return NULL;
    int64_t zero[2] = {0, 0}, two = 2;
    tp_buffer *b = NULL;
    *st = tp_buffer_from_host(p, device, TP_I64, &two, 1, zero, &b);
    if (*st) {
      tp_storage_free(fs);
      return NULL;
    }
    tp_storage_set_buffer(fs, b);
    g_flag[device] = fs;
  }
  return g_flag[device];
}

/* Emit the update of the check flag for the checks the program made. */
static tp_status *emit_flag_update(tp_plugin *p, tp_emit *e, tp_lower_ctx *c, const char *op, entry *en) {
  tp_status *st = NULL;
  tp_storage *flag = flag_storage(p, c->device, &st);
  if (!flag) return st ? st : tp_error(TP_RESOURCE_EXHAUSTED, "out of host memory");
  int fs = storage_index(c, flag);
  if (fs < 0) return tp_error(TP_RESOURCE_EXHAUSTED, "out of host memory");
  int64_t base = check_ids(op, c->checks, c->nchecks);
  if (base < 0) return tp_error(TP_RESOURCE_EXHAUSTED, "out of host memory (index check messages)");
  c->st_dt[fs] = TP_I64;
  c->st_numel[fs] = 2;
  c->st_read[fs] = 1;
  tp_val old = storage_param(e, c, fs);
  if (push_param(c, SRC_CHECK, 0, TP_I64) < 0) return tp_error(TP_RESOURCE_EXHAUSTED, "out of host memory");
  tp_type t0 = tp_type_make(TP_I64, 0, NULL);
  tp_val vbase = em_param(e, &t0);
  /* The first failing check and its first offending index, found as vectors
   * over the checks: the check's number is the min of (bad ? k : K), its
   * value read at that number.  A chain of selects, one per check, became
   * one kernel whose code generation grew superlinearly (400 gathers in a
   * graph: 112 s of compiling, 15-20 s this way).  Each check keeps its own
   * reduce over its indices: concatenating all indices before one reduce
   * saves those reduces' compile time but writes every index out again at
   * each run (docs/architecture.md, "Index checks"). */
  int K = c->nchecks;
  int64_t one = 1, z = 0, lim1 = 1, lim2 = 2;
  tp_val *keys = malloc(sizeof(tp_val) * 2 * (size_t)K), *vals = keys + K;
  if (!keys) return tp_error(TP_RESOURCE_EXHAUSTED, "out of host memory");
  tp_val none = em_const_i(e, K, TP_I64), zero = em_const_i(e, 0, TP_I64);
  for (int k = 0; k < K; k++) {
    keys[k] = em_reshape(e, em_select(e, c->checks[k].bad, em_const_i(e, k, TP_I64), none), 1, &one);
    vals[k] = em_reshape(e, c->checks[k].value, 1, &one);
  }
  tp_val first = em_reduce(e, em_concat(e, keys, K, 0), none, &z, 1, "stablehlo.minimum");
  tp_val at = em_binary(e, "stablehlo.minimum", first, em_const_i(e, K - 1, TP_I64));
  tp_val failed = em_compare(e, "LT", first, none);
  tp_val code = em_select(e, failed, em_binary(e, "stablehlo.add", vbase, first), zero);
  tp_val value = em_select(e, failed, em_reshape(e, em_dyn_slice(e, em_concat(e, vals, K, 0), &at, &one), 0, NULL), zero);
  free(keys);
  tp_val prev = em_reshape(e, em_slice(e, old, &z, &lim1, NULL), 0, NULL);
  tp_val prev_value = em_reshape(e, em_slice(e, old, &one, &lim2, NULL), 0, NULL);
  tp_val keep = em_compare(e, "NE", prev, em_const_i(e, 0, TP_I64));
  tp_val now[2] = {em_reshape(e, em_select(e, keep, prev, code), 1, &one),
                   em_reshape(e, em_select(e, keep, prev_value, value), 1, &one)};
  c->st_cur[fs] = em_concat(e, now, 2, 0);
  en->check_storage = fs;
  en->check_base = base;
  return NULL;
}

/* How check_flag looks at the flag. */
typedef enum {
  FLAG_IF_READY, /* a read: only if the checking programs are done (a read never waits longer for them) */
  FLAG_WAIT,     /* synchronize: wait for them */
  FLAG_AT_OP,    /* TORCH_PJRT_LAUNCH_BLOCKING, right after the op: wait, and leave the op out of the message */
} flag_mode;

/* Read device's check flag if a checking program ran since the last look;
 * the error of a failed check (and the flag cleared), else NULL. */
static tp_status *check_flag(tp_plugin *p, int device, flag_mode mode) {
  if (device < 0 || device >= g_nflag || !g_flag_dirty[device]) return NULL;
  if (mode == FLAG_IF_READY && !tp_buffer_is_ready(tp_storage_buffer(g_flag[device]))) return NULL;
  int64_t v[2] = {0, 0};
  TP_RETURN_IF_ERROR(tp_buffer_to_host(tp_storage_buffer(g_flag[device]), v, sizeof v));
  g_flag_dirty[device] = 0;
  g_stats.d2h_transfers++;
  g_stats.d2h_bytes += (int64_t)sizeof v;
  if (v[0] == 0) return NULL;
  int64_t zero[2] = {0, 0}, two = 2;
  tp_buffer *b = NULL;
  TP_RETURN_IF_ERROR(tp_buffer_from_host(p, device, TP_I64, &two, 1, zero, &b));
  tp_storage_set_buffer(g_flag[device], b);
  if (v[0] < 1 || v[0] > g_nmsgs) return tp_error(TP_INTERNAL, "tpu:%d: corrupt index check flag (%" PRId64 ")", device, v[0]);
  const check_msg *m = &g_msgs[v[0] - 1];
  char text[600];
  check_text(m->msg, v[1], text, sizeof text);
  if (mode == FLAG_AT_OP) return tp_error(m->code, "%s", text);
  return tp_error(m->code,
                  "%s (found on tpu:%d by %s, which ran asynchronously before this point; set "
                  "TORCH_PJRT_LAUNCH_BLOCKING=1 to raise it at that op)",
                  text, device, m->op);
}

/* TORCH_PJRT_LAUNCH_BLOCKING=1, read once (under tp_storage_lock()). */
static int launch_blocking(void) {
  static int v = -1;
  if (v < 0) {
    const char *s = getenv("TORCH_PJRT_LAUNCH_BLOCKING");
    v = s && s[0] == '1';
  }
  return v;
}

/* ---- views over flat storage values --------------------------------------------- */

/* A strided view described as a slice of a dense "box": the dims that
 * matter (size > 1, stride > 0) sorted by stride, outermost first. */
typedef struct box_plan {
  int k;                         /* number of such dims */
  int order[TP_MAX_RANK];        /* dim indices, by decreasing stride */
  int64_t box[TP_MAX_RANK + 1];  /* box extents (k + 1 dims) */
  int64_t L;                     /* elements the box spans from the offset */
  int expanded;                  /* some dim has stride 0 and size > 1 */
} box_plan;

static int plan_box(const tp_tensor_ref *r, box_plan *p) {
  p->k = 0;
  p->expanded = 0;
  for (int i = 0; i < r->rank; i++) {
    if (r->sizes[i] <= 1) continue;
    if (r->strides[i] == 0) {
      p->expanded = 1;
      continue;
    }
    if (r->strides[i] < 0) return 0;
    /* insertion sort by decreasing stride (stable) */
    int j = p->k++;
    while (j > 0 && r->strides[p->order[j - 1]] < r->strides[i]) {
      p->order[j] = p->order[j - 1];
      j--;
    }
    p->order[j] = i;
  }
  if (p->k == 0) {
    p->box[0] = 1;
    p->L = 1;
    return 1;
  }
  for (int j = 0; j + 1 < p->k; j++) {
    int64_t so = r->strides[p->order[j]], si = r->strides[p->order[j + 1]];
    if (so % si || so / si < r->sizes[p->order[j + 1]]) return 0; /* overlapping or interleaved */
  }
  p->box[0] = r->sizes[p->order[0]];
  for (int j = 1; j < p->k; j++) p->box[j] = r->strides[p->order[j - 1]] / r->strides[p->order[j]];
  p->box[p->k] = r->strides[p->order[p->k - 1]];
  p->L = p->box[0] * r->strides[p->order[0]];
  return 1;
}

static int64_t ref_numel(const tp_tensor_ref *r) {
  int64_t n = 1;
  for (int i = 0; i < r->rank; i++) n *= r->sizes[i];
  return n;
}

/* ---- a view's offset: a runtime operand ------------------------------------------
 *
 * A view's storage offset reaches its program as a runtime i64 operand, so
 * x[i], x[i:i+3], x.narrow(0, i, 2), x.select(0, i) and a write into a KV
 * cache at position t run one program for every i (a Python loop compiled
 * one per value before).  Only a view that spans its whole storage keeps
 * its offset (0) in the program: most tensors are such views, and their
 * programs stay as they were.  Sizes and strides stay static: they shape
 * the program. */
static int dyn_offset(const tp_tensor_ref *r) {
  size_t es = tp_dtype_size(r->dt);
  if (!es || ref_numel(r) == 0) return 0;
  return !(r->offset == 0 && (size_t)ref_numel(r) * es == tp_storage_nbytes(r->st));
}

/* The ordinal of a view among the op's tensors (arguments, list members,
 * then outputs), which names it in the program's parameters; -1: none. */
static int ref_ordinal(const tp_lower_ctx *c, const tp_tensor_ref *r) {
  int n = 0;
  for (int i = 0; i < c->nargs; i++) {
    if (c->args[i].a.kind == TP_ARG_TENSOR) {
      if (c->args[i].t == r) return n;
      n++;
    } else if (c->args[i].a.kind == TP_ARG_TENSORS) {
      for (int j = 0; j < c->args[i].a.n; j++, n++)
        if (c->args[i].ts[j] == r) return n;
    }
  }
  for (int i = 0; i < c->nouts; i++, n++)
    if (&c->outs[i] == r) return n;
  return -1;
}

static const tp_tensor_ref *ref_at(const tp_lower_ctx *c, int ord) {
  int n = 0;
  for (int i = 0; i < c->nargs; i++) {
    if (c->args[i].a.kind == TP_ARG_TENSOR) {
      if (n++ == ord) return c->args[i].t;
    } else if (c->args[i].a.kind == TP_ARG_TENSORS) { /* a graph's inputs: thousands, so no scan */
      if (ord - n < c->args[i].a.n) return c->args[i].ts[ord - n];
      n += c->args[i].a.n;
    }
  }
  return ord - n >= 0 && ord - n < c->nouts ? &c->outs[ord - n] : NULL;
}

/* The view's offset as a value: its runtime operand (one per view), or the
 * constant where it is static. */
static tp_val view_offset(tp_emit *e, tp_lower_ctx *c, const tp_tensor_ref *r) {
  if (!dyn_offset(r)) return em_const_i(e, r->offset, TP_I64);
  int ord = ref_ordinal(c, r);
  if (ord < 0) return em_fail(e, TP_INTERNAL, "a view that is not one of the op's tensors");
  for (int k = 0; k < c->nparams; k++)
    if (c->params[k].kind == SRC_OFFSET && c->params[k].idx == ord) return c->params[k].val;
  int k = push_param(c, SRC_OFFSET, ord, TP_I64);
  if (k < 0) return em_fail(e, TP_RESOURCE_EXHAUSTED, "out of memory");
  tp_type t = tp_type_make(TP_I64, 0, NULL);
  return c->params[k].val = em_param(e, &t);
}

/* Elements from the view's offset to one past its last (strides >= 0). */
static int64_t view_span(const tp_tensor_ref *r) {
  int64_t n = 1;
  for (int i = 0; i < r->rank; i++)
    if (r->sizes[i] > 1 && r->strides[i] > 0) n += (r->sizes[i] - 1) * r->strides[i];
  return n;
}

/* The run-time check PyTorch's views make when they are built: a view lies
 * in its storage (XLA would clamp a dynamic slice that does not). */
static tp_status *check_in_storage(const tp_tensor_ref *r) {
  int64_t lo = r->offset, hi = r->offset, es = (int64_t)tp_dtype_size(r->dt);
  for (int i = 0; i < r->rank; i++) {
    if (r->sizes[i] <= 1) continue;
    if (r->strides[i] < 0) lo += (r->sizes[i] - 1) * r->strides[i];
    else hi += (r->sizes[i] - 1) * r->strides[i];
  }
  int64_t n = es ? (int64_t)tp_storage_nbytes(r->st) / es : 0;
  if (lo < 0 || hi >= n)
    return tp_error(TP_INVALID_ARGUMENT,
                    "a view (storage offset %lld) reaches elements [%lld, %lld] outside its storage of %lld elements",
                    (long long)r->offset, (long long)lo, (long long)hi, (long long)n);
  return NULL;
}

/* Flat element indices of a view: offset + sum(iota_i * stride_i), i64. */
static tp_val view_indices(tp_emit *e, tp_lower_ctx *c, const tp_tensor_ref *r) {
  tp_type it = tp_type_make(TP_I64, r->rank, r->sizes);
  tp_val idx = em_bcast_in_dim(e, view_offset(e, c, r), &it, NULL);
  for (int i = 0; i < r->rank; i++) {
    if (r->sizes[i] <= 1 || r->strides[i] == 0) continue;
    tp_val io = em_iota(e, &it, i);
    tp_val s = em_full(e, (double)r->strides[i], &it);
    idx = em_binary(e, "stablehlo.add", idx, em_binary(e, "stablehlo.multiply", io, s));
  }
  return idx;
}

/* The `got` elements of a flat value from the view's offset (all to the
 * end, at most the box's L, where the offset is static; the view's span
 * where it is a runtime operand), zero-padded to L and shaped as the plan's
 * box. */
static tp_val box_segment(tp_emit *e, tp_lower_ctx *c, tp_val flat, const tp_tensor_ref *r, const box_plan *p,
                          int64_t *got) {
  int64_t n = em_type(e, flat)->dims[0];
  tp_val seg;
  if (dyn_offset(r)) {
    *got = view_span(r);
    tp_val off = view_offset(e, c, r);
    seg = em_dyn_slice(e, flat, &off, got);
  } else {
    int64_t end = r->offset + p->L < n ? r->offset + p->L : n;
    *got = end - r->offset;
    seg = em_slice(e, flat, &r->offset, &end, NULL);
  }
  if (*got < p->L) {
    int64_t lo = 0, hi = p->L - *got;
    seg = em_pad(e, seg, em_const(e, 0, em_type(e, flat)->dt), &lo, &hi, NULL);
  }
  return em_reshape(e, seg, p->k + 1, p->box);
}

static tp_val view_read(tp_emit *e, tp_lower_ctx *c, const tp_tensor_ref *r) {
  tp_type vt = tp_type_make(r->dt, r->rank, r->sizes);
  if (ref_numel(r) == 0) return em_full(e, 0, &vt);
  int s = storage_index(c, r->st);
  if (s < 0) return em_fail(e, TP_RESOURCE_EXHAUSTED, "out of host memory");
  tp_val flat = c->st_cur[s] >= 0 ? c->st_cur[s] : storage_param(e, c, s);
  flat = em_reinterpret(e, flat, r->dt);
  box_plan p;
  if (!plan_box(r, &p)) return em_gather_flat(e, flat, view_indices(e, c, r));
  /* Dense sub-view in stride order. */
  int64_t got;
  tp_val box = box_segment(e, c, flat, r, &p, &got);
  int64_t lim[TP_MAX_RANK + 1], start[TP_MAX_RANK + 1] = {0}, sub[TP_MAX_RANK];
  for (int j = 0; j < p.k; j++) lim[j] = sub[j] = r->sizes[p.order[j]];
  lim[p.k] = 1;
  tp_val v = em_slice(e, box, start, lim, NULL);
  v = em_reshape(e, v, p.k, sub);
  /* Back to dim order: position q takes the stride-ordered dim whose index is q-th smallest. */
  int64_t perm[TP_MAX_RANK], shaped[TP_MAX_RANK];
  int q = 0;
  for (int i = 0; i < r->rank; i++)
    for (int j = 0; j < p.k; j++)
      if (p.order[j] == i) perm[q++] = j;
  v = em_transpose(e, v, perm);
  for (int i = 0; i < r->rank; i++) {
    int used = 0;
    for (int j = 0; j < p.k; j++) used |= p.order[j] == i;
    shaped[i] = used ? r->sizes[i] : 1;
  }
  v = em_reshape(e, v, r->rank, shaped);
  if (p.expanded) {
    int64_t map[TP_MAX_RANK];
    for (int i = 0; i < r->rank; i++) map[i] = i;
    v = em_bcast_in_dim(e, v, &vt, map);
  }
  return v;
}

static int full_cover(const tp_tensor_ref *r) {
  size_t es = tp_dtype_size(r->dt);
  if (r->offset != 0 || (size_t)ref_numel(r) * es != tp_storage_nbytes(r->st)) return 0;
  int64_t expect = 1;
  for (int i = r->rank - 1; i >= 0; i--) {
    if (r->sizes[i] != 1 && r->strides[i] != expect) return 0;
    expect *= r->sizes[i];
  }
  return 1;
}

/* Ops that may write through an expanded view (stride 0 over a dim longer
 * than 1), as PyTorch's CPU kernels allow them (fill_ with a number, zero_):
 * every aliased element gets the same value. */
static int fills(const char *op) { return strcmp(op, "aten::fill_.Scalar") == 0 || strcmp(op, "aten::zero_") == 0; }

static void view_write(tp_emit *e, tp_lower_ctx *c, const tp_tensor_ref *r, tp_val v, int fill) {
  if (ref_numel(r) == 0) return;
  int s = storage_index(c, r->st);
  if (s < 0) {
    em_fail(e, TP_RESOURCE_EXHAUSTED, "out of host memory");
    return;
  }
  v = em_convert(e, v, r->dt);
  if (full_cover(r)) {
    int64_t n = ref_numel(r);
    c->st_cur[s] = em_reshape(e, v, 1, &n); /* the storage now holds r->dt elements */
    return;
  }
  tp_val cur = c->st_cur[s] >= 0 ? c->st_cur[s] : storage_param(e, c, s);
  tp_val flat = em_reinterpret(e, cur, r->dt);
  box_plan p;
  if (!plan_box(r, &p) || p.expanded) {
    if (p.expanded && !fill) {
      em_fail(e, TP_INVALID_ARGUMENT,
              "unsupported operation: more than one element of the written-to tensor refers to a single "
              "memory location. Please clone() the tensor before performing the operation.");
      return;
    }
    flat = em_scatter_flat(e, flat, view_indices(e, c, r), v, NULL);
  } else {
    /* Value into stride order, then into the box, then back into the flat value. */
    int64_t sub[TP_MAX_RANK + 1], perm[TP_MAX_RANK], zeros[TP_MAX_RANK + 1] = {0};
    int q = 0;
    int64_t compact[TP_MAX_RANK];
    for (int i = 0; i < r->rank; i++)
      for (int j = 0; j < p.k; j++)
        if (p.order[j] == i) compact[q++] = r->sizes[i];
    v = em_reshape(e, v, p.k, compact);
    /* compact is in dim order; stride order j is at compact position pos(j). */
    for (int j = 0; j < p.k; j++) {
      int pos = 0;
      for (int i = 0; i < p.order[j]; i++)
        for (int jj = 0; jj < p.k; jj++) pos += p.order[jj] == i;
      perm[j] = pos;
      sub[j] = r->sizes[p.order[j]];
    }
    v = em_transpose(e, v, perm);
    sub[p.k] = 1;
    v = em_reshape(e, v, p.k + 1, sub);
    int64_t keep, z = 0;
    tp_val box = box_segment(e, c, flat, r, &p, &keep);
    box = em_update_slice(e, box, v, zeros);
    tp_val seg = em_reshape(e, box, 1, &p.L);
    if (keep < p.L) seg = em_slice(e, seg, &z, &keep, NULL);
    if (dyn_offset(r)) {
      tp_val off = view_offset(e, c, r);
      flat = em_dyn_update_slice(e, flat, seg, &off);
    } else {
      flat = em_update_slice(e, flat, seg, &r->offset);
    }
  }
  c->st_cur[s] = flat;
}

/* ---- runtime scalars ------------------------------------------------------------------ */

static uint16_t f32_to_bf16(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  if ((b & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((b >> 16) | 0x40); /* quiet NaN */
  b += 0x7fffu + ((b >> 16) & 1u);
  return (uint16_t)(b >> 16);
}

static uint16_t f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t mag = x & 0x7fffffffu;
  if (mag > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
  if (mag >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* overflow (incl. rounding) -> inf */
  if (mag < 0x38800000u) {                                      /* subnormal or zero in f16 */
    float a;
    memcpy(&a, &mag, 4);
    /* a / 2^-24 rounded to nearest even */
    float q = a * 16777216.0f;
    uint32_t r = (uint32_t)q;
    float frac = q - (float)r;
    if (frac > 0.5f || (frac == 0.5f && (r & 1u))) r++;
    return (uint16_t)(sign | r);
  }
  uint32_t e = ((mag >> 23) - 112u) << 10;
  uint32_t m = (mag >> 13) & 0x3ffu;
  uint32_t h = e | m;
  uint32_t rest = mag & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
  return (uint16_t)(sign | h);
}

/* Host bytes of a scalar argument converted to `dt` (C conversions, which
 * match PyTorch's for in-range values). */
static void scalar_bytes(const tp_arg *a, tp_dtype dt, unsigned char out[16]) {
  int isf = tp_dtype_is_float(a->sdt) || tp_dtype_is_complex(a->sdt);
  int above_i64 = !isf && a->i < 0 && a->f > 0; /* .i holds an integer above INT64_MAX as uint64 bits */
  double f = isf || above_i64 ? a->f : (double)a->i;
  int64_t i = isf ? (int64_t)a->f : a->i;
  memset(out, 0, 16);
  switch (dt) {
    case TP_BOOL: out[0] = isf ? f != 0 : i != 0; break;
    case TP_U8: { uint8_t v = (uint8_t)i; memcpy(out, &v, 1); } break;
    case TP_I8: { int8_t v = (int8_t)i; memcpy(out, &v, 1); } break;
    case TP_I16: { int16_t v = (int16_t)i; memcpy(out, &v, 2); } break;
    case TP_U16: { uint16_t v = (uint16_t)i; memcpy(out, &v, 2); } break;
    case TP_I32: { int32_t v = (int32_t)i; memcpy(out, &v, 4); } break;
    case TP_U32: { uint32_t v = (uint32_t)i; memcpy(out, &v, 4); } break;
    case TP_I64: case TP_U64: memcpy(out, &i, 8); break;
    case TP_F16: { uint16_t v = f32_to_f16((float)f); memcpy(out, &v, 2); } break;
    case TP_BF16: { uint16_t v = f32_to_bf16((float)f); memcpy(out, &v, 2); } break;
    case TP_F32: { float v = (float)f; memcpy(out, &v, 4); } break;
    case TP_F64: memcpy(out, &f, 8); break;
    case TP_C64: { float v[2] = {(float)f, (float)a->fi}; memcpy(out, v, 8); } break;
    case TP_C128: { double v[2] = {f, a->fi}; memcpy(out, v, 16); } break;
    default: break;
  }
}

/* Uploaded scalars, reused: a two-way set-associative table keyed by
 * (device, dtype, bytes), the least recently used way replaced.  A loop's
 * positions (view offsets, roll shifts) are scalars of this kind, one per
 * step value: 4096 slots keep a few thousand of them. */
#define NSCALARS 4096
static struct {
  tp_buffer *buf;
  uint64_t used; /* g_scalar_tick at the last use */
  int device;
  tp_dtype dt;
  unsigned char bytes[16];
} g_scalars[NSCALARS];
static uint64_t g_scalar_tick;

/* `busy`/`nbusy`: slots already passed to this call's execution; such a
 * slot is not replaced (its buffer is in use): the scalar is uploaded
 * uncached instead and *owned is set (the caller frees it after launching). */
static tp_status *scalar_buffer(tp_plugin *p, int device, const tp_arg *a, tp_dtype dt, size_t *busy, int *nbusy,
                                tp_buffer **out, int *owned) {
  unsigned char b[16];
  scalar_bytes(a, dt, b);
  uint64_t h = hash_bytes(b, 16) ^ ((uint64_t)dt * 31u + (uint64_t)device * 1000003u);
  size_t set = (h % (NSCALARS / 2)) * 2;
  *owned = 0;
  for (size_t slot = set; slot < set + 2; slot++)
    if (g_scalars[slot].buf && g_scalars[slot].device == device && g_scalars[slot].dt == dt &&
        !memcmp(g_scalars[slot].bytes, b, 16)) {
      g_scalars[slot].used = ++g_scalar_tick;
      *out = g_scalars[slot].buf;
      busy[(*nbusy)++] = slot;
      return NULL;
    }
  tp_buffer *nb = NULL;
  TP_RETURN_IF_ERROR(tp_buffer_from_host(p, device, dt, NULL, 0, b, &nb));
  g_stats.h2d_transfers++;
  g_stats.h2d_bytes += (int64_t)tp_dtype_size(dt);
  int free_way[2] = {1, 1};
  for (int i = 0; i < *nbusy; i++)
    if (busy[i] >= set && busy[i] < set + 2) free_way[busy[i] - set] = 0;
  if (!free_way[0] && !free_way[1]) {
    *out = nb;
    *owned = 1;
    return NULL;
  }
  size_t slot = !free_way[0] ? set + 1
                : !free_way[1] ? set
                : g_scalars[set].used <= g_scalars[set + 1].used ? set : set + 1;
  busy[(*nbusy)++] = slot;
  tp_buffer_free(g_scalars[slot].buf);
  g_scalars[slot].buf = nb;
  g_scalars[slot].used = ++g_scalar_tick;
  g_scalars[slot].device = device;
  g_scalars[slot].dt = dt;
  memcpy(g_scalars[slot].bytes, b, 16);
  *out = nb;
  return NULL;
}

/* ---- keys ------------------------------------------------------------------------------- */

static void key_ref(kbuf *k, tp_lower_ctx *c, const tp_tensor_ref *r) {
  int s = storage_index(c, r->st);
  kb_i64(k, s);
  kb_i64(k, r->dt);
  kb_i64(k, r->rank);
  kb_put(k, r->sizes, sizeof(int64_t) * (size_t)r->rank);
  kb_put(k, r->strides, sizeof(int64_t) * (size_t)r->rank);
  kb_i64(k, dyn_offset(r) ? -1 : r->offset); /* -1: a runtime operand (view_offset) */
}

/* seg[i]: where argument i's bytes start (seg[nargs]: the outputs'), for
 * naming the argument a recompile varied (note_recompile); NULL: not needed. */
static void build_key(kbuf *k, tp_lower_ctx *c, const char *op, const tp_eager_arg *args, int nargs,
                      const tp_type *out_types, const tp_tensor_ref *outs, int nouts, size_t *seg) {
  kb_put(k, op, strlen(op) + 1);
  for (int i = 0; i < nargs; i++) {
    if (seg) seg[i] = k->len;
    const tp_arg *a = &args[i].a;
    kb_i64(k, a->kind);
    if (a->kind == TP_ARG_TENSOR) {
      key_ref(k, c, args[i].t);
    } else if (a->kind == TP_ARG_TENSORS) {
      kb_i64(k, a->n);
      for (int j = 0; j < a->n; j++) {
        if (args[i].ts[j]) key_ref(k, c, args[i].ts[j]);
        else kb_i64(k, -1);
      }
    } else {
      key_value_arg(k, a, is_runtime_int(c, i));
    }
  }
  if (seg) seg[nargs] = k->len;
  for (int i = 0; i < nouts; i++) {
    key_ref(k, c, &outs[i]);
    if (out_types) {
      kb_i64(k, out_types[i].dt);
      kb_i64(k, out_types[i].rank);
      kb_put(k, out_types[i].dims, sizeof(int64_t) * (size_t)out_types[i].rank);
    }
  }
  /* The old buffer of a storage that is only overwritten does not shape
   * the program. */
  for (int s = 0; s < c->nst; s++) {
    kb_i64(k, c->st_read[s] ? c->st_dt[s] : -2);
    kb_i64(k, c->st_read[s] ? c->st_numel[s] : -2);
    kb_i64(k, c->st_zero[s]);
  }
}

/* ---- persistent cache ---------------------------------------------------------------------- */

#define TP_VERSION "torch-pjrt 0.1.0"

tp_status *tp_eager_set_disk_cache(const char *dir, int64_t cap_bytes) {
  tp_plugin *p = tp_runtime_plugin();
  if (!p) return tp_error(TP_FAILED_PRECONDITION, "the tpu runtime is not initialised");
  /* What must match for an executable to be reused: our version, the
   * plugin's platform, API and XLA version, the plugin file itself, and the
   * environment variables through which XLA's compiler options reach the
   * plugin (XLA_FLAGS changes code generation, fast math for one). */
  struct stat sb;
  long long size = stat(tp_plugin_path(p), &sb) == 0 ? (long long)sb.st_size : -1;
  long long mtime = size >= 0 ? (long long)sb.st_mtime : -1;
  const char *xla_flags = getenv("XLA_FLAGS"), *tpu_args = getenv("LIBTPU_INIT_ARGS");
  const char *fmt = "%s; plugin %s api %s xla %s; %s %lld %lld; XLA_FLAGS=%s; LIBTPU_INIT_ARGS=%s";
  int n = snprintf(NULL, 0, fmt, TP_VERSION, tp_plugin_platform(p), tp_plugin_api_version(p),
                   tp_plugin_xla_version(p), tp_plugin_path(p), size, mtime, xla_flags ? xla_flags : "",
                   tpu_args ? tpu_args : "");
  char *version = n >= 0 ? malloc((size_t)n + 1) : NULL;
  if (!version) return tp_error(TP_RESOURCE_EXHAUSTED, "out of memory opening the compilation cache");
  snprintf(version, (size_t)n + 1, fmt, TP_VERSION, tp_plugin_platform(p), tp_plugin_api_version(p),
           tp_plugin_xla_version(p), tp_plugin_path(p), size, mtime, xla_flags ? xla_flags : "",
           tpu_args ? tpu_args : "");
  tp_diskcache *c = NULL;
  tp_status *st = dir && dir[0] ? tp_diskcache_open(dir, cap_bytes, version, &c) : NULL;
  free(version);
  if (st) return st;
  tp_storage_lock();
  tp_diskcache_close(g_disk);
  g_disk = c;
  tp_storage_unlock();
  return NULL;
}

int tp_eager_disk_cache_error(char *buf, size_t cap) {
  tp_storage_lock();
  int had = g_disk_err[0] != 0;
  if (had) snprintf(buf, cap, "%s", g_disk_err);
  g_disk_err[0] = 0;
  tp_storage_unlock();
  return had;
}

static void disk_warn(tp_status *st) {
  snprintf(g_disk_err, sizeof g_disk_err, "%s", tp_status_message(st));
  tp_status_free(st);
}

/* Compile `text`, or load it from the disk cache.  A stored executable the
 * plugin refuses to load counts as a miss and is recompiled and replaced. */
static tp_status *compile_cached(tp_plugin *p, int device, const char *name, const char *text,
                                 tp_exec **out) {
  size_t len = strlen(text);
  if (g_disk) {
    void *blob = NULL;
    size_t blen = 0;
    tp_status *st = tp_diskcache_get(g_disk, text, len, &blob, &blen);
    if (st) disk_warn(st);
    if (blob) {
      int64_t t0 = now_ns();
      tp_trace_rec *rec = tp_trace_begin(TP_TRACE_CACHE_LOAD, device, name, (int64_t)blen);
      st = tp_exec_deserialize(p, blob, blen, out);
      tp_trace_end(rec);
      free(blob);
      g_stats.load_ns += now_ns() - t0;
      if (!st) {
        g_stats.disk_hits++;
        tp_exec_set_name(*out, name);
        return NULL;
      }
      tp_status_free(st);
    }
    g_stats.disk_misses++;
  }
  int64_t t0 = now_ns();
  tp_trace_rec *rec = tp_trace_begin(TP_TRACE_COMPILE, device, name, (int64_t)len);
  tp_status *st = tp_compile(p, text, len, out);
  tp_trace_end(rec);
  g_stats.compile_ns += now_ns() - t0;
  g_stats.compiles++;
  if (!st) tp_exec_set_name(*out, name);
  if (st || !g_disk) return st;
  void *ser = NULL;
  size_t slen = 0;
  tp_status *ws = tp_exec_serialize(*out, &ser, &slen);
  if (!ws) ws = tp_diskcache_put(g_disk, text, len, ser, slen);
  free(ser);
  if (ws) disk_warn(ws);
  else g_stats.disk_writes++;
  return NULL;
}

/* ---- recompiles ---------------------------------------------------------------------------
 *
 * A loop that hands an op a new value of an argument its program bakes in
 * (a shape, or an integer that shapes the result) compiles a program per
 * value.  Each compile counts, for each argument i, under the hash of its
 * key without argument i (and without the outputs and storages, which
 * follow the arguments): that count is the number of programs that differ
 * in argument i only.  At RECOMPILE_WARN_AT (RECOMPILE_WARN_AT_SHAPES for
 * a tensor's shape) the next note names the op and the argument (tp_eager_recompile_note; Python words it as a warning),
 * once per (op, argument). */
#define RECOMPILE_WARN_AT 8
#define RECOMPILE_WARN_AT_SHAPES 64 /* a model's parameters give full_like or an optimizer's ops dozens of shapes */
#define MAX_TRACKED_ARGS 32

static struct {
  uint64_t *key; /* 0: empty */
  int *count;    /* -1: an (op, argument) already reported */
  size_t cap, n;
} g_vary;
static char g_recompile_op[128];
static int g_recompile_arg = -1, g_recompile_count, g_recompile_tensor;
static _Atomic int g_recompile_pending;

/* The count stored under h (added as 0 if new); NULL if out of memory. */
static int *vary_slot(uint64_t h) {
  if (!h) h = 1;
  if (2 * (g_vary.n + 1) > g_vary.cap) {
    size_t cap = g_vary.cap ? g_vary.cap * 2 : 1024;
    uint64_t *k = calloc(cap, sizeof *k);
    int *c = calloc(cap, sizeof *c);
    if (!k || !c) {
      free(k);
      free(c);
      return NULL;
    }
    for (size_t i = 0; i < g_vary.cap; i++)
      if (g_vary.key[i]) {
        size_t j = g_vary.key[i] & (cap - 1);
        while (k[j]) j = (j + 1) & (cap - 1);
        k[j] = g_vary.key[i];
        c[j] = g_vary.count[i];
      }
    free(g_vary.key);
    free(g_vary.count);
    g_vary.key = k;
    g_vary.count = c;
    g_vary.cap = cap;
  }
  size_t j = h & (g_vary.cap - 1);
  while (g_vary.key[j] && g_vary.key[j] != h) j = (j + 1) & (g_vary.cap - 1);
  if (!g_vary.key[j]) {
    g_vary.key[j] = h;
    g_vary.n++;
  }
  return &g_vary.count[j];
}

static uint64_t mix(uint64_t h, uint64_t v) { return (h ^ v) * 0x100000001b3ull + (h >> 29); }

static void note_recompile(const char *op, const tp_eager_arg *args, const kbuf *k, const size_t *seg, int nargs) {
  if (g_vary.n > (1u << 18)) recompiles_clear_locked(); /* bounded: a long run starts counting anew */
  uint64_t oph = hash_bytes((const unsigned char *)op, strlen(op));
  for (int i = 0; i < nargs; i++) {
    uint64_t before = hash_bytes(k->p, seg[i]), after = hash_bytes(k->p + seg[i + 1], seg[nargs] - seg[i + 1]);
    int *done = vary_slot(mix(mix(oph, (uint64_t)i), 0x5eed)); /* this (op, argument) was reported */
    int *n = vary_slot(mix(mix(mix(before, after), (uint64_t)i), 0xa11));
    if (!done || !n || *done) continue;
    int tensor = args[i].a.kind == TP_ARG_TENSOR || args[i].a.kind == TP_ARG_TENSORS;
    if (++*n >= (tensor ? RECOMPILE_WARN_AT_SHAPES : RECOMPILE_WARN_AT)) {
      *done = 1;
      snprintf(g_recompile_op, sizeof g_recompile_op, "%s", op);
      g_recompile_arg = i;
      g_recompile_count = *n;
      g_recompile_tensor = tensor;
      g_recompile_pending = 1;
    }
  }
}

static void recompiles_clear_locked(void) {
  free(g_vary.key);
  free(g_vary.count);
  memset(&g_vary, 0, sizeof g_vary);
  g_recompile_arg = -1;
  g_recompile_pending = 0;
}

int tp_eager_recompile_note(char *op, size_t cap, int *arg, int *count, int *is_tensor) {
  tp_storage_lock();
  int had = g_recompile_arg >= 0;
  if (had) {
    snprintf(op, cap, "%s", g_recompile_op);
    *arg = g_recompile_arg;
    *count = g_recompile_count;
    *is_tensor = g_recompile_tensor;
  }
  g_recompile_arg = -1;
  g_recompile_pending = 0;
  tp_storage_unlock();
  return had;
}

int tp_eager_recompile_pending(void) { return g_recompile_pending; }

/* ---- build ----------------------------------------------------------------------------- */


static tp_status *build_entry(tp_plugin *p, tp_lower_ctx *c, const char *op, tp_lower_fn fn, const tp_eager_arg *args,
                              int nargs, const tp_type *out_types, const tp_tensor_ref *outs, int nouts,
                              entry **out) {
  tp_status *st = NULL;
  tp_emit *e = em_new();
  tp_arg *la = calloc((size_t)nargs + 1, sizeof(tp_arg));
  tp_val **lists = calloc((size_t)nargs + 1, sizeof(tp_val *));
  tp_type *ot = calloc((size_t)nouts + 1, sizeof(tp_type));
  tp_val *ov = calloc((size_t)nouts + 1, sizeof(tp_val));
  tp_val *res = calloc((size_t)c->nst + 1, sizeof(tp_val));
  entry *en = calloc(1, sizeof(entry));
  if (!e || !la || !lists || !ot || !ov || !res || !en) {
    st = tp_error(TP_RESOURCE_EXHAUSTED, "out of host memory building %s", op);
    goto done;
  }
  em_set_cpu_codegen(e, tp_plugin_is_cpu(p));
  en->check_storage = -1;
  static const int64_t zeros[TP_MAX_RANK * 8];
  for (int i = 0; i < nargs; i++) {
    la[i] = args[i].a;
    if (is_runtime_int(c, i)) { /* not in the key: the rule sees zeros, reads the values with lw_runtime_int */
      la[i].i = 0;
      if (la[i].kind == TP_ARG_INTS && la[i].n > (int)(sizeof zeros / sizeof zeros[0])) {
        st = tp_error(TP_INVALID_ARGUMENT, "%s: argument %d has more than %d elements", op, i,
                      (int)(sizeof zeros / sizeof zeros[0]));
        goto done;
      }
      la[i].ints = zeros;
    }
    if (la[i].kind == TP_ARG_TENSOR) la[i].v = view_read(e, c, args[i].t);
    if (la[i].kind == TP_ARG_TENSORS) {
      lists[i] = calloc((size_t)la[i].n + 1, sizeof(tp_val));
      if (!lists[i]) {
        st = tp_error(TP_RESOURCE_EXHAUSTED, "out of host memory");
        goto done;
      }
      for (int j = 0; j < la[i].n; j++) lists[i][j] = args[i].ts[j] ? view_read(e, c, args[i].ts[j]) : -1;
      la[i].vs = lists[i];
    }
  }
  for (int i = 0; i < nouts; i++) {
    ot[i] = out_types ? out_types[i] : tp_type_make(outs[i].dt, outs[i].rank, outs[i].sizes);
    ov[i] = -1;
  }
  tp_node n = {op, nargs, la, nouts, ot, c, cb_scalar, cb_rng_key, cb_check, cb_runtime_int, cb_host_check};
  tp_lower_run(fn, e, &n, ov);
  for (int i = 0; i < nouts && !em_failed(e); i++) {
    if (ov[i] < 0) {
      em_fail(e, TP_INTERNAL, "lowering of %s produced no value for output %d", op, i);
      break;
    }
    const tp_type *vt = em_type(e, ov[i]);
    int same = vt->rank == outs[i].rank;
    for (int d = 0; same && d < vt->rank; d++) same = vt->dims[d] == outs[i].sizes[d];
    if (!same) {
      char a[256], b[256];
      tp_type want = tp_type_make(outs[i].dt, outs[i].rank, outs[i].sizes);
      em_fail(e, TP_INTERNAL, "lowering of %s produced %s for output %d, expected shape of %s", op,
              tp_type_str(vt, a, sizeof a), i, tp_type_str(&want, b, sizeof b));
      break;
    }
    view_write(e, c, &outs[i], ov[i], fills(op));
  }
  if (!em_failed(e) && c->nchecks > 0 && (st = emit_flag_update(p, e, c, op, en)) != NULL) goto done;
  int nres = 0;
  en->res_storage = calloc((size_t)c->nst + 1, sizeof(int));
  en->donate = calloc((size_t)c->nparams + 1, 1);
  int *param_of = malloc(sizeof(int) * ((size_t)c->nst + 1)); /* storage -> its parameter, -1: none */
  if (!en->res_storage || !en->donate || !param_of) {
    free(param_of);
    st = tp_error(TP_RESOURCE_EXHAUSTED, "out of host memory");
    goto done;
  }
  for (int s = 0; s < c->nst; s++) param_of[s] = -1;
  for (int q = 0; q < c->nparams; q++)
    if (c->params[q].kind == SRC_STORAGE) param_of[c->params[q].idx] = q;
  /* A storage the op reads and writes (in-place ops, outputs that are
   * views): its old buffer is donated to the new one, so XLA may update it
   * in place instead of allocating. */
  for (int s = 0; s < c->nst; s++)
    if (c->st_cur[s] >= 0) {
      int q = param_of[s];
      if (q >= 0 && tp_type_numel(em_type(e, c->st_param[s])) == tp_type_numel(em_type(e, c->st_cur[s])) &&
          em_type(e, c->st_param[s])->dt == em_type(e, c->st_cur[s])->dt) {
        em_param_alias(e, q, nres);
        en->donate[q] = 1;
      }
      res[nres] = c->st_cur[s];
      en->res_storage[nres++] = s;
    }
  free(param_of);
  const char *text = em_finish(e, res, nres);
  if (!text) {
    st = em_take_error(e);
    if (!st) st = tp_error(TP_INTERNAL, "could not build a program for %s", op);
    goto done;
  }
  const char *dump = getenv("TORCH_PJRT_DUMP_MLIR");
  if (dump && dump[0] == '1') fprintf(stderr, "// torch-pjrt program for %s\n%s\n", op, text);
  char name[96];
  if (!strcmp(op, "tp::graph") && nargs > 0 && args[0].a.kind == TP_ARG_INT)
    snprintf(name, sizeof name, "tp::graph %lld", (long long)args[0].a.i);
  else
    snprintf(name, sizeof name, "%s", op);
  st = compile_cached(p, c->device, name, text, &en->exec);
  if (st) {
    st = tp_error_wrap(st, "compiling %s (set TORCH_PJRT_DUMP_MLIR=1 to see the program)", op);
    goto done;
  }
  en->nres = nres;
  en->nparams = c->nparams;
  en->params = c->params;
  c->params = NULL;
  c->nparams = c->capparams = 0;
  en->hchecks = c->hchecks;
  en->nhchecks = c->nhchecks;
  c->hchecks = NULL;
  c->nhchecks = 0;
  for (int i = 0; i < nouts; i++) {
    int64_t m = ref_numel(&outs[i]);
    en->rng_count += (uint64_t)(m > 0 ? m : 1);
  }
  *out = en;
  en = NULL;
done:
  if (lists)
    for (int i = 0; i < nargs; i++) free(lists[i]);
  free(lists);
  free(la);
  free(ot);
  free(ov);
  free(res);
  entry_free(en);
  em_free(e);
  return st;
}

/* ---- run -------------------------------------------------------------------------------- */

static tp_status *need_read(tp_lower_ctx *c, const tp_tensor_ref *r) {
  int s = storage_index(c, r->st);
  if (s < 0) return tp_error(TP_RESOURCE_EXHAUSTED, "out of host memory");
  if (ref_numel(r) == 0) return NULL;
  c->st_read[s] = 1;
  if (!tp_storage_buffer(r->st) && !c->st_zero[s]) {
    /* Never written (torch.empty): the program reads zeros, as the first
     * dtype it is read as that divides the storage, else as bytes. */
    size_t nb = tp_storage_nbytes(r->st), es = tp_dtype_size(r->dt);
    int bytes = !es || nb % es;
    c->st_zero[s] = 1;
    c->st_dt[s] = bytes ? TP_U8 : r->dt;
    c->st_numel[s] = (int64_t)(bytes ? nb : nb / es);
  }
  return NULL;
}

/* PyTorch's checked conversion of a scalar argument to the output dtype
 * (c10::checked_convert): integers must be in range (unsigned ones may wrap
 * from negatives down to -max); finite values must not exceed a float
 * type's largest finite value; bool, float64 and complex128 take anything. */
static tp_status *check_scalar_fits(const tp_arg *a, tp_dtype dt) {
  int isf = tp_dtype_is_float(a->sdt) || tp_dtype_is_complex(a->sdt);
  double v = a->f; /* an integer's value too: .i holds integers above INT64_MAX as uint64 bits */
  const char *name = NULL;
  double lo = 0, hi = 0;
  switch (dt) {
    case TP_I8: name = "int8_t", lo = INT8_MIN, hi = INT8_MAX; break;
    case TP_I16: name = "int16_t", lo = INT16_MIN, hi = INT16_MAX; break;
    case TP_I32: name = "int", lo = INT32_MIN, hi = INT32_MAX; break;
    case TP_I64: name = "int64_t", lo = -0x1p63, hi = 0x1p63; break;
    case TP_U8: name = "uint8_t", hi = UINT8_MAX; break;
    case TP_U16: name = "uint16_t", hi = UINT16_MAX; break;
    case TP_U32: name = "uint32_t", hi = UINT32_MAX; break;
    case TP_U64: name = "uint64_t", hi = 0x1p64; break;
    case TP_F16: name = "c10::Half", hi = 65504.0; break;
    case TP_BF16: name = "c10::BFloat16", hi = 0x1.fep127; break;
    case TP_F32: name = "float", hi = FLT_MAX; break;
    case TP_C64: name = "c10::complex<float>", hi = FLT_MAX; break;
    case TP_F8E4M3FN: name = "c10::Float8_e4m3fn", hi = 448.0; break;
    case TP_F8E5M2: name = "c10::Float8_e5m2", hi = 57344.0; break;
    case TP_F8E4M3FNUZ: name = "c10::Float8_e4m3fnuz", hi = 240.0; break;
    case TP_F8E5M2FNUZ: name = "c10::Float8_e5m2fnuz", hi = 57344.0; break;
    default: return NULL;
  }
  int bad;
  if (!isf && dt == TP_I64) bad = v > 0 && a->i < 0; /* only above INT64_MAX (which is 2^63 as a double) */
  else if (!isf && dt == TP_U64) bad = 0;              /* any 64-bit integer (negatives wrap) */
  else if (!tp_dtype_is_int(dt)) bad = isfinite(v) && fabs(v) > hi;
  else if (isnan(v)) bad = 1;
  else if (tp_dtype_is_unsigned(dt)) bad = dt == TP_U64 ? fabs(v) >= hi : fabs(v) > hi;
  else bad = v < lo || (dt == TP_I64 ? v >= hi : v > hi); /* the int64 bound is 2^63 */
  return bad ? tp_error(TP_INVALID_ARGUMENT, "value cannot be converted to type %s without overflow", name) : NULL;
}

/* The program's host checks (host_check) on the arguments whose values the
 * host has: the first offending value, in row-major order, raises here. */
static tp_status *run_host_checks(const entry *en, const tp_eager_arg *args, int nargs) {
  for (int k = 0; k < en->nhchecks; k++) {
    const host_check *h = &en->hchecks[k];
    if (h->arg >= nargs || args[h->arg].a.kind != TP_ARG_TENSOR) continue;
    const tp_tensor_ref *r = args[h->arg].t;
    tp_dtype dt;
    const void *vals = tp_storage_host_copy(r->st, &dt);
    if (!vals || dt != r->dt || (dt != TP_I64 && dt != TP_I32)) continue;
    tp_status *outside = check_in_storage(r); /* the launch reports it */
    if (outside) {
      tp_status_free(outside);
      continue;
    }
    /* the view's elements in row-major order (any strides: expanded and
     * sliced index views too), read from the storage's copy */
    int64_t n = ref_numel(r), pos[TP_MAX_RANK] = {0}, at = r->offset;
    for (int64_t i = 0; i < n; i++) {
      int64_t v = dt == TP_I64 ? ((const int64_t *)vals)[at] : ((const int32_t *)vals)[at];
      if (v < h->lo || v >= h->hi) {
        char text[600];
        check_text(h->msg, v, text, sizeof text);
        return tp_error(h->code, "%s", text);
      }
      for (int d = r->rank - 1; d >= 0; d--) {
        at += r->strides[d];
        if (++pos[d] < r->sizes[d]) break;
        at -= r->strides[d] * r->sizes[d];
        pos[d] = 0;
      }
    }
  }
  return NULL;
}

static tp_status *run_locked(tp_plugin *p, tp_lower_ctx *c, const char *op, const tp_eager_arg *args, int nargs,
                             const tp_type *out_types, const tp_tensor_ref *outs, int nouts) {
  unsigned flags;
  tp_lower_fn fn = tp_lower_find_ex(op, &flags);
  if (!fn) return tp_error(TP_UNIMPLEMENTED, "no lowering for %s", op);
  for (int i = 0; i < nargs && i < 16 && nouts > 0; i++)
    if ((flags & TP_FITS(i)) && args[i].a.kind == TP_ARG_SCALAR)
      TP_RETURN_IF_ERROR(check_scalar_fits(&args[i].a, outs[0].dt));
  c->flags = flags;
  int device = -1;
  c->args = args;
  c->nargs = nargs;
  c->outs = outs;
  c->nouts = nouts;
  /* Index storages in a fixed order (inputs, then outputs) and note which
   * are read, and which of those have no buffer yet. */
  for (int i = 0; i < nargs; i++) {
    if (args[i].a.kind == TP_ARG_TENSOR) {
      TP_RETURN_IF_ERROR(need_read(c, args[i].t));
      if (device < 0) device = tp_storage_device(args[i].t->st);
    } else if (args[i].a.kind == TP_ARG_TENSORS) {
      for (int j = 0; j < args[i].a.n; j++)
        if (args[i].ts[j]) {
          TP_RETURN_IF_ERROR(need_read(c, args[i].ts[j]));
          if (device < 0) device = tp_storage_device(args[i].ts[j]->st);
        }
    }
  }
  int64_t total_out = 0;
  for (int i = 0; i < nouts; i++) {
    if (storage_index(c, outs[i].st) < 0) return tp_error(TP_RESOURCE_EXHAUSTED, "out of host memory");
    if (!full_cover(&outs[i])) TP_RETURN_IF_ERROR(need_read(c, &outs[i]));
    if (device < 0) device = tp_storage_device(outs[i].st);
    total_out += ref_numel(&outs[i]);
  }
  if (device < 0) device = 0;
  c->device = device;
  for (int s = 0; s < c->nst; s++) {
    tp_buffer *b = tp_storage_buffer(c->st[s]);
    if (b) {
      c->st_dt[s] = tp_buffer_dtype(b);
      c->st_numel[s] = tp_buffer_numel(b);
    } else if (!c->st_zero[s]) {
      c->st_dt[s] = TP_DTYPE_INVALID;
      c->st_numel[s] = -1;
    }
    if (tp_storage_device(c->st[s]) != device)
      return tp_error(TP_INVALID_ARGUMENT,
                      "Expected all tensors to be on the same device, but found at least two devices, tpu:%d and tpu:%d!",
                      device, tp_storage_device(c->st[s]));
  }
  if (nouts > 0 && total_out == 0) return NULL; /* only empty outputs: nothing to compute */

  kbuf k;
  kb_init(&k);
  size_t segb[MAX_TRACKED_ARGS + 1], *seg = nargs <= MAX_TRACKED_ARGS ? segb : NULL;
  build_key(&k, c, op, args, nargs, out_types, outs, nouts, seg);
  if (k.oom) {
    kb_free(&k);
    return tp_error(TP_RESOURCE_EXHAUSTED, "out of host memory");
  }
  uint64_t h = hash_bytes(k.p, k.len);
  entry *en = cache_find(&k, h);
  tp_status *st = NULL;
  int uncached = 0;
  if (en) {
    g_stats.cache_hits++;
    if (en->check_storage >= 0) { /* the program updates the check flag: index it where it was built */
      tp_storage *flag = flag_storage(p, device, &st);
      if (!flag && !st) st = tp_error(TP_RESOURCE_EXHAUSTED, "out of host memory");
      if (!st && storage_index(c, flag) != en->check_storage)
        st = tp_error(TP_INTERNAL, "%s: index check flag at an unexpected position", op);
      if (st) {
        kb_free(&k);
        return st;
      }
    }
  } else {
    g_stats.cache_misses++;
    st = build_entry(p, c, op, fn, args, nargs, out_types, outs, nouts, &en);
    /* The engine's own programs are not tracked: a graph's id varies, and
     * copies (tp::copy, every .to("tpu") of a new shape) follow the data. */
    if (!st && seg && strncmp(op, "tp::", 4)) note_recompile(op, args, &k, seg, nargs);
    if (!st) {
      en->hash = h;
      en->keylen = k.len;
      en->key = malloc(k.len);
      if (en->key) {
        memcpy(en->key, k.p, k.len);
        cache_insert(en);
      } else {
        uncached = 1;
      }
    }
  }
  kb_free(&k);
  if (!st) st = run_host_checks(en, args, nargs);
  if (st) {
    if (uncached) entry_free(en);
    return st;
  }

  /* Gather parameters and run. */
  tp_buffer *inb[256], *tmp[256], *outb[256];
  tp_buffer **in = en->nparams <= 256 ? inb : calloc((size_t)en->nparams, sizeof(tp_buffer *));
  tp_buffer **ob = en->nres <= 256 ? outb : calloc((size_t)en->nres, sizeof(tp_buffer *));
  int ntmp = 0, nbusy = 0;
  size_t busy[256];
  if (!in || !ob) {
    st = tp_error(TP_RESOURCE_EXHAUSTED, "out of host memory");
    goto out;
  }
  for (int i = 0; i < en->nparams && !st; i++) {
    const param_src *ps = &en->params[i];
    if (ps->kind == SRC_STORAGE) {
      in[i] = tp_storage_buffer(c->st[ps->idx]);
    } else if (ps->kind != SRC_RNG) {
      /* a runtime scalar: an argument, the id of the program's first check, a view's offset, or
       * an element of an integer argument */
      tp_arg base = {.kind = TP_ARG_SCALAR, .sdt = TP_I64, .i = en->check_base};
      if (ps->kind == SRC_OFFSET) {
        const tp_tensor_ref *r = ref_at(c, ps->idx);
        if (!r) {
          st = tp_error(TP_INTERNAL, "a program's view %d is not among the op's tensors", ps->idx);
          break;
        }
        if ((st = check_in_storage(r)) != NULL) break;
        base.i = r->offset;
      }
      if (ps->kind == SRC_INT) {
        const tp_arg *ia = &args[ps->idx].a;
        base.i = ia->kind == TP_ARG_INTS ? ia->ints[ps->sub] : ia->i;
      }
      const tp_arg *a = ps->kind == SRC_SCALAR ? &args[ps->idx].a : &base;
      int owned = 0;
      if (nbusy >= 256) { /* more scalars than we track: never reuse a slot */
        st = tp_error(TP_RESOURCE_EXHAUSTED, "too many scalar arguments");
        break;
      }
      st = scalar_buffer(p, device, a, ps->dt, busy, &nbusy, &in[i], &owned);
      if (!st && owned) {
        if (ntmp < 256) tmp[ntmp++] = in[i];
        else st = tp_error(TP_RESOURCE_EXHAUSTED, "too many scalar arguments");
      }
    } else {
      uint64_t key[2];
      if (c->rng) {
        key[0] = c->rng->seed;
        key[1] = c->rng->offset;
        c->rng->offset += en->rng_count;
      } else {
        tp_runtime_rng_advance(device, en->rng_count, &key[0], &key[1]);
      }
      int64_t two = 2;
      st = tp_buffer_from_host(p, device, TP_U64, &two, 1, key, &in[i]);
      if (!st && ntmp < 256) tmp[ntmp++] = in[i];
    }
  }
  if (!st) st = tp_execute(en->exec, device, in, en->nparams, en->donate, ob, en->nres);
  if (!st) {
    g_stats.executions++;
    for (int j = 0; j < en->nres; j++) tp_storage_set_buffer(c->st[en->res_storage[j]], ob[j]);
    if (en->check_storage >= 0) {
      g_flag_dirty[device] = 1;
      if (launch_blocking()) st = check_flag(p, device, FLAG_AT_OP);
    }
  }
out:
  for (int i = 0; i < ntmp; i++) tp_buffer_free(tmp[i]);
  if (in != inb) free(in);
  if (ob != outb) free(ob);
  if (uncached) entry_free(en);
  if (st) st = tp_error_wrap(st, "%s", op);
  return st;
}

tp_status *tp_eager_run(const char *op, const tp_eager_arg *args, int nargs, const tp_type *out_types,
                        const tp_tensor_ref *outs, int nouts) {
  return tp_eager_run_rng(op, args, nargs, out_types, outs, nouts, NULL);
}

tp_status *tp_eager_run_rng(const char *op, const tp_eager_arg *args, int nargs, const tp_type *out_types,
                            const tp_tensor_ref *outs, int nouts, tp_rng_state *rng) {
  tp_plugin *p = tp_runtime_plugin();
  if (!p) return tp_error(TP_FAILED_PRECONDITION, "the tpu runtime is not initialised (import torch_pjrt first)");
  /* The context is large (per-storage tables): reuse one under the lock
   * instead of zeroing a fresh one per op; a nested run gets its own. */
  static tp_lower_ctx g_ctx;
  static int g_ctx_busy;
  tp_storage_lock();
  tp_lower_ctx *c = &g_ctx;
  if (g_ctx_busy) {
    c = calloc(1, sizeof(tp_lower_ctx));
    if (!c) {
      tp_storage_unlock();
      return tp_error(TP_RESOURCE_EXHAUSTED, "out of host memory");
    }
  } else {
    g_ctx_busy = 1;
  }
  clear_tables(c);
  c->nparams = 0; /* keeps its params and checks arrays for reuse */
  c->rng_used = 0;
  c->rng = rng;
  c->nchecks = 0;
  c->nhchecks = 0;
  tp_status *st = run_locked(p, c, op, args, nargs, out_types, outs, nouts);
  if (c == &g_ctx) {
    g_ctx_busy = 0;
  } else {
    free(c->params);
    free(c->checks);
    free(c->hchecks);
    free_tables(c);
    free(c);
  }
  tp_storage_unlock();
  return st;
}

/* ---- host transfers ----------------------------------------------------------------------- */

static tp_tensor_ref dense_ref(tp_storage *s, tp_dtype dt, int rank, const int64_t *sizes) {
  tp_tensor_ref r;
  memset(&r, 0, sizeof r);
  r.st = s;
  r.dt = dt;
  r.rank = rank;
  int64_t stride = 1;
  for (int i = rank - 1; i >= 0; i--) {
    r.sizes[i] = sizes[i];
    r.strides[i] = stride;
    stride *= sizes[i];
  }
  return r;
}

tp_status *tp_eager_copy(const tp_tensor_ref *src, const tp_tensor_ref *dst) {
  tp_eager_arg a;
  memset(&a, 0, sizeof a);
  a.a.kind = TP_ARG_TENSOR;
  a.t = src;
  return tp_eager_run("tp::copy", &a, 1, NULL, dst, 1);
}

int tp_eager_host_values(const tp_tensor_ref *r, void *out, size_t cap) {
  tp_storage_lock();
  tp_dtype dt;
  const void *h = tp_storage_host_copy(r->st, &dt);
  size_t nb = (size_t)ref_numel(r) * tp_dtype_size(r->dt);
  int ok = h && dt == r->dt && full_cover(r) && nb <= cap;
  if (ok) memcpy(out, h, nb);
  tp_storage_unlock();
  return ok;
}

tp_status *tp_eager_write_host(const tp_tensor_ref *dst, const void *host) {
  tp_plugin *p = tp_runtime_plugin();
  if (!p) return tp_error(TP_FAILED_PRECONDITION, "the tpu runtime is not initialised");
  int64_t n = ref_numel(dst);
  if (n == 0) return NULL;
  tp_status *st = NULL;
  int dev = tp_storage_device(dst->st);
  tp_storage_lock();
  if (full_cover(dst)) {
    tp_buffer *b = NULL;
    st = tp_buffer_from_host(p, dev, dst->dt, &n, 1, host, &b);
    if (!st) {
      tp_storage_set_buffer(dst->st, b);
      /* small integer uploads (indices from Python lists and CPU tensors)
       * keep their values on the host too: tp_eager_host_values */
      if (tp_dtype_is_int(dst->dt) && n * (int64_t)tp_dtype_size(dst->dt) <= TP_EAGER_HOST_COPY_MAX)
        tp_storage_set_host_copy(dst->st, dst->dt, host);
      g_stats.h2d_transfers++;
      g_stats.h2d_bytes += n * (int64_t)tp_dtype_size(dst->dt);
    }
  } else {
    tp_storage *tmp = tp_storage_new(dev, (size_t)n * tp_dtype_size(dst->dt));
    if (!tmp) st = tp_error(TP_RESOURCE_EXHAUSTED, "out of host memory");
    tp_tensor_ref src = dense_ref(tmp, dst->dt, dst->rank, dst->sizes);
    if (!st) st = tp_eager_write_host(&src, host);
    if (!st) st = tp_eager_copy(&src, dst);
    tp_storage_free(tmp);
  }
  tp_storage_unlock();
  return st;
}

tp_status *tp_eager_read_host(const tp_tensor_ref *src, void *host) {
  tp_plugin *p = tp_runtime_plugin();
  if (!p) return tp_error(TP_FAILED_PRECONDITION, "the tpu runtime is not initialised");
  int64_t n = ref_numel(src);
  size_t nbytes = (size_t)n * tp_dtype_size(src->dt);
  if (n == 0) return NULL;
  tp_status *st = NULL;
  tp_storage_lock();
  tp_buffer *b = tp_storage_buffer(src->st);
  if (!b) {
    memset(host, 0, nbytes);
  } else if (full_cover(src) && tp_buffer_dtype(b) == src->dt) {
    st = tp_buffer_to_host(b, host, nbytes);
    if (!st) {
      g_stats.d2h_transfers++;
      g_stats.d2h_bytes += (int64_t)nbytes;
    }
  } else {
    tp_storage *tmp = tp_storage_new(tp_storage_device(src->st), nbytes);
    if (!tmp) st = tp_error(TP_RESOURCE_EXHAUSTED, "out of host memory");
    tp_tensor_ref dst = dense_ref(tmp, src->dt, src->rank, src->sizes);
    if (!st) st = tp_eager_copy(src, &dst);
    if (!st) st = tp_eager_read_host(&dst, host);
    tp_storage_free(tmp);
  }
  if (!st) st = check_flag(p, tp_storage_device(src->st), FLAG_IF_READY);
  tp_storage_unlock();
  return st;
}

tp_status *tp_eager_synchronize(int device) {
  TP_RETURN_IF_ERROR(tp_storage_await_all(device));
  tp_plugin *p = tp_runtime_plugin();
  if (!p) return NULL;
  tp_plugin_await_freed(p);
  tp_status *st = NULL;
  tp_storage_lock();
  for (int d = 0; d < g_nflag && !st; d++)
    if (device < 0 || d == device) st = check_flag(p, d, FLAG_WAIT);
  tp_storage_unlock();
  return st;
}

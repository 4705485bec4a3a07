/* test_diskcache.c - the persistent executable cache: round trips, versions,
 * corruption, concurrent writers (threads and processes), LRU eviction,
 * unwritable directories, and a real compiled executable through the cache
 * with the plugin named by $TP_TEST_PLUGIN (see `make ctest`).
 *
 * Everything lives under one mkdtemp directory in /tmp, removed at the end. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ctest.h"
#include "diskcache.h"
#include "pjrt.h"
#include "status.h"

static char g_root[] = "/tmp/tp_diskcache_test_XXXXXX";

/* ---- helpers ------------------------------------------------------------- */

/* A fresh path under the test root (not created). */
static const char *sub(const char *name) {
  static char bufs[8][512];
  static int next;
  char *b = bufs[next++ % 8];
  snprintf(b, 512, "%s/%s", g_root, name);
  return b;
}

static int is_entry(const char *name) {
  size_t n = strlen(name);
  return n == 36 && strcmp(name + 32, ".tpc") == 0;
}

/* Number of entry files in `dir`, their total size, and the path of the
 * last one seen (the only one, when there is one). */
static int list_entries(const char *dir, int64_t *bytes, char *path,
                        size_t cap) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  int64_t total = 0;
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    if (!is_entry(de->d_name)) continue;
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
    struct stat sb;
    if (lstat(p, &sb) == 0) total += sb.st_size;
    if (path) snprintf(path, cap, "%s", p);
    n++;
  }
  closedir(d);
  if (bytes) *bytes = total;
  return n;
}

static int count_entries(const char *dir) {
  return list_entries(dir, NULL, NULL, 0);
}

static int exists(const char *path) {
  struct stat sb;
  return lstat(path, &sb) == 0;
}

static int rm_one(const char *path, const struct stat *sb, int flag,
                  struct FTW *ftw) {
  (void)sb;
  (void)flag;
  (void)ftw;
  remove(path);
  return 0;
}

static void rm_rf(const char *path) {
  nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static void write_file(const char *path, const void *data, size_t n) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  CHECK(fd >= 0);
  if (fd < 0) return;
  CHECK(write(fd, data, n) == (ssize_t)n);
  close(fd);
}

static tp_diskcache *open_cache(const char *dir, int64_t cap,
                                const char *version) {
  tp_diskcache *c = NULL;
  CHECK_OK(tp_diskcache_open(dir, cap, version, &c));
  CHECK(c != NULL);
  return c;
}

static void put_str(tp_diskcache *c, const char *key, const void *data,
                    size_t n) {
  CHECK_OK(tp_diskcache_put(c, key, strlen(key), data, n));
}

/* 1 if `key` hits with exactly `want` (n bytes), 0 on a miss; -1 (and a
 * failed check) on a hit with other bytes. */
static int get_is(tp_diskcache *c, const char *key, const void *want,
                  size_t n) {
  void *data = (void *)1;
  size_t len = 99;
  CHECK_OK(tp_diskcache_get(c, key, strlen(key), &data, &len));
  if (!data) {
    CHECK_EQ_INT(len, 0);
    return 0;
  }
  int ok = len == n && (n == 0 || memcmp(data, want, n) == 0);
  CHECK(ok);
  free(data);
  return ok ? 1 : -1;
}

static tp_diskcache_stats stats_of(tp_diskcache *c) {
  tp_diskcache_stats s;
  tp_diskcache_get_stats(c, &s);
  return s;
}

static void fill(uint8_t *p, size_t n, unsigned seed) {
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; i++) {
    x = x * 1664525u + 1013904223u;
    p[i] = (uint8_t)(x >> 24);
  }
}

/* ---- basic behaviour ----------------------------------------------------- */

TEST(test_round_trip) {
  const char *dir = sub("basic/nested/deeper"); /* created like mkdir -p */
  tp_diskcache *c = open_cache(dir, 0, "v1");
  if (!c) return;
  struct stat sb;
  CHECK(stat(dir, &sb) == 0 && S_ISDIR(sb.st_mode));
  CHECK_EQ_INT(sb.st_mode & 0777, 0700);

  uint8_t blob[3000];
  fill(blob, sizeof blob, 1);
  CHECK_EQ_INT(get_is(c, "k1", blob, sizeof blob), 0);
  put_str(c, "k1", blob, sizeof blob);
  CHECK_EQ_INT(get_is(c, "k1", blob, sizeof blob), 1);
  CHECK_EQ_INT(get_is(c, "k1", blob, sizeof blob), 1);
  tp_diskcache_stats s = stats_of(c);
  CHECK_EQ_INT(s.hits, 2);
  CHECK_EQ_INT(s.misses, 1);
  CHECK_EQ_INT(s.writes, 1);
  CHECK_EQ_INT(s.corrupt_dropped, 0);
  int64_t bytes = 0;
  CHECK_EQ_INT(list_entries(dir, &bytes, NULL, 0), 1);
  CHECK_EQ_INT(s.bytes_on_disk, bytes);
  /* No temporary file is left behind. */
  DIR *d = opendir(dir);
  struct dirent *de;
  int others = 0;
  while (d && (de = readdir(d)) != NULL)
    others += strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0 &&
              !is_entry(de->d_name);
  if (d) closedir(d);
  CHECK_EQ_INT(others, 0);

  /* Replacing an entry keeps one file, with the new bytes. */
  uint8_t blob2[100];
  fill(blob2, sizeof blob2, 2);
  put_str(c, "k1", blob2, sizeof blob2);
  CHECK_EQ_INT(get_is(c, "k1", blob2, sizeof blob2), 1);
  CHECK_EQ_INT(list_entries(dir, &bytes, NULL, 0), 1);
  CHECK_EQ_INT(stats_of(c).bytes_on_disk, bytes);

  /* Empty key and empty payload are fine; binary keys with NULs too. */
  CHECK_OK(tp_diskcache_put(c, NULL, 0, "x", 1));
  CHECK_OK(tp_diskcache_put(c, "e", 1, NULL, 0));
  const char bin[] = {'a', 0, 'b', 0};
  CHECK_OK(tp_diskcache_put(c, bin, sizeof bin, blob, 10));
  void *data = NULL;
  size_t len = 0;
  CHECK_OK(tp_diskcache_get(c, NULL, 0, &data, &len));
  CHECK(data && len == 1 && memcmp(data, "x", 1) == 0);
  free(data);
  CHECK_OK(tp_diskcache_get(c, "e", 1, &data, &len));
  CHECK(data != NULL && len == 0);
  free(data);
  CHECK_OK(tp_diskcache_get(c, bin, sizeof bin, &data, &len));
  CHECK(data && len == 10 && memcmp(data, blob, 10) == 0);
  free(data);
  CHECK_OK(tp_diskcache_get(c, bin, 2, &data, &len)); /* a prefix: other key */
  CHECK(data == NULL);
  tp_diskcache_close(c);

  /* Persistent: a new handle (a new process, as far as the cache knows)
   * sees the entries and measures the directory at open. */
  c = open_cache(dir, 0, "v1");
  if (!c) return;
  CHECK_EQ_INT(get_is(c, "k1", blob2, sizeof blob2), 1);
  CHECK_EQ_INT(list_entries(dir, &bytes, NULL, 0), 4);
  CHECK_EQ_INT(stats_of(c).bytes_on_disk, bytes);
  /* Bad arguments are errors, not crashes. */
  CHECK_ERR(tp_diskcache_get(c, NULL, 3, &data, &len), TP_INVALID_ARGUMENT);
  CHECK_ERR(tp_diskcache_put(c, "k", 1, NULL, 3), TP_INVALID_ARGUMENT);
  CHECK_ERR(tp_diskcache_put(NULL, "k", 1, "x", 1), TP_INVALID_ARGUMENT);
  tp_diskcache_close(c);
  tp_diskcache_close(NULL);
}

TEST(test_miss) {
  tp_diskcache *c = open_cache(sub("miss"), 1 << 20, "v1");
  if (!c) return;
  void *data = (void *)1;
  size_t len = 7;
  CHECK_OK(tp_diskcache_get(c, "nothing", 7, &data, &len));
  CHECK(data == NULL);
  CHECK_EQ_INT(len, 0);
  tp_diskcache_stats s = stats_of(c);
  CHECK_EQ_INT(s.misses, 1);
  CHECK_EQ_INT(s.hits, 0);
  CHECK_EQ_INT(s.bytes_on_disk, 0);
  tp_diskcache_close(c);
}

TEST(test_version_mismatch) {
  const char *dir = sub("versions");
  tp_diskcache *a = open_cache(dir, 0, "torch-pjrt 0.1; plugin cpu 0.81 xla 1");
  tp_diskcache *b = open_cache(dir, 0, "torch-pjrt 0.1; plugin cpu 0.81 xla 2");
  if (!a || !b) return;
  uint8_t x[500], y[700];
  fill(x, sizeof x, 3);
  fill(y, sizeof y, 4);
  put_str(a, "key", x, sizeof x);
  CHECK_EQ_INT(get_is(b, "key", x, sizeof x), 0);
  /* A miss, not corruption, and the other version's entry stays. */
  CHECK_EQ_INT(stats_of(b).corrupt_dropped, 0);
  CHECK_EQ_INT(count_entries(dir), 1);
  put_str(b, "key", y, sizeof y);
  CHECK_EQ_INT(count_entries(dir), 2);
  CHECK_EQ_INT(get_is(a, "key", x, sizeof x), 1);
  CHECK_EQ_INT(get_is(b, "key", y, sizeof y), 1);
  tp_diskcache_close(a);
  tp_diskcache_close(b);
}

/* ---- damaged entries ----------------------------------------------------- */

enum damage {
  TRUNC_HALF, TRUNC_HEADER, TRUNC_EMPTY, FLIP_PAYLOAD, FLIP_KEY, FLIP_MAGIC,
  FLIP_VERSION, TRAILING_BYTE, GARBAGE, HUGE_LENGTH, FUTURE_FORMAT, SYMLINK,
  NDAMAGE
};
static const char *const kDamageNames[] = {
    "truncate to half", "truncate to 10 bytes", "truncate to 0",
    "flip a payload byte", "flip a key byte", "flip a magic byte",
    "flip a version byte", "append a byte", "garbage contents",
    "huge payload length", "unknown format version", "symlink"};

static void damage_file(const char *path, enum damage how, size_t size) {
  int fd = open(path, O_RDWR);
  CHECK(fd >= 0);
  if (fd < 0) return;
  uint8_t b = 0;
  switch (how) {
    case TRUNC_HALF: CHECK(ftruncate(fd, (off_t)size / 2) == 0); break;
    case TRUNC_HEADER: CHECK(ftruncate(fd, 10) == 0); break;
    case TRUNC_EMPTY: CHECK(ftruncate(fd, 0) == 0); break;
    case FLIP_PAYLOAD:
    case FLIP_KEY:
    case FLIP_MAGIC:
    case FLIP_VERSION: {
      /* version "v1" is at 56, key "victim" at 58. */
      off_t off = how == FLIP_PAYLOAD ? (off_t)size - 1
                  : how == FLIP_KEY   ? 60
                  : how == FLIP_MAGIC ? 3
                                      : 57;
      CHECK(pread(fd, &b, 1, off) == 1);
      b ^= 0x10;
      CHECK(pwrite(fd, &b, 1, off) == 1);
      break;
    }
    case TRAILING_BYTE: CHECK(pwrite(fd, &b, 1, (off_t)size) == 1); break;
    case GARBAGE: {
      uint8_t g[5000];
      fill(g, sizeof g, 77);
      CHECK(ftruncate(fd, 0) == 0);
      CHECK(pwrite(fd, g, sizeof g, 0) == (ssize_t)sizeof g);
      break;
    }
    case HUGE_LENGTH: {
      uint8_t big[8] = {0, 0, 0, 0, 0, 0, 0, 0x40}; /* 2^62 */
      CHECK(pwrite(fd, big, 8, 32) == 8);
      break;
    }
    case FUTURE_FORMAT: {
      uint8_t two = 2;
      CHECK(pwrite(fd, &two, 1, 8) == 1);
      break;
    }
    case SYMLINK: break;
    case NDAMAGE: break;
  }
  close(fd);
}

TEST(test_corruption) {
  uint8_t blob[4096];
  fill(blob, sizeof blob, 5);
  char target[600];
  snprintf(target, sizeof target, "%s/symlink_target", g_root);
  for (int how = 0; how < NDAMAGE; how++) {
    char name[32];
    snprintf(name, sizeof name, "corrupt%d", how);
    const char *dir = sub(name);
    tp_diskcache *c = open_cache(dir, 0, "v1");
    if (!c) return;
    put_str(c, "victim", blob, sizeof blob);
    char path[1024] = "";
    int64_t size = 0;
    CHECK_EQ_INT(list_entries(dir, &size, path, sizeof path), 1);
    if (how == SYMLINK) {
      /* A symlink where an entry belongs (to a valid copy of the entry):
       * not something the cache wrote, so dropped; the target survives. */
      CHECK(rename(path, target) == 0);
      CHECK(symlink(target, path) == 0);
    } else {
      damage_file(path, (enum damage)how, (size_t)size);
    }
    if (get_is(c, "victim", blob, sizeof blob) != 0)
      fprintf(stderr, "   damage '%s' was not detected\n", kDamageNames[how]);
    CHECK(!exists(path));
    tp_diskcache_stats s = stats_of(c);
    CHECK_EQ_INT(s.corrupt_dropped, 1);
    CHECK_EQ_INT(s.misses, 1);
    CHECK_EQ_INT(s.hits, 0);
    if (how == SYMLINK) {
      CHECK(exists(target));
      unlink(target);
    }
    /* The cache recovers: the next put and get work. */
    put_str(c, "victim", blob, sizeof blob);
    CHECK_EQ_INT(get_is(c, "victim", blob, sizeof blob), 1);
    tp_diskcache_close(c);
  }
}

/* A file under another key's name with a valid header (what a 128-bit hash
 * collision would look like) is a miss that leaves the file alone. */
TEST(test_other_key_under_name) {
  const char *dir = sub("collision");
  tp_diskcache *c = open_cache(dir, 0, "v1");
  if (!c) return;
  uint8_t x[300];
  fill(x, sizeof x, 6);
  put_str(c, "a", x, sizeof x);
  char pa[1024], pb[1024];
  CHECK_EQ_INT(list_entries(dir, NULL, pa, sizeof pa), 1);
  put_str(c, "b", x, sizeof x);
  /* Find b's file: the entry that is not a's. */
  DIR *d = opendir(dir);
  struct dirent *de;
  pb[0] = '\0';
  while (d && (de = readdir(d)) != NULL) {
    if (!is_entry(de->d_name)) continue;
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
    if (strcmp(p, pa) != 0) snprintf(pb, sizeof pb, "%s", p);
  }
  if (d) closedir(d);
  CHECK(pb[0] != '\0');
  CHECK(rename(pa, pb) == 0); /* a's entry now sits at b's name */
  CHECK_EQ_INT(get_is(c, "b", x, sizeof x), 0);
  CHECK(exists(pb));
  CHECK_EQ_INT(stats_of(c).corrupt_dropped, 0);
  /* b's put replaces it. */
  put_str(c, "b", x, sizeof x);
  CHECK_EQ_INT(get_is(c, "b", x, sizeof x), 1);
  tp_diskcache_close(c);
}

/* ---- concurrency --------------------------------------------------------- */

enum { PROC_ITERS = 50, SIZE_P0 = 200000, SIZE_P1 = 150001 };

/* One writer process: put its own payload under the shared key, read the
 * key back, and insist the bytes are exactly one writer's payload.
 * Returns the number of failures. */
static int writer(const char *dir, int who, const uint8_t *p0,
                  const uint8_t *p1, int64_t *corrupt) {
  tp_diskcache *c = NULL;
  tp_status *st = tp_diskcache_open(dir, 0, "v1", &c);
  if (st) {
    fprintf(stderr, "   writer %d: %s\n", who, tp_status_message(st));
    tp_status_free(st);
    return 1;
  }
  int bad = 0;
  for (int i = 0; i < PROC_ITERS; i++) {
    st = who ? tp_diskcache_put(c, "shared", 6, p1, SIZE_P1)
             : tp_diskcache_put(c, "shared", 6, p0, SIZE_P0);
    if (st) {
      fprintf(stderr, "   writer %d put: %s\n", who, tp_status_message(st));
      tp_status_free(st);
      bad++;
    }
    void *data = NULL;
    size_t len = 0;
    st = tp_diskcache_get(c, "shared", 6, &data, &len);
    if (st || !data) {
      bad++;
    } else if (!(len == SIZE_P0 && memcmp(data, p0, len) == 0) &&
               !(len == SIZE_P1 && memcmp(data, p1, len) == 0)) {
      fprintf(stderr, "   writer %d read torn data (%zu bytes)\n", who, len);
      bad++;
    }
    tp_status_free(st);
    free(data);
  }
  *corrupt = stats_of(c).corrupt_dropped;
  tp_diskcache_close(c);
  return bad;
}

TEST(test_two_processes_same_key) {
  const char *dir = sub("procs");
  uint8_t *p0 = malloc(SIZE_P0), *p1 = malloc(SIZE_P1);
  CHECK(p0 && p1);
  if (!p0 || !p1) {
    free(p0);
    free(p1);
    return;
  }
  fill(p0, SIZE_P0, 10);
  fill(p1, SIZE_P1, 11);
  int go[2];
  CHECK(pipe(go) == 0);
  fflush(NULL);
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    char ch;
    close(go[1]);
    if (read(go[0], &ch, 1) < 0) _exit(99); /* wait for the start */
    int64_t corrupt = 0;
    int bad = writer(dir, 1, p0, p1, &corrupt);
    _exit(bad || corrupt ? 1 : 0);
  }
  close(go[0]);
  close(go[1]); /* EOF in the child: go */
  int64_t corrupt = 0;
  int bad = writer(dir, 0, p0, p1, &corrupt);
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  CHECK_EQ_INT(bad, 0);
  CHECK_EQ_INT(corrupt, 0);
  /* One entry, no temporaries, and it reads back as one writer's bytes. */
  CHECK_EQ_INT(count_entries(dir), 1);
  tp_diskcache *c = open_cache(dir, 0, "v1");
  if (c) {
    void *data = NULL;
    size_t len = 0;
    CHECK_OK(tp_diskcache_get(c, "shared", 6, &data, &len));
    CHECK(data != NULL);
    CHECK((len == SIZE_P0 && memcmp(data, p0, len) == 0) ||
          (len == SIZE_P1 && memcmp(data, p1, len) == 0));
    free(data);
    tp_diskcache_close(c);
  }
  DIR *d = opendir(dir);
  struct dirent *de;
  int tmps = 0;
  while (d && (de = readdir(d)) != NULL)
    tmps += strncmp(de->d_name, ".tpc-tmp-", 9) == 0;
  if (d) closedir(d);
  CHECK_EQ_INT(tmps, 0);
  free(p0);
  free(p1);
}

static tp_diskcache *g_thread_cache;
static int g_thread_strict; /* 1: no eviction expected, every read must hit */

/* Each thread writes its own keys and one shared key, reading each back.
 * A hit must be exactly one writer's bytes; with eviction pressure a miss
 * is allowed (another thread's writes may make ours least recently used).
 * Returns 1 when all was well. */
static void *thread_body(void *arg) {
  int t = (int)(intptr_t)arg;
  uint8_t mine[2000], all[4][2000];
  for (int u = 0; u < 4; u++) fill(all[u], sizeof all[u], 100 + (unsigned)u);
  memcpy(mine, all[t], sizeof mine);
  int ok = 1;
  char key[32];
  for (int i = 0; i < 30; i++) {
    snprintf(key, sizeof key, "t%d-%d", t, i % 5);
    tp_status *st = tp_diskcache_put(g_thread_cache, key, strlen(key), mine,
                                     sizeof mine);
    if (st) ok = 0;
    tp_status_free(st);
    st = tp_diskcache_put(g_thread_cache, "common", 6, mine, sizeof mine);
    if (st) ok = 0;
    tp_status_free(st);
    void *data = NULL;
    size_t len = 0;
    st = tp_diskcache_get(g_thread_cache, key, strlen(key), &data, &len);
    if (st || (data ? len != sizeof mine || memcmp(data, mine, len) != 0
                    : g_thread_strict)) {
      fprintf(stderr, "   thread %d iter %d: own key: %s, %s, %zu bytes\n", t,
              i, tp_status_message(st), data ? "hit" : "miss", len);
      ok = 0;
    }
    tp_status_free(st);
    free(data);
    data = NULL;
    st = tp_diskcache_get(g_thread_cache, "common", 6, &data, &len);
    int intact = 0;
    for (int u = 0; data && u < 4; u++)
      intact |= len == sizeof mine && memcmp(data, all[u], len) == 0;
    if (st || (data ? !intact : g_thread_strict)) {
      fprintf(stderr, "   thread %d iter %d: common key: %s, %s, %zu bytes\n",
              t, i, tp_status_message(st), data ? "hit" : "miss", len);
      ok = 0;
    }
    tp_status_free(st);
    free(data);
  }
  return (void *)(intptr_t)ok;
}

static void run_threads(const char *dir, int64_t cap, int strict) {
  g_thread_cache = open_cache(dir, cap, "v1");
  g_thread_strict = strict;
  if (!g_thread_cache) return;
  pthread_t th[4];
  for (int t = 0; t < 4; t++)
    CHECK(pthread_create(&th[t], NULL, thread_body, (void *)(intptr_t)t) == 0);
  for (int t = 0; t < 4; t++) {
    void *ok = NULL;
    pthread_join(th[t], &ok);
    CHECK(ok == (void *)1);
  }
  tp_diskcache_stats s = stats_of(g_thread_cache);
  CHECK_EQ_INT(s.writes, 4 * 30 * 2);
  CHECK_EQ_INT(s.corrupt_dropped, 0);
  int64_t bytes = 0;
  int n = list_entries(dir, &bytes, NULL, 0);
  CHECK(bytes <= (cap > 0 ? cap : TP_DISKCACHE_DEFAULT_CAP));
  if (strict) {
    CHECK_EQ_INT(s.evictions, 0);
    CHECK_EQ_INT(n, 4 * 5 + 1);
    CHECK_EQ_INT(s.hits, 4 * 30 * 2);
  } else {
    CHECK(s.evictions > 0);
  }
  tp_diskcache_close(g_thread_cache);
}

TEST(test_threads) {
  /* Room for all 21 keys: every read hits. */
  run_threads(sub("threads"), 0, 1);
  /* Room for about 16: the threads also evict concurrently. */
  run_threads(sub("threads_small"), 16 * 2100, 0);
}

/* ---- eviction ------------------------------------------------------------ */

TEST(test_eviction) {
  const char *dir = sub("evict");
  enum { PAYLOAD = 4000, FILE_SIZE = 56 + 1 + 4 + PAYLOAD }; /* "v", "k%03d" */
  const int64_t cap = 10 * FILE_SIZE + FILE_SIZE / 2;
  tp_diskcache *c = open_cache(dir, cap, "v"); /* creates the directory */
  tp_diskcache_close(c);
  /* Files the cache did not make are never counted or deleted, and stale
   * temporaries of crashed writers are. */
  char junk[600], stale[600], fresh[600];
  snprintf(junk, sizeof junk, "%s/notes.txt", dir);
  snprintf(stale, sizeof stale, "%s/.tpc-tmp-crashed-abcdef", dir);
  snprintf(fresh, sizeof fresh, "%s/.tpc-tmp-writing-abcdef", dir);
  write_file(junk, "keep me", 7);
  write_file(stale, "partial", 7);
  write_file(fresh, "partial", 7);
  struct timespec old[2] = {{time(NULL) - 7200, 0}, {time(NULL) - 7200, 0}};
  CHECK(utimensat(AT_FDCWD, stale, old, 0) == 0);

  c = open_cache(dir, cap, "v");
  if (!c) return;
  CHECK(exists(stale)); /* opening does not scan the directory */
  CHECK_EQ_INT(stats_of(c).bytes_on_disk, 0); /* the first stats call (or write) does */
  CHECK(!exists(stale));
  CHECK(exists(fresh));

  uint8_t blob[PAYLOAD];
  char key[16];
  for (int i = 0; i <= 40; i++) {
    snprintf(key, sizeof key, "k%03d", i);
    fill(blob, sizeof blob, (unsigned)i);
    put_str(c, key, blob, sizeof blob);
    int64_t bytes = 0;
    list_entries(dir, &bytes, NULL, 0);
    CHECK(bytes <= cap);
    CHECK(stats_of(c).bytes_on_disk <= cap);
    /* Entry 0 is read after every put: the most recently used. */
    fill(blob, sizeof blob, 0);
    CHECK_EQ_INT(get_is(c, "k000", blob, sizeof blob), 1);
  }
  tp_diskcache_stats s = stats_of(c);
  CHECK(s.evictions >= 30);
  int64_t bytes = 0;
  int n = list_entries(dir, &bytes, NULL, 0);
  CHECK(n >= 2 && n <= 10);
  CHECK_EQ_INT(s.bytes_on_disk, bytes);
  CHECK_EQ_INT(bytes, (int64_t)n * FILE_SIZE);
  fill(blob, sizeof blob, 40);
  CHECK_EQ_INT(get_is(c, "k040", blob, sizeof blob), 1); /* newest write */
  fill(blob, sizeof blob, 1);
  CHECK_EQ_INT(get_is(c, "k001", blob, sizeof blob), 0); /* oldest: gone */
  CHECK(exists(junk));

  /* An entry bigger than the whole cap is refused and nothing is written. */
  uint8_t *big = calloc(1, (size_t)cap);
  if (big) {
    tp_status *st = tp_diskcache_put(c, "big", 3, big, (size_t)cap);
    CHECK_EQ_INT(tp_status_code(st), TP_RESOURCE_EXHAUSTED);
    CHECK_CONTAINS(tp_status_message(st), dir);
    tp_status_free(st);
    free(big);
  }
  CHECK_EQ_INT(count_entries(dir), n);
  tp_diskcache_close(c);

  /* Reopening with a smaller cap evicts at the first stats call (or
   * write), least recent first: the last read (k000) and the one before it
   * (k040) stay. */
  c = open_cache(dir, 3 * FILE_SIZE, "v");
  if (!c) return;
  CHECK_EQ_INT(count_entries(dir), n);
  int64_t measured = stats_of(c).bytes_on_disk;
  CHECK(count_entries(dir) <= 3);
  list_entries(dir, &bytes, NULL, 0);
  CHECK(bytes <= 3 * FILE_SIZE);
  CHECK_EQ_INT(measured, bytes);
  fill(blob, sizeof blob, 0);
  CHECK_EQ_INT(get_is(c, "k000", blob, sizeof blob), 1);
  fill(blob, sizeof blob, 40);
  CHECK_EQ_INT(get_is(c, "k040", blob, sizeof blob), 1);
  CHECK(exists(junk));
  CHECK(exists(fresh));
  tp_diskcache_close(c);

  /* A write as the first call measures what was there and itself. */
  c = open_cache(dir, cap, "v");
  if (!c) return;
  fill(blob, sizeof blob, 7);
  put_str(c, "k007", blob, sizeof blob);
  list_entries(dir, &bytes, NULL, 0);
  CHECK_EQ_INT(stats_of(c).bytes_on_disk, bytes);
  CHECK(bytes > FILE_SIZE);
  tp_diskcache_close(c);
}

/* ---- unwritable directories ---------------------------------------------- */

TEST(test_unwritable) {
  const char *file = sub("a_regular_file");
  write_file(file, "x", 1);
  /* A directory under a regular file cannot be created. */
  const char *under = sub("a_regular_file/cache/dir");
  tp_diskcache *c = (tp_diskcache *)1;
  tp_status *st = tp_diskcache_open(under, 0, "v1", &c);
  CHECK(st != NULL);
  CHECK(c == NULL);
  CHECK_CONTAINS(tp_status_message(st), under);
  fprintf(stderr, "   %s\n", tp_status_message(st));
  tp_status_free(st);
  /* The path itself is a regular file. */
  st = tp_diskcache_open(file, 0, "v1", &c);
  CHECK(st != NULL && c == NULL);
  CHECK_CONTAINS(tp_status_message(st), file);
  CHECK_CONTAINS(tp_status_message(st), "not a directory");
  tp_status_free(st);
  CHECK_ERR(tp_diskcache_open("", 0, "v1", &c), TP_INVALID_ARGUMENT);
  CHECK_ERR(tp_diskcache_open(NULL, 0, "v1", &c), TP_INVALID_ARGUMENT);

  /* A read-only directory (root ignores the mode bits, so only as a
   * normal user). */
  if (geteuid() != 0) {
    const char *ro = sub("readonly");
    CHECK(mkdir(ro, 0500) == 0);
    st = tp_diskcache_open(ro, 0, "v1", &c);
    CHECK(st != NULL && c == NULL);
    CHECK_CONTAINS(tp_status_message(st), ro);
    tp_status_free(st);
    chmod(ro, 0700);
  }

  /* The directory disappears under an open cache: puts fail with the path
   * in the message, gets are misses, nothing crashes. */
  const char *gone = sub("gone");
  c = open_cache(gone, 0, "v1");
  if (!c) return;
  put_str(c, "k", "abc", 3);
  rm_rf(gone);
  st = tp_diskcache_put(c, "k2", 2, "abc", 3);
  CHECK(st != NULL);
  CHECK_CONTAINS(tp_status_message(st), gone);
  fprintf(stderr, "   %s\n", tp_status_message(st));
  tp_status_free(st);
  CHECK_EQ_INT(get_is(c, "k", "abc", 3), 0);
  /* And a directory replaced by a file: the read is an error or a miss,
   * the write an error naming the path. */
  write_file(gone, "x", 1);
  void *data = NULL;
  size_t len = 0;
  st = tp_diskcache_get(c, "k", 1, &data, &len);
  CHECK(data == NULL);
  if (st) CHECK_CONTAINS(tp_status_message(st), gone);
  tp_status_free(st);
  st = tp_diskcache_put(c, "k", 1, "abc", 3);
  CHECK(st != NULL);
  CHECK_CONTAINS(tp_status_message(st), gone);
  tp_status_free(st);
  tp_diskcache_close(c);
}

/* ---- a real executable through the cache --------------------------------- */

static const char kAdd[] =
    "module @add {\n"
    "  func.func public @main(%a: tensor<2x3xf32>, %b: tensor<2x3xf32>)"
    " -> tensor<2x3xf32> {\n"
    "    %0 = stablehlo.add %a, %b : tensor<2x3xf32>\n"
    "    return %0 : tensor<2x3xf32>\n"
    "  }\n"
    "}\n";

static void check_add(tp_plugin *p, tp_exec *e) {
  static const int64_t dims[] = {2, 3};
  static const float a[6] = {1, 2, 3, 4, 5, 6};
  static const float b[6] = {0.5f, -2, 30, 40, 50, 60};
  tp_buffer *ba = NULL, *bb = NULL, *out[1] = {NULL};
  CHECK_OK(tp_buffer_from_host(p, 0, TP_F32, dims, 2, a, &ba));
  CHECK_OK(tp_buffer_from_host(p, 0, TP_F32, dims, 2, b, &bb));
  tp_buffer *args[2] = {ba, bb};
  if (ba && bb) CHECK_OK(tp_execute(e, 0, args, 2, NULL, out, 1));
  if (out[0]) {
    float r[6] = {0};
    CHECK_OK(tp_buffer_to_host(out[0], r, sizeof r));
    for (int i = 0; i < 6; i++) CHECK(r[i] == a[i] + b[i]);
  }
  tp_buffer_free(out[0]);
  tp_buffer_free(ba);
  tp_buffer_free(bb);
}

static void test_executable_round_trip(tp_plugin *p) {
  char version[512];
  snprintf(version, sizeof version, "torch-pjrt test; plugin %s %s xla %s",
           tp_plugin_platform(p), tp_plugin_api_version(p),
           tp_plugin_xla_version(p));
  const char *dir = sub("executables");
  tp_exec *e = NULL;
  CHECK_OK(tp_compile(p, kAdd, strlen(kAdd), &e));
  if (!e) return;
  void *ser = NULL;
  size_t serlen = 0;
  tp_status *st = tp_exec_serialize(e, &ser, &serlen);
  tp_exec_free(e);
  if (st) {
    fprintf(stderr, "   serialize refused (skipping): %s\n",
            tp_status_message(st));
    tp_status_free(st);
    return;
  }
  tp_diskcache *c = open_cache(dir, 0, version);
  if (c) {
    CHECK_OK(tp_diskcache_put(c, kAdd, strlen(kAdd), ser, serlen));
    tp_diskcache_close(c);
  }
  free(ser);

  /* A "warm start": a new handle, the bytes from disk, no compile. */
  c = open_cache(dir, 0, version);
  if (!c) return;
  void *data = NULL;
  size_t len = 0;
  CHECK_OK(tp_diskcache_get(c, kAdd, strlen(kAdd), &data, &len));
  CHECK(data != NULL && len == serlen);
  fprintf(stderr, "   executable entry: %zu payload bytes\n", len);
  if (data) {
    tp_exec *e2 = NULL;
    CHECK_OK(tp_exec_deserialize(p, data, len, &e2));
    if (e2) {
      CHECK_EQ_INT(tp_exec_num_outputs(e2), 1);
      check_add(p, e2);
      tp_exec_free(e2);
    }
    free(data);
  }
  CHECK_EQ_INT(stats_of(c).hits, 1);
  tp_diskcache_close(c);
}

int main(void) {
  if (!mkdtemp(g_root)) {
    perror("mkdtemp");
    return 1;
  }
  RUN(test_round_trip);
  RUN(test_miss);
  RUN(test_version_mismatch);
  RUN(test_corruption);
  RUN(test_other_key_under_name);
  /* Fork before the plugin starts its threads. */
  RUN(test_two_processes_same_key);
  RUN(test_threads);
  RUN(test_eviction);
  RUN(test_unwritable);

  const char *path = getenv("TP_TEST_PLUGIN");
  if (!path || !path[0]) {
    fprintf(stderr, "TP_TEST_PLUGIN is not set; run `make ctest`\n");
    CHECK(path && path[0]);
  } else {
    tp_plugin *p = NULL;
    tp_status *st = tp_plugin_load(path, NULL, &p);
    if (st) {
      fprintf(stderr, "cannot load %s: %s\n", path, tp_status_message(st));
      tp_status_free(st);
      CHECK(p != NULL);
    } else {
      fprintf(stderr, "-- test_executable_round_trip\n");
      test_executable_round_trip(p);
      tp_plugin_destroy(p);
    }
  }
  rm_rf(g_root);
  return ctest_finish();
}

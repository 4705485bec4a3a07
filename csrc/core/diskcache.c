/* diskcache.c - the persistent executable cache (see diskcache.h).
 *
 * One file per entry, named "<hi><lo>.tpc" where hi and lo are two
 * independent 64-bit hashes (FNV-1a and an xxhash-style word hash) of
 * (format, version, key) in hex.  The file holds the full version and key,
 * so a hash collision is recognised on read and is a miss.  The format
 * version is hashed too, so a future format never shares a name.
 *
 * File layout (all integers little-endian):
 *
 *   off  size  field
 *     0     8  magic "TPJRTC01"
 *     8     4  format version (1)
 *    12     4  reserved, 0
 *    16     8  V: version string length
 *    24     8  K: key length
 *    32     8  N: payload length
 *    40     8  payload checksum   = hash64(payload)
 *    48     8  header checksum    = hash64(bytes 0..47, version, key)
 *    56     V  version string (no NUL)
 *  56+V     K  key
 * 56+V+K    N  payload; the file ends exactly here
 *
 * Reading checks, in order: regular file, size >= 56, magic, format,
 * reserved, 56+V+K+N == file size, header checksum, then version and key
 * equal to the caller's, then payload checksum.  Any failure except the
 * version/key comparison means the file is damaged: it is deleted (only if
 * the name still points at the inode we read, so a fresh entry renamed in
 * meanwhile survives) and the lookup is a miss.  A valid header whose
 * version or key differ is a hash collision: a miss that leaves the file
 * alone (the caller's put replaces it).
 *
 * Entries of another version are never deleted on sight: the version is part
 * of the file name, so they are never even opened, and another install (or
 * plugin) sharing the directory may still want them.  They are not touched
 * on our hits, so they age out through the LRU cap like anything unused.
 *
 * Recency is the file's mtime, set explicitly (from CLOCK_REALTIME, so
 * nanosecond-ordered, unlike the kernel's coarse file timestamps) when an
 * entry is written and on every hit.  atime is not used: relatime and
 * noatime mounts make it unreliable.
 *
 * Size: the handle keeps a running total, measured by one directory scan at
 * open and advanced by its own writes.  Only when it exceeds the cap is the
 * directory scanned again (which also picks up other processes' writes) and
 * entries deleted, oldest mtime first, down to 90% of the cap so that a full
 * cache does not rescan on every put.  The entry just written is never the
 * victim.  Temporary files older than an hour (left by a crashed writer) are
 * removed by every scan.
 *
 * Durability: the payload is fsync'd before the rename, so after a crash an
 * entry is either complete or absent.  The directory is not fsync'd: losing
 * a freshly renamed entry in a power cut only costs a recompile.
 */
#include "diskcache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAGIC "TPJRTC01"
#define FORMAT 1u
#define HDR 56
#define NAME_LEN 36 /* 32 hex digits + ".tpc" */
#define TMP_PREFIX ".tpc-tmp-"
#define STALE_TMP_SECONDS 3600

struct tp_diskcache {
  char *dir;
  char *version;
  size_t vlen;
  int64_t cap;
  pthread_mutex_t mu; /* guards stats (bytes_on_disk included) and scans */
  tp_diskcache_stats stats;
  int scanned; /* the directory has been measured (the first write or stats call does it) */
};

/* ---- hashing ------------------------------------------------------------- */

static const uint64_t P1 = 0x9E3779B185EBCA87ULL, P2 = 0xC2B2AE3D27D4EB4FULL,
                      P3 = 0x165667B19E3779F9ULL, P4 = 0x85EBCA77C2B2AE63ULL,
                      P5 = 0x27D4EB2F165667C5ULL;

static uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static uint64_t load64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

static void store64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t load32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
         (uint32_t)p[3] << 24;
}

static void store32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* splitmix64's finaliser. */
static uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

static uint64_t round64(uint64_t acc, uint64_t w) {
  return rotl64(acc + w * P2, 31) * P1;
}

/* An xxhash64-style hash: four lanes over 32-byte stripes, then the tail,
 * then an avalanche.  Not bit-compatible with xxhash; it only has to be
 * fast, well mixed and the same everywhere (loads are little-endian). */
static uint64_t hash64(const void *data, size_t n, uint64_t seed) {
  const uint8_t *p = data;
  uint64_t h;
  size_t total = n;
  if (n >= 32) {
    uint64_t a = seed + P1 + P2, b = seed + P2, c = seed, d = seed - P1;
    do {
      a = round64(a, load64(p));
      b = round64(b, load64(p + 8));
      c = round64(c, load64(p + 16));
      d = round64(d, load64(p + 24));
      p += 32;
      n -= 32;
    } while (n >= 32);
    h = rotl64(a, 1) + rotl64(b, 7) + rotl64(c, 12) + rotl64(d, 18);
  } else {
    h = seed + P5;
  }
  h += (uint64_t)total;
  for (; n >= 8; p += 8, n -= 8)
    h = rotl64(h ^ round64(0, load64(p)), 27) * P1 + P4;
  for (; n > 0; p++, n--) h = rotl64(h ^ (*p * P5), 11) * P1;
  return mix64(h ^ P3);
}

static uint64_t fnv1a(uint64_t h, const void *data, size_t n) {
  const uint8_t *p = data;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001B3ULL;
  return h;
}

/* "<32 hex>.tpc" for (format, version, key) into `name` (NAME_LEN + 1). */
static void entry_name(const tp_diskcache *c, const void *key, size_t keylen,
                       char *name) {
  uint8_t len[8];
  uint64_t hi = 0xCBF29CE484222325ULL;
  store32(len, FORMAT);
  hi = fnv1a(hi, len, 4);
  store64(len, c->vlen);
  hi = fnv1a(hi, len, 8);
  hi = fnv1a(hi, c->version, c->vlen);
  store64(len, keylen);
  hi = fnv1a(hi, len, 8);
  hi = fnv1a(hi, key, keylen);
  uint64_t lo = hash64(c->version, c->vlen, 0x74706A72ULL ^ FORMAT);
  lo = hash64(key, keylen, mix64(lo));
  snprintf(name, NAME_LEN + 1, "%016" PRIx64 "%016" PRIx64 ".tpc", hi, lo);
}

static int is_entry_name(const char *s) {
  if (strlen(s) != NAME_LEN || strcmp(s + 32, ".tpc") != 0) return 0;
  for (int i = 0; i < 32; i++)
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
      return 0;
  return 1;
}

/* ---- small helpers ------------------------------------------------------- */

static tp_code errno_code(int err) {
  switch (err) {
    case ENOSPC:
    case EDQUOT:
    case ENOMEM:
    case EMFILE:
    case ENFILE:
      return TP_RESOURCE_EXHAUSTED;
    case EACCES:
    case EPERM:
    case EROFS:
    case ENOTDIR:
    case ENOENT:
    case EEXIST:
    case ELOOP:
    case ENAMETOOLONG:
      return TP_FAILED_PRECONDITION;
    default:
      return TP_INTERNAL;
  }
}

static char *join(const char *dir, const char *name) {
  size_t a = strlen(dir), b = strlen(name);
  char *s = malloc(a + b + 2);
  if (!s) return NULL;
  memcpy(s, dir, a);
  s[a] = '/';
  memcpy(s + a + 1, name, b + 1);
  return s;
}

static tp_status *oom(const char *what) {
  return tp_error(TP_RESOURCE_EXHAUSTED, "disk cache: out of host memory %s",
                  what);
}

/* Read exactly n bytes at off: 0 on success, 1 at a premature end of file,
 * -1 with errno on an I/O error. */
static int pread_full(int fd, void *buf, size_t n, off_t off) {
  uint8_t *p = buf;
  while (n > 0) {
    ssize_t r = pread(fd, p, n, off);
    if (r < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (r == 0) return 1;
    p += r;
    n -= (size_t)r;
    off += r;
  }
  return 0;
}

static int write_full(int fd, const void *buf, size_t n) {
  const uint8_t *p = buf;
  while (n > 0) {
    ssize_t r = write(fd, p, n);
    if (r < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (r == 0) {
      errno = ENOSPC;
      return -1;
    }
    p += r;
    n -= (size_t)r;
  }
  return 0;
}

/* Mark an entry as used now (both times, from the precise real-time clock). */
static int touch_fd(int fd) {
  struct timespec ts[2];
  clock_gettime(CLOCK_REALTIME, &ts[0]);
  ts[1] = ts[0];
  return futimens(fd, ts);
}

static int ts_before(struct timespec a, struct timespec b) {
  return a.tv_sec != b.tv_sec ? a.tv_sec < b.tv_sec : a.tv_nsec < b.tv_nsec;
}

/* mkdir -p with mode 0700 for the directories it creates. */
static tp_status *make_dirs(const char *dir) {
  char *p = strdup(dir);
  if (!p) return oom("opening the disk cache");
  tp_status *st = NULL;
  for (char *s = p + 1;; s++) {
    if (*s != '/' && *s != '\0') continue;
    char saved = *s;
    *s = '\0';
    if (mkdir(p, 0700) != 0 && errno != EEXIST) {
      int err = errno;
      st = tp_error(errno_code(err),
                    "cannot create disk cache directory '%s' (at '%s'): %s",
                    dir, p, strerror(err));
      break;
    }
    *s = saved;
    if (saved == '\0') break;
  }
  free(p);
  if (st) return st;
  struct stat sb;
  if (stat(dir, &sb) != 0) {
    int err = errno;
    return tp_error(errno_code(err), "cannot use disk cache directory '%s': %s",
                    dir, strerror(err));
  }
  if (!S_ISDIR(sb.st_mode))
    return tp_error(TP_FAILED_PRECONDITION,
                    "disk cache directory '%s' exists and is not a directory",
                    dir);
  if (faccessat(AT_FDCWD, dir, W_OK | X_OK, AT_EACCESS) != 0) {
    int err = errno;
    return tp_error(errno_code(err),
                    "disk cache directory '%s' is not writable: %s", dir,
                    strerror(err));
  }
  return NULL;
}

/* Delete the entry at `path` only if it is still the file (dev, ino) that
 * was examined.  A plain stat-then-unlink would race with a writer renaming
 * a fresh entry over the name in between and delete the fresh one; instead
 * the name is first renamed (atomically) to a private temporary, the
 * temporary is checked, and a file that turns out to be fresh is linked back
 * (link fails if an even newer entry arrived meanwhile, which then wins).
 * A reader in that window sees a miss, which is harmless.  Returns 1 if the
 * examined file was removed, 0 if it was already gone or had been replaced
 * (or on any failure: nothing is ever lost but a cache entry). */
static int remove_if_same(const tp_diskcache *c, const char *path, dev_t dev,
                          ino_t ino) {
  char *tmp = join(c->dir, TMP_PREFIX "drop-XXXXXX");
  if (!tmp) return 0;
  int removed = 0;
  int fd = mkostemp(tmp, O_CLOEXEC);
  if (fd < 0) { /* cannot make a temporary: fall back to check-then-unlink */
    struct stat now;
    if (lstat(path, &now) == 0 && now.st_dev == dev && now.st_ino == ino)
      removed = unlink(path) == 0;
    free(tmp);
    return removed;
  }
  close(fd);
  if (rename(path, tmp) == 0) {
    struct stat got;
    if (lstat(tmp, &got) == 0 && got.st_dev == dev && got.st_ino == ino)
      removed = 1;
    else if (link(tmp, path) != 0 && errno != EEXIST)
      rename(tmp, path); /* no hard links here: put it back by rename */
  }
  unlink(tmp);
  free(tmp);
  return removed;
}

/* ---- scanning and eviction ----------------------------------------------- */

typedef struct scan_entry {
  char name[NAME_LEN + 1];
  int64_t size;
  struct timespec mtime;
  dev_t dev;
  ino_t ino;
} scan_entry;

static int scan_entry_cmp(const void *pa, const void *pb) {
  const scan_entry *a = pa, *b = pb;
  if (ts_before(a->mtime, b->mtime)) return -1;
  if (ts_before(b->mtime, a->mtime)) return 1;
  return strcmp(a->name, b->name);
}

/* Measure the directory; remove stale temporaries; if over the cap, delete
 * the least recently used entries (never `keep`) down to 90% of the cap.
 * Sets stats.bytes_on_disk.  Caller holds c->mu.  Failures leave the
 * running estimate as it was: the cache is best-effort here. */
static void scan_and_evict(tp_diskcache *c, const char *keep) {
  DIR *d = opendir(c->dir);
  if (!d) return;
  int dfd = dirfd(d);
  scan_entry *ents = NULL;
  size_t n = 0, capn = 0;
  int64_t total = 0;
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    int entry = is_entry_name(de->d_name);
    int tmp =
        !entry && strncmp(de->d_name, TMP_PREFIX, strlen(TMP_PREFIX)) == 0;
    if (!entry && !tmp) continue;
    struct stat sb;
    if (fstatat(dfd, de->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (!S_ISREG(sb.st_mode)) continue;
    if (tmp) {
      if (now.tv_sec - sb.st_mtim.tv_sec > STALE_TMP_SECONDS)
        unlinkat(dfd, de->d_name, 0);
      continue;
    }
    total += (int64_t)sb.st_size;
    if (n == capn) {
      size_t nc = capn ? capn * 2 : 64;
      scan_entry *grown = realloc(ents, nc * sizeof *ents);
      if (!grown) continue; /* counted, just not a candidate for eviction */
      ents = grown;
      capn = nc;
    }
    memcpy(ents[n].name, de->d_name, NAME_LEN + 1);
    ents[n].size = (int64_t)sb.st_size;
    ents[n].mtime = sb.st_mtim;
    ents[n].dev = sb.st_dev;
    ents[n].ino = sb.st_ino;
    n++;
  }
  if (total > c->cap && n > 0) {
    qsort(ents, n, sizeof *ents, scan_entry_cmp);
    int64_t low = c->cap - c->cap / 10;
    for (size_t i = 0; i < n && total > low; i++) {
      if (keep && strcmp(ents[i].name, keep) == 0) continue;
      char *path = join(c->dir, ents[i].name);
      if (!path) break;
      struct stat cur;
      if (remove_if_same(c, path, ents[i].dev, ents[i].ino)) {
        total -= ents[i].size;
        c->stats.evictions++;
      } else if (lstat(path, &cur) != 0) {
        total -= ents[i].size; /* another process got there first */
      } /* else: replaced by a fresh entry since the scan, which stays */
      free(path);
    }
  }
  c->stats.bytes_on_disk = total;
  c->scanned = 1;
  free(ents);
  closedir(d);
}

/* ---- open / close -------------------------------------------------------- */

tp_status *tp_diskcache_open(const char *dir, int64_t cap_bytes,
                             const char *version, tp_diskcache **out) {
  if (!out) return tp_error(TP_INVALID_ARGUMENT, "tp_diskcache_open: NULL out");
  *out = NULL;
  if (!dir || !dir[0])
    return tp_error(TP_INVALID_ARGUMENT,
                    "tp_diskcache_open: empty directory name");
  if (!version) version = "";
  tp_diskcache *c = calloc(1, sizeof *c);
  if (!c) return oom("opening the disk cache");
  c->dir = strdup(dir);
  c->version = strdup(version);
  if (!c->dir || !c->version) {
    free(c->dir);
    free(c->version);
    free(c);
    return oom("opening the disk cache");
  }
  size_t dl = strlen(c->dir);
  while (dl > 1 && c->dir[dl - 1] == '/') c->dir[--dl] = '\0';
  c->vlen = strlen(c->version);
  c->cap = cap_bytes > 0 ? cap_bytes : TP_DISKCACHE_DEFAULT_CAP;
  tp_status *st = make_dirs(c->dir);
  if (st) {
    free(c->dir);
    free(c->version);
    free(c);
    return st;
  }
  pthread_mutex_init(&c->mu, NULL);
  /* The directory is measured (and trimmed to the cap) at the first write
   * or stats call, not here: a process that only reads its programs back
   * (a warm start) never stats every entry, and opening stays cheap however
   * many entries the cache holds (~3 us each). */
  *out = c;
  return NULL;
}

void tp_diskcache_close(tp_diskcache *c) {
  if (!c) return;
  pthread_mutex_destroy(&c->mu);
  free(c->dir);
  free(c->version);
  free(c);
}

void tp_diskcache_get_stats(tp_diskcache *c, tp_diskcache_stats *out) {
  if (!out) return;
  memset(out, 0, sizeof *out);
  if (!c) return;
  pthread_mutex_lock(&c->mu);
  if (!c->scanned) scan_and_evict(c, NULL);
  *out = c->stats;
  pthread_mutex_unlock(&c->mu);
}

/* ---- get ----------------------------------------------------------------- */

enum read_result { R_HIT, R_CORRUPT, R_OTHER_KEY, R_IO, R_NOMEM };

/* Validate the open entry `fd` (of size sb->st_size) against `key`; on a
 * hit, *data and *len hold the payload. */
static enum read_result read_entry(const tp_diskcache *c, int fd,
                                   const struct stat *sb, const void *key,
                                   size_t keylen, void **data, size_t *len) {
  if (!S_ISREG(sb->st_mode) || sb->st_size < HDR) return R_CORRUPT;
  uint64_t size = (uint64_t)sb->st_size;
  uint8_t h[HDR];
  int r = pread_full(fd, h, HDR, 0);
  if (r) return r < 0 ? R_IO : R_CORRUPT;
  if (memcmp(h, MAGIC, 8) != 0 || load32(h + 8) != FORMAT ||
      load32(h + 12) != 0)
    return R_CORRUPT;
  uint64_t v = load64(h + 16), k = load64(h + 24), n = load64(h + 32);
  /* Each is at most the file size (< 2^63), so the sum cannot wrap. */
  if (v > size || k > size || n > size || HDR + v + k + n != size)
    return R_CORRUPT;
  uint8_t *vk = malloc(v + k ? v + k : 1);
  if (!vk) return R_NOMEM;
  r = pread_full(fd, vk, v + k, HDR);
  if (r) {
    free(vk);
    return r < 0 ? R_IO : R_CORRUPT;
  }
  uint64_t hc = hash64(vk + v, k, hash64(vk, v, hash64(h, 48, 0)));
  if (hc != load64(h + 48)) {
    free(vk);
    return R_CORRUPT;
  }
  int same = v == c->vlen && k == keylen && memcmp(vk, c->version, v) == 0 &&
             (k == 0 || memcmp(vk + v, key, k) == 0);
  free(vk);
  if (!same) return R_OTHER_KEY;
  uint8_t *payload = malloc(n ? n : 1);
  if (!payload) return R_NOMEM;
  r = pread_full(fd, payload, n, (off_t)(HDR + v + k));
  if (r) {
    free(payload);
    return r < 0 ? R_IO : R_CORRUPT;
  }
  if (hash64(payload, n, 0) != load64(h + 40)) {
    free(payload);
    return R_CORRUPT;
  }
  *data = payload;
  *len = n;
  return R_HIT;
}

tp_status *tp_diskcache_get(tp_diskcache *c, const void *key, size_t keylen,
                            void **data, size_t *len) {
  if (data) *data = NULL;
  if (len) *len = 0;
  if (!c || !data || !len || (!key && keylen))
    return tp_error(TP_INVALID_ARGUMENT, "tp_diskcache_get: NULL argument");
  char name[NAME_LEN + 1];
  entry_name(c, key, keylen, name);
  char *path = join(c->dir, name);
  if (!path) return oom("reading the disk cache");

  enum read_result res;
  int err = 0;
  struct stat sb;
  memset(&sb, 0, sizeof sb);
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    err = errno;
    if (err == ENOENT) {
      res = R_OTHER_KEY; /* a plain miss */
    } else if (err == ELOOP && lstat(path, &sb) == 0) {
      res = R_CORRUPT; /* a symlink where an entry belongs: not ours */
    } else {
      res = R_IO;
    }
  } else if (fstat(fd, &sb) != 0) {
    err = errno;
    res = R_IO;
  } else {
    res = read_entry(c, fd, &sb, key, keylen, data, len);
    if (res == R_IO) err = errno;
    if (res == R_HIT) touch_fd(fd); /* best effort: LRU recency */
  }
  if (fd >= 0) close(fd);

  int dropped = 0;
  if (res == R_CORRUPT)
    dropped = remove_if_same(c, path, sb.st_dev, sb.st_ino);

  pthread_mutex_lock(&c->mu);
  if (res == R_HIT) {
    c->stats.hits++;
  } else if (res == R_CORRUPT || res == R_OTHER_KEY) {
    c->stats.misses++;
    if (res == R_CORRUPT) c->stats.corrupt_dropped++;
    if (dropped && c->scanned) c->stats.bytes_on_disk -= (int64_t)sb.st_size;
    if (c->stats.bytes_on_disk < 0) c->stats.bytes_on_disk = 0;
  }
  pthread_mutex_unlock(&c->mu);

  tp_status *st = NULL;
  if (res == R_IO)
    st = tp_error(errno_code(err), "cannot read disk cache entry '%s': %s",
                  path, strerror(err));
  else if (res == R_NOMEM)
    st = tp_error(TP_RESOURCE_EXHAUSTED,
                  "out of host memory reading disk cache entry '%s'", path);
  free(path);
  return st;
}

/* ---- put ----------------------------------------------------------------- */

tp_status *tp_diskcache_put(tp_diskcache *c, const void *key, size_t keylen,
                            const void *data, size_t len) {
  if (!c || (!key && keylen) || (!data && len))
    return tp_error(TP_INVALID_ARGUMENT, "tp_diskcache_put: NULL argument");
  /* Sizes: refuse anything that would not fit the cap on its own (this
   * also keeps every length far from overflowing). */
  uint64_t ucap = (uint64_t)c->cap;
  if (keylen > ucap || len > ucap || c->vlen > ucap ||
      HDR + (uint64_t)c->vlen + keylen + len > ucap)
    return tp_error(TP_RESOURCE_EXHAUSTED,
                    "disk cache entry of %zu payload bytes does not fit the "
                    "cache cap of %" PRId64 " bytes in '%s'",
                    len, c->cap, c->dir);
  size_t hlen = HDR + c->vlen + keylen;
  int64_t fsize = (int64_t)(hlen + len);

  uint8_t *hdr = malloc(hlen);
  if (!hdr) return oom("writing the disk cache");
  memcpy(hdr, MAGIC, 8);
  store32(hdr + 8, FORMAT);
  store32(hdr + 12, 0);
  store64(hdr + 16, c->vlen);
  store64(hdr + 24, keylen);
  store64(hdr + 32, len);
  store64(hdr + 40, hash64(data, len, 0));
  memcpy(hdr + HDR, c->version, c->vlen);
  if (keylen) memcpy(hdr + HDR + c->vlen, key, keylen);
  store64(hdr + 48, hash64(hdr + HDR + c->vlen, keylen,
                           hash64(hdr + HDR, c->vlen, hash64(hdr, 48, 0))));

  char name[NAME_LEN + 1], tmpname[sizeof TMP_PREFIX + 32 + 8];
  entry_name(c, key, keylen, name);
  snprintf(tmpname, sizeof tmpname, TMP_PREFIX "%.32s-XXXXXX", name);
  char *path = join(c->dir, name);
  char *tmp = join(c->dir, tmpname);
  if (!path || !tmp) {
    free(hdr);
    free(path);
    free(tmp);
    return oom("writing the disk cache");
  }

  tp_status *st = NULL;
  const char *what = NULL;
  int fd = mkostemp(tmp, O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    st = tp_error(errno_code(err),
                  "cannot create a file in disk cache directory '%s': %s",
                  c->dir, strerror(err));
  } else {
    if (write_full(fd, hdr, hlen) != 0 || write_full(fd, data, len) != 0)
      what = "write";
    else if (touch_fd(fd) != 0)
      what = "set the time of";
    else if (fsync(fd) != 0)
      what = "fsync";
    int err = errno;
    if (close(fd) != 0 && !what) {
      err = errno;
      what = "close";
    }
    if (!what) {
      /* The entry replaced is measured and renamed over under the lock: a
       * scan in another thread evicting it in between would leave this
       * entry's bytes out of the running estimate, and the directory could
       * then outgrow the cap unseen. */
      pthread_mutex_lock(&c->mu);
      struct stat old;
      int64_t old_size = 0;
      if (lstat(path, &old) == 0 && S_ISREG(old.st_mode))
        old_size = (int64_t)old.st_size;
      if (rename(tmp, path) != 0) {
        err = errno;
        what = "rename into place";
      } else {
        c->stats.writes++;
        if (!c->scanned) { /* the first write measures the directory, this entry included */
          scan_and_evict(c, name);
        } else {
          c->stats.bytes_on_disk += fsize - old_size;
          if (c->stats.bytes_on_disk > c->cap) scan_and_evict(c, name);
        }
      }
      pthread_mutex_unlock(&c->mu);
    }
    if (what) {
      unlink(tmp);
      st = tp_error(errno_code(err), "cannot %s disk cache entry '%s': %s",
                    what, path, strerror(err));
    }
  }
  free(hdr);
  free(path);
  free(tmp);
  return st;
}

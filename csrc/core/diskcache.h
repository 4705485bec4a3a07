/* diskcache.h - a persistent, size-capped store of compiled executables.
 *
 * Maps a key (any bytes, e.g. a program fingerprint) to a blob (e.g. the
 * output of tp_exec_serialize) under a directory, one file per entry.
 *
 *   - Versioned: every entry carries the `version` string given at open
 *     ("torch-pjrt <v>; plugin <platform> <api> xla <xla_version>"); an
 *     entry written under another version is never used.
 *   - Atomic: an entry is written to a unique temporary file in the same
 *     directory, fsync'd and renamed over its final name, so processes that
 *     write the same key concurrently all succeed and a reader never sees a
 *     partial file.
 *   - Corruption-safe: every length, the magic, the version, the key and
 *     two checksums are validated on read; a damaged entry is deleted and
 *     reported as a miss, never as an error and never as a crash.
 *   - Size-capped: least recently used entries (by a modification time the
 *     cache sets on every write and every hit) are deleted when the total
 *     exceeds the cap.
 *
 * Only files whose names the cache itself makes ("<32 hex>.tpc" and
 * ".tpc-tmp-*") are ever read, counted or deleted, so pointing the cache at
 * a directory that holds other files is harmless.
 *
 * Thread safety: all functions may be called from any thread on one handle;
 * any number of processes may share a directory.
 */
#ifndef TP_DISKCACHE_H
#define TP_DISKCACHE_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tp_diskcache tp_diskcache;

/* Default size cap: 2 GiB. */
#define TP_DISKCACHE_DEFAULT_CAP ((int64_t)2 << 30)

/* Open (creating it, like mkdir -p, new directories mode 0700) the cache in
 * `dir` with a cap of `cap_bytes` (<= 0: TP_DISKCACHE_DEFAULT_CAP).  At the
 * first write or stats call, one scan of the directory measures its size
 * (evicting if it is already over the cap) and removes temporary files left
 * by crashed writers; opening does not scan.  An uncreatable or unwritable
 * directory is an error naming the path. */
tp_status *tp_diskcache_open(const char *dir, int64_t cap_bytes,
                             const char *version, tp_diskcache **out);
void tp_diskcache_close(tp_diskcache *c); /* NULL is a no-op */

/* Look `key` up.  Hit: *data is a malloc'd copy of the blob (caller frees;
 * non-NULL even for an empty blob) and *len its size.  Miss: *data = NULL,
 * *len = 0, and success.  A corrupt or truncated entry is deleted and is a
 * miss.  Only an I/O failure other than "no such file" (or running out of
 * host memory) is an error. */
tp_status *tp_diskcache_get(tp_diskcache *c, const void *key, size_t keylen,
                            void **data, size_t *len);

/* Store `data` under `key` (atomically replacing any previous entry), then
 * evict least recently used entries if the cache is over its cap.  Write
 * failures (disk full, directory gone, read-only file system) are errors
 * naming the path; an entry larger than the whole cap is refused with
 * TP_RESOURCE_EXHAUSTED.  Nothing partial is ever left under a final name. */
tp_status *tp_diskcache_put(tp_diskcache *c, const void *key, size_t keylen,
                            const void *data, size_t len);

typedef struct tp_diskcache_stats {
  int64_t hits, misses, writes;
  int64_t evictions;       /* entries deleted to stay under the cap */
  int64_t corrupt_dropped; /* damaged entries deleted on read */
  /* This handle's running estimate of the directory's size: exact after
   * each scan, then updated by its own writes (other processes' writes are
   * seen at the next scan). */
  int64_t bytes_on_disk;
} tp_diskcache_stats;
void tp_diskcache_get_stats(tp_diskcache *c, tp_diskcache_stats *out);

#ifdef __cplusplus
}
#endif
#endif

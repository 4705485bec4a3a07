/* storage.h - the device memory behind a PyTorch storage.
 *
 * A tp_storage is what a "tpu" tensor's DataPtr points to.  It holds at most
 * one flat (rank-1) PJRT buffer covering `nbytes`; a storage that has never
 * been written has no buffer and reads as zeros.  Writes replace the buffer
 * (PJRT buffers are immutable), so every view of the storage sees them.
 * The pointer is an opaque handle: host code must never dereference it as
 * tensor data.
 */
#ifndef TP_STORAGE_H
#define TP_STORAGE_H

#include <stddef.h>

#include "pjrt.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tp_storage tp_storage;

/* A new storage of `nbytes` on `device` with no buffer yet.  NULL only if
 * out of host memory. */
tp_storage *tp_storage_new(int device, size_t nbytes);
void tp_storage_free(tp_storage *s); /* NULL is a no-op; frees the buffer */

int tp_storage_device(const tp_storage *s);
size_t tp_storage_nbytes(const tp_storage *s);

/* Change the size, keeping the first min(old, new) bytes. */
tp_status *tp_storage_resize(tp_storage *s, size_t nbytes);

/* The current buffer (borrowed; NULL if never written) and its dtype. */
tp_buffer *tp_storage_buffer(const tp_storage *s);
/* Install `b` (owned) as the storage's content, freeing the old buffer.
 * `b` must be rank-1 and hold exactly nbytes. */
void tp_storage_set_buffer(tp_storage *s, tp_buffer *b);

/* A host copy of the storage's current buffer (all nbytes), kept for index
 * checks before launch: a small integer tensor uploaded from the host (a
 * Python list used as indices) has its values there.  Replacing the buffer
 * drops the copy.  The getter returns NULL where there is none; call both
 * under tp_storage_lock(). */
void tp_storage_set_host_copy(tp_storage *s, tp_dtype dt, const void *host);
const void *tp_storage_host_copy(const tp_storage *s, tp_dtype *dt);

/* Wait until every live storage's buffer on `device` (-1: all) is computed.
 * Returns the first execution error found. */
tp_status *tp_storage_await_all(int device);

/* Lock guarding buffer replacement across threads (autograd runs backward
 * on its own thread).  The eager engine holds it while it reads and
 * replaces storages. */
void tp_storage_lock(void);
void tp_storage_unlock(void);

#ifdef __cplusplus
}
#endif
#endif

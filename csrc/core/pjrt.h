/* pjrt.h - the PJRT boundary: load a plugin, make a client, move buffers,
 * compile StableHLO and execute it.  Everything above this file talks to
 * these opaque handles, never to pjrt_c_api.h directly.
 *
 * Thread safety: all functions may be called from any thread.  Buffers and
 * executables are owned by the caller and freed exactly once.
 */
#ifndef TP_PJRT_H
#define TP_PJRT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dtype.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TP_MAX_RANK 16

typedef struct tp_plugin tp_plugin; /* a loaded plugin + its client */
typedef struct tp_buffer tp_buffer; /* one device buffer */
typedef struct tp_exec tp_exec;     /* one loaded executable */

typedef struct tp_plugin_options {
  /* Number of devices the XLA CPU plugin should expose (its
   * "cpu_device_count" create option).  Ignored by other plugins; <= 0
   * means 1. */
  int cpu_device_count;
  /* Run computations asynchronously where the plugin supports it. */
  int asynchronous;
} tp_plugin_options;

/* dlopen `path`, call GetPjrtApi, check the API version and struct size,
 * initialize the plugin and create a client.  Errors name `path`. */
tp_status *tp_plugin_load(const char *path, const tp_plugin_options *opts,
                          tp_plugin **out);
/* Destroys the client.  The shared object stays loaded (PJRT plugins must
 * not be dlclose'd).  All buffers and executables must be freed first. */
void tp_plugin_destroy(tp_plugin *p);

int tp_plugin_device_count(const tp_plugin *p);       /* addressable devices */
const char *tp_plugin_path(const tp_plugin *p);
const char *tp_plugin_platform(const tp_plugin *p);   /* e.g. "cpu", "tpu" */
/* Whether the plugin is XLA's CPU plugin (platform "cpu"): the one place
 * that decides the CPU-only settings (client options, host malloc, codegen). */
bool tp_plugin_is_cpu(const tp_plugin *p);
const char *tp_plugin_xla_version(const tp_plugin *p); /* "" if unknown */
/* "major.minor" of the plugin's PJRT C API. */
const char *tp_plugin_api_version(const tp_plugin *p);
/* Device kind of device `i` (e.g. "cpu", "TPU v5 lite"); "" if out of range. */
const char *tp_plugin_device_kind(const tp_plugin *p, int i);

/* Memory accounting, per addressable device (bytes held by live tp_buffers
 * created on that device). */
typedef struct tp_mem_stats {
  int64_t bytes_in_use;
  int64_t peak_bytes;
  int64_t live_buffers;
  int64_t bytes_limit; /* -1: none */
} tp_mem_stats;
tp_status *tp_plugin_mem_stats(tp_plugin *p, int device, tp_mem_stats *out);
/* Cap bytes_in_use on `device` (torch.tpu.set_per_process_memory_fraction;
 * -1: no cap).  Creating buffers past it fails with TP_RESOURCE_EXHAUSTED
 * before anything runs: a host upload, a copy between devices, or an
 * execution whose outputs (less its donated inputs) would not fit. */
tp_status *tp_plugin_set_mem_limit(tp_plugin *p, int device, int64_t bytes);
tp_status *tp_plugin_reset_peak(tp_plugin *p, int device);
/* Total/free device memory if the plugin reports it (PJRT_Device_MemoryStats);
 * returns TP_UNIMPLEMENTED if it does not. */
tp_status *tp_plugin_device_memory(tp_plugin *p, int device, int64_t *total,
                                   int64_t *free_bytes);

/* ---- buffers ------------------------------------------------------------ */

/* Copy `data` (dense, row-major, tp_dtype_size(dt) * prod(dims) bytes) to a
 * new buffer on `device`.  Returns once the host memory may be reused. */
tp_status *tp_buffer_from_host(tp_plugin *p, int device, tp_dtype dt,
                               const int64_t *dims, int ndim, const void *data,
                               tp_buffer **out);
/* Copy the whole buffer into `dst` (`nbytes` must equal tp_buffer_nbytes).
 * Blocks until the data is there. */
tp_status *tp_buffer_to_host(tp_buffer *b, void *dst, size_t nbytes);
/* Copy a buffer to another device of the same plugin. */
tp_status *tp_buffer_copy_to_device(tp_buffer *b, int device, tp_buffer **out);
/* Block until the buffer's value has been computed (or failed). */
tp_status *tp_buffer_await(tp_buffer *b);
/* 1 if the buffer's value is computed (or its computation failed, or the
 * plugin cannot tell), 0 while it is pending.  Never blocks. */
int tp_buffer_is_ready(tp_buffer *b);
void tp_buffer_free(tp_buffer *b); /* NULL is a no-op */
/* Wait for the programs that make freed buffers (and destroy those). */
void tp_plugin_await_freed(tp_plugin *p);

tp_dtype tp_buffer_dtype(const tp_buffer *b);
int tp_buffer_rank(const tp_buffer *b);
const int64_t *tp_buffer_dims(const tp_buffer *b);
int64_t tp_buffer_numel(const tp_buffer *b);
size_t tp_buffer_nbytes(const tp_buffer *b);
int tp_buffer_device(const tp_buffer *b);

/* ---- programs ----------------------------------------------------------- */

/* Compile StableHLO (MLIR text, a module with a public func.func @main).
 * The executable can run on any addressable device (portable executable).
 * A program the plugin rejects returns TP_INVALID_ARGUMENT with the
 * plugin's message. */
tp_status *tp_compile(tp_plugin *p, const char *mlir, size_t len,
                      tp_exec **out);
int tp_exec_num_outputs(const tp_exec *e);
/* What the program's profiler events are called (the op or graph). */
void tp_exec_set_name(tp_exec *e, const char *name);
void tp_exec_free(tp_exec *e); /* NULL is a no-op */

/* Run `e` on `device`.  `args` are borrowed (a buffer whose `donate[i]` is
 * nonzero may be donated to the program and must not be used afterwards,
 * except to free it; `donate` NULL: none is).  `outs` must have
 * room for tp_exec_num_outputs(e) new buffers, owned by the caller.
 * Returns before the computation finishes where the plugin is
 * asynchronous; reading an output waits for it. */
tp_status *tp_execute(tp_exec *e, int device, tp_buffer *const *args,
                      int nargs, const unsigned char *donate, tp_buffer **outs, int nouts);

/* Serialize an executable (for the disk cache) and load it back. */
tp_status *tp_exec_serialize(tp_exec *e, void **data, size_t *len); /* free() data */
tp_status *tp_exec_deserialize(tp_plugin *p, const void *data, size_t len,
                               tp_exec **out);

/* Encode the minimal valid xla.CompileOptionsProto (1 replica, 1
 * partition, portable).  Exposed for the unit tests. `buf` must hold 64
 * bytes; returns the encoded length. */
size_t tp_encode_compile_options(uint8_t *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif

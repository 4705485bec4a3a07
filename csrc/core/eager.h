/* eager.h - run one ATen op on "tpu" tensors.
 *
 * The engine turns (op, arguments, outputs) into a one-op StableHLO program:
 * each distinct storage becomes a flat parameter, tensor views are
 * materialised from it inside the program (slice/reshape/transpose, or a
 * gather for overlapping views), the lowering rule runs, and results are
 * written back into the output storages (whole-buffer replacement, or an
 * update of just the viewed elements).  Programs are cached by a key built
 * from everything that shapes the program: op, dtypes, sizes, strides,
 * offsets, storage sizes and static attributes.  Runtime scalars (Python
 * numbers) and RNG keys are program parameters, so new values never
 * recompile.
 */
#ifndef TP_EAGER_H
#define TP_EAGER_H

#include "lower.h"
#include "storage.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A tensor as PyTorch sees it: a view (dtype, sizes, strides, offset in
 * elements) of a storage. */
typedef struct tp_tensor_ref {
  tp_storage *st;
  tp_dtype dt;
  int rank;
  int64_t sizes[TP_MAX_RANK];
  int64_t strides[TP_MAX_RANK];
  int64_t offset;
} tp_tensor_ref;

/* One op argument: `a` as in lower.h, with tensors given as refs instead of
 * values (a.v / a.vs are ignored). */
typedef struct tp_eager_arg {
  tp_arg a;
  const tp_tensor_ref *t;            /* TP_ARG_TENSOR */
  const tp_tensor_ref *const *ts;    /* TP_ARG_TENSORS: a.n entries, NULL = None */
} tp_eager_arg;

/* Run `op`.  `out_types[i]` is the type the op produces for output i (NULL:
 * the output ref's own dtype and sizes); the value is converted to
 * outs[i].dt when they differ (out= arguments).  All tensors must be on
 * one device. */
tp_status *tp_eager_run(const char *op, const tp_eager_arg *args, int nargs, const tp_type *out_types,
                        const tp_tensor_ref *outs, int nouts);

/* The random state of a user-created generator: (seed, counter).  Like
 * tp_eager_run, but random ops reserve their counter values from *rng
 * (advancing rng->offset) instead of from the device's state. */
typedef struct tp_rng_state {
  uint64_t seed, offset;
} tp_rng_state;
tp_status *tp_eager_run_rng(const char *op, const tp_eager_arg *args, int nargs, const tp_type *out_types,
                            const tp_tensor_ref *outs, int nouts, tp_rng_state *rng);

/* dst = src (tp::copy: src broadcast to dst's shape, converted to its dtype),
 * two views on one device. */
tp_status *tp_eager_copy(const tp_tensor_ref *src, const tp_tensor_ref *dst);

/* Host <-> device for one view.  `host` is dense row-major data of the
 * view's dtype and numel. */
tp_status *tp_eager_write_host(const tp_tensor_ref *dst, const void *host);
tp_status *tp_eager_read_host(const tp_tensor_ref *src, void *host);
/* Wait for every pending computation whose result lives on `device`
 * (-1: all devices). */
tp_status *tp_eager_synchronize(int device);

/* Persistent cache of compiled programs: `dir` NULL or "" turns it off.
 * Opening failures are returned (the caller warns and carries on without
 * it).  Entries are keyed by the program text and the plugin's identity. */
tp_status *tp_eager_set_disk_cache(const char *dir, int64_t cap_bytes);
/* The last error the disk cache hit while reading or writing (a warning, never
 * fatal), copied into buf; returns 0 if there was none since the last call. */
int tp_eager_disk_cache_error(char *buf, size_t cap);

/* The last op that compiled RECOMPILE_WARN_AT programs differing in one
 * argument only (eager.c, "recompiles"): its name, the argument's index in
 * the op's schema, the count, and whether the argument is a tensor (its
 * shape varied); 0 if none since the last call.  Each (op, argument) is
 * reported once. */
int tp_eager_recompile_note(char *op, size_t cap, int *arg, int *count, int *is_tensor);
/* Whether a note may be waiting (no lock: for a check after every op). */
int tp_eager_recompile_pending(void);

/* The values of a tensor whose storage was last written from the host by
 * tp_eager_write_host, as a whole, with integers of at most 32 KiB (a Python
 * list or a CPU tensor used as indices): copied into out; 0 if not known
 * there (any device write since drops them).  For index checks before launch. */
int tp_eager_host_values(const tp_tensor_ref *r, void *out, size_t cap);
#define TP_EAGER_HOST_COPY_MAX 32768 /* bytes of an upload whose values the host keeps */

typedef struct tp_eager_stats {
  int64_t cache_hits, cache_misses, compiles, compile_ns, executions;
  int64_t disk_hits, disk_misses, disk_writes, disk_corrupt, load_ns;
  int64_t h2d_transfers, h2d_bytes, d2h_transfers, d2h_bytes;
  int64_t cached_programs;
} tp_eager_stats;
void tp_eager_get_stats(tp_eager_stats *out);

/* ---- output specs by argument signature ----
 * An op's output dtypes, sizes and strides come from PyTorch's meta
 * functions, which run in Python (torch_pjrt/_dispatch.py).  The first calls
 * of an (op, argument signature) take that path and record the specs here;
 * the C++ kernels (csrc/glue/fast.cpp) then find them and run the op without
 * Python.  The signature is what a meta function can look at: each tensor's
 * dtype, sizes and strides, every non-tensor argument's value, and a Python
 * number's type (its value too when `numbers_by_value`: ops like arange whose
 * output shape depends on it).  Tensor-list arguments are not cached. */
#define TP_SPEC_MAX_OUTS 8
typedef struct tp_out_spec {
  int defined; /* 0: the op returns None (an undefined tensor) here */
  tp_dtype dt;
  int rank;
  int64_t sizes[TP_MAX_RANK];
  int64_t strides[TP_MAX_RANK];
} tp_out_spec;
typedef struct tp_op_specs {
  int n;
  tp_out_spec out[TP_SPEC_MAX_OUTS];
} tp_op_specs;
/* The process-wide setting that output specs depend on besides the
 * arguments: PyTorch's default dtype, as a dtype code (int tensor * 1.5 is of
 * that dtype).  Specs are recorded under the context last set (initially
 * TP_F32); setting another one drops them all. */
void tp_eager_specs_context(int ctx);
/* 1 and *out filled if the signature was recorded under context ctx, else 0. */
int tp_eager_specs_find(const char *op, const tp_eager_arg *args, int nargs, int numbers_by_value, int ctx,
                        tp_op_specs *out);
/* Record (best effort: out of memory, or a signature that cannot be cached,
 * records nothing).  At most TORCH_PJRT_SPEC_CACHE_SIZE signatures are kept
 * (default 65536); above it the table starts over. */
void tp_eager_specs_record(const char *op, const tp_eager_arg *args, int nargs, int numbers_by_value,
                           const tp_op_specs *specs);
/* A Python number as a runtime scalar argument (wrapped, lowest promotion
 * priority): float -> F64, int -> I64, bool -> BOOL. */
void tp_eager_number_f64(tp_arg *a, double v);
void tp_eager_number_int(tp_arg *a, int64_t v, int is_bool);
/* Drop all cached programs and output specs (tests; releases memory). */
void tp_eager_clear_cache(void);

#ifdef __cplusplus
}
#endif
#endif

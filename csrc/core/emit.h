/* emit.h - build one StableHLO function as MLIR text.
 *
 * Values are SSA ids with a known type.  Every op is written in MLIR's
 * generic form ("stablehlo.add"(%a, %b) : (...) -> ...), which the plugin's
 * parser accepts for every op and which keeps this emitter uniform.  The
 * helpers below are what lowering rules use; they never fail individually:
 * the first error (bad rank, out of memory) is remembered and reported by
 * em_finish, so rules can be written as straight-line code.
 */
#ifndef TP_EMIT_H
#define TP_EMIT_H

#include <stdint.h>

#include "dtype.h"
#include "pjrt.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tp_emit tp_emit;
typedef int tp_val; /* -1 = no value */

typedef struct tp_type {
  tp_dtype dt;
  int rank;
  int64_t dims[TP_MAX_RANK];
} tp_type;

int64_t tp_type_numel(const tp_type *t);
tp_type tp_type_make(tp_dtype dt, int rank, const int64_t *dims);
/* "tensor<2x3xf32>" into buf. */
const char *tp_type_str(const tp_type *t, char *buf, size_t cap);

tp_emit *em_new(void);
void em_free(tp_emit *e);
/* The program will run on XLA:CPU: pick the forms its code generator runs
 * well where they differ from the plain ones (column reductions, em_reduce).
 * Off by default. */
void em_set_cpu_codegen(tp_emit *e, int on);

/* Record an error (first one wins); returns -1 so rules can `return em_fail(...)`. */
tp_val em_fail(tp_emit *e, tp_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int em_failed(const tp_emit *e);
/* Take the recorded error (NULL if none). */
tp_status *em_take_error(tp_emit *e);

/* Function parameters, in order. */
tp_val em_param(tp_emit *e, const tp_type *t);
int em_num_params(const tp_emit *e);
/* Parameter number `param` may be donated to result number `result` (its
 * buffer reused for it): printed as tf.aliasing_output when the two types
 * are equal, ignored otherwise.  0, or -1 for bad numbers. */
int em_param_alias(tp_emit *e, int param, int result);
/* The type of v.  The pointer is valid until the next emission (the type
 * table grows by realloc): copy the type, or what it needs, before emitting. */
const tp_type *em_type(const tp_emit *e, tp_val v);
/* Finish: `results` become the function's return values.  Returns the
 * whole module text (owned by the emitter) or NULL on error. */
const char *em_finish(tp_emit *e, const tp_val *results, int n);

/* ---- generic op --------------------------------------------------------- */
/* `attrs` is the text inside {...} without braces, or NULL. */
tp_val em_op(tp_emit *e, const char *name, const char *attrs, const tp_val *in,
             int nin, const tp_type *out);

/* Add a function (MLIR `func.func` text, private, its symbol unique to it)
 * to the program's module, once however often it is added. */
int em_add_function(tp_emit *e, const char *text);
/* Call a function of the module (em_add_function) on `in`; its nout results
 * (types `outs`) are written to res.  0, or -1 with the emitter failed. */
int em_call(tp_emit *e, const char *callee, const tp_val *in, int nin, const tp_type *outs, int nout, tp_val *res);

/* ---- constants and shapes ------------------------------------------------- */
tp_val em_const(tp_emit *e, double v, tp_dtype dt);            /* rank-0 */
tp_val em_const_i(tp_emit *e, int64_t v, tp_dtype dt);         /* rank-0, exact ints */
tp_val em_const_c(tp_emit *e, double re, double im, tp_dtype dt); /* rank-0 complex */
tp_val em_full(tp_emit *e, double v, const tp_type *t);        /* splat of shape t */
tp_val em_iota(tp_emit *e, const tp_type *t, int dim);
tp_val em_convert(tp_emit *e, tp_val x, tp_dtype dt);          /* no-op if same */
/* x rounded to the values of a narrower float dt (f64 -> f32; f32/f64 ->
 * f16 or bf16; otherwise x), type kept.  Unlike a convert pair, XLA never removes it ("excess precision"
 * lets XLA:CPU drop f32 -> f16 -> f32 round trips), so rules that must round
 * intermediates where PyTorch's CPU kernels do use this. */
tp_val em_round_to(tp_emit *e, tp_val x, tp_dtype dt);
tp_val em_bitcast(tp_emit *e, tp_val x, const tp_type *t);
/* A rank-1 value's bytes as dtype `to` (Tensor.view(dtype) of a contiguous
 * 1-d tensor): a bitcast, elements regrouped where the sizes differ; complex
 * values through their (re, im) parts, bool through uint8. */
tp_val em_reinterpret(tp_emit *e, tp_val flat, tp_dtype to);
tp_val em_reshape(tp_emit *e, tp_val x, int rank, const int64_t *dims);
tp_val em_transpose(tp_emit *e, tp_val x, const int64_t *perm);
/* S where v is S's 2-d transpose (em_transpose), perhaps converted to
 * another float dtype since; else -1. */
tp_val em_transpose_source(const tp_emit *e, tp_val v);
/* broadcast_in_dim: x's dim i goes to output dim map[i]. */
tp_val em_bcast_in_dim(tp_emit *e, tp_val x, const tp_type *out, const int64_t *map);
/* numpy-style broadcast of x to `rank`/`dims` (trailing alignment). */
tp_val em_bcast_to(tp_emit *e, tp_val x, int rank, const int64_t *dims);
tp_val em_slice(tp_emit *e, tp_val x, const int64_t *start, const int64_t *limit,
                const int64_t *stride);
tp_val em_pad(tp_emit *e, tp_val x, tp_val padval, const int64_t *lo, const int64_t *hi,
              const int64_t *interior);
tp_val em_concat(tp_emit *e, const tp_val *xs, int n, int dim);
/* dynamic_update_slice with constant start indices. */
tp_val em_update_slice(tp_emit *e, tp_val x, tp_val upd, const int64_t *start);
/* dynamic_slice / dynamic_update_slice at runtime start indices: start[i] is a
 * rank-0 integer value per dim of x (XLA clamps starts so the slice fits). */
tp_val em_dyn_slice(tp_emit *e, tp_val x, const tp_val *start, const int64_t *sizes);
tp_val em_dyn_update_slice(tp_emit *e, tp_val x, tp_val upd, const tp_val *start);

/* ---- elementwise ------------------------------------------------------------ */
/* Names the op being lowered in the emitter's messages; returns the previous one. */
const char *em_set_op(tp_emit *e, const char *op);
tp_val em_unary(tp_emit *e, const char *op, tp_val x);            /* "stablehlo.exponential" */
tp_val em_binary(tp_emit *e, const char *op, tp_val a, tp_val b); /* same shapes */
/* dir: "EQ","NE","LT","LE","GT","GE"; result i1 */
tp_val em_compare(tp_emit *e, const char *dir, tp_val a, tp_val b);
tp_val em_select(tp_emit *e, tp_val pred, tp_val a, tp_val b);
tp_val em_clamp(tp_emit *e, tp_val lo, tp_val x, tp_val hi);

/* ---- reductions and contractions ------------------------------------------- */
/* Reduce `x` over `dims` with a binary body op ("stablehlo.add", "stablehlo.maximum",
 * "stablehlo.minimum", "stablehlo.multiply", "stablehlo.and", "stablehlo.or"). */
tp_val em_reduce(tp_emit *e, tp_val x, tp_val init, const int64_t *dims, int ndims,
                 const char *body_op);
/* The leading factor a of n = a*b with a, b <= 32, for 32 < n <= max (else 0):
 * a reduction over [a, b] compiles to one XLA CPU kernel, over [n] to two.
 * em_reduce splits its dims this way; EM_SPLIT_SUM_MAX bounds floating-point sums. */
#define EM_SPLIT_SUM_MAX 256
int64_t em_split_dim(int64_t n, int64_t max);
/* Argmax/argmin over one dim: returns values and i64 indices (first index on ties,
 * NaN wins like PyTorch). `is_max` selects the direction. */
void em_argreduce(tp_emit *e, tp_val x, int dim, int is_max, tp_val *values, tp_val *indices);
tp_val em_dot(tp_emit *e, tp_val a, tp_val b, const int64_t *lb, const int64_t *rb, int nbatch,
              const int64_t *lc, const int64_t *rc, int ncontract, tp_dtype out_dt);

/* ---- gather/scatter on a flat operand ------------------------------------------ */
/* out[idx...] = x1d[index[idx...]]; `index` is an integer tensor of any shape. */
tp_val em_gather_flat(tp_emit *e, tp_val x1d, tp_val index);
/* x1d with x1d[index[i]] = upd[i] (replace; later duplicates win arbitrarily). */
tp_val em_scatter_flat(tp_emit *e, tp_val x1d, tp_val index, tp_val upd, const char *combine);

/* ---- structured while loop ------------------------------------------------------ */
/* A stablehlo.while carrying n values (1..EM_LOOP_MAX):
 *   tp_val a[k], b[k], out[k]; em_loop L;
 *   em_while_begin(e, &L, init, k, a);  -- emit the condition from a[] ...
 *   em_while_body(e, &L, pred, b);      -- pred: rank-0 bool; emit the body from b[] ...
 *   em_while_end(e, &L, next, out);     -- next[i] typed like init[i]; out[] are the results
 * Values from outside the loop may be used inside it; values made inside one
 * region must not be used outside it.  Each call returns 0, or -1 after em_fail. */
#define EM_LOOP_MAX 16
typedef struct em_loop {
  int n;
  tp_val res;
  tp_val init[EM_LOOP_MAX];
} em_loop;
int em_while_begin(tp_emit *e, em_loop *L, const tp_val *init, int n, tp_val *args);
int em_while_body(tp_emit *e, em_loop *L, tp_val pred, tp_val *args);
int em_while_end(tp_emit *e, em_loop *L, const tp_val *next, tp_val *outs);

/* ---- conditional ------------------------------------------------------------------ */
/* A stablehlo.case on a rank-0 i32 index: only the branch it picks runs (an
 * index out of range runs the last).  Each branch returns one value, all of
 * one type:
 *   em_case C; em_case_begin(e, &C, index, n);
 *   ... emit branch 0 ...; em_case_next(e, &C, v0);
 *   ... emit branch 1 ...; em_case_next(e, &C, v1); ...
 *   tp_val out = em_case_end(e, &C);
 * Values made inside a branch must not be used outside it.  begin/next
 * return 0, or -1 after em_fail; end returns the result or -1. */
typedef struct em_case {
  int n, done;
  tp_val res;
  tp_type t;
} em_case;
int em_case_begin(tp_emit *e, em_case *C, tp_val index, int n);
int em_case_next(tp_emit *e, em_case *C, tp_val v);
tp_val em_case_end(tp_emit *e, em_case *C);

#ifdef __cplusplus
}
#endif
#endif

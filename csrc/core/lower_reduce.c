/* lower_reduce.c - reductions, scans, softmax, matrix products and sorting.
 *
 * Conventions (see lower_elementwise.c): the output dtype and shape come from
 * PyTorch's meta function (n->outs).  Reductions accumulate in
 * lw_opmath(out dtype) (f32 for f16/bf16, as PyTorch's CPU kernels do) and
 * round once; the reduced value is reshaped to the output's shape, which
 * takes care of keepdim.  Number arguments (beta, alpha, correction, ord)
 * may be runtime scalars: behaviour that depends on their value is chosen
 * in the program (select, or stablehlo.case for vector_norm's ord), so a new
 * value never recompiles; num_arg also takes them as static numbers. */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lower_util.h"

/* ---- small helpers ------------------------------------------------------------ */

static tp_val add(tp_emit *e, tp_val a, tp_val b) { return lw_bin(e, "stablehlo.add", a, b); }
static tp_val sub(tp_emit *e, tp_val a, tp_val b) { return lw_bin(e, "stablehlo.subtract", a, b); }
static tp_val mul(tp_emit *e, tp_val a, tp_val b) { return lw_bin(e, "stablehlo.multiply", a, b); }
static tp_val dv(tp_emit *e, tp_val a, tp_val b) { return lw_bin(e, "stablehlo.divide", a, b); }
static tp_val un(tp_emit *e, const char *op, tp_val a) { return em_unary(e, op, a); }
static tp_val kl(tp_emit *e, tp_val like, double v) { return lw_full_like(e, like, v); }
static int rank_of(tp_emit *e, tp_val v) { return em_type(e, v)->rank; }
static tp_dtype dt_of(tp_emit *e, tp_val v) { return em_type(e, v)->dt; }

/* Select between two values of the same type on a rank-0 predicate. */
static tp_val sel0(tp_emit *e, tp_val pred0, tp_val a, tp_val b) {
  const tp_type *t = em_type(e, a);
  if (t->rank > 0) pred0 = em_bcast_to(e, pred0, t->rank, t->dims);
  return em_select(e, pred0, a, b);
}

/* A number argument as a rank-0 value of dt: a runtime scalar or tensor, a
 * static int/float (how a `Scalar?` argument arrives today), or `def` if None. */
static tp_val num_arg(tp_emit *e, const tp_node *n, int i, tp_dtype dt, double def) {
  const tp_arg *a = lw_arg(n, i);
  switch (a->kind) {
    case TP_ARG_SCALAR:
    case TP_ARG_TENSOR: return lw_tensor(e, n, i, dt);
    case TP_ARG_INT:
    case TP_ARG_BOOL: return em_const_i(e, a->i, dt);
    case TP_ARG_FLOAT: return em_const(e, a->f, dt);
    default: return em_const(e, def, dt);
  }
}

/* Reshape v to output i's shape (keepdim, squeezes) and convert to its dtype. */
static tp_val to_out(tp_emit *e, const tp_node *n, int i, tp_val v) {
  const tp_type *o = &n->outs[i];
  v = em_reshape(e, v, o->rank, o->dims);
  return em_convert(e, v, o->dt);
}

/* The smallest / largest value of dt (identity of max / min). */
static tp_val lowest(tp_emit *e, tp_dtype dt) {
  if (tp_dtype_is_float(dt)) return em_const(e, -INFINITY, dt);
  if (dt == TP_BOOL || tp_dtype_is_unsigned(dt)) return em_const_i(e, 0, dt);
  switch (dt) {
    case TP_I8: return em_const_i(e, INT8_MIN, dt);
    case TP_I16: return em_const_i(e, INT16_MIN, dt);
    case TP_I32: return em_const_i(e, INT32_MIN, dt);
    default: return em_const_i(e, INT64_MIN, dt);
  }
}
static tp_val highest(tp_emit *e, tp_dtype dt) {
  if (tp_dtype_is_float(dt)) return em_const(e, INFINITY, dt);
  if (dt == TP_BOOL) return em_const_i(e, 1, dt);
  if (tp_dtype_is_unsigned(dt)) return em_const_i(e, -1, dt); /* all ones */
  switch (dt) {
    case TP_I8: return em_const_i(e, INT8_MAX, dt);
    case TP_I16: return em_const_i(e, INT16_MAX, dt);
    case TP_I32: return em_const_i(e, INT32_MAX, dt);
    default: return em_const_i(e, INT64_MAX, dt);
  }
}

/* PyTorch's IndexError (maybe_wrap_dim) for a dim outside a rank-`rank` input. */
static void dim_out_of_range(tp_emit *e, int64_t dim, int rank) {
  int r = rank > 0 ? rank : 1;
  em_fail(e, TP_OUT_OF_RANGE, "Dimension out of range (expected to be in range of [%d, %d], but got %" PRId64 ")", -r,
          r - 1, dim);
}

/* Dims to reduce from int-list argument i of a rank-`rank` input.  None
 * reduces everything; so does [] when empty_all.  A rank-0 input accepts
 * dim 0/-1 and reduces nothing.  Returns the count (-1 on error). */
static int red_dims(tp_emit *e, const tp_node *n, int i, int rank, int empty_all, int64_t *dims) {
  const int64_t *v = NULL;
  int k = lw_ints(n, i, &v);
  if (lw_is_none(n, i) || (k == 0 && empty_all)) {
    for (int d = 0; d < rank; d++) dims[d] = d;
    return rank;
  }
  int nd = 0;
  for (int j = 0; j < k; j++) {
    int d = lw_dim(v[j], rank);
    if (d < 0 || d >= (rank > 0 ? rank : 1)) {
      dim_out_of_range(e, v[j], rank);
      return -1;
    }
    if (rank == 0) continue;
    for (int m = 0; m < nd; m++)
      if (dims[m] == d) {
        em_fail(e, TP_INVALID_ARGUMENT, "%s: dim %d appears multiple times in the list of dims", n->op, d);
        return -1;
      }
    dims[nd++] = d;
  }
  return nd;
}

/* One static dim argument (0 for a rank-0 input). */
static int one_dim(tp_emit *e, const tp_node *n, int i, int rank) {
  int64_t raw = lw_int(n, i, 0);
  int d = lw_dim(raw, rank);
  if (d < 0 || d >= (rank > 0 ? rank : 1)) {
    dim_out_of_range(e, raw, rank);
    return -1;
  }
  return rank == 0 ? -1 : d; /* -1: nothing to reduce */
}

static int64_t count_of(tp_emit *e, tp_val x, const int64_t *dims, int nd) {
  const tp_type *t = em_type(e, x);
  int64_t c = 1;
  for (int i = 0; i < nd; i++) c *= t->dims[dims[i]];
  return c;
}

/* Broadcast a reduced value r (x's dims minus `dims`) back to x's shape. */
static tp_val expand_back(tp_emit *e, tp_val r, tp_val x, const int64_t *dims, int nd) {
  const tp_type *t = em_type(e, x);
  int64_t map[TP_MAX_RANK];
  int k = 0;
  for (int i = 0; i < t->rank; i++) {
    int red = 0;
    for (int j = 0; j < nd; j++) red |= dims[j] == i;
    if (!red) map[k++] = i;
  }
  tp_type bt = *t;
  bt.dt = dt_of(e, r);
  return em_bcast_in_dim(e, r, &bt, map);
}

static tp_val rsum(tp_emit *e, tp_val x, const int64_t *dims, int nd) {
  return em_reduce(e, x, em_const(e, 0, dt_of(e, x)), dims, nd, "stablehlo.add");
}
/* XLA:CPU's maximum/minimum reductions drop NaNs; PyTorch propagates them. */
static tp_val nan_fix(tp_emit *e, tp_val x, tp_val r, const int64_t *dims, int nd) {
  if (!tp_dtype_is_float(dt_of(e, x))) return r;
  tp_val anynan = em_reduce(e, em_compare(e, "NE", x, x), em_const_i(e, 0, TP_BOOL), dims, nd, "stablehlo.or");
  return em_select(e, anynan, kl(e, r, NAN), r);
}
/* max ignoring NaNs: enough where NaN propagates through later arithmetic */
static tp_val rmax_nonan(tp_emit *e, tp_val x, const int64_t *dims, int nd) {
  tp_dtype dt = dt_of(e, x);
  return em_reduce(e, x, lowest(e, dt), dims, nd, dt == TP_BOOL ? "stablehlo.or" : "stablehlo.maximum");
}
static tp_val rmax(tp_emit *e, tp_val x, const int64_t *dims, int nd) {
  return nan_fix(e, x, rmax_nonan(e, x, dims, nd), dims, nd);
}
static tp_val rmin(tp_emit *e, tp_val x, const int64_t *dims, int nd) {
  tp_dtype dt = dt_of(e, x);
  tp_val r = em_reduce(e, x, highest(e, dt), dims, nd, dt == TP_BOOL ? "stablehlo.and" : "stablehlo.minimum");
  return nan_fix(e, x, r, dims, nd);
}

/* The input (argument 0) converted to the output dtype (the dtype= argument's
 * cast, or the int->int64 promotion), then to its opmath dtype. */
static tp_val input_acc(tp_emit *e, const tp_node *n, int i) {
  tp_dtype od = n->outs[i].dt;
  tp_val x = lw_value(e, n, 0);
  if (tp_dtype_is_complex(dt_of(e, x)) && !tp_dtype_is_complex(od))
    return em_fail(e, TP_UNIMPLEMENTED, "%s: complex input with a real result is not supported", n->op);
  x = em_convert(e, x, od);
  return em_convert(e, x, lw_opmath(od));
}

/* ---- ops with regions ---------------------------------------------------------
 *
 * emit.h writes regions only inside em_reduce and em_argreduce, so ops such
 * as stablehlo.sort and stablehlo.case are written here as text through
 * em_op's op-name argument.  em_op prints
 *     %vV = "NAME"(ins) {attrs} : (in types) -> T
 * raw_text() passes NAME = `stablehlo.reshape"(%vA) : (TA) -> TA <text>
 * %jK = "stablehlo.reshape`, so the line becomes a dead reshape of an
 * anchor value, the text, and a second dead reshape that em_op completes
 * (the compiler removes both).  raw_bind() turns a named result of such text
 * into an ordinary value.  Values defined inside a region must not be used
 * after it closes. */
typedef struct sbuild {
  char *p;
  size_t len, cap;
  int oom;
} sbuild;

static void sbp(sbuild *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sbp(sbuild *b, const char *fmt, ...) {
  if (b->oom) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    size_t room = b->cap - b->len;
    int k = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? room : 0, fmt, ap);
    va_end(ap);
    if (k < 0) {
      b->oom = 1;
      return;
    }
    if (b->p && (size_t)k < room) {
      b->len += (size_t)k;
      return;
    }
    size_t nc = b->cap ? b->cap * 2 : 2048;
    while (nc < b->len + (size_t)k + 1) nc *= 2;
    char *np = realloc(b->p, nc);
    if (!np) {
      b->oom = 1;
      return;
    }
    b->p = np;
    b->cap = nc;
  }
}

/* A number for names no other value in this program uses: the id of a fresh
 * (dead) value.  Deterministic, so equal programs have equal text (the
 * persistent cache is keyed by the text). */
static unsigned raw_id(tp_emit *e) {
  tp_val tag = em_const_i(e, 0, TP_I8);
  return tag < 0 ? 0u : (unsigned)tag;
}

static const char *tstr(tp_emit *e, tp_val v, char *buf, size_t cap) { return tp_type_str(em_type(e, v), buf, cap); }

/* Write whole statements `text`; `anchor` is any value visible there. */
static void raw_text(tp_emit *e, tp_val anchor, const char *text) {
  if (em_failed(e)) return;
  char ta[256];
  tstr(e, anchor, ta, sizeof ta);
  sbuild b = {0};
  sbp(&b, "stablehlo.reshape\"(%%v%d) : (%s) -> %s\n%s    %%j%u = \"stablehlo.reshape", anchor, ta, ta, text, raw_id(e));
  if (b.oom) em_fail(e, TP_RESOURCE_EXHAUSTED, "out of memory building a program");
  else em_op(e, b.p, NULL, &anchor, 1, em_type(e, anchor));
  free(b.p);
}

/* The SSA result `name` ("%s3#0") of type t, as a value. */
static tp_val raw_bind(tp_emit *e, const char *name, const tp_type *t) {
  tp_val c = em_const(e, 0, t->dt);
  if (em_failed(e)) return -1;
  char tt[256], nm[768];
  tp_type_str(t, tt, sizeof tt);
  snprintf(nm, sizeof nm, "stablehlo.reshape\"(%s) : (%s) -> %s\n    %%j%u = \"stablehlo.broadcast_in_dim", name, tt, tt,
           raw_id(e));
  return em_op(e, nm, "broadcast_dimensions = array<i64>", &c, 1, t);
}

/* stablehlo.case on a rank-0 i32 index: case_open, then for each branch its
 * ops and case_next(result) (the last one closes), then case_result. */
typedef struct tp_case {
  unsigned id;
  tp_val index;
  int nbranch, done;
  tp_type t;
} tp_case;

static void case_open(tp_emit *e, tp_case *c, tp_val index, int nbranch, const tp_type *t) {
  c->id = raw_id(e);
  c->index = index;
  c->nbranch = nbranch;
  c->done = 0;
  c->t = *t;
  char buf[96];
  snprintf(buf, sizeof buf, "    %%c%u = \"stablehlo.case\"(%%v%d) ({\n", c->id, index);
  raw_text(e, index, buf);
}

static void case_next(tp_emit *e, tp_case *c, tp_val result) {
  if (em_failed(e)) return;
  char tt[256], ti[64], buf[768];
  tp_type_str(&c->t, tt, sizeof tt);
  tstr(e, c->index, ti, sizeof ti);
  if (em_type(e, result)->rank != c->t.rank || em_type(e, result)->dt != c->t.dt) {
    em_fail(e, TP_INTERNAL, "case branch result type mismatch");
    return;
  }
  int last = ++c->done == c->nbranch;
  snprintf(buf, sizeof buf, "      \"stablehlo.return\"(%%v%d) : (%s) -> ()\n    %s", result, tt,
           last ? "" : "}, {\n");
  if (last) {
    size_t k = strlen(buf);
    snprintf(buf + k, sizeof buf - k, "}) : (%s) -> %s\n", ti, tt);
  }
  raw_text(e, c->index, buf);
}

static tp_val case_result(tp_emit *e, const tp_case *c) {
  char nm[32];
  snprintf(nm, sizeof nm, "%%c%u", c->id);
  return raw_bind(e, nm, &c->t);
}

/* ---- sum / mean / prod ------------------------------------------------------------ */

/* sum.dim_IntList(self, dim, keepdim, dtype) / sum(self, dtype) */
static void sum_like(tp_emit *e, const tp_node *n, tp_val *o, int dim_i, int is_mean) {
  tp_val x = input_acc(e, n, 0);
  int64_t dims[TP_MAX_RANK];
  /* the full forms have no dim argument: red_dims reads it as None (all) */
  int nd = red_dims(e, n, dim_i < 0 ? n->nargs + 1 : dim_i, rank_of(e, x), 1, dims);
  if (nd < 0) return;
  tp_val s = rsum(e, x, dims, nd);
  if (is_mean) s = dv(e, s, kl(e, s, (double)count_of(e, x, dims, nd)));
  o[0] = to_out(e, n, 0, s);
}
static void r_sum(tp_emit *e, const tp_node *n, tp_val *o) { sum_like(e, n, o, -1, 0); }
static void r_sum_dim(tp_emit *e, const tp_node *n, tp_val *o) { sum_like(e, n, o, 1, 0); }
static void r_mean(tp_emit *e, const tp_node *n, tp_val *o) { sum_like(e, n, o, -1, 1); }
static void r_mean_dim(tp_emit *e, const tp_node *n, tp_val *o) { sum_like(e, n, o, 1, 1); }

/* prod(self, dtype) / prod.dim_int(self, dim, keepdim, dtype) */
static void prod_like(tp_emit *e, const tp_node *n, tp_val *o, int has_dim) {
  tp_val x = input_acc(e, n, 0);
  int64_t dims[TP_MAX_RANK];
  int nd = rank_of(e, x);
  for (int d = 0; d < nd; d++) dims[d] = d;
  if (has_dim) {
    if (em_failed(e)) return;
    int d = one_dim(e, n, 1, rank_of(e, x));
    if (em_failed(e)) return;
    nd = d < 0 ? 0 : 1;
    dims[0] = d;
  }
  tp_dtype dt = dt_of(e, x);
  tp_val p = em_reduce(e, x, em_const(e, 1, dt), dims, nd, dt == TP_BOOL ? "stablehlo.and" : "stablehlo.multiply");
  o[0] = to_out(e, n, 0, p);
}
static void r_prod(tp_emit *e, const tp_node *n, tp_val *o) { prod_like(e, n, o, 0); }
static void r_prod_dim(tp_emit *e, const tp_node *n, tp_val *o) { prod_like(e, n, o, 1); }

/* ---- max / min family ---------------------------------------------------------------- */

/* amax/amin(self, dim=[], keepdim); max/min(self) with dim_i < 0. */
static void minmax_like(tp_emit *e, const tp_node *n, tp_val *o, int dim_i, int is_max) {
  tp_val x = lw_value(e, n, 0);
  int64_t dims[TP_MAX_RANK];
  int nd = rank_of(e, x);
  for (int d = 0; d < nd; d++) dims[d] = d;
  if (dim_i >= 0) nd = red_dims(e, n, dim_i, rank_of(e, x), 1, dims);
  if (nd < 0) return;
  if (tp_dtype_is_complex(dt_of(e, x))) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: not supported for complex tensors", n->op);
    return;
  }
  o[0] = to_out(e, n, 0, is_max ? rmax(e, x, dims, nd) : rmin(e, x, dims, nd));
}
static void r_amax(tp_emit *e, const tp_node *n, tp_val *o) { minmax_like(e, n, o, 1, 1); }
static void r_amin(tp_emit *e, const tp_node *n, tp_val *o) { minmax_like(e, n, o, 1, 0); }
static void r_max(tp_emit *e, const tp_node *n, tp_val *o) { minmax_like(e, n, o, -1, 1); }
static void r_min(tp_emit *e, const tp_node *n, tp_val *o) { minmax_like(e, n, o, -1, 0); }

/* hash_tensor(self, dim=[], keepdim, mode=0): the XOR of the elements' bits,
 * each widened to 64 bits first (floats to double, integers and bools to
 * int64), as the CPU kernel computes it. */
static void r_hash_tensor(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = lw_value(e, n, 0);
  tp_dtype dt = dt_of(e, x);
  if (lw_int(n, 3, 0) != 0 || tp_dtype_is_complex(dt)) {
    o[0] = em_fail(e, TP_UNIMPLEMENTED, "%s: mode %" PRId64 " of %s is not supported on tpu", n->op, lw_int(n, 3, 0),
                   tp_scalar_type_name(dt));
    return;
  }
  int64_t dims[TP_MAX_RANK];
  int nd = red_dims(e, n, 1, rank_of(e, x), 1, dims);
  if (nd < 0) return;
  x = em_convert(e, x, tp_dtype_is_float(dt) ? TP_F64 : tp_dtype_is_unsigned(dt) ? TP_U64 : TP_I64);
  tp_type t = *em_type(e, x);
  t.dt = TP_U64;
  x = em_bitcast(e, x, &t);
  o[0] = to_out(e, n, 0, em_reduce(e, x, em_const_i(e, 0, TP_U64), dims, nd, "stablehlo.xor"));
}

/* em_argreduce, for every dtype: it writes its i8/i16/i32 identity as an
 * out-of-range INT64_MIN/MAX constant first, which fails to parse, so those
 * run widened to i64 (exact). */
static void argreduce(tp_emit *e, tp_val x, int dim, int is_max, tp_val *v, tp_val *i) {
  tp_dtype dt = dt_of(e, x);
  int widen = dt == TP_I8 || dt == TP_I16 || dt == TP_I32;
  em_argreduce(e, widen ? em_convert(e, x, TP_I64) : x, dim, is_max, v, i);
  if (widen) *v = em_convert(e, *v, dt);
}

/* max.dim / min.dim(self, dim, keepdim) -> (values, indices) */
static void minmax_dim(tp_emit *e, const tp_node *n, tp_val *o, int is_max) {
  tp_val x = lw_value(e, n, 0);
  int d = one_dim(e, n, 1, rank_of(e, x));
  if (em_failed(e)) return;
  if (d < 0) { /* rank 0 */
    o[0] = to_out(e, n, 0, x);
    o[1] = to_out(e, n, 1, em_const_i(e, 0, TP_I64));
    return;
  }
  tp_val v, i;
  argreduce(e, x, d, is_max, &v, &i);
  o[0] = to_out(e, n, 0, v);
  o[1] = to_out(e, n, 1, i);
}
static void r_max_dim(tp_emit *e, const tp_node *n, tp_val *o) { minmax_dim(e, n, o, 1); }
static void r_min_dim(tp_emit *e, const tp_node *n, tp_val *o) { minmax_dim(e, n, o, 0); }

/* argmax / argmin(self, dim=None, keepdim) */
static void arg_like(tp_emit *e, const tp_node *n, tp_val *o, int is_max) {
  tp_val x = lw_value(e, n, 0);
  int d;
  if (lw_is_none(n, 1)) {
    int64_t numel = tp_type_numel(em_type(e, x));
    x = em_reshape(e, x, 1, &numel);
    d = 0;
  } else {
    d = one_dim(e, n, 1, rank_of(e, x));
    if (em_failed(e)) return;
    if (d < 0) {
      o[0] = to_out(e, n, 0, em_const_i(e, 0, TP_I64));
      return;
    }
  }
  tp_val v, i;
  argreduce(e, x, d, is_max, &v, &i);
  o[0] = to_out(e, n, 0, i);
}
static void r_argmax(tp_emit *e, const tp_node *n, tp_val *o) { arg_like(e, n, o, 1); }
static void r_argmin(tp_emit *e, const tp_node *n, tp_val *o) { arg_like(e, n, o, 0); }

/* ---- any / all ---------------------------------------------------------------------- */

/* mode: 0 full, 1 .dim (one int), 2 .dims (int[]? : None = all, [] = none) */
static void anyall(tp_emit *e, const tp_node *n, tp_val *o, int mode, int is_any) {
  tp_val x = em_convert(e, lw_value(e, n, 0), TP_BOOL);
  int r = rank_of(e, x);
  int64_t dims[TP_MAX_RANK];
  int nd = r;
  for (int d = 0; d < nd; d++) dims[d] = d;
  if (mode == 1) {
    int d = one_dim(e, n, 1, r);
    if (em_failed(e)) return;
    nd = d < 0 ? 0 : 1;
    dims[0] = d;
  } else if (mode == 2) {
    nd = red_dims(e, n, 1, r, 0, dims);
    if (nd < 0) return;
  }
  tp_val v = em_reduce(e, x, em_const_i(e, is_any ? 0 : 1, TP_BOOL), dims, nd, is_any ? "stablehlo.or" : "stablehlo.and");
  o[0] = to_out(e, n, 0, v);
}
static void r_any(tp_emit *e, const tp_node *n, tp_val *o) { anyall(e, n, o, 0, 1); }
static void r_any_dim(tp_emit *e, const tp_node *n, tp_val *o) { anyall(e, n, o, 1, 1); }
static void r_any_dims(tp_emit *e, const tp_node *n, tp_val *o) { anyall(e, n, o, 2, 1); }
static void r_all(tp_emit *e, const tp_node *n, tp_val *o) { anyall(e, n, o, 0, 0); }
static void r_all_dim(tp_emit *e, const tp_node *n, tp_val *o) { anyall(e, n, o, 1, 0); }
static void r_all_dims(tp_emit *e, const tp_node *n, tp_val *o) { anyall(e, n, o, 2, 0); }

/* ---- var / std ------------------------------------------------------------------------ */

/* var.correction(self, dim=None, *, correction=None, keepdim) and friends.
 * which: 0 var, 1 std, 2 var_mean, 3 std_mean.  Two passes (mean, then the
 * sum of squared deviations) in opmath; divisor max(N - correction, 0). */
static void var_like(tp_emit *e, const tp_node *n, tp_val *o, int which) {
  tp_val x = lw_value(e, n, 0);
  tp_dtype od = n->outs[0].dt;
  if (tp_dtype_is_complex(dt_of(e, x))) {
    o[0] = em_fail(e, TP_UNIMPLEMENTED, "%s: complex input is not supported", n->op);
    return;
  }
  tp_dtype ct = lw_opmath(od);
  x = em_convert(e, x, ct);
  int64_t dims[TP_MAX_RANK];
  int nd = red_dims(e, n, 1, rank_of(e, x), 1, dims);
  if (nd < 0) return;
  int64_t cnt = count_of(e, x, dims, nd);
  tp_val mean = dv(e, rsum(e, x, dims, nd), em_const(e, (double)cnt, ct));
  tp_val dev = sub(e, x, expand_back(e, mean, x, dims, nd));
  tp_val ss = rsum(e, mul(e, dev, dev), dims, nd);
  tp_val corr = num_arg(e, n, 2, ct, 1);
  tp_val div = em_binary(e, "stablehlo.maximum", sub(e, em_const(e, (double)cnt, ct), corr), em_const(e, 0, ct));
  tp_val var = dv(e, ss, div);
  if (which == 1 || which == 3) var = un(e, "stablehlo.sqrt", var);
  o[0] = to_out(e, n, 0, var);
  if (which >= 2) o[1] = to_out(e, n, 1, mean);
}
static void r_var(tp_emit *e, const tp_node *n, tp_val *o) { var_like(e, n, o, 0); }
static void r_std(tp_emit *e, const tp_node *n, tp_val *o) { var_like(e, n, o, 1); }
static void r_var_mean(tp_emit *e, const tp_node *n, tp_val *o) { var_like(e, n, o, 2); }
static void r_std_mean(tp_emit *e, const tp_node *n, tp_val *o) { var_like(e, n, o, 3); }

/* ---- logsumexp / norms ------------------------------------------------------------------ */

/* logsumexp(self, dim, keepdim): m + log(sum(exp(x - m))), m = max with
 * infinities replaced by 0 (so all -inf gives -inf and +inf gives +inf). */
static void r_logsumexp(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_dtype ct = lw_opmath(n->outs[0].dt);
  if (tp_dtype_is_complex(ct)) {
    o[0] = em_fail(e, TP_UNIMPLEMENTED, "%s: complex input is not supported", n->op);
    return;
  }
  tp_val x = em_convert(e, lw_value(e, n, 0), ct);
  int64_t dims[TP_MAX_RANK];
  int nd = red_dims(e, n, 1, rank_of(e, x), 1, dims);
  if (nd < 0) return;
  tp_val m = rmax_nonan(e, x, dims, nd); /* a NaN reaches the sum */
  tp_val isinf = em_compare(e, "EQ", un(e, "stablehlo.abs", m), kl(e, m, INFINITY));
  m = em_select(e, isinf, kl(e, m, 0), m);
  tp_val s = rsum(e, un(e, "stablehlo.exponential", sub(e, x, expand_back(e, m, x, dims, nd))), dims, nd);
  o[0] = to_out(e, n, 0, add(e, un(e, "stablehlo.log", s), m));
}

/* linalg_vector_norm(self, ord=2, dim=None, keepdim, *, dtype).  `ord` is a
 * runtime scalar: a stablehlo.case runs only the branch for its value (a
 * select over all variants would pay for pow on every call). */
static void r_vector_norm(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_dtype od = n->outs[0].dt, ct = lw_opmath(od);
  tp_val x = lw_value(e, n, 0);
  if (!lw_is_none(n, 4)) x = em_convert(e, x, (tp_dtype)lw_int(n, 4, od));
  int is_cplx = tp_dtype_is_complex(em_type(e, x)->dt);
  int64_t dims[TP_MAX_RANK];
  int nd = red_dims(e, n, 2, rank_of(e, x), 1, dims);
  if (nd < 0) return;
  tp_val p = num_arg(e, n, 1, ct, 2);
  /* branch: 0 -> ord 2, 1 -> 1, 2 -> inf, 3 -> -inf, 4 -> 0, 5 -> other p */
  static const double ords[5] = {2, 1, INFINITY, -INFINITY, 0};
  tp_val idx = em_const_i(e, 5, TP_I32);
  for (int b = 4; b >= 0; b--)
    idx = em_select(e, em_compare(e, "EQ", p, em_const(e, ords[b], ct)), em_const_i(e, b, TP_I32), idx);
  tp_type rt = *em_type(e, x);
  rt.dt = ct;
  rt.rank = 0;
  for (int i = 0; i < em_type(e, x)->rank; i++) {
    int red = 0;
    for (int j = 0; j < nd; j++) red |= dims[j] == i;
    if (!red) rt.dims[rt.rank++] = em_type(e, x)->dims[i];
  }
  if (em_failed(e)) return;
  tp_case c;
  case_open(e, &c, idx, 6, &rt);
  for (int b = 0; b < 6 && !em_failed(e); b++) {
    tp_val a;
    if (is_cplx) {
      a = em_convert(e, lw_abs(e, x), ct);
    } else {
      a = un(e, "stablehlo.abs", em_convert(e, x, ct));
    }
    tp_val r;
    switch (b) {
      case 0: r = un(e, "stablehlo.sqrt", rsum(e, mul(e, a, a), dims, nd)); break;
      case 1: r = rsum(e, a, dims, nd); break;
      case 2: r = nan_fix(e, a, em_reduce(e, a, em_const(e, 0, ct), dims, nd, "stablehlo.maximum"), dims, nd); break;
      case 3: r = rmin(e, a, dims, nd); break;
      case 4: r = rsum(e, em_convert(e, em_compare(e, "NE", a, kl(e, a, 0)), ct), dims, nd); break;
      default: {
        tp_val s = rsum(e, em_binary(e, "stablehlo.power", a, em_bcast_to(e, p, em_type(e, a)->rank, em_type(e, a)->dims)),
                        dims, nd);
        tp_val inv = dv(e, em_const(e, 1, ct), p);
        r = em_binary(e, "stablehlo.power", s, em_bcast_to(e, inv, rt.rank, rt.dims));
      }
    }
    case_next(e, &c, r);
  }
  o[0] = to_out(e, n, 0, case_result(e, &c));
}

/* ---- scans ------------------------------------------------------------------------------------ */

/* Inclusive scan of v (R, L) along its last dim with an associative
 * combine(a, b) (a before b).  Blocks of SCAN_B: within a block a
 * sequential chain of combines (O(1) work per element, fused by the
 * compiler), then the block totals are scanned the same way (recursively)
 * and combined in.  Exact for integers; for floats the order is the
 * sequential one within blocks.  `ident` (combine's identity) pads. */
#define SCAN_B 16

typedef tp_val (*scan_fn)(tp_emit *e, tp_val a, tp_val b, const char *op);

static tp_val scan_binop(tp_emit *e, tp_val a, tp_val b, const char *op) { return em_binary(e, op, a, b); }

static tp_val scan2(tp_emit *e, tp_val v, scan_fn comb, const char *op, double ident) {
  tp_type tt = *em_type(e, v), *t = &tt; /* a copy: the scan emits */
  int64_t R = t->dims[0], L = t->dims[1];
  if (L <= 1 || em_failed(e)) return v;
  int64_t B = L < SCAN_B ? L : SCAN_B, M = (L + B - 1) / B;
  tp_val id = em_const(e, ident, t->dt);
  int64_t lo[2] = {0, 0}, hi[2] = {0, M * B - L};
  v = em_pad(e, v, id, lo, hi, NULL);
  int64_t d3[3] = {R, M, B};
  v = em_reshape(e, v, 3, d3);
  tp_val outs[SCAN_B];
  for (int64_t j = 0; j < B; j++) {
    int64_t st[3] = {0, 0, j}, lim[3] = {R, M, j + 1};
    tp_val c = em_slice(e, v, st, lim, NULL);
    outs[j] = j == 0 ? c : comb(e, outs[j - 1], c, op);
  }
  tp_val y = em_concat(e, outs, (int)B, 2);
  if (M > 1) {
    int64_t d2[2] = {R, M};
    tp_val inc = scan2(e, em_reshape(e, outs[B - 1], 2, d2), comb, op, ident);
    int64_t st[2] = {0, 0}, lim[2] = {R, M - 1}, plo[2] = {0, 1}, phi[2] = {0, 0};
    tp_val excl = em_pad(e, em_slice(e, inc, st, lim, NULL), em_const(e, ident, t->dt), plo, phi, NULL);
    int64_t map[2] = {0, 1};
    tp_type yt = *em_type(e, y);
    y = comb(e, em_bcast_in_dim(e, excl, &yt, map), y, op);
  }
  int64_t d2[2] = {R, M * B};
  y = em_reshape(e, y, 2, d2);
  int64_t st[2] = {0, 0}, lim[2] = {R, L};
  return em_slice(e, y, st, lim, NULL);
}

/* Inclusive scan of x along `dim`. */
static tp_val scan_with(tp_emit *e, tp_val x, int dim, scan_fn comb, const char *op, double ident) {
  tp_type t = *em_type(e, x);
  int r = t.rank;
  int64_t perm[TP_MAX_RANK], inv[TP_MAX_RANK];
  int k = 0;
  for (int i = 0; i < r; i++)
    if (i != dim) perm[k++] = i;
  perm[k] = dim;
  for (int i = 0; i < r; i++) inv[perm[i]] = i;
  tp_val v = em_transpose(e, x, perm);
  int64_t L = t.dims[dim], R = L ? tp_type_numel(&t) / L : 0;
  if (R == 0 || L == 0) return x;
  int64_t d2[2] = {R, L};
  v = scan2(e, em_reshape(e, v, 2, d2), comb, op, ident);
  tp_type pt = t;
  for (int i = 0; i < r; i++) pt.dims[i] = t.dims[perm[i]];
  v = em_reshape(e, v, r, pt.dims);
  return em_transpose(e, v, inv);
}

static tp_val scan(tp_emit *e, tp_val x, int dim, const char *op, double ident) {
  return scan_with(e, x, dim, scan_binop, op, ident);
}

/* cumsum / cumprod(self, dim, *, dtype).  float32 accumulates in float64 as
 * PyTorch's CPU kernel does (acc_type), f16/bf16 in float32. */
static void cum_like(tp_emit *e, const tp_node *n, tp_val *o, int is_prod) {
  tp_dtype od = n->outs[0].dt;
  tp_dtype ct = od == TP_F32 ? TP_F64 : lw_opmath(od);
  tp_val x = em_convert(e, em_convert(e, lw_value(e, n, 0), od), ct);
  int d = one_dim(e, n, 1, rank_of(e, x));
  if (em_failed(e)) return;
  if (d >= 0) x = scan(e, x, d, is_prod ? "stablehlo.multiply" : "stablehlo.add", is_prod ? 1 : 0);
  o[0] = to_out(e, n, 0, x);
}
static void r_cumsum(tp_emit *e, const tp_node *n, tp_val *o) { cum_like(e, n, o, 0); }

/* _cummax_helper / _cummin_helper(self, values!, indices!, dim) -> (): the
 * dispatcher passes values and indices as outputs 0 and 1.  PyTorch's CPU
 * loop takes element i when it is NaN, or when the running value is not NaN
 * and x[i] >= it (<= for cummin): values are the NaN-propagating running
 * max; the index is the last NaN seen, else the last position whose value
 * equals the running max there (ties go to the later index). */
static void cum_maxmin(tp_emit *e, const tp_node *n, tp_val *o, int is_max) {
  tp_val x = lw_value(e, n, 0);
  tp_dtype dt = dt_of(e, x);
  if (tp_dtype_is_complex(dt)) {
    o[0] = em_fail(e, TP_UNIMPLEMENTED, "%s: complex inputs are not supported", n->op);
    return;
  }
  int d = one_dim(e, n, 3, rank_of(e, x));
  if (em_failed(e)) return;
  if (d < 0 || rank_of(e, x) == 0) {
    o[0] = to_out(e, n, 0, x);
    o[1] = to_out(e, n, 1, em_const_i(e, 0, TP_I64));
    return;
  }
  const char *op = is_max ? "stablehlo.maximum" : "stablehlo.minimum";
  tp_type it = *em_type(e, x);
  it.dt = TP_I64;
  tp_val pos = em_iota(e, &it, d);
  tp_val vals, rec;
  if (tp_dtype_is_float(dt)) {
    tp_val nan = em_compare(e, "NE", x, x);
    tp_val clean = em_select(e, nan, kl(e, x, is_max ? -INFINITY : INFINITY), x);
    tp_val run = scan(e, clean, d, op, is_max ? -INFINITY : INFINITY);
    tp_val seen = scan(e, em_convert(e, nan, TP_U8), d, "stablehlo.maximum", 0);
    vals = em_select(e, em_compare(e, "NE", seen, kl(e, seen, 0)), kl(e, x, NAN), run);
    rec = em_binary(e, "stablehlo.or", nan, em_compare(e, "EQ", x, vals));
  } else {
    /* exact in int64; cummin as ~cummax(~x) (~ reverses the order without
     * overflow), so the identity is INT64_MIN for both */
    tp_val xs = em_convert(e, x, TP_I64);
    if (!is_max) xs = un(e, "stablehlo.not", xs);
    tp_val run = scan(e, xs, d, "stablehlo.maximum", -9223372036854775808.0);
    rec = em_compare(e, "EQ", xs, run);
    vals = em_convert(e, is_max ? run : un(e, "stablehlo.not", run), dt);
  }
  tp_val cand = em_select(e, rec, pos, kl(e, pos, -1));
  o[0] = to_out(e, n, 0, vals);
  o[1] = to_out(e, n, 1, scan(e, cand, d, "stablehlo.maximum", -1));
}
static void r_cummax_helper(tp_emit *e, const tp_node *n, tp_val *o) { cum_maxmin(e, n, o, 1); }
static void r_cummin_helper(tp_emit *e, const tp_node *n, tp_val *o) { cum_maxmin(e, n, o, 0); }

/* nonzero_static(self, *, size, fill_value=-1) -> (size, ndim) int64: the
 * first `size` nonzero positions in row-major order (an exclusive cumsum
 * gives each its row), the remaining rows fill_value. */
static void r_nonzero_static(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = lw_value(e, n, 0);
  tp_type xt = *em_type(e, x), ot = n->outs[0];
  if (tp_dtype_is_complex(xt.dt)) {
    o[0] = em_fail(e, TP_UNIMPLEMENTED, "nonzero_static: complex inputs are not supported on tpu yet");
    return;
  }
  int64_t fill = lw_int(n, 2, -1), N = tp_type_numel(&xt);
  int nd = xt.rank;
  if (ot.rank != 2 || tp_type_numel(&ot) == 0 || N == 0) {
    /* nothing to find (or nothing to write): every row is fill_value */
    o[0] = em_convert(e, em_bcast_to(e, em_const_i(e, fill, TP_I64), ot.rank, ot.dims), ot.dt);
    return;
  }
  int64_t size = ot.dims[0];
  tp_type t1 = tp_type_make(TP_I64, 1, &N), x1 = tp_type_make(xt.dt, 1, &N);
  tp_val m = em_compare(e, "NE", em_reshape(e, x, 1, &N), em_full(e, 0, &x1));
  tp_val mi = em_convert(e, em_convert(e, m, TP_U8), TP_I64);
  tp_val pos = sub(e, scan(e, mi, 0, "stablehlo.add", 0), mi);
  int64_t nk[2] = {N, nd}, m0 = 0;
  tp_type t2 = tp_type_make(TP_I64, 2, nk);
  tp_val flat = em_bcast_in_dim(e, em_iota(e, &t1, 0), &t2, &m0);
  /* coordinate of flat index f along dim d: (f / stride_d) % size_d */
  tp_val stride = em_full(e, 1, &t2), dsz = em_full(e, 1, &t2);
  tp_val col = em_iota(e, &t2, 1);
  int64_t st = 1;
  for (int d = nd - 1; d >= 0; d--) {
    tp_val here = em_compare(e, "EQ", col, em_full(e, d, &t2));
    stride = em_select(e, here, em_full(e, (double)st, &t2), stride);
    dsz = em_select(e, here, em_full(e, (double)xt.dims[d], &t2), dsz);
    st *= xt.dims[d];
  }
  tp_val coord = em_binary(e, "stablehlo.remainder", dv(e, flat, stride), dsz);
  tp_val pb = em_bcast_in_dim(e, pos, &t2, &m0);
  tp_val keep = em_binary(e, "stablehlo.and", em_bcast_in_dim(e, m, &(tp_type){TP_BOOL, 2, {N, nd}}, &m0),
                          em_compare(e, "LT", pb, em_full(e, (double)size, &t2)));
  tp_val dest = add(e, mul(e, pb, em_full(e, nd, &t2)), col);
  dest = em_select(e, keep, dest, em_full(e, (double)(size * nd), &t2));
  int64_t total = size * nd;
  tp_val out = em_scatter_flat(e, em_bcast_to(e, em_const_i(e, fill, TP_I64), 1, &total), dest, coord, NULL);
  o[0] = to_out(e, n, 0, out);
}

/* log(exp(a) + exp(b)) as PyTorch's _log_add_exp_helper: the larger plus
 * log1p(exp(smaller - larger)); two equal infinities give a (no inf - inf);
 * NaN propagates. */
static tp_val log_add_exp(tp_emit *e, tp_val a, tp_val b, const char *unused) {
  (void)unused;
  tp_val an = em_compare(e, "NE", a, a), bn = em_compare(e, "NE", b, b);
  tp_val lo = em_select(e, em_compare(e, "LT", a, b), a, b), hi = em_select(e, em_compare(e, "LT", a, b), b, a);
  tp_val r = add(e, un(e, "stablehlo.log_plus_one", un(e, "stablehlo.exponential", sub(e, lo, hi))), hi);
  tp_val same_inf = em_binary(e, "stablehlo.and", em_compare(e, "EQ", lo, hi),
                              em_compare(e, "EQ", un(e, "stablehlo.abs", lo), kl(e, lo, INFINITY)));
  r = em_select(e, same_inf, a, r);
  r = em_select(e, bn, b, r);
  return em_select(e, an, a, r);
}

/* _logcumsumexp(self, dim): accumulates in PyTorch's acc_type (f64 for f32,
 * f32 for f16/bf16). */
static void r_logcumsumexp(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_dtype od = n->outs[0].dt;
  if (!tp_dtype_is_float(od)) {
    o[0] = em_fail(e, TP_UNIMPLEMENTED, "logcumsumexp: %s outputs are not supported on tpu",
                   tp_dtype_is_complex(od) ? "complex" : "non-float");
    return;
  }
  tp_dtype ct = od == TP_F32 ? TP_F64 : lw_opmath(od);
  tp_val x = em_convert(e, lw_value(e, n, 0), ct);
  int d = one_dim(e, n, 1, rank_of(e, x));
  if (em_failed(e)) return;
  if (d >= 0 && rank_of(e, x) > 0) x = scan_with(e, x, d, log_add_exp, NULL, -INFINITY);
  o[0] = to_out(e, n, 0, x);
}
static void r_cumprod(tp_emit *e, const tp_node *n, tp_val *o) { cum_like(e, n, o, 1); }


/* ---- softmax --------------------------------------------------------------------------------- */

/* _softmax / _log_softmax(self, dim, half_to_float) */
static void softmax_like(tp_emit *e, const tp_node *n, tp_val *o, int is_log) {
  tp_dtype ct = lw_opmath(n->outs[0].dt);
  tp_val x = em_convert(e, lw_value(e, n, 0), ct);
  int d = one_dim(e, n, 1, rank_of(e, x));
  if (em_failed(e)) return;
  if (d < 0) { /* rank 0: a one-element softmax */
    int64_t one = 1;
    x = em_reshape(e, x, 1, &one);
    d = 0;
  }
  int64_t dims[1] = {d};
  tp_val m = expand_back(e, rmax_nonan(e, x, dims, 1), x, dims, 1); /* a NaN reaches the sum */
  tp_val z = sub(e, x, m);
  tp_val ez = un(e, "stablehlo.exponential", z);
  tp_val s = expand_back(e, rsum(e, ez, dims, 1), x, dims, 1);
  tp_val r = is_log ? sub(e, z, un(e, "stablehlo.log", s)) : dv(e, ez, s);
  o[0] = to_out(e, n, 0, r);
}
static void r_softmax(tp_emit *e, const tp_node *n, tp_val *o) { softmax_like(e, n, o, 0); }
static void r_log_softmax(tp_emit *e, const tp_node *n, tp_val *o) { softmax_like(e, n, o, 1); }

/* _softmax_backward_data / _log_softmax_backward_data(grad, output, dim, input_dtype) */
static void softmax_bw(tp_emit *e, const tp_node *n, tp_val *o, int is_log) {
  tp_dtype ct = lw_opmath(n->outs[0].dt);
  tp_type t = lw_out_as(n, 0, ct);
  tp_val g = lw_operand(e, n, 0, &t), y = lw_operand(e, n, 1, &t);
  int d = one_dim(e, n, 2, t.rank);
  if (em_failed(e)) return;
  if (d < 0) {
    int64_t one = 1;
    g = em_reshape(e, g, 1, &one);
    y = em_reshape(e, y, 1, &one);
    d = 0;
  }
  int64_t dims[1] = {d};
  tp_val r;
  if (is_log) {
    tp_val s = expand_back(e, rsum(e, g, dims, 1), g, dims, 1);
    r = sub(e, g, mul(e, un(e, "stablehlo.exponential", y), s));
  } else {
    tp_val gy = mul(e, g, y);
    tp_val s = expand_back(e, rsum(e, gy, dims, 1), g, dims, 1);
    r = sub(e, gy, mul(e, y, s));
  }
  o[0] = to_out(e, n, 0, r);
}
static void r_softmax_bw(tp_emit *e, const tp_node *n, tp_val *o) { softmax_bw(e, n, o, 0); }
static void r_log_softmax_bw(tp_emit *e, const tp_node *n, tp_val *o) { softmax_bw(e, n, o, 1); }

/* ---- matrix products --------------------------------------------------------------------------- */

/* The dtype a product runs in, and its operands converted to it. */
static tp_val mm_operand(tp_emit *e, const tp_node *n, int i, tp_dtype ct) { return em_convert(e, lw_value(e, n, i), ct); }

static tp_val conj_of(tp_emit *e, tp_val x) {
  tp_dtype dt = dt_of(e, x);
  if (!tp_dtype_is_complex(dt)) return x;
  tp_type rt = *em_type(e, x);
  rt.dt = dt == TP_C64 ? TP_F32 : TP_F64;
  tp_val re = em_op(e, "stablehlo.real", NULL, &x, 1, &rt);
  tp_val im = un(e, "stablehlo.negate", em_op(e, "stablehlo.imag", NULL, &x, 1, &rt));
  tp_val in[2] = {re, im};
  return em_op(e, "stablehlo.complex", NULL, in, 2, em_type(e, x));
}

/* A [1, k] @ [k, p] product.  XLA:CPU runs a dot with one row as a
 * matrix-vector loop 5-7x slower than its matrix kernel with two
 * ([1,768]x[768,2048] f32: 7 ms against 1 ms for 8 rows): one row is
 * multiplied as two, the second zeros, and the first kept.  The sums are
 * the same (a row's result does not depend on the others). */
static tp_val one_row_product(tp_emit *e, tp_val a, tp_val b, tp_dtype ct) {
  int64_t lc[1] = {1}, rc[1] = {0}, p = em_type(e, b)->dims[1];
  tp_val a2 = em_pad(e, a, em_const(e, 0, dt_of(e, a)), (int64_t[]){0, 0}, (int64_t[]){1, 0}, NULL);
  tp_val r = em_dot(e, a2, b, NULL, NULL, 0, lc, rc, 1, ct);
  return em_slice(e, r, (int64_t[]){0, 0}, (int64_t[]){1, p}, NULL);
}

/* a @ B^T for a [m, k] and B [p, k] (nn.Linear's x @ w.t()), as (B @ a^T)^T.
 * XLA:CPU's dot with the transposed [p, k] matrix on the right is 4-6x
 * slower than with it on the left ([1,768] @ [2048,768]^T f32: 3.2 ms
 * against 0.5; [64,768]: 6.8 against 4.3); transposing the [p, m] result
 * back is cheap while m <= k.  The sums are the same products. */
static tp_val swapped_product(tp_emit *e, tp_val a, tp_val bsrc, tp_dtype ct) {
  int64_t lc[1] = {1}, rc[1] = {0}, perm[2] = {1, 0};
  /* a^T as its own small transpose: contracting a's last dim in the dot
   * itself is the slow form again (2.9 against 1.0 ms at m = 8). */
  tp_val r = em_dot(e, em_convert(e, bsrc, ct), em_transpose(e, a, perm), NULL, NULL, 0, lc, rc, 1, ct);
  /* The barrier keeps XLA from folding the result's transpose into the
   * dot's output layout, which is the slow form once more. */
  tp_type rt = *em_type(e, r);
  r = em_op(e, "stablehlo.optimization_barrier", NULL, &r, 1, &rt);
  return em_transpose(e, r, perm);
}

/* a @ b for the ranks the ops take: (m,k)@(k,p), (b,m,k)@(b,k,p),
 * (m,k)@(k), (k)@(k); `sum_batch` contracts the batch too (addbmm). */
static tp_val product(tp_emit *e, const tp_node *n, tp_val a, tp_val b, int sum_batch) {
  int ra = rank_of(e, a), rb = rank_of(e, b);
  tp_dtype ct = dt_of(e, a);
  if (dt_of(e, b) != ct) return em_fail(e, TP_INVALID_ARGUMENT, "%s: operands must have the same dtype", n->op);
  if (ra == 3 && rb == 3) {
    if (em_type(e, a)->dims[2] != em_type(e, b)->dims[1] || em_type(e, a)->dims[0] != em_type(e, b)->dims[0])
      return em_fail(e, TP_INVALID_ARGUMENT, "%s: shapes cannot be multiplied", n->op);
    int64_t bz[1] = {0};
    if (sum_batch) {
      int64_t lc[2] = {0, 2}, rc[2] = {0, 1};
      return em_dot(e, a, b, NULL, NULL, 0, lc, rc, 2, ct);
    }
    int64_t lc[1] = {2}, rc[1] = {1};
    return em_dot(e, a, b, bz, bz, 1, lc, rc, 1, ct);
  }
  int64_t lc[1] = {ra - 1}, rc[1] = {0};
  if (ra < 1 || ra > 2 || rb < 1 || rb > 2 || em_type(e, a)->dims[ra - 1] != em_type(e, b)->dims[0])
    return em_fail(e, TP_INVALID_ARGUMENT, "%s: shapes cannot be multiplied", n->op);
  if (ra == 2 && rb == 2) {
    tp_val bs = em_transpose_source(e, b);
    int64_t m = em_type(e, a)->dims[0], k = em_type(e, a)->dims[1];
    if (bs >= 0 && m <= k) return swapped_product(e, a, bs, ct);
    if (m == 1) return one_row_product(e, a, b, ct);
  }
  return em_dot(e, a, b, NULL, NULL, 0, lc, rc, 1, ct);
}

/* out = op(a, b) for mm, bmm, mv, dot, vdot */
static void plain_product(tp_emit *e, const tp_node *n, tp_val *o, int conj) {
  if (!lw_same_dtypes(e, n, 0, 1)) return;
  tp_dtype ct = lw_opmath(n->outs[0].dt);
  tp_val a = mm_operand(e, n, 0, ct), b = mm_operand(e, n, 1, ct);
  if (conj) a = conj_of(e, a);
  o[0] = to_out(e, n, 0, product(e, n, a, b, 0));
}
static void r_mm(tp_emit *e, const tp_node *n, tp_val *o) { plain_product(e, n, o, 0); }
static void r_vdot(tp_emit *e, const tp_node *n, tp_val *o) { plain_product(e, n, o, 1); }

/* Where index i of a [d0, d1] iota along `dim` lies in group g of offs (the
 * groups' end offsets, i64 [G]): [offs[g-1], offs[g]), from 0 for g == 0. */
static tp_val in_group(tp_emit *e, tp_val offs, int64_t g, int64_t d0, int64_t d1, int dim) {
  int64_t dims[2] = {d0, d1};
  tp_type it = tp_type_make(TP_I64, 2, dims);
  tp_val at = em_iota(e, &it, dim);
  tp_val end = em_reshape(e, em_slice(e, offs, &g, (int64_t[]){g + 1}, NULL), 0, NULL);
  tp_val start = em_const_i(e, 0, TP_I64);
  if (g > 0) start = em_reshape(e, em_slice(e, offs, (int64_t[]){g - 1}, &g, NULL), 0, NULL);
  return em_binary(e, "stablehlo.and", em_compare(e, "GE", at, em_bcast_to(e, start, 2, dims)),
                   em_compare(e, "LT", at, em_bcast_to(e, end, 2, dims)));
}

/* [K, N] matrix g of a [G, K, N] value. */
static tp_val group_of(tp_emit *e, tp_val x, int64_t g) {
  const tp_type *t = em_type(e, x); /* (valid until the next emission) */
  int64_t st[3] = {g, 0, 0}, lim[3] = {g + 1, t->dims[1], t->dims[2]};
  tp_val m = em_slice(e, x, st, lim, NULL);
  return em_reshape(e, m, 2, lim + 1);
}

/* torch._grouped_mm (mixture-of-experts layers): a matrix product per group,
 * the groups given by offs, their end offsets along the ragged dim (rows of a
 * 2-d mat_a against a 3-d mat_b, columns of a 2-d mat_b against a 3-d mat_a,
 * the contraction of two 2-d matrices, one [M, N] result per group); two 3-d
 * matrices are a batched product.  The offsets are data, so each group's
 * product runs over the whole ragged dim and a select keeps its part: G times
 * a dense product's work, in one program (PyTorch's CPU kernel copies offs to
 * the host and multiplies slices).  Elements outside every group are zero
 * (PyTorch leaves them uninitialised).  Strides need no 16-byte alignment, and
 * float32 and float16 are taken as bfloat16 is. */
static void r_grouped_mm(tp_emit *e, const tp_node *n, tp_val *o) {
  if (!lw_same_dtypes(e, n, 0, 1)) return;
  tp_dtype ct = lw_opmath(n->outs[0].dt);
  tp_val a = mm_operand(e, n, 0, ct), b = mm_operand(e, n, 1, ct);
  const tp_type ta = *em_type(e, a), tb = *em_type(e, b); /* copies: emitting moves the value table */
  if (ta.rank == 3 && tb.rank == 3) {
    o[0] = to_out(e, n, 0, product(e, n, a, b, 0));
    return;
  }
  tp_val offs = em_convert(e, lw_value(e, n, 2), TP_I64);
  int64_t G = em_type(e, offs)->dims[0];
  tp_type rt = lw_out_as(n, 0, ct);
  tp_val acc = em_full(e, 0, &rt), zero = em_const(e, 0, ct);
  for (int64_t g = 0; g < G; g++) {
    if (ta.rank == 2 && tb.rank == 3) { /* rows of a */
      tp_val p = product(e, n, a, group_of(e, b, g), 0);
      acc = em_select(e, in_group(e, offs, g, rt.dims[0], rt.dims[1], 0), p, acc);
    } else if (ta.rank == 3) { /* columns of b */
      tp_val p = product(e, n, group_of(e, a, g), b, 0);
      acc = em_select(e, in_group(e, offs, g, rt.dims[0], rt.dims[1], 1), p, acc);
    } else { /* the contraction: both operands masked, so inf or NaN elsewhere cannot leak in */
      int64_t M = ta.dims[0], K = ta.dims[1], N = tb.dims[1];
      tp_val am = em_select(e, in_group(e, offs, g, M, K, 1), a, em_bcast_to(e, zero, 2, ta.dims));
      tp_val bm = em_select(e, in_group(e, offs, g, K, N, 0), b, em_bcast_to(e, zero, 2, tb.dims));
      tp_val p = em_reshape(e, product(e, n, am, bm, 0), 3, (int64_t[]){1, M, N});
      tp_val z = em_const_i(e, 0, TP_I64), st[3] = {em_const_i(e, g, TP_I64), z, z};
      acc = em_dyn_update_slice(e, acc, p, st);
    }
  }
  o[0] = to_out(e, n, 0, acc);
}

/* beta * self + alpha * (a @ b); beta == 0 ignores self and alpha == 0 the
 * product (NaNs included), as BLAS and PyTorch do.  act: 0 none, 1 relu, 2 gelu. */
static void addprod(tp_emit *e, const tp_node *n, tp_val *o, int sum_batch, int act) {
  if (!lw_same_dtypes(e, n, 0, 2)) return;
  tp_dtype ct = lw_opmath(n->outs[0].dt);
  tp_type t = lw_out_as(n, 0, ct);
  tp_val p = product(e, n, mm_operand(e, n, 1, ct), mm_operand(e, n, 2, ct), sum_batch);
  if (em_failed(e)) return;
  tp_val self = lw_operand(e, n, 0, &t);
  tp_val beta = num_arg(e, n, 3, ct, 1), alpha = num_arg(e, n, 4, ct, 1);
  tp_val z = em_const(e, 0, ct);
  tp_val bs = sel0(e, em_compare(e, "EQ", beta, z), kl(e, self, 0), mul(e, self, beta));
  tp_val ap = sel0(e, em_compare(e, "EQ", alpha, z), kl(e, p, 0), mul(e, p, alpha));
  tp_val r = add(e, bs, ap);
  if (act == 1) {
    r = em_binary(e, "stablehlo.maximum", r, kl(e, r, 0));
  } else if (act == 2) {
    r = mul(e, mul(e, r, kl(e, r, 0.5)), lw_normal_cdf2(e, r));
  }
  o[0] = to_out(e, n, 0, r);
}
static void r_addmm(tp_emit *e, const tp_node *n, tp_val *o) { addprod(e, n, o, 0, 0); }
/* _scaled_mm(self, mat2, scale_a, scale_b, bias?, scale_result?, out_dtype?, use_fast_accum):
 * float8 matmul as PyTorch's CPU kernel computes it: (self * scale_a) @ (mat2 * scale_b)
 * in f32, + bias, divided by scale_result for a float8 result, rounded once to the
 * output dtype.  Scales are one value each, or rowwise ([M, 1] and [1, N]). */
static void r_scaled_mm(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val a = em_convert(e, lw_value(e, n, 0), TP_F32), b = em_convert(e, lw_value(e, n, 1), TP_F32);
  if (em_failed(e)) return;
  if (em_type(e, a)->rank != 2 || em_type(e, b)->rank != 2 || em_type(e, a)->dims[1] != em_type(e, b)->dims[0]) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: expected 2-d matrices that can be multiplied", n->op);
    return;
  }
  tp_type at = *em_type(e, a), bt = *em_type(e, b);
  a = mul(e, a, lw_operand(e, n, 2, &at));
  b = mul(e, b, lw_operand(e, n, 3, &bt));
  int64_t lc = 1, rc = 0;
  tp_val r = em_dot(e, a, b, NULL, NULL, 0, &lc, &rc, 1, TP_F32);
  tp_type rt = *em_type(e, r);
  if (!lw_is_none(n, 4)) r = add(e, r, lw_operand(e, n, 4, &rt));
  if (tp_dtype_is_f8(n->outs[0].dt) && !lw_is_none(n, 5))
    r = mul(e, r, lw_bin(e, "stablehlo.divide", kl(e, r, 1.0), lw_operand(e, n, 5, &rt)));
  o[0] = to_out(e, n, 0, r);
}

/* _int_mm(self, mat2): int8 [M, K] @ int8 [K, N] -> int32, exact (torchao's
 * int8 dynamic-activation matmul, through out_dtype). */
static void r_int_mm(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val a = lw_value(e, n, 0), b = lw_value(e, n, 1);
  if (em_failed(e)) return;
  const tp_type at = *em_type(e, a), bt = *em_type(e, b);
  if (at.dt != TP_I8 || bt.dt != TP_I8) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "_int_mm: expected self and mat2 to be int8");
    return;
  }
  if (at.rank != 2 || bt.rank != 2 || at.dims[1] != bt.dims[0]) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "_int_mm: expected 2-d matrices that can be multiplied");
    return;
  }
  /* An integer dot_general: XLA:CPU multiplies int8 in int32 as fast as
   * float32 from 2 rows on; one row takes its 5x slower matrix-vector
   * loop, so a single row is multiplied as two (the second zeros). */
  int64_t lc = 1, rc = 0;
  o[0] = at.dims[0] == 1 ? one_row_product(e, a, b, TP_I32) : em_dot(e, a, b, NULL, NULL, 0, &lc, &rc, 1, TP_I32);
}

static void r_addbmm(tp_emit *e, const tp_node *n, tp_val *o) { addprod(e, n, o, 1, 0); }
static void r_addmm_act(tp_emit *e, const tp_node *n, tp_val *o) { addprod(e, n, o, 0, lw_bool(n, 5, 0) ? 2 : 1); }

/* ---- sorting ----------------------------------------------------------------------------------- */

static int topk_passes(tp_emit *e, tp_val x, int d, int64_t kk, int largest, tp_val *vals, tp_val *idx);

/* Stable sort of x along dim; NaN is the largest value (last ascending,
 * first descending), like PyTorch.  Returns values and i64 indices. */
static void sort_dim(tp_emit *e, const tp_node *n, tp_val x, int dim, int descending, tp_val *vals, tp_val *idx) {
  *vals = *idx = -1;
  if (em_failed(e)) return;
  tp_type xt = *em_type(e, x);
  if (tp_dtype_is_complex(xt.dt)) {
    em_fail(e, TP_INVALID_ARGUMENT, "%s: sorting complex tensors is not supported", n->op);
    return;
  }
  tp_type it = xt;
  it.dt = TP_I64;
  tp_val io = em_iota(e, &it, dim);
  if (em_failed(e)) return;
  unsigned k = raw_id(e);
  char tx[256], ti[256], ts[64], tsi[64];
  tp_type st = tp_type_make(xt.dt, 0, NULL), sti = tp_type_make(TP_I64, 0, NULL);
  tp_type_str(&xt, tx, sizeof tx);
  tp_type_str(&it, ti, sizeof ti);
  tp_type_str(&st, ts, sizeof ts);
  tp_type_str(&sti, tsi, sizeof tsi);
  const char *ct = tp_dtype_is_float(xt.dt) ? "FLOAT" : (tp_dtype_is_unsigned(xt.dt) || xt.dt == TP_BOOL) ? "UNSIGNED" : "SIGNED";
  const char *b1 = "tensor<i1>";
  sbuild b = {0};
  sbp(&b, "    %%s%u:2 = \"stablehlo.sort\"(%%v%d, %%v%d) ({\n", k, x, io);
  sbp(&b, "    ^bb0(%%s%ua: %s, %%s%ub: %s, %%s%uia: %s, %%s%uib: %s):\n", k, ts, k, ts, k, tsi, k, tsi);
#define CMPL(name, dir, l, r)                                                                                        \
  sbp(&b,                                                                                                            \
      "      %%s%u" name " = \"stablehlo.compare\"(%%s%u" l ", %%s%u" r ") {comparison_direction = "                  \
      "#stablehlo<comparison_direction " dir ">, compare_type = #stablehlo<comparison_type %s>} : (%s, %s) -> %s\n", \
      k, k, k, ct, ts, ts, b1)
  if (descending) CMPL("c", "GT", "a", "b");
  else CMPL("c", "LT", "a", "b");
  const char *res = "c";
  if (tp_dtype_is_float(xt.dt)) {
    CMPL("na", "NE", "a", "a");
    CMPL("nb", "NE", "b", "b");
    /* ascending: c | (!na & nb); descending: c | (na & !nb) */
    sbp(&b, "      %%s%unot = \"stablehlo.not\"(%%s%u%s) : (%s) -> %s\n", k, k, descending ? "nb" : "na", b1, b1);
    sbp(&b, "      %%s%uand = \"stablehlo.and\"(%%s%unot, %%s%u%s) : (%s, %s) -> %s\n", k, k, k, descending ? "na" : "nb", b1,
        b1, b1);
    sbp(&b, "      %%s%ur = \"stablehlo.or\"(%%s%uc, %%s%uand) : (%s, %s) -> %s\n", k, k, k, b1, b1, b1);
    res = "r";
  }
#undef CMPL
  sbp(&b, "      \"stablehlo.return\"(%%s%u%s) : (%s) -> ()\n", k, res, b1);
  sbp(&b, "    }) {dimension = %d : i64, is_stable = true} : (%s, %s) -> (%s, %s)\n", dim, tx, ti, tx, ti);
  if (b.oom) {
    free(b.p);
    em_fail(e, TP_RESOURCE_EXHAUSTED, "out of memory building a program");
    return;
  }
  raw_text(e, x, b.p);
  free(b.p);
  char nm[48];
  snprintf(nm, sizeof nm, "%%s%u#0", k);
  *vals = raw_bind(e, nm, &xt);
  snprintf(nm, sizeof nm, "%%s%u#1", k);
  *idx = raw_bind(e, nm, &it);
}

/* sort.stable(self, *, stable, dim=-1, descending) / sort(self, dim=-1, descending) */
static void sort_like(tp_emit *e, const tp_node *n, tp_val *o, int dim_i) {
  tp_val x = lw_value(e, n, 0);
  int d = one_dim(e, n, dim_i, rank_of(e, x));
  if (em_failed(e)) return;
  if (d < 0) {
    o[0] = to_out(e, n, 0, x);
    o[1] = to_out(e, n, 1, em_const_i(e, 0, TP_I64));
    return;
  }
  tp_val v, i;
  int descending = lw_bool(n, dim_i + 1, 0);
  /* a short dim sorts as a topk of all of it (first index on ties: stable) */
  if (!topk_passes(e, x, d, em_type(e, x)->dims[d], descending, &v, &i))
    sort_dim(e, n, x, d, descending, &v, &i);
  o[0] = to_out(e, n, 0, v);
  o[1] = to_out(e, n, 1, i);
}
static void r_sort(tp_emit *e, const tp_node *n, tp_val *o) { sort_like(e, n, o, 1); }
static void r_sort_stable(tp_emit *e, const tp_node *n, tp_val *o) { sort_like(e, n, o, 2); }

/* Elements [from, from + len) of v along dim. */
static tp_val take(tp_emit *e, tp_val v, int dim, int64_t from, int64_t len) {
  const tp_type *t = em_type(e, v);
  int64_t start[TP_MAX_RANK] = {0}, limit[TP_MAX_RANK];
  for (int i = 0; i < t->rank; i++) limit[i] = t->dims[i];
  start[dim] = from;
  limit[dim] = from + len;
  return em_slice(e, v, start, limit, NULL);
}

/* topk for k <= TOPK_PASSES of f32/f16/bf16 or narrow-integer inputs: k
 * passes of an argmax (argmin) over an order-preserving integer key, each
 * taking the first index of the best key left, instead of XLA CPU's sort,
 * which costs tens of times more (two experts of eight per token, the top
 * tokens of a vocabulary).  Keys: a float's bits with the negative ones'
 * magnitudes flipped, -0 as +0, every NaN above +inf (PyTorch's order); an
 * integer's value.  A taken element's key becomes a sentinel outside the
 * keys' range.  The values are gathered from x, bits and all.  Returns 0
 * when it does not apply. */
#define TOPK_PASSES 16
static int topk_passes(tp_emit *e, tp_val x, int d, int64_t kk, int largest, tp_val *vals, tp_val *idx) {
  tp_type xt = *em_type(e, x);
  tp_dtype dt = xt.dt;
  int fl = dt == TP_F32 || dt == TP_F16 || dt == TP_BF16;
  if (kk < 1 || kk > TOPK_PASSES || !(fl || dt == TP_I32 || dt == TP_I16 || dt == TP_I8 || dt == TP_U8 || dt == TP_BOOL))
    return 0;
  int64_t n = xt.dims[d], total = tp_type_numel(&xt);
  if (n == 0 || total == 0) return 0;
  int64_t R = total / n, perm[TP_MAX_RANK], two[2] = {R, n}, flat = total;
  int r = 0;
  for (int i = 0; i < xt.rank; i++)
    if (i != d) perm[r++] = i;
  perm[r] = d;
  tp_val x2 = em_reshape(e, em_transpose(e, x, perm), 2, two);
  tp_type kt = tp_type_make(TP_I64, 2, two), k32 = tp_type_make(TP_I32, 2, two);
  tp_val key;
  if (fl) {
    tp_val f = em_convert(e, x2, TP_F32), b = em_bitcast(e, f, &k32);
    tp_val zero = em_full(e, 0, &k32);
    tp_val flipped = em_binary(e, "stablehlo.xor", b, em_full(e, INT32_MAX, &k32));
    tp_val k = em_select(e, em_compare(e, "LT", b, zero), flipped, b);
    k = em_select(e, em_compare(e, "EQ", f, em_full(e, 0, em_type(e, f))), zero, k);
    key = em_select(e, em_compare(e, "NE", f, f), em_full(e, 2147483648.0, &kt), em_convert(e, k, TP_I64));
  } else {
    key = em_convert(e, x2, TP_I64);
  }
  tp_val taken = em_full(e, largest ? -1099511627776.0 : 1099511627776.0, &kt); /* -+2^40 */
  tp_val io = em_iota(e, &kt, 1);
  int64_t col[2] = {R, 1};
  tp_val picks[TOPK_PASSES];
  for (int64_t t = 0; t < kk; t++) {
    tp_val kv, ki;
    em_argreduce(e, key, 1, largest, &kv, &ki);
    picks[t] = em_reshape(e, ki, 2, col);
    if (t + 1 < kk) key = em_select(e, em_compare(e, "EQ", io, em_bcast_to(e, picks[t], 2, two)), taken, key);
  }
  tp_val ix = em_concat(e, picks, (int)kk, 1); /* (R, kk) */
  int64_t out2[2] = {R, kk};
  tp_type rt = tp_type_make(TP_I64, 2, out2);
  tp_val rowbase = em_binary(e, "stablehlo.multiply", em_iota(e, &rt, 0), em_full(e, (double)n, &rt));
  tp_val v2 = em_gather_flat(e, em_reshape(e, x2, 1, &flat), em_binary(e, "stablehlo.add", rowbase, ix));
  /* back to x's layout: the kk results along d */
  int64_t pdims[TP_MAX_RANK], inv[TP_MAX_RANK];
  for (int i = 0; i < r; i++) pdims[i] = xt.dims[perm[i]];
  pdims[r] = kk;
  for (int i = 0; i <= r; i++) inv[perm[i]] = i;
  *vals = em_transpose(e, em_reshape(e, v2, xt.rank, pdims), inv);
  *idx = em_transpose(e, em_reshape(e, ix, xt.rank, pdims), inv);
  return 1;
}

/* topk(self, k, dim=-1, largest, sorted): always sorted. */
static void r_topk(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = lw_value(e, n, 0);
  int64_t kk = lw_int(n, 1, 0);
  int d = one_dim(e, n, 2, rank_of(e, x));
  if (em_failed(e)) return;
  if (d < 0) {
    int64_t one = 1;
    x = em_reshape(e, x, 1, &one);
    d = 0;
  }
  if (kk < 0 || kk > em_type(e, x)->dims[d]) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "topk: k (%" PRId64 ") out of range for dimension %d", kk, d);
    return;
  }
  tp_val v, i;
  if (topk_passes(e, x, d, kk, lw_bool(n, 3, 1), &v, &i)) {
    o[0] = to_out(e, n, 0, v);
    o[1] = to_out(e, n, 1, i);
    return;
  }
  sort_dim(e, n, x, d, lw_bool(n, 3, 1), &v, &i);
  o[0] = to_out(e, n, 0, take(e, v, d, 0, kk));
  o[1] = to_out(e, n, 1, take(e, i, d, 0, kk));
}

/* kthvalue(self, k, dim=-1, keepdim): the k-th smallest (1-based). */
static void r_kthvalue(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = lw_value(e, n, 0);
  int64_t kk = lw_int(n, 1, 0);
  int d = one_dim(e, n, 2, rank_of(e, x));
  if (em_failed(e)) return;
  if (d < 0) {
    int64_t one = 1;
    x = em_reshape(e, x, 1, &one);
    d = 0;
  }
  if (kk < 1 || kk > em_type(e, x)->dims[d]) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "kthvalue: k (%" PRId64 ") out of range for dimension %d", kk, d);
    return;
  }
  tp_val v, i;
  sort_dim(e, n, x, d, 0, &v, &i);
  o[0] = to_out(e, n, 0, take(e, v, d, kk - 1, 1));
  o[1] = to_out(e, n, 1, take(e, i, d, kk - 1, 1));
}

/* median / nanmedian: the sorted element at a per-row position.  median
 * takes the lower middle, or the first NaN if there is one; nanmedian the
 * lower middle of the non-NaN values (if all are NaN, the middle one).  full: flattened,
 * values only; else (self, dim, keepdim) -> (values, indices). */
static void median_like(tp_emit *e, const tp_node *n, tp_val *o, int full, int nan_skip) {
  tp_val x = lw_value(e, n, 0);
  int d = 0;
  if (full) {
    int64_t numel = tp_type_numel(em_type(e, x));
    x = em_reshape(e, x, 1, &numel);
    if (numel == 0) {
      o[0] = to_out(e, n, 0, em_const(e, NAN, dt_of(e, x)));
      return;
    }
  } else {
    d = one_dim(e, n, 1, rank_of(e, x));
    if (em_failed(e)) return;
    if (d < 0) { /* rank 0 */
      o[0] = to_out(e, n, 0, x);
      o[1] = to_out(e, n, 1, em_const_i(e, 0, TP_I64));
      return;
    }
  }
  tp_dtype dt = dt_of(e, x);
  if (dt == TP_BOOL || tp_dtype_is_complex(dt)) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: not supported for %s tensors", n->op, tp_dtype_name(dt));
    return;
  }
  int64_t L = em_type(e, x)->dims[d], dims[1] = {d};
  tp_val sv, si;
  sort_dim(e, n, x, d, 0, &sv, &si);
  /* pos: per-row position in the sorted order (i64, x's shape minus d) */
  tp_type it = *em_type(e, x);
  it.dt = TP_I64;
  tp_val cnt;
  if (tp_dtype_is_float(dt)) cnt = rsum(e, em_convert(e, em_compare(e, "EQ", x, x), TP_I64), dims, 1);
  else cnt = rsum(e, em_full(e, 1, &it), dims, 1);
  tp_val pos;
  if (nan_skip) {
    tp_val one = kl(e, cnt, 1), zero = kl(e, cnt, 0);
    tp_val mid = dv(e, sub(e, cnt, one), kl(e, cnt, 2));
    pos = em_select(e, em_compare(e, "EQ", cnt, zero), kl(e, cnt, (double)((L - 1) / 2)), mid); /* all NaN: as PyTorch */
  } else {
    pos = em_select(e, em_compare(e, "LT", cnt, kl(e, cnt, (double)L)), cnt, kl(e, cnt, (double)((L - 1) / 2)));
  }
  tp_val mask = em_compare(e, "EQ", em_iota(e, &it, d), expand_back(e, pos, x, dims, 1));
  /* exactly one element per row is picked: summing it onto -0.0 keeps it bit-exact */
  tp_val negz = tp_dtype_is_float(dt) ? em_const(e, -0.0, dt) : em_const(e, 0, dt);
  const tp_type *st = em_type(e, sv);
  tp_val v = em_reduce(e, em_select(e, mask, sv, em_bcast_to(e, negz, st->rank, st->dims)), negz, dims, 1, "stablehlo.add");
  o[0] = to_out(e, n, 0, v);
  if (!full) o[1] = to_out(e, n, 1, rsum(e, em_select(e, mask, si, kl(e, si, 0)), dims, 1));
}
static void r_median(tp_emit *e, const tp_node *n, tp_val *o) { median_like(e, n, o, 1, 0); }
static void r_median_dim(tp_emit *e, const tp_node *n, tp_val *o) { median_like(e, n, o, 0, 0); }
static void r_nanmedian(tp_emit *e, const tp_node *n, tp_val *o) { median_like(e, n, o, 1, 1); }
static void r_nanmedian_dim(tp_emit *e, const tp_node *n, tp_val *o) { median_like(e, n, o, 0, 1); }

/* histc(x, bins, min, max), as PyTorch's CPU kernel computes it.  The range
 * is [min, max] in double (the data's own when min == max, widened by 1 each
 * way if still empty), its end points taken in x's dtype like linspace's;
 * an element in range goes to bin (int64)((v - lo) * bins / (hi - lo)),
 * evaluated in x's dtype step by step (f16/bf16 round after each step, as
 * c10::Half arithmetic does), v == hi to the last bin.  A non-finite or
 * empty range raises at the next synchronisation (a device-side check). */
static tp_val histc_int(tp_emit *e, const tp_node *n, tp_val flat, int64_t bins, int64_t N);

/* histc's empty range [v, v] becomes [v - 1, v + 1]. */
static void histc_widen(tp_emit *e, tp_val *lo, tp_val *hi) {
  tp_val eq = em_compare(e, "EQ", *lo, *hi);
  *lo = em_select(e, eq, sub(e, *lo, kl(e, *lo, 1)), *lo);
  *hi = em_select(e, eq, add(e, *hi, kl(e, *hi, 1)), *hi);
}

/* The histogram of dtype dt of N bin positions (i64 [N], `bins` for the top
 * of the range, which the last bin takes), counting those with `in` set. */
static tp_val histc_count(tp_emit *e, tp_dtype dt, tp_val pos, tp_val in, int64_t bins, int64_t N) {
  int64_t d0 = 0;
  tp_type ht = tp_type_make(dt, 1, (int64_t[]){bins + 1}), it = tp_type_make(TP_I64, 1, &N);
  tp_val hist = em_full(e, 0, &ht);
  if (N > 0) {
    tp_val nb = em_full(e, (double)bins, &it);
    pos = em_select(e, em_compare(e, "EQ", pos, nb), em_full(e, (double)(bins - 1), &it), pos);
    pos = em_select(e, in, pos, nb); /* out of range (or NaN): the extra bin, dropped */
    hist = em_scatter_flat(e, hist, pos, em_full(e, 1, &(tp_type){dt, 1, {N}}), "stablehlo.add");
  }
  return em_slice(e, hist, &d0, &bins, (int64_t[]){1});
}

static void r_histc(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = lw_value(e, n, 0);
  tp_dtype dt = dt_of(e, x), ct = lw_opmath(dt);
  int64_t bins = n->outs[0].dims[0], N = tp_type_numel(em_type(e, x)), d0 = 0;
  tp_val flat = em_reshape(e, x, 1, &N);
  if (tp_dtype_is_int(dt)) {
    o[0] = histc_int(e, n, flat, bins, N);
    return;
  }
  if (!tp_dtype_is_float(dt)) {
    o[0] = lw_not_for(e, "histogram_cpu", dt);
    return;
  }
  tp_val lo = num_arg(e, n, 2, TP_F64, 0), hi = num_arg(e, n, 3, TP_F64, 0);
  if (N > 0) { /* min == max: the data's range (NaN if any element is NaN, as aminmax gives) */
    tp_val v = em_convert(e, flat, TP_F64);
    tp_val dmin = em_reduce(e, v, em_const(e, INFINITY, TP_F64), &d0, 1, "stablehlo.minimum");
    tp_val dmax = em_reduce(e, v, em_const(e, -INFINITY, TP_F64), &d0, 1, "stablehlo.maximum");
    tp_val same = em_compare(e, "EQ", lo, hi);
    lo = em_select(e, same, nan_fix(e, v, dmin, &d0, 1), lo);
    hi = em_select(e, same, nan_fix(e, v, dmax, &d0, 1), hi);
  }
  histc_widen(e, &lo, &hi);
  tp_type bt = tp_type_make(TP_BOOL, 0, NULL);
  tp_val finite = em_binary(e, "stablehlo.and", em_op(e, "stablehlo.is_finite", NULL, &lo, 1, &bt),
                            em_op(e, "stablehlo.is_finite", NULL, &hi, 1, &bt));
  lw_check_text(e, n, em_convert(e, finite, TP_I64), 1, 2, TP_INVALID_ARGUMENT,
                "torch.histc: range of [min, max] is not finite: pass finite min and max (with min == max, the "
                "default, the range is the input's own, and the input holds inf or NaN)");
  lw_check_text(e, n, em_convert(e, em_compare(e, "LT", lo, hi), TP_I64), 1, 2, TP_INVALID_ARGUMENT,
                "torch.histc: max must be larger than min");
  tp_val pos = flat, in = flat; /* (unread when N == 0) */
  if (N > 0) {
    tp_type ft = tp_type_make(ct, 1, &N);
    lo = em_bcast_to(e, em_convert(e, em_convert(e, lo, dt), ct), 1, &N);
    hi = em_bcast_to(e, em_convert(e, em_convert(e, hi, dt), ct), 1, &N);
    tp_val v = em_convert(e, flat, ct);
    tp_val q = em_round_to(e, sub(e, v, lo), dt);
    q = em_round_to(e, mul(e, q, em_full(e, (double)bins, &ft)), dt);
    q = em_round_to(e, dv(e, q, em_round_to(e, sub(e, hi, lo), dt)), dt);
    pos = em_convert(e, q, TP_I64);
    in = em_binary(e, "stablehlo.and", em_compare(e, "GE", v, lo), em_compare(e, "LE", v, hi));
  }
  o[0] = histc_count(e, dt, pos, in, bins, N);
}

/* histc of integers, which PyTorch's CPU kernel refuses and its CUDA kernel
 * counts (Hugging Face's mixture-of-experts layers call it so off the CPU):
 * min and max truncated to int64, the data's range when they are equal (then
 * widened by 1 each way if still empty), and an element v in [lo, hi] goes to
 * bin (v - lo) * bins / (hi - lo) in int64 arithmetic, v == hi to the last.
 * The counts have the input's dtype, as on CUDA. */
static tp_val histc_int(tp_emit *e, const tp_node *n, tp_val flat, int64_t bins, int64_t N) {
  tp_dtype dt = dt_of(e, flat);
  int64_t d0 = 0;
  tp_val lo = em_convert(e, num_arg(e, n, 2, TP_F64, 0), TP_I64);
  tp_val hi = em_convert(e, num_arg(e, n, 3, TP_F64, 0), TP_I64);
  tp_val v = em_convert(e, flat, TP_I64);
  if (N > 0) {
    tp_val same = em_compare(e, "EQ", lo, hi);
    lo = em_select(e, same, em_reduce(e, v, highest(e, TP_I64), &d0, 1, "stablehlo.minimum"), lo);
    hi = em_select(e, same, em_reduce(e, v, lowest(e, TP_I64), &d0, 1, "stablehlo.maximum"), hi);
  }
  histc_widen(e, &lo, &hi);
  lw_check_text(e, n, em_convert(e, em_compare(e, "LT", lo, hi), TP_I64), 1, 2, TP_INVALID_ARGUMENT,
                "torch.histc: max must be larger than min");
  tp_val pos = v, in = v; /* (unread when N == 0) */
  if (N > 0) {
    tp_type it = tp_type_make(TP_I64, 1, &N);
    tp_val lob = em_bcast_to(e, lo, 1, &N), hib = em_bcast_to(e, hi, 1, &N);
    pos = dv(e, mul(e, sub(e, v, lob), em_full(e, (double)bins, &it)), em_bcast_to(e, sub(e, hi, lo), 1, &N));
    in = em_binary(e, "stablehlo.and", em_compare(e, "GE", v, lob), em_compare(e, "LE", v, hib));
  }
  return histc_count(e, dt, pos, in, bins, N);
}

const tp_lower_entry tp_lower_reduce[] = {
    {"aten::sum", r_sum, 0},
    {"aten::sum.dim_IntList", r_sum_dim, 0},
    {"aten::mean", r_mean, 0},
    {"aten::mean.dim", r_mean_dim, 0},
    {"aten::prod", r_prod, 0},
    {"aten::prod.dim_int", r_prod_dim, 0},
    {"aten::amax", r_amax, 0},
    {"aten::amin", r_amin, 0},
    {"aten::max", r_max, 0},
    {"aten::min", r_min, 0},
    {"aten::max.dim", r_max_dim, 0},
    {"aten::min.dim", r_min_dim, 0},
    {"aten::argmax", r_argmax, 0},
    {"aten::argmin", r_argmin, 0},
    {"aten::any", r_any, 0},
    {"aten::hash_tensor", r_hash_tensor, 0},
    {"aten::any.dim", r_any_dim, 0},
    {"aten::any.dims", r_any_dims, 0},
    {"aten::all", r_all, 0},
    {"aten::all.dim", r_all_dim, 0},
    {"aten::all.dims", r_all_dims, 0},
    {"aten::var.correction", r_var, 0},
    {"aten::std.correction", r_std, 0},
    {"aten::var_mean.correction", r_var_mean, 0},
    {"aten::std_mean.correction", r_std_mean, 0},
    {"aten::logsumexp", r_logsumexp, 0},
    {"aten::linalg_vector_norm", r_vector_norm, 0},
    {"aten::cumsum", r_cumsum, 0},
    {"aten::cumprod", r_cumprod, 0},
    {"aten::_cummax_helper", r_cummax_helper, 0},
    {"aten::_cummin_helper", r_cummin_helper, 0},
    {"aten::_logcumsumexp", r_logcumsumexp, 0},
    {"aten::nonzero_static", r_nonzero_static, 0},
    {"aten::_softmax", r_softmax, 0},
    {"aten::_log_softmax", r_log_softmax, 0},
    {"aten::_softmax_backward_data", r_softmax_bw, 0},
    {"aten::_log_softmax_backward_data", r_log_softmax_bw, 0},
    {"aten::mm", r_mm, 0},
    {"aten::bmm", r_mm, 0},
    {"aten::_grouped_mm", r_grouped_mm, 0},
    {"aten::mv", r_mm, 0},
    {"aten::dot", r_mm, 0},
    {"aten::vdot", r_vdot, 0},
    {"aten::addmm", r_addmm, 0},
    {"aten::_scaled_mm", r_scaled_mm, 0},
    {"aten::_int_mm", r_int_mm, 0},
    {"aten::baddbmm", r_addmm, 0},
    {"aten::addmv", r_addmm, 0},
    {"aten::addbmm", r_addbmm, 0},
    {"aten::_addmm_activation", r_addmm_act, 0},
    {"aten::sort", r_sort, 0},
    {"aten::sort.stable", r_sort_stable, 0},
    {"aten::topk", r_topk, 0},
    {"aten::kthvalue", r_kthvalue, 0},
    {"aten::median", r_median, 0},
    {"aten::median.dim", r_median_dim, 0},
    {"aten::nanmedian", r_nanmedian, 0},
    {"aten::nanmedian.dim", r_nanmedian_dim, 0},
    {"aten::histc", r_histc, 0},
    {NULL, NULL, 0},
};

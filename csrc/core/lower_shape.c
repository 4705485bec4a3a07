/* lower_shape.c - ops that compute new tensors from indices and shapes:
 * concatenation, padding, flips and rolls, triangles, gathers and scatters
 * (index_select, gather, scatter*, advanced indexing and index_put,
 * index_add/copy/fill, masked_scatter, take/put, embedding backward,
 * embedding bags and their gradients), the
 * *_scatter ops functionalization and view backward use, and the range
 * factories (arange, linspace, eye).
 *
 * Views (view, slice, select, permute, expand, ...) never reach this file:
 * they are metadata in the glue, materialised by the engine.
 *
 * Gathers use stablehlo.gather with whole-slice windows (a row gather for
 * index_select / embedding / advanced indexing, a point gather for
 * torch.gather).  Scatters use em_scatter_flat on the flattened operand with
 * linear element indices: an index outside its dimension turns into an
 * out-of-range linear index, which XLA's scatter drops.
 *
 * Out-of-range indices: PyTorch raises on the host before indexing; a
 * program cannot look at data, so each rule declares the range its indices
 * must lie in (lw_check_range) and the engine reports a violation at the
 * next synchronisation (eager.c, "index checks").  The values computed
 * meanwhile follow XLA: gathers clamp each index into its dimension and
 * scatters drop out-of-range updates.  Negative indices wrap where PyTorch
 * allows them (advanced indexing, index_put, index_fill, take, put,
 * select_scatter); the _unsafe_ forms are not checked. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "lower_util.h"

#define OUT0 (&n->outs[0])

/* ---- small helpers ----------------------------------------------------------------- */

static tp_val add(tp_emit *e, tp_val a, tp_val b) { return em_binary(e, "stablehlo.add", a, b); }
static tp_val sub(tp_emit *e, tp_val a, tp_val b) { return em_binary(e, "stablehlo.subtract", a, b); }
static tp_val mul(tp_emit *e, tp_val a, tp_val b) { return em_binary(e, "stablehlo.multiply", a, b); }
static tp_val k_like(tp_emit *e, tp_val like, double v) { return lw_full_like(e, like, v); }

/* Splat of an exact integer shaped like `like`. */
static tp_val ki_like(tp_emit *e, tp_val like, int64_t v) {
  const tp_type *t = em_type(e, like);
  tp_type tt = *t;
  return em_bcast_in_dim(e, em_const_i(e, v, t->dt), &tt, NULL);
}

static tp_val to_i64(tp_emit *e, tp_val v) { return em_convert(e, v, TP_I64); }

static tp_val iota_i64(tp_emit *e, int rank, const int64_t *dims, int dim) {
  tp_type t = tp_type_make(TP_I64, rank, dims);
  return em_iota(e, &t, dim);
}

static tp_val flatten(tp_emit *e, tp_val x) {
  int64_t nel = tp_type_numel(em_type(e, x));
  return em_reshape(e, x, 1, &nel);
}

static tp_val reshape_to(tp_emit *e, tp_val x, const tp_type *t) { return em_reshape(e, x, t->rank, t->dims); }

/* idx < 0 ? idx + size : idx (i64). */
static tp_val wrap_neg(tp_emit *e, tp_val idx, int64_t size) {
  tp_val z = ki_like(e, idx, 0);
  return em_select(e, em_compare(e, "LT", idx, z), add(e, idx, ki_like(e, idx, size)), idx);
}

/* broadcast_in_dim that accepts an unsorted dimension map: transposes x
 * first so the map is increasing (XLA wants it so). */
static tp_val bcast_map(tp_emit *e, tp_val x, const tp_type *out, const int64_t *map) {
  if (em_failed(e)) return -1;
  const tp_type *s = em_type(e, x);
  int r = s->rank;
  int sorted = 1;
  for (int i = 1; i < r; i++) sorted &= map[i] > map[i - 1];
  if (sorted) return em_bcast_in_dim(e, x, out, map);
  int64_t perm[TP_MAX_RANK], m2[TP_MAX_RANK];
  for (int i = 0; i < r; i++) perm[i] = i;
  for (int i = 1; i < r; i++) /* insertion sort of perm by map */
    for (int j = i; j > 0 && map[perm[j]] < map[perm[j - 1]]; j--) {
      int64_t t = perm[j];
      perm[j] = perm[j - 1];
      perm[j - 1] = t;
    }
  for (int i = 0; i < r; i++) m2[i] = map[perm[i]];
  return em_bcast_in_dim(e, em_transpose(e, x, perm), out, m2);
}

/* Smallest (hi=0) or largest (hi=1) value of dt, as a rank-0 constant. */
static tp_val dt_limit(tp_emit *e, tp_dtype dt, int hi) {
  if (tp_dtype_is_float(dt)) return em_const(e, hi ? INFINITY : -INFINITY, dt);
  int64_t lo = 0, up = 0;
  switch (dt) {
    case TP_I8: lo = INT8_MIN, up = INT8_MAX; break;
    case TP_I16: lo = INT16_MIN, up = INT16_MAX; break;
    case TP_I32: lo = INT32_MIN, up = INT32_MAX; break;
    case TP_I64: lo = INT64_MIN, up = INT64_MAX; break;
    case TP_U8: up = UINT8_MAX; break;
    case TP_U16: up = UINT16_MAX; break;
    case TP_U32: up = UINT32_MAX; break;
    case TP_U64: up = -1; break; /* all ones */
    case TP_BOOL: up = 1; break;
    default: break;
  }
  return em_const_i(e, hi ? up : lo, dt);
}

static size_t put_list(char *buf, size_t cap, size_t k, const int64_t *v, int nv) {
  if (k >= cap) return k;
  k += (size_t)snprintf(buf + k, cap - k, "[");
  for (int i = 0; i < nv && k < cap; i++) k += (size_t)snprintf(buf + k, cap - k, "%s%" PRId64, i ? ", " : "", v[i]);
  if (k < cap) k += (size_t)snprintf(buf + k, cap - k, "]");
  return k;
}

/* Rank guard: a rule about to build a value of rank `r`. */
static int rank_ok(tp_emit *e, const tp_node *n, int r) {
  if (r <= TP_MAX_RANK) return 1;
  em_fail(e, TP_INVALID_ARGUMENT, "%s: needs a tensor of rank %d; tpu supports at most %d dimensions", n->op, r,
          TP_MAX_RANK);
  return 0;
}

/* ---- gather ------------------------------------------------------------------------------ */

/* x gathered at an index-vector tensor `idx` of shape B + [m] (i64): entry j of
 * each vector indexes operand dim dims[j]; the other dims of x are taken
 * whole.  The result has x's other dims in order, with B inserted before the
 * batch_pos-th of them.  Indices are clamped into range (XLA semantics). */
static tp_val gather_nd(tp_emit *e, const tp_node *n, tp_val x, tp_val idx, const int *dims, int m, int batch_pos) {
  if (em_failed(e)) return -1;
  tp_type xt = *em_type(e, x), it = *em_type(e, idx);
  int r = xt.rank, nb = it.rank - 1;
  if (nb < 0 || it.dims[nb] != m) return em_fail(e, TP_INTERNAL, "%s: malformed gather indices", n->op);
  if (!rank_ok(e, n, r - m + nb)) return -1;
  int isidx[TP_MAX_RANK] = {0};
  int64_t bnumel = 1;
  for (int i = 0; i < nb; i++) bnumel *= it.dims[i];
  for (int j = 0; j < m; j++) {
    isidx[dims[j]] = 1;
    if (xt.dims[dims[j]] == 0 && bnumel > 0)
      return em_fail(e, TP_OUT_OF_RANGE, "%s: index is out of bounds for dimension with size 0", n->op);
  }
  tp_type ot = tp_type_make(xt.dt, 0, NULL);
  int64_t offset_dims[TP_MAX_RANK], collapsed[TP_MAX_RANK], smap[TP_MAX_RANK], sizes[TP_MAX_RANK];
  int noff = 0, ncol = 0, k = 0, bdone = 0;
  for (int d = 0; d < r; d++) {
    sizes[d] = isidx[d] ? 1 : xt.dims[d];
    if (isidx[d]) {
      collapsed[ncol++] = d;
      continue;
    }
    if (k == batch_pos) {
      for (int i = 0; i < nb; i++) ot.dims[ot.rank++] = it.dims[i];
      bdone = 1;
    }
    offset_dims[noff++] = ot.rank;
    ot.dims[ot.rank++] = xt.dims[d];
    k++;
  }
  if (!bdone)
    for (int i = 0; i < nb; i++) ot.dims[ot.rank++] = it.dims[i];
  for (int j = 0; j < m; j++) smap[j] = dims[j];
  char attrs[2048];
  size_t q = (size_t)snprintf(attrs, sizeof attrs, "dimension_numbers = #stablehlo.gather<");
  if (noff) {
    q += (size_t)snprintf(attrs + q, sizeof attrs - q, "offset_dims = ");
    q = put_list(attrs, sizeof attrs, q, offset_dims, noff);
    q += (size_t)snprintf(attrs + q, sizeof attrs - q, ", ");
  }
  q += (size_t)snprintf(attrs + q, sizeof attrs - q, "collapsed_slice_dims = ");
  q = put_list(attrs, sizeof attrs, q, collapsed, ncol);
  q += (size_t)snprintf(attrs + q, sizeof attrs - q, ", start_index_map = ");
  q = put_list(attrs, sizeof attrs, q, smap, m);
  q += (size_t)snprintf(attrs + q, sizeof attrs - q, ", index_vector_dim = %d>, slice_sizes = array<i64", nb);
  for (int d = 0; d < r && q < sizeof attrs; d++)
    q += (size_t)snprintf(attrs + q, sizeof attrs - q, "%s%" PRId64, d ? ", " : ": ", sizes[d]);
  if (q < sizeof attrs) snprintf(attrs + q, sizeof attrs - q, ">, indices_are_sorted = false");
  tp_val in[2] = {x, idx};
  return em_op(e, "stablehlo.gather", attrs, in, 2, &ot);
}

/* Stack same-shaped i64 index tensors into an index-vector tensor S + [k]. */
static tp_val stack_last(tp_emit *e, const tp_node *n, const tp_val *v, int k) {
  if (em_failed(e)) return -1;
  tp_type t = *em_type(e, v[0]);
  if (!rank_ok(e, n, t.rank + 1)) return -1;
  t.dims[t.rank++] = 1;
  tp_val parts[TP_MAX_RANK];
  for (int i = 0; i < k; i++) parts[i] = em_reshape(e, v[i], t.rank, t.dims);
  return em_concat(e, parts, k, t.rank - 1);
}

/* ---- scatter ----------------------------------------------------------------------------- */

/* Linear element index into a tensor of `dims` from per-dim coordinates (i64
 * values of one shape).  Where a checked coordinate is outside its dim the
 * result is numel (out of range: a scatter drops it). */
static tp_val linearize(tp_emit *e, const tp_val *coord, const int *check, int r, const int64_t *dims) {
  if (em_failed(e)) return -1;
  int64_t total = 1;
  for (int d = 0; d < r; d++) total *= dims[d];
  tp_val lin = -1, valid = -1;
  int64_t stride = 1;
  for (int d = r - 1; d >= 0; d--) {
    tp_val c = coord[d];
    tp_val term = stride == 1 ? c : mul(e, c, ki_like(e, c, stride));
    lin = lin < 0 ? term : add(e, lin, term);
    if (check[d]) {
      tp_val ok = em_binary(e, "stablehlo.and", em_compare(e, "GE", c, ki_like(e, c, 0)),
                            em_compare(e, "LT", c, ki_like(e, c, dims[d])));
      valid = valid < 0 ? ok : em_binary(e, "stablehlo.and", valid, ok);
    }
    stride *= dims[d];
  }
  if (valid >= 0) lin = em_select(e, valid, lin, ki_like(e, lin, total));
  return lin;
}

typedef enum { RED_REPLACE, RED_SUM, RED_PROD, RED_MEAN, RED_AMAX, RED_AMIN, RED_BAD } red_kind;

static red_kind parse_reduce(const char *s) {
  if (!s) return RED_BAD;
  if (!strcmp(s, "sum") || !strcmp(s, "add")) return RED_SUM;
  if (!strcmp(s, "prod") || !strcmp(s, "multiply")) return RED_PROD;
  if (!strcmp(s, "mean")) return RED_MEAN;
  if (!strcmp(s, "amax")) return RED_AMAX;
  if (!strcmp(s, "amin")) return RED_AMIN;
  return RED_BAD;
}

/* x (any shape) with updates `upd` combined into the elements at linear
 * indices `lin` (same shape as upd), like PyTorch's scatter_reduce:
 * include_self=0 first resets every targeted element to the reduction's
 * identity; MEAN divides by the number of contributions (floor division for
 * integers).  Arithmetic runs in opmath (bool in i32). */
/* native: combine in x's own dtype, rounding after each element as the
 * CPU's index_reduce does for float16/bfloat16 (scatter_reduce and
 * index_add accumulate in float32 there, as here otherwise). */
static tp_val scatter_core_in(tp_emit *e, tp_val x, tp_val lin, tp_val upd, red_kind red, int include_self,
                              int native) {
  if (em_failed(e)) return -1;
  tp_type xt = *em_type(e, x);
  int64_t nel = tp_type_numel(&xt), kk = tp_type_numel(em_type(e, lin));
  if (kk == 0) return x;
  tp_dtype dt = xt.dt;
  tp_dtype cdt = red == RED_REPLACE || (native && tp_dtype_is_float(dt)) ? dt : dt == TP_BOOL ? TP_I32 : lw_opmath(dt);
  tp_val xf = em_reshape(e, em_convert(e, x, cdt), 1, &nel);
  tp_val lf = em_reshape(e, lin, 1, &kk);
  tp_val uf = em_reshape(e, em_convert(e, upd, cdt), 1, &kk);
  tp_val res;
  if (red == RED_REPLACE) {
    res = em_scatter_flat(e, xf, lf, uf, NULL);
  } else {
    tp_type kt = tp_type_make(cdt, 1, &kk);
    tp_val ident = red == RED_AMAX ? dt_limit(e, cdt, 0) : red == RED_AMIN ? dt_limit(e, cdt, 1)
                                                                            : em_const_i(e, red == RED_PROD, cdt);
    if (!include_self) xf = em_scatter_flat(e, xf, lf, em_bcast_in_dim(e, ident, &kt, NULL), NULL);
    const char *op = red == RED_PROD ? "stablehlo.multiply"
                     : red == RED_AMAX ? "stablehlo.maximum"
                     : red == RED_AMIN ? "stablehlo.minimum"
                                       : "stablehlo.add";
    tp_val x0 = xf;
    res = em_scatter_flat(e, xf, lf, uf, op);
    if ((red == RED_AMAX || red == RED_AMIN) && tp_dtype_is_float(cdt)) {
      /* XLA:CPU's scatter drops NaN through a max/min combiner; PyTorch
       * propagates it.  Scatter-add NaN markers and put NaN back. */
      tp_val nanu = em_select(e, em_compare(e, "NE", uf, uf), uf, k_like(e, uf, 0));
      tp_val nanacc = em_scatter_flat(e, em_full(e, 0, em_type(e, xf)), lf, nanu, "stablehlo.add");
      tp_val isnan = em_compare(e, "NE", nanacc, nanacc);
      if (include_self) isnan = em_binary(e, "stablehlo.or", isnan, em_compare(e, "NE", x0, x0));
      res = em_select(e, isnan, k_like(e, res, NAN), res);
    }
    if (red == RED_MEAN) {
      tp_dtype ct = tp_dtype_is_float(cdt) ? cdt : TP_I64;
      tp_type nt = tp_type_make(ct, 1, &nel), k1 = tp_type_make(ct, 1, &kk);
      tp_val cnt = em_scatter_flat(e, em_full(e, include_self ? 1 : 0, &nt), lf, em_full(e, 1, &k1), "stablehlo.add");
      cnt = em_select(e, em_compare(e, "EQ", cnt, k_like(e, cnt, 0)), k_like(e, cnt, 1), cnt);
      cnt = em_convert(e, cnt, cdt);
      if (tp_dtype_is_float(cdt)) {
        res = em_binary(e, "stablehlo.divide", res, cnt);
      } else { /* floor division by a positive count */
        tp_val q = em_binary(e, "stablehlo.divide", res, cnt);
        tp_val rem = sub(e, res, mul(e, q, cnt));
        res = em_select(e, em_compare(e, "LT", rem, k_like(e, rem, 0)), sub(e, q, k_like(e, q, 1)), q);
      }
    }
  }
  return em_convert(e, reshape_to(e, res, &xt), dt);
}

static tp_val scatter_core(tp_emit *e, tp_val x, tp_val lin, tp_val upd, red_kind red, int include_self) {
  return scatter_core_in(e, x, lin, upd, red, include_self, 0);
}

/* ---- cat / stack --------------------------------------------------------------------------- */

static void r_cat(tp_emit *e, const tp_node *n, tp_val *o) {
  const tp_arg *L = lw_arg(n, 0);
  if (L->kind != TP_ARG_TENSORS) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: expected a list of tensors", n->op);
    return;
  }
  int rank = OUT0->rank;
  int dim = lw_dim(lw_int(n, 1, 0), rank);
  tp_val acc = -1, chunk[64];
  int nc = 0;
  for (int j = 0; j <= L->n; j++) {
    if (j < L->n) {
      tp_val v = L->vs[j];
      if (v < 0) continue;
      const tp_type *t = em_type(e, v);
      if (tp_type_numel(t) == 0) continue; /* legacy [0] tensors and empty pieces add nothing */
      if (t->rank != rank) {
        o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: tensor %d has %d dimensions, expected %d", n->op, j, t->rank, rank);
        return;
      }
      chunk[nc++] = em_convert(e, v, OUT0->dt);
    }
    if (nc == 64 || (j == L->n && nc > 0)) {
      tp_val c = em_concat(e, chunk, nc, dim);
      if (acc < 0) {
        acc = c;
      } else {
        tp_val two[2] = {acc, c};
        acc = em_concat(e, two, 2, dim);
      }
      nc = 0;
    }
  }
  o[0] = acc >= 0 ? acc : em_full(e, 0, OUT0);
}

static void r_stack(tp_emit *e, const tp_node *n, tp_val *o) {
  const tp_arg *L = lw_arg(n, 0);
  if (L->kind != TP_ARG_TENSORS || L->n < 1) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: expected a non-empty list of tensors", n->op);
    return;
  }
  int rank = OUT0->rank;
  int dim = lw_dim(lw_int(n, 1, 0), rank);
  tp_val acc = -1, chunk[64];
  int nc = 0;
  for (int j = 0; j < L->n; j++) {
    tp_val v = L->vs[j];
    const tp_type *t = em_type(e, v);
    if (t->rank + 1 != rank) {
      o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: stack expects each tensor to be equal size", n->op);
      return;
    }
    int64_t d[TP_MAX_RANK];
    for (int i = 0, k = 0; i < rank; i++) d[i] = i == dim ? 1 : t->dims[k++];
    chunk[nc++] = em_reshape(e, em_convert(e, v, OUT0->dt), rank, d);
    if (nc == 64 || j == L->n - 1) {
      tp_val c = em_concat(e, chunk, nc, dim);
      if (acc < 0) {
        acc = c;
      } else {
        tp_val two[2] = {acc, c};
        acc = em_concat(e, two, 2, dim);
      }
      nc = 0;
    }
  }
  o[0] = acc;
}

/* ---- padding, flips, rolls, repeats, triangles ------------------------------------------------- */

static void r_constant_pad_nd(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = lw_value(e, n, 0);
  const tp_type *t = em_type(e, x);
  const int64_t *pad;
  int np = lw_ints(n, 1, &pad);
  int r = t->rank;
  if (np % 2 || np / 2 > r) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: padding length must be even and at most twice the rank", n->op);
    return;
  }
  int64_t lo[TP_MAX_RANK] = {0}, hi[TP_MAX_RANK] = {0};
  for (int i = 0; i < np / 2; i++) {
    lo[r - 1 - i] = pad[2 * i];
    hi[r - 1 - i] = pad[2 * i + 1];
  }
  tp_val pv = lw_tensor(e, n, 2, t->dt);
  o[0] = em_pad(e, x, pv, lo, hi, NULL);
}

static void r_flip(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = lw_value(e, n, 0);
  tp_type t = *em_type(e, x);
  const int64_t *dims;
  int nd = lw_ints(n, 1, &dims);
  int use[TP_MAX_RANK] = {0};
  for (int i = 0; i < nd; i++) {
    int d = lw_dim(dims[i], t.rank);
    if (d >= 0 && d < t.rank && t.dims[d] > 1) use[d] = 1;
  }
  int64_t rd[TP_MAX_RANK];
  int k = 0;
  for (int d = 0; d < t.rank; d++)
    if (use[d]) rd[k++] = d;
  if (!k) {
    o[0] = x;
    return;
  }
  char attrs[512];
  size_t q = (size_t)snprintf(attrs, sizeof attrs, "dimensions = array<i64");
  for (int i = 0; i < k && q < sizeof attrs; i++)
    q += (size_t)snprintf(attrs + q, sizeof attrs - q, "%s%" PRId64, i ? ", " : ": ", rd[i]);
  if (q < sizeof attrs) snprintf(attrs + q, sizeof attrs - q, ">");
  o[0] = em_op(e, "stablehlo.reverse", attrs, &x, 1, &t);
}

/* torch.roll along one dim by a runtime shift (TP_RUNTIME: a loop over
 * shifts runs one program): the last `shift mod size` elements move to the
 * front, i.e. the result is [x, x] from size - (shift mod size) on. */
static tp_val roll1(tp_emit *e, tp_val x, int d, tp_val shift) {
  if (em_failed(e)) return -1;
  tp_type t = *em_type(e, x);
  int64_t size = t.dims[d];
  if (size <= 1) return x;
  tp_val n = em_const_i(e, size, TP_I64);
  tp_val r = em_binary(e, "stablehlo.remainder", shift, n); /* sign of the shift */
  r = em_select(e, em_compare(e, "LT", r, em_const_i(e, 0, TP_I64)), add(e, r, n), r);
  tp_val xx[2] = {x, x};
  tp_val both = em_concat(e, xx, 2, d);
  tp_val st[TP_MAX_RANK];
  for (int i = 0; i < t.rank; i++) st[i] = i == d ? sub(e, n, r) : em_const_i(e, 0, TP_I64);
  return em_dyn_slice(e, both, st, t.dims);
}

static void r_roll(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = lw_value(e, n, 0);
  tp_type t = *em_type(e, x);
  const int64_t *shifts, *dims;
  int ns = lw_ints(n, 1, &shifts), nd = lw_ints(n, 2, &dims);
  if (nd == 0) {
    if (ns != 1) {
      o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: shifts must have one element when dims is empty", n->op);
      return;
    }
    o[0] = reshape_to(e, roll1(e, flatten(e, x), 0, lw_runtime_int(e, n, 1, 0)), &t);
    return;
  }
  if (ns != nd) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: shifts and dimensions must align. shifts: %d, dims:%d", n->op, ns, nd);
    return;
  }
  for (int i = 0; i < nd; i++) x = roll1(e, x, lw_dim(dims[i], t.rank), lw_runtime_int(e, n, 1, i));
  o[0] = x;
}

static void r_repeat(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = lw_value(e, n, 0);
  tp_type t = *em_type(e, x);
  const int64_t *rep;
  int nr = lw_ints(n, 1, &rep);
  if (nr < t.rank || !rank_ok(e, n, nr + 1)) {
    if (!em_failed(e))
      em_fail(e, TP_INVALID_ARGUMENT,
              "%s: number of dimensions of repeat dims can not be smaller than number of dimensions of tensor", n->op);
    o[0] = -1;
    return;
  }
  int64_t d[TP_MAX_RANK];
  for (int i = 0; i < nr; i++) d[i] = i < nr - t.rank ? 1 : t.dims[i - (nr - t.rank)];
  x = em_reshape(e, x, nr, d);
  for (int i = 0; i < nr; i++) {
    if (rep[i] == 1) continue;
    /* [.., d_i, ..] -> [.., rep_i, d_i, ..] -> [.., rep_i*d_i, ..] */
    tp_type bt = tp_type_make(t.dt, 0, NULL);
    int64_t map[TP_MAX_RANK];
    for (int j = 0; j < nr; j++) {
      if (j == i) bt.dims[bt.rank++] = rep[i];
      map[j] = bt.rank;
      bt.dims[bt.rank++] = d[j];
    }
    x = em_bcast_in_dim(e, x, &bt, map);
    d[i] *= rep[i];
    x = em_reshape(e, x, nr, d);
  }
  o[0] = x;
}

static void tri(tp_emit *e, const tp_node *n, tp_val *o, int lower) {
  tp_val x = lw_value(e, n, 0);
  tp_type t = *em_type(e, x);
  if (t.rank < 2) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: input tensor must have at least 2 dimensions", n->op);
    return;
  }
  int64_t rc[2] = {t.dims[t.rank - 2], t.dims[t.rank - 1]};
  tp_val row = iota_i64(e, 2, rc, 0), col = iota_i64(e, 2, rc, 1);
  tp_val dif = sub(e, col, row);
  tp_type dt = *em_type(e, dif);
  tp_val diag = em_bcast_in_dim(e, lw_runtime_int(e, n, 1, 0), &dt, NULL); /* TP_RUNTIME */
  tp_val m = em_compare(e, lower ? "LE" : "GE", dif, diag);
  tp_type bt = t;
  bt.dt = TP_BOOL;
  int64_t map[2] = {t.rank - 2, t.rank - 1};
  m = em_bcast_in_dim(e, m, &bt, map);
  o[0] = em_select(e, m, x, em_full(e, 0, &t));
}
static void r_tril(tp_emit *e, const tp_node *n, tp_val *o) { tri(e, n, o, 1); }
static void r_triu(tp_emit *e, const tp_node *n, tp_val *o) { tri(e, n, o, 0); }

/* ---- index_select / gather / take / embedding ----------------------------------------------- */

static void r_index_select(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = lw_value(e, n, 0);
  tp_type t = *em_type(e, x);
  int dim = lw_dim(lw_int(n, 1, 0), t.rank);
  if (t.rank == 0) {
    int64_t one = 1;
    x = em_reshape(e, x, 1, &one);
    dim = 0;
  }
  tp_val idx = to_i64(e, lw_value(e, n, 2));
  int64_t size = em_type(e, x)->dims[dim];
  if (t.rank > 1 && dim == 1) /* the CPU kernel's own loop for dim 1 words it so */
    lw_check_arg(e, n, 2, idx, 0, size, TP_INVALID_ARGUMENT, "INDICES element is out of DATA bounds, id={} axis_dim=%" PRId64,
                 size);
  else
    lw_check_arg(e, n, 2, idx, 0, size, TP_OUT_OF_RANGE, "index out of range in self");
  int64_t kd[2] = {tp_type_numel(em_type(e, idx)), 1};
  idx = em_reshape(e, idx, 2, kd);
  int dims[1] = {dim};
  o[0] = reshape_to(e, gather_nd(e, n, x, idx, dims, 1, dim), OUT0);
}

static void r_gather(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = lw_value(e, n, 0);
  tp_type t = *em_type(e, x);
  int dim = lw_dim(lw_int(n, 1, 0), t.rank);
  tp_val idx = to_i64(e, lw_value(e, n, 2));
  tp_type it = *em_type(e, idx);
  lw_check_arg(e, n, 2, idx, 0, t.rank ? t.dims[dim] : 1, TP_INVALID_ARGUMENT,
               "index {} is out of bounds for dimension %d with size %" PRId64, dim, t.rank ? t.dims[dim] : 1);
  if (t.rank == 0) { /* index must be 0 */
    o[0] = em_bcast_to(e, x, OUT0->rank, OUT0->dims);
    return;
  }
  if (it.rank != t.rank) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: Index tensor must have the same number of dimensions as input tensor",
                   n->op);
    return;
  }
  tp_val coord[TP_MAX_RANK];
  int dims[TP_MAX_RANK];
  for (int d = 0; d < t.rank; d++) {
    coord[d] = d == dim ? idx : iota_i64(e, it.rank, it.dims, d);
    dims[d] = d;
  }
  tp_val iv = stack_last(e, n, coord, t.rank);
  o[0] = gather_nd(e, n, x, iv, dims, t.rank, 0);
}

static void r_take(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = flatten(e, lw_value(e, n, 0));
  int64_t nel = em_type(e, x)->dims[0];
  tp_val idx = to_i64(e, lw_value(e, n, 1));
  lw_check_arg(e, n, 1, idx, -nel, nel, TP_OUT_OF_RANGE,
               "out of range: tried to access index {} on a tensor of %" PRId64 " elements.", nel);
  idx = wrap_neg(e, idx, nel);
  if (nel == 0) {
    o[0] = em_fail(e, TP_OUT_OF_RANGE, "%s: out of range: tried to access index on an empty tensor", n->op);
    return;
  }
  o[0] = em_gather_flat(e, x, idx);
}

static void r_embedding(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val w = lw_value(e, n, 0);
  tp_val idx = to_i64(e, lw_value(e, n, 1));
  tp_type it = *em_type(e, idx);
  if (em_type(e, w)->rank != 2) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: 'weight' must be 2-D", n->op);
    return;
  }
  if (!rank_ok(e, n, it.rank + 1)) return;
  lw_check_arg(e, n, 1, idx, 0, em_type(e, w)->dims[0], TP_OUT_OF_RANGE, "index out of range in self");
  it.dims[it.rank++] = 1;
  idx = em_reshape(e, idx, it.rank, it.dims);
  int dims[1] = {0};
  o[0] = gather_nd(e, n, w, idx, dims, 1, 0);
}

static void r_embedding_dense_backward(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_dtype cdt = lw_opmath(OUT0->dt);
  tp_val g = lw_tensor(e, n, 0, cdt);
  tp_val idx = flatten(e, to_i64(e, lw_value(e, n, 1)));
  int64_t nw = lw_int(n, 2, 0), pad = lw_int(n, 3, -1);
  int scale = lw_bool(n, 4, 0);
  int64_t nidx = em_type(e, idx)->dims[0];
  int64_t dd = OUT0->dims[1];
  int64_t nd[2] = {nidx, dd};
  g = em_reshape(e, g, 2, nd);
  tp_type gt = tp_type_make(cdt, 2, nd);
  int64_t map0[1] = {0};
  if (nidx == 0) {
    o[0] = em_full(e, 0, OUT0);
    return;
  }
  if (scale) {
    tp_type ct = tp_type_make(cdt, 1, &nw), kt = tp_type_make(cdt, 1, &nidx);
    tp_val cnt = em_scatter_flat(e, em_full(e, 0, &ct), idx, em_full(e, 1, &kt), "stablehlo.add");
    tp_val per = em_gather_flat(e, cnt, idx);
    g = em_binary(e, "stablehlo.divide", g, em_bcast_in_dim(e, per, &gt, map0));
  }
  /* rows of padding_idx (and out-of-range rows) contribute nothing */
  tp_val keep = em_binary(e, "stablehlo.and", em_compare(e, "NE", idx, ki_like(e, idx, pad)),
                          em_binary(e, "stablehlo.and", em_compare(e, "GE", idx, ki_like(e, idx, 0)),
                                    em_compare(e, "LT", idx, ki_like(e, idx, nw))));
  tp_type lt = tp_type_make(TP_I64, 2, nd);
  tp_val row = em_select(e, keep, idx, ki_like(e, idx, nw)); /* nw*dd+j: out of range */
  tp_val lin = add(e, mul(e, em_bcast_in_dim(e, row, &lt, map0), em_full(e, (double)dd, &lt)), em_iota(e, &lt, 1));
  int64_t tot = nw * dd;
  tp_type ft = tp_type_make(cdt, 1, &tot);
  tp_val res = em_scatter_flat(e, em_full(e, 0, &ft), lin, g, "stablehlo.add");
  o[0] = em_convert(e, reshape_to(e, res, OUT0), OUT0->dt);
}

/* ---- scatter / scatter_add / scatter_reduce ------------------------------------------------ */

/* self.scatter*(dim, index, src-or-value) with the given reduction. */
static void scatter_dim(tp_emit *e, const tp_node *n, tp_val *o, red_kind red, int include_self) {
  tp_val x = lw_value(e, n, 0);
  tp_type t = *em_type(e, x);
  int dim = lw_dim(lw_int(n, 1, 0), t.rank);
  tp_val idx = to_i64(e, lw_value(e, n, 2));
  tp_type it = *em_type(e, idx);
  int64_t kk = tp_type_numel(&it);
  if (kk == 0 || em_failed(e)) {
    o[0] = x;
    return;
  }
  tp_type x1 = t;
  if (t.rank == 0) { /* a 0-d self: treat as [1] */
    x1 = tp_type_make(t.dt, 1, &kk);
    x1.dims[0] = 1;
    idx = em_reshape(e, idx, 1, &kk);
    it = *em_type(e, idx);
    dim = 0;
  }
  if (it.rank != x1.rank) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: Index tensor must have the same number of dimensions as self tensor",
                   n->op);
    return;
  }
  lw_check_arg(e, n, 2, idx, 0, x1.dims[dim], TP_INVALID_ARGUMENT,
               "index {} is out of bounds for dimension %d with size %" PRId64, dim, x1.dims[dim]);
  tp_val upd;
  tp_type ut = it;
  ut.dt = t.dt;
  if (lw_arg(n, 3)->kind == TP_ARG_TENSOR) {
    tp_val src = lw_value(e, n, 3);
    const tp_type *st = em_type(e, src);
    if (st->rank == 0) src = em_reshape(e, src, 1, &kk);
    int64_t z[TP_MAX_RANK] = {0};
    if (em_type(e, src)->rank != it.rank) {
      o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: Index tensor must have the same number of dimensions as src tensor",
                     n->op);
      return;
    }
    upd = em_convert(e, em_slice(e, src, z, it.dims, NULL), t.dt);
  } else {
    upd = lw_operand(e, n, 3, &ut);
  }
  tp_val coord[TP_MAX_RANK];
  int check[TP_MAX_RANK];
  for (int d = 0; d < it.rank; d++) {
    coord[d] = d == dim ? idx : iota_i64(e, it.rank, it.dims, d);
    check[d] = d == dim;
  }
  tp_val lin = linearize(e, coord, check, x1.rank, x1.dims);
  o[0] = reshape_to(e, scatter_core(e, reshape_to(e, x, &x1), lin, upd, red, include_self), &t);
}

static void r_scatter(tp_emit *e, const tp_node *n, tp_val *o) { scatter_dim(e, n, o, RED_REPLACE, 1); }
static void r_scatter_add(tp_emit *e, const tp_node *n, tp_val *o) { scatter_dim(e, n, o, RED_SUM, 1); }
static void r_scatter_reduce_two(tp_emit *e, const tp_node *n, tp_val *o) {
  const char *s = lw_str(n, 4, NULL);
  red_kind r = parse_reduce(s);
  if (r == RED_BAD || (s && (!strcmp(s, "add") || !strcmp(s, "multiply")))) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: reduce argument must be either sum, prod, mean, amax or amin, got %s",
                   n->op, s ? s : "None");
    return;
  }
  scatter_dim(e, n, o, r, lw_bool(n, 5, 1));
}
/* scatter(..., reduce="add"|"multiply") (src or value) */
static void r_scatter_legacy_reduce(tp_emit *e, const tp_node *n, tp_val *o) {
  const char *s = lw_str(n, 4, NULL);
  red_kind r = parse_reduce(s);
  if (!s || (strcmp(s, "add") && strcmp(s, "multiply"))) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: reduce argument must be either add or multiply, got %s", n->op,
                   s ? s : "None");
    return;
  }
  scatter_dim(e, n, o, r, 1);
}

/* ---- index_add / index_copy / index_reduce / index_fill --------------------------------------- */

/* self.index_*(dim, index, source): source's dim `dim` is scattered to
 * self's rows index[i]. */
static void index_dim(tp_emit *e, const tp_node *n, tp_val *o, red_kind red, int include_self, int alpha_i, int native) {
  tp_val x = lw_value(e, n, 0);
  tp_type t = *em_type(e, x);
  int dim = lw_dim(lw_int(n, 1, 0), t.rank);
  tp_val idx = flatten(e, to_i64(e, lw_value(e, n, 2)));
  int64_t kk = em_type(e, idx)->dims[0];
  tp_val src = lw_value(e, n, 3);
  if (kk == 0 || em_failed(e)) {
    o[0] = x;
    return;
  }
  tp_type x1 = t;
  if (t.rank == 0) {
    x1.rank = 1;
    x1.dims[0] = 1;
    src = flatten(e, src);
    dim = 0;
  }
  if (em_type(e, src)->rank == 0 && kk == 1 && x1.rank == 1) src = flatten(e, src); /* a scalar source, as the CPU takes */
  tp_type st = *em_type(e, src);
  if (st.rank != x1.rank || st.dims[dim] != kk) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: source has the wrong shape for index of %" PRId64 " elements", n->op, kk);
    return;
  }
  if (red == RED_REPLACE)
    lw_check_arg(e, n, 2, idx, 0, x1.dims[dim], TP_OUT_OF_RANGE,
                 "index_copy_(): index {} is out of bounds for dimension %d with size %" PRId64, dim, x1.dims[dim]);
  else if (red == RED_SUM)
    lw_check_arg(e, n, 2, idx, 0, x1.dims[dim], TP_INVALID_ARGUMENT,
                 "index {} is out of bounds for dimension %d with size %" PRId64, dim, x1.dims[dim]);
  else
    lw_check_arg(e, n, 2, idx, 0, x1.dims[dim], TP_OUT_OF_RANGE, "index out of range in self");
  tp_val upd = src;
  if (alpha_i >= 0 && t.dt == TP_BOOL) {
    upd = em_binary(e, "stablehlo.and", em_convert(e, src, TP_BOOL), lw_operand(e, n, alpha_i, &st)); /* bool * alpha */
  } else if (alpha_i >= 0) {
    tp_dtype cdt = lw_opmath(t.dt);
    tp_type ct = st;
    ct.dt = cdt;
    upd = mul(e, em_convert(e, src, cdt), lw_operand(e, n, alpha_i, &ct));
  }
  tp_val coord[TP_MAX_RANK];
  int check[TP_MAX_RANK];
  int64_t map[1] = {dim};
  tp_type sit = st;
  sit.dt = TP_I64;
  for (int d = 0; d < st.rank; d++) {
    coord[d] = d == dim ? em_bcast_in_dim(e, idx, &sit, map) : iota_i64(e, st.rank, st.dims, d);
    check[d] = d == dim;
  }
  tp_val lin = linearize(e, coord, check, x1.rank, x1.dims);
  o[0] = reshape_to(e, scatter_core_in(e, reshape_to(e, x, &x1), lin, upd, red, include_self, native), &t);
}

static void r_index_add(tp_emit *e, const tp_node *n, tp_val *o) { index_dim(e, n, o, RED_SUM, 1, 4, 0); }
static void r_index_copy(tp_emit *e, const tp_node *n, tp_val *o) { index_dim(e, n, o, RED_REPLACE, 1, -1, 0); }
static void r_index_reduce(tp_emit *e, const tp_node *n, tp_val *o) {
  const char *s = lw_str(n, 4, NULL);
  red_kind r = parse_reduce(s);
  if (r != RED_PROD && r != RED_MEAN && r != RED_AMAX && r != RED_AMIN) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: reduce argument must be either prod, mean, amax or amin, got %s", n->op,
                   s ? s : "None");
    return;
  }
  index_dim(e, n, o, r, lw_bool(n, 5, 1), -1, 1);
}

static void r_index_fill(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = lw_value(e, n, 0);
  tp_type t = *em_type(e, x);
  int dim = lw_dim(lw_int(n, 1, 0), t.rank);
  int64_t size = t.rank ? t.dims[dim] : 1;
  tp_val idx = flatten(e, to_i64(e, lw_value(e, n, 2)));
  int64_t kk = em_type(e, idx)->dims[0];
  if (kk == 0 || em_failed(e)) {
    o[0] = x;
    return;
  }
  lw_check_arg(e, n, 2, idx, -size, size, TP_OUT_OF_RANGE,
               "index {} is out of bounds for dimension %d with size %" PRId64, dim, size);
  idx = wrap_neg(e, idx, size);
  tp_type ht = tp_type_make(TP_BOOL, 1, &size), kt = tp_type_make(TP_BOOL, 1, &kk);
  tp_val hit = em_scatter_flat(e, em_full(e, 0, &ht), idx, em_full(e, 1, &kt), NULL);
  tp_type bt = t;
  bt.dt = TP_BOOL;
  int64_t map[1] = {dim};
  hit = t.rank ? em_bcast_in_dim(e, hit, &bt, map) : em_reshape(e, hit, 0, NULL);
  o[0] = em_select(e, hit, lw_operand(e, n, 3, OUT0), x);
}

/* ---- max_unpool ------------------------------------------------------------------------------- */

/* max_unpool2d(self, indices, output_size) / max_unpool3d(self, indices,
 * output_size, stride, padding): each plane's values go to their flat
 * positions in a zero output plane.  An index outside the plane raises the
 * CPU's error (device-side check) and is dropped, never written into
 * another plane. */
static void r_max_unpool(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = lw_value(e, n, 0), idx = to_i64(e, lw_value(e, n, 1));
  if (em_failed(e)) return;
  const int64_t *osz;
  int k = lw_ints(n, 2, &osz);
  tp_type xt = *em_type(e, x);
  if (k < 1 || xt.rank < k || tp_type_numel(em_type(e, idx)) != tp_type_numel(&xt)) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: expected indices of the input's shape and %d output sizes", n->op, k);
    return;
  }
  int64_t plane = 1, in_plane = 1, planes = 1;
  char sizes[128];
  size_t q = 0;
  for (int i = 0; i < k; i++) {
    plane *= osz[i];
    in_plane *= xt.dims[xt.rank - k + i];
    q += (size_t)snprintf(sizes + q, sizeof sizes - q, "%s%" PRId64, i ? "x" : "", osz[i]);
    if (q >= sizeof sizes) q = sizeof sizes - 1;
  }
  for (int i = 0; i < xt.rank - k; i++) planes *= xt.dims[i];
  if (planes * plane == 0 || in_plane == 0) {
    o[0] = em_full(e, 0, OUT0);
    return;
  }
  int64_t d2[2] = {planes, in_plane};
  tp_val i2 = em_reshape(e, idx, 2, d2);
  lw_check_range(e, n, i2, 0, plane, TP_INVALID_ARGUMENT,
                 "Found an invalid max index: {} (output volumes are of size %s)", sizes);
  tp_val coord[2] = {iota_i64(e, 2, d2, 0), i2};
  int check[2] = {0, 1};
  int64_t od[2] = {planes, plane}, total = planes * plane;
  tp_val lin = linearize(e, coord, check, 2, od); /* out of range: past the end, dropped */
  tp_type ft = tp_type_make(xt.dt, 1, &total);
  tp_val res = em_scatter_flat(e, em_full(e, 0, &ft), flatten(e, lin), flatten(e, x), NULL);
  o[0] = reshape_to(e, res, OUT0);
}

/* ---- advanced indexing ------------------------------------------------------------------------ */

typedef struct iplan {
  int m;                   /* number of index tensors (not None) */
  int dims[TP_MAX_RANK];   /* the operand dim each indexes */
  tp_val idx[TP_MAX_RANK]; /* i64, broadcast to B, negatives wrapped */
  int brank;
  int64_t b[TP_MAX_RANK];  /* broadcast index shape B */
  int batch_pos;           /* where B goes among the non-indexed dims */
  int mask;                /* the one index is a bool/byte mask (index_put only) */
  int mask_dim;
  tp_val mask_v;
} iplan;

/* Read the Tensor?[] argument `ai` indexing `x`.  Returns 0 on error (recorded). */
static int index_plan(tp_emit *e, const tp_node *n, tp_val x, int ai, iplan *p, int allow_mask) {
  memset(p, 0, sizeof *p);
  tp_type xtt = *em_type(e, x), *xt = &xtt; /* a copy: the plan emits */
  const tp_arg *L = lw_arg(n, ai);
  if (L->kind == TP_ARG_NONE) return 1;
  if (L->kind != TP_ARG_TENSORS) {
    em_fail(e, TP_INVALID_ARGUMENT, "%s: expected a list of index tensors", n->op);
    return 0;
  }
  int d = 0, nmask = 0, nint = 0, mask0d = 0;
  tp_val raw[TP_MAX_RANK];
  for (int j = 0; j < L->n; j++) {
    tp_val v = L->vs[j];
    if (v < 0) {
      d++;
      continue;
    }
    const tp_type *vt = em_type(e, v);
    if (vt->dt == TP_BOOL || vt->dt == TP_U8) {
      nmask++;
      p->mask_dim = d;
      p->mask_v = v;
      mask0d |= vt->rank == 0; /* x[True]: adds a dim; not lowered */
      d += vt->rank;
      continue;
    }
    if (!tp_dtype_is_int(vt->dt)) {
      em_fail(e, TP_OUT_OF_RANGE, "%s: tensors used as indices must be long, int, byte or bool tensors", n->op);
      return 0;
    }
    if (d >= xt->rank) {
      em_fail(e, TP_OUT_OF_RANGE, "%s: too many indices for tensor of dimension %d", n->op, xt->rank);
      return 0;
    }
    p->dims[p->m] = d++;
    raw[p->m++] = v;
    nint++;
  }
  if (nmask) {
    if (!allow_mask || nmask != 1 || nint != 0 || mask0d) {
      em_fail(e, TP_UNIMPLEMENTED,
              "%s: indexing with bool or byte masks has a data-dependent shape; only a single mask in index_put is "
              "lowered",
              n->op);
      return 0;
    }
    if (d > xt->rank) {
      em_fail(e, TP_OUT_OF_RANGE, "%s: too many indices for tensor of dimension %d", n->op, xt->rank);
      return 0;
    }
    p->mask = 1;
    return 1;
  }
  if (p->m == 0) return 1;
  /* broadcast shape of the index tensors */
  for (int j = 0; j < p->m; j++) {
    const tp_type *vt = em_type(e, raw[j]);
    if (vt->rank > p->brank) {
      int sh = vt->rank - p->brank;
      memmove(p->b + sh, p->b, sizeof(int64_t) * (size_t)p->brank);
      for (int i = 0; i < sh; i++) p->b[i] = 1;
      p->brank = vt->rank;
    }
    for (int i = 0; i < vt->rank; i++) {
      int64_t *bd = &p->b[p->brank - vt->rank + i];
      int64_t s = vt->dims[i];
      if (*bd == 1) *bd = s;
      else if (s != 1 && s != *bd) {
        em_fail(e, TP_OUT_OF_RANGE, "%s: shape mismatch: indexing tensors could not be broadcast together", n->op);
        return 0;
      }
    }
  }
  for (int j = 0; j < p->m; j++) {
    int64_t size = xt->dims[p->dims[j]];
    if (strncmp(n->op, "aten::_unsafe_", 14)) /* the unsafe forms promise in-range indices */
      lw_check_range(e, n, raw[j], -size, size, TP_OUT_OF_RANGE,
                   "index {} is out of bounds for dimension %d with size %" PRId64, p->dims[j], size);
    tp_val v = em_bcast_to(e, to_i64(e, raw[j]), p->brank, p->b);
    p->idx[j] = wrap_neg(e, v, size);
  }
  int adjacent = p->dims[p->m - 1] - p->dims[0] == p->m - 1;
  p->batch_pos = adjacent ? p->dims[0] : 0;
  return !em_failed(e);
}

/* Shape of x[indices]: x's non-indexed dims with B at batch_pos. */
static tp_type index_result_type(const tp_type *xt, const iplan *p) {
  int isidx[TP_MAX_RANK] = {0};
  for (int j = 0; j < p->m; j++) isidx[p->dims[j]] = 1;
  tp_type r = tp_type_make(xt->dt, 0, NULL);
  int k = 0, done = 0;
  for (int d = 0; d < xt->rank; d++) {
    if (isidx[d]) continue;
    if (k == p->batch_pos && !done) {
      for (int i = 0; i < p->brank && r.rank < TP_MAX_RANK; i++) r.dims[r.rank++] = p->b[i];
      done = 1;
    }
    if (r.rank < TP_MAX_RANK) r.dims[r.rank++] = xt->dims[d];
    k++;
  }
  if (!done)
    for (int i = 0; i < p->brank && r.rank < TP_MAX_RANK; i++) r.dims[r.rank++] = p->b[i];
  return r;
}

static void r_index(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = lw_value(e, n, 0);
  iplan p;
  if (!index_plan(e, n, x, 1, &p, 0)) {
    o[0] = -1;
    return;
  }
  if (p.m == 0) {
    o[0] = reshape_to(e, x, OUT0);
    return;
  }
  tp_val iv = stack_last(e, n, p.idx, p.m);
  o[0] = reshape_to(e, gather_nd(e, n, x, iv, p.dims, p.m, p.batch_pos), OUT0);
}

/* Exclusive position of each true element among the trues of a 1-D i64 0/1
 * tensor: inclusive prefix sum (log-step) minus one. */
/* Inclusive running sum of integer x along `dim` (log2(n) shifted adds). */
static tp_val prefix_sum_dim(tp_emit *e, tp_val x, int dim) {
  if (em_failed(e)) return -1;
  const tp_type *t = em_type(e, x);
  int64_t nel = t->dims[dim], lo[TP_MAX_RANK] = {0}, hi[TP_MAX_RANK] = {0};
  tp_val zero = em_const_i(e, 0, t->dt);
  for (int64_t s = 1; s < nel; s *= 2) {
    lo[dim] = s;
    hi[dim] = -s;
    x = add(e, x, em_pad(e, x, zero, lo, hi, NULL));
  }
  return x;
}
static tp_val prefix_sum(tp_emit *e, tp_val x) { return prefix_sum_dim(e, x, 0); }

/* For a bool value `mask` (any shape), the index (into the K trues, in
 * row-major order) of each element, clamped into [0, kmax). */
static tp_val mask_positions(tp_emit *e, tp_val mask, int64_t kmax) {
  tp_type mt = *em_type(e, mask);
  tp_val cs = prefix_sum(e, to_i64(e, flatten(e, mask)));
  cs = sub(e, cs, ki_like(e, cs, 1));
  cs = em_clamp(e, em_const_i(e, 0, TP_I64), cs, em_const_i(e, kmax - 1, TP_I64));
  mt.dt = TP_I64;
  return reshape_to(e, cs, &mt);
}

/* t's sizes as PyTorch prints them in messages: [3, 2]. */
static const char *dims_str(char *buf, size_t n, const tp_type *t) {
  size_t k = (size_t)snprintf(buf, n, "[");
  for (int i = 0; i < t->rank && k < n; i++)
    k += (size_t)snprintf(buf + k, n - k, "%s%" PRId64, i ? ", " : "", t->dims[i]);
  if (k < n) snprintf(buf + k, n - k, "]");
  return buf;
}

/* index_put with one bool/byte mask covering dims [p, p+k). */
static tp_val index_put_mask(tp_emit *e, const tp_node *n, tp_val x, const iplan *pl, tp_val values, int accumulate) {
  tp_type xt = *em_type(e, x);
  tp_val mask = em_convert(e, pl->mask_v, TP_BOOL);
  tp_type mt = *em_type(e, mask);
  int p = pl->mask_dim, k = mt.rank;
  for (int i = 0; i < k; i++)
    if (mt.dims[i] != xt.dims[p + i]) {
      char ms[TP_MAX_RANK * 24], xs[TP_MAX_RANK * 24];
      return em_fail(e, TP_OUT_OF_RANGE,
                     "%s: The shape of the mask %s at index %d does not match the shape of the indexed tensor %s at "
                     "index %d",
                     n->op, dims_str(ms, sizeof ms, &mt), i, dims_str(xs, sizeof xs, &xt), p + i);
    }
  /* x[mask] has shape x[:p] + [K] + x[p+k:]; values broadcast to it. */
  int rr = xt.rank - k + 1;
  const tp_type *vt = em_type(e, values);
  if (vt->rank > rr) return em_fail(e, TP_INVALID_ARGUMENT, "%s: values have too many dimensions", n->op);
  int kv_dim = vt->rank - (rr - p);
  int64_t kv = kv_dim >= 0 ? vt->dims[kv_dim] : 1;
  int64_t rd[TP_MAX_RANK];
  for (int i = 0; i < p; i++) rd[i] = xt.dims[i];
  rd[p] = kv;
  for (int i = p + k; i < xt.rank; i++) rd[i - k + 1] = xt.dims[i];
  tp_dtype cdt = accumulate ? (xt.dt == TP_BOOL ? TP_I32 : lw_opmath(xt.dt)) : xt.dt;
  tp_val v = em_bcast_to(e, em_convert(e, values, cdt), rr, rd);
  tp_type ct = xt;
  ct.dt = cdt;
  tp_val vx;
  if (kv == 1) {
    int64_t d1[TP_MAX_RANK];
    for (int i = 0; i < xt.rank; i++) d1[i] = (i >= p && i < p + k) ? 1 : xt.dims[i];
    vx = em_bcast_to(e, em_reshape(e, v, xt.rank, d1), xt.rank, xt.dims);
  } else {
    tp_val cnt = em_reduce(e, to_i64(e, flatten(e, mask)), em_const_i(e, 0, TP_I64), (const int64_t[]){0}, 1,
                           "stablehlo.add");
    char vs[256], rs[256]; /* the shapes as PyTorch prints them; {} is the count of trues */
    size_t q = 0, w = 0;
    for (int i = 0; i < em_type(e, values)->rank && q < sizeof vs; i++)
      q += (size_t)snprintf(vs + q, sizeof vs - q, "%s%" PRId64, i ? ", " : "", em_type(e, values)->dims[i]);
    vs[q < sizeof vs ? q : sizeof vs - 1] = 0;
    for (int i = 0; i < rr && w < sizeof rs; i++) {
      if (i == p) w += (size_t)snprintf(rs + w, sizeof rs - w, "%s{}", i ? ", " : "");
      else w += (size_t)snprintf(rs + w, sizeof rs - w, "%s%" PRId64, i ? ", " : "", rd[i]);
    }
    rs[w < sizeof rs ? w : sizeof rs - 1] = 0;
    lw_check_range(e, n, cnt, kv, kv + 1, TP_INVALID_ARGUMENT,
                   "shape mismatch: value tensor of shape [%s] cannot be broadcast to indexing result of shape [%s]",
                   vs, rs);
    if (kv == 0) return x; /* no values: the check above leaves no true in the mask */
    tp_val pos = mask_positions(e, mask, kv);
    tp_type pt = *em_type(e, pos);
    if (!rank_ok(e, n, pt.rank + 1)) return -1;
    pt.dims[pt.rank++] = 1;
    pos = reshape_to(e, pos, &pt);
    int dims[1] = {p};
    vx = gather_nd(e, n, v, pos, dims, 1, p);
  }
  tp_type bt = xt;
  bt.dt = TP_BOOL;
  int64_t map[TP_MAX_RANK];
  for (int i = 0; i < k; i++) map[i] = p + i;
  tp_val mx = em_bcast_in_dim(e, mask, &bt, map);
  if (accumulate) {
    tp_val xc = em_convert(e, x, cdt);
    return em_convert(e, add(e, xc, em_select(e, mx, vx, em_full(e, 0, &ct))), xt.dt);
  }
  return em_select(e, mx, vx, x);
}

/* index_put(self, indices, values, accumulate) and _index_put_impl_ (same + unsafe) */
static void r_index_put(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = lw_value(e, n, 0);
  tp_type xt = *em_type(e, x);
  int accumulate = lw_bool(n, 3, 0);
  tp_val values = lw_value(e, n, 2);
  iplan p;
  if (!index_plan(e, n, x, 1, &p, 1)) {
    o[0] = -1;
    return;
  }
  if (p.mask) {
    o[0] = index_put_mask(e, n, x, &p, values, accumulate);
    return;
  }
  if (p.m == 0) {
    tp_val v = em_bcast_to(e, em_convert(e, values, xt.dt), xt.rank, xt.dims);
    o[0] = accumulate ? em_convert(e, add(e, em_convert(e, x, lw_opmath(xt.dt)), em_convert(e, v, lw_opmath(xt.dt))), xt.dt)
                      : v;
    return;
  }
  if (!rank_ok(e, n, xt.rank - p.m + p.brank)) return;
  tp_type rt = index_result_type(&xt, &p);
  if (tp_type_numel(&rt) == 0) {
    o[0] = x;
    return;
  }
  const tp_type *vt = em_type(e, values);
  if (vt->rank > rt.rank) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: shape mismatch: value tensor cannot be broadcast to indexing result",
                   n->op);
    return;
  }
  tp_val v = em_bcast_to(e, em_convert(e, values, xt.dt), rt.rank, rt.dims);
  /* operand coordinates of every element of the indexing result */
  tp_val coord[TP_MAX_RANK];
  int check[TP_MAX_RANK] = {0};
  int isidx[TP_MAX_RANK] = {0};
  tp_type ri = rt;
  ri.dt = TP_I64;
  int64_t bmap[TP_MAX_RANK];
  for (int i = 0; i < p.brank; i++) bmap[i] = p.batch_pos + i;
  for (int j = 0; j < p.m; j++) {
    isidx[p.dims[j]] = 1;
    coord[p.dims[j]] = em_bcast_in_dim(e, p.idx[j], &ri, bmap);
    check[p.dims[j]] = 1;
  }
  for (int d = 0, k = 0; d < xt.rank; d++) {
    if (isidx[d]) continue;
    int pos = k < p.batch_pos ? k : k + p.brank;
    coord[d] = em_iota(e, &ri, pos);
    k++;
  }
  tp_val lin = linearize(e, coord, check, xt.rank, xt.dims);
  o[0] = scatter_core(e, x, lin, v, accumulate ? RED_SUM : RED_REPLACE, 1);
}

static void r_put(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = lw_value(e, n, 0);
  tp_type xt = *em_type(e, x);
  int64_t nel = tp_type_numel(&xt);
  tp_val idx = to_i64(e, lw_value(e, n, 1));
  tp_type it = *em_type(e, idx);
  int accumulate = lw_bool(n, 3, 0);
  if (tp_type_numel(&it) == 0 || em_failed(e)) {
    o[0] = x;
    return;
  }
  tp_val src = reshape_to(e, em_convert(e, lw_value(e, n, 2), xt.dt), &it);
  lw_check_arg(e, n, 1, idx, -nel, nel, TP_OUT_OF_RANGE,
               "out of range: tried to access index {} on a tensor of %" PRId64 " elements.", nel);
  idx = wrap_neg(e, idx, nel);
  int check[1] = {1};
  tp_val lin = linearize(e, &idx, check, 1, &nel);
  tp_val xf = flatten(e, x);
  o[0] = reshape_to(e, scatter_core(e, xf, lin, src, accumulate ? RED_SUM : RED_REPLACE, 1), &xt);
}

static void r_masked_scatter(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = lw_operand(e, n, 0, OUT0);
  tp_type bt = lw_out_as(n, 0, TP_BOOL);
  tp_val m = lw_operand(e, n, 1, &bt);
  tp_val src = flatten(e, em_convert(e, lw_value(e, n, 2), OUT0->dt));
  int64_t ns = em_type(e, src)->dims[0];
  /* The CPU's check (CUDA asserts on the device): no more ones than values. */
  tp_val ones = em_reduce(e, to_i64(e, flatten(e, m)), em_const_i(e, 0, TP_I64), (const int64_t[]){0}, 1,
                          "stablehlo.add");
  lw_check_text(e, n, ones, 0, ns + 1, TP_INVALID_ARGUMENT, "masked_scatter: Number of elements of source < number of ones in mask");
  if (ns == 0 || em_failed(e)) { /* then the mask is all false */
    o[0] = x;
    return;
  }
  tp_val pos = mask_positions(e, m, ns);
  tp_val g = em_gather_flat(e, src, pos);
  o[0] = em_select(e, m, g, x);
}

/* ---- segment_reduce ------------------------------------------------------------------------- */

/* data [pre..., N, post...] cut along `axis` into segments given by lengths
 * [pre..., S] or offsets [pre..., S+1]: with P = prod(pre), Q = prod(post),
 * lin (i64 [P, N, Q]) is each element's index in the flat [P, S, Q] result
 * (P*S*Q, out of range, for elements outside every segment), seg (i64 [P, N])
 * its segment, valid ([P, N]) whether it is in one, and len (i64 [P, S]) the
 * segments' lengths. */
typedef struct seg_plan {
  int64_t P, N, S, Q;
  tp_val lin, seg, valid, len;
} seg_plan;

static int seg_plan_make(tp_emit *e, const tp_node *n, tp_val data, int len_i, int off_i, int axis_i, int unsafe,
                         seg_plan *sp) {
  tp_type t = *em_type(e, data);
  int axis = lw_dim(lw_int(n, axis_i, 0), t.rank);
  int by_len = lw_arg(n, len_i)->kind == TP_ARG_TENSOR;
  tp_val b = to_i64(e, lw_value(e, n, by_len ? len_i : off_i));
  const tp_type *bt = em_type(e, b);
  if (em_failed(e)) return 0;
  if (bt->rank != axis + 1) {
    em_fail(e, TP_INVALID_ARGUMENT, "%s: expected axis (%d) to be the last dimension of the %s", n->op, axis,
            by_len ? "lengths" : "offsets");
    return 0;
  }
  sp->P = 1;
  sp->Q = 1;
  for (int d = 0; d < t.rank; d++) {
    if (d < axis) sp->P *= t.dims[d];
    if (d > axis) sp->Q *= t.dims[d];
  }
  sp->N = t.dims[axis];
  int64_t P = sp->P, N = sp->N, S = sp->S = bt->dims[axis] - !by_len;
  int64_t ps1[2] = {P, S + 1}, ps[2] = {P, S}, z2[2] = {0, 0};
  tp_val off;
  if (by_len) {
    b = em_reshape(e, b, 2, ps);
    if (!unsafe) {
      lw_check_text(e, n, b, 0, INT64_MAX, TP_INVALID_ARGUMENT, "lengths contains negative value!");
      tp_val tot = em_reduce(e, b, em_const_i(e, 0, TP_I64), (const int64_t[]){1}, 1, "stablehlo.add");
      lw_check_text(e, n, tot, N, N + 1, TP_INVALID_ARGUMENT,
                    "segment_reduce(): Expected all rows of lengths along axis to sum to data.size(lengths.dim()-1) "
                    "when !unsafe.");
    }
    int64_t lo[2] = {0, 1}, hi[2] = {0, 0};
    off = em_pad(e, prefix_sum_dim(e, b, 1), em_const_i(e, 0, TP_I64), lo, hi, NULL);
    sp->len = b;
  } else {
    off = em_reshape(e, b, 2, ps1);
    int64_t one[2] = {0, 1};
    sp->len = sub(e, em_slice(e, off, one, ps1, NULL), em_slice(e, off, z2, ps, NULL));
  }
  lw_check_text(e, n, sp->len, 0, INT64_MAX, TP_INVALID_ARGUMENT, "Expected segment_length >= 0 to be true, but got false.");
  /* A segment starts at each offset after the first: marks at those
   * positions, summed up to each element, number its segment. */
  int64_t pn[2] = {P, N}, pn1[2] = {P, N + 1}, pnq[3] = {P, N, sp->Q};
  tp_val first = em_slice(e, off, z2, (const int64_t[]){P, 1}, NULL);
  tp_val last = em_slice(e, off, (const int64_t[]){0, S}, ps1, NULL);
  tp_type pnt = tp_type_make(TP_I64, 2, pn);
  tp_val pos = em_iota(e, &pnt, 1);
  int64_t m01[2] = {0, 1};
  tp_val lo_b = em_bcast_in_dim(e, em_reshape(e, first, 1, &P), &pnt, m01);
  tp_val hi_b = em_bcast_in_dim(e, em_reshape(e, last, 1, &P), &pnt, m01);
  sp->valid = em_binary(e, "stablehlo.and", em_compare(e, "GE", pos, lo_b), em_compare(e, "LT", pos, hi_b));
  tp_val seg = em_full(e, 0, &pnt);
  if (S > 1 && N > 0) {
    int64_t inner[2] = {P, S - 1};
    tp_val starts = em_slice(e, off, m01, ps, NULL); /* offsets 1 .. S-1 */
    starts = em_clamp(e, em_const_i(e, 0, TP_I64), starts, em_const_i(e, N, TP_I64));
    tp_type it = tp_type_make(TP_I64, 2, inner);
    tp_val at = add(e, mul(e, em_iota(e, &it, 0), em_full(e, (double)(N + 1), &it)), starts);
    tp_type mt = tp_type_make(TP_I64, 1, (const int64_t[]){P * (N + 1)});
    tp_val marks = em_scatter_flat(e, em_full(e, 0, &mt), flatten(e, at), flatten(e, em_full(e, 1, &it)), "stablehlo.add");
    marks = em_slice(e, em_reshape(e, marks, 2, pn1), z2, pn, NULL);
    seg = prefix_sum_dim(e, marks, 1);
  }
  sp->seg = seg;
  tp_type lt = tp_type_make(TP_I64, 3, pnq);
  int64_t m2[2] = {0, 1};
  tp_val row = add(e, mul(e, em_iota(e, &lt, 0), em_full(e, (double)S, &lt)), em_bcast_in_dim(e, seg, &lt, m2));
  tp_val lin = add(e, mul(e, row, em_full(e, (double)sp->Q, &lt)), em_iota(e, &lt, 2));
  sp->lin = em_select(e, em_bcast_in_dim(e, sp->valid, &(tp_type){.dt = TP_BOOL, .rank = 3, .dims = {P, N, sp->Q}}, m2),
                      lin, em_full(e, (double)(P * S * sp->Q), &lt));
  return !em_failed(e);
}

static red_kind seg_reduce_kind(tp_emit *e, const tp_node *n, int i) {
  const char *s = lw_str(n, i, "");
  red_kind r = !strcmp(s, "max") ? RED_AMAX : !strcmp(s, "min") ? RED_AMIN : RED_BAD;
  if (!strcmp(s, "sum") || !strcmp(s, "mean") || !strcmp(s, "prod")) r = parse_reduce(s);
  if (r == RED_BAD) em_fail(e, TP_INVALID_ARGUMENT, "%s: unsupported reduction %s", n->op, s);
  return r;
}

/* The [P*S*Q] starting values: `initial`, else the reduction's identity
 * (what an empty segment gives; mean's empty segments are NaN, later). */
static tp_val seg_start(tp_emit *e, const tp_node *n, int init_i, red_kind red, tp_dtype cdt, int64_t total) {
  tp_type ft = tp_type_make(cdt, 1, &total);
  if (!lw_is_none(n, init_i)) return em_bcast_in_dim(e, lw_tensor(e, n, init_i, cdt), &ft, NULL);
  return em_full(e, red == RED_PROD ? 1 : red == RED_AMAX ? -INFINITY : red == RED_AMIN ? INFINITY : 0, &ft);
}

/* segment_reduce(data, reduce, lengths|offsets, axis, unsafe, initial), as
 * the CPU kernel: reductions start from `initial` (mean: (initial + sum) /
 * length); empty segments give initial, else 0, 1, -inf, inf, or NaN for a
 * mean; max and min propagate NaN. */
static void r_segment_reduce(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = lw_value(e, n, 0);
  tp_dtype dt = em_type(e, x)->dt;
  if (!tp_dtype_is_float(dt)) {
    o[0] = lw_not_for(e, "_segment_reduce_cpu", dt);
    return;
  }
  red_kind red = seg_reduce_kind(e, n, 1);
  seg_plan sp;
  if (red == RED_BAD || !seg_plan_make(e, n, x, 2, 4, 5, lw_bool(n, 6, 0), &sp)) return;
  tp_dtype cdt = lw_opmath(dt);
  int64_t total = sp.P * sp.S * sp.Q;
  tp_val res = seg_start(e, n, 7, red, cdt, total);
  if (sp.P * sp.N * sp.Q > 0) res = scatter_core(e, res, sp.lin, em_convert(e, x, cdt), red == RED_MEAN ? RED_SUM : red, 1);
  if (red == RED_MEAN) {
    tp_type st = tp_type_make(cdt, 3, (const int64_t[]){sp.P, sp.S, sp.Q});
    int64_t m01[2] = {0, 1};
    tp_val len = em_bcast_in_dim(e, em_convert(e, sp.len, cdt), &st, m01);
    tp_val empty = lw_is_none(n, 7) ? em_full(e, NAN, &st) : em_bcast_in_dim(e, lw_tensor(e, n, 7, cdt), &st, NULL);
    res = reshape_to(e, res, &st);
    res = em_select(e, em_compare(e, "GT", len, lw_full_like(e, len, 0)), em_binary(e, "stablehlo.divide", res, len), empty);
  }
  o[0] = em_convert(e, reshape_to(e, res, OUT0), dt);
}

/* For a bool b [P, N, Q]: how many elements of each one's segment are true. */
static tp_val seg_count(tp_emit *e, const seg_plan *sp, tp_val b, tp_val safe, const tp_type *flat) {
  tp_val c = em_scatter_flat(e, em_full(e, 0, flat), flatten(e, sp->lin), flatten(e, em_convert(e, b, flat->dt)),
                             "stablehlo.add");
  return em_gather_flat(e, c, safe);
}

/* Its backward, as PyTorch's kernels compute it: each element of a segment
 * gets the segment's gradient (mean: divided by the length; max/min and
 * prod: see below). */
static void r_segment_reduce_backward(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = lw_value(e, n, 2);
  tp_type xt = *em_type(e, x);
  tp_dtype dt = xt.dt, cdt = lw_opmath(dt);
  red_kind red = seg_reduce_kind(e, n, 3);
  seg_plan sp;
  if (red == RED_BAD || !seg_plan_make(e, n, x, 4, 5, 6, 1, &sp)) return;
  int64_t pnq[3] = {sp.P, sp.N, sp.Q}, total = sp.P * sp.S * sp.Q, m01[2] = {0, 1};
  if (sp.P * sp.N * sp.Q == 0) {
    o[0] = em_full(e, 0, OUT0);
    return;
  }
  tp_type ct = tp_type_make(cdt, 3, pnq), bt = tp_type_make(TP_BOOL, 3, pnq);
  tp_val xv = em_convert(e, em_reshape(e, x, 3, pnq), cdt);
  tp_val safe = em_select(e, em_compare(e, "LT", sp.lin, ki_like(e, sp.lin, total)), sp.lin, ki_like(e, sp.lin, 0));
  tp_val g = em_gather_flat(e, flatten(e, em_convert(e, lw_value(e, n, 0), cdt)), safe);
  tp_val r = g;
  if (red == RED_MEAN) {
    tp_val len = em_bcast_in_dim(e, em_convert(e, sp.len, cdt), &(tp_type){.dt = cdt, .rank = 3, .dims = {sp.P, sp.S, sp.Q}}, m01);
    r = em_binary(e, "stablehlo.divide", g, em_gather_flat(e, flatten(e, len), safe));
  } else if (red != RED_SUM) {
    tp_val out = em_gather_flat(e, flatten(e, em_convert(e, lw_value(e, n, 1), cdt)), safe);
    tp_type ft = tp_type_make(cdt, 1, &total);
    tp_val zero = em_full(e, 0, &ct), one = em_full(e, 1, &ct);
    tp_val isnan = em_compare(e, "NE", xv, xv);
    if (red == RED_PROD) {
      /* A zero or NaN element gets the product of the others (initial
       * included); the rest result / element. */
      tp_val z = em_compare(e, "EQ", xv, zero), special = em_binary(e, "stablehlo.or", z, isnan);
      tp_val nzprod = scatter_core(e, seg_start(e, n, 7, red, cdt, total), sp.lin, em_select(e, special, one, xv),
                                   RED_PROD, 1);
      tp_val zc = seg_count(e, &sp, z, safe, &ft), nc = seg_count(e, &sp, isnan, safe, &ft);
      zc = sub(e, zc, em_convert(e, z, cdt));
      nc = sub(e, nc, em_convert(e, isnan, cdt));
      tp_val excl = em_select(e, em_compare(e, "GT", nc, zero), em_full(e, NAN, &ct),
                              em_select(e, em_compare(e, "GT", zc, zero), zero, em_gather_flat(e, nzprod, safe)));
      r = em_select(e, special, mul(e, g, excl), em_binary(e, "stablehlo.divide", mul(e, g, out), xv));
    } else {
      /* PyTorch's kernels (CPU and CUDA): the elements equal to the result
       * (or NaN) get its gradient, divided among them only where it is
       * positive. */
      tp_val eq = em_binary(e, "stablehlo.or", em_compare(e, "EQ", xv, out), isnan);
      tp_val ties = seg_count(e, &sp, eq, safe, &ft);
      tp_val split = em_binary(e, "stablehlo.and", em_compare(e, "GE", ties, em_full(e, 2, &ct)),
                               em_compare(e, "GT", g, zero));
      r = em_select(e, eq, em_select(e, split, em_binary(e, "stablehlo.divide", g, ties), g), zero);
    }
  }
  r = em_select(e, em_bcast_in_dim(e, sp.valid, &bt, m01), r, em_full(e, 0, &ct));
  o[0] = em_convert(e, reshape_to(e, r, &xt), dt);
}

/* ---- *_scatter (functionalization and view backward) ------------------------------------------ */

static void r_diag_embed(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = lw_value(e, n, 0);
  tp_type t = *em_type(e, x);
  int64_t off = lw_int(n, 1, 0);
  int rr = OUT0->rank;
  int d1 = lw_dim(lw_int(n, 2, -2), rr), d2 = lw_dim(lw_int(n, 3, -1), rr);
  if (t.rank < 1 || d1 == d2) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: diagonal dimensions cannot be identical", n->op);
    return;
  }
  int64_t a = off < 0 ? -off : off;
  int64_t lo[TP_MAX_RANK] = {0}, hi[TP_MAX_RANK] = {0};
  hi[t.rank - 1] = a;
  x = em_pad(e, x, em_const(e, 0, t.dt), lo, hi, NULL);
  int64_t map[TP_MAX_RANK];
  for (int i = 0, k = 0; i < rr; i++)
    if (i != d1 && i != d2) map[k++] = i;
  map[t.rank - 1] = off >= 0 ? d1 : d2;
  tp_type ot = *OUT0;
  tp_val v = bcast_map(e, x, &ot, map);
  int64_t md[2] = {OUT0->dims[d1], OUT0->dims[d2]};
  tp_val dif = sub(e, iota_i64(e, 2, md, 1), iota_i64(e, 2, md, 0));
  tp_val mk = em_compare(e, "EQ", dif, ki_like(e, dif, off));
  tp_type bt = lw_out_as(n, 0, TP_BOOL);
  int64_t mm[2] = {d1, d2};
  mk = bcast_map(e, mk, &bt, mm);
  o[0] = em_select(e, mk, v, em_full(e, 0, &ot));
}

static void r_diagonal_scatter(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = lw_value(e, n, 0);
  tp_type t = *em_type(e, x);
  tp_val src = em_convert(e, lw_value(e, n, 1), t.dt);
  tp_type st = *em_type(e, src);
  int64_t off = lw_int(n, 2, 0);
  int d1 = lw_dim(lw_int(n, 3, 0), t.rank), d2 = lw_dim(lw_int(n, 4, 1), t.rank);
  if (t.rank < 2 || d1 == d2 || st.rank != t.rank - 1) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: bad diagonal dimensions or src shape", n->op);
    return;
  }
  int tdim = off >= 0 ? d1 : d2;
  int64_t tsz = t.dims[tdim], len = st.dims[st.rank - 1];
  if (len > tsz) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: src has the wrong diagonal length", n->op);
    return;
  }
  if (len == 0) {
    o[0] = x;
    return;
  }
  int64_t lo[TP_MAX_RANK] = {0}, hi[TP_MAX_RANK] = {0};
  hi[st.rank - 1] = tsz - len;
  src = em_pad(e, src, em_const(e, 0, t.dt), lo, hi, NULL);
  int64_t map[TP_MAX_RANK];
  for (int i = 0, k = 0; i < t.rank; i++)
    if (i != d1 && i != d2) map[k++] = i;
  map[st.rank - 1] = tdim;
  tp_val v = bcast_map(e, src, &t, map);
  int64_t md[2] = {t.dims[d1], t.dims[d2]};
  tp_val dif = sub(e, iota_i64(e, 2, md, 1), iota_i64(e, 2, md, 0));
  tp_val mk = em_compare(e, "EQ", dif, ki_like(e, dif, off));
  tp_type bt = t;
  bt.dt = TP_BOOL;
  int64_t mm[2] = {d1, d2};
  mk = bcast_map(e, mk, &bt, mm);
  o[0] = em_select(e, mk, v, x);
}

static void r_slice_scatter(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = lw_value(e, n, 0);
  tp_type t = *em_type(e, x);
  tp_val src = em_convert(e, lw_value(e, n, 1), t.dt);
  int dim = lw_dim(lw_int(n, 2, 0), t.rank);
  if (t.rank == 0) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: slice() cannot be applied to a 0-dim tensor", n->op);
    return;
  }
  int64_t size = t.dims[dim];
  int64_t start = lw_is_none(n, 3) ? 0 : lw_int(n, 3, 0);
  int64_t end = lw_is_none(n, 4) ? size : lw_int(n, 4, size);
  int64_t step = lw_int(n, 5, 1);
  if (step <= 0) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: slice step must be positive", n->op);
    return;
  }
  if (start < 0) start += size;
  if (end < 0) end += size;
  if (start < 0) start = 0;
  if (start > size) start = size;
  if (end < start) end = start;
  if (end > size) end = size;
  int64_t cnt = (end - start + step - 1) / step;
  if (cnt == 0 || tp_type_numel(em_type(e, src)) == 0) {
    o[0] = x;
    return;
  }
  if (em_type(e, src)->dims[dim] != cnt) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: src has the wrong size along dimension %d", n->op, dim);
    return;
  }
  int64_t lo[TP_MAX_RANK] = {0}, hi[TP_MAX_RANK] = {0}, in[TP_MAX_RANK] = {0};
  if (step == 1) {
    lo[dim] = start;
    o[0] = em_update_slice(e, x, src, lo);
    return;
  }
  lo[dim] = start;
  hi[dim] = size - (start + (cnt - 1) * step + 1);
  in[dim] = step - 1;
  tp_val sp = em_pad(e, src, em_const(e, 0, t.dt), lo, hi, in);
  tp_type bt = *em_type(e, src);
  bt.dt = TP_BOOL;
  tp_val mk = em_pad(e, em_full(e, 1, &bt), em_const(e, 0, TP_BOOL), lo, hi, in);
  o[0] = em_select(e, mk, sp, x);
}

static void r_select_scatter(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = lw_value(e, n, 0);
  tp_type t = *em_type(e, x);
  if (t.rank == 0) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: select() cannot be applied to a 0-dim tensor", n->op);
    return;
  }
  int dim = lw_dim(lw_int(n, 2, 0), t.rank);
  int64_t idx = lw_int(n, 3, 0), size = t.dims[dim];
  if (idx < -size || idx >= size) {
    o[0] = em_fail(e, TP_OUT_OF_RANGE, "%s: index %" PRId64 " out of range for tensor of size %" PRId64
                   " at dimension %d", n->op, idx, size, dim);
    return;
  }
  if (idx < 0) idx += size;
  tp_type ut = t;
  ut.dims[dim] = 1;
  tp_val src = reshape_to(e, em_convert(e, lw_value(e, n, 1), t.dt), &ut);
  int64_t st[TP_MAX_RANK] = {0};
  st[dim] = idx;
  o[0] = em_update_slice(e, x, src, st);
}

/* as_strided_scatter: positions refer to self's elements in row-major
 * (contiguous) order, as for a contiguous self (compiled mode hands it other
 * layouts flattened in memory order: torch_pjrt/_compile.py). */
static void r_as_strided_scatter(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = lw_value(e, n, 0);
  tp_type t = *em_type(e, x);
  const int64_t *size, *stride;
  int ns = lw_ints(n, 2, &size), nst = lw_ints(n, 3, &stride);
  int64_t off = lw_is_none(n, 4) ? 0 : lw_int(n, 4, 0);
  if (ns != nst) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: mismatch in length of strides and shape", n->op);
    return;
  }
  tp_val src = em_convert(e, lw_value(e, n, 1), t.dt);
  int64_t cnt = tp_type_numel(em_type(e, src)), nel = tp_type_numel(&t);
  if (cnt == 0) {
    o[0] = x;
    return;
  }
  int64_t maxpos = off;
  for (int i = 0; i < ns; i++) maxpos += (size[i] - 1) * stride[i];
  if (off < 0 || maxpos >= nel) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: the view is out of bounds of self's %" PRId64 " elements", n->op, nel);
    return;
  }
  tp_val lin;
  if (ns == 0) {
    int64_t one = 1;
    tp_type lt = tp_type_make(TP_I64, 1, &one);
    lin = em_full(e, (double)off, &lt);
    src = em_reshape(e, src, 1, &one);
  } else {
    lin = -1;
    for (int d = 0; d < ns; d++) {
      tp_val term = iota_i64(e, ns, size, d);
      if (stride[d] != 1) term = mul(e, term, ki_like(e, term, stride[d]));
      lin = lin < 0 ? term : add(e, lin, term);
    }
    if (off) lin = add(e, lin, ki_like(e, lin, off));
    src = em_reshape(e, src, ns, size);
  }
  o[0] = reshape_to(e, em_scatter_flat(e, flatten(e, x), lin, src, NULL), &t);
}

/* ---- embedding bags --------------------------------------------------------------------------- */

/* _embedding_bag and _embedding_bag_forward_only give the four outputs of
 * PyTorch's CPU kernels (aten/src/ATen/native/EmbeddingBag.cpp) with static
 * shapes: the number of bags is offsets' length, and which bag each index
 * belongs to is computed in the program.  The output shapes come from
 * _dispatch.py (_meta_embedding_bag), which follows the CPU kernel's "fast
 * path" (mode sum, a float32/float16/bfloat16 weight with unit-stride rows,
 * no padding_idx, unit-stride per_sample_weights): offset2bag is empty there.
 *
 * What the CPU kernels compute, and so the rules:
 * - offset2bag[i] = #{k : offsets[k] <= i} - 1 over the offsets that start a
 *   bag (all but the last with include_last_offset): index_add of ones,
 *   minus one, cumsum.  With include_last_offset, indices after
 *   offsets[-1] therefore belong to the last bag -- except on the fast path
 *   of sum and mean (no padding_idx, float32/float16/bfloat16), which reads
 *   bag b as indices[offsets[b]:offsets[b+1]] and leaves them out.
 * - sum: accumulated in float32 for float16/bfloat16 (float64 for float64),
 *   rounded once (on the fast path, bfloat16 with ties away from zero, as
 *   fbgemm rounds); mean: that rounded sum divided by max(bag_size, 1) in the
 *   weight's dtype.  Entries equal to padding_idx take no part.
 * - max: per column the first maximum of the bag (an element replaces the
 *   running maximum only when strictly greater, so a NaN wins only in first
 *   place); empty bags give 0 and max index 0.
 * - bag_size[b] = offsets[b+1] - offsets[b] (the last: numel - offsets[B-1])
 *   minus the bag's padding entries; all zeros for sum (the kernel zeroes
 *   it).  max_indices: the maximum's row (max), bag_size (mean), zeros (sum).
 *
 * Rules do not see strides: a weight with strided rows (stride(1) != 1) takes
 * the CPU's slow path, which differs from the fast path only for mean with
 * include_last_offset and indices after offsets[-1]; the rule assumes the
 * fast path there (for sum, offset2bag's shape says which path the CPU took).
 * Indices are not checked: out of range ones are clamped. */

enum { BAG_SUM = 0, BAG_MEAN = 1, BAG_MAX = 2 };

/* 1-D slice [a, b) of a 1-D value. */
static tp_val slice1(tp_emit *e, tp_val x, int64_t a, int64_t b) { return em_slice(e, x, &a, &b, NULL); }

static tp_val bool_to_i64(tp_emit *e, tp_val b) { return to_i64(e, em_convert(e, b, TP_U8)); }

/* Whether each entry's bag o2b (L, i64) is one of the B bags: entries
 * after offsets[-1] with include_last_offset are not (the CPU kernels leave
 * them out of sum's gradient; per_sample_weights' gradient reads past the
 * end of grad there, and gets 0 here). */
static tp_val bag_member(tp_emit *e, tp_val o2b, int64_t B) {
  return em_binary(e, "stablehlo.and", em_compare(e, "GE", o2b, ki_like(e, o2b, 0)),
                   em_compare(e, "LT", o2b, ki_like(e, o2b, B)));
}

/* offset2bag (L, i64) from the first k offsets (i64), as make_offset2bag. */
static tp_val bag_offset2bag(tp_emit *e, tp_val off, int64_t k, int64_t L) {
  int64_t L1 = L + 1;
  tp_type ct = tp_type_make(TP_I64, 1, &L1);
  tp_val cnt = em_full(e, 0, &ct);
  if (k > 0) {
    tp_type kt = tp_type_make(TP_I64, 1, &k);
    cnt = em_scatter_flat(e, cnt, slice1(e, off, 0, k), em_full(e, 1, &kt), "stablehlo.add");
  }
  tp_val cs = slice1(e, prefix_sum(e, cnt), 0, L);
  return sub(e, cs, ki_like(e, cs, 1));
}

/* float32 x rounded to bfloat16 values with ties away from zero (type
 * kept): fbgemm's float -> bfloat16 conversion, which the CPU fast path's
 * bfloat16 results go through ((bits + 0x8000) >> 16). */
static tp_val round_bf16_ties_away(tp_emit *e, tp_val x) {
  tp_type t = *em_type(e, x), ut = t;
  ut.dt = TP_U32;
  tp_val b = add(e, em_bitcast(e, x, &ut), em_full(e, 32768, &ut));
  b = em_binary(e, "stablehlo.and", b, em_bcast_in_dim(e, em_const_i(e, 0xFFFF0000LL, TP_U32), &ut, NULL));
  return em_bitcast(e, b, &t);
}

/* Rows idx (L, i64) of the 2-D x: (L, D), indices clamped into range. */
static tp_val bag_rows(tp_emit *e, const tp_node *n, tp_val x, tp_val idx) {
  int64_t l2[2] = {em_type(e, idx)->dims[0], 1};
  int dims[1] = {0};
  return gather_nd(e, n, x, em_reshape(e, idx, 2, l2), dims, 1, 0);
}

/* Linear element indices (L, D) of (row[j], d) in an (R, D) matrix; a row
 * outside [0, R) gives an out-of-range index, which a scatter drops. */
static tp_val bag_lin(tp_emit *e, tp_val row, int64_t R, int64_t D) {
  if (em_failed(e)) return -1;
  int64_t L = em_type(e, row)->dims[0], ld[2] = {L, D}, m0 = 0, dims[2] = {R, D};
  tp_type lt = tp_type_make(TP_I64, 2, ld);
  tp_val coord[2] = {em_bcast_in_dim(e, row, &lt, &m0), em_iota(e, &lt, 1)};
  int check[2] = {1, 0};
  return linearize(e, coord, check, 2, dims);
}

/* bag_size (B, i64) of mean and max: offsets[b+1] - offsets[b], the last
 * L - offsets[B-1], minus the padding entries of each bag. */
static tp_val bag_sizes(tp_emit *e, tp_val off, int64_t B, int64_t L, tp_val idx, tp_val bag, int64_t pad) {
  int64_t one = 1;
  tp_type t1 = tp_type_make(TP_I64, 1, &one), bt = tp_type_make(TP_I64, 1, &B);
  tp_val end = em_full(e, (double)L, &t1);
  if (B > 1) {
    tp_val parts[2] = {slice1(e, off, 1, B), end};
    end = em_concat(e, parts, 2, 0);
  }
  tp_val bs = sub(e, end, slice1(e, off, 0, B));
  if (pad >= 0 && L > 0) {
    tp_val ispad = bool_to_i64(e, em_compare(e, "EQ", idx, ki_like(e, idx, pad)));
    bs = sub(e, bs, em_scatter_flat(e, em_full(e, 0, &bt), bag, ispad, "stablehlo.add"));
  }
  return bs;
}

/* The first maximum of each column of each bag: values (B, D) in vals'
 * dtype and the rows (indices) they came from (B, D, i64).  vals (L, D): the
 * gathered rows; bag (L): each entry's bag, outside [0, B) for none. */
static void bag_max(tp_emit *e, tp_val vals, tp_val bag, tp_val idx, int64_t B, tp_val *val, tp_val *row) {
  tp_type vt = *em_type(e, vals);
  int64_t L = vt.dims[0], D = vt.dims[1], BD = B * D, LD = L * D, bd[2] = {B, D}, m0 = 0;
  tp_type lit = tp_type_make(TP_I64, 2, vt.dims), l1 = tp_type_make(TP_I64, 1, &L);
  tp_type bdf = tp_type_make(vt.dt, 1, &BD), bdi = tp_type_make(TP_I64, 1, &BD);
  tp_type b2 = tp_type_make(TP_I64, 2, bd), v2 = tp_type_make(vt.dt, 2, bd), bt = tp_type_make(TP_I64, 1, &B);
  tp_val lin = bag_lin(e, bag, B, D);
  tp_val member = em_compare(e, "LT", lin, em_full(e, (double)BD, &lit));
  /* the bag's largest non-NaN value (XLA's scatter max would drop NaNs) */
  tp_val clean = em_select(e, em_compare(e, "NE", vals, vals), em_full(e, -INFINITY, &vt), vals);
  tp_val m = em_scatter_flat(e, em_full(e, -INFINITY, &bdf), lin, clean, "stablehlo.maximum");
  /* its first position (equal values: -0 and 0 too), and each bag's first entry */
  tp_val at = em_binary(e, "stablehlo.and", member, em_compare(e, "EQ", vals, em_gather_flat(e, m, lin)));
  tp_val cand = em_select(e, at, em_iota(e, &lit, 0), em_full(e, (double)L, &lit));
  tp_val jmax = em_scatter_flat(e, em_full(e, (double)L, &bdi), lin, cand, "stablehlo.minimum");
  tp_val inbag = bag_member(e, bag, B);
  tp_val first = em_scatter_flat(e, em_full(e, (double)L, &bt), em_select(e, inbag, bag, ki_like(e, bag, B)),
                                 em_iota(e, &l1, 0), "stablehlo.minimum");
  tp_val fb = em_bcast_in_dim(e, first, &b2, &m0), col = em_iota(e, &b2, 1), dd = em_full(e, (double)D, &b2);
  tp_val vflat = em_reshape(e, vals, 1, &LD);
  tp_val fv = em_gather_flat(e, vflat, add(e, mul(e, fb, dd), col));
  /* a NaN in first place stays the maximum */
  tp_val j = em_select(e, em_compare(e, "NE", fv, fv), fb, em_reshape(e, jmax, 2, bd));
  tp_val empty = em_compare(e, "EQ", fb, em_full(e, (double)L, &b2));
  *val = em_select(e, empty, em_full(e, 0, &v2), em_gather_flat(e, vflat, add(e, mul(e, j, dd), col)));
  *row = em_select(e, empty, em_full(e, 0, &b2), em_gather_flat(e, idx, j));
}

/* bag_size (B, i64; -1: all zeros) as an output of type t.  The CPU gives
 * bag_size and mean's max_indices one entry per bag; in compiled graphs
 * PyTorch's meta function gives CUDA's shapes instead (bag_size one entry
 * per offset, so one more with include_last_offset, the extra entry 0;
 * max_indices empty), and the graph's types are the ones to produce. */
static tp_val bag_size_as(tp_emit *e, tp_val bs, const tp_type *t) {
  if (bs < 0 || tp_type_numel(t) == 0 || em_failed(e)) return em_full(e, 0, t);
  int64_t B = em_type(e, bs)->dims[0], lo = 0, hi = t->dims[0] - B, in = 0;
  if (hi < 0) bs = slice1(e, bs, 0, t->dims[0]);
  else if (hi > 0) bs = em_pad(e, bs, em_const_i(e, 0, TP_I64), &lo, &hi, &in);
  return em_convert(e, bs, t->dt);
}

/* _embedding_bag / _embedding_bag_forward_only(weight, indices, offsets,
 * scale_grad_by_freq, mode, sparse, per_sample_weights?, include_last_offset,
 * padding_idx) -> (output, offset2bag, bag_size, max_indices) */
static void r_embedding_bag(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val w = lw_value(e, n, 0), idx = lw_value(e, n, 1), off = lw_value(e, n, 2);
  if (em_failed(e)) return;
  tp_type wt = *em_type(e, w);
  int64_t mode = lw_int(n, 4, BAG_SUM), pad = lw_int(n, 8, -1);
  int ilo = lw_bool(n, 7, 0), has_psw = lw_arg(n, 6)->kind == TP_ARG_TENSOR;
  if (n->nouts != 4 || wt.rank != 2 || !tp_dtype_is_float(wt.dt) || em_type(e, idx)->rank != 1 ||
      em_type(e, off)->rank != 1 || mode < BAG_SUM || mode > BAG_MAX || (has_psw && mode != BAG_SUM)) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT,
                   "%s: expected a 2-D floating-point weight, 1-D indices and offsets, mode 0, 1 or 2, and "
                   "per_sample_weights only with mode 0",
                   n->op);
    return;
  }
  tp_dtype dt = wt.dt, ct = lw_opmath(dt);
  const tp_type *ot = &n->outs[0];
  int64_t D = wt.dims[1], L = em_type(e, idx)->dims[0], O = em_type(e, off)->dims[0], B = ot->dims[0];
  if (B != O - ilo) {
    o[0] = em_fail(e, TP_INTERNAL, "%s: unexpected output shape", n->op);
    return;
  }
  idx = to_i64(e, idx);
  off = to_i64(e, off);
  lw_check_arg(e, n, 1, idx, 0, wt.dims[0], TP_INVALID_ARGUMENT,
               "An index of input takes value {} which is not in the valid range [0, %" PRId64 ")", wt.dims[0]);
  if (O > 0)
    lw_check_range(e, n, slice1(e, off, 0, 1), 0, 1, TP_INVALID_ARGUMENT,
                   "offsets[0] has to be 0, i.e., the first sequence in the mini-batch has to start from position 0. "
                   "However, got {}");
  /* In eager mode offset2bag's shape says whether the CPU took sum's fast
   * path.  Compiled graphs carry CUDA's shapes (PyTorch's meta function:
   * max_indices empty but for max) and no strides; they assume the fast
   * path, which every weight with unit-stride rows takes. */
  int cuda_shapes = mode != BAG_MAX && tp_type_numel(&n->outs[3]) == 0 && B > 0;
  int fast = mode != BAG_MAX && pad < 0 && (dt == TP_F32 || dt == TP_F16 || dt == TP_BF16) &&
             (mode == BAG_MEAN || tp_type_numel(&n->outs[1]) == 0 || cuda_shapes);
  /* each index's bag (-1 before offsets[0]; B when it takes no part) */
  tp_val bag = -1, row_of = -1;
  if (L > 0) {
    bag = bag_offset2bag(e, off, ilo ? O - 1 : O, L);
    tp_type lb = tp_type_make(TP_BOOL, 1, &L);
    tp_val keep = em_full(e, 1, &lb);
    if (pad >= 0) keep = em_compare(e, "NE", idx, ki_like(e, idx, pad));
    if (fast && ilo) { /* the fast path stops at offsets[-1] */
      tp_type li = tp_type_make(TP_I64, 1, &L);
      tp_val last = em_bcast_in_dim(e, em_reshape(e, slice1(e, off, O - 1, O), 0, NULL), &li, NULL);
      keep = em_binary(e, "stablehlo.and", keep, em_compare(e, "LT", em_iota(e, &li, 0), last));
    }
    row_of = em_select(e, keep, bag, ki_like(e, bag, B));
  }
  tp_val bs = B > 0 && mode != BAG_SUM ? bag_sizes(e, off, B, L, idx, bag, pad) : -1;
  tp_val out, maxrow = -1;
  if (B * D == 0 || L == 0) {
    out = em_full(e, 0, ot);
  } else if (mode == BAG_MAX) {
    tp_val vals = em_convert(e, bag_rows(e, n, w, idx), ct);
    bag_max(e, vals, row_of, idx, B, &out, &maxrow);
    out = em_convert(e, out, dt);
  } else {
    tp_val rows = em_convert(e, bag_rows(e, n, w, idx), ct); /* (L, D) */
    if (has_psw) {
      int64_t m0 = 0;
      tp_val psw = lw_tensor(e, n, 6, ct);
      rows = mul(e, rows, em_bcast_in_dim(e, psw, em_type(e, rows), &m0));
    }
    tp_type st = lw_out_as(n, 0, ct);
    tp_val sum = scatter_core(e, em_full(e, 0, &st), bag_lin(e, row_of, B, D), rows, RED_SUM, 1);
    sum = fast && dt == TP_BF16 ? round_bf16_ties_away(e, sum) : em_round_to(e, sum, dt);
    if (mode == BAG_MEAN) {
      /* output /= max(bag_size, 1) converted to the weight's dtype */
      tp_val cnt = em_convert(e, em_binary(e, "stablehlo.maximum", bs, ki_like(e, bs, 1)), ct);
      int64_t m0 = 0;
      sum = em_binary(e, "stablehlo.divide", sum, em_bcast_in_dim(e, em_round_to(e, cnt, dt), &st, &m0));
    }
    out = em_convert(e, sum, dt);
  }
  o[0] = out;
  /* the CPU's fast path of sum leaves offset2bag empty; where the graph
   * wants one (CUDA's shapes), entries after offsets[-1] are marked B, so
   * that the backward, like the CPU's, gives them no gradient */
  tp_val o2b = fast && mode == BAG_SUM ? row_of : bag;
  o[1] = tp_type_numel(&n->outs[1]) == 0 ? em_full(e, 0, &n->outs[1]) : em_convert(e, o2b, n->outs[1].dt);
  o[2] = bag_size_as(e, bs, &n->outs[2]);
  if (mode == BAG_MAX)
    o[3] = maxrow < 0 ? em_full(e, 0, &n->outs[3]) : em_convert(e, maxrow, n->outs[3].dt);
  else
    o[3] = bag_size_as(e, bs, &n->outs[3]);
}

/* The divisor scale_grad_by_freq applies to entry j in PyTorch's CPU
 * _embedding_bag_dense_backward: counts[sorted[r]], r the rank of
 * indices[j] among the distinct indices, sorted the sorted indices and
 * counts the occurrences of each index (padding included).  The kernel
 * reads counts[indices_sorted[i]] with i the distinct value's rank rather
 * than its position (for indices [1, 1, 2] index 2's gradient is halved);
 * the rule gives the same values.  (L, i64) */
static tp_val bag_freq_divisor(tp_emit *e, tp_val idx, int64_t NW) {
  int64_t L = em_type(e, idx)->dims[0], L1 = L + 1;
  tp_type nt = tp_type_make(TP_I64, 1, &NW), lt = tp_type_make(TP_I64, 1, &L), l1 = tp_type_make(TP_I64, 1, &L1);
  tp_val counts = em_scatter_flat(e, em_full(e, 0, &nt), idx, em_full(e, 1, &lt), "stablehlo.add");
  tp_val present = bool_to_i64(e, em_compare(e, "GT", counts, em_full(e, 0, &nt)));
  tp_val rank = sub(e, prefix_sum(e, present), present); /* distinct indices below each */
  tp_val cum = prefix_sum(e, counts);                     /* entries <= each index */
  /* sorted[k] = #{u : cum[u] <= k} */
  tp_val hist = em_scatter_flat(e, em_full(e, 0, &l1), cum, em_full(e, 1, &nt), "stablehlo.add");
  tp_val sorted = slice1(e, prefix_sum(e, hist), 0, L);
  return em_gather_flat(e, counts, em_gather_flat(e, sorted, em_gather_flat(e, rank, idx)));
}

/* The weight's gradient (num_weights, D) of an embedding bag, from the
 * arguments at positions at[]: grad, indices, offsets (-1: none),
 * offset2bag, bag_size, maximum_indices, scale_grad_by_freq, mode,
 * per_sample_weights, padding_idx.  As PyTorch's CPU
 * _embedding_bag_dense_backward:
 * max: grad[b, d] goes to row maximum_indices[b, d] for bags with bag_size != 0.
 * sum/mean: grad[offset2bag[j]] * scale_j goes to row indices[j] (padding
 * entries skipped), scale_j computed in double as the kernel does --
 * per_sample_weights[j], / the frequency divisor, / bag_size (mean, when not
 * 0) -- then cast to the gradient's dtype.  Sums in float32 for
 * float16/bfloat16, rounded once (the CPU kernel rounds every addition).
 * An empty offset2bag (the forward's fast path) is recomputed from all the
 * offsets, as _embedding_bag_backward does. */
enum { BW_GRAD, BW_IDX, BW_OFF, BW_O2B, BW_BS, BW_MAXI, BW_SGBF, BW_MODE, BW_PSW, BW_PAD };

static void bag_dense_backward(tp_emit *e, const tp_node *n, tp_val *o, const int *at) {
  const tp_type *ot = OUT0;
  tp_dtype dt = ot->dt, ct = lw_opmath(dt);
  int64_t mode = lw_int(n, at[BW_MODE], BAG_SUM), pad = lw_int(n, at[BW_PAD], -1);
  int sgbf = lw_bool(n, at[BW_SGBF], 0), has_psw = lw_arg(n, at[BW_PSW])->kind == TP_ARG_TENSOR;
  tp_val g = lw_tensor(e, n, at[BW_GRAD], ct), bs = lw_value(e, n, at[BW_BS]);
  if (em_failed(e)) return;
  tp_type gt = *em_type(e, g);
  if (ot->rank != 2 || gt.rank != 2 || gt.dims[1] != ot->dims[1] || em_type(e, bs)->rank != 1 ||
      em_type(e, bs)->dims[0] < gt.dims[0] || mode < BAG_SUM || mode > BAG_MAX) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: unexpected argument shapes", n->op);
    return;
  }
  int64_t NW = ot->dims[0], D = ot->dims[1], B = gt.dims[0];
  tp_val zero = em_full(e, 0, ot);
  bs = slice1(e, to_i64(e, bs), 0, B); /* CUDA's shape in compiled graphs: one more with include_last_offset */
  if (NW * D == 0 || B == 0) {
    o[0] = zero;
    return;
  }
  if (mode == BAG_MAX) {
    tp_val mi = lw_value(e, n, at[BW_MAXI]);
    if (em_failed(e)) return;
    if (em_type(e, mi)->rank != 2 || em_type(e, mi)->dims[0] != B || em_type(e, mi)->dims[1] != D) {
      o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: maximum_indices must have the gradient's shape", n->op);
      return;
    }
    int64_t bd[2] = {B, D}, m0 = 0, dims[2] = {NW, D};
    tp_type b2 = tp_type_make(TP_I64, 2, bd), bb = tp_type_make(TP_BOOL, 2, bd);
    tp_val nonempty = em_bcast_in_dim(e, em_compare(e, "NE", bs, ki_like(e, bs, 0)), &bb, &m0);
    tp_val coord[2] = {em_select(e, nonempty, to_i64(e, mi), em_full(e, (double)NW, &b2)), em_iota(e, &b2, 1)};
    int check[2] = {1, 0};
    o[0] = scatter_core(e, zero, linearize(e, coord, check, 2, dims), g, RED_SUM, 1);
    return;
  }
  tp_val idx = flatten(e, to_i64(e, lw_value(e, n, at[BW_IDX]))), o2b = lw_value(e, n, at[BW_O2B]);
  if (em_failed(e)) return;
  int64_t L = em_type(e, idx)->dims[0];
  if (L == 0) {
    o[0] = zero;
    return;
  }
  if (tp_type_numel(em_type(e, o2b)) == 0 && at[BW_OFF] >= 0) {
    tp_val off = flatten(e, to_i64(e, lw_value(e, n, at[BW_OFF])));
    o2b = bag_offset2bag(e, off, em_type(e, off)->dims[0], L);
  } else {
    o2b = flatten(e, to_i64(e, o2b));
  }
  if (em_failed(e)) return;
  if (em_type(e, o2b)->dims[0] != L) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: offset2bag must have one entry per index", n->op);
    return;
  }
  tp_type l64 = tp_type_make(TP_F64, 1, &L);
  tp_val scale = has_psw ? em_convert(e, flatten(e, lw_value(e, n, at[BW_PSW])), TP_F64) : em_full(e, 1, &l64);
  if (sgbf) scale = em_binary(e, "stablehlo.divide", scale, em_convert(e, bag_freq_divisor(e, idx, NW), TP_F64));
  if (mode == BAG_MEAN) {
    tp_val b = em_gather_flat(e, bs, em_clamp(e, em_const_i(e, 0, TP_I64), o2b, em_const_i(e, B - 1, TP_I64)));
    scale = em_select(e, em_compare(e, "NE", b, ki_like(e, b, 0)),
                      em_binary(e, "stablehlo.divide", scale, em_convert(e, b, TP_F64)), scale);
  }
  scale = em_convert(e, em_round_to(e, scale, dt), ct); /* (scalar_t)scale */
  int64_t m0 = 0;
  tp_val rows = bag_rows(e, n, g, o2b);
  rows = mul(e, rows, em_bcast_in_dim(e, scale, em_type(e, rows), &m0));
  tp_val part = em_binary(e, "stablehlo.and", em_compare(e, "NE", idx, ki_like(e, idx, pad)), bag_member(e, o2b, B));
  tp_val row = em_select(e, part, idx, ki_like(e, idx, NW));
  o[0] = scatter_core(e, zero, bag_lin(e, row, NW, D), rows, RED_SUM, 1);
}

/* _embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, maximum_indices,
 * num_weights, scale_grad_by_freq, mode, per_sample_weights?, padding_idx) */
static void r_embedding_bag_dense_backward(tp_emit *e, const tp_node *n, tp_val *o) {
  static const int at[] = {0, 1, -1, 2, 3, 4, 6, 7, 8, 9};
  bag_dense_backward(e, n, o, at);
}

/* _embedding_bag_backward(grad, indices, offsets, offset2bag, bag_size, maximum_indices,
 * num_weights, scale_grad_by_freq, mode, sparse, per_sample_weights?, padding_idx):
 * what autograd calls; the dense gradient (sparse ones are not supported). */
static void r_embedding_bag_backward(tp_emit *e, const tp_node *n, tp_val *o) {
  static const int at[] = {0, 1, 2, 3, 4, 5, 7, 8, 10, 11};
  if (lw_bool(n, 9, 0)) {
    o[0] = em_fail(e, TP_UNIMPLEMENTED,
                   "embedding_bag with sparse=True: sparse gradients are not supported on the tpu device "
                   "(torch-pjrt); use sparse=False (a dense gradient)");
    return;
  }
  bag_dense_backward(e, n, o, at);
}

/* _embedding_bag_per_sample_weights_backward(grad, weight, indices, offsets,
 * offset2bag, mode, padding_idx) -> (L): the dot product of grad[offset2bag[j]]
 * and weight[indices[j]] (0 for padding entries), in float32 for
 * float16/bfloat16.  An empty offset2bag (the forward's fast path) is
 * recomputed from all the offsets, as the kernel does. */
static void r_embedding_bag_psw_backward(tp_emit *e, const tp_node *n, tp_val *o) {
  const tp_type *ot = OUT0;
  tp_dtype dt = ot->dt, ct = lw_opmath(dt);
  tp_val g = lw_tensor(e, n, 0, ct), w = lw_tensor(e, n, 1, ct);
  tp_val idx = lw_value(e, n, 2), off = lw_value(e, n, 3), o2b = lw_value(e, n, 4);
  int64_t pad = lw_int(n, 6, -1);
  if (em_failed(e)) return;
  tp_type gt = *em_type(e, g), wt = *em_type(e, w);
  if (gt.rank != 2 || wt.rank != 2 || gt.dims[1] != wt.dims[1] || em_type(e, idx)->rank != 1 ||
      em_type(e, off)->rank != 1) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: unexpected argument shapes", n->op);
    return;
  }
  int64_t L = em_type(e, idx)->dims[0], O = em_type(e, off)->dims[0], B = gt.dims[0], D = gt.dims[1];
  if (L == 0 || B == 0 || D == 0 || wt.dims[0] == 0) {
    o[0] = em_full(e, 0, ot);
    return;
  }
  idx = to_i64(e, idx);
  o2b = tp_type_numel(em_type(e, o2b)) == 0 ? bag_offset2bag(e, to_i64(e, off), O, L) : flatten(e, to_i64(e, o2b));
  int64_t one = 1;
  tp_val prod = mul(e, bag_rows(e, n, g, o2b), bag_rows(e, n, w, idx));
  tp_val dot = em_reduce(e, prod, em_const(e, 0, ct), &one, 1, "stablehlo.add");
  tp_val part = em_binary(e, "stablehlo.and", em_compare(e, "NE", idx, ki_like(e, idx, pad)), bag_member(e, o2b, B));
  dot = em_select(e, part, dot, lw_full_like(e, dot, 0));
  o[0] = em_convert(e, dot, dt);
}

/* ---- range factories (out= overloads: the output type comes from `out`) ------------------------- */

static void r_arange_out(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_dtype dt = OUT0->dt;
  /* PyTorch's CPU kernel: start + i*step in accscalar (double for
   * float/double, float for half types, int64 for integers), then cast. */
  tp_dtype cdt = tp_dtype_is_float(dt) ? (dt == TP_F16 || dt == TP_BF16 ? TP_F32 : TP_F64) : TP_I64;
  if (OUT0->rank != 1) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: out must be 1-D", n->op);
    return;
  }
  tp_type ct = lw_out_as(n, 0, cdt);
  tp_val i = em_iota(e, &ct, 0);
  tp_val start = lw_operand(e, n, 0, &ct), step = lw_operand(e, n, 2, &ct);
  o[0] = em_convert(e, add(e, start, mul(e, i, step)), dt);
}

/* arange(end) and arange(start, end): the same values as arange.start_out
 * with the missing start (0) and step (1). */
static void arange_from(tp_emit *e, const tp_node *n, tp_val *o, int start_i) {
  tp_dtype dt = OUT0->dt;
  tp_dtype cdt = tp_dtype_is_float(dt) ? (dt == TP_F16 || dt == TP_BF16 ? TP_F32 : TP_F64) : TP_I64;
  tp_type ct = lw_out_as(n, 0, cdt);
  tp_val i = em_iota(e, &ct, 0);
  if (start_i >= 0) i = add(e, lw_operand(e, n, start_i, &ct), i);
  o[0] = em_convert(e, i, dt);
}
static void r_arange_end(tp_emit *e, const tp_node *n, tp_val *o) { arange_from(e, n, o, -1); }
static void r_arange_start(tp_emit *e, const tp_node *n, tp_val *o) { arange_from(e, n, o, 0); }

/* linspace's values in dtype cdt, as PyTorch's CPU kernel computes them:
 * start and end first cast to the output dtype (Scalar::to<scalar_t>), then
 * step = (end - start) / (steps - 1); the first half counts up from start,
 * the second down from end. */
static tp_val linspace_in(tp_emit *e, const tp_node *n, tp_dtype cdt) {
  tp_dtype dt = OUT0->dt;
  int64_t steps = OUT0->dims[0];
  tp_type ct = lw_out_as(n, 0, cdt);
  tp_val s0 = em_convert(e, lw_tensor(e, n, 0, dt), cdt), e0 = em_convert(e, lw_tensor(e, n, 1, dt), cdt);
  tp_val start = em_bcast_in_dim(e, s0, &ct, NULL);
  if (steps == 1) return start;
  tp_val end = em_bcast_in_dim(e, e0, &ct, NULL);
  /* A true division, as on the CPU: XLA rewrites x / constant into
   * x * (1 / constant), which is inexact (49 -> 0.0204...: integer results
   * truncated one too low), so the divisor goes through an optimization
   * barrier that hides its value. */
  tp_val den = em_full(e, (double)(steps - 1), &ct);
  den = em_op(e, "stablehlo.optimization_barrier", NULL, &den, 1, &ct);
  tp_val step = em_binary(e, "stablehlo.divide", sub(e, end, start), den);
  tp_type it = lw_out_as(n, 0, TP_I64);
  tp_val ii = em_iota(e, &it, 0);
  tp_val fi = em_convert(e, ii, cdt);
  tp_val lo = add(e, start, mul(e, step, fi));
  tp_val hi = sub(e, end, mul(e, step, sub(e, em_full(e, (double)(steps - 1), &ct), fi)));
  tp_val first = em_compare(e, "LT", ii, ki_like(e, ii, steps / 2));
  return em_select(e, first, lo, hi);
}

static int is_real_int(tp_dtype dt) { return !tp_dtype_is_float(dt) && !tp_dtype_is_complex(dt); }

static void r_linspace_out(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_dtype dt = OUT0->dt;
  o[0] = em_convert(e, linspace_in(e, n, is_real_int(dt) ? TP_F64 : lw_opmath(dt)), dt);
}

/* logspace(start, end, steps, base) = base ** linspace's values, computed in
 * double for real dtypes and in the output's dtype for complex ones, as the
 * CPU kernel does (which fills a one-step result with base ** start in
 * double precision). */
static void r_logspace_out(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_dtype dt = OUT0->dt, cdt = tp_dtype_is_complex(dt) ? dt : TP_F64;
  tp_val x;
  if (OUT0->dims[0] == 1) { /* one step: base ** start, start not cast to dt first */
    cdt = tp_dtype_is_complex(dt) ? TP_C128 : TP_F64;
    tp_type ct = lw_out_as(n, 0, cdt);
    x = em_bcast_in_dim(e, lw_tensor(e, n, 0, cdt), &ct, NULL);
  } else {
    x = linspace_in(e, n, cdt);
  }
  o[0] = em_convert(e, em_binary(e, "stablehlo.power", lw_full_like(e, x, lw_float(n, 3, 10.0)), x), dt);
}

static void r_eye_out(tp_emit *e, const tp_node *n, tp_val *o) {
  if (OUT0->rank != 2) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: out must be 2-D", n->op);
    return;
  }
  tp_val r = iota_i64(e, 2, OUT0->dims, 0), c = iota_i64(e, 2, OUT0->dims, 1);
  o[0] = em_convert(e, em_compare(e, "EQ", r, c), OUT0->dt);
}

const tp_lower_entry tp_lower_shape[] = {
    {"aten::cat", r_cat, 0},
    {"aten::stack", r_stack, 0},
    {"aten::constant_pad_nd", r_constant_pad_nd, TP_FITS(2)},
    {"aten::flip", r_flip, 0},
    {"aten::roll", r_roll, TP_RUNTIME(1)},
    {"aten::repeat", r_repeat, 0},
    {"aten::tril", r_tril, TP_RUNTIME(1)},
    {"aten::triu", r_triu, TP_RUNTIME(1)},
    {"aten::index_select", r_index_select, 0},
    {"aten::gather", r_gather, 0},
    {"aten::take", r_take, 0},
    {"aten::put", r_put, 0},
    {"aten::max_unpool2d", r_max_unpool, 0},
    {"aten::max_unpool3d", r_max_unpool, 0},
    {"aten::embedding", r_embedding, 0},
    {"aten::embedding_dense_backward", r_embedding_dense_backward, 0},
    {"aten::_embedding_bag", r_embedding_bag, 0},
    {"aten::_embedding_bag_forward_only", r_embedding_bag, 0},
    {"aten::_embedding_bag_backward", r_embedding_bag_backward, 0},
    {"aten::_embedding_bag_dense_backward", r_embedding_bag_dense_backward, 0},
    {"aten::_embedding_bag_per_sample_weights_backward", r_embedding_bag_psw_backward, 0},
    {"aten::scatter.src", r_scatter, 0},
    {"aten::scatter.value", r_scatter, TP_FITS(3)},
    {"aten::scatter.reduce", r_scatter_legacy_reduce, 0},
    {"aten::scatter.value_reduce", r_scatter_legacy_reduce, 0},
    {"aten::scatter_add", r_scatter_add, 0},
    {"aten::scatter_reduce.two", r_scatter_reduce_two, 0},
    {"aten::index.Tensor", r_index, 0},
    {"aten::_unsafe_index.Tensor", r_index, 0},
    {"aten::index_put", r_index_put, 0},
    {"aten::_unsafe_index_put", r_index_put, 0},
    {"aten::_index_put_impl_", r_index_put, 0},
    {"aten::index_add", r_index_add, 0},
    {"aten::index_copy", r_index_copy, 0},
    {"aten::index_reduce", r_index_reduce, 0},
    {"aten::index_fill.int_Scalar", r_index_fill, TP_FITS(3)},
    {"aten::index_fill.int_Tensor", r_index_fill, 0},
    {"aten::masked_scatter", r_masked_scatter, 0},
    {"aten::segment_reduce", r_segment_reduce, 0},
    {"aten::_segment_reduce_backward", r_segment_reduce_backward, 0},
    {"aten::diag_embed", r_diag_embed, 0},
    {"aten::diagonal_scatter", r_diagonal_scatter, 0},
    {"aten::slice_scatter", r_slice_scatter, 0},
    {"aten::select_scatter", r_select_scatter, 0},
    {"aten::as_strided_scatter", r_as_strided_scatter, 0},
    {"aten::arange.start_out", r_arange_out, 0},
    {"aten::arange.start_step", r_arange_out, 0},
    {"aten::arange", r_arange_end, 0},
    {"aten::arange.start", r_arange_start, 0},
    {"aten::linspace.out", r_linspace_out, 0},
    {"aten::logspace.out", r_logspace_out, 0},
    {"aten::eye.out", r_eye_out, 0},
    {"aten::eye.m_out", r_eye_out, 0},
    {NULL, NULL, 0},
};

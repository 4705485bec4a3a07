/* lower_view.c - view ops as value transforms.
 *
 * In eager mode views are metadata (the C++ glue and PyTorch's composite
 * kernels handle them, and the engine materialises views of storages).
 * Compiled graphs still contain view ops after functionalization; there
 * they are plain functions of their input, lowered here.  Output shapes
 * come from the graph's meta values (n->outs). */
#include <string.h>

#include "lower_util.h"

static const tp_type *in_type(tp_emit *e, const tp_node *n) { return em_type(e, lw_arg(n, 0)->v); }

static void r_reshape(tp_emit *e, const tp_node *n, tp_val *o) {
  o[0] = em_reshape(e, lw_value(e, n, 0), n->outs[0].rank, n->outs[0].dims);
}

static void r_identity(tp_emit *e, const tp_node *n, tp_val *o) { o[0] = lw_value(e, n, 0); }

static void r_expand(tp_emit *e, const tp_node *n, tp_val *o) {
  o[0] = em_bcast_to(e, lw_value(e, n, 0), n->outs[0].rank, n->outs[0].dims);
}

static void transpose2(tp_emit *e, const tp_node *n, tp_val *o, int d0, int d1) {
  const tp_type *t = in_type(e, n);
  int64_t perm[TP_MAX_RANK];
  for (int i = 0; i < t->rank; i++) perm[i] = i;
  if (t->rank >= 2) {
    perm[d0] = d1;
    perm[d1] = d0;
  }
  o[0] = em_transpose(e, lw_value(e, n, 0), perm);
}

/* view.dtype(self, dtype): the bytes as the new dtype.  The meta function
 * admits element sizes that differ only where the last dim is contiguous, and
 * scales it by their ratio; a graph value is row-major, so its flattened
 * bytes reinterpreted (em_reinterpret, as eager mode reads a view of a
 * storage) are the result's elements in order. */
static void r_view_dtype(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = lw_value(e, n, 0);
  int64_t numel = tp_type_numel(em_type(e, x));
  tp_val flat = em_reinterpret(e, em_reshape(e, x, 1, &numel), n->outs[0].dt);
  o[0] = em_reshape(e, flat, n->outs[0].rank, n->outs[0].dims);
}

/* view_as_real: (..., 2) holding (re, im); view_as_complex its inverse. */
static void r_view_as_real(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val z = lw_value(e, n, 0);
  tp_type pt = *em_type(e, z);
  pt.dt = n->outs[0].dt;
  tp_val parts[2] = {em_op(e, "stablehlo.real", NULL, &z, 1, &pt), em_op(e, "stablehlo.imag", NULL, &z, 1, &pt)};
  int64_t d1[TP_MAX_RANK];
  memcpy(d1, n->outs[0].dims, sizeof d1);
  d1[n->outs[0].rank - 1] = 1;
  for (int i = 0; i < 2; i++) parts[i] = em_reshape(e, parts[i], n->outs[0].rank, d1);
  o[0] = em_concat(e, parts, 2, n->outs[0].rank - 1);
}

static void r_view_as_complex(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = lw_value(e, n, 0);
  tp_type tt = *em_type(e, x), *t = &tt; /* a copy: the loop emits */
  int64_t start[TP_MAX_RANK] = {0}, limit[TP_MAX_RANK], step[TP_MAX_RANK];
  for (int i = 0; i < t->rank; i++) {
    limit[i] = t->dims[i];
    step[i] = 1;
  }
  tp_val parts[2];
  for (int i = 0; i < 2; i++) {
    start[t->rank - 1] = i;
    limit[t->rank - 1] = i + 1;
    parts[i] = em_reshape(e, em_slice(e, x, start, limit, step), n->outs[0].rank, n->outs[0].dims);
  }
  o[0] = em_op(e, "stablehlo.complex", NULL, parts, 2, &n->outs[0]);
}

static void r_t(tp_emit *e, const tp_node *n, tp_val *o) { transpose2(e, n, o, 0, 1); }

static void r_transpose(tp_emit *e, const tp_node *n, tp_val *o) {
  int r = in_type(e, n)->rank;
  transpose2(e, n, o, lw_dim(lw_int(n, 1, 0), r), lw_dim(lw_int(n, 2, 1), r));
}

static void r_permute(tp_emit *e, const tp_node *n, tp_val *o) {
  const int64_t *dims;
  int k = lw_ints(n, 1, &dims);
  int r = in_type(e, n)->rank;
  int64_t perm[TP_MAX_RANK];
  for (int i = 0; i < k && i < TP_MAX_RANK; i++) perm[i] = lw_dim(dims[i], r);
  o[0] = em_transpose(e, lw_value(e, n, 0), perm);
}

/* slice.Tensor(self, dim, start?, end?, step) */
static void r_slice(tp_emit *e, const tp_node *n, tp_val *o) {
  const tp_type *t = in_type(e, n);
  int d = lw_dim(lw_int(n, 1, 0), t->rank);
  int64_t size = t->dims[d];
  int64_t start = lw_is_none(n, 2) ? 0 : lw_int(n, 2, 0);
  int64_t step = lw_int(n, 4, 1);
  if (start < 0) start += size;
  if (start < 0) start = 0;
  if (start > size) start = size;
  int64_t st[TP_MAX_RANK] = {0}, lim[TP_MAX_RANK], stride[TP_MAX_RANK];
  for (int i = 0; i < t->rank; i++) {
    lim[i] = t->dims[i];
    stride[i] = 1;
  }
  st[d] = start;
  stride[d] = step;
  lim[d] = start + (n->outs[0].dims[d] - 1) * step + 1;
  if (n->outs[0].dims[d] == 0) lim[d] = start;
  o[0] = em_slice(e, lw_value(e, n, 0), st, lim, stride);
}

/* select.int(self, dim, index) */
static void r_select(tp_emit *e, const tp_node *n, tp_val *o) {
  const tp_type *t = in_type(e, n);
  int d = lw_dim(lw_int(n, 1, 0), t->rank);
  int64_t idx = lw_int(n, 2, 0);
  if (idx < 0) idx += t->dims[d];
  int64_t st[TP_MAX_RANK] = {0}, lim[TP_MAX_RANK];
  for (int i = 0; i < t->rank; i++) lim[i] = t->dims[i];
  st[d] = idx;
  lim[d] = idx + 1;
  tp_val v = em_slice(e, lw_value(e, n, 0), st, lim, NULL);
  o[0] = em_reshape(e, v, n->outs[0].rank, n->outs[0].dims);
}

/* split.Tensor / split_with_sizes / unbind: consecutive slices along dim. */
static void split_along(tp_emit *e, const tp_node *n, tp_val *o, int d, int squeeze) {
  tp_type tt = *in_type(e, n), *t = &tt; /* a copy: the loop emits */
  int64_t off = 0;
  for (int k = 0; k < n->nouts; k++) {
    int64_t len = squeeze ? 1 : n->outs[k].dims[d];
    int64_t st[TP_MAX_RANK] = {0}, lim[TP_MAX_RANK];
    for (int i = 0; i < t->rank; i++) lim[i] = t->dims[i];
    st[d] = off;
    lim[d] = off + len;
    tp_val v = em_slice(e, lw_value(e, n, 0), st, lim, NULL);
    o[k] = squeeze ? em_reshape(e, v, n->outs[k].rank, n->outs[k].dims) : v;
    off += len;
  }
}

static void r_split(tp_emit *e, const tp_node *n, tp_val *o) {
  split_along(e, n, o, lw_dim(lw_int(n, 2, 0), in_type(e, n)->rank), 0);
}

static void r_unbind(tp_emit *e, const tp_node *n, tp_val *o) {
  split_along(e, n, o, lw_dim(lw_int(n, 1, 0), in_type(e, n)->rank), 1);
}

/* as_strided(self, size, stride, storage_offset?) on a value: indices into
 * the flattened (contiguous) input.  as_strided addresses self's storage,
 * which is that only for a self filling it row-major: compiled mode hands
 * this rule a storage as a flat value (torch_pjrt/_compile.py, _as_strided). */
static void r_as_strided(tp_emit *e, const tp_node *n, tp_val *o) {
  const tp_type *t = in_type(e, n);
  const int64_t *strides;
  int k = lw_ints(n, 2, &strides);
  int64_t off = lw_is_none(n, 3) ? 0 : lw_int(n, 3, 0);
  int64_t numel = tp_type_numel(t);
  tp_val flat = em_reshape(e, lw_value(e, n, 0), 1, &numel);
  tp_type it = lw_out_as(n, 0, TP_I64);
  tp_val idx = em_full(e, (double)off, &it);
  for (int i = 0; i < k && i < it.rank; i++) {
    if (it.dims[i] <= 1 || strides[i] == 0) continue;
    tp_val io = em_iota(e, &it, i);
    idx = em_binary(e, "stablehlo.add", idx, em_binary(e, "stablehlo.multiply", io, em_full(e, (double)strides[i], &it)));
  }
  o[0] = em_gather_flat(e, flat, idx);
}

/* diagonal(self, offset, dim1, dim2): gather along the two dims. */
static void r_diagonal(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_type tt = *in_type(e, n), *t = &tt; /* a copy: the rule emits */
  int64_t off = lw_int(n, 1, 0);
  int d1 = lw_dim(lw_int(n, 2, 0), t->rank), d2 = lw_dim(lw_int(n, 3, 1), t->rank);
  /* strides of the contiguous input */
  int64_t st[TP_MAX_RANK], acc = 1;
  for (int i = t->rank - 1; i >= 0; i--) {
    st[i] = acc;
    acc *= t->dims[i];
  }
  int64_t numel = acc;
  tp_val flat = em_reshape(e, lw_value(e, n, 0), 1, &numel);
  tp_type it = lw_out_as(n, 0, TP_I64);
  int64_t base = off >= 0 ? off * st[d2] : -off * st[d1];
  tp_val idx = em_full(e, (double)base, &it);
  int q = 0;
  for (int i = 0; i < t->rank; i++) {
    if (i == d1 || i == d2) continue;
    tp_val io = em_iota(e, &it, q++);
    idx = em_binary(e, "stablehlo.add", idx, em_binary(e, "stablehlo.multiply", io, em_full(e, (double)st[i], &it)));
  }
  tp_val io = em_iota(e, &it, it.rank - 1);
  idx = em_binary(e, "stablehlo.add", idx, em_binary(e, "stablehlo.multiply", io, em_full(e, (double)(st[d1] + st[d2]), &it)));
  o[0] = em_gather_flat(e, flat, idx);
}

const tp_lower_entry tp_lower_view[] = {
    {"aten::view", r_reshape, 0},
    {"aten::view_copy", r_reshape, 0},
    {"aten::_unsafe_view", r_reshape, 0},
    {"aten::_reshape_alias", r_reshape, 0},
    {"aten::reshape", r_reshape, 0},
    {"aten::unsqueeze", r_reshape, 0},
    {"aten::unsqueeze_copy", r_reshape, 0},
    {"aten::squeeze", r_reshape, 0},
    {"aten::squeeze.dim", r_reshape, 0},
    {"aten::squeeze.dims", r_reshape, 0},
    {"aten::squeeze_copy.dims", r_reshape, 0},
    {"aten::alias", r_identity, 0},
    {"aten::alias_copy", r_identity, 0},
    {"aten::detach", r_identity, 0},
    {"aten::lift_fresh_copy", r_identity, 0},
    {"aten::resolve_conj", r_identity, 0}, /* graph values carry no lazy bits */
    {"aten::resolve_neg", r_identity, 0},
    {"aten::expand", r_expand, 0},
    {"aten::expand_copy", r_expand, 0},
    {"aten::t", r_t, 0},
    {"aten::t_copy", r_t, 0},
    {"aten::transpose.int", r_transpose, 0},
    {"aten::transpose_copy.int", r_transpose, 0},
    {"aten::permute", r_permute, 0},
    {"aten::permute_copy", r_permute, 0},
    {"aten::slice.Tensor", r_slice, 0},
    {"aten::slice_copy.Tensor", r_slice, 0},
    {"aten::select.int", r_select, 0},
    {"aten::select_copy.int", r_select, 0},
    {"aten::split.Tensor", r_split, 0},
    {"aten::split_with_sizes", r_split, 0},
    {"aten::split_with_sizes_copy", r_split, 0},
    {"aten::unbind.int", r_unbind, 0},
    {"aten::as_strided", r_as_strided, 0},
    {"aten::as_strided_copy", r_as_strided, 0},
    {"aten::diagonal", r_diagonal, 0},
    {"aten::diagonal_copy", r_diagonal, 0},
    {"aten::view.dtype", r_view_dtype, 0},
    {"aten::view_copy.dtype", r_view_dtype, 0},
    {"aten::view_as_real", r_view_as_real, 0},
    {"aten::view_as_real_copy", r_view_as_real, 0},
    {"aten::view_as_complex", r_view_as_complex, 0},
    {"aten::view_as_complex_copy", r_view_as_complex, 0},
    {NULL, NULL, 0},
};

/* lower_misc.c - ops that fit no other family: outer-product and cross
 * products, distances, searching and binning, embedding bags and
 * renormalisation.
 *
 * Conventions (see lower.h): arguments arrive in schema order; outputs have
 * the shapes and dtypes PyTorch's meta functions computed (n->outs).
 *
 * Low precision: where PyTorch's CPU kernel computes f16/bf16 with
 * c10::Half/BFloat16 arithmetic (every operation rounded), the rule rounds
 * at the same points (em_round_to), so results match it bit for bit. */
#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "lower_util.h"

#define OUT0 (&n->outs[0])

static tp_val add(tp_emit *e, tp_val a, tp_val b) { return em_binary(e, "stablehlo.add", a, b); }
static tp_val sub(tp_emit *e, tp_val a, tp_val b) { return em_binary(e, "stablehlo.subtract", a, b); }
static tp_val mul(tp_emit *e, tp_val a, tp_val b) { return em_binary(e, "stablehlo.multiply", a, b); }

static tp_val rnd(tp_emit *e, tp_val x, tp_dtype dt) { return em_round_to(e, x, dt); }

/* ---- addr, cross --------------------------------------------------------------- */

/* addr(self, vec1, vec2, *, beta=1, alpha=1) = beta * self + alpha * outer(vec1, vec2),
 * computed as PyTorch's CPU kernel does: (beta * self) + ((alpha * vec1) * vec2),
 * each operation in the output dtype, beta and alpha converted to it; beta
 * == 0 ignores self (NaN there does not propagate); bool: logical form. */
static void r_addr(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_dtype od = OUT0->dt;
  if (OUT0->rank != 2) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "addr: expected a 2-D output");
    return;
  }
  if (tp_dtype_is_complex(od)) {
    o[0] = em_fail(e, TP_UNIMPLEMENTED, "addr: complex inputs are not supported on tpu yet");
    return;
  }
  tp_dtype ct = lw_opmath(od);
  tp_type t = lw_out_as(n, 0, ct);
  int64_t m0 = 0, m1 = 1;
  tp_val v1 = em_bcast_in_dim(e, lw_tensor(e, n, 1, ct), &t, &m0);
  tp_val v2 = em_bcast_in_dim(e, lw_tensor(e, n, 2, ct), &t, &m1);
  const tp_arg *ba = lw_arg(n, 3), *aa = lw_arg(n, 4);
  int beta_zero = ba->kind == TP_ARG_SCALAR && (tp_dtype_is_float(ba->sdt) ? ba->f == 0.0 : ba->i == 0);
  if (od == TP_BOOL) {
    /* PyTorch: (beta && self) || (alpha && vec1 && vec2) */
    tp_type bt = lw_out_as(n, 0, TP_BOOL);
    tp_val alpha = lw_is_none(n, 4) ? em_full(e, 1, &bt) : lw_operand(e, n, 4, &bt);
    tp_val r = em_binary(e, "stablehlo.and", alpha, em_binary(e, "stablehlo.and", v1, v2));
    if (!beta_zero) {
      tp_val beta = lw_is_none(n, 3) ? em_full(e, 1, &bt) : lw_operand(e, n, 3, &bt);
      r = em_binary(e, "stablehlo.or", em_binary(e, "stablehlo.and", beta, lw_operand(e, n, 0, &bt)), r);
    }
    o[0] = r;
    return;
  }
  /* the scalars as the kernel sees them: converted to the output dtype */
  tp_val alpha = aa->kind == TP_ARG_NONE ? em_full(e, 1, &t) : em_convert(e, lw_operand(e, n, 4, OUT0), ct);
  tp_val r = rnd(e, mul(e, rnd(e, mul(e, alpha, v1), od), v2), od);
  if (!beta_zero) {
    tp_val beta = ba->kind == TP_ARG_NONE ? em_full(e, 1, &t) : em_convert(e, lw_operand(e, n, 3, OUT0), ct);
    r = add(e, rnd(e, mul(e, beta, lw_operand(e, n, 0, &t)), od), r);
  }
  o[0] = em_convert(e, r, od);
}

/* linalg_cross(self, other, *, dim=-1): broadcast, then per component
 * a[i] * b[j] - a[j] * b[i], each product and the difference rounded to
 * the dtype (PyTorch's CPU kernel works in the tensor's dtype). */
static void r_linalg_cross(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_dtype od = OUT0->dt;
  if (tp_dtype_is_complex(od)) {
    o[0] = em_fail(e, TP_UNIMPLEMENTED, "linalg_cross: complex inputs are not supported on tpu yet");
    return;
  }
  int r = OUT0->rank;
  int d = lw_dim(lw_int(n, 2, -1), r);
  if (r == 0 || d < 0 || d >= r || OUT0->dims[d] != 3) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "linalg.cross: inputs dimension %d must have length 3", d);
    return;
  }
  tp_type t = lw_out_as(n, 0, lw_opmath(od));
  tp_val a = lw_operand(e, n, 0, &t), b = lw_operand(e, n, 1, &t);
  tp_val ac[3], bc[3], out[3];
  for (int c = 0; c < 3; c++) {
    int64_t st[TP_MAX_RANK] = {0}, lim[TP_MAX_RANK];
    for (int i = 0; i < r; i++) lim[i] = t.dims[i];
    st[d] = c;
    lim[d] = c + 1;
    ac[c] = em_slice(e, a, st, lim, NULL);
    bc[c] = em_slice(e, b, st, lim, NULL);
  }
  for (int c = 0; c < 3; c++) {
    int i = (c + 1) % 3, j = (c + 2) % 3;
    out[c] = rnd(e, sub(e, rnd(e, mul(e, ac[i], bc[j]), od), rnd(e, mul(e, ac[j], bc[i]), od)), od);
  }
  o[0] = em_convert(e, em_concat(e, out, 3, d), od);
}

/* ---- searchsorted ---------------------------------------------------------------- */

/* searchsorted.Tensor / .Scalar(sorted_sequence, self, *, out_int32, right, side, sorter):
 * PyTorch's CPU binary search, replayed step for step (so NaNs and unsorted
 * input give its answers): start = 0, end = L; while start < end: mid =
 * start + (end - start) / 2; go right when !(seq[mid] >= v) (left) or
 * !(seq[mid] > v) (right).  ceil(log2(L + 1)) vectorised steps do it. */
static void r_searchsorted(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val seq0 = lw_value(e, n, 0);
  tp_type st = *em_type(e, seq0);
  tp_dtype vdt = lw_dtype(e, n, 1);
  if (em_failed(e)) return;
  if (tp_dtype_is_complex(st.dt) || tp_dtype_is_complex(vdt)) {
    o[0] = em_fail(e, TP_UNIMPLEMENTED, "searchsorted: complex inputs are not supported");
    return;
  }
  tp_dtype ct = lw_promote(st.dt, vdt);
  if (ct == TP_BOOL) ct = TP_U8;
  const char *side = lw_str(n, 4, NULL);
  int right = side ? !strcmp(side, "right") : lw_bool(n, 3, 0);
  int64_t L = st.rank ? st.dims[st.rank - 1] : 1;
  int64_t rows = L ? tp_type_numel(&st) / L : 0;
  tp_type qt = lw_out_as(n, 0, TP_I64); /* query positions: the output's shape */
  int64_t Q = tp_type_numel(&qt);
  if (Q == 0 || L == 0) {
    o[0] = em_full(e, 0, OUT0);
    return;
  }
  int64_t per_row = rows > 1 ? Q / rows : Q;
  int64_t nseq = tp_type_numel(&st);
  tp_val seq = em_reshape(e, em_convert(e, seq0, ct), 1, &nseq);
  tp_val v = lw_tensor(e, n, 1, ct);
  v = em_reshape(e, em_bcast_to(e, v, qt.rank, qt.dims), 1, &Q);
  tp_val sorter = -1;
  if (lw_arg(n, 5)->kind == TP_ARG_TENSOR) sorter = em_reshape(e, em_convert(e, lw_value(e, n, 5), TP_I64), 1, &nseq);
  /* row offset of each query into the flattened sequence */
  tp_type q1 = tp_type_make(TP_I64, 1, &Q);
  tp_val base = em_full(e, 0, &q1);
  if (rows > 1) {
    int64_t d2[2] = {rows, per_row};
    tp_type t2 = tp_type_make(TP_I64, 2, d2);
    base = em_reshape(e, mul(e, em_iota(e, &t2, 0), em_full(e, (double)L, &t2)), 1, &Q);
  }
  tp_val start = em_full(e, 0, &q1), end = em_full(e, (double)L, &q1), one = em_full(e, 1, &q1);
  int steps = 0;
  while (((int64_t)1 << steps) <= L) steps++;
  for (int i = 0; i < steps; i++) {
    tp_val active = em_compare(e, "LT", start, end);
    tp_val mid = add(e, start, em_binary(e, "stablehlo.shift_right_logical", sub(e, end, start), one));
    tp_val at = add(e, base, em_clamp(e, em_const_i(e, 0, TP_I64), mid, em_const_i(e, L - 1, TP_I64)));
    if (sorter >= 0) at = add(e, base, em_gather_flat(e, sorter, at));
    tp_val mv = em_gather_flat(e, seq, at);
    tp_val go_right = em_unary(e, "stablehlo.not", em_compare(e, right ? "GT" : "GE", mv, v));
    start = em_select(e, em_binary(e, "stablehlo.and", active, go_right), add(e, mid, one), start);
    end = em_select(e, em_binary(e, "stablehlo.and", active, em_unary(e, "stablehlo.not", go_right)), mid, end);
  }
  o[0] = em_convert(e, em_reshape(e, start, OUT0->rank, OUT0->dims), OUT0->dt);
}

const tp_lower_entry tp_lower_misc[] = {
    {"aten::searchsorted.Tensor", r_searchsorted},
    {"aten::searchsorted.Scalar", r_searchsorted},
    {"aten::addr", r_addr},
    {"aten::linalg_cross", r_linalg_cross},
    {NULL, NULL},
};

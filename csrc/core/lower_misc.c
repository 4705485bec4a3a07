/* lower_misc.c - ops that fit no other family: outer-product and cross
 * products, distances, searching and binning, embedding renormalisation
 * (embedding bags are in lower_shape.c, with the other gathers and scatters).
 *
 * Conventions (see lower.h): arguments arrive in schema order; outputs have
 * the shapes and dtypes PyTorch's meta functions computed (n->outs).
 *
 * Low precision: where PyTorch's CPU kernel computes f16/bf16 with
 * c10::Half/BFloat16 arithmetic (every operation rounded), the rule rounds
 * at the same points (em_round_to), so results match it bit for bit. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
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
  /* beta and alpha are runtime scalars: beta == 0 is selected in the program */
  if (od == TP_BOOL) {
    /* PyTorch: (beta && self) || (alpha && vec1 && vec2) */
    tp_type bt = lw_out_as(n, 0, TP_BOOL);
    tp_val alpha = lw_is_none(n, 4) ? em_full(e, 1, &bt) : lw_operand(e, n, 4, &bt);
    tp_val r = em_binary(e, "stablehlo.and", alpha, em_binary(e, "stablehlo.and", v1, v2));
    tp_val beta = lw_is_none(n, 3) ? em_full(e, 1, &bt) : lw_operand(e, n, 3, &bt);
    o[0] = em_binary(e, "stablehlo.or", em_binary(e, "stablehlo.and", beta, lw_operand(e, n, 0, &bt)), r);
    return;
  }
  /* the scalars as the kernel sees them: converted to the output dtype */
  tp_val alpha = lw_is_none(n, 4) ? em_full(e, 1, &t) : em_convert(e, lw_operand(e, n, 4, OUT0), ct);
  tp_val r = rnd(e, mul(e, rnd(e, mul(e, alpha, v1), od), v2), od);
  if (!lw_is_none(n, 3)) {
    tp_val beta = em_convert(e, lw_operand(e, n, 3, OUT0), ct);
    tp_val with_self = add(e, rnd(e, mul(e, beta, lw_operand(e, n, 0, &t)), od), r);
    r = em_select(e, em_compare(e, "EQ", beta, em_full(e, 0, &t)), r, with_self);
  } else {
    r = add(e, lw_operand(e, n, 0, &t), r);
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
  if (lw_arg(n, 5)->kind == TP_ARG_TENSOR) {
    sorter = em_reshape(e, em_convert(e, lw_value(e, n, 5), TP_I64), 1, &nseq);
    lw_check_range(e, n, sorter, 0, L, TP_INVALID_ARGUMENT, "torch.searchsorted(): sorter index out of range");
  }
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

/* ---- distances -------------------------------------------------------------------- */

/* The p-norm of d over its last dim, as PyTorch's distance kernels compute
 * it: p = 0 counts nonzeros, 1 sums |d|, 2 is sqrt(sum d^2), inf the max
 * |d|, else (sum |d|^p)^(1/p). */
static tp_val pnorm_last(tp_emit *e, tp_val d, double p) {
  tp_type t = *em_type(e, d);
  int64_t last = t.rank - 1;
  tp_val a = em_unary(e, "stablehlo.abs", d);
  tp_val zero = em_const(e, 0, t.dt);
  if (p == 0) {
    tp_val nz = em_convert(e, em_convert(e, em_compare(e, "NE", d, em_full(e, 0, &t)), TP_U8), t.dt);
    return em_reduce(e, nz, zero, &last, 1, "stablehlo.add");
  }
  if (p == 1) return em_reduce(e, a, zero, &last, 1, "stablehlo.add");
  if (p == 2) return em_unary(e, "stablehlo.sqrt", em_reduce(e, mul(e, d, d), zero, &last, 1, "stablehlo.add"));
  if (isinf(p)) {
    /* NaN-propagating max of |d| (XLA's maximum may drop a NaN) */
    tp_val m = em_reduce(e, a, zero, &last, 1, "stablehlo.maximum");
    tp_val nan = em_reduce(e, em_convert(e, em_compare(e, "NE", d, d), TP_U8), em_const(e, 0, TP_U8), &last, 1,
                           "stablehlo.maximum");
    tp_type mt = *em_type(e, m), nt0 = *em_type(e, nan);
    return em_select(e, em_compare(e, "NE", nan, em_full(e, 0, &nt0)), em_full(e, NAN, &mt), m);
  }
  tp_val s = em_reduce(e, em_binary(e, "stablehlo.power", a, em_full(e, p, &t)), zero, &last, 1, "stablehlo.add");
  tp_type st = *em_type(e, s);
  return em_binary(e, "stablehlo.power", s, em_full(e, 1.0 / p, &st));
}

static int dist_p_ok(tp_emit *e, const char *op, double p, tp_dtype dt) {
  if (p < 0 || isnan(p)) {
    em_fail(e, TP_INVALID_ARGUMENT, "%s only supports non-negative p values", op);
    return 0;
  }
  if (!tp_dtype_is_float(dt)) {
    em_fail(e, TP_INVALID_ARGUMENT, "%s only supports floating-point dtypes, X1 got: %s", op, tp_dtype_name(dt));
    return 0;
  }
  return 1;
}

/* _cdist_forward(x1 (B.., P, M), x2 (B.., R, M), p, compute_mode) -> (B.., P, R).
 * p = 2 with compute_mode 1, or None/0 when P or R > 25, uses PyTorch's
 * matmul form sqrt(clamp_min(|a|^2 - 2 a.b + |b|^2, 0)) like the CPU
 * kernel; everything else the direct differences. */
static void r_cdist(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_type ot = *OUT0;
  double p = lw_float(n, 2, 2.0);
  if (!dist_p_ok(e, "cdist", p, ot.dt)) return;
  int r = ot.rank;
  if (r < 2) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "cdist only supports at least 2D tensors");
    return;
  }
  tp_dtype ct = lw_opmath(ot.dt);
  tp_val x1 = lw_tensor(e, n, 0, ct), x2 = lw_tensor(e, n, 1, ct);
  tp_type t1 = *em_type(e, x1);
  int64_t P = ot.dims[r - 2], R = ot.dims[r - 1], M = t1.dims[t1.rank - 1];
  /* broadcast batch dims: x1 -> (B.., P, M), x2 -> (B.., R, M) */
  int64_t d1[TP_MAX_RANK], d2[TP_MAX_RANK];
  for (int i = 0; i < r - 2; i++) d1[i] = d2[i] = ot.dims[i];
  d1[r - 2] = P;
  d2[r - 2] = R;
  d1[r - 1] = d2[r - 1] = M;
  x1 = em_bcast_to(e, x1, r, d1);
  x2 = em_bcast_to(e, x2, r, d2);
  int64_t mode = lw_is_none(n, 3) ? 0 : lw_int(n, 3, 0);
  tp_type rt = lw_out_as(n, 0, ct);
  if (P * R == 0) {
    o[0] = em_full(e, 0, OUT0);
    return;
  }
  if (M == 0) {
    o[0] = em_full(e, 0, OUT0);
    return;
  }
  if (p == 2 && (mode == 1 || (mode == 0 && (P > 25 || R > 25)))) {
    int64_t last = r - 1;
    int64_t batch[TP_MAX_RANK];
    for (int i = 0; i < r - 2; i++) batch[i] = i;
    tp_val n1 = em_reduce(e, mul(e, x1, x1), em_const(e, 0, ct), &last, 1, "stablehlo.add"); /* (B.., P) */
    tp_val n2 = em_reduce(e, mul(e, x2, x2), em_const(e, 0, ct), &last, 1, "stablehlo.add"); /* (B.., R) */
    int64_t lc = r - 1, rc = r - 1;
    tp_val dot = em_dot(e, x1, x2, batch, batch, r - 2, &lc, &rc, 1, ct); /* (B.., P, R) */
    int64_t m1[TP_MAX_RANK], m2[TP_MAX_RANK];
    for (int i = 0; i < r - 1; i++) m1[i] = m2[i] = i;
    m2[r - 2] = r - 1;
    tp_val sq = add(e, sub(e, em_bcast_in_dim(e, n1, &rt, m1), mul(e, em_full(e, 2, &rt), dot)),
                    em_bcast_in_dim(e, n2, &rt, m2));
    sq = em_select(e, em_compare(e, "LT", sq, em_full(e, 0, &rt)), em_full(e, 0, &rt), sq);
    o[0] = em_convert(e, em_unary(e, "stablehlo.sqrt", sq), ot.dt);
    return;
  }
  /* (B.., P, 1, M) - (B.., 1, R, M) */
  tp_type dt4 = tp_type_make(ct, r + 1, ot.dims);
  dt4.dims[r] = M;
  int64_t a1[TP_MAX_RANK + 1], a2[TP_MAX_RANK + 1];
  for (int i = 0; i < r - 2; i++) a1[i] = a2[i] = i;
  a1[r - 2] = r - 2;
  a1[r - 1] = r;
  a2[r - 2] = r - 1;
  a2[r - 1] = r;
  tp_val diff = sub(e, em_bcast_in_dim(e, x1, &dt4, a1), em_bcast_in_dim(e, x2, &dt4, a2));
  o[0] = em_convert(e, pnorm_last(e, diff, p), ot.dt);
}

/* The gradient of one |diff|_p term w.r.t. diff, as PyTorch's CPU distance
 * backward kernels write it (dist: the forward distance, g: its gradient;
 * all shaped like diff). */
static tp_val dist_grad(tp_emit *e, tp_val diff, tp_val dist, tp_val g, double p) {
  tp_type t = *em_type(e, diff);
  tp_val zero = em_full(e, 0, &t);
  tp_val sgn = em_unary(e, "stablehlo.sign", diff), a = em_unary(e, "stablehlo.abs", diff);
  tp_val dz = em_compare(e, "EQ", dist, zero);
  if (p == 0) return zero;
  if (p == 1) return mul(e, g, sgn);
  if (isinf(p)) return mul(e, mul(e, g, sgn), em_convert(e, em_convert(e, em_compare(e, "EQ", a, dist), TP_U8), t.dt));
  if (p == 2) return em_select(e, dz, zero, em_binary(e, "stablehlo.divide", mul(e, g, diff), dist));
  tp_val pm1 = em_full(e, p - 1, &t);
  tp_val den = em_binary(e, "stablehlo.power", dist, pm1);
  if (p < 2) {
    tp_val r = em_binary(e, "stablehlo.divide", mul(e, mul(e, sgn, em_binary(e, "stablehlo.power", a, pm1)), g), den);
    tp_val z = dz;
    if (p < 1) z = em_binary(e, "stablehlo.or", z, em_compare(e, "EQ", diff, zero));
    return em_select(e, z, zero, r);
  }
  tp_val r = em_binary(e, "stablehlo.divide",
                       mul(e, mul(e, diff, em_binary(e, "stablehlo.power", a, em_full(e, p - 2, &t))), g), den);
  return em_select(e, dz, zero, r);
}

/* _cdist_backward(grad (B.., P, R), x1, x2, p, cdist) -> grad_x1 (B.., P, M):
 * the sum over R of dist_grad (x2 broadcast like the forward). */
static void r_cdist_backward(tp_emit *e, const tp_node *n, tp_val *o) {
  double p = lw_float(n, 3, 2.0);
  tp_type ot = *OUT0;
  tp_dtype ct = lw_opmath(ot.dt);
  tp_val g = lw_tensor(e, n, 0, ct), dist = lw_tensor(e, n, 4, ct);
  tp_type gt = *em_type(e, g);
  int r = gt.rank;
  if (r < 2 || ot.rank < 2 || ot.rank > r) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "_cdist_backward: unexpected ranks");
    return;
  }
  int64_t M = ot.dims[ot.rank - 1];
  if (tp_type_numel(&gt) == 0 || M == 0) {
    o[0] = em_full(e, 0, OUT0);
    return;
  }
  /* x1, x2 broadcast to the output's batch dims: (B.., P, M), (B.., R, M) */
  int64_t d1[TP_MAX_RANK], d2[TP_MAX_RANK];
  for (int i = 0; i < r; i++) d1[i] = d2[i] = gt.dims[i];
  d1[r - 1] = d2[r - 1] = M;
  d2[r - 2] = gt.dims[r - 1];
  tp_val x1 = em_bcast_to(e, lw_tensor(e, n, 1, ct), r, d1), x2 = em_bcast_to(e, lw_tensor(e, n, 2, ct), r, d2);
  tp_type dt4 = tp_type_make(ct, r + 1, gt.dims);
  dt4.dims[r] = M;
  int64_t a1[TP_MAX_RANK + 1], a2[TP_MAX_RANK + 1], ag[TP_MAX_RANK + 1];
  for (int i = 0; i < r - 2; i++) a1[i] = a2[i] = i;
  a1[r - 2] = r - 2;
  a1[r - 1] = r;
  a2[r - 2] = r - 1;
  a2[r - 1] = r;
  for (int i = 0; i < r; i++) ag[i] = i;
  tp_val diff = sub(e, em_bcast_in_dim(e, x1, &dt4, a1), em_bcast_in_dim(e, x2, &dt4, a2));
  tp_val gd = dist_grad(e, diff, em_bcast_in_dim(e, dist, &dt4, ag), em_bcast_in_dim(e, g, &dt4, ag), p);
  int64_t rdim = r - 1;
  tp_val gx = em_reduce(e, gd, em_const(e, 0, ct), &rdim, 1, "stablehlo.add"); /* (B.., P, M) */
  /* sum the batch dims x1 was broadcast along */
  int64_t red[TP_MAX_RANK];
  int nred = 0, lead = r - ot.rank;
  for (int i = 0; i < r - 2; i++)
    if (i < lead || (ot.dims[i - lead] == 1 && d1[i] != 1)) red[nred++] = i;
  if (nred) gx = em_reduce(e, gx, em_const(e, 0, ct), red, nred, "stablehlo.add");
  o[0] = em_convert(e, em_reshape(e, gx, ot.rank, ot.dims), ot.dt);
}

/* Rows i < j of pair k (0 <= k < K) of N rows, in row-major order: a binary
 * search over off(i) = i N - i (i + 1) / 2 (exact integers) finds i, then
 * j = k - off(i) + i + 1.  *pi, *pj: i64 (K). */
static void pdist_pairs(tp_emit *e, int64_t N, int64_t K, tp_val *pi, tp_val *pj) {
  tp_type kt = tp_type_make(TP_I64, 1, &K);
  tp_val k = em_iota(e, &kt, 0);
  tp_val lo = em_full(e, 0, &kt), hi = em_full(e, (double)(N - 2), &kt), one = em_full(e, 1, &kt);
  tp_val nn = em_full(e, (double)N, &kt), two = em_full(e, 2, &kt);
#define OFF(i) sub(e, mul(e, i, nn), em_binary(e, "stablehlo.divide", mul(e, i, add(e, i, one)), two))
  /* largest i in [lo, hi] with off(i) <= k */
  int steps = 0;
  while (((int64_t)1 << steps) <= N) steps++;
  for (int s2 = 0; s2 < steps; s2++) {
    tp_val mid = em_binary(e, "stablehlo.shift_right_logical", add(e, add(e, lo, hi), one), one);
    tp_val ok = em_compare(e, "LE", OFF(mid), k);
    tp_val act = em_compare(e, "LT", lo, hi);
    lo = em_select(e, em_binary(e, "stablehlo.and", act, ok), mid, lo);
    hi = em_select(e, em_binary(e, "stablehlo.and", act, em_unary(e, "stablehlo.not", ok)), sub(e, mid, one), hi);
  }
  *pi = lo;
  *pj = add(e, add(e, sub(e, k, OFF(lo)), lo), one);
#undef OFF
}

/* Flat element indices (K, M) of rows idx (K) of an (N, M) matrix. */
static tp_val row_elems(tp_emit *e, tp_val idx, int64_t K, int64_t M) {
  int64_t km[2] = {K, M}, m0 = 0;
  tp_type kmt = tp_type_make(TP_I64, 2, km);
  return add(e, mul(e, em_bcast_in_dim(e, idx, &kmt, &m0), em_full(e, (double)M, &kmt)), em_iota(e, &kmt, 1));
}

/* _pdist_forward(self (N, M), p) -> (N(N-1)/2): distances of rows i < j in
 * row-major order (pdist_pairs). */
static void r_pdist(tp_emit *e, const tp_node *n, tp_val *o) {
  double p = lw_float(n, 1, 2.0);
  tp_dtype od = OUT0->dt;
  if (!dist_p_ok(e, "pdist", p, od)) return;
  tp_dtype ct = lw_opmath(od);
  tp_val x = lw_tensor(e, n, 0, ct);
  tp_type xt = *em_type(e, x);
  if (xt.rank != 2) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "pdist only supports 2D tensors, got: %dD", xt.rank);
    return;
  }
  int64_t N = xt.dims[0], M = xt.dims[1], K = OUT0->dims[0];
  if (K == 0 || M == 0) {
    o[0] = em_full(e, 0, OUT0);
    return;
  }
  tp_val i, j;
  pdist_pairs(e, N, K, &i, &j);
  int64_t nm = N * M;
  tp_val flat = em_reshape(e, x, 1, &nm);
  tp_val diff = sub(e, em_gather_flat(e, flat, row_elems(e, i, K, M)), em_gather_flat(e, flat, row_elems(e, j, K, M)));
  o[0] = em_convert(e, pnorm_last(e, diff, p), od);
}

/* _pdist_backward(grad (K), self (N, M), p, pdist (K)) -> (N, M): each pair's
 * dist_grad added to row i and subtracted from row j. */
static void r_pdist_backward(tp_emit *e, const tp_node *n, tp_val *o) {
  double p = lw_float(n, 2, 2.0);
  tp_dtype od = OUT0->dt, ct = lw_opmath(od);
  tp_val x = lw_tensor(e, n, 1, ct);
  tp_type xt = *em_type(e, x);
  if (xt.rank != 2) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "_pdist_backward: expected a 2D input");
    return;
  }
  int64_t N = xt.dims[0], M = xt.dims[1], K = N * (N - 1) / 2;
  if (K <= 0 || M == 0) {
    o[0] = em_full(e, 0, OUT0);
    return;
  }
  tp_val i, j;
  pdist_pairs(e, N, K, &i, &j);
  int64_t nm = N * M, km[2] = {K, M}, m0 = 0;
  tp_type kmt = tp_type_make(ct, 2, km);
  tp_val flat = em_reshape(e, x, 1, &nm);
  tp_val ei = row_elems(e, i, K, M), ej = row_elems(e, j, K, M);
  tp_val diff = sub(e, em_gather_flat(e, flat, ei), em_gather_flat(e, flat, ej));
  tp_val g = em_bcast_in_dim(e, lw_tensor(e, n, 0, ct), &kmt, &m0);
  tp_val dist = em_bcast_in_dim(e, lw_tensor(e, n, 3, ct), &kmt, &m0);
  tp_val gd = dist_grad(e, diff, dist, g, p);
  tp_type ft = tp_type_make(ct, 1, &nm);
  tp_val acc = em_scatter_flat(e, em_full(e, 0, &ft), ei, gd, "stablehlo.add");
  acc = em_scatter_flat(e, acc, ej, em_unary(e, "stablehlo.negate", gd), "stablehlo.add");
  o[0] = em_convert(e, em_reshape(e, acc, 2, xt.dims), od);
}

/* ---- embeddings ---------------------------------------------------------------------- */

/* embedding_renorm_(self!, indices, max_norm, norm_type) -> self: each row
 * of self named in indices whose norm_type-norm (in self's dtype) exceeds
 * max_norm is scaled by max_norm / (norm + 1e-7), the factor computed in
 * double and then rounded to self's dtype, as PyTorch's CPU kernel does. */
static void r_embedding_renorm(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val w0 = lw_value(e, n, 0);
  tp_type wt = *em_type(e, w0);
  if (wt.rank != 2 || !tp_dtype_is_float(wt.dt)) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "embedding_renorm_: expected a 2-D floating-point weight");
    return;
  }
  double max_norm = lw_float(n, 2, 1.0), p = lw_float(n, 3, 2.0);
  int64_t N = wt.dims[0], M = wt.dims[1];
  tp_val idx = lw_value(e, n, 1);
  tp_type it = *em_type(e, idx);
  int64_t ni = tp_type_numel(&it);
  if (N == 0 || M == 0 || ni == 0) {
    o[0] = w0;
    return;
  }
  tp_dtype ct = lw_opmath(wt.dt);
  tp_val w = em_convert(e, w0, ct);
  tp_val nrm = pnorm_last(e, w, p); /* (N) */
  if (ct != wt.dt) nrm = em_round_to(e, nrm, wt.dt);
  tp_type nt = tp_type_make(TP_U8, 1, &N);
  tp_val used = em_scatter_flat(e, em_full(e, 0, &nt), em_reshape(e, em_convert(e, idx, TP_I64), 1, &ni),
                                em_full(e, 1, &(tp_type){TP_U8, 1, {ni}}), "stablehlo.maximum");
  tp_val nd = em_convert(e, nrm, TP_F64);
  tp_type n64 = *em_type(e, nd);
  tp_val scale = em_binary(e, "stablehlo.divide", em_full(e, max_norm, &n64), add(e, nd, em_full(e, 1e-7, &n64)));
  tp_val hit = em_binary(e, "stablehlo.and", em_compare(e, "NE", used, em_full(e, 0, &nt)),
                         em_compare(e, "GT", nd, em_full(e, max_norm, &n64)));
  /* the kernel's row *= scale casts the (double) scale to self's dtype */
  tp_type nrmt = *em_type(e, nrm);
  tp_val f = em_select(e, hit, em_convert(e, em_round_to(e, scale, wt.dt), ct), em_full(e, 1, &nrmt));
  int64_t m0 = 0;
  tp_type wct = wt;
  wct.dt = ct;
  tp_val y = mul(e, w, em_bcast_in_dim(e, f, &wct, &m0));
  o[0] = em_convert(e, em_select(e, em_bcast_in_dim(e, hit, &(tp_type){TP_BOOL, 2, {N, M}}, &m0), y, w), wt.dt);
}

/* ---- replication padding backward --------------------------------------------------- */

/* g summed along `dim` into `in` positions: output position q reads input
 * clamp(q - left, 0, in - 1), so grad_in = A g with A[i][q] = (that == i),
 * a 0/1 matrix contracted with dot_general. */
static tp_val fold_dim(tp_emit *e, tp_val g, int dim, int64_t in, int64_t left) {
  tp_type t = *em_type(e, g);
  int r = t.rank;
  int64_t q = t.dims[dim];
  int64_t ad[2] = {in, q};
  tp_type at = tp_type_make(TP_I64, 2, ad);
  tp_val src = sub(e, em_iota(e, &at, 1), em_full(e, (double)left, &at));
  src = em_clamp(e, em_const_i(e, 0, TP_I64), src, em_const_i(e, in - 1, TP_I64));
  tp_val a = em_convert(e, em_convert(e, em_compare(e, "EQ", src, em_iota(e, &at, 0)), TP_U8), t.dt);
  /* dot(g, A) contracting g's dim with A's dim 1: result (g dims without dim..., in) */
  int64_t lc = dim, rc = 1;
  tp_val y = em_dot(e, g, a, NULL, NULL, 0, &lc, &rc, 1, t.dt);
  int64_t perm[TP_MAX_RANK];
  for (int i = 0, k = 0; i < r; i++) perm[i] = i == dim ? r - 1 : k++;
  return em_transpose(e, y, perm);
}

/* replication_pad{1,2,3}d_backward(grad_output, self, padding) -> grad_input */
static void r_replication_pad_bw(tp_emit *e, const tp_node *n, tp_val *o) {
  const int64_t *pad;
  int np = lw_ints(n, 2, &pad);
  tp_type ot = *OUT0;
  int k = np / 2;
  if (np % 2 || k > ot.rank) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: bad padding", n->op);
    return;
  }
  tp_dtype ct = lw_opmath(ot.dt);
  tp_val g = lw_tensor(e, n, 0, ct);
  if (tp_type_numel(&ot) == 0) {
    o[0] = em_full(e, 0, OUT0);
    return;
  }
  for (int j = 0; j < k; j++) {
    int dim = ot.rank - 1 - j;
    g = fold_dim(e, g, dim, ot.dims[dim], pad[2 * j]);
  }
  o[0] = em_convert(e, g, ot.dt);
}

/* ---- margin loss backward ------------------------------------------------------------ */

/* grad_output scaled per row as PyTorch's CPU kernels do at the end: a
 * scalar grad (reduction != none, or 0-dim) multiplies everything, else
 * row i by grad_output[i].  gi: (N, D) in ct. */
static tp_val margin_grad_out(tp_emit *e, const tp_node *n, tp_val gi, int64_t red) {
  tp_type t = *em_type(e, gi);
  const tp_arg *ga = lw_arg(n, 0);
  tp_val g = lw_tensor(e, n, 0, t.dt);
  int64_t m0 = 0;
  if (red != 0 || ga->kind != TP_ARG_TENSOR || em_type(e, g)->rank == 0 || tp_type_numel(em_type(e, g)) == 1)
    return mul(e, gi, em_bcast_to(e, em_reshape(e, g, 0, NULL), t.rank, t.dims));
  return mul(e, gi, em_bcast_in_dim(e, em_reshape(e, g, 1, &t.dims[0]), &t, &m0));
}

/* multi_margin_loss_backward(grad_output, self, target, p, margin, weight?, reduction):
 * for class d != y with z = margin - x[y] + x[d] > 0: h = g (p = 1) or 2 g z,
 * times weight[y]; grad[d] = h, grad[y] -= h; g = 1 / (N D) (mean) or 1 / D. */
static void r_multi_margin_bw(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_type ot = *OUT0;
  tp_dtype ct = lw_opmath(ot.dt);
  int64_t red = lw_int(n, 6, 1);
  int64_t D = ot.rank ? ot.dims[ot.rank - 1] : 1, N = D ? tp_type_numel(&ot) / D : 0;
  if (N * D == 0) {
    o[0] = em_full(e, 0, OUT0);
    return;
  }
  int64_t nd[2] = {N, D}, m0 = 0;
  tp_type t = tp_type_make(ct, 2, nd), it = tp_type_make(TP_I64, 2, nd);
  tp_val x = em_reshape(e, lw_tensor(e, n, 1, ct), 2, nd);
  tp_val y = em_reshape(e, em_convert(e, lw_value(e, n, 2), TP_I64), 1, &N);
  tp_val hot = em_compare(e, "EQ", em_iota(e, &it, 1), em_bcast_in_dim(e, y, &it, &m0));
  int64_t one = 1;
  tp_val xy = em_reduce(e, em_select(e, hot, x, em_full(e, 0, &t)), em_const(e, 0, ct), &one, 1, "stablehlo.add");
  tp_val margin = em_convert(e, lw_operand(e, n, 4, &t), ct);
  tp_val z = add(e, sub(e, margin, em_bcast_in_dim(e, xy, &t, &m0)), x);
  double g = red == 1 ? 1.0 / (double)(N * D) : 1.0 / (double)D;
  /* p is a runtime scalar (1 or 2: the forward checked it) */
  tp_val p1 = em_compare(e, "EQ", em_convert(e, lw_operand(e, n, 3, &t), ct), em_full(e, 1, &t));
  tp_val h = em_select(e, p1, em_full(e, g, &t), mul(e, em_full(e, 2 * g, &t), z));
  if (lw_arg(n, 5)->kind == TP_ARG_TENSOR) {
    tp_val w = lw_tensor(e, n, 5, ct);
    int64_t d1 = 1;
    tp_val wy = em_gather_flat(e, em_reshape(e, w, 1, &D), y); /* weight[y] (N) */
    (void)d1;
    h = mul(e, h, em_bcast_in_dim(e, wy, &t, &m0));
  }
  tp_val on = em_binary(e, "stablehlo.and", em_unary(e, "stablehlo.not", hot), em_compare(e, "GT", z, em_full(e, 0, &t)));
  h = em_select(e, on, h, em_full(e, 0, &t));
  tp_val tot = em_reduce(e, h, em_const(e, 0, ct), &one, 1, "stablehlo.add");
  tp_val gi = em_select(e, hot, em_unary(e, "stablehlo.negate", em_bcast_in_dim(e, tot, &t, &m0)), h);
  gi = margin_grad_out(e, n, gi, red);
  o[0] = em_convert(e, em_reshape(e, gi, ot.rank, ot.dims), ot.dt);
}

/* multilabel_margin_loss_backward(grad_output, self, target, reduction, is_target):
 * targets of a row are target[0..k) up to the first -1; for each such t and
 * each non-target d with 1 - x[t] + x[d] > 0: grad[d] += g, grad[t] -= g. */
static void r_multilabel_margin_bw(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_type ot = *OUT0;
  tp_dtype ct = lw_opmath(ot.dt);
  int64_t red = lw_int(n, 3, 1);
  int64_t D = ot.rank ? ot.dims[ot.rank - 1] : 1, N = D ? tp_type_numel(&ot) / D : 0;
  if (N * D == 0) {
    o[0] = em_full(e, 0, OUT0);
    return;
  }
  int64_t nd[2] = {N, D}, nkd[3] = {N, D, D};
  tp_type t = tp_type_make(ct, 2, nd), it = tp_type_make(TP_I64, 2, nd);
  tp_type t3 = tp_type_make(ct, 3, nkd), b3 = tp_type_make(TP_BOOL, 3, nkd), i3 = tp_type_make(TP_I64, 3, nkd);
  tp_val x = em_reshape(e, lw_tensor(e, n, 1, ct), 2, nd);
  tp_val tg = em_reshape(e, em_convert(e, lw_value(e, n, 2), TP_I64), 2, nd);
  tp_val ist = em_compare(e, "NE", em_reshape(e, em_convert(e, lw_value(e, n, 4), ct), 2, nd), em_full(e, 0, &t));
  /* valid[k]: no -1 in target[0..k] */
  tp_val neg = em_convert(e, em_convert(e, em_compare(e, "LT", tg, em_full(e, 0, &it)), TP_U8), TP_I64);
  int64_t kdim[3] = {0, 1, 2};
  /* count of negatives at or before k: compare pairs (k, k') with k' <= k */
  tp_val kk = em_iota(e, &i3, 1), kp = em_iota(e, &i3, 2);
  int64_t mnk[2] = {0, 2};
  tp_val negb = em_bcast_in_dim(e, neg, &i3, mnk);
  tp_val before = em_select(e, em_compare(e, "LE", kp, kk), negb, em_full(e, 0, &i3));
  int64_t two = 2;
  tp_val valid = em_compare(e, "EQ", em_reduce(e, before, em_const_i(e, 0, TP_I64), &two, 1, "stablehlo.add"),
                            em_full(e, 0, &it)); /* (N, K) */
  (void)kdim;
  /* x[target_k] (N, K) */
  tp_val safe = em_clamp(e, em_const_i(e, 0, TP_I64), tg, em_const_i(e, D - 1, TP_I64));
  int64_t m0 = 0;
  tp_val rowoff = mul(e, em_iota(e, &it, 0), em_full(e, (double)D, &it));
  int64_t nn = N * D;
  tp_val xt = em_gather_flat(e, em_reshape(e, x, 1, &nn), add(e, rowoff, safe));
  /* z[n, k, d] = 1 - x[t_k] + x[d] */
  int64_t mk[2] = {0, 1}, md[2] = {0, 2};
  tp_val z = add(e, sub(e, em_full(e, 1, &t3), em_bcast_in_dim(e, xt, &t3, mk)), em_bcast_in_dim(e, x, &t3, md));
  tp_val on = em_binary(e, "stablehlo.and", em_bcast_in_dim(e, valid, &b3, mk),
                        em_unary(e, "stablehlo.not", em_bcast_in_dim(e, ist, &b3, md)));
  on = em_binary(e, "stablehlo.and", on, em_compare(e, "GT", z, em_full(e, 0, &t3)));
  tp_val onf = em_convert(e, em_convert(e, on, TP_U8), ct);
  double g = red == 1 ? 1.0 / (double)(N * D) : 1.0 / (double)D;
  int64_t one = 1;
  tp_val plus = em_reduce(e, onf, em_const(e, 0, ct), &one, 1, "stablehlo.add");  /* (N, D): per d */
  tp_val minus = em_reduce(e, onf, em_const(e, 0, ct), &two, 1, "stablehlo.add"); /* (N, K): per target */
  /* scatter minus onto target positions: hot[n, k, d] = (t_k == d) & valid */
  tp_val hot = em_binary(e, "stablehlo.and", em_compare(e, "EQ", em_bcast_in_dim(e, safe, &i3, mk), em_iota(e, &i3, 2)),
                         em_bcast_in_dim(e, valid, &b3, mk));
  tp_val mt = em_reduce(e, em_select(e, hot, em_bcast_in_dim(e, minus, &t3, mk), em_full(e, 0, &t3)), em_const(e, 0, ct),
                        &one, 1, "stablehlo.add");
  tp_val gi = mul(e, sub(e, plus, mt), em_full(e, g, &t));
  gi = margin_grad_out(e, n, gi, red);
  (void)m0;
  o[0] = em_convert(e, em_reshape(e, gi, ot.rank, ot.dims), ot.dt);
}

/* ---- _assert_async ------------------------------------------------------------------- */

/* _assert_async(self) / _assert_async.msg(self, assert_msg): the CPU kernel
 * raises RuntimeError when the one value is zero (is_nonzero: NaN counts as
 * nonzero, -0.0 as zero, a complex value when both parts are zero).  Reading
 * it here would make the host wait for the device, so the value is checked
 * on the device like an index (tp_node.check): the error surfaces at the next
 * read or synchronize, or right here with TORCH_PJRT_LAUNCH_BLOCKING=1, as
 * CUDA's asynchronous assert does.  The element count is known on the host:
 * an empty or many-valued tensor raises at once, as on the CPU. */
static void r_assert_async(tp_emit *e, const tp_node *n, tp_val *o) {
  (void)o;
  tp_val x = lw_value(e, n, 0);
  if (x < 0) return;
  tp_type t = *em_type(e, x);
  int64_t nel = tp_type_numel(&t);
  if (nel == 0) {
    em_fail(e, TP_INVALID_ARGUMENT, "Boolean value of Tensor with no values is ambiguous");
    return;
  }
  if (nel > 1) {
    em_fail(e, TP_INVALID_ARGUMENT, "Boolean value of Tensor with more than one value is ambiguous");
    return;
  }
  x = em_reshape(e, x, 0, NULL);
  tp_val ok;
  if (t.dt == TP_BOOL) {
    ok = x;
  } else if (tp_dtype_is_complex(t.dt)) {
    tp_val re, im;
    lw_complex_parts(e, x, &re, &im);
    tp_dtype pdt = em_type(e, re)->dt;
    ok = em_binary(e, "stablehlo.or", em_compare(e, "NE", re, em_const(e, 0, pdt)),
                   em_compare(e, "NE", im, em_const(e, 0, pdt)));
  } else {
    ok = em_compare(e, "NE", x, em_const(e, 0, t.dt));
  }
  const char *msg = "Expected Tensor with single nonzero value, but got zero";
  if (lw_arg(n, 1)->kind == TP_ARG_STR) {
    const char *m = lw_str(n, 1, "");
    msg = m[0] ? m : "Assertion is failed";
  }
  lw_check_text(e, n, em_convert(e, ok, TP_I64), 1, 2, TP_INVALID_ARGUMENT, msg);
}

/* tp::custom(text, callee, tensors...): a user's op with a StableHLO body
 * (torch_pjrt.library).  The body's functions (private, their symbols made
 * unique to the body there) join the program's module, and the op is a call
 * of its entry function `callee` on the tensors; the results are typed as
 * PyTorch's fake function gives them (n->outs), which the verifier checks
 * against the function's signature.  Eager programs and compiled graphs
 * lower it alike: in a graph the call is inlined into the one program. */
static void r_custom(tp_emit *e, const tp_node *n, tp_val *o) {
  const char *text = lw_str(n, 0, NULL), *callee = lw_str(n, 1, NULL);
  if (!text || !callee || n->nouts < 1) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "tp::custom: expected a body, its entry function's name and a result");
    return;
  }
  int nin = n->nargs - 2;
  tp_val *in = malloc(sizeof(tp_val) * (size_t)(nin > 0 ? nin : 1));
  if (!in) {
    o[0] = em_fail(e, TP_RESOURCE_EXHAUSTED, "out of memory building a program");
    return;
  }
  for (int i = 0; i < nin; i++) in[i] = lw_value(e, n, i + 2);
  if (!em_failed(e) && em_add_function(e, text) == 0) em_call(e, callee, in, nin, n->outs, n->nouts, o);
  free(in);
}

const tp_lower_entry tp_lower_misc[] = {
    {"tp::custom", r_custom, 0},
    {"aten::_assert_async", r_assert_async, 0},
    {"aten::_assert_async.msg", r_assert_async, 0},
    {"aten::multi_margin_loss_backward", r_multi_margin_bw, 0},
    {"aten::multilabel_margin_loss_backward", r_multilabel_margin_bw, 0},
    {"aten::replication_pad1d_backward", r_replication_pad_bw, 0},
    {"aten::replication_pad2d_backward", r_replication_pad_bw, 0},
    {"aten::replication_pad3d_backward", r_replication_pad_bw, 0},
    {"aten::embedding_renorm_", r_embedding_renorm, 0},
    {"aten::embedding_renorm", r_embedding_renorm, 0},
    {"aten::_cdist_forward", r_cdist, 0},
    {"aten::_cdist_backward", r_cdist_backward, 0},
    {"aten::_pdist_forward", r_pdist, 0},
    {"aten::_pdist_backward", r_pdist_backward, 0},
    {"aten::searchsorted.Tensor", r_searchsorted, 0},
    {"aten::searchsorted.Scalar", r_searchsorted, 0},
    {"aten::addr", r_addr, 0},
    {"aten::linalg_cross", r_linalg_cross, 0},
    {NULL, NULL, 0},
};

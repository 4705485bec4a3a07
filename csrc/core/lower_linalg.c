/* lower_linalg.c - linear algebra: LU (partial pivoting), solves, inverse,
 * determinants, Cholesky, triangular solves, Householder QR, symmetric
 * eigendecomposition and SVD.
 *
 * Conventions:
 *  - Every rule flattens the batch dims to one: matrices are [B, m, n].
 *    Output shapes and dtypes come from PyTorch's meta functions (n->outs).
 *  - Real inputs compute in f64 (float32 inputs too: PyTorch's float32 LAPACK
 *    results are then matched within float32 rounding) and round once at the
 *    end.  Complex inputs are refused (lw_tensor).
 *  - Factorisations are while loops (em_while_*) over columns or over Jacobi
 *    pairs; a step touches rows/columns at a runtime index with
 *    em_dyn_slice / em_dyn_update_slice, and per-batch pivots with selects on
 *    one-hot masks (never products with 0/1, which would turn inf into NaN).
 *  - LU: LAPACK's getrf conventions: pivot = first row of largest |a| at or
 *    below the diagonal, 1-based int32 pivots, unit-lower L below the
 *    diagonal, info = first zero pivot (1-based), 0 if none.
 *  - QR: LAPACK's geqrf/dlarfg conventions (R's diagonal is -sign(a) * norm;
 *    tau = 0 when the column below the diagonal is already zero).
 *  - eigh: cyclic Jacobi, eigenvalues ascending; SVD: one-sided Jacobi
 *    (Hestenes) on the columns of the taller orientation, singular values
 *    descending; both rotate all pairs of a round-robin schedule at once; U (and Vh for wide inputs) are completed to orthonormal bases
 *    by a Householder QR of the computed vectors.  Both loops run sweeps
 *    until no pair was more than 1e-15 off (relative), at most 40 sweeps.
 *    Eigen/singular vector signs are whatever Jacobi gives (PyTorch
 *    documents them as unspecified; its OpInfos compare sign-invariant
 *    quantities). */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "lower_util.h"

#define WDT TP_F64 /* working dtype */
#define MAX_SWEEPS 40

/* ---- small helpers ------------------------------------------------------------ */

static tp_val add(tp_emit *e, tp_val a, tp_val b) { return lw_bin(e, "stablehlo.add", a, b); }
static tp_val sub(tp_emit *e, tp_val a, tp_val b) { return lw_bin(e, "stablehlo.subtract", a, b); }
static tp_val mul(tp_emit *e, tp_val a, tp_val b) { return lw_bin(e, "stablehlo.multiply", a, b); }
static tp_val dvd(tp_emit *e, tp_val a, tp_val b) { return lw_bin(e, "stablehlo.divide", a, b); }
static tp_val un(tp_emit *e, const char *op, tp_val a) { return em_unary(e, op, a); }
static tp_val cmp(tp_emit *e, const char *dir, tp_val a, tp_val b) {
  const tp_type *ta = em_type(e, a), *tb = em_type(e, b);
  if (ta->rank == 0 && tb->rank > 0) a = em_bcast_to(e, a, tb->rank, tb->dims);
  else if (tb->rank == 0 && ta->rank > 0) b = em_bcast_to(e, b, ta->rank, ta->dims);
  return em_compare(e, dir, a, b);
}
static tp_val land(tp_emit *e, tp_val a, tp_val b) { return em_binary(e, "stablehlo.and", a, b); }
static tp_val kf(tp_emit *e, double v) { return em_const(e, v, WDT); }
static tp_val ki(tp_emit *e, int64_t v) { return em_const_i(e, v, TP_I64); }
static const tp_type *ty(tp_emit *e, tp_val v) { return em_type(e, v); }

/* select(pred, a, b) where pred/a/b may be of lower rank than the result type
 * of `like`: each is broadcast to it with the given dim map (NULL: same rank). */
static tp_val bmap(tp_emit *e, tp_val x, const tp_type *like, const int64_t *map) {
  tp_type t = *like;
  t.dt = ty(e, x)->dt;
  return em_bcast_in_dim(e, x, &t, map);
}
static tp_val sel(tp_emit *e, tp_val p, tp_val a, tp_val b) {
  /* broadcast rank-0 operands to the largest operand */
  tp_type tp = *ty(e, p), ta = *ty(e, a), tb = *ty(e, b); /* copies: emitting moves the type table */
  tp_type t = tp;
  if (ta.rank > t.rank) t = ta;
  if (tb.rank > t.rank) t = tb;
  if (tp.rank == 0 && t.rank) p = em_bcast_to(e, p, t.rank, t.dims);
  if (ta.rank == 0 && t.rank) a = em_bcast_to(e, a, t.rank, t.dims);
  if (tb.rank == 0 && t.rank) b = em_bcast_to(e, b, t.rank, t.dims);
  return em_select(e, p, a, b);
}

static tp_type t2(tp_dtype dt, int64_t a, int64_t b) {
  int64_t d[2] = {a, b};
  return tp_type_make(dt, 2, d);
}
static tp_type t3(tp_dtype dt, int64_t a, int64_t b, int64_t c) {
  int64_t d[3] = {a, b, c};
  return tp_type_make(dt, 3, d);
}

/* [B, len] i64 iota along dim 1; [B, m, n] iotas along rows / columns. */
static tp_val iota2(tp_emit *e, int64_t B, int64_t len) {
  tp_type t = t2(TP_I64, B, len);
  return em_iota(e, &t, 1);
}
static tp_val iota3(tp_emit *e, int64_t B, int64_t m, int64_t n, int dim) {
  tp_type t = t3(TP_I64, B, m, n);
  return em_iota(e, &t, dim);
}

/* Broadcasts into [B,m,n]: x [B,n] along rows, [B,m] along columns, [B] everywhere. */
static const int64_t MAP_ROW[2] = {0, 2}, MAP_COL[2] = {0, 1}, MAP_B[1] = {0};
static tp_val as_rows(tp_emit *e, tp_val x, int64_t m) {
  const tp_type *s = ty(e, x);
  tp_type t = t3(s->dt, s->dims[0], m, s->dims[1]);
  return em_bcast_in_dim(e, x, &t, MAP_ROW);
}
static tp_val as_cols(tp_emit *e, tp_val x, int64_t n) {
  const tp_type *s = ty(e, x);
  tp_type t = t3(s->dt, s->dims[0], s->dims[1], n);
  return em_bcast_in_dim(e, x, &t, MAP_COL);
}
/* x [B] -> like's shape (rank 2 or 3) */
static tp_val per_batch(tp_emit *e, tp_val x, tp_val like) { return bmap(e, x, ty(e, like), MAP_B); }

static tp_val sum_dim(tp_emit *e, tp_val x, int d) {
  int64_t dd = d;
  return em_reduce(e, x, em_const(e, 0, ty(e, x)->dt), &dd, 1, "stablehlo.add");
}
static tp_val max_all(tp_emit *e, tp_val x) {
  const tp_type *t = ty(e, x);
  int64_t dims[TP_MAX_RANK];
  int r = t->rank;
  for (int i = 0; i < r; i++) dims[i] = i;
  return em_reduce(e, x, em_const(e, 0, t->dt), dims, r, "stablehlo.maximum");
}

/* Batched matrix product [B,m,k] x [B,k,n]. */
static tp_val bmm(tp_emit *e, tp_val a, tp_val b) {
  const int64_t lb[1] = {0}, rb[1] = {0}, lc[1] = {2}, rc[1] = {1};
  return em_dot(e, a, b, lb, rb, 1, lc, rc, 1, ty(e, a)->dt);
}
static tp_val tr(tp_emit *e, tp_val a) {
  const int64_t p[3] = {0, 2, 1};
  return em_transpose(e, a, p);
}
static tp_val eye(tp_emit *e, int64_t B, int64_t m, int64_t n, tp_dtype dt) {
  tp_val eq = em_compare(e, "EQ", iota3(e, B, m, n, 1), iota3(e, B, m, n, 2));
  return em_convert(e, eq, dt);
}

/* Column j / row i of [B,m,n] at a runtime rank-0 i64 index, as [B,m] / [B,n]. */
static tp_val col(tp_emit *e, tp_val A, tp_val j) {
  const tp_type *t = ty(e, A);
  int64_t B = t->dims[0], m = t->dims[1];
  tp_val z = ki(e, 0);
  tp_val st[3] = {z, z, j};
  int64_t sz[3] = {B, m, 1};
  tp_val c = em_dyn_slice(e, A, st, sz);
  int64_t d[2] = {B, m};
  return em_reshape(e, c, 2, d);
}
static tp_val row(tp_emit *e, tp_val A, tp_val i) {
  const tp_type *t = ty(e, A);
  int64_t B = t->dims[0], n = t->dims[2];
  tp_val z = ki(e, 0);
  tp_val st[3] = {z, i, z};
  int64_t sz[3] = {B, 1, n};
  tp_val r = em_dyn_slice(e, A, st, sz);
  int64_t d[2] = {B, n};
  return em_reshape(e, r, 2, d);
}
static tp_val set_col(tp_emit *e, tp_val A, tp_val j, tp_val v) {
  const tp_type *t = ty(e, v);
  int64_t d[3] = {t->dims[0], t->dims[1], 1};
  v = em_reshape(e, v, 3, d);
  tp_val z = ki(e, 0);
  tp_val st[3] = {z, z, j};
  return em_dyn_update_slice(e, A, v, st);
}
/* Element j of [B,len] as [B]. */
static tp_val elem(tp_emit *e, tp_val x, tp_val j) {
  const tp_type *t = ty(e, x);
  int64_t B = t->dims[0];
  tp_val st[2] = {ki(e, 0), j};
  int64_t sz[2] = {B, 1};
  tp_val r = em_dyn_slice(e, x, st, sz);
  return em_reshape(e, r, 1, &B);
}
static tp_val set_elem(tp_emit *e, tp_val x, tp_val j, tp_val v) {
  const tp_type *t = ty(e, v);
  int64_t d[2] = {t->dims[0], 1};
  v = em_reshape(e, v, 2, d);
  tp_val st[2] = {ki(e, 0), j};
  return em_dyn_update_slice(e, x, v, st);
}
/* The diagonal of [B,m,n] as [B,min(m,n)]. */
static tp_val diag(tp_emit *e, tp_val A) {
  const tp_type *t = ty(e, A);
  int64_t B = t->dims[0], m = t->dims[1], n = t->dims[2], k = m < n ? m : n;
  tp_val mask = em_compare(e, "EQ", iota3(e, B, m, n, 1), iota3(e, B, m, n, 2));
  tp_val z = lw_full_like(e, A, 0);
  tp_val d = sum_dim(e, em_select(e, mask, A, z), 2); /* [B,m]: row i's diagonal entry */
  int64_t s0[2] = {0, 0}, s1[2] = {B, k};
  return em_slice(e, d, s0, s1, NULL);
}
/* Lower (lower=1) or upper triangle of [B,m,n], with offset k like torch.tril/triu. */
static tp_val tri(tp_emit *e, tp_val A, int lower, int64_t k) {
  const tp_type *t = ty(e, A);
  int64_t B = t->dims[0], m = t->dims[1], n = t->dims[2];
  tp_val r = iota3(e, B, m, n, 1), c = iota3(e, B, m, n, 2);
  tp_val rk = add(e, r, ki(e, k));
  tp_val keep = lower ? em_compare(e, "LE", c, rk) : em_compare(e, "GE", c, rk);
  return em_select(e, keep, A, lw_full_like(e, A, 0));
}
static tp_val set_diag_one(tp_emit *e, tp_val A) {
  const tp_type *t = ty(e, A);
  int64_t B = t->dims[0], m = t->dims[1], n = t->dims[2];
  tp_val mask = em_compare(e, "EQ", iota3(e, B, m, n, 1), iota3(e, B, m, n, 2));
  return em_select(e, mask, lw_full_like(e, A, 1), A);
}

/* sign(x) with sign(0) = +1 */
static tp_val sgn1(tp_emit *e, tp_val x) {
  tp_val neg = cmp(e, "LT", x, kf(e, 0));
  return sel(e, neg, lw_full_like(e, x, -1), lw_full_like(e, x, 1));
}

/* ---- batch plumbing ------------------------------------------------------------- */

/* A tensor argument (rank >= 2) as [B, m, n] in the working dtype. */
static tp_val mat_arg(tp_emit *e, const tp_node *n, int i, int64_t *B, int64_t *m, int64_t *k) {
  const tp_arg *a = lw_arg(n, i);
  if (a->kind != TP_ARG_TENSOR) return em_fail(e, TP_INVALID_ARGUMENT, "%s: argument %d must be a tensor", n->op, i);
  tp_type tt = *ty(e, a->v), *t = &tt; /* a copy: lw_tensor emits, which moves the type table */
  if (t->rank < 2)
    return em_fail(e, TP_INVALID_ARGUMENT, "%s: expected a tensor with 2 or more dimensions, got %d", n->op, t->rank);
  tp_val v = lw_tensor(e, n, i, WDT);
  int64_t b = 1;
  for (int d = 0; d < t->rank - 2; d++) b *= t->dims[d];
  *B = b;
  *m = t->dims[t->rank - 2];
  *k = t->dims[t->rank - 1];
  int64_t dims[3] = {b, *m, *k};
  return em_reshape(e, v, 3, dims);
}

/* Broadcast a tensor argument's batch dims to `bdims` and flatten: [B, r, c]. */
static tp_val mat_arg_bcast(tp_emit *e, const tp_node *n, int i, int brank, const int64_t *bdims, tp_dtype dt) {
  tp_val v = lw_tensor(e, n, i, dt);
  const tp_type *t = ty(e, v);
  int64_t dims[TP_MAX_RANK];
  for (int d = 0; d < brank; d++) dims[d] = bdims[d];
  dims[brank] = t->dims[t->rank - 2];
  dims[brank + 1] = t->dims[t->rank - 1];
  v = em_bcast_to(e, v, brank + 2, dims);
  int64_t B = 1;
  for (int d = 0; d < brank; d++) B *= bdims[d];
  int64_t f[3] = {B, dims[brank], dims[brank + 1]};
  return em_reshape(e, v, 3, f);
}

/* Value v as output i (reshape to its dims, convert to its dtype). */
static tp_val out_as(tp_emit *e, const tp_node *n, int i, tp_val v) {
  const tp_type *o = &n->outs[i];
  v = em_convert(e, v, o->dt);
  return em_reshape(e, v, o->rank, o->dims);
}
static tp_val zeros_out(tp_emit *e, const tp_node *n, int i) { return em_full(e, 0, &n->outs[i]); }

static int is_real_float(tp_dtype d) { return d == TP_F32 || d == TP_F64; }
static int check_float(tp_emit *e, const tp_node *n, int i) {
  tp_dtype d = lw_dtype(e, n, i);
  if (tp_dtype_is_complex(d)) {
    em_fail(e, TP_UNIMPLEMENTED, "%s: complex inputs are not supported on tpu yet", n->op);
    return 0;
  }
  if (!is_real_float(d)) {
    em_fail(e, TP_UNIMPLEMENTED, "%s: dtype %s is not supported (float32 and float64 are)", n->op, tp_dtype_name(d));
    return 0;
  }
  return 1;
}

/* ---- permutations --------------------------------------------------------------- */

/* perm [B,m] i64 with entries j and p[b] swapped (p: [B] i64; j rank-0). */
static tp_val swap_entries(tp_emit *e, tp_val perm, tp_val j, tp_val p) {
  const tp_type *t = ty(e, perm);
  int64_t B = t->dims[0], m = t->dims[1];
  tp_val io = iota2(e, B, m);
  tp_val ohj = cmp(e, "EQ", io, j);
  tp_val ohp = em_compare(e, "EQ", io, per_batch(e, p, io));
  tp_val pj = elem(e, perm, j);
  tp_val pp = sum_dim(e, em_select(e, ohp, perm, lw_full_like(e, perm, 0)), 1);
  return em_select(e, ohj, per_batch(e, pp, perm), em_select(e, ohp, per_batch(e, pj, perm), perm));
}

/* Row order from LAPACK pivots: perm[i] = the row of A that ends in row i of
 * L*U (applying the swaps piv[0..k) in order to 0..m-1).  piv: [B,k] 1-based. */
static tp_val perm_from_pivots(tp_emit *e, tp_val piv, int64_t m) {
  const tp_type *t = ty(e, piv);
  int64_t B = t->dims[0], k = t->dims[1];
  tp_val perm = iota2(e, B, m);
  if (k == 0 || B == 0 || m == 0) return perm;
  piv = em_convert(e, piv, TP_I64);
  tp_val init[2] = {ki(e, 0), perm}, a[2], b[2], out[2];
  em_loop L;
  if (em_while_begin(e, &L, init, 2, a)) return -1;
  if (em_while_body(e, &L, cmp(e, "LT", a[0], ki(e, k)), b)) return -1;
  tp_val p = sub(e, elem(e, piv, b[0]), ki(e, 1));
  p = em_clamp(e, ki(e, 0), p, ki(e, m - 1));
  tp_val next[2] = {add(e, b[0], ki(e, 1)), swap_entries(e, b[1], b[0], p)};
  if (em_while_end(e, &L, next, out)) return -1;
  return out[1];
}

/* Rows of X [B,m,c] gathered by perm [B,m] (i64): Y[b,i,:] = X[b,perm[b,i],:]. */
static tp_val gather_rows(tp_emit *e, tp_val X, tp_val perm) {
  const tp_type *t = ty(e, X);
  int64_t B = t->dims[0], m = t->dims[1], c = t->dims[2];
  if (B * m * c == 0) return X;
  tp_val bi = iota3(e, B, m, c, 0), ci = iota3(e, B, m, c, 2);
  tp_val pr = as_cols(e, perm, c);
  tp_val lin = add(e, mul(e, bi, ki(e, m * c)), add(e, mul(e, pr, ki(e, c)), ci));
  int64_t tot = B * m * c;
  tp_val flat = em_reshape(e, X, 1, &tot);
  return em_gather_flat(e, flat, lin);
}
/* The inverse permutation: inv[perm[i]] = i. */
static tp_val invert_perm(tp_emit *e, tp_val perm) {
  const tp_type *t = ty(e, perm);
  int64_t B = t->dims[0], m = t->dims[1];
  tp_val ri = iota3(e, B, m, m, 1), ci = iota3(e, B, m, m, 2);
  tp_val hit = em_compare(e, "EQ", as_cols(e, perm, m), ci); /* [b,i,c]: perm[i]==c */
  return sum_dim(e, em_select(e, hit, ri, lw_full_like(e, ri, 0)), 1);
}
/* Permutation matrix P with A = P (LU): P[r,c] = (perm[c] == r). */
static tp_val perm_matrix(tp_emit *e, tp_val perm, tp_dtype dt) {
  const tp_type *t = ty(e, perm);
  int64_t B = t->dims[0], m = t->dims[1];
  tp_val hit = em_compare(e, "EQ", as_rows(e, perm, m), iota3(e, B, m, m, 1));
  return em_convert(e, hit, dt);
}

/* ---- LU with partial pivoting ------------------------------------------------------ */

typedef struct lu_res {
  tp_val lu, piv, perm, info; /* [B,m,n] WDT, [B,k] i32, [B,m] i64, [B] i32 */
} lu_res;

static lu_res lu_factor(tp_emit *e, tp_val A) {
  const tp_type *t = ty(e, A);
  int64_t B = t->dims[0], m = t->dims[1], n = t->dims[2], k = m < n ? m : n;
  lu_res r;
  r.lu = A;
  tp_type pt = t2(TP_I32, B, k);
  r.piv = em_full(e, 0, &pt);
  r.perm = iota2(e, B, m);
  tp_type it = tp_type_make(TP_I32, 1, &B);
  r.info = em_full(e, 0, &it);
  if (B == 0 || k == 0) {
    /* pivots of an empty factorisation: 1..k */
    r.piv = em_convert(e, add(e, iota2(e, B, k), ki(e, 1)), TP_I32);
    return r;
  }
  tp_val init[5] = {ki(e, 0), A, r.piv, r.perm, r.info}, a[5], b[5], out[5];
  em_loop L;
  if (em_while_begin(e, &L, init, 5, a)) return r;
  if (em_while_body(e, &L, cmp(e, "LT", a[0], ki(e, k)), b)) return r;
  tp_val j = b[0], M = b[1], piv = b[2], perm = b[3], info = b[4];
  tp_val rows = iota2(e, B, m);
  tp_val cj = col(e, M, j);
  /* candidate |a| at or below the diagonal; -1 elsewhere */
  tp_val cand = sel(e, cmp(e, "GE", rows, j), un(e, "stablehlo.abs", cj), kf(e, -1));
  tp_val mx, p;
  em_argreduce(e, cand, 1, 1, &mx, &p); /* p: [B] i64, first max */
  /* swap rows j and p */
  tp_val ohj = cmp(e, "EQ", rows, j), ohp = em_compare(e, "EQ", rows, per_batch(e, p, rows));
  tp_val rj = row(e, M, j);
  tp_val ohp3 = as_cols(e, ohp, n), ohj3 = as_cols(e, ohj, n);
  tp_val rp = sum_dim(e, em_select(e, ohp3, M, lw_full_like(e, M, 0)), 1);
  M = em_select(e, ohj3, as_rows(e, rp, m), em_select(e, ohp3, as_rows(e, rj, m), M));
  perm = swap_entries(e, perm, j, p);
  piv = set_elem(e, piv, j, em_convert(e, add(e, p, ki(e, 1)), TP_I32));
  /* eliminate below the pivot */
  tp_val d = elem(e, rp, j); /* [B] */
  tp_val dz = cmp(e, "EQ", d, kf(e, 0));
  tp_val jp1 = em_convert(e, add(e, j, ki(e, 1)), TP_I32);
  info = sel(e, land(e, dz, cmp(e, "EQ", info, em_const_i(e, 0, TP_I32))), jp1, info);
  tp_val cj2 = col(e, M, j);
  tp_val below = cmp(e, "GT", rows, j);
  tp_val l = sel(e, per_batch(e, dz, cj2), cj2, dvd(e, cj2, per_batch(e, d, cj2)));
  l = sel(e, below, l, kf(e, 0));
  tp_val cols = iota2(e, B, n);
  tp_val after = cmp(e, "GT", cols, j);
  tp_val u = sel(e, after, rp, kf(e, 0));
  tp_val upd = sub(e, M, mul(e, as_cols(e, l, n), as_rows(e, u, m)));
  tp_val mask = land(e, as_cols(e, below, n), as_rows(e, after, m));
  M = em_select(e, mask, upd, M);
  M = set_col(e, M, j, sel(e, below, l, cj2));
  tp_val next[5] = {add(e, j, ki(e, 1)), M, piv, perm, info};
  if (em_while_end(e, &L, next, out)) return r;
  r.lu = out[1];
  r.piv = out[2];
  r.perm = out[3];
  r.info = out[4];
  return r;
}

/* ---- triangular solves ------------------------------------------------------------- */

/* Solve op(T) X = Y (left) or X op(T) = Y (right) for triangular T [B,k,k];
 * only T's `lower` triangle is read; unit: diagonal taken as 1. */
static tp_val trsolve(tp_emit *e, tp_val T, tp_val Y, int left, int lower, int unit, int transpose) {
  tp_type out = *ty(e, Y); /* a copy: tri and set_diag_one emit */
  if (tp_type_numel(&out) == 0 || tp_type_numel(ty(e, T)) == 0) return Y;
  T = tri(e, T, lower, 0);
  if (unit) T = set_diag_one(e, T);
  char attrs[256];
  snprintf(attrs, sizeof attrs,
           "left_side = %s, lower = %s, unit_diagonal = %s, transpose_a = #stablehlo<transpose %s>",
           left ? "true" : "false", lower ? "true" : "false", unit ? "true" : "false",
           transpose ? "TRANSPOSE" : "NO_TRANSPOSE");
  tp_val in[2] = {T, Y};
  return em_op(e, "stablehlo.triangular_solve", attrs, in, 2, &out);
}

/* Solve A X = Y (adjoint: A^T X = Y) from A's LU factors and row order perm. */
static tp_val lu_solve_left(tp_emit *e, tp_val LU, tp_val perm, tp_val Y, int adjoint) {
  if (!adjoint) {
    tp_val Z = gather_rows(e, Y, perm);
    Z = trsolve(e, LU, Z, 1, 1, 1, 0);
    return trsolve(e, LU, Z, 1, 0, 0, 0);
  }
  tp_val Z = trsolve(e, LU, Y, 1, 0, 0, 1);
  Z = trsolve(e, LU, Z, 1, 1, 1, 1);
  return gather_rows(e, Z, invert_perm(e, perm));
}
static tp_val lu_solve_any(tp_emit *e, tp_val LU, tp_val perm, tp_val Y, int left, int adjoint) {
  if (left) return lu_solve_left(e, LU, perm, Y, adjoint);
  /* X A = Y  <=>  A^T X^T = Y^T */
  return tr(e, lu_solve_left(e, LU, perm, tr(e, Y), !adjoint));
}

/* ---- LU rules ------------------------------------------------------------------------ */

static void r_lu_factor_ex(tp_emit *e, const tp_node *n, tp_val *o) {
  if (!check_float(e, n, 0)) return;
  if (!lw_bool(n, 1, 1)) {
    em_fail(e, TP_UNIMPLEMENTED, "%s: LU without pivoting is not supported (PyTorch's CPU does not support it)", n->op);
    return;
  }
  int64_t B, m, k;
  tp_val A = mat_arg(e, n, 0, &B, &m, &k);
  lu_res r = lu_factor(e, A);
  o[0] = out_as(e, n, 0, r.lu);
  o[1] = out_as(e, n, 1, r.piv);
  o[2] = out_as(e, n, 2, r.info);
}

/* P [B,m,m], L [B,m,k], U [B,k,n] from LU [B,m,n] and perm. */
static void unpack(tp_emit *e, const tp_node *n, tp_val LU, tp_val perm, int want_p, int want_lu, tp_val *o) {
  const tp_type *t = ty(e, LU);
  int64_t B = t->dims[0], m = t->dims[1], nn = t->dims[2], k = m < nn ? m : nn;
  o[0] = want_p ? out_as(e, n, 0, perm_matrix(e, perm, WDT)) : zeros_out(e, n, 0);
  if (!want_lu) {
    o[1] = zeros_out(e, n, 1);
    o[2] = zeros_out(e, n, 2);
    return;
  }
  int64_t s0[3] = {0, 0, 0}, sl[3] = {B, m, k}, su[3] = {B, k, nn};
  tp_val Lp = em_slice(e, LU, s0, sl, NULL);
  tp_val Up = em_slice(e, LU, s0, su, NULL);
  o[1] = out_as(e, n, 1, set_diag_one(e, tri(e, Lp, 1, -1)));
  o[2] = out_as(e, n, 2, tri(e, Up, 0, 0));
}

static void r_linalg_lu(tp_emit *e, const tp_node *n, tp_val *o) {
  if (!check_float(e, n, 0)) return;
  if (!lw_bool(n, 1, 1)) {
    em_fail(e, TP_UNIMPLEMENTED, "%s: LU without pivoting is not supported (PyTorch's CPU does not support it)", n->op);
    return;
  }
  int64_t B, m, k;
  tp_val A = mat_arg(e, n, 0, &B, &m, &k);
  lu_res r = lu_factor(e, A);
  unpack(e, n, r.lu, r.perm, 1, 1, o);
}

static void r_lu_unpack(tp_emit *e, const tp_node *n, tp_val *o) {
  if (!check_float(e, n, 0)) return;
  int64_t B, m, k;
  tp_val LU = mat_arg(e, n, 0, &B, &m, &k);
  int want_lu = lw_bool(n, 2, 1), want_p = lw_bool(n, 3, 1);
  tp_val perm = -1;
  if (want_p) {
    tp_val piv = lw_value(e, n, 1);
    const tp_type *pt = ty(e, piv);
    int64_t kk = pt->rank ? pt->dims[pt->rank - 1] : 1;
    int64_t d[2] = {B, kk};
    piv = em_reshape(e, piv, 2, d);
    perm = perm_from_pivots(e, piv, m);
  }
  unpack(e, n, LU, perm, want_p, want_lu, o);
}

/* Batch dims of output i (its rank minus `core` trailing dims). */
static int out_batch(const tp_node *n, int i, int core, int64_t *bd) {
  int br = n->outs[i].rank - core;
  for (int d = 0; d < br; d++) bd[d] = n->outs[i].dims[d];
  return br;
}

static void r_lu_solve(tp_emit *e, const tp_node *n, tp_val *o) {
  if (!check_float(e, n, 0) || !check_float(e, n, 2)) return;
  int left = lw_bool(n, 3, 1), adjoint = lw_bool(n, 4, 0);
  int64_t bd[TP_MAX_RANK] = {0};
  int br = out_batch(n, 0, 2, bd);
  tp_val LU = mat_arg_bcast(e, n, 0, br, bd, WDT);
  tp_val Y = mat_arg_bcast(e, n, 2, br, bd, WDT);
  /* pivots [*, k]: broadcast to the batch too */
  tp_val piv = lw_value(e, n, 1);
  const tp_type *pt = ty(e, piv);
  int64_t kk = pt->dims[pt->rank - 1];
  int64_t pd[TP_MAX_RANK];
  for (int d = 0; d < br; d++) pd[d] = bd[d];
  pd[br] = kk;
  piv = em_bcast_to(e, piv, br + 1, pd);
  int64_t B = ty(e, LU)->dims[0], m = ty(e, LU)->dims[1];
  int64_t f[2] = {B, kk};
  piv = em_reshape(e, piv, 2, f);
  tp_val perm = perm_from_pivots(e, piv, m);
  o[0] = out_as(e, n, 0, lu_solve_any(e, LU, perm, Y, left, adjoint));
}

/* _linalg_solve_ex(A, B, left, check_errors) -> (result, LU, pivots, info) */
static void r_solve_ex(tp_emit *e, const tp_node *n, tp_val *o) {
  if (!check_float(e, n, 0) || !check_float(e, n, 1)) return;
  int left = lw_bool(n, 2, 1);
  int64_t B, m, k;
  tp_val A = mat_arg(e, n, 0, &B, &m, &k);
  lu_res r = lu_factor(e, A);
  o[1] = out_as(e, n, 1, r.lu);
  o[2] = out_as(e, n, 2, r.piv);
  o[3] = out_as(e, n, 3, r.info);
  /* result batch = broadcast of A's and B's batch dims */
  const tp_type *at = ty(e, lw_arg(n, 0)->v);
  const tp_type *rt = &n->outs[0];
  int vec = rt->rank == at->rank - 1; /* B is a (batch of) vector(s) */
  int br = vec ? rt->rank - 1 : rt->rank - 2;
  int64_t bd[TP_MAX_RANK] = {0};
  for (int d = 0; d < br; d++) bd[d] = rt->dims[d];
  int64_t RB = 1;
  for (int d = 0; d < br; d++) RB *= bd[d];
  /* A's factors broadcast to the result's batch */
  int abr = at->rank - 2;
  int64_t ad[TP_MAX_RANK], full[TP_MAX_RANK];
  for (int d = 0; d < abr; d++) ad[d] = at->dims[d];
  for (int d = 0; d < br; d++) full[d] = bd[d];
  ad[abr] = ad[abr + 1] = full[br] = full[br + 1] = m;
  tp_val LUb = em_bcast_to(e, em_reshape(e, r.lu, abr + 2, ad), br + 2, full);
  int64_t f3[3] = {RB, m, m};
  LUb = em_reshape(e, LUb, 3, f3);
  tp_val Pb = em_bcast_to(e, em_reshape(e, r.perm, abr + 1, ad), br + 1, full);
  int64_t f2[2] = {RB, m};
  Pb = em_reshape(e, Pb, 2, f2);
  tp_val Y = lw_tensor(e, n, 1, WDT);
  const tp_type *yt = ty(e, Y);
  int64_t yd[TP_MAX_RANK];
  int64_t ncol;
  if (vec) {
    for (int d = 0; d < br; d++) yd[d] = bd[d];
    yd[br] = m;
    Y = em_bcast_to(e, Y, br + 1, yd);
    ncol = 1;
  } else {
    ncol = left ? yt->dims[yt->rank - 1] : yt->dims[yt->rank - 2];
    for (int d = 0; d < br; d++) yd[d] = bd[d];
    yd[br] = yt->dims[yt->rank - 2];
    yd[br + 1] = yt->dims[yt->rank - 1];
    Y = em_bcast_to(e, Y, br + 2, yd);
  }
  int64_t y3[3] = {RB, left ? m : ncol, left ? ncol : m};
  if (vec) {
    y3[1] = left ? m : 1;
    y3[2] = left ? 1 : m;
  }
  Y = em_reshape(e, Y, 3, y3);
  tp_val X = (RB * m == 0) ? Y : lu_solve_any(e, LUb, Pb, Y, left, 0);
  o[0] = out_as(e, n, 0, X);
}

static void r_inv_ex(tp_emit *e, const tp_node *n, tp_val *o) {
  if (!check_float(e, n, 0)) return;
  int64_t B, m, k;
  tp_val A = mat_arg(e, n, 0, &B, &m, &k);
  lu_res r = lu_factor(e, A);
  tp_val I = eye(e, B, m, m, WDT);
  tp_val X = (B * m == 0) ? I : lu_solve_left(e, r.lu, r.perm, I, 0);
  o[0] = out_as(e, n, 0, X);
  o[1] = out_as(e, n, 1, r.info);
}

/* det from LU: prod(diag) * (-1)^(#pivots that swap) */
static tp_val pivot_sign(tp_emit *e, tp_val piv) {
  const tp_type *t = ty(e, piv);
  int64_t B = t->dims[0], k = t->dims[1];
  tp_val self = em_convert(e, add(e, iota2(e, B, k), ki(e, 1)), TP_I32);
  tp_val sw = em_convert(e, em_compare(e, "NE", piv, self), TP_I64);
  tp_val cnt = sum_dim(e, sw, 1);
  tp_val odd = cmp(e, "EQ", em_binary(e, "stablehlo.and", cnt, lw_full_like(e, cnt, 1)), ki(e, 1));
  return sel(e, odd, kf(e, -1), kf(e, 1));
}

static void r_det(tp_emit *e, const tp_node *n, tp_val *o) {
  if (!check_float(e, n, 0)) return;
  int64_t B, m, k;
  tp_val A = mat_arg(e, n, 0, &B, &m, &k);
  lu_res r = lu_factor(e, A);
  int64_t red = 1;
  tp_val prod = em_reduce(e, diag(e, r.lu), kf(e, 1), &red, 1, "stablehlo.multiply");
  o[0] = out_as(e, n, 0, mul(e, prod, pivot_sign(e, r.piv)));
  o[1] = out_as(e, n, 1, r.lu);
  o[2] = out_as(e, n, 2, r.piv);
}

static void r_slogdet(tp_emit *e, const tp_node *n, tp_val *o) {
  if (!check_float(e, n, 0)) return;
  int64_t B, m, k;
  tp_val A = mat_arg(e, n, 0, &B, &m, &k);
  lu_res r = lu_factor(e, A);
  tp_val d = diag(e, r.lu);
  int64_t red = 1;
  tp_val sg = em_reduce(e, un(e, "stablehlo.sign", d), kf(e, 1), &red, 1, "stablehlo.multiply");
  sg = mul(e, sg, pivot_sign(e, r.piv));
  tp_val la = sum_dim(e, un(e, "stablehlo.log", un(e, "stablehlo.abs", d)), 1);
  o[0] = out_as(e, n, 0, sg);
  o[1] = out_as(e, n, 1, la);
  o[2] = out_as(e, n, 2, r.lu);
  o[3] = out_as(e, n, 3, r.piv);
}

/* ---- triangular solve rules ------------------------------------------------------------ */

/* triangular_solve(self=B, A, upper, transpose, unitriangular) -> (X, A clone) */
static void r_triangular_solve(tp_emit *e, const tp_node *n, tp_val *o) {
  if (!check_float(e, n, 0) || !check_float(e, n, 1)) return;
  int upper = lw_bool(n, 2, 1), trans = lw_bool(n, 3, 0), unit = lw_bool(n, 4, 0);
  int64_t bd[TP_MAX_RANK] = {0};
  int br = out_batch(n, 0, 2, bd);
  tp_val Y = mat_arg_bcast(e, n, 0, br, bd, WDT);
  tp_val A = mat_arg_bcast(e, n, 1, br, bd, WDT);
  o[0] = out_as(e, n, 0, trsolve(e, A, Y, 1, !upper, unit, trans));
  o[1] = out_as(e, n, 1, A);
}

/* linalg_solve_triangular(A, B, upper, left, unitriangular) */
static void r_solve_triangular(tp_emit *e, const tp_node *n, tp_val *o) {
  if (!check_float(e, n, 0) || !check_float(e, n, 1)) return;
  int upper = lw_bool(n, 2, 0), left = lw_bool(n, 3, 1), unit = lw_bool(n, 4, 0);
  int64_t bd[TP_MAX_RANK] = {0};
  int br = out_batch(n, 0, 2, bd);
  tp_val A = mat_arg_bcast(e, n, 0, br, bd, WDT);
  tp_val Y = mat_arg_bcast(e, n, 1, br, bd, WDT);
  o[0] = out_as(e, n, 0, trsolve(e, A, Y, left, !upper, unit, 0));
}

/* ---- Cholesky ------------------------------------------------------------------------------ */

/* Lower Cholesky factor of the symmetric matrix whose lower triangle A holds;
 * info = first j (1-based) whose pivot is not positive (NaN included).  On
 * failure at column j the result is LAPACK's (potf2): columns before j hold
 * L, the diagonal entry j the failed pivot value, and the rest of the lower
 * triangle the input. */
static void cholesky(tp_emit *e, tp_val A, tp_val *Lout, tp_val *info_out) {
  const tp_type *t = ty(e, A);
  int64_t B = t->dims[0], nn = t->dims[1];
  tp_type it = tp_type_make(TP_I32, 1, &B), ft = tp_type_make(WDT, 1, &B);
  tp_val info = em_full(e, 0, &it);
  if (B == 0 || nn == 0) {
    *Lout = A;
    *info_out = info;
    return;
  }
  tp_val init[4] = {ki(e, 0), A, info, em_full(e, 0, &ft)}, a[4], b[4], out[4];
  em_loop L;
  if (em_while_begin(e, &L, init, 4, a)) return;
  if (em_while_body(e, &L, cmp(e, "LT", a[0], ki(e, nn)), b)) return;
  tp_val j = b[0], M = b[1], dfail = b[3];
  info = b[2];
  tp_val rows = iota2(e, B, nn);
  tp_val cj = col(e, M, j);
  tp_val d = elem(e, cj, j);
  tp_val ok = cmp(e, "GT", d, kf(e, 0)); /* false for NaN too */
  tp_val first = land(e, cmp(e, "EQ", info, em_const_i(e, 0, TP_I32)), un(e, "stablehlo.not", ok));
  tp_val jp1 = em_convert(e, add(e, j, ki(e, 1)), TP_I32);
  info = sel(e, first, jp1, info);
  dfail = sel(e, first, d, dfail);
  tp_val s = un(e, "stablehlo.sqrt", d);
  tp_val below = cmp(e, "GT", rows, j);
  tp_val l = sel(e, below, dvd(e, cj, per_batch(e, s, cj)), kf(e, 0));
  tp_val upd = sub(e, M, mul(e, as_cols(e, l, nn), as_rows(e, l, nn)));
  tp_val mask = land(e, as_cols(e, below, nn), as_rows(e, below, nn));
  M = em_select(e, mask, upd, M);
  tp_val newc = sel(e, below, l, sel(e, cmp(e, "EQ", rows, j), per_batch(e, s, cj), kf(e, 0)));
  M = set_col(e, M, j, newc);
  tp_val next[4] = {add(e, j, ki(e, 1)), M, info, dfail};
  if (em_while_end(e, &L, next, out)) return;
  info = out[2];
  tp_val f = sub(e, em_convert(e, info, TP_I64), ki(e, 1)); /* failed column, -1 if none */
  tp_val fb = per_batch(e, f, A);
  tp_val ri = iota3(e, B, nn, nn, 1), ci = iota3(e, B, nn, nn, 2);
  tp_val keep = em_binary(e, "stablehlo.or", cmp(e, "LT", fb, ki(e, 0)), em_compare(e, "LT", ci, fb));
  tp_val atf = land(e, em_compare(e, "EQ", ri, fb), em_compare(e, "EQ", ci, fb));
  tp_val res = em_select(e, keep, out[1], em_select(e, atf, per_batch(e, out[3], A), A));
  *Lout = tri(e, res, 1, 0);
  *info_out = info;
}

static void r_cholesky_ex(tp_emit *e, const tp_node *n, tp_val *o) {
  if (!check_float(e, n, 0)) return;
  int upper = lw_bool(n, 1, 0);
  int64_t B, m, k;
  tp_val A = mat_arg(e, n, 0, &B, &m, &k);
  if (upper) A = tr(e, A);
  tp_val Lf = -1, info = -1;
  cholesky(e, A, &Lf, &info);
  if (upper) Lf = tr(e, Lf);
  o[0] = out_as(e, n, 0, Lf);
  if (n->nouts > 1) o[1] = out_as(e, n, 1, info);
}

static void r_cholesky_inverse(tp_emit *e, const tp_node *n, tp_val *o) {
  if (!check_float(e, n, 0)) return;
  int upper = lw_bool(n, 1, 0);
  int64_t B, m, k;
  tp_val F = mat_arg(e, n, 0, &B, &m, &k);
  tp_val I = eye(e, B, m, m, WDT);
  /* A = L L^T: A^-1 = L^-T L^-1 = X^T X with X = L^-1; A = U^T U: Y Y^T with Y = U^-1 */
  tp_val X = trsolve(e, F, I, 1, !upper, 0, 0);
  o[0] = out_as(e, n, 0, upper ? bmm(e, X, tr(e, X)) : bmm(e, tr(e, X), X));
}

/* _cholesky_solve_helper(self=B, A=factor, upper) */
static void r_cholesky_solve(tp_emit *e, const tp_node *n, tp_val *o) {
  if (!check_float(e, n, 0) || !check_float(e, n, 1)) return;
  int upper = lw_bool(n, 2, 0);
  int64_t bd[TP_MAX_RANK] = {0};
  int br = out_batch(n, 0, 2, bd);
  tp_val Y = mat_arg_bcast(e, n, 0, br, bd, WDT);
  tp_val F = mat_arg_bcast(e, n, 1, br, bd, WDT);
  tp_val X;
  if (!upper) X = trsolve(e, F, trsolve(e, F, Y, 1, 1, 0, 0), 1, 1, 0, 1);
  else X = trsolve(e, F, trsolve(e, F, Y, 1, 0, 0, 1), 1, 0, 0, 0);
  o[0] = out_as(e, n, 0, X);
}

/* ---- Householder QR ------------------------------------------------------------------------- */

/* geqrf: A [B,m,n] -> (R above/on the diagonal, reflectors below; tau [B,k]). */
static void geqrf(tp_emit *e, tp_val A, tp_val *out_a, tp_val *out_tau) {
  const tp_type *t = ty(e, A);
  int64_t B = t->dims[0], m = t->dims[1], n = t->dims[2], k = m < n ? m : n;
  tp_type tt = t2(WDT, B, k);
  tp_val tau = em_full(e, 0, &tt);
  if (B == 0 || k == 0) {
    *out_a = A;
    *out_tau = tau;
    return;
  }
  tp_val init[3] = {ki(e, 0), A, tau}, a[3], b[3], out[3];
  em_loop L;
  if (em_while_begin(e, &L, init, 3, a)) return;
  if (em_while_body(e, &L, cmp(e, "LT", a[0], ki(e, k)), b)) return;
  tp_val j = b[0], M = b[1];
  tau = b[2];
  tp_val rows = iota2(e, B, m);
  tp_val cj = col(e, M, j);
  tp_val below = cmp(e, "GT", rows, j), atj = cmp(e, "EQ", rows, j);
  tp_val x = sel(e, below, cj, kf(e, 0));
  tp_val alpha = elem(e, cj, j);
  tp_val xn2 = sum_dim(e, mul(e, x, x), 1);
  tp_val xn = un(e, "stablehlo.sqrt", xn2);
  tp_val zero = cmp(e, "EQ", xn, kf(e, 0));
  tp_val nrm = un(e, "stablehlo.sqrt", add(e, mul(e, alpha, alpha), xn2));
  /* hypot without overflow for moderate values; inputs are f32-ranged in f64 */
  tp_val beta = mul(e, un(e, "stablehlo.negate", sgn1(e, alpha)), nrm);
  tp_val tj = sel(e, zero, kf(e, 0), dvd(e, sub(e, beta, alpha), beta));
  tp_val scale = sel(e, zero, kf(e, 0), dvd(e, kf(e, 1), sub(e, alpha, beta)));
  tp_val v = sel(e, atj, kf(e, 1), mul(e, x, per_batch(e, scale, x))); /* [B,m] */
  /* apply H = I - tau v v^T to the columns after j */
  tp_val w = sum_dim(e, mul(e, as_cols(e, v, n), M), 1); /* [B,n] = v^T M */
  tp_val cols = iota2(e, B, n);
  tp_val after = cmp(e, "GT", cols, j);
  tp_val upd = sub(e, M, mul(e, as_cols(e, mul(e, v, per_batch(e, tj, v)), n), as_rows(e, w, m)));
  M = em_select(e, as_rows(e, after, m), upd, M);
  tp_val newc = sel(e, per_batch(e, zero, cj), cj, sel(e, atj, per_batch(e, beta, cj), sel(e, below, v, cj)));
  M = set_col(e, M, j, newc);
  tau = set_elem(e, tau, j, tj);
  tp_val next[3] = {add(e, j, ki(e, 1)), M, tau};
  if (em_while_end(e, &L, next, out)) return;
  *out_a = out[1];
  *out_tau = out[2];
}

/* Apply Q = H_0 H_1 ... H_{k-1} (reflectors in the columns of V [B,m,*], tau
 * [B,k]) to C: left ? op(Q) C : C op(Q), op = transpose if trans. */
static tp_val apply_q(tp_emit *e, tp_val V, tp_val tau, tp_val C, int left, int trans) {
  const tp_type *vt = ty(e, V), *ct = ty(e, C);
  int64_t B = vt->dims[0], m = vt->dims[1], k = ty(e, tau)->dims[1];
  int64_t c_m = ct->dims[1], c_n = ct->dims[2];
  if (B == 0 || k == 0 || tp_type_numel(ct) == 0) return C;
  int down = left ? !trans : trans; /* j = k-1 .. 0 */
  tp_val init[2] = {ki(e, 0), C}, a[2], b[2], out[2];
  em_loop L;
  if (em_while_begin(e, &L, init, 2, a)) return -1;
  if (em_while_body(e, &L, cmp(e, "LT", a[0], ki(e, k)), b)) return -1;
  tp_val j = down ? sub(e, ki(e, k - 1), b[0]) : b[0];
  tp_val X = b[1];
  tp_val rows = iota2(e, B, m);
  tp_val cj = col(e, V, j);
  tp_val v = sel(e, cmp(e, "GT", rows, j), cj, sel(e, cmp(e, "EQ", rows, j), kf(e, 1), kf(e, 0)));
  tp_val tj = elem(e, tau, j);
  tp_val tv = mul(e, v, per_batch(e, tj, v));
  if (left) { /* X - tau v (v^T X) */
    tp_val w = sum_dim(e, mul(e, as_cols(e, v, c_n), X), 1);
    X = sub(e, X, mul(e, as_cols(e, tv, c_n), as_rows(e, w, c_m)));
  } else { /* X - tau (X v) v^T */
    tp_val w = sum_dim(e, mul(e, as_rows(e, v, c_m), X), 2);
    X = sub(e, X, mul(e, as_cols(e, w, c_n), as_rows(e, tv, c_m)));
  }
  tp_val next[2] = {add(e, b[0], ki(e, 1)), X};
  if (em_while_end(e, &L, next, out)) return -1;
  return out[1];
}

static void r_geqrf(tp_emit *e, const tp_node *n, tp_val *o) {
  if (!check_float(e, n, 0)) return;
  int64_t B, m, k;
  tp_val A = mat_arg(e, n, 0, &B, &m, &k);
  tp_val R = -1, tau = -1;
  geqrf(e, A, &R, &tau);
  o[0] = out_as(e, n, 0, R);
  o[1] = out_as(e, n, 1, tau);
}

static void r_linalg_qr(tp_emit *e, const tp_node *n, tp_val *o) {
  if (!check_float(e, n, 0)) return;
  const char *mode = lw_str(n, 1, "reduced");
  int complete = !strcmp(mode, "complete"), ronly = !strcmp(mode, "r");
  if (!complete && !ronly && strcmp(mode, "reduced")) {
    em_fail(e, TP_INVALID_ARGUMENT, "%s: qr received unrecognized mode '%s'", n->op, mode);
    return;
  }
  int64_t B, m, nn;
  tp_val A = mat_arg(e, n, 0, &B, &m, &nn);
  int64_t k = m < nn ? m : nn;
  tp_val F = -1, tau = -1;
  geqrf(e, A, &F, &tau);
  int64_t rrows = complete ? m : k;
  int64_t s0[3] = {0, 0, 0}, s1[3] = {B, rrows, nn};
  o[1] = out_as(e, n, 1, tri(e, em_slice(e, F, s0, s1, NULL), 0, 0));
  if (ronly) {
    o[0] = zeros_out(e, n, 0);
    return;
  }
  int64_t qc = complete ? m : k;
  o[0] = out_as(e, n, 0, apply_q(e, F, tau, eye(e, B, m, qc, WDT), 1, 0));
}

/* linalg_householder_product(input [m,n], tau [k]) -> Q[:, :n] */
static void r_householder_product(tp_emit *e, const tp_node *n, tp_val *o) {
  if (!check_float(e, n, 0) || !check_float(e, n, 1)) return;
  int64_t B, m, nn;
  tp_val V = mat_arg(e, n, 0, &B, &m, &nn);
  tp_val tau = lw_tensor(e, n, 1, WDT);
  int64_t kk = ty(e, tau)->dims[ty(e, tau)->rank - 1];
  int64_t d[2] = {B, kk};
  tau = em_reshape(e, tau, 2, d);
  o[0] = out_as(e, n, 0, apply_q(e, V, tau, eye(e, B, m, nn, WDT), 1, 0));
}

/* ormqr(input, tau, other, left, transpose) */
static void r_ormqr(tp_emit *e, const tp_node *n, tp_val *o) {
  if (!check_float(e, n, 0) || !check_float(e, n, 1) || !check_float(e, n, 2)) return;
  int left = lw_bool(n, 3, 1), trans = lw_bool(n, 4, 0);
  int64_t B, m, nn, B2, r, c;
  tp_val V = mat_arg(e, n, 0, &B, &m, &nn);
  tp_val C = mat_arg(e, n, 2, &B2, &r, &c);
  if (B2 != B) {
    em_fail(e, TP_INVALID_ARGUMENT, "%s: batch dimensions of input and other differ", n->op);
    return;
  }
  tp_val tau = lw_tensor(e, n, 1, WDT);
  int64_t kk = ty(e, tau)->dims[ty(e, tau)->rank - 1];
  int64_t d[2] = {B, kk};
  tau = em_reshape(e, tau, 2, d);
  o[0] = out_as(e, n, 0, apply_q(e, V, tau, C, left, trans));
}

/* ---- Jacobi iterations ------------------------------------------------------------------------ */

/* Parallel (round-robin) ordering: a sweep is N-1 steps (N = len rounded up
 * to even); in step r every index i is paired with partner(i) -- disjoint
 * pairs, each pair once per sweep -- and all pairs rotate at once.  With an
 * odd len, the index paired with the missing one is its own partner (no
 * rotation) in that step.  partner: [len] i64. */
static tp_val rr_partner(tp_emit *e, tp_val r, int64_t len) {
  int64_t N = len + (len & 1);
  tp_type t = tp_type_make(TP_I64, 1, &len);
  tp_val i = em_iota(e, &t, 0);
  tp_val rb = em_bcast_to(e, r, 1, &len);
  tp_val q = sub(e, add(e, mul(e, rb, ki(e, 2)), ki(e, 2 * (N - 1))), i);
  q = lw_bin(e, "stablehlo.remainder", q, ki(e, N - 1));
  tp_val part = sel(e, cmp(e, "EQ", i, ki(e, N - 1)), rb, sel(e, em_compare(e, "EQ", i, rb), ki(e, N - 1), q));
  return sel(e, cmp(e, "GE", part, ki(e, len)), i, part);
}

/* X [B,r,c] with rows (dim 1) or columns (dim 2) gathered by idx [len]. */
static tp_val gather_dim(tp_emit *e, tp_val X, tp_val idx, int dim) {
  const tp_type *t = ty(e, X);
  int64_t B = t->dims[0], r = t->dims[1], c = t->dims[2], tot = B * r * c;
  tp_type it = t3(TP_I64, B, r, c);
  int64_t map[1] = {dim};
  tp_val pi = em_bcast_in_dim(e, idx, &it, map);
  tp_val ri = dim == 1 ? pi : iota3(e, B, r, c, 1), ci = dim == 2 ? pi : iota3(e, B, r, c, 2);
  tp_val lin = add(e, mul(e, iota3(e, B, r, c, 0), ki(e, r * c)), add(e, mul(e, ri, ki(e, c)), ci));
  return em_gather_flat(e, em_reshape(e, X, 1, &tot), lin);
}
/* x [B,len] gathered by idx [len]; A [B,n,n] at (i, idx[i]) -> [B,n]. */
static tp_val gather_vec(tp_emit *e, tp_val x, tp_val idx) {
  const tp_type *t = ty(e, x);
  int64_t B = t->dims[0], len = t->dims[1], tot = B * len;
  tp_type it = t2(TP_I64, B, len);
  int64_t map[1] = {1};
  tp_val lin = add(e, mul(e, em_iota(e, &it, 0), ki(e, len)), em_bcast_in_dim(e, idx, &it, map));
  return em_gather_flat(e, em_reshape(e, x, 1, &tot), lin);
}
static tp_val gather_pairs(tp_emit *e, tp_val A, tp_val p, tp_val q) { /* A[b, p[i], q[i]] */
  const tp_type *t = ty(e, A);
  int64_t B = t->dims[0], n = t->dims[1], tot = B * n * n;
  tp_type it = t2(TP_I64, B, n);
  int64_t map[1] = {1};
  tp_val pb = em_bcast_in_dim(e, p, &it, map), qb = em_bcast_in_dim(e, q, &it, map);
  tp_val lin = add(e, mul(e, em_iota(e, &it, 0), ki(e, n * n)), add(e, mul(e, pb, ki(e, n)), qb));
  return em_gather_flat(e, em_reshape(e, A, 1, &tot), lin);
}

/* t = sign(z) / (|z| + sqrt(1 + z^2)) (sign(0) = 1), with z -> inf safe; c, s. */
static void rot_cs(tp_emit *e, tp_val z, tp_val active, tp_val *c, tp_val *s) {
  tp_val az = un(e, "stablehlo.abs", z);
  tp_val big = cmp(e, "GT", az, kf(e, 1e150));
  tp_val t = dvd(e, sgn1(e, z), add(e, az, un(e, "stablehlo.sqrt", add(e, mul(e, z, z), kf(e, 1)))));
  t = sel(e, big, dvd(e, kf(e, 0.5), z), t);
  tp_val cc = un(e, "stablehlo.rsqrt", add(e, mul(e, t, t), kf(e, 1)));
  tp_val ss = mul(e, t, cc);
  *c = sel(e, active, cc, kf(e, 1));
  *s = sel(e, active, ss, kf(e, 0));
}

/* Order of values [B,len] (descending or ascending; ties by index) as a 0/1
 * matrix S [B,len,len] with S[i, r] = 1 where r is i's rank; x S sorts x. */
static tp_val rank_matrix(tp_emit *e, tp_val x, int descending) {
  const tp_type *t = ty(e, x);
  int64_t B = t->dims[0], len = t->dims[1];
  tp_val xi = as_cols(e, x, len), xj = as_rows(e, x, len); /* [b,i,j] */
  tp_val ii = iota3(e, B, len, len, 1), jj = iota3(e, B, len, len, 2);
  tp_val before = em_compare(e, descending ? "GT" : "LT", xj, xi);
  tp_val tie = land(e, em_compare(e, "EQ", xj, xi), em_compare(e, "LT", jj, ii));
  tp_val cnt = sum_dim(e, em_convert(e, em_binary(e, "stablehlo.or", before, tie), TP_I64), 2); /* [B,len] rank */
  tp_val hit = em_compare(e, "EQ", as_cols(e, cnt, len), jj);
  return em_convert(e, hit, WDT);
}
/* x [B,len] and the columns of M [B,r,len] reordered by S (exact: one 1 per row/col). */
static tp_val reorder_vec(tp_emit *e, tp_val x, tp_val S) {
  const tp_type *t = ty(e, x);
  int64_t d3[3] = {t->dims[0], 1, t->dims[1]}, d2[2] = {t->dims[0], t->dims[1]};
  tp_val r = bmm(e, em_reshape(e, x, 3, d3), S);
  return em_reshape(e, r, 2, d2);
}

/* Symmetric eigendecomposition of A [B,n,n] (both triangles set): w [B,n]
 * ascending, V [B,n,n] (columns). */
static void eigh(tp_emit *e, tp_val A, int want_v, tp_val *w_out, tp_val *v_out) {
  const tp_type *t = ty(e, A);
  int64_t B = t->dims[0], nn = t->dims[1];
  tp_val V = eye(e, B, nn, nn, WDT);
  if (B > 0 && nn > 1) {
    int64_t steps = nn + (nn & 1) - 1; /* per sweep */
    tp_val nrm = un(e, "stablehlo.sqrt", sum_dim(e, sum_dim(e, mul(e, A, A), 2), 1)); /* [B] */
    tp_val init[6] = {A, V, ki(e, 0), ki(e, 0), kf(e, 0), em_const(e, 0, TP_BOOL)};
    tp_val a[6], b[6], out[6];
    em_loop L;
    if (em_while_begin(e, &L, init, 6, a)) return;
    tp_val go = land(e, un(e, "stablehlo.not", a[5]), cmp(e, "LT", a[3], ki(e, MAX_SWEEPS)));
    if (em_while_body(e, &L, go, b)) return;
    tp_val M = b[0], W = b[1], r = b[2], sweep = b[3], off = b[4];
    tp_val part = rr_partner(e, r, nn);
    tp_type it = tp_type_make(TP_I64, 1, &nn);
    tp_val idx = em_iota(e, &it, 0);
    tp_val lo1 = em_compare(e, "LT", idx, part);
    tp_val pi = em_select(e, lo1, idx, part), qi = em_select(e, lo1, part, idx);
    tp_val dv = diag(e, M);
    tp_val lower = bmap(e, lo1, ty(e, dv), (const int64_t[]){1}); /* [B,n]: i is the p of its pair */
    tp_val dp = gather_vec(e, dv, part);
    tp_val app = em_select(e, lower, dv, dp), aqq = em_select(e, lower, dp, dv);
    tp_val apq = gather_pairs(e, M, pi, qi);
    tp_val ne = em_compare(e, "NE", idx, part);
    tp_val paired = bmap(e, ne, ty(e, dv), (const int64_t[]){1});
    tp_val active = land(e, paired, cmp(e, "NE", apq, kf(e, 0)));
    tp_val z = dvd(e, sub(e, aqq, app), mul(e, kf(e, 2), sel(e, active, apq, kf(e, 1))));
    tp_val c, s;
    rot_cs(e, z, active, &c, &s);
    tp_val sg = em_select(e, lower, un(e, "stablehlo.negate", s), s);
    /* J^T A (rows), then (J^T A) J (columns); V J */
    M = add(e, mul(e, as_cols(e, c, nn), M), mul(e, as_cols(e, sg, nn), gather_dim(e, M, part, 1)));
    M = add(e, mul(e, as_rows(e, c, nn), M), mul(e, as_rows(e, sg, nn), gather_dim(e, M, part, 2)));
    if (want_v) W = add(e, mul(e, as_rows(e, c, nn), W), mul(e, as_rows(e, sg, nn), gather_dim(e, W, part, 2)));
    tp_val den = per_batch(e, sel(e, cmp(e, "EQ", nrm, kf(e, 0)), kf(e, 1), nrm), apq);
    tp_val rel = dvd(e, un(e, "stablehlo.abs", apq), den);
    off = em_binary(e, "stablehlo.maximum", off, max_all(e, rel));
    tp_val r1 = add(e, r, ki(e, 1));
    tp_val wrap = cmp(e, "EQ", r1, ki(e, steps));
    tp_val done = land(e, wrap, cmp(e, "LE", off, kf(e, 1e-15)));
    /* a NaN input never converges: stop after MAX_SWEEPS */
    tp_val next[6] = {M, W, sel(e, wrap, ki(e, 0), r1), sel(e, wrap, add(e, sweep, ki(e, 1)), sweep),
                      sel(e, wrap, kf(e, 0), off), done};
    if (em_while_end(e, &L, next, out)) return;
    A = out[0];
    V = out[1];
  }
  tp_val w = diag(e, A);
  if (nn > 1 && B > 0) {
    tp_val S = rank_matrix(e, w, 0);
    w = reorder_vec(e, w, S);
    if (want_v) V = bmm(e, V, S);
  }
  *w_out = w;
  *v_out = V;
}

static void r_eigh(tp_emit *e, const tp_node *n, tp_val *o) {
  if (!check_float(e, n, 0)) return;
  const char *uplo = lw_str(n, 1, "L");
  int want_v = lw_bool(n, 2, 1);
  int64_t B, m, k;
  tp_val A = mat_arg(e, n, 0, &B, &m, &k);
  if (m != k) {
    em_fail(e, TP_INVALID_ARGUMENT, "%s: A must be batches of square matrices", n->op);
    return;
  }
  int lower = uplo[0] == 'L' || uplo[0] == 'l';
  tp_val T = tri(e, A, lower, 0);
  tp_val S = add(e, T, tr(e, tri(e, A, lower, lower ? -1 : 1)));
  tp_val w = -1, V = -1;
  eigh(e, S, want_v, &w, &V);
  o[0] = out_as(e, n, 0, w);
  o[1] = want_v ? out_as(e, n, 1, V) : zeros_out(e, n, 1);
}

/* One-sided Jacobi on the columns of A [B,m,n] (m >= n): A V = U S.  Returns
 * s [B,n] descending, U [B,m,ucols] (ucols = n or m: completed to an
 * orthonormal basis) and V [B,n,n], columns in the order of s. */
static void svd_tall(tp_emit *e, tp_val A, int64_t ucols, int want_uv, tp_val *s_out, tp_val *u_out, tp_val *v_out) {
  const tp_type *t = ty(e, A);
  int64_t B = t->dims[0], m = t->dims[1], nn = t->dims[2];
  tp_val V = eye(e, B, nn, nn, WDT);
  if (B > 0 && nn > 1 && m > 0) {
    int64_t steps = nn + (nn & 1) - 1; /* per sweep */
    tp_val init[6] = {A, V, ki(e, 0), ki(e, 0), kf(e, 0), em_const(e, 0, TP_BOOL)};
    tp_val a[6], b[6], out[6];
    em_loop L;
    if (em_while_begin(e, &L, init, 6, a)) return;
    tp_val go = land(e, un(e, "stablehlo.not", a[5]), cmp(e, "LT", a[3], ki(e, MAX_SWEEPS)));
    if (em_while_body(e, &L, go, b)) return;
    tp_val M = b[0], W = b[1], r = b[2], sweep = b[3], off = b[4];
    tp_val part = rr_partner(e, r, nn);
    tp_type it = tp_type_make(TP_I64, 1, &nn);
    tp_val idx = em_iota(e, &it, 0);
    tp_val Mp = gather_dim(e, M, part, 2); /* partner columns */
    tp_val nrm2 = sum_dim(e, mul(e, M, M), 1), ga = sum_dim(e, mul(e, M, Mp), 1); /* [B,n] */
    tp_val lt = em_compare(e, "LT", idx, part);
    tp_val lower = bmap(e, lt, ty(e, nrm2), (const int64_t[]){1});
    tp_val np2 = gather_vec(e, nrm2, part);
    tp_val al = em_select(e, lower, nrm2, np2), be = em_select(e, lower, np2, nrm2);
    tp_val ne = em_compare(e, "NE", idx, part);
    tp_val paired = bmap(e, ne, ty(e, nrm2), (const int64_t[]){1});
    tp_val active = land(e, paired, cmp(e, "NE", ga, kf(e, 0)));
    tp_val z = dvd(e, sub(e, be, al), mul(e, kf(e, 2), sel(e, active, ga, kf(e, 1))));
    tp_val c, s;
    rot_cs(e, z, active, &c, &s);
    tp_val sg = em_select(e, lower, un(e, "stablehlo.negate", s), s);
    M = add(e, mul(e, as_rows(e, c, m), M), mul(e, as_rows(e, sg, m), Mp));
    if (want_uv) W = add(e, mul(e, as_rows(e, c, nn), W), mul(e, as_rows(e, sg, nn), gather_dim(e, W, part, 2)));
    tp_val den = un(e, "stablehlo.sqrt", mul(e, al, be));
    tp_val rel = sel(e, cmp(e, "GT", den, kf(e, 0)), dvd(e, un(e, "stablehlo.abs", ga), den), kf(e, 0));
    rel = sel(e, paired, rel, kf(e, 0));
    off = em_binary(e, "stablehlo.maximum", off, max_all(e, rel));
    tp_val r1 = add(e, r, ki(e, 1));
    tp_val wrap = cmp(e, "EQ", r1, ki(e, steps));
    tp_val done = land(e, wrap, cmp(e, "LE", off, kf(e, 1e-15)));
    tp_val next[6] = {M, W, sel(e, wrap, ki(e, 0), r1), sel(e, wrap, add(e, sweep, ki(e, 1)), sweep),
                      sel(e, wrap, kf(e, 0), off), done};
    if (em_while_end(e, &L, next, out)) return;
    A = out[0];
    V = out[1];
  }
  tp_val s = un(e, "stablehlo.sqrt", sum_dim(e, mul(e, A, A), 1)); /* [B,n] */
  tp_val S = -1;
  if (nn > 1 && B > 0) {
    S = rank_matrix(e, s, 1);
    s = reorder_vec(e, s, S);
  }
  *s_out = s;
  *u_out = *v_out = -1;
  if (!want_uv) return;
  if (S >= 0) {
    A = bmm(e, A, S);
    V = bmm(e, V, S);
  }
  /* U = A / s (0 where s = 0), completed by a Householder QR: Q's first
   * columns are +-U's (exactly U's up to rounding), the rest an orthonormal
   * complement; zero columns come last (s descending) and get complement vectors. */
  tp_val sb = as_rows(e, s, m);
  tp_val U = sel(e, cmp(e, "GT", sb, kf(e, 0)), dvd(e, A, sb), kf(e, 0));
  tp_val F = -1, tau = -1;
  geqrf(e, U, &F, &tau);
  tp_val Q = apply_q(e, F, tau, eye(e, B, m, ucols, WDT), 1, 0);
  /* sign fix: column j of Q times sign(R[j,j]) for j < n */
  int64_t k = m < nn ? m : nn;
  tp_val rd = diag(e, F); /* [B,k] */
  tp_val sg = sel(e, cmp(e, "LT", rd, kf(e, 0)), kf(e, -1), kf(e, 1));
  if (ucols > k) {
    tp_val pad = kf(e, 1);
    int64_t lo[2] = {0, 0}, hi[2] = {0, ucols - k};
    sg = em_pad(e, sg, pad, lo, hi, NULL);
  } else if (ucols < k) {
    int64_t s0[2] = {0, 0}, s1[2] = {B, ucols};
    sg = em_slice(e, sg, s0, s1, NULL);
  }
  *u_out = mul(e, Q, as_rows(e, sg, m));
  *v_out = V;
}

/* _linalg_svd(A, full_matrices, compute_uv, driver) -> (U, S, Vh) */
static void r_svd(tp_emit *e, const tp_node *n, tp_val *o) {
  if (!check_float(e, n, 0)) return;
  int full = lw_bool(n, 1, 0), want_uv = lw_bool(n, 2, 1);
  int64_t B, m, nn;
  tp_val A = mat_arg(e, n, 0, &B, &m, &nn);
  int64_t k = m < nn ? m : nn;
  if (B == 0 || k == 0) {
    /* empty: U / Vh are identities of their shapes where square (PyTorch: eye for the full bases) */
    o[0] = o[1] = o[2] = -1;
    for (int i = 0; i < 3; i++) {
      const tp_type *ot = &n->outs[i];
      if (i != 1 && want_uv && ot->rank >= 2) {
        int64_t r = ot->dims[ot->rank - 2], c = ot->dims[ot->rank - 1];
        o[i] = out_as(e, n, i, eye(e, B, r, c, WDT));
      } else {
        o[i] = zeros_out(e, n, i);
      }
    }
    return;
  }
  int wide = m < nn;
  tp_val X = wide ? tr(e, A) : A;
  int64_t tall = wide ? nn : m;
  tp_val s = -1, U = -1, V = -1;
  svd_tall(e, X, full ? tall : k, want_uv, &s, &U, &V);
  o[1] = out_as(e, n, 1, s);
  if (!want_uv) {
    o[0] = zeros_out(e, n, 0);
    o[2] = zeros_out(e, n, 2);
    return;
  }
  if (!wide) {
    o[0] = out_as(e, n, 0, U);
    o[2] = out_as(e, n, 2, tr(e, V));
  } else { /* A^T = U' S V'^T  =>  A = V' S U'^T */
    o[0] = out_as(e, n, 0, V);
    o[2] = out_as(e, n, 2, tr(e, U));
  }
}

/* ---- least squares ------------------------------------------------------------------------------------- */

/* Thin SVD of any [B,m,n]: s [B,k] descending, U [B,m,k], V [B,n,k]. */
static void svd_thin(tp_emit *e, tp_val A, tp_val *s, tp_val *U, tp_val *V) {
  const tp_type *t = ty(e, A);
  int64_t m = t->dims[1], nn = t->dims[2], k = m < nn ? m : nn;
  if (m >= nn) {
    svd_tall(e, A, k, 1, s, U, V);
  } else {
    svd_tall(e, tr(e, A), k, 1, s, V, U); /* A^T = V' S U'^T */
  }
}

/* linalg_lstsq(A, B, rcond, driver) -> (solution, residuals, rank, singular_values).
 * Every driver is computed from an SVD in f64: the minimum-norm solution with
 * singular values <= rcond * s_max dropped (gelsd/gelss; for a matrix of full
 * numerical rank, gels and gelsy give the same solution).  Output shapes come
 * from the Python meta function in _dispatch.py, which also empties the
 * residuals of a rank-deficient gelsd/gelss result like PyTorch does. */
static void r_lstsq(tp_emit *e, const tp_node *n, tp_val *o) {
  if (!check_float(e, n, 0) || !check_float(e, n, 1)) return;
  const char *driver = lw_str(n, 3, "gelsy");
  int gels = !strcmp(driver, "gels"), gelsy = !strcmp(driver, "gelsy");
  if (!gels && !gelsy && strcmp(driver, "gelsd") && strcmp(driver, "gelss")) {
    em_fail(e, TP_INVALID_ARGUMENT, "%s: parameter `driver` should be one of (gels, gelsy, gelsd, gelss)", n->op);
    return;
  }
  tp_type att = *ty(e, lw_arg(n, 0)->v), btt = *ty(e, lw_arg(n, 1)->v); /* copies: the rule emits */
  const tp_type *at = &att, *bt = &btt;
  int vec = bt->rank == at->rank - 1;
  int64_t m = at->dims[at->rank - 2], nn = at->dims[at->rank - 1], k = m < nn ? m : nn;
  int64_t ncol = vec ? 1 : bt->dims[bt->rank - 1];
  const tp_type *xt = &n->outs[0];
  int br = xt->rank - (vec ? 1 : 2);
  int64_t bd[TP_MAX_RANK] = {0};
  for (int d = 0; d < br; d++) bd[d] = xt->dims[d];
  int64_t RB = 1;
  for (int d = 0; d < br; d++) RB *= bd[d];
  tp_val A = mat_arg_bcast(e, n, 0, br, bd, WDT);
  tp_val Y = lw_tensor(e, n, 1, WDT);
  if (vec) { /* (*, m) -> (*, m, 1) */
    int64_t ud[TP_MAX_RANK];
    for (int d = 0; d < bt->rank; d++) ud[d] = bt->dims[d];
    ud[bt->rank] = 1;
    Y = em_reshape(e, Y, bt->rank + 1, ud);
  }
  int64_t yd[TP_MAX_RANK];
  for (int d = 0; d < br; d++) yd[d] = bd[d];
  yd[br] = m;
  yd[br + 1] = ncol;
  Y = em_bcast_to(e, Y, br + 2, yd);
  int64_t y3[3] = {RB, m, ncol};
  Y = em_reshape(e, Y, 3, y3);
  if (RB == 0 || k == 0) {
    /* nothing to solve: the solution is zero, residuals are |B|^2 */
    tp_type xt3 = t3(WDT, RB, nn, ncol);
    tp_val X = em_full(e, 0, &xt3);
    o[0] = out_as(e, n, 0, X);
    for (int i = 1; i < 4; i++) o[i] = zeros_out(e, n, i);
    if (tp_type_numel(&n->outs[1]) > 0) o[1] = out_as(e, n, 1, sum_dim(e, mul(e, Y, Y), 1));
    return;
  }
  tp_val sv = -1, U = -1, V = -1;
  svd_thin(e, A, &sv, &U, &V);
  /* rcond: None -> eps(dtype) * max(m, n); negative -> eps (LAPACK) */
  double eps = lw_dtype(e, n, 0) == TP_F64 ? 2.220446049250313e-16 : 1.1920928955078125e-07;
  double rc = lw_is_none(n, 2) ? eps * (double)(m > nn ? m : nn) : lw_float(n, 2, 0);
  if (rc < 0) rc = eps;
  int64_t s0[2] = {0, 0}, s1[2] = {RB, 1};
  tp_val smax = em_reshape(e, em_slice(e, sv, s0, s1, NULL), 1, &RB);
  tp_val keep = gels ? cmp(e, "GT", sv, kf(e, 0)) : em_compare(e, "GT", sv, per_batch(e, mul(e, smax, kf(e, rc)), sv));
  tp_val inv = sel(e, keep, dvd(e, kf(e, 1), sv), kf(e, 0)); /* [RB,k] */
  tp_val UtY = bmm(e, tr(e, U), Y);                          /* [RB,k,ncol] */
  tp_val X = bmm(e, V, mul(e, as_cols(e, inv, ncol), UtY));  /* [RB,n,ncol] */
  o[0] = out_as(e, n, 0, X);
  if (tp_type_numel(&n->outs[1]) > 0) {
    tp_val R = sub(e, bmm(e, A, X), Y);
    o[1] = out_as(e, n, 1, sum_dim(e, mul(e, R, R), 1));
  } else {
    o[1] = zeros_out(e, n, 1);
  }
  tp_val rank = sum_dim(e, em_convert(e, keep, TP_I64), 1);
  o[2] = tp_type_numel(&n->outs[2]) > 0 || n->outs[2].rank == 0 ? out_as(e, n, 2, rank) : zeros_out(e, n, 2);
  o[3] = tp_type_numel(&n->outs[3]) > 0 ? out_as(e, n, 3, sv) : zeros_out(e, n, 3);
}

/* ---- matrix exponential ------------------------------------------------------------------------------ */

/* exp(A) by scaling and squaring: X = A / 2^s with ||X||_1 <= 1, a degree-18
 * Taylor polynomial (truncation error below 1/19! ~ 8e-18, so exact in f64),
 * then s squarings (s per matrix; the loop runs to the largest s). */
static void r_matrix_exp(tp_emit *e, const tp_node *n, tp_val *o) {
  /* float16/bfloat16 too, computed in f64 like the others and rounded once.
   * (PyTorch's CPU kernel gets them wrong, NaN or far off: it reads its
   * double coefficient tables as f16/bf16.  CUDA computes them.) */
  tp_dtype d = lw_dtype(e, n, 0);
  if (d != TP_F16 && d != TP_BF16 && !check_float(e, n, 0)) return;
  int64_t B, m, k;
  tp_val A = mat_arg(e, n, 0, &B, &m, &k);
  if (m != k) {
    em_fail(e, TP_INVALID_ARGUMENT, "%s: expected a square matrix", n->op);
    return;
  }
  if (B * m == 0) {
    o[0] = out_as(e, n, 0, A);
    return;
  }
  tp_val norm1 = em_reduce(e, sum_dim(e, un(e, "stablehlo.abs", A), 1), kf(e, 0), (const int64_t[]){1}, 1,
                           "stablehlo.maximum"); /* [B] */
  tp_val sc = un(e, "stablehlo.ceil", dvd(e, un(e, "stablehlo.log", norm1), kf(e, log(2.0))));
  /* s in [0, 1100]; NaN (a NaN input) -> 0: the result is NaN anyway */
  tp_val isnan = cmp(e, "NE", sc, sc);
  sc = sel(e, isnan, kf(e, 0), em_clamp(e, kf(e, 0), sc, kf(e, 1100)));
  tp_val X = dvd(e, A, per_batch(e, un(e, "stablehlo.exponential", mul(e, sc, kf(e, log(2.0)))), A));
  /* Horner: T = I + X/1 (I + X/2 (I + ... (I + X/18))) */
  tp_val I = eye(e, B, m, m, WDT);
  tp_val T = I;
  for (int d = 18; d >= 1; d--) T = add(e, I, dvd(e, bmm(e, X, T), kf(e, d)));
  tp_val s_i = em_convert(e, sc, TP_I64);
  tp_val smax = em_reduce(e, s_i, ki(e, 0), (const int64_t[]){0}, 1, "stablehlo.maximum");
  tp_val init[2] = {ki(e, 0), T}, a[2], b[2], out[2];
  em_loop L;
  if (em_while_begin(e, &L, init, 2, a)) return;
  if (em_while_body(e, &L, cmp(e, "LT", a[0], smax), b)) return;
  tp_val sq = bmm(e, b[1], b[1]);
  tp_val go = cmp(e, "LT", b[0], s_i); /* i < s[b] */
  tp_val next[2] = {add(e, b[0], ki(e, 1)), em_select(e, per_batch(e, go, sq), sq, b[1])};
  if (em_while_end(e, &L, next, out)) return;
  o[0] = out_as(e, n, 0, out[1]);
}

/* ---- the table ------------------------------------------------------------------------------------ */

const tp_lower_entry tp_lower_linalg[] = {
    {"aten::linalg_lu_factor_ex", r_lu_factor_ex, 0},
    {"aten::linalg_lu", r_linalg_lu, 0},
    {"aten::lu_unpack", r_lu_unpack, 0},
    {"aten::linalg_lu_solve", r_lu_solve, 0},
    {"aten::_linalg_solve_ex", r_solve_ex, 0},
    {"aten::linalg_inv_ex", r_inv_ex, 0},
    {"aten::_linalg_det", r_det, 0},
    {"aten::_linalg_slogdet", r_slogdet, 0},
    {"aten::triangular_solve", r_triangular_solve, 0},
    {"aten::linalg_solve_triangular", r_solve_triangular, 0},
    {"aten::linalg_cholesky_ex", r_cholesky_ex, 0},
    {"aten::cholesky_inverse", r_cholesky_inverse, 0},
    {"aten::_cholesky_solve_helper", r_cholesky_solve, 0},
    {"aten::geqrf", r_geqrf, 0},
    {"aten::linalg_qr", r_linalg_qr, 0},
    {"aten::linalg_householder_product", r_householder_product, 0},
    {"aten::ormqr", r_ormqr, 0},
    {"aten::_linalg_eigh", r_eigh, 0},
    {"aten::_linalg_svd", r_svd, 0},
    {"aten::linalg_matrix_exp", r_matrix_exp, 0},
    {"aten::linalg_lstsq", r_lstsq, 0},
    {NULL, NULL, 0},
};

/* lower_nn.c - neural-network ops: normalisations, losses, convolution,
 * pooling and upsampling, with their backward ops.
 *
 * Conventions (see lower.h): arguments arrive in schema order; outputs must
 * have the shapes PyTorch's meta functions computed (n->outs).  Arithmetic
 * runs in lw_opmath(dtype) (f32 for f16/bf16) and is rounded once.
 *
 * Optional outputs: ops with an output_mask (the *_backward ops) return
 * None in PyTorch for masked-out outputs.  A rule writes zeros of the
 * declared type for an output that is masked out (or whose declared type is
 * an empty placeholder), so the caller may pass any placeholder tensor for
 * those outputs and ignore what comes back.
 *
 * Batch norm in training mode updates running_mean/running_var in place.
 * The rules return the updated statistics as outputs 3 and 4 when the
 * caller passes five outputs (as _native_batch_norm_legit_functional
 * declares); a caller that passes only three while asking for an update
 * gets an error, never silently stale statistics. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lower_util.h"

#define OUT(i) (&n->outs[i])

/* ---- small helpers ----------------------------------------------------------- */

/* A splat like `like`.  (The type is copied first: em_type's pointer does not
 * survive emitting, which lw_full_like/em_full do not account for.) */
static tp_val kf(tp_emit *e, tp_val like, double v) {
  tp_type t = *em_type(e, like);
  return em_full(e, v, &t);
}
static tp_val add(tp_emit *e, tp_val a, tp_val b) { return em_binary(e, "stablehlo.add", a, b); }
static tp_val sub(tp_emit *e, tp_val a, tp_val b) { return em_binary(e, "stablehlo.subtract", a, b); }
static tp_val mul(tp_emit *e, tp_val a, tp_val b) { return em_binary(e, "stablehlo.multiply", a, b); }
static tp_val dv(tp_emit *e, tp_val a, tp_val b) { return em_binary(e, "stablehlo.divide", a, b); }
static tp_val mulk(tp_emit *e, tp_val a, double k) { return mul(e, a, kf(e, a, k)); }
static int rank_of(tp_emit *e, tp_val v) { return em_type(e, v)->rank; }

static tp_val rsum(tp_emit *e, tp_val x, const int64_t *dims, int nd) {
  return em_reduce(e, x, em_const(e, 0, em_type(e, x)->dt), dims, nd, "stablehlo.add");
}

/* Broadcast v, whose dims are t's dims at positions map[0..rank(v)), to type t
 * (dtype of v kept). */
static tp_val bcast(tp_emit *e, tp_val v, const tp_type *t, const int64_t *map) {
  tp_type tt = *t;
  tt.dt = em_type(e, v)->dt;
  return em_bcast_in_dim(e, v, &tt, map);
}

/* The dims of 0..rank-1 that are not in `dims`, in order; returns how many. */
static int kept_dims(int rank, const int64_t *dims, int nd, int64_t *kept) {
  int k = 0;
  for (int i = 0; i < rank; i++) {
    int red = 0;
    for (int j = 0; j < nd; j++) red |= dims[j] == i;
    if (!red) kept[k++] = i;
  }
  return k;
}

/* Sum over `dims`, broadcast back to x's shape. */
static tp_val rsum_b(tp_emit *e, tp_val x, const int64_t *dims, int nd) {
  tp_type t = *em_type(e, x);
  int64_t kept[TP_MAX_RANK];
  kept_dims(t.rank, dims, nd, kept);
  return bcast(e, rsum(e, x, dims, nd), &t, kept);
}

/* A value of output i's shape and dtype from v (same element count). */
static tp_val as_out(tp_emit *e, const tp_node *n, int i, tp_val v) {
  v = em_reshape(e, v, n->outs[i].rank, n->outs[i].dims);
  return em_convert(e, v, n->outs[i].dt);
}

static int64_t numel_of(const tp_type *t) { return tp_type_numel(t); }

/* Entry i of the bool[] mask argument (true if absent). */
static int mask_bit(const tp_node *n, int arg, int i) {
  const int64_t *m;
  int k = lw_ints(n, arg, &m);
  return i < k ? m[i] != 0 : 1;
}

/* Optional outputs.  PyTorch returns None for some outputs of backward ops
 * (masked out, or no weight/bias); the caller passes only the defined ones,
 * in order.  def[i] says which are defined; slot[i] receives the index in
 * o[] of output i, or -1.  A caller that passes all k outputs anyway gets
 * zeros in the undefined ones (slot[i] = i, with def[i] = 0). */
static int map_outs(tp_emit *e, const tp_node *n, const int *def, int k, int *slot) {
  int cnt = 0;
  for (int i = 0; i < k; i++) cnt += def[i] != 0;
  if (n->nouts == cnt) {
    for (int i = 0, j = 0; i < k; i++) slot[i] = def[i] ? j++ : -1;
    return 1;
  }
  if (n->nouts == k) {
    for (int i = 0; i < k; i++) slot[i] = i;
    return 1;
  }
  em_fail(e, TP_INTERNAL, "%s: the caller passed %d outputs; expected the %d defined ones (or all %d)", n->op, n->nouts,
          cnt, k);
  return 0;
}

/* Write output i: v if it is defined, else zeros of the declared type. */
static void put_opt(tp_emit *e, const tp_node *n, tp_val *o, const int *slot, const int *def, int i, tp_val v) {
  int s = slot[i];
  if (s < 0) return;
  o[s] = def[i] ? as_out(e, n, s, v) : em_full(e, 0, OUT(s));
}

/* Optional tensor argument i as opmath dtype `ct` (or -1 if None). */
static tp_val opt_tensor(tp_emit *e, const tp_node *n, int i, tp_dtype ct) {
  if (lw_arg(n, i)->kind != TP_ARG_TENSOR) return -1;
  return lw_tensor(e, n, i, ct);
}

/* A rank-1 constant of i64 values. */
__attribute__((unused)) static tp_val const_i64(tp_emit *e, const int64_t *v, int64_t cnt) {
  size_t cap = 64 + (size_t)cnt * 24;
  char *s = malloc(cap);
  if (!s) return em_fail(e, TP_RESOURCE_EXHAUSTED, "out of memory building a program");
  size_t k = (size_t)snprintf(s, cap, "value = dense<[");
  for (int64_t i = 0; i < cnt; i++) k += (size_t)snprintf(s + k, cap - k, "%s%" PRId64, i ? ", " : "", v[i]);
  snprintf(s + k, cap - k, "]> : tensor<%" PRId64 "xi64>", cnt);
  tp_type t = tp_type_make(TP_I64, 1, &cnt);
  tp_val r = em_op(e, "stablehlo.constant", s, NULL, 0, &t);
  free(s);
  return r;
}

/* A rank-1 constant of floating values, in dtype dt (f32 or f64). */
__attribute__((unused)) static tp_val const_f(tp_emit *e, const double *v, int64_t cnt, tp_dtype dt) {
  size_t cap = 64 + (size_t)cnt * 28;
  char *s = malloc(cap);
  if (!s) return em_fail(e, TP_RESOURCE_EXHAUSTED, "out of memory building a program");
  int dbl = dt == TP_F64;
  size_t k = (size_t)snprintf(s, cap, "value = dense<[");
  for (int64_t i = 0; i < cnt; i++) {
    if (dbl) {
      uint64_t bits;
      memcpy(&bits, &v[i], 8);
      k += (size_t)snprintf(s + k, cap - k, "%s0x%016" PRIX64, i ? ", " : "", bits);
    } else {
      float f = (float)v[i];
      uint32_t bits;
      memcpy(&bits, &f, 4);
      k += (size_t)snprintf(s + k, cap - k, "%s0x%08" PRIX32, i ? ", " : "", bits);
    }
  }
  snprintf(s + k, cap - k, "]> : tensor<%" PRId64 "x%s>", cnt, dbl ? "f64" : "f32");
  tp_type t = tp_type_make(dbl ? TP_F64 : TP_F32, 1, &cnt);
  tp_val r = em_op(e, "stablehlo.constant", s, NULL, 0, &t);
  free(s);
  return em_convert(e, r, dt);
}

/* ---- layer norm ------------------------------------------------------------------ */

/* native_layer_norm(input, normalized_shape, weight?, bias?, eps) -> (out, mean, rstd) */
static void r_layer_norm(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x0 = lw_value(e, n, 0);
  tp_type t = *em_type(e, x0);
  const int64_t *ns;
  int nd = lw_ints(n, 1, &ns);
  int axis = t.rank - nd;
  if (axis < 0) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "native_layer_norm: normalized_shape has more dims than the input");
    return;
  }
  tp_dtype ct = lw_opmath(t.dt);
  t.dt = ct;
  tp_val x = em_convert(e, x0, ct);
  int64_t rd[TP_MAX_RANK], outer[TP_MAX_RANK], inner[TP_MAX_RANK];
  int64_t N = 1;
  for (int i = 0; i < nd; i++) {
    rd[i] = axis + i;
    inner[i] = axis + i;
    N *= t.dims[axis + i];
  }
  for (int i = 0; i < axis; i++) outer[i] = i;
  double invn = N ? 1.0 / (double)N : NAN;
  tp_val mean = mulk(e, rsum(e, x, rd, nd), invn);
  tp_val d = sub(e, x, bcast(e, mean, &t, outer));
  tp_val var = mulk(e, rsum(e, mul(e, d, d), rd, nd), invn);
  tp_val rstd = em_unary(e, "stablehlo.rsqrt", add(e, var, kf(e, var, lw_float(n, 4, 1e-5))));
  tp_val y = mul(e, d, bcast(e, rstd, &t, outer));
  tp_val w = opt_tensor(e, n, 2, ct), b = opt_tensor(e, n, 3, ct);
  if (w >= 0) y = mul(e, y, bcast(e, em_reshape(e, w, nd, t.dims + axis), &t, inner));
  if (b >= 0) y = add(e, y, bcast(e, em_reshape(e, b, nd, t.dims + axis), &t, inner));
  o[0] = em_convert(e, y, n->outs[0].dt);
  if (n->nouts > 1) o[1] = as_out(e, n, 1, mean);
  if (n->nouts > 2) o[2] = as_out(e, n, 2, rstd);
}

/* native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight?, bias?,
 * output_mask) -> (grad_input, grad_weight, grad_bias) */
static void r_layer_norm_backward(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x0 = lw_value(e, n, 1);
  tp_type t = *em_type(e, x0);
  const int64_t *ns;
  int nd = lw_ints(n, 2, &ns);
  int axis = t.rank - nd;
  if (axis < 0) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "native_layer_norm_backward: normalized_shape has more dims than the input");
    return;
  }
  tp_dtype ct = lw_opmath(t.dt);
  t.dt = ct;
  tp_val x = em_convert(e, x0, ct);
  tp_val dy = lw_operand(e, n, 0, &t);
  int64_t rd[TP_MAX_RANK], outer[TP_MAX_RANK], inner[TP_MAX_RANK];
  int64_t N = 1, M = 1;
  for (int i = 0; i < nd; i++) {
    rd[i] = inner[i] = axis + i;
    N *= t.dims[axis + i];
  }
  for (int i = 0; i < axis; i++) {
    outer[i] = i;
    M *= t.dims[i];
  }
  tp_val mean = em_reshape(e, lw_tensor(e, n, 3, ct), axis, t.dims);
  tp_val rstd = em_reshape(e, lw_tensor(e, n, 4, ct), axis, t.dims);
  tp_val rstd_b = bcast(e, rstd, &t, outer);
  tp_val xhat = mul(e, sub(e, x, bcast(e, mean, &t, outer)), rstd_b);
  tp_val w = opt_tensor(e, n, 5, ct);
  int def[3] = {mask_bit(n, 7, 0), mask_bit(n, 7, 1) && w >= 0, mask_bit(n, 7, 2) && lw_arg(n, 6)->kind == TP_ARG_TENSOR};
  int slot[3];
  if (!map_outs(e, n, def, 3, slot)) return;
  if (def[0] && slot[0] >= 0) {
    tp_val g = dy;
    if (w >= 0) g = mul(e, g, bcast(e, em_reshape(e, w, nd, t.dims + axis), &t, inner));
    tp_val sg = rsum_b(e, g, rd, nd), sgx = rsum_b(e, mul(e, g, xhat), rd, nd);
    double invn = N ? 1.0 / (double)N : 0.0;
    /* rstd * (g - (sum(g) + xhat * sum(g * xhat)) / N) */
    put_opt(e, n, o, slot, def, 0, mul(e, rstd_b, sub(e, g, mulk(e, add(e, sg, mul(e, xhat, sgx)), invn))));
  } else {
    put_opt(e, n, o, slot, def, 0, -1);
  }
  put_opt(e, n, o, slot, def, 1, def[1] && slot[1] >= 0 ? rsum(e, mul(e, dy, xhat), outer, axis) : -1);
  put_opt(e, n, o, slot, def, 2, def[2] && slot[2] >= 0 ? rsum(e, dy, outer, axis) : -1);
  (void)M;
}

/* ---- batch norm ------------------------------------------------------------------- */

/* Reduction dims of batch norm: all but dim 1. */
static int bn_dims(int rank, int64_t *rd) {
  int k = 0;
  for (int i = 0; i < rank; i++)
    if (i != 1) rd[k++] = i;
  return k;
}

/* Shared forward: argument indices (wi, bi, rmi, rvi: -1 for absent) and
 * the static training/momentum/eps. */
static void batch_norm(tp_emit *e, const tp_node *n, tp_val *o, int wi, int bi, int rmi, int rvi, int training,
                       double momentum, double eps) {
  tp_val x0 = lw_value(e, n, 0);
  tp_type t = *em_type(e, x0);
  if (t.rank < 2) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: expected an input with at least 2 dims, got %d", n->op, t.rank);
    return;
  }
  tp_dtype ct = lw_opmath(t.dt);
  t.dt = ct;
  tp_val x = em_convert(e, x0, ct);
  int64_t rd[TP_MAX_RANK], ch = 1;
  int nr = bn_dims(t.rank, rd);
  int64_t C = t.dims[1], cnt = C ? numel_of(&t) / C : 0;
  tp_val rm = rmi >= 0 ? opt_tensor(e, n, rmi, ct) : -1, rv = rvi >= 0 ? opt_tensor(e, n, rvi, ct) : -1;
  tp_val w = wi >= 0 ? opt_tensor(e, n, wi, ct) : -1, b = bi >= 0 ? opt_tensor(e, n, bi, ct) : -1;
  tp_val mean, invstd, new_rm = rm, new_rv = rv;
  if (training) {
    double invc = cnt ? 1.0 / (double)cnt : NAN;
    mean = mulk(e, rsum(e, x, rd, nr), invc);
    tp_val d = sub(e, x, bcast(e, mean, &t, &ch));
    tp_val var = mulk(e, rsum(e, mul(e, d, d), rd, nr), invc);
    invstd = dv(e, kf(e, var, 1), em_unary(e, "stablehlo.sqrt", add(e, var, kf(e, var, eps))));
    if (rm >= 0) new_rm = add(e, mulk(e, mean, momentum), mulk(e, rm, 1 - momentum));
    if (rv >= 0) {
      double corr = cnt > 1 ? (double)cnt / (double)(cnt - 1) : INFINITY;
      new_rv = add(e, mulk(e, mulk(e, var, corr), momentum), mulk(e, rv, 1 - momentum));
    }
    if ((rm >= 0 || rv >= 0) && n->nouts < 5) {
      o[0] = em_fail(e, TP_UNIMPLEMENTED,
                     "%s: training mode with running_mean/running_var updates them in place; the caller must pass "
                     "running_mean and running_var as outputs 3 and 4 to receive the update",
                     n->op);
      return;
    }
  } else {
    if (rm < 0 || rv < 0) {
      o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: running_mean and running_var must be defined in evaluation mode", n->op);
      return;
    }
    mean = rm;
    invstd = dv(e, kf(e, rv, 1), em_unary(e, "stablehlo.sqrt", add(e, rv, kf(e, rv, eps))));
  }
  /* out = x * alpha + beta, alpha = invstd * w, beta = b - mean * alpha (PyTorch's CPU form) */
  tp_val alpha = w >= 0 ? mul(e, invstd, w) : invstd;
  tp_val beta = em_unary(e, "stablehlo.negate", mul(e, mean, alpha));
  if (b >= 0) beta = add(e, b, beta);
  tp_val y = add(e, mul(e, x, bcast(e, alpha, &t, &ch)), bcast(e, beta, &t, &ch));
  o[0] = em_convert(e, y, n->outs[0].dt);
  if (n->nouts > 1) o[1] = numel_of(OUT(1)) == C ? as_out(e, n, 1, mean) : em_full(e, 0, OUT(1));
  if (n->nouts > 2) o[2] = numel_of(OUT(2)) == C ? as_out(e, n, 2, invstd) : em_full(e, 0, OUT(2));
  if (n->nouts > 3) o[3] = new_rm >= 0 ? as_out(e, n, 3, new_rm) : em_full(e, 0, OUT(3));
  if (n->nouts > 4) o[4] = new_rv >= 0 ? as_out(e, n, 4, new_rv) : em_full(e, 0, OUT(4));
}

/* native_batch_norm / _native_batch_norm_legit / _native_batch_norm_legit_functional
 * (input, weight?, bias?, running_mean?, running_var?, training, momentum, eps) */
static void r_batch_norm(tp_emit *e, const tp_node *n, tp_val *o) {
  batch_norm(e, n, o, 1, 2, 3, 4, lw_bool(n, 5, 1), lw_float(n, 6, 0.1), lw_float(n, 7, 1e-5));
}
/* _native_batch_norm_legit.no_stats(input, weight?, bias?, training, momentum, eps) */
static void r_batch_norm_no_stats(tp_emit *e, const tp_node *n, tp_val *o) {
  batch_norm(e, n, o, 1, 2, -1, -1, lw_bool(n, 3, 1), lw_float(n, 4, 0.1), lw_float(n, 5, 1e-5));
}
/* _native_batch_norm_legit_no_training(input, weight?, bias?, running_mean, running_var, momentum, eps) */
static void r_batch_norm_no_training(tp_emit *e, const tp_node *n, tp_val *o) {
  batch_norm(e, n, o, 1, 2, 3, 4, 0, lw_float(n, 5, 0.1), lw_float(n, 6, 1e-5));
}

/* native_batch_norm_backward(grad_out, input, weight?, running_mean?, running_var?, save_mean?,
 * save_invstd?, train, eps, output_mask) -> (grad_input, grad_weight, grad_bias) */
static void r_batch_norm_backward(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x0 = lw_value(e, n, 1);
  tp_type t = *em_type(e, x0);
  if (t.rank < 2) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: expected an input with at least 2 dims", n->op);
    return;
  }
  tp_dtype ct = lw_opmath(t.dt);
  t.dt = ct;
  tp_val x = em_convert(e, x0, ct);
  tp_val dy = lw_operand(e, n, 0, &t);
  int64_t rd[TP_MAX_RANK], ch = 1;
  int nr = bn_dims(t.rank, rd);
  int64_t C = t.dims[1], cnt = C ? numel_of(&t) / C : 0;
  int train = lw_bool(n, 7, 1);
  double eps = lw_float(n, 8, 1e-5);
  tp_val w = opt_tensor(e, n, 2, ct);
  tp_val mean, invstd;
  if (train) {
    mean = opt_tensor(e, n, 5, ct);
    invstd = opt_tensor(e, n, 6, ct);
  } else {
    mean = opt_tensor(e, n, 3, ct);
    tp_val rv = opt_tensor(e, n, 4, ct);
    invstd = rv >= 0 ? dv(e, kf(e, rv, 1), em_unary(e, "stablehlo.sqrt", add(e, rv, kf(e, rv, eps)))) : -1;
  }
  if (mean < 0 || invstd < 0) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: the %s statistics are missing", n->op, train ? "saved" : "running");
    return;
  }
  tp_val invstd_b = bcast(e, invstd, &t, &ch);
  tp_val xmu = sub(e, x, bcast(e, mean, &t, &ch));
  tp_val sdy = rsum(e, dy, rd, nr);
  tp_val dot = rsum(e, mul(e, dy, xmu), rd, nr); /* sum(dy * (x - mean)) */
  /* PyTorch always defines grad_input here (zeros when masked out). */
  int def[3] = {1, mask_bit(n, 9, 1), mask_bit(n, 9, 2)};
  int slot[3];
  if (!map_outs(e, n, def, 3, slot)) return;
  if (mask_bit(n, 9, 0) && slot[0] >= 0) {
    tp_val scale = w >= 0 ? mul(e, invstd, w) : invstd; /* per channel */
    tp_val gi;
    if (train) {
      /* PyTorch CPU: proj = (x - mean) * dot * invstd^2 / N; gi = (dy - proj - sum(dy)/N) * invstd * w */
      double invc = cnt ? 1.0 / (double)cnt : 0.0;
      tp_val k = mulk(e, mul(e, dot, mul(e, invstd, invstd)), invc);
      tp_val gm = mulk(e, sdy, invc);
      gi = sub(e, sub(e, dy, mul(e, xmu, bcast(e, k, &t, &ch))), bcast(e, gm, &t, &ch));
      gi = mul(e, gi, bcast(e, scale, &t, &ch));
    } else {
      gi = mul(e, dy, bcast(e, scale, &t, &ch));
    }
    put_opt(e, n, o, slot, def, 0, gi);
  } else if (slot[0] >= 0) {
    o[slot[0]] = em_full(e, 0, OUT(slot[0]));
  }
  put_opt(e, n, o, slot, def, 1, mul(e, dot, invstd));
  put_opt(e, n, o, slot, def, 2, sdy);
  (void)invstd_b;
}

/* ---- losses ------------------------------------------------------------------------ */

/* Pieces of nll_loss: for input x (rank 1: [C]; rank >= 2: [N, C, d...]) and
 * target (x's shape without the class dim): a one-hot mask of the target
 * class, the per-element weight w[target] masked by ignore_index, and the
 * validity mask. */
typedef struct nll_parts {
  tp_type xt;     /* input type in compute dtype */
  int cdim;       /* class dim */
  tp_val onehot;  /* bool, x's shape */
  tp_val valid;   /* bool, target's shape */
  tp_val wt;      /* compute dtype, target's shape: weight[target] (1 without weights), 0 where ignored */
} nll_parts;

static int nll_prepare(tp_emit *e, const tp_node *n, int xi, int ti, int wi, int ii, nll_parts *p) {
  tp_val x0 = lw_value(e, n, xi);
  p->xt = *em_type(e, x0);
  p->xt.dt = lw_opmath(p->xt.dt);
  int r = p->xt.rank;
  if (r < 1) {
    em_fail(e, TP_INVALID_ARGUMENT, "%s: input tensor should be 1D or more", n->op);
    return 0;
  }
  p->cdim = r >= 2 ? 1 : 0;
  tp_val tg = lw_value(e, n, ti);
  const tp_type *tt = em_type(e, tg);
  if (tt->rank != r - 1) {
    em_fail(e, TP_INVALID_ARGUMENT, "%s: expected target of rank %d, got rank %d", n->op, r - 1, tt->rank);
    return 0;
  }
  tg = em_convert(e, tg, TP_I64);
  int64_t map[TP_MAX_RANK];
  for (int i = 0, k = 0; i < r; i++)
    if (i != p->cdim) map[k++] = i;
  tp_type it = p->xt;
  it.dt = TP_I64;
  p->onehot = em_compare(e, "EQ", em_iota(e, &it, p->cdim), bcast(e, tg, &it, map));
  tp_type tgt = *em_type(e, tg);
  p->valid = em_compare(e, "NE", tg, bcast(e, em_const_i(e, lw_int(n, ii, -100), TP_I64), &tgt, NULL));
  tp_type wt_t = *em_type(e, tg);
  wt_t.dt = p->xt.dt;
  tp_val ones = em_full(e, 1, &wt_t), zeros = em_full(e, 0, &wt_t);
  tp_val w = opt_tensor(e, n, wi, p->xt.dt);
  tp_val wt = ones;
  if (w >= 0) {
    int64_t cd = p->cdim;
    tp_val wb = bcast(e, w, &p->xt, &cd);
    wt = rsum(e, em_select(e, p->onehot, wb, kf(e, wb, 0)), &cd, 1);
  }
  p->wt = em_select(e, p->valid, wt, zeros);
  return !em_failed(e);
}

/* nll_loss_forward / nll_loss2d_forward(self, target, weight?, reduction, ignore_index)
 * -> (output, total_weight) */
static void r_nll_loss(tp_emit *e, const tp_node *n, tp_val *o) {
  nll_parts p;
  if (!nll_prepare(e, n, 0, 1, 2, 4, &p)) {
    o[0] = -1;
    return;
  }
  tp_val x = lw_tensor(e, n, 0, p.xt.dt);
  int64_t cd = p.cdim;
  tp_val picked = rsum(e, em_select(e, p.onehot, x, kf(e, x, 0)), &cd, 1);
  tp_val loss = em_select(e, p.valid, em_unary(e, "stablehlo.negate", mul(e, picked, p.wt)), kf(e, picked, 0));
  int64_t red = lw_int(n, 3, 1);
  int tr = rank_of(e, loss);
  int64_t all[TP_MAX_RANK];
  for (int i = 0; i < tr; i++) all[i] = i;
  tp_val tw = rsum(e, p.wt, all, tr);
  if (red == 0) {
    o[0] = as_out(e, n, 0, loss);
  } else if (red == 1 || red == 2) {
    tp_val s = rsum(e, loss, all, tr);
    o[0] = as_out(e, n, 0, red == 1 ? dv(e, s, tw) : s);
  } else {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: %" PRId64 " is not a valid value for reduction", n->op, red);
    return;
  }
  /* total_weight: PyTorch's CPU kernel leaves it 0 for reduction='none' */
  if (n->nouts > 1) o[1] = red == 0 ? em_full(e, 0, OUT(1)) : as_out(e, n, 1, tw);
}

/* nll_loss_backward / nll_loss2d_backward(grad_output, self, target, weight?, reduction,
 * ignore_index, total_weight) -> grad_input */
static void r_nll_loss_backward(tp_emit *e, const tp_node *n, tp_val *o) {
  nll_parts p;
  if (!nll_prepare(e, n, 1, 2, 3, 5, &p)) {
    o[0] = -1;
    return;
  }
  int64_t red = lw_int(n, 4, 1);
  tp_type tt = *em_type(e, p.wt);
  tp_val g;
  if (red == 0) {
    g = lw_operand(e, n, 0, &tt);
  } else {
    tp_type s0 = tp_type_make(p.xt.dt, 0, NULL);
    g = em_reshape(e, lw_tensor(e, n, 0, p.xt.dt), 0, NULL);
    if (red == 1) g = dv(e, g, em_reshape(e, lw_tensor(e, n, 6, p.xt.dt), 0, NULL));
    g = bcast(e, g, &tt, NULL);
    (void)s0;
  }
  tp_val per = em_unary(e, "stablehlo.negate", mul(e, g, p.wt)); /* target's shape */
  per = em_select(e, p.valid, per, kf(e, per, 0));
  int64_t map[TP_MAX_RANK];
  for (int i = 0, k = 0; i < p.xt.rank; i++)
    if (i != p.cdim) map[k++] = i;
  tp_val pb = bcast(e, per, &p.xt, map);
  o[0] = em_convert(e, em_select(e, p.onehot, pb, kf(e, pb, 0)), n->outs[0].dt);
}

/* Broadcast shape of two types into *r. */
static int bshape(const tp_type *a, const tp_type *b, tp_type *r) {
  int rank = a->rank > b->rank ? a->rank : b->rank;
  *r = tp_type_make(a->dt, 0, NULL);
  r->rank = rank;
  for (int i = 0; i < rank; i++) {
    int ia = i - (rank - a->rank), ib = i - (rank - b->rank);
    int64_t da = ia >= 0 ? a->dims[ia] : 1, db = ib >= 0 ? b->dims[ib] : 1;
    if (da != db && da != 1 && db != 1) return 0;
    r->dims[i] = da == 1 ? db : da;
  }
  return 1;
}

/* mse_loss(self, target, reduction) */
static void r_mse_loss(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_dtype ct = lw_opmath(n->outs[0].dt);
  tp_type ta = *em_type(e, lw_value(e, n, 0)), tb = *em_type(e, lw_value(e, n, 1)), t;
  if (!bshape(&ta, &tb, &t)) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "mse_loss: self and target shapes do not broadcast");
    return;
  }
  t.dt = ct;
  tp_val d = sub(e, lw_operand(e, n, 0, &t), lw_operand(e, n, 1, &t));
  tp_val sq = mul(e, d, d);
  int64_t red = lw_int(n, 2, 1);
  if (red == 0) {
    o[0] = as_out(e, n, 0, sq);
    return;
  }
  if (red != 1 && red != 2) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "mse_loss: %" PRId64 " is not a valid value for reduction", red);
    return;
  }
  int64_t all[TP_MAX_RANK];
  for (int i = 0; i < t.rank; i++) all[i] = i;
  tp_val s = rsum(e, sq, all, t.rank);
  if (red == 1) s = mulk(e, s, numel_of(&t) ? 1.0 / (double)numel_of(&t) : NAN);
  o[0] = as_out(e, n, 0, s);
}

/* mse_loss_backward(grad_output, self, target, reduction) */
static void r_mse_loss_backward(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_type t = lw_out_as(n, 0, lw_opmath(n->outs[0].dt));
  int64_t red = lw_int(n, 3, 1);
  int64_t cnt = numel_of(em_type(e, lw_value(e, n, 1)));
  double norm = red == 1 ? (cnt ? 2.0 / (double)cnt : NAN) : 2.0;
  tp_val d = sub(e, lw_operand(e, n, 1, &t), lw_operand(e, n, 2, &t));
  tp_val g = red == 0 ? lw_operand(e, n, 0, &t) : bcast(e, em_reshape(e, lw_tensor(e, n, 0, t.dt), 0, NULL), &t, NULL);
  o[0] = em_convert(e, mul(e, mulk(e, d, norm), g), n->outs[0].dt);
}

const tp_lower_entry tp_lower_nn[] = {
    {"aten::native_layer_norm", r_layer_norm},
    {"aten::native_layer_norm_backward", r_layer_norm_backward},
    {"aten::native_batch_norm", r_batch_norm},
    {"aten::_native_batch_norm_legit", r_batch_norm},
    {"aten::_native_batch_norm_legit_functional", r_batch_norm},
    {"aten::_native_batch_norm_legit.no_stats", r_batch_norm_no_stats},
    {"aten::_native_batch_norm_legit_no_training", r_batch_norm_no_training},
    {"aten::native_batch_norm_backward", r_batch_norm_backward},
    {"aten::nll_loss_forward", r_nll_loss},
    {"aten::nll_loss2d_forward", r_nll_loss},
    {"aten::nll_loss_backward", r_nll_loss_backward},
    {"aten::nll_loss2d_backward", r_nll_loss_backward},
    {"aten::mse_loss", r_mse_loss},
    {"aten::mse_loss_backward", r_mse_loss_backward},
    {NULL, NULL},
};

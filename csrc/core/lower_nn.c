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
static tp_val const_i64(tp_emit *e, const int64_t *v, int64_t cnt) {
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
static tp_val const_f(tp_emit *e, const double *v, int64_t cnt, tp_dtype dt) {
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

/* Layer norm works on the input with its normalized dims flattened into one,
 * split into two where em_split_dim allows (XLA CPU then reduces each row in
 * one kernel, not two).  t2: that shape; returns its number of normalized dims,
 * or nd with t2 = t where the flattened shape would not fit TP_MAX_RANK. */
static int ln_shape(const tp_type *t, int axis, int nd, tp_type *t2) {
  int64_t N = 1;
  for (int i = axis; i < t->rank; i++) N *= t->dims[i];
  int64_t a = em_split_dim(N, EM_SPLIT_SUM_MAX);
  *t2 = *t;
  if (axis + 1 + (a != 0) > TP_MAX_RANK) return nd;
  t2->rank = axis;
  if (a) t2->dims[t2->rank++] = a;
  t2->dims[t2->rank++] = a ? N / a : N;
  return t2->rank - axis;
}

/* native_layer_norm(input, normalized_shape, weight?, bias?, eps) -> (out, mean, rstd) */
static void r_layer_norm(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x0 = lw_value(e, n, 0);
  tp_type t0 = *em_type(e, x0), t;
  const int64_t *ns;
  int nd = lw_ints(n, 1, &ns);
  int axis = t0.rank - nd;
  if (axis < 0) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "native_layer_norm: normalized_shape has more dims than the input");
    return;
  }
  nd = ln_shape(&t0, axis, nd, &t);
  tp_dtype ct = lw_opmath(t.dt);
  t.dt = ct;
  tp_val x = em_reshape(e, em_convert(e, x0, ct), t.rank, t.dims);
  int64_t rd[TP_MAX_RANK], outer[TP_MAX_RANK];
  int64_t N = 1;
  for (int i = 0; i < nd; i++) {
    rd[i] = axis + i;
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
  if (w >= 0) y = mul(e, y, bcast(e, em_reshape(e, w, nd, t.dims + axis), &t, rd));
  if (b >= 0) y = add(e, y, bcast(e, em_reshape(e, b, nd, t.dims + axis), &t, rd));
  o[0] = as_out(e, n, 0, y);
  if (n->nouts > 1) o[1] = as_out(e, n, 1, mean);
  if (n->nouts > 2) o[2] = as_out(e, n, 2, rstd);
}

/* native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight?, bias?,
 * output_mask) -> (grad_input, grad_weight, grad_bias) */
static void r_layer_norm_backward(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x0 = lw_value(e, n, 1);
  tp_type t0 = *em_type(e, x0), t;
  const int64_t *ns;
  int nd = lw_ints(n, 2, &ns);
  int axis = t0.rank - nd;
  if (axis < 0) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "native_layer_norm_backward: normalized_shape has more dims than the input");
    return;
  }
  nd = ln_shape(&t0, axis, nd, &t);
  tp_dtype ct = lw_opmath(t.dt);
  t.dt = t0.dt = ct;
  tp_val x = em_reshape(e, em_convert(e, x0, ct), t.rank, t.dims);
  tp_val dy = em_reshape(e, lw_operand(e, n, 0, &t0), t.rank, t.dims);
  int64_t rd[TP_MAX_RANK], outer[TP_MAX_RANK];
  int64_t N = 1;
  for (int i = 0; i < nd; i++) {
    rd[i] = axis + i;
    N *= t.dims[axis + i];
  }
  for (int i = 0; i < axis; i++) outer[i] = i;
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
    if (w >= 0) g = mul(e, g, bcast(e, em_reshape(e, w, nd, t.dims + axis), &t, rd));
    tp_val sg = rsum_b(e, g, rd, nd), sgx = rsum_b(e, mul(e, g, xhat), rd, nd);
    double invn = N ? 1.0 / (double)N : 0.0;
    /* rstd * (g - (sum(g) + xhat * sum(g * xhat)) / N) */
    put_opt(e, n, o, slot, def, 0, mul(e, rstd_b, sub(e, g, mulk(e, add(e, sg, mul(e, xhat, sgx)), invn))));
  } else {
    put_opt(e, n, o, slot, def, 0, -1);
  }
  put_opt(e, n, o, slot, def, 1, def[1] && slot[1] >= 0 ? rsum(e, mul(e, dy, xhat), outer, axis) : -1);
  put_opt(e, n, o, slot, def, 2, def[2] && slot[2] >= 0 ? rsum(e, dy, outer, axis) : -1);
}

/* ---- batch norm ------------------------------------------------------------------- */

/* v rounded to the values of dt when dt is f16/bf16 (em_round_to). */
static tp_val rnd_to(tp_emit *e, tp_val v, tp_dtype dt) { return em_round_to(e, v, dt); }

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
  tp_dtype xdt = t.dt, ct = lw_opmath(t.dt);
  t.dt = ct;
  tp_val x = em_convert(e, x0, ct);
  int64_t rd[TP_MAX_RANK], ch = 1;
  int nr = bn_dims(t.rank, rd);
  int64_t C = t.dims[1], cnt = C ? numel_of(&t) / C : 0;
  /* f16/bf16 input with parameters of its own dtype: PyTorch's CPU kernel
   * keeps the statistics in that dtype (not "mixed"), which rounds them. */
  int lowp = training && ct != xdt;
  const int pi[4] = {wi, bi, rmi, rvi};
  for (int j = 0; j < 4; j++)
    if (pi[j] >= 0 && lw_arg(n, pi[j])->kind == TP_ARG_TENSOR && lw_dtype(e, n, pi[j]) != xdt) lowp = 0;
  tp_val rm = rmi >= 0 ? opt_tensor(e, n, rmi, ct) : -1, rv = rvi >= 0 ? opt_tensor(e, n, rvi, ct) : -1;
  tp_val w = wi >= 0 ? opt_tensor(e, n, wi, ct) : -1, b = bi >= 0 ? opt_tensor(e, n, bi, ct) : -1;
  tp_val mean, invstd, new_rm = rm, new_rv = rv;
  if (training) {
    double invc = cnt ? 1.0 / (double)cnt : NAN;
    mean = mulk(e, rsum(e, x, rd, nr), invc);
    tp_val var;
    if (!lowp) {
      /* PyTorch's CPU kernel accumulates in double.  In the input's dtype,
       * the corrected two-pass form comes close: r = mean(x - m) is the
       * rounding error of m, so m + r is the mean and mean((x - m)^2) - r^2
       * the variance (clamped at 0 against rounding), accurate even where
       * |mean| >> std. */
      tp_val d = sub(e, x, bcast(e, mean, &t, &ch));
      tp_val r = mulk(e, rsum(e, d, rd, nr), invc);
      var = sub(e, mulk(e, rsum(e, mul(e, d, d), rd, nr), invc), mul(e, r, r));
      var = em_binary(e, "stablehlo.maximum", var, kf(e, var, 0));
      mean = add(e, mean, r);
      invstd = dv(e, kf(e, var, 1), em_unary(e, "stablehlo.sqrt", add(e, var, kf(e, var, eps))));
    } else {
      /* Where PyTorch's CPU kernels round (measured against them): the mean
       * is stored in the input dtype; bf16 centres on the f32 mean and
       * stores the sum of squares, then divides by the count in bf16; f16
       * centres on the rounded mean and divides in f32.  invstd is
       * 1 / sqrt(var + eps) in double, stored in the input dtype. */
      tp_val mean_r = rnd_to(e, mean, xdt);
      tp_val d = sub(e, x, bcast(e, xdt == TP_BF16 ? mean : mean_r, &t, &ch));
      tp_val vs = rsum(e, mul(e, d, d), rd, nr);
      if (xdt == TP_BF16) var = rnd_to(e, dv(e, rnd_to(e, vs, xdt), rnd_to(e, kf(e, vs, (double)cnt), xdt)), xdt);
      else var = mulk(e, vs, invc);
      tp_val vd = em_convert(e, var, TP_F64);
      invstd = dv(e, kf(e, vd, 1), em_unary(e, "stablehlo.sqrt", add(e, vd, kf(e, vd, eps))));
      invstd = rnd_to(e, em_convert(e, invstd, ct), xdt);
      mean = mean_r;
    }
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
  tp_val y;
  if (lowp && xdt == TP_F16) {
    /* PyTorch's f16 kernel contracts x * alpha + beta to an FMA: x * alpha
     * is exact in f64, so one f64 add rounds (almost always) like it. */
    tp_type t64 = t;
    t64.dt = TP_F64;
    y = add(e, mul(e, em_convert(e, x, TP_F64), bcast(e, em_convert(e, alpha, TP_F64), &t64, &ch)),
            bcast(e, em_convert(e, beta, TP_F64), &t64, &ch));
    y = em_convert(e, y, ct);
  } else {
    y = add(e, mul(e, x, bcast(e, alpha, &t, &ch)), bcast(e, beta, &t, &ch));
  }
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

/* _batch_norm_with_update(input, weight?, bias?, running_mean!, running_var!, momentum, eps)
 * -> (out, save_mean, save_invstd, reserve), then the updated running_mean
 * and running_var as outputs 4 and 5 (the dispatcher passes mutated
 * arguments as extra outputs).  _batch_norm_no_update: the same in
 * evaluation mode, running statistics optional and unchanged. */
static void bn_update_like(tp_emit *e, const tp_node *n, tp_val *o, int training) {
  if (n->nouts < 4 || (training && n->nouts < 6)) {
    o[0] = em_fail(e, TP_INTERNAL, "%s: expected %d outputs, got %d", n->op, training ? 6 : 4, n->nouts);
    return;
  }
  tp_type outs[5] = {n->outs[0], n->outs[1], n->outs[2]};
  tp_node m = *n;
  m.nouts = 3;
  if (training) {
    outs[3] = n->outs[4];
    outs[4] = n->outs[5];
    m.nouts = 5;
  }
  m.outs = outs;
  tp_val r[5] = {-1, -1, -1, -1, -1};
  batch_norm(e, &m, r, 1, 2, 3, 4, training, lw_float(n, 5, 0.1), lw_float(n, 6, 1e-5));
  for (int i = 0; i < 3; i++) o[i] = r[i];
  o[3] = em_full(e, 0, OUT(3));
  if (training) {
    o[4] = r[3];
    o[5] = r[4];
  }
}
static void r_batch_norm_with_update(tp_emit *e, const tp_node *n, tp_val *o) { bn_update_like(e, n, o, 1); }
static void r_batch_norm_no_update(tp_emit *e, const tp_node *n, tp_val *o) { bn_update_like(e, n, o, 0); }

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
  if (ti == 1) /* the forward (nll_loss_backward's target comes later, and was checked by the forward) */
    lw_check_range(e, n, em_select(e, p->valid, tg, em_full(e, 0, &tgt)), 0, p->xt.dims[p->cdim], TP_OUT_OF_RANGE,
                   "Target {} is out of bounds.");
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

/* Element j (a rank-0 value) of the rank-1 vector v. */
static tp_val elem(tp_emit *e, tp_val v, int64_t j) {
  int64_t st = j, li = j + 1;
  return em_reshape(e, em_slice(e, v, &st, &li, NULL), 0, NULL);
}

/* PyTorch's CPU nll_loss reductions for f16/bf16 sum in the input dtype with
 * a cascade of 8 partial sums (c10::Half/BFloat16 arithmetic: every add
 * rounds): element i (in target order, ignored ones skipped) is subtracted
 * from partial sum 0 (its weight added to weight sum 0); then, while the
 * bits of i at level j (4 bits a level) are all 0, partial sum j is added
 * into j + 1 and cleared.  The partial sums are then added up in order.
 * This replays that loop exactly.  term, wt: f32 rank-1 (term already
 * rounded), valid: bool rank-1.  *loss and *wsum are f32 rank-0 values of
 * dtype dt. */
static void nll_cascade(tp_emit *e, tp_val term, tp_val wt, tp_val valid, tp_dtype dt, tp_val *loss, tp_val *wsum) {
  int64_t N = em_type(e, term)->dims[0];
  int lp = 0;
  while (lp < 62 && ((int64_t)1 << lp) < N) lp++; /* ceil(log2(N)) */
  lp = lp / 8 > 4 ? lp / 8 : 4;
  int64_t eight = 8;
  tp_type vt = tp_type_make(TP_F32, 1, &eight);
  tp_val vf = em_convert(e, em_convert(e, valid, TP_U8), TP_F32);
  tp_val init[3] = {em_const_i(e, 0, TP_I64), em_full(e, 0, &vt), em_full(e, 0, &vt)};
  tp_val a[3], b[3], next[3], out[3];
  em_loop L;
  if (em_while_begin(e, &L, init, 3, a)) return;
  tp_val pred = em_compare(e, "LT", a[0], em_const_i(e, N, TP_I64));
  if (em_while_body(e, &L, pred, b)) return;
  tp_val i = b[0];
  tp_val t = em_gather_flat(e, term, i), w = em_gather_flat(e, wt, i);
  tp_val ok = em_compare(e, "NE", em_gather_flat(e, vf, i), em_const(e, 0, TP_F32));
  tp_val ls[8], ws[8];
  for (int j = 0; j < 8; j++) {
    ls[j] = elem(e, b[1], j);
    ws[j] = elem(e, b[2], j);
  }
  tp_val l0 = rnd_to(e, sub(e, ls[0], t), dt), w0 = rnd_to(e, add(e, ws[0], w), dt);
  ls[0] = em_select(e, ok, l0, ls[0]);
  ws[0] = em_select(e, ok, w0, ws[0]);
  tp_val go = ok, zero = em_const(e, 0, TP_F32);
  for (int j = 0; j + 1 < 8; j++) {
    int64_t mask = lp * j < 62 ? ((((int64_t)1 << lp) - 1) << (lp * j)) : 0;
    tp_val bits = em_binary(e, "stablehlo.and", i, em_const_i(e, mask, TP_I64));
    go = em_binary(e, "stablehlo.and", go, em_compare(e, "EQ", bits, em_const_i(e, 0, TP_I64)));
    ls[j + 1] = em_select(e, go, rnd_to(e, add(e, ls[j + 1], ls[j]), dt), ls[j + 1]);
    ws[j + 1] = em_select(e, go, rnd_to(e, add(e, ws[j + 1], ws[j]), dt), ws[j + 1]);
    ls[j] = em_select(e, go, zero, ls[j]);
    ws[j] = em_select(e, go, zero, ws[j]);
  }
  int64_t one = 1;
  tp_val lv[8], wv[8];
  for (int j = 0; j < 8; j++) {
    lv[j] = em_reshape(e, ls[j], 1, &one);
    wv[j] = em_reshape(e, ws[j], 1, &one);
  }
  next[0] = em_binary(e, "stablehlo.add", i, em_const_i(e, 1, TP_I64));
  next[1] = em_concat(e, lv, 8, 0);
  next[2] = em_concat(e, wv, 8, 0);
  if (em_while_end(e, &L, next, out)) return;
  tp_val sl = em_const(e, 0, TP_F32), sw = em_const(e, 0, TP_F32);
  for (int j = 0; j < 8; j++) {
    sl = rnd_to(e, add(e, sl, elem(e, out[1], j)), dt);
    sw = rnd_to(e, add(e, sw, elem(e, out[2], j)), dt);
  }
  *loss = sl;
  *wsum = sw;
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
  tp_dtype xdt = lw_dtype(e, n, 0);
  int64_t nt = numel_of(em_type(e, loss));
  if (red == 0) {
    o[0] = as_out(e, n, 0, loss);
  } else if ((red == 1 || red == 2) && xdt != p.xt.dt && nt > 0) {
    /* f16/bf16: PyTorch's order and roundings (nll_cascade); the weighted
     * term is rounded before it is subtracted, the count of valid targets
     * is rounded to the dtype. */
    tp_val term = em_reshape(e, picked, 1, &nt), wt = em_reshape(e, p.wt, 1, &nt);
    tp_val valid = em_reshape(e, p.valid, 1, &nt);
    if (!lw_is_none(n, 2)) term = rnd_to(e, mul(e, term, wt), xdt);
    tp_val s = -1, sw = -1;
    nll_cascade(e, term, wt, valid, xdt, &s, &sw);
    if (em_failed(e)) return;
    if (lw_is_none(n, 2)) sw = rnd_to(e, tw, xdt);
    tw = sw;
    o[0] = as_out(e, n, 0, red == 1 ? rnd_to(e, dv(e, s, tw), xdt) : s);
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

/* binary_cross_entropy(self, target, weight?, reduction), as PyTorch's CPU
 * kernel: (t - 1) * max(log1p(-x), -100) - t * max(log(x), -100), times the
 * weight, in opmath.  An input outside [0, 1] raises the CPU's error through
 * the device-side checks (it would give NaN). */
static void r_binary_cross_entropy(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_type t = lw_out_as(n, 0, lw_opmath(n->outs[0].dt));
  tp_type xt = *em_type(e, lw_value(e, n, 0));
  t.rank = xt.rank;
  for (int i = 0; i < xt.rank; i++) t.dims[i] = xt.dims[i];
  tp_val x = lw_operand(e, n, 0, &t), y = lw_operand(e, n, 1, &t);
  tp_val ok = em_binary(e, "stablehlo.and", em_compare(e, "GE", x, kf(e, x, 0)), em_compare(e, "LE", x, kf(e, x, 1)));
  lw_check_range(e, n, em_convert(e, ok, TP_I64), 1, 2, TP_INVALID_ARGUMENT,
                 "all elements of input should be between 0 and 1");
  tp_val lo = kf(e, x, -100);
  tp_val l1 = em_binary(e, "stablehlo.maximum", em_unary(e, "stablehlo.log_plus_one", em_unary(e, "stablehlo.negate", x)), lo);
  tp_val l0 = em_binary(e, "stablehlo.maximum", em_unary(e, "stablehlo.log", x), lo);
  tp_val loss = sub(e, mul(e, sub(e, y, kf(e, y, 1)), l1), mul(e, y, l0));
  if (lw_arg(n, 2)->kind == TP_ARG_TENSOR) loss = mul(e, loss, lw_operand(e, n, 2, &t));
  int64_t red = lw_int(n, 3, 1);
  if (red == 0) {
    o[0] = as_out(e, n, 0, loss);
    return;
  }
  int64_t all[TP_MAX_RANK];
  for (int i = 0; i < t.rank; i++) all[i] = i;
  tp_val sum = rsum(e, loss, all, t.rank);
  if (red == 1) sum = dv(e, sum, kf(e, sum, (double)numel_of(&t)));
  o[0] = as_out(e, n, 0, sum);
}

/* binary_cross_entropy_backward(grad_output, self, target, weight?, reduction):
 * grad * (x - t) / max(x * (1 - x), 1e-12) * weight, / numel for the mean. */
static void r_binary_cross_entropy_backward(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_type t = lw_out_as(n, 0, lw_opmath(n->outs[0].dt));
  tp_val g = lw_operand(e, n, 0, &t), x = lw_operand(e, n, 1, &t), y = lw_operand(e, n, 2, &t);
  tp_val den = em_binary(e, "stablehlo.maximum", mul(e, x, sub(e, kf(e, x, 1), x)), kf(e, x, 1e-12));
  tp_val r = dv(e, mul(e, g, sub(e, x, y)), den);
  if (lw_arg(n, 3)->kind == TP_ARG_TENSOR) r = mul(e, r, lw_operand(e, n, 3, &t));
  if (lw_int(n, 4, 1) == 1) r = dv(e, r, kf(e, r, (double)numel_of(&t)));
  o[0] = as_out(e, n, 0, r);
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
  /* PyTorch's CPU kernel computes (a - b) * (a - b) per element in the
   * tensor's dtype: f16/bf16 round the difference and the square. */
  tp_dtype xdt = n->outs[0].dt;
  tp_val d = rnd_to(e, sub(e, lw_operand(e, n, 0, &t), lw_operand(e, n, 1, &t)), xdt);
  tp_val sq = rnd_to(e, mul(e, d, d), xdt);
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


/* ---- convolution -------------------------------------------------------------------- */

/* A depthwise convolution (one input and one output channel per group:
 * MobileNet's, EfficientNet's, ConvNeXt's 7x7) of lhs [N, C, sp] with rhs
 * [C, 1, k]: the sum over the kernel's taps of a strided slice of the
 * (padded, dilated) input times that tap's per-channel weight.  XLA:CPU's
 * grouped convolution ran these at 0.7 GFLOP/s, 30-50x the CPU's time; the
 * taps' products fuse into one loop over the output.  lo/hi >= 0 here
 * (conv_general pads negative edges first). */
static tp_val conv_depthwise(tp_emit *e, tp_val lhs, tp_val rhs, int nsp, const int64_t *wstride, const int64_t *lo,
                             const int64_t *hi, const int64_t *ldil, const int64_t *rdil) {
  tp_type lt = *em_type(e, lhs), rt = *em_type(e, rhs);
  int r = lt.rank;
  int64_t plo[TP_MAX_RANK] = {0}, phi[TP_MAX_RANK] = {0}, pin[TP_MAX_RANK] = {0};
  int padded = 0;
  for (int k = 0; k < nsp; k++) {
    plo[2 + k] = lo[k], phi[2 + k] = hi[k], pin[2 + k] = ldil[k] - 1;
    padded |= lo[k] || hi[k] || ldil[k] > 1;
  }
  tp_val xp = padded ? em_pad(e, lhs, em_const(e, 0, lt.dt), plo, phi, pin) : lhs;
  tp_type pt = *em_type(e, xp);
  tp_type ot = pt;
  int64_t taps = 1, win[TP_MAX_RANK];
  for (int k = 0; k < nsp; k++) {
    win[k] = (rt.dims[2 + k] - 1) * rdil[k] + 1;
    ot.dims[2 + k] = pt.dims[2 + k] < win[k] ? 0 : (pt.dims[2 + k] - win[k]) / wstride[k] + 1;
    taps *= rt.dims[2 + k];
  }
  if (tp_type_numel(&ot) == 0 || taps == 0) return em_full(e, 0, &ot);
  int64_t cdim[2] = {rt.dims[0], taps};
  tp_val wflat = em_reshape(e, rhs, 2, cdim); /* [C, taps] */
  tp_val acc = -1;
  for (int64_t t = 0; t < taps; t++) {
    int64_t st[TP_MAX_RANK] = {0}, lim[TP_MAX_RANK], step[TP_MAX_RANK], rem = t;
    for (int d = 0; d < r; d++) lim[d] = pt.dims[d], step[d] = 1;
    for (int k = nsp - 1; k >= 0; k--) { /* tap t's index along each kernel dim, the last fastest */
      int64_t i = rem % rt.dims[2 + k];
      rem /= rt.dims[2 + k];
      st[2 + k] = i * rdil[k];
      lim[2 + k] = st[2 + k] + (ot.dims[2 + k] - 1) * wstride[k] + 1;
      step[2 + k] = wstride[k];
    }
    tp_val xs = em_slice(e, xp, st, lim, step);
    int64_t s0[2] = {0, t}, s1[2] = {rt.dims[0], t + 1};
    tp_val wt = em_reshape(e, em_slice(e, wflat, s0, s1, NULL), 1, &rt.dims[0]);
    int64_t map[1] = {1};
    tp_val term = mul(e, xs, em_bcast_in_dim(e, wt, &ot, map));
    acc = acc < 0 ? term : add(e, acc, term);
  }
  return acc;
}

/* stablehlo.convolution.  Specs name each tensor dim: 'b'/'f' (lhs, out),
 * 'o'/'i' (rhs), '0'..'9' spatial.  Negative padding is applied to the lhs
 * with stablehlo.pad first. */
static tp_val conv_general(tp_emit *e, tp_val lhs, tp_val rhs, const char *ls, const char *rs, const char *os,
                           int nsp, const int64_t *wstride, const int64_t *lo_in, const int64_t *hi_in,
                           const int64_t *ldil_in, const int64_t *rdil, int64_t fgc, int64_t bgc) {
  int64_t lo[TP_MAX_RANK], hi[TP_MAX_RANK], ldil[TP_MAX_RANK];
  int neg = 0;
  for (int k = 0; k < nsp; k++) {
    lo[k] = lo_in[k];
    hi[k] = hi_in[k];
    ldil[k] = ldil_in ? ldil_in[k] : 1;
    neg |= lo[k] < 0 || hi[k] < 0;
  }
  if (neg) { /* pad (and dilate) the lhs explicitly: stablehlo.pad takes negative edges */
    const tp_type *lt = em_type(e, lhs);
    int r = lt->rank;
    int64_t plo[TP_MAX_RANK] = {0}, phi[TP_MAX_RANK] = {0}, pin[TP_MAX_RANK] = {0};
    for (int d = 0; d < r; d++) {
      char c = ls[d];
      if (c >= '0' && c <= '9') {
        int k = c - '0';
        plo[d] = lo[k];
        phi[d] = hi[k];
        pin[d] = ldil[k] - 1;
        lo[k] = hi[k] = 0;
        ldil[k] = 1;
      }
    }
    tp_dtype dt = lt->dt;
    lhs = em_pad(e, lhs, em_const(e, 0, dt), plo, phi, pin);
  }
  tp_type lt = *em_type(e, lhs), rt = *em_type(e, rhs);
  if (!strncmp(ls, "bf", 2) && !strncmp(rs, "oi", 2) && !strncmp(os, "bf", 2) && bgc == 1 && fgc > 1 &&
      lt.dims[1] == fgc && rt.dims[0] == fgc && rt.dims[1] == 1)
    return conv_depthwise(e, lhs, rhs, nsp, wstride, lo, hi, ldil, rdil);
  int64_t lsp[TP_MAX_RANK], rsp[TP_MAX_RANK], lb = 0, ro = 0;
  for (int d = 0; d < lt.rank; d++) {
    if (ls[d] == 'b') lb = lt.dims[d];
    else if (ls[d] >= '0' && ls[d] <= '9') lsp[ls[d] - '0'] = lt.dims[d];
  }
  for (int d = 0; d < rt.rank; d++) {
    if (rs[d] == 'o') ro = rt.dims[d];
    else if (rs[d] >= '0' && rs[d] <= '9') rsp[rs[d] - '0'] = rt.dims[d];
  }
  tp_type ot = tp_type_make(lt.dt, 0, NULL);
  ot.rank = lt.rank;
  for (int d = 0; d < ot.rank; d++) {
    char c = os[d];
    if (c == 'b') ot.dims[d] = bgc ? lb / bgc : 0;
    else if (c == 'f') ot.dims[d] = ro;
    else {
      int k = c - '0';
      int64_t in = lsp[k] > 0 ? (lsp[k] - 1) * ldil[k] + 1 : 0;
      in += lo[k] + hi[k];
      int64_t win = rsp[k] > 0 ? (rsp[k] - 1) * rdil[k] + 1 : 0;
      ot.dims[d] = in < win || rsp[k] == 0 ? 0 : (in - win) / wstride[k] + 1;
    }
  }
  /* attributes */
  char spec[3][64];
  const char *src[3] = {ls, rs, os};
  for (int j = 0; j < 3; j++) {
    size_t k = 0;
    for (int d = 0; src[j][d]; d++) k += (size_t)snprintf(spec[j] + k, sizeof spec[j] - k, "%s%c", d ? ", " : "", src[j][d]);
  }
  char attrs[1400];
  size_t k = (size_t)snprintf(attrs, sizeof attrs,
                              "batch_group_count = %" PRId64 " : i64, dimension_numbers = #stablehlo.conv<[%s]x[%s]->[%s]>, "
                              "feature_group_count = %" PRId64 " : i64, lhs_dilation = array<i64",
                              bgc, spec[0], spec[1], spec[2], fgc);
#define LIST(v)                                                                                                  \
  for (int i = 0; i < nsp; i++) k += (size_t)snprintf(attrs + k, sizeof attrs - k, "%s%" PRId64, i ? ", " : ": ", (v)[i])
  LIST(ldil);
  k += (size_t)snprintf(attrs + k, sizeof attrs - k, ">, padding = dense<[");
  for (int i = 0; i < nsp; i++)
    k += (size_t)snprintf(attrs + k, sizeof attrs - k, "%s[%" PRId64 ", %" PRId64 "]", i ? ", " : "", lo[i], hi[i]);
  k += (size_t)snprintf(attrs + k, sizeof attrs - k, "]> : tensor<%dx2xi64>, precision_config = [#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>], rhs_dilation = array<i64", nsp);
  LIST(rdil);
  k += (size_t)snprintf(attrs + k, sizeof attrs - k, ">, window_strides = array<i64");
  LIST(wstride);
  snprintf(attrs + k, sizeof attrs - k, ">");
#undef LIST
  tp_val in[2] = {lhs, rhs};
  return em_op(e, "stablehlo.convolution", attrs, in, 2, &ot);
}

/* The specs for nsp spatial dims: "bf01..", "oi01..". */
static void conv_specs(int nsp, char *bf, char *oi, char *fb, char *io) {
  bf[0] = 'b', bf[1] = 'f';
  oi[0] = 'o', oi[1] = 'i';
  fb[0] = 'f', fb[1] = 'b';
  io[0] = 'i', io[1] = 'o';
  for (int k = 0; k < nsp; k++) bf[2 + k] = oi[2 + k] = fb[2 + k] = io[2 + k] = (char)('0' + k);
  bf[2 + nsp] = oi[2 + nsp] = fb[2 + nsp] = io[2 + nsp] = 0;
}

typedef struct conv_params {
  int nsp;
  int64_t stride[TP_MAX_RANK], pad[TP_MAX_RANK], dil[TP_MAX_RANK], opad[TP_MAX_RANK];
  int transposed;
  int64_t groups;
} conv_params;

/* Read a per-spatial-dim int list (a single value applies to every dim). */
static int conv_list(tp_emit *e, const tp_node *n, int i, int nsp, int64_t def, int64_t *out, const char *what) {
  const int64_t *v;
  int k = lw_ints(n, i, &v);
  for (int j = 0; j < nsp; j++) out[j] = k == 0 ? def : k == 1 ? v[0] : j < k ? v[j] : def;
  if (k > 1 && k != nsp) {
    em_fail(e, TP_INVALID_ARGUMENT, "%s: expected %s to have %d elements, got %d", n->op, what, nsp, k);
    return 0;
  }
  return 1;
}

/* Arguments from `si` on: stride, padding, dilation, transposed, output_padding, groups. */
static int conv_read(tp_emit *e, const tp_node *n, int si, int nsp, conv_params *p) {
  p->nsp = nsp;
  if (nsp < 1 || nsp > 3) {
    em_fail(e, TP_UNIMPLEMENTED, "%s: %d spatial dims (1 to 3 are supported)", n->op, nsp);
    return 0;
  }
  if (!conv_list(e, n, si, nsp, 1, p->stride, "stride") || !conv_list(e, n, si + 1, nsp, 0, p->pad, "padding") ||
      !conv_list(e, n, si + 2, nsp, 1, p->dil, "dilation") ||
      !conv_list(e, n, si + 4, nsp, 0, p->opad, "output_padding"))
    return 0;
  p->transposed = lw_bool(n, si + 3, 0);
  p->groups = lw_int(n, si + 5, 1);
  if (p->groups < 1) {
    em_fail(e, TP_INVALID_ARGUMENT, "%s: non-positive groups is not supported", n->op);
    return 0;
  }
  for (int k = 0; k < nsp; k++)
    if (p->stride[k] < 1 || p->dil[k] < 1 || p->pad[k] < 0) {
      em_fail(e, TP_INVALID_ARGUMENT, "%s: stride and dilation must be positive and padding non-negative", n->op);
      return 0;
    }
  return 1;
}

/* Normal convolution of x [N, C, sp] with w [O, C/g, k]: [N, O, out]. */
static tp_val conv_fwd(tp_emit *e, tp_val x, tp_val w, const conv_params *p) {
  char bf[16], oi[16], fb[16], io[16];
  conv_specs(p->nsp, bf, oi, fb, io);
  return conv_general(e, x, w, bf, oi, bf, p->nsp, p->stride, p->pad, p->pad, NULL, p->dil, p->groups, 1);
}

/* Transposed convolution of x [N, Cin, sp] with w [Cin, Cout/g, k], output
 * spatial sizes `target`: the gradient of conv_fwd with respect to its input. */
static tp_val conv_bwd_data(tp_emit *e, tp_val x, tp_val w, const conv_params *p, const int64_t *target) {
  int nsp = p->nsp;
  tp_type wt = *em_type(e, w), xt = *em_type(e, x);
  int64_t g = p->groups, cin = wt.dims[0], coutg = wt.dims[1];
  /* [Cin, Cout/g, k] -> [g, Cin/g, Cout/g, k] -> [g, Cout/g, Cin/g, k] -> [Cout, Cin/g, k], flipped */
  int64_t d5[TP_MAX_RANK + 1], perm[TP_MAX_RANK + 1], d4[TP_MAX_RANK];
  d5[0] = g, d5[1] = cin / g, d5[2] = coutg;
  perm[0] = 0, perm[1] = 2, perm[2] = 1;
  d4[0] = g * coutg, d4[1] = cin / g;
  for (int k = 0; k < nsp; k++) {
    d5[3 + k] = wt.dims[2 + k];
    perm[3 + k] = 3 + k;
    d4[2 + k] = wt.dims[2 + k];
  }
  tp_val k5 = em_reshape(e, w, nsp + 3, d5);
  k5 = em_transpose(e, k5, perm);
  tp_val kern = em_reshape(e, k5, nsp + 2, d4);
  char rev[160];
  size_t q = (size_t)snprintf(rev, sizeof rev, "dimensions = array<i64");
  for (int k = 0; k < nsp; k++) q += (size_t)snprintf(rev + q, sizeof rev - q, "%s%d", k ? ", " : ": ", 2 + k);
  snprintf(rev + q, sizeof rev - q, ">");
  tp_type kt = *em_type(e, kern);
  kern = em_op(e, "stablehlo.reverse", rev, &kern, 1, &kt);
  int64_t lo[TP_MAX_RANK], hi[TP_MAX_RANK], one[TP_MAX_RANK];
  for (int k = 0; k < nsp; k++) {
    int64_t kk = wt.dims[2 + k], in = xt.dims[2 + k];
    lo[k] = p->dil[k] * (kk - 1) - p->pad[k];
    hi[k] = target[k] + p->pad[k] - 1 - (in - 1) * p->stride[k];
    one[k] = 1;
  }
  char bf[16], oi[16], fb[16], io[16];
  conv_specs(nsp, bf, oi, fb, io);
  return conv_general(e, x, kern, bf, oi, bf, nsp, one, lo, hi, p->stride, p->dil, g, 1);
}

/* Gradient of conv_fwd(x, w) with respect to w, for x [N, C, sp] and
 * gy [N, O, out]: [O, C/g, ksize]. */
static tp_val conv_bwd_filter(tp_emit *e, tp_val x, tp_val gy, const conv_params *p, const int64_t *ksize) {
  int nsp = p->nsp;
  tp_type xt = *em_type(e, x), gt = *em_type(e, gy);
  int64_t lo[TP_MAX_RANK], hi[TP_MAX_RANK];
  for (int k = 0; k < nsp; k++) {
    int64_t in = xt.dims[2 + k], out = gt.dims[2 + k];
    lo[k] = p->pad[k];
    hi[k] = (ksize[k] - 1) * p->dil[k] + (out > 0 ? (out - 1) * p->stride[k] + 1 : 0) - in - p->pad[k];
  }
  char bf[16], oi[16], fb[16], io[16];
  conv_specs(nsp, bf, oi, fb, io);
  return conv_general(e, x, gy, fb, io, fb, nsp, p->dil, lo, hi, NULL, p->stride, 1, p->groups);
}

/* convolution(input, weight, bias?, stride, padding, dilation, transposed, output_padding, groups) */
static void r_convolution(tp_emit *e, const tp_node *n, tp_val *o) {
  if (!lw_same_dtypes(e, n, 0, 2)) return;
  tp_val x0 = lw_value(e, n, 0), w0 = lw_value(e, n, 1);
  tp_type xt = *em_type(e, x0), wt = *em_type(e, w0);
  conv_params p;
  if (!conv_read(e, n, 3, wt.rank - 2, &p)) return;
  if (xt.rank != wt.rank) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: expected a batched %dD input for a %dD weight", n->op, wt.rank, wt.rank);
    return;
  }
  tp_dtype ct = lw_opmath(n->outs[0].dt);
  tp_val x = em_convert(e, x0, ct), w = em_convert(e, w0, ct);
  tp_val y;
  if (!p.transposed) {
    y = conv_fwd(e, x, w, &p);
  } else {
    int64_t target[TP_MAX_RANK];
    for (int k = 0; k < p.nsp; k++) target[k] = n->outs[0].dims[2 + k];
    y = conv_bwd_data(e, x, w, &p, target);
  }
  tp_val b = opt_tensor(e, n, 2, ct);
  if (b >= 0) {
    tp_type yt = *em_type(e, y);
    int64_t one = 1;
    y = add(e, y, bcast(e, b, &yt, &one));
  }
  o[0] = em_convert(e, y, n->outs[0].dt);
}

/* Backward: gi = argument index of grad_output; bias_sizes at gi + 3 if has_bs;
 * then stride..groups, output_mask. */
static void conv_backward(tp_emit *e, const tp_node *n, tp_val *o, int has_bs) {
  tp_val gy0 = lw_value(e, n, 0), x0 = lw_value(e, n, 1), w0 = lw_value(e, n, 2);
  tp_type xt = *em_type(e, x0), wt = *em_type(e, w0);
  int si = has_bs ? 4 : 3;
  conv_params p;
  if (!conv_read(e, n, si, wt.rank - 2, &p)) return;
  int mi = si + 6;
  int def[3] = {mask_bit(n, mi, 0), mask_bit(n, mi, 1), mask_bit(n, mi, 2)};
  int slot[3];
  if (!map_outs(e, n, def, 3, slot)) return;
  tp_dtype ct = lw_opmath(xt.dt);
  tp_val gy = em_convert(e, gy0, ct), x = em_convert(e, x0, ct), w = em_convert(e, w0, ct);
  int64_t xsp[TP_MAX_RANK], ksz[TP_MAX_RANK];
  for (int k = 0; k < p.nsp; k++) {
    xsp[k] = xt.dims[2 + k];
    ksz[k] = wt.dims[2 + k];
  }
  if (def[0] && slot[0] >= 0) {
    tp_val gx = p.transposed ? conv_fwd(e, gy, w, &p) : conv_bwd_data(e, gy, w, &p, xsp);
    if (p.transposed) {
      /* output_padding >= stride (possible when dilation > stride) gives
       * grad_output rows past the last input position: drop them. */
      tp_type gt = *em_type(e, gx);
      int64_t st[TP_MAX_RANK] = {0}, lim[TP_MAX_RANK];
      int crop = 0;
      for (int d = 0; d < gt.rank; d++) {
        lim[d] = gt.dims[d];
        if (d >= 2 && gt.dims[d] > xsp[d - 2]) {
          lim[d] = xsp[d - 2];
          crop = 1;
        }
      }
      if (crop) gx = em_slice(e, gx, st, lim, NULL);
    }
    put_opt(e, n, o, slot, def, 0, gx);
  } else {
    put_opt(e, n, o, slot, def, 0, -1);
  }
  if (def[1] && slot[1] >= 0) {
    tp_val gw = p.transposed ? conv_bwd_filter(e, gy, x, &p, ksz) : conv_bwd_filter(e, x, gy, &p, ksz);
    put_opt(e, n, o, slot, def, 1, gw);
  } else {
    put_opt(e, n, o, slot, def, 1, -1);
  }
  if (def[2] && slot[2] >= 0) {
    int64_t rd[TP_MAX_RANK];
    int nr = bn_dims(rank_of(e, gy), rd);
    put_opt(e, n, o, slot, def, 2, rsum(e, gy, rd, nr));
  } else {
    put_opt(e, n, o, slot, def, 2, -1);
  }
}

/* convolution_backward(grad_output, input, weight, bias_sizes?, stride, padding, dilation,
 * transposed, output_padding, groups, output_mask) -> (grad_input, grad_weight, grad_bias) */
static void r_convolution_backward(tp_emit *e, const tp_node *n, tp_val *o) { conv_backward(e, n, o, 1); }


/* ---- gathers and scatters along one dim with host-known indices ------------------------ */

/* x with dim `d` replaced by m entries: x[..., idx[j], ...]. */
static tp_val gather_dim(tp_emit *e, tp_val x, int d, const int64_t *idx, int64_t m) {
  tp_type t = *em_type(e, x);
  tp_val iv = em_reshape(e, const_i64(e, idx, m), 2, (int64_t[]){m, 1});
  tp_type ot = t;
  ot.dims[d] = m;
  char attrs[600], offs[160], sizes[200];
  size_t a = 0, b = 0;
  offs[0] = sizes[0] = 0;
  for (int i = 0; i < t.rank; i++) {
    if (i != d) a += (size_t)snprintf(offs + a, sizeof offs - a, "%s%d", a ? ", " : "", i);
    b += (size_t)snprintf(sizes + b, sizeof sizes - b, "%s%" PRId64, i ? ", " : "", i == d ? (int64_t)1 : t.dims[i]);
  }
  snprintf(attrs, sizeof attrs,
           "dimension_numbers = #stablehlo.gather<offset_dims = [%s], collapsed_slice_dims = [%d], "
           "start_index_map = [%d], index_vector_dim = 1>, slice_sizes = array<i64: %s>, indices_are_sorted = false",
           offs, d, d, sizes);
  tp_val in[2] = {x, iv};
  return em_op(e, "stablehlo.gather", attrs, in, 2, &ot);
}

/* The transpose of gather_dim: out[..., idx[j], ...] += v[..., j, ...], out's dim d of size `size`. */
static tp_val scatter_add_dim(tp_emit *e, tp_val v, int d, const int64_t *idx, int64_t size) {
  tp_type t = *em_type(e, v);
  int64_t A = 1, B = 1, m = t.dims[d];
  for (int i = 0; i < d; i++) A *= t.dims[i];
  for (int i = d + 1; i < t.rank; i++) B *= t.dims[i];
  int64_t d3[3] = {A, m, B};
  tp_type it = tp_type_make(TP_I64, 3, d3);
  int64_t one = 1;
  tp_val col = bcast(e, const_i64(e, idx, m), &it, &one);
  tp_val flat = add(e, add(e, mul(e, em_iota(e, &it, 0), em_full(e, (double)(size * B), &it)),
                           mul(e, col, em_full(e, (double)B, &it))),
                    em_iota(e, &it, 2));
  int64_t total = A * size * B;
  tp_type zt = tp_type_make(t.dt, 1, &total);
  tp_val r = em_scatter_flat(e, em_full(e, 0, &zt), flat, em_reshape(e, v, 3, d3), "stablehlo.add");
  tp_type ot = t;
  ot.dims[d] = size;
  return em_reshape(e, r, ot.rank, ot.dims);
}

/* ---- padding ------------------------------------------------------------------------------- */

/* replication_padNd_backward(grad_output, self, padding): output position j
 * of a padded dim read input position clamp(j - left, 0, I - 1), so the
 * gradient is scatter-added back dim by dim (padding as in F.pad: last dim
 * first; negative entries crop). */
static void replication_pad_backward(tp_emit *e, const tp_node *n, tp_val *o, int nsp) {
  tp_type xt = *em_type(e, lw_value(e, n, 1));
  tp_dtype ct = lw_opmath(n->outs[0].dt);
  tp_val g = lw_tensor(e, n, 0, ct);
  const int64_t *pad;
  int np = lw_ints(n, 2, &pad);
  int L = xt.rank - nsp;
  if (np != 2 * nsp || L < 0 || em_type(e, g)->rank != xt.rank) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: expected %d padding values and a %dD or %dD input", n->op, 2 * nsp,
                   nsp + 1, nsp + 2);
    return;
  }
  for (int i = 0; i < nsp && !em_failed(e); i++) {
    int d = xt.rank - 1 - i; /* pad[2i], pad[2i+1] pad the i-th dim from the end */
    int64_t I = xt.dims[d], O = em_type(e, g)->dims[d], left = pad[2 * i];
    if (O != I + left + pad[2 * i + 1]) {
      o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: grad_output size %" PRId64 " in dim %d, expected %" PRId64, n->op, O,
                     d, I + left + pad[2 * i + 1]);
      return;
    }
    if (O == 0 || I == 0) {
      tp_type zt = *em_type(e, g);
      zt.dims[d] = I;
      g = em_full(e, 0, &zt);
      continue;
    }
    int64_t *ix = malloc(sizeof(int64_t) * (size_t)O);
    if (!ix) {
      o[0] = em_fail(e, TP_RESOURCE_EXHAUSTED, "out of memory building a program");
      return;
    }
    for (int64_t j = 0; j < O; j++) {
      int64_t p = j - left;
      ix[j] = p < 0 ? 0 : p >= I ? I - 1 : p;
    }
    g = scatter_add_dim(e, g, d, ix, I);
    free(ix);
  }
  o[0] = as_out(e, n, 0, g);
}
static void r_replication_pad1d_backward(tp_emit *e, const tp_node *n, tp_val *o) {
  replication_pad_backward(e, n, o, 1);
}
static void r_replication_pad2d_backward(tp_emit *e, const tp_node *n, tp_val *o) {
  replication_pad_backward(e, n, o, 2);
}
static void r_replication_pad3d_backward(tp_emit *e, const tp_node *n, tp_val *o) {
  replication_pad_backward(e, n, o, 3);
}

/* ---- pooling ------------------------------------------------------------------------------- */

typedef struct pool_params {
  int nsp;   /* spatial dims */
  int lead;  /* dims before the spatial ones (1 unbatched, 2 batched) */
  int64_t k[3], s[3], p[3], d[3];
  int ceil_mode;
} pool_params;

/* Arguments at ki..: kernel_size, stride, padding[, dilation] (di < 0: none); input rank. */
static int pool_read(tp_emit *e, const tp_node *n, int nsp, int rank, int ki, int di, pool_params *pp) {
  pp->nsp = nsp;
  pp->lead = rank - nsp;
  if (pp->lead != 1 && pp->lead != 2) {
    em_fail(e, TP_INVALID_ARGUMENT, "%s: expected a %dD or %dD input, got %dD", n->op, nsp + 1, nsp + 2, rank);
    return 0;
  }
  const int64_t *v;
  int c = lw_ints(n, ki, &v);
  if (c != 1 && c != nsp) {
    em_fail(e, TP_INVALID_ARGUMENT, "%s: kernel_size must have 1 or %d elements", n->op, nsp);
    return 0;
  }
  for (int i = 0; i < nsp; i++) pp->k[i] = v[c == 1 ? 0 : i];
  c = lw_ints(n, ki + 1, &v);
  for (int i = 0; i < nsp; i++) pp->s[i] = c == 0 ? pp->k[i] : v[c == 1 ? 0 : i];
  c = lw_ints(n, ki + 2, &v);
  for (int i = 0; i < nsp; i++) pp->p[i] = c == 0 ? 0 : v[c == 1 ? 0 : i];
  if (di >= 0) {
    c = lw_ints(n, di, &v);
    for (int i = 0; i < nsp; i++) pp->d[i] = c == 0 ? 1 : v[c == 1 ? 0 : i];
  } else {
    for (int i = 0; i < nsp; i++) pp->d[i] = 1;
  }
  for (int i = 0; i < nsp; i++)
    if (pp->k[i] < 1 || pp->s[i] < 1 || pp->d[i] < 1 || pp->p[i] < 0) {
      em_fail(e, TP_INVALID_ARGUMENT, "%s: kernel_size, stride and dilation must be positive, padding non-negative",
              n->op);
      return 0;
    }
  return 1;
}

/* One step of a max pool's window scan, PyTorch's CPU rule: the window's
 * first element, a greater one or (for floats) a NaN replaces the running
 * maximum *m and its index *idx (-1 before the first step); where `valid` (or
 * -1 for everywhere) is false the position lies outside the input. */
static void max_scan_step(tp_emit *e, tp_val v, tp_val flat, tp_val valid, int isf, tp_val *m, tp_val *idx) {
  tp_type it = *em_type(e, *idx);
  tp_val upd = em_binary(e, "stablehlo.or", em_compare(e, "EQ", *idx, em_full(e, -1, &it)), em_compare(e, "GT", v, *m));
  if (isf) upd = em_binary(e, "stablehlo.or", upd, em_compare(e, "NE", v, v));
  if (valid >= 0) upd = em_binary(e, "stablehlo.and", upd, valid);
  *m = em_select(e, upd, v, *m);
  *idx = em_select(e, upd, flat, *idx);
}

/* max_poolNd_with_indices(self, kernel_size, stride, padding, dilation, ceil_mode) -> (out, indices) */
static void max_pool(tp_emit *e, const tp_node *n, tp_val *o, int nsp) {
  tp_val x = lw_value(e, n, 0);
  tp_type t = *em_type(e, x);
  pool_params pp;
  if (!pool_read(e, n, nsp, t.rank, 1, 4, &pp)) return;
  const tp_type *ot = OUT(0);
  int L = pp.lead;
  int64_t osz[3], isz[3];
  for (int i = 0; i < nsp; i++) {
    osz[i] = ot->dims[L + i];
    isz[i] = t.dims[L + i];
  }
  /* pad with anything (masked below) so every window position exists */
  int64_t lo[TP_MAX_RANK] = {0}, hi[TP_MAX_RANK] = {0};
  for (int i = 0; i < nsp; i++) {
    lo[L + i] = pp.p[i];
    hi[L + i] = (osz[i] > 0 ? (osz[i] - 1) * pp.s[i] : 0) + (pp.k[i] - 1) * pp.d[i] + 1 - isz[i] - pp.p[i];
  }
  int isf = tp_dtype_is_float(t.dt);
  /* f16/bf16 compare and select in f32 (exact): XLA:CPU widens each
   * reduced-precision op by itself, and the resulting chain of k selects
   * took minutes or all memory to compile (max_pool3d float16). */
  t.dt = lw_opmath(t.dt);
  x = em_convert(e, x, t.dt);
  tp_val xp = em_pad(e, x, em_const(e, isf ? -INFINITY : 0, t.dt), lo, hi, NULL);
  tp_type vt = *ot;
  vt.dt = t.dt;
  tp_type it = vt;
  it.dt = TP_I64;
  tp_val m = em_full(e, 0, &vt), idx = em_full(e, -1, &it);
  int64_t koff[3] = {0, 0, 0};
  int64_t nk = 1;
  for (int i = 0; i < nsp; i++) nk *= pp.k[i];
  for (int64_t q = 0; q < nk; q++) {
    int64_t r = q;
    for (int i = nsp - 1; i >= 0; i--) {
      koff[i] = r % pp.k[i];
      r /= pp.k[i];
    }
    int64_t st[TP_MAX_RANK] = {0}, lim[TP_MAX_RANK], str[TP_MAX_RANK];
    for (int dd = 0; dd < t.rank; dd++) {
      lim[dd] = em_type(e, xp)->dims[dd];
      str[dd] = 1;
    }
    tp_val valid = -1, flat = -1;
    for (int i = 0; i < nsp; i++) {
      int dd = L + i;
      st[dd] = koff[i] * pp.d[i];
      lim[dd] = st[dd] + (osz[i] > 0 ? (osz[i] - 1) * pp.s[i] + 1 : 0);
      str[dd] = pp.s[i];
      /* input position along this dim: o * s - p + koff * d */
      tp_val pos = add(e, mul(e, em_iota(e, &it, dd), em_full(e, (double)pp.s[i], &it)),
                       em_full(e, (double)(koff[i] * pp.d[i] - pp.p[i]), &it));
      tp_val ok = em_binary(e, "stablehlo.and", em_compare(e, "GE", pos, em_full(e, 0, &it)),
                            em_compare(e, "LT", pos, em_full(e, (double)isz[i], &it)));
      valid = valid < 0 ? ok : em_binary(e, "stablehlo.and", valid, ok);
      flat = flat < 0 ? pos : add(e, mul(e, flat, em_full(e, (double)isz[i], &it)), pos);
    }
    max_scan_step(e, em_slice(e, xp, st, lim, str), flat, valid, isf, &m, &idx);
  }
  o[0] = em_convert(e, m, ot->dt);
  if (n->nouts > 1) o[1] = em_convert(e, idx, n->outs[1].dt);
}
static void r_max_pool2d(tp_emit *e, const tp_node *n, tp_val *o) { max_pool(e, n, o, 2); }
static void r_max_pool3d(tp_emit *e, const tp_node *n, tp_val *o) { max_pool(e, n, o, 3); }

/* max_poolNd_with_indices_backward(grad_output, self, kernel_size, stride, padding, dilation,
 * ceil_mode, indices) and adaptive_max_poolNd_backward(grad_output, self, indices): scatter-add
 * into the input plane at the indices (argument ii). */
static void max_pool_backward(tp_emit *e, const tp_node *n, tp_val *o, int nsp, int ii) {
  tp_type xt = *em_type(e, lw_value(e, n, 1));
  tp_dtype ct = lw_opmath(n->outs[0].dt);
  tp_val idx = lw_tensor(e, n, ii, TP_I64);
  tp_type gt = *em_type(e, idx);
  tp_type gct = gt;
  gct.dt = ct;
  tp_val g = lw_operand(e, n, 0, &gct);
  int lead = xt.rank - nsp;
  if (lead < 1) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: bad input rank %d", n->op, xt.rank);
    return;
  }
  int64_t plane = 1;
  for (int i = 0; i < nsp; i++) plane *= xt.dims[lead + i];
  /* flat = (plane index) * plane + idx, planes numbered over the lead dims */
  tp_val base = em_full(e, 0, &gt);
  for (int i = 0; i < lead; i++)
    base = add(e, mul(e, base, em_full(e, (double)gt.dims[i], &gt)), em_iota(e, &gt, i));
  tp_val flat = add(e, mul(e, base, em_full(e, (double)plane, &gt)), idx);
  int64_t total = numel_of(&xt);
  tp_type zt = tp_type_make(ct, 1, &total);
  tp_val r = em_scatter_flat(e, em_full(e, 0, &zt), flat, g, "stablehlo.add");
  o[0] = as_out(e, n, 0, r);
}
static void r_max_pool2d_backward(tp_emit *e, const tp_node *n, tp_val *o) { max_pool_backward(e, n, o, 2, 7); }
static void r_max_pool3d_backward(tp_emit *e, const tp_node *n, tp_val *o) { max_pool_backward(e, n, o, 3, 7); }
static void r_adaptive_max_pool2d_backward(tp_emit *e, const tp_node *n, tp_val *o) {
  max_pool_backward(e, n, o, 2, 2);
}
static void r_adaptive_max_pool3d_backward(tp_emit *e, const tp_node *n, tp_val *o) {
  max_pool_backward(e, n, o, 3, 2);
}

/* Divisors of avg_poolNd for each output position (PyTorch's CPU rule),
 * as a value of shape osz (nsp dims), dtype ct. */
static tp_val avg_divisors(tp_emit *e, const pool_params *pp, const int64_t *isz, const int64_t *osz, int cip,
                           int64_t dov, int has_dov, tp_dtype ct) {
  int nsp = pp->nsp;
  int64_t tot = 1;
  for (int i = 0; i < nsp; i++) tot *= osz[i];
  double *dv_ = malloc(sizeof(double) * (size_t)(tot ? tot : 1));
  if (!dv_) return em_fail(e, TP_RESOURCE_EXHAUSTED, "out of memory building a program");
  for (int64_t q = 0; q < tot; q++) {
    int64_t r = q, pool = 1, cnt = 1;
    for (int i = nsp - 1; i >= 0; i--) {
      int64_t oi = r % osz[i];
      r /= osz[i];
      int64_t st = oi * pp->s[i] - pp->p[i];
      int64_t en = st + pp->k[i] < isz[i] + pp->p[i] ? st + pp->k[i] : isz[i] + pp->p[i];
      pool *= en - st;
      int64_t st2 = st > 0 ? st : 0, en2 = en < isz[i] ? en : isz[i];
      cnt *= en2 > st2 ? en2 - st2 : 0;
    }
    double dvv = has_dov ? (double)dov : cip ? (double)pool : (double)cnt;
    dv_[q] = cnt == 0 || dvv == 0 ? 1.0 : dvv; /* empty windows sum to 0 */
  }
  tp_val c = const_f(e, dv_, tot, ct == TP_F64 ? TP_F64 : TP_F32);
  free(dv_);
  return em_reshape(e, em_convert(e, c, ct), nsp, osz);
}

/* avg_poolNd(self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override?) */
static void avg_pool(tp_emit *e, const tp_node *n, tp_val *o, int nsp) {
  tp_val x0 = lw_value(e, n, 0);
  tp_type t = *em_type(e, x0);
  pool_params pp;
  if (!pool_read(e, n, nsp, t.rank, 1, -1, &pp)) return;
  int cip = lw_bool(n, 5, 1), has_dov = !lw_is_none(n, 6);
  int64_t dov = lw_int(n, 6, 0);
  if (has_dov && dov == 0) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: divisor must be not zero", n->op);
    return;
  }
  tp_dtype ct = lw_opmath(n->outs[0].dt);
  int L = pp.lead;
  int64_t isz[3], osz[3], P = 1;
  for (int i = 0; i < L; i++) P *= t.dims[i];
  for (int i = 0; i < nsp; i++) {
    isz[i] = t.dims[L + i];
    osz[i] = n->outs[0].dims[L + i];
  }
  /* sums: a ones-kernel convolution of [P, 1, sp] */
  int64_t xd[TP_MAX_RANK], kd[TP_MAX_RANK];
  xd[0] = P, xd[1] = 1, kd[0] = kd[1] = 1;
  for (int i = 0; i < nsp; i++) {
    xd[2 + i] = isz[i];
    kd[2 + i] = pp.k[i];
  }
  tp_val x = em_reshape(e, em_convert(e, x0, ct), nsp + 2, xd);
  tp_type kt = tp_type_make(ct, nsp + 2, kd);
  conv_params cp = {.nsp = nsp, .groups = 1};
  int64_t lo[3], hi[3];
  for (int i = 0; i < nsp; i++) {
    cp.stride[i] = pp.s[i];
    cp.dil[i] = 1;
    lo[i] = pp.p[i];
    hi[i] = (osz[i] > 0 ? (osz[i] - 1) * pp.s[i] : 0) + pp.k[i] - isz[i] - pp.p[i];
  }
  char bf[16], oi[16], fb[16], io[16];
  conv_specs(nsp, bf, oi, fb, io);
  tp_val sums = conv_general(e, x, em_full(e, 1, &kt), bf, oi, bf, nsp, cp.stride, lo, hi, NULL, cp.dil, 1, 1);
  tp_type st = *em_type(e, sums);
  int64_t map[3];
  for (int i = 0; i < nsp; i++) map[i] = 2 + i;
  tp_val div = bcast(e, avg_divisors(e, &pp, isz, osz, cip, dov, has_dov, ct), &st, map);
  o[0] = as_out(e, n, 0, dv(e, sums, div));
}
static void r_avg_pool2d(tp_emit *e, const tp_node *n, tp_val *o) { avg_pool(e, n, o, 2); }
static void r_avg_pool3d(tp_emit *e, const tp_node *n, tp_val *o) { avg_pool(e, n, o, 3); }

/* avg_poolNd_backward(grad_output, self, kernel_size, stride, padding, ceil_mode,
 * count_include_pad, divisor_override?) */
static void avg_pool_backward(tp_emit *e, const tp_node *n, tp_val *o, int nsp) {
  tp_type t = *em_type(e, lw_value(e, n, 1));
  pool_params pp;
  if (!pool_read(e, n, nsp, t.rank, 2, -1, &pp)) return;
  int cip = lw_bool(n, 6, 1), has_dov = !lw_is_none(n, 7);
  int64_t dov = lw_int(n, 7, 0);
  if (has_dov && dov == 0) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: divisor must be not zero", n->op);
    return;
  }
  tp_dtype ct = lw_opmath(n->outs[0].dt);
  tp_val g0 = lw_tensor(e, n, 0, ct);
  tp_type gt = *em_type(e, g0);
  int L = pp.lead;
  int64_t isz[3], osz[3], P = 1;
  for (int i = 0; i < L; i++) P *= t.dims[i];
  for (int i = 0; i < nsp; i++) {
    isz[i] = t.dims[L + i];
    osz[i] = gt.dims[L + i];
  }
  int64_t gd[TP_MAX_RANK], kd[TP_MAX_RANK], map[3];
  gd[0] = P, gd[1] = 1, kd[0] = kd[1] = 1;
  for (int i = 0; i < nsp; i++) {
    gd[2 + i] = osz[i];
    kd[2 + i] = pp.k[i];
    map[i] = 2 + i;
  }
  tp_val g = em_reshape(e, g0, nsp + 2, gd);
  tp_type g4 = *em_type(e, g);
  g = dv(e, g, bcast(e, avg_divisors(e, &pp, isz, osz, cip, dov, has_dov, ct), &g4, map));
  tp_type kt = tp_type_make(ct, nsp + 2, kd);
  conv_params cp = {.nsp = nsp, .groups = 1};
  for (int i = 0; i < nsp; i++) {
    cp.stride[i] = pp.s[i];
    cp.pad[i] = pp.p[i];
    cp.dil[i] = 1;
  }
  o[0] = as_out(e, n, 0, conv_bwd_data(e, g, em_full(e, 1, &kt), &cp, isz));
}
static void r_avg_pool2d_backward(tp_emit *e, const tp_node *n, tp_val *o) { avg_pool_backward(e, n, o, 2); }
static void r_avg_pool3d_backward(tp_emit *e, const tp_node *n, tp_val *o) { avg_pool_backward(e, n, o, 3); }

/* Adaptive average pooling bins along one dim: [floor(o*I/O), ceil((o+1)*I/O)). */
static int64_t adaptive_bins(int64_t I, int64_t O, int64_t *start, int64_t *len) {
  int64_t maxlen = 0;
  for (int64_t q = 0; q < O; q++) {
    int64_t a = (q * I) / O, b = ((q + 1) * I + O - 1) / O;
    start[q] = a;
    len[q] = b - a;
    if (len[q] > maxlen) maxlen = len[q];
  }
  return maxlen;
}

/* Sum x over adaptive bins along dim d (I -> O). */
static tp_val adaptive_sum_dim(tp_emit *e, tp_val x, int d, int64_t O) {
  tp_type t = *em_type(e, x);
  int64_t I = t.dims[d];
  if (O > 0 && I % O == 0) { /* uniform bins: reshape and reduce */
    int64_t dims[TP_MAX_RANK + 1];
    int r = 0;
    for (int i = 0; i < t.rank; i++) {
      if (i == d) {
        dims[r++] = O;
        dims[r++] = I / O;
      } else {
        dims[r++] = t.dims[i];
      }
    }
    int64_t rd = d + 1;
    return rsum(e, em_reshape(e, x, r, dims), &rd, 1);
  }
  int64_t *start = malloc(sizeof(int64_t) * (size_t)(2 * O + 1));
  if (!start) return em_fail(e, TP_RESOURCE_EXHAUSTED, "out of memory building a program");
  int64_t *len = start + O, *ix = malloc(sizeof(int64_t) * (size_t)(O + 1));
  if (!ix) {
    free(start);
    return em_fail(e, TP_RESOURCE_EXHAUSTED, "out of memory building a program");
  }
  int64_t maxlen = adaptive_bins(I, O, start, len);
  tp_val acc = -1;
  for (int64_t j = 0; j < maxlen; j++) {
    int all = 1;
    for (int64_t q = 0; q < O; q++) {
      ix[q] = start[q] + j < I ? start[q] + j : I - 1;
      all &= j < len[q];
    }
    tp_val v = gather_dim(e, x, d, ix, O);
    if (!all) {
      int64_t *mk = ix; /* reuse as 0/1 mask */
      for (int64_t q = 0; q < O; q++) mk[q] = j < len[q];
      tp_type vt = *em_type(e, v);
      tp_type mt = vt;
      mt.dt = TP_I64;
      int64_t dd = d;
      tp_val m = bcast(e, const_i64(e, mk, O), &mt, &dd);
      v = em_select(e, em_compare(e, "NE", m, em_full(e, 0, &mt)), v, kf(e, v, 0));
    }
    acc = acc < 0 ? v : add(e, acc, v);
  }
  free(start);
  free(ix);
  return acc;
}

/* Product over the spatial dims of the bin lengths, shape osz, dtype ct. */
static tp_val adaptive_counts(tp_emit *e, int nsp, const int64_t *isz, const int64_t *osz, tp_dtype ct) {
  int64_t tot = 1;
  for (int i = 0; i < nsp; i++) tot *= osz[i];
  double *c = malloc(sizeof(double) * (size_t)(tot ? tot : 1));
  if (!c) return em_fail(e, TP_RESOURCE_EXHAUSTED, "out of memory building a program");
  for (int64_t q = 0; q < tot; q++) {
    int64_t r = q;
    double v = 1;
    for (int i = nsp - 1; i >= 0; i--) {
      int64_t oi = r % osz[i];
      r /= osz[i];
      int64_t a = (oi * isz[i]) / osz[i], b = ((oi + 1) * isz[i] + osz[i] - 1) / osz[i];
      v *= (double)(b - a);
    }
    c[q] = v;
  }
  tp_val r = const_f(e, c, tot, ct == TP_F64 ? TP_F64 : TP_F32);
  free(c);
  return em_reshape(e, em_convert(e, r, ct), nsp, osz);
}

/* _adaptive_avg_poolNd(self, output_size) */
static void adaptive_avg_pool(tp_emit *e, const tp_node *n, tp_val *o, int nsp) {
  tp_val x0 = lw_value(e, n, 0);
  tp_type t = *em_type(e, x0);
  int L = t.rank - nsp;
  if (L < 1) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: bad input rank %d", n->op, t.rank);
    return;
  }
  tp_dtype ct = lw_opmath(n->outs[0].dt);
  tp_val x = em_convert(e, x0, ct);
  int64_t isz[3], osz[3], map[3];
  for (int i = 0; i < nsp; i++) {
    isz[i] = t.dims[L + i];
    osz[i] = n->outs[0].dims[L + i];
    map[i] = L + i;
  }
  for (int i = 0; i < nsp; i++) x = adaptive_sum_dim(e, x, L + i, osz[i]);
  tp_type st = *em_type(e, x);
  o[0] = as_out(e, n, 0, dv(e, x, bcast(e, adaptive_counts(e, nsp, isz, osz, ct), &st, map)));
}
static void r_adaptive_avg_pool2d(tp_emit *e, const tp_node *n, tp_val *o) { adaptive_avg_pool(e, n, o, 2); }
static void r_adaptive_avg_pool3d(tp_emit *e, const tp_node *n, tp_val *o) { adaptive_avg_pool(e, n, o, 3); }

/* _adaptive_avg_poolNd_backward(grad_output, self) */
static void adaptive_avg_pool_backward(tp_emit *e, const tp_node *n, tp_val *o, int nsp) {
  tp_type t = *em_type(e, lw_value(e, n, 1));
  tp_dtype ct = lw_opmath(n->outs[0].dt);
  tp_val g = lw_tensor(e, n, 0, ct);
  tp_type gt = *em_type(e, g);
  int L = t.rank - nsp;
  if (L < 1 || gt.rank != t.rank) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: bad input rank %d", n->op, t.rank);
    return;
  }
  int64_t isz[3], osz[3], map[3];
  for (int i = 0; i < nsp; i++) {
    isz[i] = t.dims[L + i];
    osz[i] = gt.dims[L + i];
    map[i] = L + i;
  }
  g = dv(e, g, bcast(e, adaptive_counts(e, nsp, isz, osz, ct), &gt, map));
  for (int i = 0; i < nsp; i++) {
    int d = L + i;
    int64_t I = isz[i], O = osz[i];
    int64_t *start = malloc(sizeof(int64_t) * (size_t)(3 * O + 1));
    if (!start) {
      o[0] = em_fail(e, TP_RESOURCE_EXHAUSTED, "out of memory building a program");
      return;
    }
    int64_t *len = start + O, *ix = start + 2 * O;
    int64_t maxlen = adaptive_bins(I, O, start, len);
    tp_val acc = -1;
    for (int64_t j = 0; j < maxlen; j++) {
      tp_val v = g;
      int all = 1;
      for (int64_t q = 0; q < O; q++) all &= j < len[q];
      if (!all) {
        for (int64_t q = 0; q < O; q++) ix[q] = j < len[q];
        tp_type vt = *em_type(e, v);
        tp_type mt = vt;
        mt.dt = TP_I64;
        int64_t dd = d;
        tp_val m = bcast(e, const_i64(e, ix, O), &mt, &dd);
        v = em_select(e, em_compare(e, "NE", m, em_full(e, 0, &mt)), v, kf(e, v, 0));
      }
      for (int64_t q = 0; q < O; q++) ix[q] = start[q] + j < I ? start[q] + j : I - 1;
      tp_val sc = scatter_add_dim(e, v, d, ix, I);
      acc = acc < 0 ? sc : add(e, acc, sc);
    }
    free(start);
    if (acc < 0) { /* O == 0 or I == 0 */
      tp_type zt = *em_type(e, g);
      zt.dims[d] = I;
      acc = em_full(e, 0, &zt);
    }
    g = acc;
  }
  o[0] = as_out(e, n, 0, g);
}
static void r_adaptive_avg_pool2d_backward(tp_emit *e, const tp_node *n, tp_val *o) {
  adaptive_avg_pool_backward(e, n, o, 2);
}
static void r_adaptive_avg_pool3d_backward(tp_emit *e, const tp_node *n, tp_val *o) {
  adaptive_avg_pool_backward(e, n, o, 3);
}

/* adaptive_max_poolNd(self, output_size) -> (out, indices): bins as for
 * adaptive average pooling; the window is scanned in row-major order like
 * PyTorch's CPU kernel: the first maximum wins, and a NaN always replaces
 * (so the last NaN wins).  Indices are flat within the input plane. */
static void adaptive_max_pool(tp_emit *e, const tp_node *n, tp_val *o, int nsp) {
  tp_type t = *em_type(e, lw_value(e, n, 0));
  t.dt = lw_opmath(t.dt); /* exact; see max_pool */
  tp_val x = lw_tensor(e, n, 0, t.dt);
  int L = t.rank - nsp;
  if (L != 1 && L != 2) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: expected a %dD or %dD input, got %dD", n->op, nsp + 1, nsp + 2,
                   t.rank);
    return;
  }
  const tp_type *ot = OUT(0);
  int64_t isz[3], osz[3], maxlen[3] = {1, 1, 1}, nk = 1, tot = 0;
  for (int i = 0; i < nsp; i++) {
    isz[i] = t.dims[L + i];
    osz[i] = ot->dims[L + i];
    tot += osz[i];
  }
  /* start/len per dim, then per-step gather indices and validity */
  int64_t *buf = malloc(sizeof(int64_t) * (size_t)(3 * tot + 1));
  if (!buf) {
    o[0] = em_fail(e, TP_RESOURCE_EXHAUSTED, "out of memory building a program");
    return;
  }
  int64_t *start[3], *len[3], *ix = buf + 2 * tot;
  for (int i = 0, at = 0; i < nsp; i++) {
    start[i] = buf + at;
    len[i] = buf + tot + at;
    at += (int)osz[i];
    maxlen[i] = osz[i] > 0 ? adaptive_bins(isz[i], osz[i], start[i], len[i]) : 0;
    nk *= maxlen[i];
  }
  tp_type vt = *ot;
  vt.dt = t.dt;
  tp_type it = vt;
  it.dt = TP_I64;
  int isf = tp_dtype_is_float(t.dt);
  tp_val m = em_full(e, 0, &vt), idx = em_full(e, -1, &it);
  for (int64_t q = 0; q < nk && !em_failed(e); q++) {
    int64_t koff[3] = {0, 0, 0}, r = q;
    for (int i = nsp - 1; i >= 0; i--) {
      koff[i] = r % maxlen[i];
      r /= maxlen[i];
    }
    tp_val v = x, valid = -1, flat = -1;
    for (int i = 0; i < nsp; i++) {
      int64_t O = osz[i], dd = L + i;
      int all = 1;
      for (int64_t b = 0; b < O; b++) {
        int64_t end = start[i][b] + len[i][b];
        ix[b] = start[i][b] + koff[i] < end ? start[i][b] + koff[i] : end - 1;
        all &= koff[i] < len[i][b];
      }
      v = gather_dim(e, v, (int)dd, ix, O);
      tp_val pos = bcast(e, const_i64(e, ix, O), &it, &dd);
      flat = flat < 0 ? pos : add(e, mul(e, flat, em_full(e, (double)isz[i], &it)), pos);
      if (!all) {
        for (int64_t b = 0; b < O; b++) ix[b] = koff[i] < len[i][b];
        tp_val ok = em_compare(e, "NE", bcast(e, const_i64(e, ix, O), &it, &dd), em_full(e, 0, &it));
        valid = valid < 0 ? ok : em_binary(e, "stablehlo.and", valid, ok);
      }
    }
    max_scan_step(e, v, flat, valid, isf, &m, &idx);
  }
  free(buf);
  o[0] = em_convert(e, m, ot->dt);
  if (n->nouts > 1) o[1] = em_convert(e, idx, n->outs[1].dt);
}
static void r_adaptive_max_pool2d(tp_emit *e, const tp_node *n, tp_val *o) { adaptive_max_pool(e, n, o, 2); }
static void r_adaptive_max_pool3d(tp_emit *e, const tp_node *n, tp_val *o) { adaptive_max_pool(e, n, o, 3); }

/* fractional_max_poolNd(self, kernel_size, output_size, random_samples) -> (out, indices).
 * Window starts per plane and dim follow PyTorch's CPU generate_intervals:
 * alpha = (in - k) / (out - 1), start[j] = int((j + u) * alpha) - int(u * alpha)
 * for j < out - 1 and in - k for the last, computed in the input's dtype (each
 * step rounded for float16/bfloat16, as c10's Half/BFloat16 arithmetic does).
 * u is random_samples[plane][s], s counting the spatial dims from the last one
 * for 2d (W, H) and from the first one for 3d (T, H, W).  Since the meta
 * function keeps alpha >= 1, any sample, even outside [0, 1), gives starts in
 * [0, in - k]; they are still checked (raising at the next synchronisation,
 * where the CPU kernel asserts) and clamped, as a guard for rounding the
 * formula does not foresee.  The window is scanned like max_pool's. */
static void fractional_max_pool(tp_emit *e, const tp_node *n, tp_val *o, int nsp) {
  tp_type t = *em_type(e, lw_value(e, n, 0));
  int L = t.rank - nsp;
  const int64_t *k, *osz_arg;
  if ((L != 1 && L != 2) || lw_ints(n, 1, &k) != nsp || lw_ints(n, 2, &osz_arg) != nsp) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: expected a %dD or %dD input with %d kernel and output sizes", n->op,
                   nsp + 1, nsp + 2, nsp);
    return;
  }
  tp_dtype dt = t.dt, ct = lw_opmath(dt);
  if (!tp_dtype_is_float(dt)) {
    o[0] = lw_not_for(e, nsp == 2 ? "fractional_max_pool2d_out_frame" : "fractional_max_pool3d_out_frame", dt);
    return;
  }
  if (lw_dtype(e, n, 3) != dt) { /* PyTorch's meta function checks this for 2d only; its kernels for both */
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "Expect _random_samples to have the same dtype as input");
    return;
  }
  tp_val x = em_reshape(e, lw_tensor(e, n, 0, ct), 1, (int64_t[]){numel_of(&t)});
  tp_val smp = lw_tensor(e, n, 3, ct);
  tp_type st = *em_type(e, smp);
  int64_t batch = L == 2 ? t.dims[0] : 1, lead[2] = {batch, t.dims[L - 1]};
  if (st.rank != 3 || st.dims[2] != nsp || st.dims[0] < batch || st.dims[1] != t.dims[L - 1]) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT,
                   "%s: random_samples must have shape [N, %" PRId64 ", %d] with N at least the batch size %" PRId64,
                   n->op, t.dims[L - 1], nsp, batch);
    return;
  }
  const tp_type *ot = OUT(0);
  tp_type it = *ot;
  it.dt = TP_I64;
  tp_type ft = *ot;
  ft.dt = ct;
  int64_t lead_map[2] = {0, 1}, plane = 1;
  for (int i = 0; i < nsp; i++) plane *= t.dims[L + i];
  /* per-dim window starts, broadcast to the output's shape */
  tp_val start[3];
  for (int i = 0; i < nsp && !em_failed(e); i++) {
    int s = nsp == 2 ? 1 - i : i;
    int64_t in = t.dims[L + i], out = ot->dims[L + i], kk = k[i];
    tp_val u = em_slice(e, smp, (int64_t[]){0, 0, s}, (int64_t[]){batch, st.dims[1], s + 1}, NULL);
    u = em_reshape(e, u, L, L == 2 ? lead : lead + 1);
    u = bcast(e, u, &ft, lead_map);
    tp_val alpha = em_round_to(e, dv(e, em_round_to(e, em_full(e, (double)(in - kk), &ft), dt),
                                     em_round_to(e, em_full(e, (double)(out > 1 ? out - 1 : 1), &ft), dt)),
                               dt);
    int64_t dd = L + i;
    tp_val j = em_round_to(e, em_convert(e, em_iota(e, &it, (int)dd), ct), dt);
    tp_val a = em_convert(e, em_round_to(e, mul(e, em_round_to(e, add(e, j, u), dt), alpha), dt), TP_I64);
    tp_val b = em_convert(e, em_round_to(e, mul(e, u, alpha), dt), TP_I64);
    tp_val last = em_compare(e, "EQ", em_iota(e, &it, (int)dd), em_full(e, (double)(out - 1), &it));
    start[i] = em_select(e, last, em_full(e, (double)(in - kk), &it), em_binary(e, "stablehlo.subtract", a, b));
    lw_check_range(e, n, start[i], 0, in - kk + 1, TP_INVALID_ARGUMENT,
                   "%s: a random sample gives the window start {} along spatial dim %d, outside [0, %" PRId64
                   "]; random_samples must lie in [0, 1)",
                   n->op, i, in - kk);
  }
  /* plane offset of each output element in the flattened input */
  tp_val base = em_full(e, 0, &it);
  for (int i = 0; i < L; i++) base = add(e, mul(e, base, em_full(e, (double)t.dims[i], &it)), em_iota(e, &it, i));
  base = mul(e, base, em_full(e, (double)plane, &it));
  int64_t nk = 1;
  for (int i = 0; i < nsp; i++) nk *= k[i];
  tp_val m = em_full(e, 0, &ft), idx = em_full(e, -1, &it);
  /* gather positions clamped, so that a bad sample (reported above) cannot read outside the input */
  tp_val at_lo = em_const(e, 0, TP_I64), at_hi = em_const(e, (double)(numel_of(&t) - 1), TP_I64);
  for (int64_t q = 0; q < nk && !em_failed(e); q++) {
    int64_t r = q, koff[3] = {0, 0, 0};
    for (int i = nsp - 1; i >= 0; i--) {
      koff[i] = r % k[i];
      r /= k[i];
    }
    tp_val flat = -1;
    for (int i = 0; i < nsp; i++) {
      tp_val pos = add(e, start[i], em_full(e, (double)koff[i], &it));
      flat = flat < 0 ? pos : add(e, mul(e, flat, em_full(e, (double)t.dims[L + i], &it)), pos);
    }
    tp_val at = em_clamp(e, at_lo, add(e, base, flat), at_hi);
    max_scan_step(e, em_gather_flat(e, x, at), flat, -1, 1, &m, &idx);
  }
  o[0] = em_convert(e, m, ot->dt);
  if (n->nouts > 1) o[1] = em_convert(e, idx, n->outs[1].dt);
}
static void r_fractional_max_pool2d(tp_emit *e, const tp_node *n, tp_val *o) { fractional_max_pool(e, n, o, 2); }
static void r_fractional_max_pool3d(tp_emit *e, const tp_node *n, tp_val *o) { fractional_max_pool(e, n, o, 3); }
/* fractional_max_poolNd_backward(grad_output, self, kernel_size, output_size, indices) */
static void r_fractional_max_pool2d_backward(tp_emit *e, const tp_node *n, tp_val *o) {
  max_pool_backward(e, n, o, 2, 4);
}
static void r_fractional_max_pool3d_backward(tp_emit *e, const tp_node *n, tp_val *o) {
  max_pool_backward(e, n, o, 3, 4);
}

/* ---- upsampling ------------------------------------------------------------------------------ */

/* PyTorch's compute_scales_value: 1/scale if given (> 0), else in/out, in
 * float, or in double for float64 inputs (the kernels' opmath type). */
static double up_scale(const tp_node *n, int si, int64_t in, int64_t out, int dbl) {
  if (!lw_is_none(n, si)) {
    double sc = lw_float(n, si, 0);
    if (sc > 0) return dbl ? 1.0 / sc : (double)(float)(1.0 / sc);
  }
  return dbl ? (double)in / (double)out : (double)((float)in / (float)out);
}

/* Source indices of nearest (exact=0) / nearest-exact (exact=1) sampling
 * along one dim, as PyTorch's CPU kernels pick them (UpSample.h,
 * cpu/UpSampleKernel.cpp).  Two rules, by kernel:
 *  - legacy: nearest_idx / nearest_exact_idx, used by the backward kernels
 *    and the channels-last forward kernel (which 2-d inputs also take when
 *    out_h + out_w <= 128): nearest copies when out == in and halves when
 *    out == 2 * in, whatever the given scale; float math.
 *  - otherwise HelperInterpNearest(Exact), the generic forward kernel: always
 *    samples with the scale (1/scale_factor when given), in the opmath type
 *    (double for float64: dbl), then floorf.
 * The casts copy each kernel's float/double rounding, and fma(f) its
 * scale * (j + 0.5) - 0.5: PyTorch's AVX2/AVX-512 kernels are built with FMA
 * and the compiler contracts it into one fused multiply-add (C11 does not
 * contract, so the other roundings stay the kernels'). */
static void nearest_src(const tp_node *n, int si, int64_t in, int64_t out, int exact, int legacy, int dbl,
                        int64_t *src) {
  double sd = up_scale(n, si, in, out, dbl && !legacy);
  float sf = (float)sd;
  for (int64_t j = 0; j < out; j++) {
    int64_t v;
    if (legacy && !exact) {
      if (out == in) v = j;
      else if (out == 2 * in) v = j >> 1;
      else v = (int64_t)floorf((float)j * sf);
    } else if (legacy) {
      v = (int64_t)floorf((float)(((double)j + 0.5) * (double)sf));
    } else if (dbl) {
      double r = exact ? fma(sd, (double)j + 0.5, -0.5) : sd * (double)j;
      if (r < 0) r = 0;
      v = (int64_t)floorf((float)(exact ? r + 0.5 : r));
    } else {
      float r = exact ? fmaf(sf, (float)j + 0.5f, -0.5f) : sf * (float)j;
      if (r < 0) r = 0;
      v = (int64_t)floorf(exact ? (float)((double)r + 0.5) : r);
    }
    src[j] = v < in - 1 ? v : in - 1;
  }
}

/* Whether src (out entries) is 0, 1, ..., in - 1: the dim is left as is. */
static int src_identity(const int64_t *src, int64_t in, int64_t out) {
  if (in != out) return 0;
  for (int64_t j = 0; j < out; j++)
    if (src[j] != j) return 0;
  return 1;
}

/* upsample_nearestNd(self, output_size, scales...) */
static void upsample_nearest(tp_emit *e, const tp_node *n, tp_val *o, int nsp, int exact) {
  tp_val x = lw_value(e, n, 0);
  tp_type t = *em_type(e, x);
  int L = t.rank - nsp;
  if (L < 1) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: bad input rank %d", n->op, t.rank);
    return;
  }
  /* The CPU's 2-d forward takes its channels-last kernel (the legacy
   * indices) for small outputs, whatever the layout; its 1-d and 3-d ones
   * (contiguous inputs) the generic kernel. */
  int legacy = nsp == 2 && n->outs[0].dims[L] + n->outs[0].dims[L + 1] <= 128;
  for (int i = 0; i < nsp; i++) {
    int64_t in = t.dims[L + i], out = n->outs[0].dims[L + i];
    int64_t *src = malloc(sizeof(int64_t) * (size_t)(out + 1));
    if (!src) {
      o[0] = em_fail(e, TP_RESOURCE_EXHAUSTED, "out of memory building a program");
      return;
    }
    nearest_src(n, 2 + i, in, out, exact, legacy, t.dt == TP_F64, src);
    if (in > 0 && !src_identity(src, in, out)) x = gather_dim(e, x, L + i, src, out);
    free(src);
  }
  o[0] = em_convert(e, x, n->outs[0].dt);
}
static void r_upsample_nearest1d(tp_emit *e, const tp_node *n, tp_val *o) { upsample_nearest(e, n, o, 1, 0); }
static void r_upsample_nearest2d(tp_emit *e, const tp_node *n, tp_val *o) { upsample_nearest(e, n, o, 2, 0); }
static void r_upsample_nearest3d(tp_emit *e, const tp_node *n, tp_val *o) { upsample_nearest(e, n, o, 3, 0); }
static void r_upsample_nearest_exact1d(tp_emit *e, const tp_node *n, tp_val *o) { upsample_nearest(e, n, o, 1, 1); }
static void r_upsample_nearest_exact2d(tp_emit *e, const tp_node *n, tp_val *o) { upsample_nearest(e, n, o, 2, 1); }
static void r_upsample_nearest_exact3d(tp_emit *e, const tp_node *n, tp_val *o) { upsample_nearest(e, n, o, 3, 1); }

/* upsample_nearestNd_backward(grad_output, output_size, input_size, scales...):
 * the CPU's backward kernels use the legacy indices (nearest_src). */
static void upsample_nearest_backward(tp_emit *e, const tp_node *n, tp_val *o, int nsp, int exact) {
  tp_dtype ct = lw_opmath(n->outs[0].dt);
  tp_val g = lw_tensor(e, n, 0, ct);
  tp_type t = *em_type(e, g);
  int L = t.rank - nsp;
  if (L < 1 || n->outs[0].rank != t.rank) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: bad grad_output rank %d", n->op, t.rank);
    return;
  }
  for (int i = 0; i < nsp; i++) {
    int64_t in = n->outs[0].dims[L + i], out = t.dims[L + i];
    int64_t *src = malloc(sizeof(int64_t) * (size_t)(out + 1));
    if (!src) {
      o[0] = em_fail(e, TP_RESOURCE_EXHAUSTED, "out of memory building a program");
      return;
    }
    nearest_src(n, 3 + i, in, out, exact, 1, 0, src);
    if (!src_identity(src, in, out)) g = scatter_add_dim(e, g, L + i, src, in);
    free(src);
  }
  o[0] = em_convert(e, g, n->outs[0].dt);
}
static void r_upsample_nearest1d_bw(tp_emit *e, const tp_node *n, tp_val *o) { upsample_nearest_backward(e, n, o, 1, 0); }
static void r_upsample_nearest2d_bw(tp_emit *e, const tp_node *n, tp_val *o) { upsample_nearest_backward(e, n, o, 2, 0); }
static void r_upsample_nearest3d_bw(tp_emit *e, const tp_node *n, tp_val *o) { upsample_nearest_backward(e, n, o, 3, 0); }
static void r_upsample_nearest_exact1d_bw(tp_emit *e, const tp_node *n, tp_val *o) {
  upsample_nearest_backward(e, n, o, 1, 1);
}
static void r_upsample_nearest_exact2d_bw(tp_emit *e, const tp_node *n, tp_val *o) {
  upsample_nearest_backward(e, n, o, 2, 1);
}
static void r_upsample_nearest_exact3d_bw(tp_emit *e, const tp_node *n, tp_val *o) {
  upsample_nearest_backward(e, n, o, 3, 1);
}

/* Linear interpolation along one dim: indices i0, i1 and weights l0, l1, as
 * the CPU's compute_source_index_and_lambda (UpSample.h) makes them: a dim
 * that keeps its size is copied (even when a scale_factor says otherwise);
 * else area_pixel_compute_scale/_source_index (fused, see nearest_src) and
 * guard_index_and_lambda, in float, or double for float64 (dbl).  Returns 1
 * for a copied dim. */
static int linear_src(const tp_node *n, int si, int align, int64_t in, int64_t out, int64_t *i0, int64_t *i1,
                      double *l0, double *l1, int dbl) {
  if (in == out) return 1;
  double scale;
  if (align) scale = out <= 1 ? 0.0 : dbl ? (double)(in - 1) / (double)(out - 1)
                                          : (double)((float)(in - 1) / (float)(out - 1));
  else scale = up_scale(n, si, in, out, dbl);
  for (int64_t j = 0; j < out; j++) {
    double src, lam;
    int64_t a;
    if (dbl) {
      src = align ? scale * (double)j : fma(scale, (double)j + 0.5, -0.5);
      if (!align && src < 0) src = 0;
      a = (int64_t)floorf((float)src); /* floorf, as guard_index_and_lambda */
      if (a > in - 1) a = in - 1;
      lam = src - (double)a;
    } else {
      float sf = (float)scale, s2 = align ? sf * (float)j : fmaf(sf, (float)j + 0.5f, -0.5f);
      if (!align && s2 < 0) s2 = 0;
      a = (int64_t)floorf(s2);
      if (a > in - 1) a = in - 1;
      lam = s2 - (float)a;
    }
    lam = lam < 0 ? 0 : lam > 1 ? 1 : lam;
    i0[j] = a;
    i1[j] = a + (a < in - 1 ? 1 : 0);
    l1[j] = lam;
    l0[j] = dbl ? 1.0 - lam : (double)(1.0f - (float)lam);
  }
  return 0;
}

/* uint8 images: the CPU's separable kernel rounds each pass's result to the
 * nearest uint8 (its int16 fixed-point weights can move a value by one). */
static tp_val round_to_u8(tp_emit *e, tp_val x) {
  tp_val r = em_unary(e, "stablehlo.round_nearest_afz", x);
  return em_clamp(e, em_const(e, 0, em_type(e, x)->dt), r, em_const(e, 255, em_type(e, x)->dt));
}

/* upsample_linear1d / upsample_bilinear2d / upsample_trilinear3d
 * (self, output_size, align_corners, scales...): separable, innermost dim
 * first; uint8 (the one integer dtype the CPU takes) in float32. */
static void upsample_linear(tp_emit *e, const tp_node *n, tp_val *o, int nsp) {
  int u8 = n->outs[0].dt == TP_U8;
  tp_dtype ct = u8 ? TP_F32 : lw_opmath(n->outs[0].dt);
  tp_val x = lw_tensor(e, n, 0, ct);
  tp_type t = *em_type(e, x);
  int L = t.rank - nsp, align = lw_bool(n, 2, 0);
  if (L < 1) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: bad input rank %d", n->op, t.rank);
    return;
  }
  for (int i = nsp - 1; i >= 0; i--) {
    int d = L + i;
    int64_t in = em_type(e, x)->dims[d], out = n->outs[0].dims[d];
    if (in == 0 || out == 0) {
      tp_type zt = *em_type(e, x);
      zt.dims[d] = out;
      x = em_full(e, 0, &zt);
      continue;
    }
    int64_t *i0 = malloc(sizeof(int64_t) * (size_t)(2 * out)), *i1 = i0 ? i0 + out : NULL;
    double *l0 = malloc(sizeof(double) * (size_t)(2 * out)), *l1 = l0 ? l0 + out : NULL;
    if (!i0 || !l0) {
      free(i0);
      free(l0);
      o[0] = em_fail(e, TP_RESOURCE_EXHAUSTED, "out of memory building a program");
      return;
    }
    if (!linear_src(n, 3 + i, align, in, out, i0, i1, l0, l1, ct == TP_F64)) {
      tp_val a = gather_dim(e, x, d, i0, out), b = gather_dim(e, x, d, i1, out);
      tp_type at = *em_type(e, a);
      int64_t dd = d;
      tp_val w0 = bcast(e, const_f(e, l0, out, ct), &at, &dd), w1 = bcast(e, const_f(e, l1, out, ct), &at, &dd);
      x = add(e, mul(e, a, w0), mul(e, b, w1));
      if (u8) x = round_to_u8(e, x);
    }
    free(i0);
    free(l0);
  }
  o[0] = em_convert(e, x, n->outs[0].dt);
}
static void r_upsample_linear1d(tp_emit *e, const tp_node *n, tp_val *o) { upsample_linear(e, n, o, 1); }
static void r_upsample_bilinear2d(tp_emit *e, const tp_node *n, tp_val *o) { upsample_linear(e, n, o, 2); }
static void r_upsample_trilinear3d(tp_emit *e, const tp_node *n, tp_val *o) { upsample_linear(e, n, o, 3); }

/* ..._backward(grad_output, output_size, input_size, align_corners, scales...) */
static void upsample_linear_backward(tp_emit *e, const tp_node *n, tp_val *o, int nsp) {
  tp_dtype ct = lw_opmath(n->outs[0].dt);
  tp_val g = lw_tensor(e, n, 0, ct);
  tp_type t = *em_type(e, g);
  int L = t.rank - nsp, align = lw_bool(n, 3, 0);
  if (L < 1 || n->outs[0].rank != t.rank) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: bad grad_output rank %d", n->op, t.rank);
    return;
  }
  for (int i = 0; i < nsp; i++) { /* the transpose of the forward: outermost dim first */
    int d = L + i;
    int64_t in = n->outs[0].dims[d], out = em_type(e, g)->dims[d];
    if (in == 0 || out == 0) {
      tp_type zt = *em_type(e, g);
      zt.dims[d] = in;
      g = em_full(e, 0, &zt);
      continue;
    }
    int64_t *i0 = malloc(sizeof(int64_t) * (size_t)(2 * out)), *i1 = i0 ? i0 + out : NULL;
    double *l0 = malloc(sizeof(double) * (size_t)(2 * out)), *l1 = l0 ? l0 + out : NULL;
    if (!i0 || !l0) {
      free(i0);
      free(l0);
      o[0] = em_fail(e, TP_RESOURCE_EXHAUSTED, "out of memory building a program");
      return;
    }
    if (!linear_src(n, 4 + i, align, in, out, i0, i1, l0, l1, ct == TP_F64)) {
      tp_type gt = *em_type(e, g);
      int64_t dd = d;
      tp_val w0 = bcast(e, const_f(e, l0, out, ct), &gt, &dd), w1 = bcast(e, const_f(e, l1, out, ct), &gt, &dd);
      g = add(e, scatter_add_dim(e, mul(e, g, w0), d, i0, in), scatter_add_dim(e, mul(e, g, w1), d, i1, in));
    }
    free(i0);
    free(l0);
  }
  o[0] = em_convert(e, g, n->outs[0].dt);
}
static void r_upsample_linear1d_bw(tp_emit *e, const tp_node *n, tp_val *o) { upsample_linear_backward(e, n, o, 1); }
static void r_upsample_bilinear2d_bw(tp_emit *e, const tp_node *n, tp_val *o) { upsample_linear_backward(e, n, o, 2); }
static void r_upsample_trilinear3d_bw(tp_emit *e, const tp_node *n, tp_val *o) { upsample_linear_backward(e, n, o, 3); }


/* ---- antialiased interpolation (_upsample_bilinear2d_aa / _upsample_bicubic2d_aa) -------------- */

/* The aa filters of PyTorch's CPU kernels (the bicubic one with a = -0.5, as PIL). */
static double aa_filter(double x, int cubic) {
  x = fabs(x);
  if (!cubic) return x < 1.0 ? 1.0 - x : 0.0;
  const double a = -0.5;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
  if (x < 2.0) return ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a;
  return 0.0;
}

/* Along one dim: output j reads inputs xmin[j] + k, k < *K, with weight
 * w[j * K + k] (0 past its window; the index is then clamped into range).
 * The filter widens by the scale when downsampling, so every input pixel
 * contributes.  Returns 0, or -1 when out of memory. */
static int aa_weights(const tp_node *n, int si, int align, int64_t in, int64_t out, int cubic, int64_t *K,
                      int64_t **idx, double **w) {
  double scale;
  if (align) scale = out > 1 ? (double)(in - 1) / (double)(out - 1) : 0.0;
  else if (!lw_is_none(n, si) && lw_float(n, si, 0) > 0) scale = 1.0 / lw_float(n, si, 0);
  else scale = (double)in / (double)out;
  double support = (cubic ? 2.0 : 1.0) * (scale >= 1.0 ? scale : 1.0);
  double invscale = scale >= 1.0 ? 1.0 / scale : 1.0;
  *K = (int64_t)ceil(support) * 2 + 1;
  *idx = malloc(sizeof(int64_t) * (size_t)(out * *K));
  *w = calloc((size_t)(out * *K), sizeof(double));
  if (!*idx || !*w) {
    free(*idx);
    free(*w);
    return -1;
  }
  for (int64_t j = 0; j < out; j++) {
    double center = scale * ((double)j + 0.5), total = 0.0;
    int64_t lo = (int64_t)(center - support + 0.5), hi = (int64_t)(center + support + 0.5);
    if (lo < 0) lo = 0;
    if (hi > in) hi = in;
    for (int64_t k = 0; k < *K; k++) {
      int64_t src = lo + k;
      (*idx)[j * *K + k] = src < in ? src : in - 1;
      if (src < hi) total += (*w)[j * *K + k] = aa_filter(((double)src - center + 0.5) * invscale, cubic);
    }
    if (total != 0.0)
      for (int64_t k = 0; k < *K; k++) (*w)[j * *K + k] /= total;
  }
  return 0;
}

/* x (or, backward, the gradient g) with dim d resampled through the weights:
 * forward  out[j] = sum_k w[j, k] x[idx[j, k]];
 * backward in[idx[j, k]] += w[j, k] g[j]. */
static tp_val aa_apply(tp_emit *e, tp_val x, int d, int64_t in, int64_t out, int64_t K, const int64_t *idx,
                       const double *w, int backward) {
  tp_dtype ct = em_type(e, x)->dt;
  int64_t *ik = malloc(sizeof(int64_t) * (size_t)out);
  double *wk = malloc(sizeof(double) * (size_t)out);
  tp_val acc = -1;
  if (!ik || !wk) {
    free(ik);
    free(wk);
    return em_fail(e, TP_RESOURCE_EXHAUSTED, "out of memory building a program");
  }
  int64_t dd = d;
  for (int64_t k = 0; k < K; k++) {
    int any = 0;
    for (int64_t j = 0; j < out; j++) {
      ik[j] = idx[j * K + k];
      wk[j] = w[j * K + k];
      any |= wk[j] != 0.0;
    }
    if (!any) continue;
    tp_val term;
    if (backward) {
      tp_type gt = *em_type(e, x);
      term = scatter_add_dim(e, mul(e, x, bcast(e, const_f(e, wk, out, ct), &gt, &dd)), d, ik, in);
    } else {
      tp_val g = gather_dim(e, x, d, ik, out);
      tp_type gt = *em_type(e, g);
      term = mul(e, g, bcast(e, const_f(e, wk, out, ct), &gt, &dd));
    }
    acc = acc < 0 ? term : add(e, acc, term);
  }
  free(ik);
  free(wk);
  if (acc < 0) { /* no weights at all (an empty dim) */
    tp_type zt = *em_type(e, x);
    zt.dims[d] = backward ? in : out;
    acc = em_full(e, 0, &zt);
  }
  return acc;
}

/* _upsample_{bilinear,bicubic}2d_aa(self, output_size, align_corners, scales_h, scales_w) and
 * their _backward(grad_output, output_size, input_size, align_corners, scales_h, scales_w):
 * separable, the last dim first (forward); the backward is the transpose. */
static void upsample_aa(tp_emit *e, const tp_node *n, tp_val *o, int cubic, int backward) {
  tp_dtype dt = n->outs[0].dt;
  if (!tp_dtype_is_float(dt)) {
    o[0] = em_fail(e, TP_UNIMPLEMENTED, "%s: antialiased interpolation of %s tensors is not supported on tpu; "
                   "convert the input to a float dtype first", n->op, tp_dtype_name(dt));
    return;
  }
  tp_dtype ct = lw_opmath(dt);
  tp_val x = lw_tensor(e, n, 0, ct);
  tp_type t = *em_type(e, x);
  int align = lw_bool(n, backward ? 3 : 2, 0), si = backward ? 4 : 3;
  if (t.rank != 4 || n->outs[0].rank != 4) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: expected a 4-d tensor, got %d-d", n->op, t.rank);
    return;
  }
  for (int q = 0; q < 2 && !em_failed(e); q++) {
    int i = backward ? q : 1 - q, d = 2 + i;
    /* sizes of the forward's input and output along d */
    int64_t in = backward ? n->outs[0].dims[d] : t.dims[d], out = backward ? t.dims[d] : n->outs[0].dims[d];
    /* the CPU's separable forward leaves a dim that keeps its size as is; its
     * backward kernel resamples every dim (with a given scale, no copy) */
    if (in == out && !backward) continue;
    if (in == 0 || out == 0) {
      tp_type zt = *em_type(e, x);
      zt.dims[d] = backward ? in : out;
      x = em_full(e, 0, &zt);
      continue;
    }
    int64_t K, *idx;
    double *w;
    if (aa_weights(n, si + i, align, in, out, cubic, &K, &idx, &w) < 0) {
      o[0] = em_fail(e, TP_RESOURCE_EXHAUSTED, "out of memory building a program");
      return;
    }
    x = aa_apply(e, x, d, in, out, K, idx, w, backward);
    free(idx);
    free(w);
  }
  o[0] = em_convert(e, x, dt);
}
static void r_upsample_bilinear2d_aa(tp_emit *e, const tp_node *n, tp_val *o) { upsample_aa(e, n, o, 0, 0); }
static void r_upsample_bicubic2d_aa(tp_emit *e, const tp_node *n, tp_val *o) { upsample_aa(e, n, o, 1, 0); }
static void r_upsample_bilinear2d_aa_bw(tp_emit *e, const tp_node *n, tp_val *o) { upsample_aa(e, n, o, 0, 1); }
static void r_upsample_bicubic2d_aa_bw(tp_emit *e, const tp_node *n, tp_val *o) { upsample_aa(e, n, o, 1, 1); }

/* ---- group norm ------------------------------------------------------------------------------- */

/* native_group_norm(input, weight?, bias?, N, C, HxW, group, eps) -> (out, mean [N, G], rstd [N, G]) */
static void r_group_norm(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x0 = lw_value(e, n, 0);
  int64_t N = lw_int(n, 3, 0), C = lw_int(n, 4, 0), HW = lw_int(n, 5, 0), G = lw_int(n, 6, 1);
  double eps = lw_float(n, 7, 1e-5);
  if (G <= 0 || C % G || numel_of(em_type(e, x0)) != N * C * HW) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: bad N/C/HxW/group for the input", n->op);
    return;
  }
  tp_dtype ct = lw_opmath(n->outs[0].dt);
  int64_t g3[3] = {N, G, C / G * HW}, c3[3] = {N, C, HW}, two = 2;
  tp_val xg = em_reshape(e, em_convert(e, x0, ct), 3, g3);
  tp_type gt = *em_type(e, xg);
  int64_t D = g3[2];
  double invd = D ? 1.0 / (double)D : NAN;
  int64_t m01[2] = {0, 1};
  tp_val mean = mulk(e, rsum(e, xg, &two, 1), invd);
  tp_val d = sub(e, xg, bcast(e, mean, &gt, m01));
  tp_val var = mulk(e, rsum(e, mul(e, d, d), &two, 1), invd);
  tp_val rstd = em_unary(e, "stablehlo.rsqrt", add(e, var, kf(e, var, eps)));
  tp_val y = mul(e, d, bcast(e, rstd, &gt, m01));
  y = em_reshape(e, y, 3, c3);
  tp_type yt = *em_type(e, y);
  int64_t one = 1;
  tp_val w = opt_tensor(e, n, 1, ct), b = opt_tensor(e, n, 2, ct);
  if (w >= 0) y = mul(e, y, bcast(e, w, &yt, &one));
  if (b >= 0) y = add(e, y, bcast(e, b, &yt, &one));
  o[0] = as_out(e, n, 0, y);
  if (n->nouts > 1) o[1] = as_out(e, n, 1, mean);
  if (n->nouts > 2) o[2] = as_out(e, n, 2, rstd);
}

/* native_group_norm_backward(grad_out, input, mean, rstd, weight?, N, C, HxW, group, output_mask)
 * -> (grad_input, grad_weight, grad_bias) */
static void r_group_norm_backward(tp_emit *e, const tp_node *n, tp_val *o) {
  int64_t N = lw_int(n, 5, 0), C = lw_int(n, 6, 0), HW = lw_int(n, 7, 0), G = lw_int(n, 8, 1);
  tp_val x0 = lw_value(e, n, 1);
  if (G <= 0 || C % G || numel_of(em_type(e, x0)) != N * C * HW) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: bad N/C/HxW/group for the input", n->op);
    return;
  }
  int def[3] = {mask_bit(n, 9, 0), mask_bit(n, 9, 1), mask_bit(n, 9, 2)};
  int slot[3];
  if (!map_outs(e, n, def, 3, slot)) return;
  tp_dtype ct = lw_opmath(em_type(e, x0)->dt);
  int64_t c3[3] = {N, C, HW}, g3[3] = {N, G, C / G * HW}, c4[4] = {N, G, C / G, HW}, ng[2] = {N, G};
  tp_val x = em_reshape(e, em_convert(e, x0, ct), 3, c3);
  tp_val dy = em_reshape(e, lw_tensor(e, n, 0, ct), 3, c3);
  tp_val mean = em_reshape(e, lw_tensor(e, n, 2, ct), 2, ng), rstd = em_reshape(e, lw_tensor(e, n, 3, ct), 2, ng);
  tp_val w = opt_tensor(e, n, 4, ct);
  tp_type t3 = *em_type(e, x);
  tp_type t4 = tp_type_make(ct, 4, c4);
  int64_t m01[2] = {0, 1}, one = 1, two = 2, n0 = 0;
  tp_val mean4 = bcast(e, mean, &t4, m01), rstd4 = bcast(e, rstd, &t4, m01);
  if (def[0] && slot[0] >= 0) {
    tp_val g = dy;
    if (w >= 0) g = mul(e, g, bcast(e, w, &t3, &one));
    tp_val g4 = em_reshape(e, g, 4, c4), x4 = em_reshape(e, x, 4, c4);
    tp_val xhat = mul(e, sub(e, x4, mean4), rstd4);
    int64_t rd[2] = {2, 3};
    int64_t D = g3[2];
    double invd = D ? 1.0 / (double)D : 0.0;
    tp_val sg = bcast(e, rsum(e, g4, rd, 2), &t4, m01), sgx = bcast(e, rsum(e, mul(e, g4, xhat), rd, 2), &t4, m01);
    tp_val gi = mul(e, rstd4, sub(e, g4, mulk(e, add(e, sg, mul(e, xhat, sgx)), invd)));
    put_opt(e, n, o, slot, def, 0, gi);
  } else {
    put_opt(e, n, o, slot, def, 0, -1);
  }
  if ((def[1] && slot[1] >= 0) || (def[2] && slot[2] >= 0)) {
    tp_val db = rsum(e, dy, &two, 1); /* [N, C] */
    if (def[1] && slot[1] >= 0) {
      tp_val ds = rsum(e, mul(e, dy, x), &two, 1); /* [N, C] */
      int64_t gc[3] = {N, G, C / G};
      tp_type t3g = tp_type_make(ct, 3, gc);
      tp_val m3 = bcast(e, mean, &t3g, m01), r3 = bcast(e, rstd, &t3g, m01);
      tp_val per = mul(e, sub(e, em_reshape(e, ds, 3, gc), mul(e, em_reshape(e, db, 3, gc), m3)), r3);
      put_opt(e, n, o, slot, def, 1, rsum(e, em_reshape(e, per, 2, (int64_t[]){N, C}), &n0, 1));
    } else {
      put_opt(e, n, o, slot, def, 1, -1);
    }
    put_opt(e, n, o, slot, def, 2, def[2] && slot[2] >= 0 ? rsum(e, db, &n0, 1) : -1);
  } else {
    put_opt(e, n, o, slot, def, 1, -1);
    put_opt(e, n, o, slot, def, 2, -1);
  }
}

/* ---- weight norm ------------------------------------------------------------------------------ */

/* _weight_norm_interface(v, g, dim) -> (w, norm) and its backward, as
 * PyTorch's CPU kernels (cpu/WeightNormKernel.cpp): the norm of v over every
 * dim but `dim` (a dim outside [0, rank), -1 included, takes the whole
 * tensor, as norm_except_dim and the meta function do; the CPU kernels
 * accept only the first and last dim, which is all _weight_norm hands them),
 * accumulated in opmath; a = g / norm stays in opmath and w = v * a is
 * rounded once.  The norm output has the dtype the caller gives (float32
 * for float16/bfloat16 on the CPU). */
/* The CPU kernels' dtypes: float, double, half, bfloat16. */
static int wn_dtype_ok(tp_dtype dt) { return dt == TP_F32 || dt == TP_F64 || dt == TP_F16 || dt == TP_BF16; }

/* What both rules start from: v in opmath, the dims its norm reduces (all
 * but `dim`) and those it keeps, and all of v's dims (a compiled 1-d v's
 * whole-tensor form).  0 after a failure (a dtype without a CPU kernel). */
typedef struct wn_v {
  tp_type t; /* v's sizes, opmath dtype */
  tp_val vc; /* v in opmath */
  int nr;
  int64_t red[TP_MAX_RANK], kept[TP_MAX_RANK], all[TP_MAX_RANK];
} wn_v;

static int wn_begin(tp_emit *e, tp_val v, int64_t dim, const char *kernel, tp_val *o, wn_v *w) {
  w->t = *em_type(e, v);
  if (!wn_dtype_ok(w->t.dt)) {
    o[0] = lw_not_for(e, kernel, w->t.dt);
    return 0;
  }
  w->t.dt = lw_opmath(w->t.dt);
  w->vc = em_convert(e, v, w->t.dt);
  w->nr = kept_dims(w->t.rank, &dim, 1, w->red);
  kept_dims(w->t.rank, w->red, w->nr, w->kept);
  for (int i = 0; i < w->t.rank; i++) w->all[i] = i;
  return 1;
}

/* Argument i (g or a saved norm), in dtype ct, shaped like the per-slice
 * value `like` (the same number of elements: g is [C, 1, 1] or [C]). */
static tp_val wn_per_slice(tp_emit *e, const tp_node *n, int i, tp_val like, tp_dtype ct, const char *what) {
  tp_type lt = *em_type(e, like);
  tp_val x = lw_value(e, n, i);
  if (x < 0) return x;
  if (tp_type_numel(em_type(e, x)) != tp_type_numel(&lt))
    return em_fail(e, TP_INVALID_ARGUMENT, "%s: %s has %" PRId64 " elements; expected %" PRId64 " (one per slice of v)",
                   n->op, what, tp_type_numel(em_type(e, x)), tp_type_numel(&lt));
  return em_reshape(e, em_convert(e, x, ct), lt.rank, lt.dims);
}

static void r_weight_norm(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val v = lw_value(e, n, 0);
  wn_v w;
  if (v < 0 || !wn_begin(e, v, lw_int(n, 2, 0), "weight_norm_kernel", o, &w)) return;
  tp_dtype ct = w.t.dt;
  tp_val vc = w.vc;
  tp_val norm = em_unary(e, "stablehlo.sqrt", rsum(e, mul(e, vc, vc), w.red, w.nr));
  if (tp_type_numel(OUT(1)) == 1 && tp_type_numel(em_type(e, norm)) != 1) {
    /* A compiled graph's 1-d v: the meta function (and torch.compile on the
     * CPU, through the decomposition) norms it whole, w = v * g / |v|, where
     * the CPU kernel takes each element as a slice.  Follow the graph's
     * shapes; the backward rule differentiates this form. */
    norm = em_unary(e, "stablehlo.sqrt", rsum(e, mul(e, vc, vc), w.all, w.t.rank));
    tp_val g = wn_per_slice(e, n, 1, vc, ct, "g");
    if (g < 0) return;
    o[0] = as_out(e, n, 0, mul(e, vc, lw_bin(e, "stablehlo.divide", g, norm)));
    o[1] = as_out(e, n, 1, norm);
    return;
  }
  tp_val g = wn_per_slice(e, n, 1, norm, ct, "g");
  if (g < 0) return;
  tp_val a = dv(e, g, norm);
  o[0] = as_out(e, n, 0, mul(e, vc, bcast(e, a, &w.t, w.kept)));
  o[1] = as_out(e, n, 1, norm);
}

/* _weight_norm_interface_backward(grad_w, saved_v, saved_g, saved_norms, dim)
 * -> (grad_v, grad_g): with s = sum(grad_w * v) per slice, grad_g = s / norm,
 * a = g / norm, b = a * grad_g / norm, grad_v = a * grad_w - b * v (opmath,
 * grad_g unrounded inside b), as the CPU kernel (an empty v gives grad_g
 * 0 / 0 = NaN there too). */
static void r_weight_norm_backward(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val gw = lw_value(e, n, 0), v = lw_value(e, n, 1);
  wn_v w;
  if (gw < 0 || v < 0 || !wn_begin(e, v, lw_int(n, 4, 0), "weight_norm_backward_kernel", o, &w)) return;
  if (tp_type_numel(em_type(e, gw)) != tp_type_numel(&w.t)) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s: grad_w and saved_v differ in size", n->op);
    return;
  }
  tp_dtype ct = w.t.dt;
  tp_val vc = w.vc;
  tp_val gc = em_reshape(e, em_convert(e, gw, ct), w.t.rank, w.t.dims);
  tp_val s = rsum(e, mul(e, gc, vc), w.red, w.nr);
  tp_val sn = lw_value(e, n, 3);
  if (sn < 0) return;
  if (tp_type_numel(em_type(e, sn)) == 1 && tp_type_numel(em_type(e, s)) != 1) {
    /* the whole-norm form of a compiled 1-d v (see r_weight_norm):
     * w = v * g / N, N = |v|: grad_g = grad_w * v / N,
     * grad_v = grad_w * g / N - v * sum(grad_w * g * v) / N^3 */
    tp_val nrm = em_reshape(e, em_convert(e, sn, ct), 0, NULL);
    tp_val g = wn_per_slice(e, n, 2, vc, ct, "saved_g");
    if (g < 0) return;
    tp_val gg = lw_bin(e, "stablehlo.divide", mul(e, gc, vc), nrm);
    tp_val t = rsum(e, mul(e, mul(e, gc, g), vc), w.all, w.t.rank);
    tp_val n3 = mul(e, nrm, mul(e, nrm, nrm));
    tp_val gv = sub(e, lw_bin(e, "stablehlo.divide", mul(e, gc, g), nrm), lw_bin(e, "stablehlo.multiply", vc, dv(e, t, n3)));
    o[0] = as_out(e, n, 0, gv);
    o[1] = as_out(e, n, 1, gg);
    return;
  }
  tp_val g = wn_per_slice(e, n, 2, s, ct, "saved_g");
  tp_val norm = g < 0 ? g : wn_per_slice(e, n, 3, s, ct, "saved_norms");
  if (norm < 0) return;
  tp_val grad_g = dv(e, s, norm);
  tp_val a = dv(e, g, norm);
  tp_val b = dv(e, mul(e, a, grad_g), norm);
  tp_val grad_v = sub(e, mul(e, bcast(e, a, &w.t, w.kept), gc), mul(e, bcast(e, b, &w.t, w.kept), vc));
  o[0] = as_out(e, n, 0, grad_v);
  o[1] = as_out(e, n, 1, grad_g);
}

/* ---- fused attention (scaled_dot_product_attention) ----------------------------------------- */

/* tp::sdpa(q, k, v, bias?, is_causal, scale?) -> (out, lse) and
 * tp::sdpa_backward(grad_out, q, k, v, bias?, is_causal, scale?, bias_grad)
 * -> (dq, dk, dv, dbias): the kernels behind SDPA's overrideable backend
 * (torch_pjrt/_attention.py, which also says which calls take it).
 * One program each, where PyTorch's math backend is about ten eager ops.
 * q is [*B, Hq, L, E], k [*B, Hk, S, E], v [*B, Hk, S, Ev] with Hk dividing
 * Hq (grouped-query attention: query head h reads kv head h / (Hq / Hk)).
 * The scores run in opmath, as the CPU's flash kernel accumulates: s =
 * q k^T * scale, plus the float bias (or -inf where a bool bias is false,
 * or above the diagonal with is_causal, tril's top-left alignment); out =
 * softmax(s) v, lse = logsumexp(s) per row.  A row with every score -inf
 * attends to nothing and gives zeros (the CPU's flash and _safe_softmax
 * do the same); its lse is -inf.  The backward recomputes p = softmax(s)
 * as the forward did (flash attention's trade: no [L, S] tensor saved; not
 * from lse, whose rounding exp(s - lse) would scale by |s|) and returns
 * dv = p^T dO, ds = p * (dO v^T - rowsum(p * dO v^T)), dq = ds k * scale,
 * dk = ds^T q * scale, and dbias = ds summed to the bias's shape.
 * Internally the heads are split [*B, Hk, g, ...] with g = Hq / Hk, so k
 * and v are never repeated. */
typedef struct sdpa_dims {
  int nb;                      /* leading batch dims (*B) */
  int64_t hk, g, l, s, ed, ev; /* kv heads, group, query len, key len, head dims */
  tp_type st;                  /* scores: [*B, Hk, g, L, S] in opmath */
  tp_dtype ct;
  double scale;
  int a_bias, a_causal;        /* argument numbers of bias and is_causal */
} sdpa_dims;

/* The dims of q, k, v; a_bias, a_causal, a_scale: argument numbers. */
static int sdpa_shape(tp_emit *e, const tp_node *n, tp_val q, tp_val k, tp_val v, int a_bias, int a_causal,
                      int a_scale, sdpa_dims *d) {
  tp_type tq = *em_type(e, q), tk = *em_type(e, k), tv = *em_type(e, v);
  int r = tq.rank;
  int ok = r >= 3 && r + 1 <= TP_MAX_RANK && tk.rank == r && tv.rank == r;
  for (int i = 0; ok && i < r - 3; i++) ok = tk.dims[i] == tq.dims[i] && tv.dims[i] == tq.dims[i];
  int64_t hq = ok ? tq.dims[r - 3] : 0;
  ok = ok && tk.dims[r - 3] > 0 && hq % tk.dims[r - 3] == 0 && tv.dims[r - 3] == tk.dims[r - 3] &&
       tk.dims[r - 1] == tq.dims[r - 1] && tv.dims[r - 2] == tk.dims[r - 2];
  if (!ok) {
    em_fail(e, TP_INVALID_ARGUMENT, "%s: query, key and value must be [*, H, L, E], [*, Hk, S, E], [*, Hk, S, Ev] "
            "with Hk dividing H", n->op);
    return 0;
  }
  d->nb = r - 3;
  d->hk = tk.dims[r - 3];
  d->g = hq / d->hk;
  d->l = tq.dims[r - 2];
  d->s = tk.dims[r - 2];
  d->ed = tq.dims[r - 1];
  d->ev = tv.dims[r - 1];
  d->ct = lw_opmath(tq.dt);
  int64_t sd[TP_MAX_RANK];
  for (int i = 0; i < d->nb; i++) sd[i] = tq.dims[i];
  sd[d->nb] = d->hk, sd[d->nb + 1] = d->g, sd[d->nb + 2] = d->l, sd[d->nb + 3] = d->s;
  d->st = tp_type_make(d->ct, d->nb + 4, sd);
  d->scale = lw_is_none(n, a_scale) ? 1.0 / sqrt((double)d->ed) : lw_float(n, a_scale, 1.0);
  d->a_bias = a_bias;
  d->a_causal = a_causal;
  return 1;
}

/* x ([*B, Hq, a, b]) as [*B, Hk, g, a, b], in opmath. */
static tp_val sdpa_split(tp_emit *e, const sdpa_dims *d, tp_val x) {
  tp_type t = *em_type(e, x);
  int64_t dims[TP_MAX_RANK];
  for (int i = 0; i < d->nb; i++) dims[i] = t.dims[i];
  dims[d->nb] = d->hk, dims[d->nb + 1] = d->g, dims[d->nb + 2] = t.dims[t.rank - 2], dims[d->nb + 3] = t.dims[t.rank - 1];
  return em_reshape(e, em_convert(e, x, d->ct), d->nb + 4, dims);
}

/* The scores' [*B, Hq, L, S] form into full; returns its rank. */
static int sdpa_full(const sdpa_dims *d, int64_t *full) {
  for (int i = 0; i < d->nb; i++) full[i] = d->st.dims[i];
  full[d->nb] = d->hk * d->g, full[d->nb + 1] = d->l, full[d->nb + 2] = d->s;
  return d->nb + 3;
}

/* a ([*B, Hk, g, L, x]) times b ([*B, Hk, ., .]) over a's x and b's dim rc:
 * [*B, Hk, g, L, y], y b's other dim. */
static tp_val sdpa_dot_last(tp_emit *e, const sdpa_dims *d, tp_val a, tp_val b, int64_t rc) {
  int64_t bat[TP_MAX_RANK];
  for (int i = 0; i <= d->nb; i++) bat[i] = i;
  int64_t lc = d->nb + 3;
  rc += d->nb;
  return em_dot(e, a, b, bat, bat, d->nb + 1, &lc, &rc, 1, d->ct);
}

/* a ([*B, Hk, g, L, x]) times b ([*B, Hk, g, L, y]) over (g, L): [*B, Hk, x, y]. */
static tp_val sdpa_dot_rows(tp_emit *e, const sdpa_dims *d, tp_val a, tp_val b) {
  int64_t bat[TP_MAX_RANK];
  for (int i = 0; i <= d->nb; i++) bat[i] = i;
  int64_t c[2] = {d->nb + 1, d->nb + 2};
  return em_dot(e, a, b, bat, bat, d->nb + 1, c, c, 2, d->ct);
}

/* The masked, scaled scores s ([*B, Hk, g, L, S]). */
static tp_val sdpa_scores(tp_emit *e, const tp_node *n, const sdpa_dims *d, tp_val q5, tp_val k) {
  tp_val s = mulk(e, sdpa_dot_last(e, d, q5, em_convert(e, k, d->ct), 2), d->scale);
  tp_val ninf = kf(e, s, -INFINITY);
  if (lw_arg(n, d->a_bias)->kind == TP_ARG_TENSOR) {
    tp_val b = lw_value(e, n, d->a_bias);
    if (b < 0) return b;
    tp_type bt = *em_type(e, b);
    int64_t full[TP_MAX_RANK];
    int r = sdpa_full(d, full);
    if (bt.rank > r) return em_fail(e, TP_INVALID_ARGUMENT, "%s: attn_mask has more dims than the scores", n->op);
    for (int i = 0; i < bt.rank; i++) {
      int64_t want = full[r - bt.rank + i];
      if (bt.dims[i] != 1 && bt.dims[i] != want)
        return em_fail(e, TP_INVALID_ARGUMENT, "%s: attn_mask of size %" PRId64 " at dim %d does not broadcast to %" PRId64,
                       n->op, bt.dims[i], i, want);
    }
    b = em_bcast_to(e, b, r, full);
    tp_type bst = d->st;
    bst.dt = bt.dt;
    b = em_reshape(e, b, bst.rank, bst.dims);
    s = bt.dt == TP_BOOL ? em_select(e, b, s, ninf) : add(e, s, em_convert(e, b, d->ct));
  }
  if (lw_bool(n, d->a_causal, 0)) {
    tp_type it = d->st;
    it.dt = TP_I64;
    tp_val row = em_iota(e, &it, d->nb + 2), col = em_iota(e, &it, d->nb + 3);
    s = em_select(e, em_compare(e, "GT", col, row), ninf, s);
  }
  return s;
}

/* Broadcast a per-row value ([*B, Hk, g, L]) to the scores' shape. */
static tp_val sdpa_rows(tp_emit *e, const sdpa_dims *d, tp_val x) {
  int64_t map[TP_MAX_RANK];
  for (int i = 0; i < d->nb + 3; i++) map[i] = i;
  return bcast(e, x, &d->st, map);
}

/* softmax(s) over the key dim; *m (each row's max, 0 for a row of -inf)
 * and *l (its sum of exp(s - m)) are per row.  A row of -inf gives zeros. */
static tp_val sdpa_probs(tp_emit *e, const sdpa_dims *d, tp_val s, tp_val *m, tp_val *l) {
  int64_t last = d->nb + 3;
  tp_val mx = em_reduce(e, s, em_const(e, -INFINITY, d->ct), &last, 1, "stablehlo.maximum");
  *m = em_select(e, em_compare(e, "EQ", mx, kf(e, mx, -INFINITY)), kf(e, mx, 0), mx);
  tp_val ez = em_unary(e, "stablehlo.exponential", sub(e, s, sdpa_rows(e, d, *m)));
  *l = rsum(e, ez, &last, 1);
  tp_val inv = em_select(e, em_compare(e, "EQ", *l, kf(e, *l, 0)), kf(e, *l, 0), dv(e, kf(e, *l, 1), *l));
  return mul(e, ez, sdpa_rows(e, d, inv));
}

static void r_sdpa(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val q = lw_value(e, n, 0), k = lw_value(e, n, 1), v = lw_value(e, n, 2);
  sdpa_dims d;
  if (q < 0 || k < 0 || v < 0 || !sdpa_shape(e, n, q, k, v, 3, 4, 5, &d)) return;
  tp_val s = sdpa_scores(e, n, &d, sdpa_split(e, &d, q), k);
  if (s < 0) return;
  tp_val m, l;
  tp_val p = sdpa_probs(e, &d, s, &m, &l);
  o[0] = as_out(e, n, 0, sdpa_dot_last(e, &d, p, em_convert(e, v, d.ct), 1));
  o[1] = as_out(e, n, 1, add(e, m, em_unary(e, "stablehlo.log", l)));
}

/* The bias's gradient: ds ([*B, Hk, g, L, S]) summed over the dims the bias
 * ([..] aligned to [*B, Hq, L, S] from the right) broadcasts along. */
static tp_val sdpa_bias_grad(tp_emit *e, const sdpa_dims *d, tp_val ds, const tp_type *bt) {
  int64_t full[TP_MAX_RANK], red[TP_MAX_RANK];
  int r = sdpa_full(d, full);
  tp_val x = em_reshape(e, ds, r, full);
  int nr = 0;
  for (int i = 0; i < r; i++) {
    int j = i - (r - bt->rank);
    if (j < 0 || (bt->dims[j] == 1 && full[i] != 1)) red[nr++] = i;
  }
  if (nr) x = rsum(e, x, red, nr);
  return em_reshape(e, x, bt->rank, bt->dims);
}

static void r_sdpa_backward(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val go = lw_value(e, n, 0), q = lw_value(e, n, 1), k = lw_value(e, n, 2), v = lw_value(e, n, 3);
  sdpa_dims d;
  if (go < 0 || q < 0 || k < 0 || v < 0 || !sdpa_shape(e, n, q, k, v, 4, 5, 6, &d)) return;
  tp_val q5 = sdpa_split(e, &d, q);
  tp_val s = sdpa_scores(e, n, &d, q5, k);
  if (s < 0) return;
  tp_val m, l;
  tp_val p = sdpa_probs(e, &d, s, &m, &l);
  tp_val g5 = sdpa_split(e, &d, go);
  tp_val vc = em_convert(e, v, d.ct);
  tp_val dp = sdpa_dot_last(e, &d, g5, vc, 2);
  int64_t last = d.nb + 3;
  tp_val ds = mul(e, p, sub(e, dp, sdpa_rows(e, &d, rsum(e, mul(e, p, dp), &last, 1))));
  o[0] = as_out(e, n, 0, mulk(e, sdpa_dot_last(e, &d, ds, em_convert(e, k, d.ct), 1), d.scale));
  o[1] = as_out(e, n, 1, mulk(e, sdpa_dot_rows(e, &d, ds, q5), d.scale));
  o[2] = as_out(e, n, 2, sdpa_dot_rows(e, &d, p, g5));
  if (lw_bool(n, 7, 0) && lw_arg(n, 4)->kind == TP_ARG_TENSOR) {
    tp_type bt = *em_type(e, lw_value(e, n, 4));
    o[3] = as_out(e, n, 3, sdpa_bias_grad(e, &d, ds, &bt));
  } else {
    o[3] = em_full(e, 0, OUT(3));
  }
}

const tp_lower_entry tp_lower_nn[] = {
    {"tp::sdpa", r_sdpa, 0},
    {"tp::sdpa_backward", r_sdpa_backward, 0},
    {"aten::native_group_norm", r_group_norm, 0},
    {"aten::native_group_norm_backward", r_group_norm_backward, 0},
    {"aten::max_pool2d_with_indices", r_max_pool2d, 0},
    {"aten::max_pool3d_with_indices", r_max_pool3d, 0},
    {"aten::max_pool2d_with_indices_backward", r_max_pool2d_backward, 0},
    {"aten::max_pool3d_with_indices_backward", r_max_pool3d_backward, 0},
    {"aten::avg_pool2d", r_avg_pool2d, 0},
    {"aten::avg_pool3d", r_avg_pool3d, 0},
    {"aten::avg_pool2d_backward", r_avg_pool2d_backward, 0},
    {"aten::avg_pool3d_backward", r_avg_pool3d_backward, 0},
    {"aten::_adaptive_avg_pool2d", r_adaptive_avg_pool2d, 0},
    {"aten::_adaptive_avg_pool3d", r_adaptive_avg_pool3d, 0},
    {"aten::_adaptive_avg_pool2d_backward", r_adaptive_avg_pool2d_backward, 0},
    {"aten::_adaptive_avg_pool3d_backward", r_adaptive_avg_pool3d_backward, 0},
    {"aten::replication_pad1d_backward", r_replication_pad1d_backward, 0},
    {"aten::replication_pad2d_backward", r_replication_pad2d_backward, 0},
    {"aten::replication_pad3d_backward", r_replication_pad3d_backward, 0},
    {"aten::adaptive_max_pool2d", r_adaptive_max_pool2d, 0},
    {"aten::adaptive_max_pool3d", r_adaptive_max_pool3d, 0},
    {"aten::adaptive_max_pool2d_backward", r_adaptive_max_pool2d_backward, 0},
    {"aten::adaptive_max_pool3d_backward", r_adaptive_max_pool3d_backward, 0},
    {"aten::fractional_max_pool2d", r_fractional_max_pool2d, 0},
    {"aten::fractional_max_pool3d", r_fractional_max_pool3d, 0},
    {"aten::fractional_max_pool2d_backward", r_fractional_max_pool2d_backward, 0},
    {"aten::fractional_max_pool3d_backward", r_fractional_max_pool3d_backward, 0},
    {"aten::upsample_nearest1d", r_upsample_nearest1d, 0},
    {"aten::upsample_nearest2d", r_upsample_nearest2d, 0},
    {"aten::upsample_nearest3d", r_upsample_nearest3d, 0},
    {"aten::_upsample_nearest_exact1d", r_upsample_nearest_exact1d, 0},
    {"aten::_upsample_nearest_exact2d", r_upsample_nearest_exact2d, 0},
    {"aten::_upsample_nearest_exact3d", r_upsample_nearest_exact3d, 0},
    {"aten::upsample_nearest1d_backward", r_upsample_nearest1d_bw, 0},
    {"aten::upsample_nearest2d_backward", r_upsample_nearest2d_bw, 0},
    {"aten::upsample_nearest3d_backward", r_upsample_nearest3d_bw, 0},
    {"aten::_upsample_nearest_exact1d_backward", r_upsample_nearest_exact1d_bw, 0},
    {"aten::_upsample_nearest_exact2d_backward", r_upsample_nearest_exact2d_bw, 0},
    {"aten::_upsample_nearest_exact3d_backward", r_upsample_nearest_exact3d_bw, 0},
    {"aten::upsample_linear1d", r_upsample_linear1d, 0},
    {"aten::upsample_bilinear2d", r_upsample_bilinear2d, 0},
    {"aten::upsample_trilinear3d", r_upsample_trilinear3d, 0},
    {"aten::upsample_linear1d_backward", r_upsample_linear1d_bw, 0},
    {"aten::upsample_bilinear2d_backward", r_upsample_bilinear2d_bw, 0},
    {"aten::upsample_trilinear3d_backward", r_upsample_trilinear3d_bw, 0},
    {"aten::_upsample_bilinear2d_aa", r_upsample_bilinear2d_aa, 0},
    {"aten::_upsample_bicubic2d_aa", r_upsample_bicubic2d_aa, 0},
    {"aten::_upsample_bilinear2d_aa_backward", r_upsample_bilinear2d_aa_bw, 0},
    {"aten::_upsample_bicubic2d_aa_backward", r_upsample_bicubic2d_aa_bw, 0},
    {"aten::convolution", r_convolution, 0},
    {"aten::convolution_backward", r_convolution_backward, 0},
    {"aten::native_layer_norm", r_layer_norm, 0},
    {"aten::native_layer_norm_backward", r_layer_norm_backward, 0},
    {"aten::native_batch_norm", r_batch_norm, 0},
    {"aten::_native_batch_norm_legit", r_batch_norm, 0},
    {"aten::_native_batch_norm_legit_functional", r_batch_norm, 0},
    {"aten::_native_batch_norm_legit.no_stats", r_batch_norm_no_stats, 0},
    {"aten::_native_batch_norm_legit_no_training", r_batch_norm_no_training, 0},
    {"aten::native_batch_norm_backward", r_batch_norm_backward, 0},
    {"aten::_batch_norm_with_update", r_batch_norm_with_update, 0},
    {"aten::_batch_norm_no_update", r_batch_norm_no_update, 0},
    {"aten::nll_loss_forward", r_nll_loss, 0},
    {"aten::nll_loss2d_forward", r_nll_loss, 0},
    {"aten::nll_loss_backward", r_nll_loss_backward, 0},
    {"aten::nll_loss2d_backward", r_nll_loss_backward, 0},
    {"aten::binary_cross_entropy", r_binary_cross_entropy, 0},
    {"aten::binary_cross_entropy_backward", r_binary_cross_entropy_backward, 0},
    {"aten::mse_loss", r_mse_loss, 0},
    {"aten::mse_loss_backward", r_mse_loss_backward, 0},
    {"aten::_weight_norm_interface", r_weight_norm, 0},
    {"aten::_weight_norm_interface_backward", r_weight_norm_backward, 0},
    {NULL, NULL, 0},
};

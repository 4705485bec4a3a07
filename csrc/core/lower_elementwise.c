/* lower_elementwise.c - pointwise ops: arithmetic, comparisons, unary math,
 * activations and their backward formulas, copies and fills.
 *
 * Convention: the output dtype comes from PyTorch's meta function
 * (n->outs); arithmetic runs in lw_opmath(out dtype) (f32 for f16/bf16,
 * as PyTorch's CPU kernels do) and is rounded once at the end. */
#include <math.h>
#include <string.h>

#include "lower_util.h"

#define OUT0 (&n->outs[0])

/* Compute type: the output's shape in its opmath dtype. */
static tp_type ctype(const tp_node *n) { return lw_out_as(n, 0, lw_opmath(n->outs[0].dt)); }

static tp_val finish(tp_emit *e, const tp_node *n, tp_val v) { return em_convert(e, v, n->outs[0].dt); }

static tp_val k(tp_emit *e, tp_val like, double v) { return lw_full_like(e, like, v); }
static tp_val add(tp_emit *e, tp_val a, tp_val b) { return em_binary(e, "stablehlo.add", a, b); }
static tp_val sub(tp_emit *e, tp_val a, tp_val b) { return em_binary(e, "stablehlo.subtract", a, b); }
static tp_val mul(tp_emit *e, tp_val a, tp_val b) { return em_binary(e, "stablehlo.multiply", a, b); }
static tp_val dv(tp_emit *e, tp_val a, tp_val b) { return em_binary(e, "stablehlo.divide", a, b); }
static tp_val un(tp_emit *e, const char *op, tp_val a) { return em_unary(e, op, a); }

/* ---- binary arithmetic ------------------------------------------------------ */

/* out = a OP (alpha * b), or for rsub (reversed) b - alpha * a; alpha is
 * argument `alpha_i` (or -1). */
static void arith(tp_emit *e, const tp_node *n, tp_val *o, const char *op, int alpha_i, int reversed) {
  tp_type ct = ctype(n);
  tp_val a = lw_operand(e, n, 0, &ct), b = lw_operand(e, n, 1, &ct);
  if (reversed) {
    tp_val t = a;
    a = b;
    b = t;
  }
  if (alpha_i >= 0 && !lw_is_none(n, alpha_i)) b = mul(e, b, lw_operand(e, n, alpha_i, &ct));
  o[0] = finish(e, n, em_binary(e, op, a, b));
}

static void r_add(tp_emit *e, const tp_node *n, tp_val *o) { arith(e, n, o, "stablehlo.add", 2, 0); }
static void r_sub(tp_emit *e, const tp_node *n, tp_val *o) { arith(e, n, o, "stablehlo.subtract", 2, 0); }
static void r_rsub(tp_emit *e, const tp_node *n, tp_val *o) { arith(e, n, o, "stablehlo.subtract", 2, 1); }
static void r_mul(tp_emit *e, const tp_node *n, tp_val *o) { arith(e, n, o, "stablehlo.multiply", -1, 0); }
static void r_maximum(tp_emit *e, const tp_node *n, tp_val *o) { arith(e, n, o, "stablehlo.maximum", -1, 0); }
static void r_minimum(tp_emit *e, const tp_node *n, tp_val *o) { arith(e, n, o, "stablehlo.minimum", -1, 0); }
static void r_atan2(tp_emit *e, const tp_node *n, tp_val *o) { arith(e, n, o, "stablehlo.atan2", -1, 0); }
static void r_fmod(tp_emit *e, const tp_node *n, tp_val *o) { arith(e, n, o, "stablehlo.remainder", -1, 0); }
static void r_band(tp_emit *e, const tp_node *n, tp_val *o) { arith(e, n, o, "stablehlo.and", -1, 0); }
static void r_bor(tp_emit *e, const tp_node *n, tp_val *o) { arith(e, n, o, "stablehlo.or", -1, 0); }
static void r_bxor(tp_emit *e, const tp_node *n, tp_val *o) { arith(e, n, o, "stablehlo.xor", -1, 0); }

static void r_pow(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_type ct = ctype(n);
  tp_val a = lw_operand(e, n, 0, &ct), b = lw_operand(e, n, 1, &ct);
  o[0] = finish(e, n, em_binary(e, "stablehlo.power", a, b));
}

/* Python-style floor division of a by b in compute type. */
static tp_val floor_div(tp_emit *e, tp_val a, tp_val b) {
  tp_dtype dt = em_type(e, a)->dt;
  tp_val zero = k(e, a, 0);
  if (!tp_dtype_is_float(dt)) {
    tp_val q = dv(e, a, b), r = em_binary(e, "stablehlo.remainder", a, b);
    tp_val adjust = em_binary(e, "stablehlo.and", em_compare(e, "NE", r, zero),
                              em_compare(e, "NE", em_compare(e, "LT", r, zero), em_compare(e, "LT", b, zero)));
    return em_select(e, adjust, sub(e, q, k(e, a, 1)), q);
  }
  /* PyTorch's div_floor_floating */
  tp_val mod = em_binary(e, "stablehlo.remainder", a, b);
  tp_val d = dv(e, sub(e, a, mod), b);
  tp_val fix = em_binary(e, "stablehlo.and", em_compare(e, "NE", mod, zero),
                         em_compare(e, "NE", em_compare(e, "LT", b, zero), em_compare(e, "LT", mod, zero)));
  d = em_select(e, fix, sub(e, d, k(e, a, 1)), d);
  tp_val fl = un(e, "stablehlo.floor", d);
  tp_val up = em_compare(e, "GT", sub(e, d, fl), k(e, a, 0.5));
  fl = em_select(e, up, add(e, fl, k(e, a, 1)), fl);
  tp_val q = dv(e, a, b);
  /* zero result keeps the sign of a/b */
  tp_val signed0 = mul(e, zero, q);
  tp_val res = em_select(e, em_compare(e, "NE", d, zero), fl, em_binary(e, "stablehlo.add", signed0, zero));
  res = em_select(e, em_compare(e, "NE", d, zero), fl, un(e, "stablehlo.sign", q));
  res = em_select(e, em_compare(e, "EQ", d, zero), mul(e, zero, un(e, "stablehlo.sign", q)), fl);
  return em_select(e, em_compare(e, "EQ", b, zero), q, res);
}

static void r_div(tp_emit *e, const tp_node *n, tp_val *o) {
  const char *mode = lw_str(n, 2, NULL);
  tp_type ct = ctype(n);
  if (!mode) {
    tp_val a = lw_operand(e, n, 0, &ct), b = lw_operand(e, n, 1, &ct);
    o[0] = finish(e, n, dv(e, a, b));
    return;
  }
  /* rounding modes compute in the promoted input type (= output type). */
  tp_val a = lw_operand(e, n, 0, &ct), b = lw_operand(e, n, 1, &ct);
  if (!strcmp(mode, "trunc")) {
    tp_val q = dv(e, a, b);
    if (tp_dtype_is_float(ct.dt)) {
      tp_val neg = em_compare(e, "LT", q, k(e, q, 0));
      q = em_select(e, neg, un(e, "stablehlo.ceil", q), un(e, "stablehlo.floor", q));
    }
    o[0] = finish(e, n, q);
  } else if (!strcmp(mode, "floor")) {
    o[0] = finish(e, n, floor_div(e, a, b));
  } else {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT,
                   "div expected rounding_mode to be one of None, 'trunc', or 'floor' but found '%s'", mode);
  }
}

static void r_floor_divide(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_type ct = ctype(n);
  o[0] = finish(e, n, floor_div(e, lw_operand(e, n, 0, &ct), lw_operand(e, n, 1, &ct)));
}

static void r_remainder(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_type ct = ctype(n);
  tp_val a = lw_operand(e, n, 0, &ct), b = lw_operand(e, n, 1, &ct);
  tp_val m = em_binary(e, "stablehlo.remainder", a, b), zero = k(e, a, 0);
  tp_val fix = em_binary(e, "stablehlo.and", em_compare(e, "NE", m, zero),
                         em_compare(e, "NE", em_compare(e, "LT", m, zero), em_compare(e, "LT", b, zero)));
  o[0] = finish(e, n, em_select(e, fix, add(e, m, b), m));
}

/* ---- comparisons and logic ---------------------------------------------------- */

static void cmp(tp_emit *e, const tp_node *n, tp_val *o, const char *dir) {
  int idx[2] = {0, 1};
  tp_type ct = lw_out_as(n, 0, lw_result_type(e, n, idx, 2));
  tp_val a = lw_operand(e, n, 0, &ct), b = lw_operand(e, n, 1, &ct);
  o[0] = finish(e, n, em_compare(e, dir, a, b));
}
static void r_eq(tp_emit *e, const tp_node *n, tp_val *o) { cmp(e, n, o, "EQ"); }
static void r_ne(tp_emit *e, const tp_node *n, tp_val *o) { cmp(e, n, o, "NE"); }
static void r_lt(tp_emit *e, const tp_node *n, tp_val *o) { cmp(e, n, o, "LT"); }
static void r_le(tp_emit *e, const tp_node *n, tp_val *o) { cmp(e, n, o, "LE"); }
static void r_gt(tp_emit *e, const tp_node *n, tp_val *o) { cmp(e, n, o, "GT"); }
static void r_ge(tp_emit *e, const tp_node *n, tp_val *o) { cmp(e, n, o, "GE"); }

static void logic(tp_emit *e, const tp_node *n, tp_val *o, const char *op) {
  tp_type bt = lw_out_as(n, 0, TP_BOOL);
  tp_val a = lw_operand(e, n, 0, &bt), b = lw_operand(e, n, 1, &bt);
  o[0] = finish(e, n, em_binary(e, op, a, b));
}
static void r_land(tp_emit *e, const tp_node *n, tp_val *o) { logic(e, n, o, "stablehlo.and"); }
static void r_lor(tp_emit *e, const tp_node *n, tp_val *o) { logic(e, n, o, "stablehlo.or"); }
static void r_lxor(tp_emit *e, const tp_node *n, tp_val *o) { logic(e, n, o, "stablehlo.xor"); }
static void r_lnot(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_type bt = lw_out_as(n, 0, TP_BOOL);
  o[0] = finish(e, n, un(e, "stablehlo.not", lw_operand(e, n, 0, &bt)));
}
static void r_bnot(tp_emit *e, const tp_node *n, tp_val *o) {
  o[0] = un(e, "stablehlo.not", lw_operand(e, n, 0, OUT0));
}

static void r_where(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_type bt = lw_out_as(n, 0, TP_BOOL);
  tp_val c = lw_operand(e, n, 0, &bt);
  o[0] = em_select(e, c, lw_operand(e, n, 1, OUT0), lw_operand(e, n, 2, OUT0));
}

static void r_masked_fill(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_type bt = lw_out_as(n, 0, TP_BOOL);
  o[0] = em_select(e, lw_operand(e, n, 1, &bt), lw_operand(e, n, 2, OUT0), lw_operand(e, n, 0, OUT0));
}

static void r_clamp(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_type ct = ctype(n);
  tp_val x = lw_operand(e, n, 0, &ct);
  if (!lw_is_none(n, 1)) x = em_binary(e, "stablehlo.maximum", x, lw_operand(e, n, 1, &ct));
  if (!lw_is_none(n, 2)) x = em_binary(e, "stablehlo.minimum", x, lw_operand(e, n, 2, &ct));
  o[0] = finish(e, n, x);
}
static void r_clamp_min(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_type ct = ctype(n);
  o[0] = finish(e, n, em_binary(e, "stablehlo.maximum", lw_operand(e, n, 0, &ct), lw_operand(e, n, 1, &ct)));
}
static void r_clamp_max(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_type ct = ctype(n);
  o[0] = finish(e, n, em_binary(e, "stablehlo.minimum", lw_operand(e, n, 0, &ct), lw_operand(e, n, 1, &ct)));
}

/* lerp: weight < 0.5 ? self + w*(end-self) : end - (end-self)*(1-w) (PyTorch's form) */
static void r_lerp(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_type ct = ctype(n);
  tp_val a = lw_operand(e, n, 0, &ct), b = lw_operand(e, n, 1, &ct), w = lw_operand(e, n, 2, &ct);
  tp_val d = sub(e, b, a);
  tp_val lo = add(e, a, mul(e, w, d)), hi = sub(e, b, mul(e, d, sub(e, k(e, w, 1), w)));
  tp_val small = em_compare(e, "LT", un(e, "stablehlo.abs", w), k(e, w, 0.5));
  o[0] = finish(e, n, em_select(e, small, lo, hi));
}

static void r_addcmul(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_type ct = ctype(n);
  tp_val s = lw_operand(e, n, 0, &ct), t1 = lw_operand(e, n, 1, &ct), t2 = lw_operand(e, n, 2, &ct);
  tp_val v = lw_operand(e, n, 3, &ct);
  o[0] = finish(e, n, add(e, s, mul(e, v, mul(e, t1, t2))));
}
static void r_addcdiv(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_type ct = ctype(n);
  tp_val s = lw_operand(e, n, 0, &ct), t1 = lw_operand(e, n, 1, &ct), t2 = lw_operand(e, n, 2, &ct);
  tp_val v = lw_operand(e, n, 3, &ct);
  o[0] = finish(e, n, add(e, s, mul(e, v, dv(e, t1, t2))));
}

/* prims::fma(a, b, c) = a * b + c (PyTorch's decompositions of optimizers use it). */
static void r_fma(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_type ct = ctype(n);
  tp_val a = lw_operand(e, n, 0, &ct), b = lw_operand(e, n, 1, &ct), c = lw_operand(e, n, 2, &ct);
  o[0] = finish(e, n, add(e, mul(e, a, b), c));
}

/* ---- unary -------------------------------------------------------------------- */

static tp_val x_in(tp_emit *e, const tp_node *n) {
  tp_type ct = ctype(n);
  return lw_operand(e, n, 0, &ct);
}

#define UNARY(fn, hlo) \
  static void fn(tp_emit *e, const tp_node *n, tp_val *o) { o[0] = finish(e, n, un(e, hlo, x_in(e, n))); }
UNARY(r_exp, "stablehlo.exponential")
UNARY(r_expm1, "stablehlo.exponential_minus_one")
UNARY(r_log, "stablehlo.log")
UNARY(r_log1p, "stablehlo.log_plus_one")
UNARY(r_sqrt, "stablehlo.sqrt")
UNARY(r_rsqrt, "stablehlo.rsqrt")
UNARY(r_sin, "stablehlo.sine")
UNARY(r_cos, "stablehlo.cosine")
UNARY(r_tan, "chlo.tan")
UNARY(r_tanh, "stablehlo.tanh")
UNARY(r_sigmoid, "stablehlo.logistic")
UNARY(r_neg, "stablehlo.negate")
UNARY(r_floor, "stablehlo.floor")
UNARY(r_ceil, "stablehlo.ceil")
UNARY(r_erf, "chlo.erf")
UNARY(r_erfinv, "chlo.erf_inv")
UNARY(r_asin, "chlo.asin")
UNARY(r_acos, "chlo.acos")
UNARY(r_sinh, "chlo.sinh")
UNARY(r_cosh, "chlo.cosh")
UNARY(r_asinh, "chlo.asinh")
UNARY(r_acosh, "chlo.acosh")
UNARY(r_atanh, "chlo.atanh")
UNARY(r_lgamma, "chlo.lgamma")
UNARY(r_digamma, "chlo.digamma")
#undef UNARY

/* abs: complex inputs give their magnitude (a real result). */
static void r_abs(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = lw_value(e, n, 0);
  const tp_type *t = em_type(e, x);
  if (tp_dtype_is_complex(t->dt)) {
    tp_type r = *t;
    r.dt = t->dt == TP_C64 ? TP_F32 : TP_F64;
    o[0] = finish(e, n, em_op(e, "stablehlo.abs", NULL, &x, 1, &r));
    return;
  }
  o[0] = finish(e, n, un(e, "stablehlo.abs", x_in(e, n)));
}

static void r_round(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = x_in(e, n);
  if (!tp_dtype_is_float(em_type(e, x)->dt)) {
    o[0] = finish(e, n, x);
    return;
  }
  int64_t dec = lw_int(n, 1, 0);
  if (dec == 0) {
    o[0] = finish(e, n, un(e, "stablehlo.round_nearest_even", x));
    return;
  }
  double s = pow(10.0, (double)(dec < 0 ? -dec : dec));
  tp_val f = k(e, x, s);
  tp_val y = dec > 0 ? mul(e, x, f) : dv(e, x, f);
  y = un(e, "stablehlo.round_nearest_even", y);
  o[0] = finish(e, n, dec > 0 ? dv(e, y, f) : mul(e, y, f));
}

static void r_trunc(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = x_in(e, n);
  if (!tp_dtype_is_float(em_type(e, x)->dt)) {
    o[0] = finish(e, n, x);
    return;
  }
  tp_val neg = em_compare(e, "LT", x, k(e, x, 0));
  o[0] = finish(e, n, em_select(e, neg, un(e, "stablehlo.ceil", x), un(e, "stablehlo.floor", x)));
}

static void r_frac(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = x_in(e, n);
  tp_val neg = em_compare(e, "LT", x, k(e, x, 0));
  tp_val t = em_select(e, neg, un(e, "stablehlo.ceil", x), un(e, "stablehlo.floor", x));
  o[0] = finish(e, n, sub(e, x, t));
}

static void r_sign(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = x_in(e, n);
  tp_dtype dt = em_type(e, x)->dt;
  if (dt == TP_BOOL) {
    o[0] = finish(e, n, x);
    return;
  }
  if (tp_dtype_is_unsigned(dt)) {
    o[0] = finish(e, n, em_convert(e, em_compare(e, "NE", x, k(e, x, 0)), dt));
    return;
  }
  o[0] = finish(e, n, un(e, "stablehlo.sign", x));
}

static void r_reciprocal(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = x_in(e, n);
  o[0] = finish(e, n, dv(e, k(e, x, 1), x));
}

static void r_log2(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = x_in(e, n);
  o[0] = finish(e, n, dv(e, un(e, "stablehlo.log", x), k(e, x, M_LN2)));
}
static void r_log10(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = x_in(e, n);
  o[0] = finish(e, n, dv(e, un(e, "stablehlo.log", x), k(e, x, M_LN10)));
}
static void r_exp2(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = x_in(e, n);
  o[0] = finish(e, n, em_binary(e, "stablehlo.power", k(e, x, 2), x));
}
static void r_atan(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = x_in(e, n);
  o[0] = finish(e, n, em_binary(e, "stablehlo.atan2", x, k(e, x, 1)));
}
static void r_square(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = x_in(e, n);
  o[0] = finish(e, n, mul(e, x, x));
}

static void r_isnan(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = lw_value(e, n, 0);
  o[0] = em_compare(e, "NE", x, x);
}
static void r_isinf(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = lw_value(e, n, 0);
  if (!tp_dtype_is_float(em_type(e, x)->dt)) {
    o[0] = em_full(e, 0, OUT0);
    return;
  }
  o[0] = em_compare(e, "EQ", un(e, "stablehlo.abs", x), k(e, x, INFINITY));
}
static void r_isfinite(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = lw_value(e, n, 0);
  if (!tp_dtype_is_float(em_type(e, x)->dt)) {
    o[0] = em_full(e, 1, OUT0);
    return;
  }
  o[0] = em_compare(e, "LT", un(e, "stablehlo.abs", x), k(e, x, INFINITY));
}

static void r_nan_to_num(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = lw_value(e, n, 0);
  tp_dtype dt = em_type(e, x)->dt;
  if (!tp_dtype_is_float(dt)) {
    o[0] = x;
    return;
  }
  double big = dt == TP_F64 ? 1.7976931348623157e308 : dt == TP_F32 ? 3.4028234663852886e38
               : dt == TP_BF16 ? 3.3895313892515355e38 : 65504.0;
  double nanv = lw_is_none(n, 1) ? 0.0 : lw_float(n, 1, 0.0);
  double pinf = lw_is_none(n, 2) ? big : lw_float(n, 2, big);
  double ninf = lw_is_none(n, 3) ? -big : lw_float(n, 3, -big);
  x = em_select(e, em_compare(e, "NE", x, x), k(e, x, nanv), x);
  x = em_select(e, em_compare(e, "EQ", x, k(e, x, INFINITY)), k(e, x, pinf), x);
  x = em_select(e, em_compare(e, "EQ", x, k(e, x, -INFINITY)), k(e, x, ninf), x);
  o[0] = x;
}

/* ---- activations ------------------------------------------------------------------ */

static void r_relu(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = lw_operand(e, n, 0, OUT0);
  o[0] = em_binary(e, "stablehlo.maximum", x, k(e, x, 0));
}

/* threshold_backward(grad, self, threshold): grad where self > threshold else 0 */
static void r_threshold_backward(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val g = lw_operand(e, n, 0, OUT0), x = lw_operand(e, n, 1, OUT0), t = lw_operand(e, n, 2, OUT0);
  o[0] = em_select(e, em_compare(e, "LE", x, t), k(e, g, 0), g);
}

static void r_threshold(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = lw_operand(e, n, 0, OUT0), t = lw_operand(e, n, 1, OUT0), v = lw_operand(e, n, 2, OUT0);
  o[0] = em_select(e, em_compare(e, "LE", x, t), v, x);
}

static void r_gelu(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = x_in(e, n);
  const char *approx = lw_str(n, 1, "none");
  tp_val y;
  if (!strcmp(approx, "tanh")) {
    tp_val inner = mul(e, k(e, x, sqrt(2.0 / M_PI)), add(e, x, mul(e, k(e, x, 0.044715), mul(e, x, mul(e, x, x)))));
    y = mul(e, mul(e, k(e, x, 0.5), x), add(e, k(e, x, 1), un(e, "stablehlo.tanh", inner)));
  } else {
    tp_val cdf = add(e, k(e, x, 1), un(e, "chlo.erf", mul(e, x, k(e, x, M_SQRT1_2))));
    y = mul(e, mul(e, x, k(e, x, 0.5)), cdf);
  }
  o[0] = finish(e, n, y);
}

static void r_gelu_backward(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_type ct = ctype(n);
  tp_val g = lw_operand(e, n, 0, &ct), x = lw_operand(e, n, 1, &ct);
  const char *approx = lw_str(n, 2, "none");
  tp_val d;
  if (!strcmp(approx, "tanh")) {
    double beta = sqrt(2.0 / M_PI), kap = 0.044715;
    tp_val x2 = mul(e, x, x), x3 = mul(e, x2, x);
    tp_val th = un(e, "stablehlo.tanh", mul(e, k(e, x, beta), add(e, x, mul(e, k(e, x, kap), x3))));
    tp_val left = mul(e, k(e, x, 0.5), x), right = add(e, k(e, x, 1), th);
    tp_val ld = mul(e, k(e, x, 0.5), right);
    tp_val rd = mul(e, mul(e, left, sub(e, k(e, x, 1), mul(e, th, th))),
                    mul(e, k(e, x, beta), add(e, k(e, x, 1), mul(e, k(e, x, 3 * kap), x2))));
    d = add(e, ld, rd);
  } else {
    tp_val cdf = mul(e, k(e, x, 0.5), add(e, k(e, x, 1), un(e, "chlo.erf", mul(e, x, k(e, x, M_SQRT1_2)))));
    tp_val pdf = mul(e, un(e, "stablehlo.exponential", mul(e, k(e, x, -0.5), mul(e, x, x))), k(e, x, 0.3989422804014327));
    d = add(e, cdf, mul(e, x, pdf));
  }
  o[0] = finish(e, n, mul(e, g, d));
}

static void r_silu(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = x_in(e, n);
  o[0] = finish(e, n, mul(e, x, un(e, "stablehlo.logistic", x)));
}
static void r_silu_backward(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_type ct = ctype(n);
  tp_val g = lw_operand(e, n, 0, &ct), x = lw_operand(e, n, 1, &ct);
  tp_val s = un(e, "stablehlo.logistic", x);
  o[0] = finish(e, n, mul(e, g, mul(e, s, add(e, k(e, x, 1), mul(e, x, sub(e, k(e, x, 1), s))))));
}
static void r_sigmoid_backward(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_type ct = ctype(n);
  tp_val g = lw_operand(e, n, 0, &ct), y = lw_operand(e, n, 1, &ct);
  o[0] = finish(e, n, mul(e, g, mul(e, sub(e, k(e, y, 1), y), y)));
}
static void r_tanh_backward(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_type ct = ctype(n);
  tp_val g = lw_operand(e, n, 0, &ct), y = lw_operand(e, n, 1, &ct);
  o[0] = finish(e, n, mul(e, g, sub(e, k(e, y, 1), mul(e, y, y))));
}
static void r_leaky_relu(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_type ct = ctype(n);
  tp_val x = lw_operand(e, n, 0, &ct), s = lw_operand(e, n, 1, &ct);
  o[0] = finish(e, n, em_select(e, em_compare(e, "GT", x, k(e, x, 0)), x, mul(e, x, s)));
}
static void r_hardtanh(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_type ct = ctype(n);
  tp_val x = lw_operand(e, n, 0, &ct), lo = lw_operand(e, n, 1, &ct), hi = lw_operand(e, n, 2, &ct);
  o[0] = finish(e, n, em_binary(e, "stablehlo.minimum", em_binary(e, "stablehlo.maximum", x, lo), hi));
}

/* ---- copies and fills ---------------------------------------------------------------- */

/* tp::copy(src) -> out: convert and broadcast (copy_ semantics). */
static void r_copy(tp_emit *e, const tp_node *n, tp_val *o) { o[0] = lw_operand(e, n, 0, OUT0); }
/* copy(self, src, non_blocking): functional copy_ */
static void r_copy2(tp_emit *e, const tp_node *n, tp_val *o) { o[0] = lw_operand(e, n, 1, OUT0); }
static void r_fill(tp_emit *e, const tp_node *n, tp_val *o) { o[0] = lw_operand(e, n, 1, OUT0); }
static void r_zero(tp_emit *e, const tp_node *n, tp_val *o) { o[0] = em_full(e, 0, OUT0); }
static void r_full(tp_emit *e, const tp_node *n, tp_val *o) { o[0] = lw_operand(e, n, 1, OUT0); }

/* Factories (compiled graphs contain them; eager mode fills allocated outputs). */
static void r_ones(tp_emit *e, const tp_node *n, tp_val *o) { o[0] = em_full(e, 1, OUT0); }
static void r_scalar_tensor(tp_emit *e, const tp_node *n, tp_val *o) { o[0] = lw_operand(e, n, 0, OUT0); }
static void r_new_full(tp_emit *e, const tp_node *n, tp_val *o) { o[0] = lw_operand(e, n, 2, OUT0); }

const tp_lower_entry tp_lower_elementwise[] = {
    {"aten::empty.memory_format", r_zero},
    {"aten::empty_strided", r_zero},
    {"aten::empty_permuted", r_zero},
    {"aten::empty_like", r_zero},
    {"aten::new_empty", r_zero},
    {"aten::new_empty_strided", r_zero},
    {"aten::zeros", r_zero},
    {"aten::zeros_like", r_zero},
    {"aten::new_zeros", r_zero},
    {"aten::ones", r_ones},
    {"aten::ones_like", r_ones},
    {"aten::new_ones", r_ones},
    {"aten::full", r_full},
    {"aten::new_full", r_new_full},
    {"aten::scalar_tensor", r_scalar_tensor},
    {"tp::copy", r_copy},
    {"aten::clone", r_copy},
    {"aten::_to_copy", r_copy},
    {"aten::copy", r_copy2},
    {"aten::fill.Scalar", r_fill},
    {"aten::fill.Tensor", r_fill},
    {"aten::fill_.Scalar", r_fill},
    {"aten::fill_.Tensor", r_fill},
    {"aten::zero", r_zero},
    {"aten::zero_", r_zero},
    {"aten::full_like", r_full},
    {"aten::add.Tensor", r_add},
    {"aten::add.Scalar", r_add},
    {"aten::sub.Tensor", r_sub},
    {"aten::sub.Scalar", r_sub},
    {"aten::rsub.Tensor", r_rsub},
    {"aten::rsub.Scalar", r_rsub},
    {"aten::mul.Tensor", r_mul},
    {"aten::mul.Scalar", r_mul},
    {"aten::div.Tensor", r_div},
    {"aten::div.Scalar", r_div},
    {"aten::div.Tensor_mode", r_div},
    {"aten::div.Scalar_mode", r_div},
    {"aten::floor_divide", r_floor_divide},
    {"aten::floor_divide.Scalar", r_floor_divide},
    {"aten::remainder.Tensor", r_remainder},
    {"aten::remainder.Scalar", r_remainder},
    {"aten::fmod.Tensor", r_fmod},
    {"aten::fmod.Scalar", r_fmod},
    {"aten::pow.Tensor_Tensor", r_pow},
    {"aten::pow.Tensor_Scalar", r_pow},
    {"aten::pow.Scalar", r_pow},
    {"aten::maximum", r_maximum},
    {"aten::minimum", r_minimum},
    {"aten::atan2", r_atan2},
    {"aten::bitwise_and.Tensor", r_band},
    {"aten::bitwise_and.Scalar", r_band},
    {"aten::bitwise_or.Tensor", r_bor},
    {"aten::bitwise_or.Scalar", r_bor},
    {"aten::bitwise_xor.Tensor", r_bxor},
    {"aten::bitwise_xor.Scalar", r_bxor},
    {"aten::bitwise_not", r_bnot},
    {"aten::logical_and", r_land},
    {"aten::logical_or", r_lor},
    {"aten::logical_xor", r_lxor},
    {"aten::logical_not", r_lnot},
    {"aten::eq.Tensor", r_eq},
    {"aten::eq.Scalar", r_eq},
    {"aten::ne.Tensor", r_ne},
    {"aten::ne.Scalar", r_ne},
    {"aten::lt.Tensor", r_lt},
    {"aten::lt.Scalar", r_lt},
    {"aten::le.Tensor", r_le},
    {"aten::le.Scalar", r_le},
    {"aten::gt.Tensor", r_gt},
    {"aten::gt.Scalar", r_gt},
    {"aten::ge.Tensor", r_ge},
    {"aten::ge.Scalar", r_ge},
    {"aten::where.self", r_where},
    {"aten::masked_fill.Scalar", r_masked_fill},
    {"aten::masked_fill.Tensor", r_masked_fill},
    {"aten::clamp", r_clamp},
    {"aten::clamp.Tensor", r_clamp},
    {"aten::clamp_min", r_clamp_min},
    {"aten::clamp_min.Tensor", r_clamp_min},
    {"aten::clamp_max", r_clamp_max},
    {"aten::clamp_max.Tensor", r_clamp_max},
    {"aten::lerp.Scalar", r_lerp},
    {"aten::lerp.Tensor", r_lerp},
    {"aten::addcmul", r_addcmul},
    {"aten::addcdiv", r_addcdiv},
    {"prims::fma", r_fma},
    {"aten::exp", r_exp},
    {"aten::expm1", r_expm1},
    {"aten::exp2", r_exp2},
    {"aten::log", r_log},
    {"aten::log1p", r_log1p},
    {"aten::log2", r_log2},
    {"aten::log10", r_log10},
    {"aten::sqrt", r_sqrt},
    {"aten::rsqrt", r_rsqrt},
    {"aten::sin", r_sin},
    {"aten::cos", r_cos},
    {"aten::tan", r_tan},
    {"aten::tanh", r_tanh},
    {"aten::asin", r_asin},
    {"aten::acos", r_acos},
    {"aten::atan", r_atan},
    {"aten::sinh", r_sinh},
    {"aten::cosh", r_cosh},
    {"aten::asinh", r_asinh},
    {"aten::acosh", r_acosh},
    {"aten::atanh", r_atanh},
    {"aten::sigmoid", r_sigmoid},
    {"aten::abs", r_abs},
    {"aten::neg", r_neg},
    {"aten::sign", r_sign},
    {"aten::floor", r_floor},
    {"aten::ceil", r_ceil},
    {"aten::round", r_round},
    {"aten::round.decimals", r_round},
    {"aten::trunc", r_trunc},
    {"aten::frac", r_frac},
    {"aten::reciprocal", r_reciprocal},
    {"aten::square", r_square},
    {"aten::erf", r_erf},
    {"aten::erfinv", r_erfinv},
    {"aten::lgamma", r_lgamma},
    {"aten::digamma", r_digamma},
    {"aten::isnan", r_isnan},
    {"aten::isinf", r_isinf},
    {"aten::isfinite", r_isfinite},
    {"aten::nan_to_num", r_nan_to_num},
    {"aten::relu", r_relu},
    {"aten::threshold", r_threshold},
    {"aten::threshold_backward", r_threshold_backward},
    {"aten::gelu", r_gelu},
    {"aten::gelu_backward", r_gelu_backward},
    {"aten::silu", r_silu},
    {"aten::silu_backward", r_silu_backward},
    {"aten::sigmoid_backward", r_sigmoid_backward},
    {"aten::tanh_backward", r_tanh_backward},
    {"aten::leaky_relu", r_leaky_relu},
    {"aten::hardtanh", r_hardtanh},
    {NULL, NULL},
};

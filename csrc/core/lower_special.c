/* lower_special.c - special functions and the remaining elementwise ops:
 * erfc/erfcx/log_ndtr/ndtri, the modified Bessel functions, polygamma and
 * zeta, the orthogonal polynomials, fmax/fmin/hypot/nextafter/frexp/angle,
 * gcd, the Tensor shifts and a few backward formulas.
 *
 * Which function PyTorch computes, its domain handling and special values
 * follow ATen's native/Math.h and CPU kernels.  The algorithms are our own:
 *  - Special functions of f32 (and f16/bf16/integer) inputs are computed in
 *    f64 and rounded once, which keeps them within a few f32 ulps of
 *    PyTorch's float kernels (the OpInfo tolerance is 1.3e-6 relative).
 *    Power series run as while loops; asymptotic expansions use
 *    coefficients computed here from their closed forms; K_nu in its middle
 *    range is the trapezoid rule on its integral representation.
 *  - Where PyTorch's float result depends on its float arithmetic (the
 *    polynomial recurrences and closed forms, trigamma's reflection, the
 *    phases of the Bessel and Airy expansions, log_ndtr's t * t), the same
 *    operations run in the same dtype and order, or their f64 values are
 *    rounded to float with reduce_precision (em_round_to: XLA:CPU drops a
 *    convert to f32 and back, as it allows excess precision).
 *  - XLA:CPU flushes subnormal floats to zero in arithmetic and comparisons;
 *    nextafter and frexp work on the bits instead.
 *  - The polynomials' recurrences are while loops up to the largest degree
 *    among the elements still iterating (an element stops at its own n, or
 *    when its value turns NaN, as in PyTorch). */
#include <math.h>
#include <string.h>

#include "lower_util.h"

#define OUT0 (&n->outs[0])

static int isf(tp_dtype d) { return tp_dtype_is_float(d); }

static tp_val K(tp_emit *e, tp_val like, double v) { return lw_full_like(e, like, v); }
static tp_val add(tp_emit *e, tp_val a, tp_val b) { return em_binary(e, "stablehlo.add", a, b); }
static tp_val sub(tp_emit *e, tp_val a, tp_val b) { return em_binary(e, "stablehlo.subtract", a, b); }
static tp_val mul(tp_emit *e, tp_val a, tp_val b) { return em_binary(e, "stablehlo.multiply", a, b); }
static tp_val dv(tp_emit *e, tp_val a, tp_val b) { return em_binary(e, "stablehlo.divide", a, b); }
static tp_val un(tp_emit *e, const char *op, tp_val a) { return em_unary(e, op, a); }
static tp_val cmp(tp_emit *e, const char *dir, tp_val a, tp_val b) { return em_compare(e, dir, a, b); }
static tp_val sel(tp_emit *e, tp_val p, tp_val a, tp_val b) { return em_select(e, p, a, b); }
static tp_val and_(tp_emit *e, tp_val a, tp_val b) { return em_binary(e, "stablehlo.and", a, b); }
static tp_val or_(tp_emit *e, tp_val a, tp_val b) { return em_binary(e, "stablehlo.or", a, b); }
static tp_val not_(tp_emit *e, tp_val a) { return un(e, "stablehlo.not", a); }
static tp_val isnan_(tp_emit *e, tp_val x) { return cmp(e, "NE", x, x); }
static tp_val abs_(tp_emit *e, tp_val x) { return un(e, "stablehlo.abs", x); }
static tp_val exp_(tp_emit *e, tp_val x) { return un(e, "stablehlo.exponential", x); }
static tp_val log_(tp_emit *e, tp_val x) { return un(e, "stablehlo.log", x); }
static tp_val sqrt_(tp_emit *e, tp_val x) { return un(e, "stablehlo.sqrt", x); }
static tp_val isinf_(tp_emit *e, tp_val x) { return cmp(e, "EQ", abs_(e, x), K(e, x, INFINITY)); }

/* Argument i converted to t's dtype and broadcast to its shape; a bool tensor
 * reaches float arithmetic through u8 (XLA rewrites convert(pred) * x into a
 * select, which loses 0 * inf = NaN). */
static tp_val in_as(tp_emit *e, const tp_node *n, int i, const tp_type *t) {
  const tp_arg *a = lw_arg(n, i);
  if (a->kind == TP_ARG_TENSOR && em_type(e, a->v)->dt == TP_BOOL && isf(t->dt)) {
    tp_val v = em_convert(e, em_convert(e, a->v, TP_U8), t->dt);
    return em_bcast_to(e, v, t->rank, t->dims);
  }
  return lw_operand(e, n, i, t);
}

/* Output shape with dtype dt. */
static tp_type out_as(const tp_node *n, tp_dtype dt) { return lw_out_as(n, 0, dt); }

/* The value of a rank-0 f64 loop counter, broadcast like `like`. */
static tp_val bc(tp_emit *e, tp_val scalar, tp_val like) {
  const tp_type *t = em_type(e, like);
  tp_type tt = *t;
  return em_bcast_to(e, em_convert(e, scalar, tt.dt), tt.rank, tt.dims);
}

/* Any element of a bool tensor true (rank-0 bool). */
static tp_val any_(tp_emit *e, tp_val p) {
  const tp_type *t = em_type(e, p);
  int r = t->rank;
  if (r == 0) return p;
  int64_t dims[TP_MAX_RANK];
  for (int i = 0; i < r; i++) dims[i] = i;
  return em_reduce(e, p, em_const(e, 0, TP_BOOL), dims, r, "stablehlo.or");
}

/* Horner evaluation of sum_k c[k] * y^k (k = 0..m-1). */
static tp_val horner(tp_emit *e, tp_val y, const double *c, int m) {
  tp_val acc = K(e, y, c[m - 1]);
  for (int i = m - 2; i >= 0; i--) acc = add(e, mul(e, acc, y), K(e, y, c[i]));
  return acc;
}

/* An f64 value rounded to dt's precision (kept in f64).  A convert to f32
 * and back does not do it: XLA:CPU drops such round trips (it allows excess
 * precision), reduce_precision it keeps. */

/* ---- unary special functions computed in f64 ------------------------------ */

typedef tp_val (*fn64)(tp_emit *e, tp_val x);

/* A float function of one input, computed in f64 and rounded to the output
 * dtype (integers and bools promote to the output's float dtype). */
static void unary64(tp_emit *e, const tp_node *n, tp_val *o, fn64 f) {
  if (!isf(OUT0->dt)) {
    o[0] = em_fail(e, TP_UNIMPLEMENTED, "%s: output dtype %s is not supported on tpu", n->op, tp_scalar_type_name(OUT0->dt));
    return;
  }
  tp_type ct = out_as(n, TP_F64);
  tp_val x = in_as(e, n, 0, &ct);
  o[0] = em_convert(e, f(e, x), OUT0->dt);
}

/* erfc(x) for x >= 25: the asymptotic series exp(-x^2) / (x sqrt(pi)) *
 * sum_k (-1)^k (2k-1)!! / (2x^2)^k is exact to double precision there; this
 * returns the part after exp(-x^2) (erfcx's large-x form). */
static tp_val erfcx_large(tp_emit *e, tp_val x) {
  double c[12];
  c[0] = 1;
  for (int i = 1; i < 12; i++) c[i] = -c[i - 1] * (2 * i - 1);
  tp_val y = dv(e, K(e, x, 0.5), mul(e, x, x)); /* 1 / (2x^2) */
  return dv(e, horner(e, y, c, 12), mul(e, x, K(e, x, sqrt(M_PI))));
}

/* erfcx(x) = exp(x^2) erfc(x), for any x (f64). */
static tp_val erfcx64(tp_emit *e, tp_val x) {
  tp_val big = cmp(e, "GT", x, K(e, x, 25.0));
  tp_val xs = sel(e, big, K(e, x, 1.0), x); /* keep the unused branch finite */
  tp_val mid = mul(e, exp_(e, mul(e, xs, xs)), un(e, "chlo.erfc", xs));
  tp_val xl = sel(e, big, x, K(e, x, 30.0));
  tp_val r = sel(e, big, erfcx_large(e, xl), mid);
  /* erfcx(+inf) = 0; erfcx(-inf) = inf (exp overflows); NaN stays NaN */
  return sel(e, cmp(e, "EQ", x, K(e, x, INFINITY)), K(e, x, 0), r);
}
static tp_val erfc64(tp_emit *e, tp_val x) { return un(e, "chlo.erfc", x); }

/* log(ndtr(x)): for x < -1 through erfcx (no underflow), else log1p(-erfc(x/sqrt2)/2). */
static tp_val log_ndtr64(tp_emit *e, tp_val x) {
  tp_val t = mul(e, x, K(e, x, M_SQRT1_2));
  tp_val lo = sub(e, log_(e, mul(e, erfcx64(e, un(e, "stablehlo.negate", t)), K(e, x, 0.5))), mul(e, t, t));
  tp_val hi = un(e, "stablehlo.log_plus_one", mul(e, un(e, "chlo.erfc", t), K(e, x, -0.5)));
  return sel(e, cmp(e, "LT", x, K(e, x, -1.0)), lo, hi);
}

/* ndtri(p): the z with ndtr(z) = p.  For q = min(p, 1 - p) (exact in f64),
 * start from Abramowitz & Stegun 26.2.23 (error < 4.5e-4) and take Newton
 * steps on log(ndtr(z)) = log(q); then z for p > 1/2 is -z. */
static tp_val ndtri64(tp_emit *e, tp_val p) {
  tp_val upper = cmp(e, "GT", p, K(e, p, 0.5));
  tp_val q = sel(e, upper, sub(e, K(e, p, 1), p), p);
  tp_val qs = sel(e, cmp(e, "GT", q, K(e, q, 0)), q, K(e, q, 0.25)); /* keep the iteration finite */
  qs = sel(e, isnan_(e, qs), K(e, qs, 0.25), qs);
  tp_val t = sqrt_(e, mul(e, K(e, qs, -2), log_(e, qs)));
  static const double num[3] = {2.515517, 0.802853, 0.010328}, den[4] = {1, 1.432788, 0.189269, 0.001308};
  tp_val z = un(e, "stablehlo.negate", sub(e, t, dv(e, horner(e, t, num, 3), horner(e, t, den, 4))));
  tp_val lq = log_(e, qs);
  for (int it = 0; it < 4; it++) {
    /* d/dz log ndtr(z) = phi(z) / ndtr(z) = sqrt(2/pi) / erfcx(-z / sqrt 2) for z <= 0 */
    tp_val ex = erfcx64(e, mul(e, z, K(e, z, -M_SQRT1_2)));
    tp_val step = mul(e, sub(e, log_ndtr64(e, z), lq), dv(e, ex, K(e, z, sqrt(2.0 / M_PI))));
    z = sub(e, z, step);
    z = em_clamp(e, em_const(e, -40.0, TP_F64), z, em_const(e, 0.0, TP_F64));
  }
  z = sel(e, upper, un(e, "stablehlo.negate", z), z);
  tp_val zero = K(e, p, 0), one = K(e, p, 1);
  z = sel(e, cmp(e, "EQ", p, zero), K(e, p, -INFINITY), z);
  z = sel(e, cmp(e, "EQ", p, one), K(e, p, INFINITY), z);
  z = sel(e, or_(e, cmp(e, "LT", p, zero), cmp(e, "GT", p, one)), K(e, p, NAN), z);
  return sel(e, isnan_(e, p), p, z);
}

/* ---- modified Bessel functions I0, I1, K0, K1 (f64) ------------------------- */

/* Power series in y = x^2/4, 45 terms (exact to double precision for x <= 20):
 *   si = sum_k y^k / (k! (k+nu)!),  sk = sum_k c_k y^k / (k! (k+nu)!)
 * with c_k = H_k (nu = 0) or H_k + H_{k+1} (nu = 1), H_k the harmonic numbers
 * (the log-free part of K_nu's series, DLMF 10.31.1). */
static void bessel_series(tp_emit *e, tp_val y, int nu, tp_val *si, tp_val *sk) {
  tp_val t0 = K(e, y, 1.0);
  tp_val c0 = K(e, y, nu ? 1.0 : 0.0); /* H_0 + H_1 = 1; H_0 = 0 */
  tp_val init[5] = {em_const(e, 0, TP_F64), t0, t0, mul(e, c0, t0), em_const(e, 0, TP_F64)};
  /* carried: k, term, sum_i, sum_k, H_k (scalar) */
  tp_val a[5], b[5], next[5], out[5];
  em_loop L;
  if (em_while_begin(e, &L, init, 5, a)) return;
  tp_val pred = cmp(e, "LT", a[0], em_const(e, 45, TP_F64));
  if (em_while_body(e, &L, pred, b)) return;
  tp_val k1 = add(e, b[0], em_const(e, 1, TP_F64));
  tp_val h1 = add(e, b[4], dv(e, em_const(e, 1, TP_F64), k1)); /* H_{k+1} */
  tp_val den = mul(e, k1, add(e, k1, em_const(e, nu, TP_F64)));
  tp_val term = dv(e, mul(e, b[1], y), bc(e, den, y));
  tp_val c = nu ? add(e, h1, add(e, h1, dv(e, em_const(e, 1, TP_F64), add(e, k1, em_const(e, 1, TP_F64))))) : h1;
  next[0] = k1;
  next[1] = term;
  next[2] = add(e, b[2], term);
  next[3] = add(e, b[3], mul(e, term, bc(e, c, y)));
  next[4] = h1;
  if (em_while_end(e, &L, next, out)) return;
  *si = out[2];
  *sk = out[3];
}

/* sum_k s^k a_k(nu) / x^k, a_k = prod_{j<=k} (4nu^2 - (2j-1)^2) / (k! 8^k):
 * the asymptotic series of I_nu (s = -1) and K_nu (s = +1), for x > 20. */
static tp_val bessel_asym(tp_emit *e, tp_val x, int nu, int s) {
  double c[30];
  c[0] = 1;
  for (int k = 1; k < 30; k++) c[k] = c[k - 1] * s * (4.0 * nu * nu - (2.0 * k - 1) * (2.0 * k - 1)) / (8.0 * k);
  return horner(e, dv(e, K(e, x, 1), x), c, 30);
}

/* exp(-|x|) I_nu(|x|) for x >= 0 (the caller applies the sign of odd nu). */
static tp_val bessel_ie(tp_emit *e, tp_val ax, int nu) {
  tp_val big = cmp(e, "GT", ax, K(e, ax, 20.0));
  tp_val xs = sel(e, big, K(e, ax, 1), ax), xl = sel(e, big, ax, K(e, ax, 30));
  tp_val si, sk;
  bessel_series(e, mul(e, mul(e, xs, xs), K(e, xs, 0.25)), nu, &si, &sk);
  if (em_failed(e)) return -1;
  if (nu) si = mul(e, si, mul(e, xs, K(e, xs, 0.5)));
  tp_val small = mul(e, si, exp_(e, un(e, "stablehlo.negate", xs)));
  tp_val large = dv(e, bessel_asym(e, xl, nu, -1), sqrt_(e, mul(e, xl, K(e, xl, 2 * M_PI))));
  return sel(e, big, large, small);
}

/* exp(x) K_nu(x) for x > 0: series (x <= 2), the trapezoid rule on
 * exp(x) K_nu(x) = int_0^inf exp(-x (cosh t - 1)) cosh(nu t) dt (2 < x <= 20;
 * step 0.1 to t = 4, exact to double precision there), asymptotic series above. */
static tp_val bessel_ke(tp_emit *e, tp_val x, int nu) {
  tp_val le2 = cmp(e, "LE", x, K(e, x, 2.0)), gt20 = cmp(e, "GT", x, K(e, x, 20.0));
  tp_val xs = sel(e, le2, x, K(e, x, 1));
  tp_val si, sk;
  bessel_series(e, mul(e, mul(e, xs, xs), K(e, xs, 0.25)), nu, &si, &sk);
  if (em_failed(e)) return -1;
  const double euler = 0.57721566490153286061;
  tp_val lg = log_(e, mul(e, xs, K(e, xs, 0.5)));
  tp_val ks;
  if (!nu) {
    ks = add(e, mul(e, un(e, "stablehlo.negate", add(e, lg, K(e, xs, euler))), si), sk);
  } else {
    tp_val i1 = mul(e, si, mul(e, xs, K(e, xs, 0.5)));
    tp_val tail = mul(e, mul(e, xs, K(e, xs, 0.25)), sub(e, sk, mul(e, K(e, xs, 2 * euler), si)));
    ks = sub(e, add(e, dv(e, K(e, xs, 1), xs), mul(e, lg, i1)), tail);
  }
  ks = mul(e, ks, exp_(e, xs));
  tp_val xm = sel(e, or_(e, le2, gt20), K(e, x, 5), x);
  const double h = 0.1;
  tp_val acc = K(e, xm, 0);
  for (int j = 0; j <= 40; j++) {
    double t = j * h, sh = sinh(t / 2), c = 2 * sh * sh; /* cosh t - 1 */
    double w = (j == 0 ? 0.5 : 1.0) * (nu ? cosh(t) : 1.0) * h;
    acc = add(e, acc, mul(e, K(e, xm, w), exp_(e, mul(e, xm, K(e, xm, -c)))));
  }
  tp_val xl = sel(e, gt20, x, K(e, x, 30));
  tp_val large = mul(e, bessel_asym(e, xl, nu, 1), sqrt_(e, dv(e, K(e, xl, M_PI / 2), xl)));
  return sel(e, le2, ks, sel(e, gt20, large, acc));
}

static tp_val sgn_odd(tp_emit *e, tp_val x, tp_val v) { return sel(e, cmp(e, "LT", x, K(e, x, 0)), un(e, "stablehlo.negate", v), v); }

static tp_val i0e64(tp_emit *e, tp_val x) { return bessel_ie(e, abs_(e, x), 0); }
static tp_val i1e64(tp_emit *e, tp_val x) { return sgn_odd(e, x, bessel_ie(e, abs_(e, x), 1)); }
/* I_nu = exp(|x|) * scaled; I(+-inf) = +-inf (odd nu) */
static tp_val unscale_i(tp_emit *e, tp_val x, tp_val scaled) {
  tp_val r = mul(e, scaled, exp_(e, abs_(e, x)));
  return sel(e, isinf_(e, x), x, r);
}
static tp_val i0_64(tp_emit *e, tp_val x) { return sel(e, isinf_(e, x), K(e, x, INFINITY), unscale_i(e, x, i0e64(e, x))); }
static tp_val i1_64(tp_emit *e, tp_val x) { return unscale_i(e, x, i1e64(e, x)); }

/* K_nu: x = 0 -> inf, x < 0 -> NaN, x = inf -> 0 (PyTorch). */
static tp_val k_domain(tp_emit *e, tp_val x, tp_val r) {
  r = sel(e, cmp(e, "EQ", x, K(e, x, 0)), K(e, x, INFINITY), r);
  r = sel(e, cmp(e, "EQ", x, K(e, x, INFINITY)), K(e, x, 0), r);
  r = sel(e, cmp(e, "LT", x, K(e, x, 0)), K(e, x, NAN), r);
  return sel(e, isnan_(e, x), x, r);
}
static tp_val kx(tp_emit *e, tp_val x) { /* a finite positive stand-in for domain-edge elements */
  tp_val ok = and_(e, cmp(e, "GT", x, K(e, x, 0)), cmp(e, "LT", x, K(e, x, INFINITY)));
  return sel(e, ok, x, K(e, x, 1));
}
static tp_val k0e64(tp_emit *e, tp_val x) { return k_domain(e, x, bessel_ke(e, kx(e, x), 0)); }
static tp_val k1e64(tp_emit *e, tp_val x) { return k_domain(e, x, bessel_ke(e, kx(e, x), 1)); }
static tp_val k0_64(tp_emit *e, tp_val x) {
  tp_val xx = kx(e, x);
  return k_domain(e, x, mul(e, bessel_ke(e, xx, 0), exp_(e, un(e, "stablehlo.negate", xx))));
}
static tp_val k1_64(tp_emit *e, tp_val x) {
  tp_val xx = kx(e, x);
  return k_domain(e, x, mul(e, bessel_ke(e, xx, 1), exp_(e, un(e, "stablehlo.negate", xx))));
}

#define UNARY64(name, f) \
  static void name(tp_emit *e, const tp_node *n, tp_val *o) { unary64(e, n, o, f); }
UNARY64(r_erfc, erfc64)
UNARY64(r_ndtri, ndtri64)
UNARY64(r_i0e, i0e64)
UNARY64(r_i1e, i1e64)
UNARY64(r_k0, k0_64)
UNARY64(r_k1, k1_64)
UNARY64(r_k0e, k0e64)
UNARY64(r_k1e, k1e64)
#undef UNARY64

/* i0, i1: PyTorch multiplies by exp(|x|) in the compute dtype, so the
 * result is +-inf once that exp overflows (|x| > 88.72 in float, where the
 * true value is still finite) and NaN at +-inf. */
static void unscaled_i(tp_emit *e, const tp_node *n, tp_val *o, fn64 f, int odd) {
  unary64(e, n, o, f);
  if (em_failed(e)) return;
  tp_type ct = out_as(n, TP_F64);
  tp_val x = in_as(e, n, 0, &ct);
  double thr = lw_opmath(OUT0->dt) == TP_F64 ? 709.782712893384 : 88.72283935546875;
  tp_val r = em_convert(e, o[0], TP_F64);
  tp_val big = odd ? sel(e, cmp(e, "LT", x, K(e, x, 0)), K(e, x, -INFINITY), K(e, x, INFINITY)) : K(e, x, INFINITY);
  r = sel(e, cmp(e, "GT", abs_(e, x), K(e, x, thr)), big, r);
  r = sel(e, isinf_(e, x), K(e, x, NAN), r);
  o[0] = em_convert(e, r, OUT0->dt);
}
static void r_i0(tp_emit *e, const tp_node *n, tp_val *o) { unscaled_i(e, n, o, i0_64, 0); }
static void r_i1(tp_emit *e, const tp_node *n, tp_val *o) { unscaled_i(e, n, o, i1_64, 1); }

/* log_ndtr: PyTorch's log(erfcx(-t) / 2) - t * t (x < -1), t = x / sqrt 2,
 * with t, t * t and the final difference rounded to its compute dtype (the
 * difference cancels most of t * t, so its rounding is what the float
 * result and its gradient depend on); erfcx and log in f64. */
static void r_log_ndtr(tp_emit *e, const tp_node *n, tp_val *o) {
  if (!isf(OUT0->dt)) {
    o[0] = lw_not_for(e, "log_ndtr", OUT0->dt);
    return;
  }
  tp_dtype cdt = lw_opmath(OUT0->dt);
  tp_type ct = out_as(n, TP_F64);
  tp_val x = in_as(e, n, 0, &ct);
  /* K(cdt constant) as f64: sqrt(1/2) rounded like PyTorch's constant */
  double c = cdt == TP_F64 ? M_SQRT1_2 : (double)(float)M_SQRT1_2;
  tp_val t = em_round_to(e, mul(e, x, K(e, x, c)), cdt);
  tp_val lg = em_round_to(e, log_(e, mul(e, erfcx64(e, un(e, "stablehlo.negate", t)), K(e, t, 0.5))), cdt);
  tp_val lo = em_round_to(e, sub(e, lg, em_round_to(e, mul(e, t, t), cdt)), cdt);
  tp_val hi = log_ndtr64(e, x);
  o[0] = em_convert(e, sel(e, cmp(e, "LT", x, K(e, x, -1.0)), lo, hi), OUT0->dt);
}

/* erfcx: for x < 0 PyTorch computes 2 exp(x*x) - erfcx(-x) with x*x rounded
 * to its compute dtype (which moves float results by up to ~1e-5 relative
 * at x = -9); the same rounding happens here before the f64 exp. */
static void r_erfcx(tp_emit *e, const tp_node *n, tp_val *o) {
  if (!isf(OUT0->dt)) {
    o[0] = lw_not_for(e, "erfcx_cpu", OUT0->dt);
    return;
  }
  tp_type ct = out_as(n, TP_F64);
  tp_val x = in_as(e, n, 0, &ct);
  tp_val xx = mul(e, x, x);
  xx = em_round_to(e, xx, lw_opmath(OUT0->dt));
  tp_val neg = sub(e, mul(e, K(e, x, 2), exp_(e, xx)), erfcx64(e, un(e, "stablehlo.negate", x)));
  tp_val r = sel(e, cmp(e, "LT", x, K(e, x, 0)), neg, erfcx64(e, x));
  o[0] = em_convert(e, r, OUT0->dt);
}

/* ---- Bessel functions of the first and second kind, spherical j0, Airy Ai ---- */

/* The phase x - c rounded to the dtype PyTorch computes it in (pd), as f64. */
static tp_val phase(tp_emit *e, tp_val x, double c, tp_dtype pd) {
  double cr = pd == TP_F64 ? c : (double)(float)c;
  return em_round_to(e, sub(e, em_round_to(e, x, pd), K(e, x, cr)), pd);
}

/* J_nu (want_y = 0) or Y_nu (want_y = 1) for x >= 0, nu = 0 or 1, in f64:
 * power series for x <= 12 (DLMF 10.2.2 and 10.8.1), Hankel's asymptotic
 * expansion (DLMF 10.17.3-4, 24 terms) above.  pd: PyTorch's dtype for the
 * phase x - (2nu + 1) pi / 4. */
static tp_val bessel_jy(tp_emit *e, tp_val ax, int nu, int want_y, tp_dtype pd) {
  const double euler = 0.57721566490153286061;
  tp_val small = cmp(e, "LE", ax, K(e, ax, 12.0));
  tp_val xs = sel(e, small, ax, K(e, ax, 1));
  xs = sel(e, cmp(e, "EQ", xs, K(e, xs, 0)), K(e, xs, 1), xs);
  tp_val si, sk;
  bessel_series(e, mul(e, mul(e, xs, xs), K(e, xs, -0.25)), nu, &si, &sk);
  if (em_failed(e)) return -1;
  tp_val rs;
  tp_val j = nu ? mul(e, si, mul(e, xs, K(e, xs, 0.5))) : si;
  if (!want_y) {
    rs = j;
  } else {
    tp_val lg = log_(e, mul(e, xs, K(e, xs, 0.5)));
    if (!nu) {
      rs = mul(e, K(e, xs, 2 / M_PI), sub(e, mul(e, add(e, lg, K(e, xs, euler)), si), sk));
    } else {
      tp_val a = dv(e, K(e, xs, -2 / M_PI), xs);
      tp_val b = mul(e, K(e, xs, 2 / M_PI), mul(e, lg, j));
      tp_val c = mul(e, mul(e, xs, K(e, xs, 0.5 / M_PI)), sub(e, sk, mul(e, K(e, xs, 2 * euler), si)));
      rs = sub(e, add(e, a, b), c);
    }
  }
  /* a_k(nu) = prod_{j<=k} (4nu^2 - (2j-1)^2) / (k! 8^k); P = sum (-1)^k a_2k / x^2k,
   * Q = sum (-1)^k a_2k+1 / x^(2k+1) */
  double ak[24], pc[12], qc[12];
  ak[0] = 1;
  for (int k = 1; k < 24; k++) ak[k] = ak[k - 1] * (4.0 * nu * nu - (2.0 * k - 1) * (2.0 * k - 1)) / (8.0 * k);
  for (int k = 0; k < 12; k++) {
    pc[k] = (k % 2 ? -1 : 1) * ak[2 * k];
    qc[k] = (k % 2 ? -1 : 1) * ak[2 * k + 1];
  }
  tp_val xl = sel(e, small, K(e, ax, 20.0), ax);
  tp_val w = dv(e, K(e, xl, 1), mul(e, xl, xl));
  tp_val P = horner(e, w, pc, 12), Q = dv(e, horner(e, w, qc, 12), xl);
  tp_val chi = phase(e, xl, (2 * nu + 1) * M_PI / 4, pd);
  tp_val c = un(e, "stablehlo.cosine", chi), sn = un(e, "stablehlo.sine", chi);
  tp_val amp = sqrt_(e, dv(e, K(e, xl, 2 / M_PI), xl));
  tp_val rl = want_y ? mul(e, amp, add(e, mul(e, P, sn), mul(e, Q, c))) : mul(e, amp, sub(e, mul(e, P, c), mul(e, Q, sn)));
  return sel(e, small, rs, rl);
}

static void r_bessel(tp_emit *e, const tp_node *n, tp_val *o, int nu, int want_y) {
  if (!isf(OUT0->dt)) {
    o[0] = lw_not_for(e, "bessel", OUT0->dt);
    return;
  }
  tp_type ct = out_as(n, TP_F64);
  tp_val x = in_as(e, n, 0, &ct);
  tp_val ax = abs_(e, x);
  tp_val r = bessel_jy(e, ax, nu, want_y, lw_opmath(OUT0->dt));
  if (want_y) {
    r = sel(e, cmp(e, "EQ", x, K(e, x, 0)), K(e, x, -INFINITY), r);
    r = sel(e, cmp(e, "LT", x, K(e, x, 0)), K(e, x, NAN), r);
  } else {
    if (nu) r = sel(e, cmp(e, "LT", x, K(e, x, 0)), un(e, "stablehlo.negate", r), r);
    r = sel(e, cmp(e, "EQ", x, K(e, x, 0)), K(e, x, nu ? 0.0 : 1.0), r);
  }
  o[0] = em_convert(e, r, OUT0->dt);
}
static void r_j0(tp_emit *e, const tp_node *n, tp_val *o) { r_bessel(e, n, o, 0, 0); }
static void r_j1(tp_emit *e, const tp_node *n, tp_val *o) { r_bessel(e, n, o, 1, 0); }
static void r_y0(tp_emit *e, const tp_node *n, tp_val *o) { r_bessel(e, n, o, 0, 1); }
static void r_y1(tp_emit *e, const tp_node *n, tp_val *o) { r_bessel(e, n, o, 1, 1); }

/* spherical j0 = sin(x) / x (1 at 0, 0 at +-inf), in f64. */
static tp_val sph_j0_64(tp_emit *e, tp_val x) {
  tp_val z = cmp(e, "EQ", x, K(e, x, 0));
  tp_val xs = sel(e, z, K(e, x, 1), x);
  tp_val r = dv(e, un(e, "stablehlo.sine", xs), xs);
  r = sel(e, z, K(e, x, 1), r);
  return sel(e, isinf_(e, x), K(e, x, 0), r);
}

/* Airy Ai in f64: Maclaurin series Ai = c1 f - c2 g (DLMF 9.4.1) for
 * -10 <= x <= 2; for x > 2, Ai = sqrt(x/3) / pi * K_1/3(zeta) with
 * zeta = 2/3 x^3/2, K by the trapezoid rule on its integral (zeta <= 20) or
 * the asymptotic series (DLMF 9.7.5); for x < -10 the oscillatory expansion
 * (DLMF 9.7.9) with PyTorch's phase zeta + pi/4 rounded like its.  PyTorch:
 * +-inf -> NaN, x > 103.892 -> 0. */
static tp_val airy_ai64(tp_emit *e, tp_val x, tp_dtype pd) {
  const double c1 = 0.355028053887817239260, c2 = 0.258819403792806798405;
  tp_val ser_ok = and_(e, cmp(e, "GE", x, K(e, x, -10.0)), cmp(e, "LE", x, K(e, x, 2.0)));
  tp_val xs = sel(e, ser_ok, x, K(e, x, 0));
  tp_val x3 = mul(e, xs, mul(e, xs, xs));
  /* carried: k, f term, g term, f sum, g sum */
  tp_val init[5] = {em_const(e, 0, TP_F64), K(e, xs, 1), xs, K(e, xs, 1), xs};
  tp_val a[5], b[5], next[5], out[5];
  em_loop L;
  if (em_while_begin(e, &L, init, 5, a)) return -1;
  if (em_while_body(e, &L, cmp(e, "LT", a[0], em_const(e, 40, TP_F64)), b)) return -1;
  tp_val k3 = mul(e, b[0], em_const(e, 3, TP_F64));
  tp_val one = em_const(e, 1, TP_F64);
  tp_val d2 = add(e, k3, em_const(e, 2, TP_F64)), d3 = add(e, k3, em_const(e, 3, TP_F64)), d4 = add(e, k3, em_const(e, 4, TP_F64));
  tp_val ft = dv(e, mul(e, b[1], x3), bc(e, mul(e, d2, d3), x3));
  tp_val gt = dv(e, mul(e, b[2], x3), bc(e, mul(e, d3, d4), x3));
  next[0] = add(e, b[0], one);
  next[1] = ft;
  next[2] = gt;
  next[3] = add(e, b[3], ft);
  next[4] = add(e, b[4], gt);
  if (em_while_end(e, &L, next, out)) return -1;
  tp_val rser = sub(e, mul(e, K(e, x, c1), out[3]), mul(e, K(e, x, c2), out[4]));
  /* u_k (DLMF 9.7.2) */
  double u[24];
  u[0] = 1;
  for (int k = 1; k < 24; k++) u[k] = u[k - 1] * (6.0 * k - 5) * (6.0 * k - 3) * (6.0 * k - 1) / ((2.0 * k - 1) * 216.0 * k);
  /* x > 2 */
  tp_val pos = cmp(e, "GT", x, K(e, x, 2.0));
  tp_val xp = sel(e, pos, x, K(e, x, 3.0));
  tp_val zp = mul(e, K(e, xp, 2.0 / 3), mul(e, xp, sqrt_(e, xp)));
  tp_val zlarge = cmp(e, "GT", zp, K(e, zp, 20.0));
  tp_val zm = sel(e, zlarge, K(e, zp, 5.0), zp);
  const double h = 0.1;
  tp_val acc = K(e, zm, 0);
  for (int j = 0; j <= 50; j++) {
    double t = j * h, sh = sinh(t / 2), cc = 2 * sh * sh;
    double wgt = (j == 0 ? 0.5 : 1.0) * cosh(t / 3) * h;
    acc = add(e, acc, mul(e, K(e, zm, wgt), exp_(e, mul(e, zm, K(e, zm, -cc)))));
  }
  tp_val rmid = mul(e, mul(e, sqrt_(e, mul(e, xp, K(e, xp, 1.0 / 3))), K(e, xp, 1 / M_PI)), mul(e, acc, exp_(e, un(e, "stablehlo.negate", zm))));
  double ua[24];
  for (int k = 0; k < 24; k++) ua[k] = (k % 2 ? -1 : 1) * u[k];
  tp_val zl = sel(e, zlarge, zp, K(e, zp, 30.0));
  tp_val x14 = sqrt_(e, sqrt_(e, xp));
  tp_val rbig = dv(e, mul(e, exp_(e, un(e, "stablehlo.negate", zl)), horner(e, dv(e, K(e, zl, 1), zl), ua, 24)),
                   mul(e, K(e, zl, 2 * sqrt(M_PI)), x14));
  tp_val rpos = sel(e, zlarge, rbig, rmid);
  /* x < -10 */
  tp_val negb = cmp(e, "LT", x, K(e, x, -10.0));
  tp_val xn = sel(e, negb, un(e, "stablehlo.negate", x), K(e, x, 20.0)); /* |x| */
  tp_val zn = mul(e, K(e, xn, 2.0 / 3), mul(e, xn, sqrt_(e, xn)));
  double pc[12], qc[12];
  for (int k = 0; k < 12; k++) {
    pc[k] = (k % 2 ? -1 : 1) * u[2 * k];
    qc[k] = (k % 2 ? -1 : 1) * u[2 * k + 1];
  }
  tp_val wz = dv(e, K(e, zn, 1), mul(e, zn, zn));
  tp_val P = horner(e, wz, pc, 12), Q = dv(e, horner(e, wz, qc, 12), zn);
  /* PyTorch's t = -2 x sqrt(-x) / 3 + pi / 4 in its dtype */
  tp_val xq = em_round_to(e, un(e, "stablehlo.negate", xn), pd);
  tp_val sq = em_round_to(e, sqrt_(e, un(e, "stablehlo.negate", xq)), pd);
  tp_val tq = em_round_to(e, dv(e, em_round_to(e, mul(e, mul(e, K(e, xq, -2.0), xq), sq), pd), K(e, xq, 3.0)), pd);
  double qpi = pd == TP_F64 ? 0.25 * M_PI : (double)(0.25f * (float)M_PI);
  tp_val t = em_round_to(e, add(e, tq, K(e, tq, qpi)), pd);
  tp_val rneg = dv(e, sub(e, mul(e, un(e, "stablehlo.sine", t), P), mul(e, un(e, "stablehlo.cosine", t), Q)),
                   mul(e, K(e, xn, sqrt(M_PI)), sqrt_(e, sqrt_(e, xn))));
  tp_val r = sel(e, pos, rpos, sel(e, negb, rneg, rser));
  r = sel(e, cmp(e, "GT", x, K(e, x, 103.892)), K(e, x, 0), r);
  r = sel(e, isinf_(e, x), K(e, x, NAN), r);
  return sel(e, isnan_(e, x), x, r);
}

static void r_airy_ai(tp_emit *e, const tp_node *n, tp_val *o) {
  if (!isf(OUT0->dt)) {
    o[0] = lw_not_for(e, "airy_ai_cpu", OUT0->dt);
    return;
  }
  tp_type ct = out_as(n, TP_F64);
  o[0] = em_convert(e, airy_ai64(e, in_as(e, n, 0, &ct), lw_opmath(OUT0->dt)), OUT0->dt);
}
static void r_sph_j0(tp_emit *e, const tp_node *n, tp_val *o) { unary64(e, n, o, sph_j0_64); }

/* ---- polygamma and zeta --------------------------------------------------------- */

/* Hurwitz zeta(x, q) = sum_i (q + i)^-x in f64 by Euler-Maclaurin summation:
 * terms are added directly until q + i > 9 (and at least 9 of them, as in
 * PyTorch, which also sums from negative q directly), then the tail
 * w^(1-x)/(x-1) - w^-x/2 + sum_j B_2j/(2j)! x(x+1)..(x+2j-2) w^(-x-2j+1)
 * with w the last q + i.  PyTorch's domain rules: x = 1 -> inf, x < 1 -> NaN,
 * q <= 0 an integer -> inf, q <= 0 with x not an integer -> NaN. */
static tp_val zeta64(tp_emit *e, tp_val x, tp_val q) {
  static const double bern[12][2] = {{1, 6},       {-1, 30},    {1, 42},         {-1, 30},
                                     {5, 66},      {-691, 2730}, {7, 6},         {-3617, 510},
                                     {43867, 798}, {-174611, 330}, {854513, 138}, {-236364091, 2730}};
  tp_val qle0 = cmp(e, "LE", q, K(e, q, 0));
  tp_val qint = cmp(e, "EQ", q, un(e, "stablehlo.floor", q));
  tp_val xint = cmp(e, "EQ", x, un(e, "stablehlo.floor", x));
  tp_val bad = or_(e, cmp(e, "LE", x, K(e, x, 1)), and_(e, qle0, or_(e, qint, not_(e, xint))));
  bad = or_(e, bad, or_(e, isnan_(e, x), isnan_(e, q)));
  tp_val xs = sel(e, bad, K(e, x, 2), x), qs = sel(e, bad, K(e, q, 1), q);
  tp_val nx = un(e, "stablehlo.negate", xs);
  tp_val b0 = em_binary(e, "stablehlo.power", qs, nx);
  /* carried: i (scalar), a = q + i, s = partial sum, b = a^-x */
  tp_val init[4] = {em_const(e, 0, TP_F64), qs, b0, b0};
  tp_val av[4], bv[4], next[4], out[4];
  em_loop L;
  if (em_while_begin(e, &L, init, 4, av)) return -1;
  tp_val lt9 = cmp(e, "LT", av[0], em_const(e, 9, TP_F64));
  tp_type qst = *em_type(e, qs);
  tp_val more = or_(e, em_bcast_to(e, lt9, qst.rank, qst.dims), cmp(e, "LE", av[1], K(e, qs, 9)));
  if (em_while_body(e, &L, any_(e, more), bv)) return -1;
  tp_val lt9b = cmp(e, "LT", bv[0], em_const(e, 9, TP_F64));
  tp_val step = or_(e, em_bcast_to(e, lt9b, qst.rank, qst.dims), cmp(e, "LE", bv[1], K(e, qs, 9)));
  tp_val a1 = add(e, bv[1], K(e, qs, 1));
  tp_val t = em_binary(e, "stablehlo.power", a1, nx);
  next[0] = add(e, bv[0], em_const(e, 1, TP_F64));
  next[1] = sel(e, step, a1, bv[1]);
  next[2] = sel(e, step, add(e, bv[2], t), bv[2]);
  next[3] = sel(e, step, t, bv[3]);
  if (em_while_end(e, &L, next, out)) return -1;
  tp_val w = out[1], s = out[2], b = out[3];
  s = add(e, s, dv(e, mul(e, b, w), sub(e, xs, K(e, xs, 1))));
  s = sub(e, s, mul(e, K(e, b, 0.5), b));
  tp_val fac = K(e, xs, 1), kk = K(e, xs, 0);
  double f2j = 1; /* (2j)! */
  for (int j = 0; j < 12; j++) {
    f2j *= (2.0 * j + 1) * (2.0 * j + 2);
    fac = mul(e, fac, add(e, xs, kk));
    b = dv(e, b, w);
    s = add(e, s, mul(e, mul(e, fac, b), K(e, b, bern[j][0] / bern[j][1] / f2j)));
    kk = add(e, kk, K(e, kk, 1));
    fac = mul(e, fac, add(e, xs, kk));
    b = dv(e, b, w);
    kk = add(e, kk, K(e, kk, 1));
  }
  tp_val z = s;
  z = sel(e, and_(e, qle0, not_(e, xint)), K(e, x, NAN), z);
  z = sel(e, and_(e, qle0, qint), K(e, x, INFINITY), z);
  z = sel(e, cmp(e, "LT", x, K(e, x, 1)), K(e, x, NAN), z);
  z = sel(e, cmp(e, "EQ", x, K(e, x, 1)), K(e, x, INFINITY), z);
  return sel(e, or_(e, isnan_(e, x), isnan_(e, q)), K(e, x, NAN), z);
}

/* special_zeta(x, q): computed in f64 (PyTorch accumulates in double too). */
static void r_zeta(tp_emit *e, const tp_node *n, tp_val *o) {
  if (!isf(OUT0->dt)) {
    o[0] = lw_not_for(e, "zeta_cpu", OUT0->dt);
    return;
  }
  tp_type ct = out_as(n, TP_F64);
  o[0] = em_convert(e, zeta64(e, in_as(e, n, 0, &ct), in_as(e, n, 1, &ct)), OUT0->dt);
}

/* PyTorch's trigamma, operation for operation in dt (f32 or f64): the
 * reflection for x < 1/2 in dt's precision, six recurrence steps, then the
 * asymptotic series. */
static tp_val trigamma_t(tp_emit *e, tp_val x) {
  int f64 = em_type(e, x)->dt == TP_F64;
  float pf = (float)M_PI, ppf = pf * pf;
  double pi = f64 ? M_PI : (double)pf, pp = f64 ? M_PI * M_PI : (double)ppf;
  tp_val refl = cmp(e, "LT", x, K(e, x, 0.5));
  tp_val s = un(e, "stablehlo.sine", mul(e, K(e, x, pi), x));
  tp_val result = sel(e, refl, sub(e, K(e, x, 0), dv(e, K(e, x, pp), mul(e, s, s))), K(e, x, 0));
  x = sel(e, refl, sub(e, K(e, x, 1), x), x);
  for (int i = 0; i < 6; i++) {
    result = add(e, result, dv(e, K(e, x, 1), mul(e, x, x)));
    x = add(e, x, K(e, x, 1));
  }
  tp_val ixx = dv(e, K(e, x, 1), mul(e, x, x));
  double c6 = f64 ? 1.0 / 6 : (double)(1.f / 6), c30 = f64 ? 1.0 / 30 : (double)(1.f / 30),
         c42 = f64 ? 1.0 / 42 : (double)(1.f / 42);
  tp_val ser = mul(e, ixx, sub(e, K(e, x, c6), mul(e, ixx, sub(e, K(e, x, c30), mul(e, ixx, K(e, x, c42))))));
  ser = add(e, add(e, K(e, x, 1), dv(e, K(e, x, 1), mul(e, K(e, x, 2), x))), ser);
  result = add(e, result, dv(e, ser, x));
  return sel(e, refl, un(e, "stablehlo.negate", result), result);
}

/* polygamma(n, x): digamma (n = 0), PyTorch's trigamma (n = 1), else
 * (-1)^(n+1) n! zeta(n + 1, x) with n! = exp(lgamma(n + 1)) in the compute
 * dtype and zeta in f64, as PyTorch does. */
static void polygamma_at(tp_emit *e, const tp_node *n, tp_val *o, int n_i, int x_i) {
  int64_t order = lw_int(n, n_i, 0);
  if (order < 0) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "polygamma(n, x) does not support negative n.");
    return;
  }
  if (!isf(OUT0->dt)) {
    o[0] = lw_not_for(e, "polygamma", OUT0->dt);
    return;
  }
  tp_dtype cdt = lw_opmath(OUT0->dt);
  tp_type ct = out_as(n, cdt);
  tp_val x = in_as(e, n, x_i, &ct);
  tp_val r;
  if (order == 0) {
    r = lw_digamma(e, x);
  } else if (order == 1) {
    r = trigamma_t(e, x);
  } else {
    double fact = cdt == TP_F64 ? exp(lgamma((double)order + 1)) : (double)expf(lgammaf((float)order + 1.f));
    tp_type t64 = out_as(n, TP_F64);
    tp_val x64 = em_convert(e, x, TP_F64);
    tp_val z = em_convert(e, zeta64(e, em_full(e, (double)(order + 1), &t64), x64), cdt);
    r = mul(e, K(e, z, (order % 2) ? fact : -fact), z);
  }
  o[0] = em_convert(e, r, OUT0->dt);
}
static void r_polygamma(tp_emit *e, const tp_node *n, tp_val *o) { polygamma_at(e, n, o, 0, 1); }
/* polygamma_(self, n): the in-place form takes its arguments the other way round. */
static void r_polygamma_(tp_emit *e, const tp_node *n, tp_val *o) { polygamma_at(e, n, o, 1, 0); }

/* ---- regularized incomplete gamma ------------------------------------------------- */

/* P(a, x) (want_q = 0) or Q(a, x) = 1 - P in f64: the series
 * P = x^a e^-x / Gamma(a+1) sum_k x^k / ((a+1)..(a+k)) where x < a + 1, the
 * continued fraction for Q (modified Lentz) elsewhere; the other one is
 * 1 minus it.  Both are while loops until every element has converged;
 * elements that have not converged after 20000 steps (a above ~10^7 with
 * x near a, where PyTorch switches to an asymptotic expansion) give NaN
 * rather than an inaccurate value.  PyTorch's boundary values: a < 0 or
 * x < 0 -> NaN; a = 0 -> 1 (P) / 0 (Q) for x > 0, else NaN; x = 0 -> 0 / 1;
 * a = inf -> 0 / 1 (NaN if x = inf too); x = inf -> 1 / 0. */
static tp_val igamma64(tp_emit *e, tp_val a, tp_val x, int want_q) {
  const double maxit = 20000;
  tp_val one = K(e, a, 1);
  tp_val ok = and_(e, and_(e, cmp(e, "GT", a, K(e, a, 0)), cmp(e, "GT", x, K(e, x, 0))),
                   and_(e, cmp(e, "LT", a, K(e, a, INFINITY)), cmp(e, "LT", x, K(e, x, INFINITY))));
  tp_val use_ser = and_(e, ok, cmp(e, "LT", x, add(e, a, one)));
  tp_val use_cf = and_(e, ok, not_(e, use_ser));
  const tp_type *tt = em_type(e, a);
  int rank = tt->rank;
  int64_t dims[TP_MAX_RANK];
  memcpy(dims, tt->dims, sizeof dims);
  /* series on (as, xs); other elements get (1, 0.5), which converges at once */
  tp_val as = sel(e, use_ser, a, one), xs = sel(e, use_ser, x, K(e, x, 0.5));
  tp_val init[4] = {em_const(e, 0, TP_F64), one, one, one}; /* k, term, sum, a + k */
  tp_val v[4], w[4], next[4], out[4];
  em_loop L;
  if (em_while_begin(e, &L, init, 4, v)) return -1;
  tp_val go = and_(e, any_(e, cmp(e, "GT", abs_(e, v[1]), mul(e, abs_(e, v[2]), K(e, v[2], 1e-17)))),
                   cmp(e, "LT", v[0], em_const(e, maxit, TP_F64)));
  if (em_while_body(e, &L, go, w)) return -1;
  tp_val ak = add(e, as, em_bcast_to(e, add(e, w[0], em_const(e, 1, TP_F64)), rank, dims));
  tp_val term = mul(e, w[1], dv(e, xs, ak));
  next[0] = add(e, w[0], em_const(e, 1, TP_F64));
  next[1] = term;
  next[2] = add(e, w[2], term);
  next[3] = ak;
  if (em_while_end(e, &L, next, out)) return -1;
  tp_val ser_conv = cmp(e, "LE", abs_(e, out[1]), mul(e, abs_(e, out[2]), K(e, out[2], 1e-17)));
  tp_val lg1 = un(e, "chlo.lgamma", add(e, as, one));
  tp_val p_ser = mul(e, exp_(e, sub(e, sub(e, mul(e, as, log_(e, xs)), xs), lg1)), out[2]);
  /* continued fraction on (ac, xc); others get (1, 3) */
  tp_val ac = sel(e, use_cf, a, one), xc = sel(e, use_cf, x, K(e, x, 3));
  const double tiny = 1e-300;
  tp_val b0 = sub(e, add(e, xc, one), ac);
  tp_val d0 = dv(e, one, b0);
  /* carried: i, b, c, d, h, delta */
  tp_val ci[6] = {em_const(e, 0, TP_F64), b0, K(e, a, 1 / tiny), d0, d0, K(e, a, 0)};
  tp_val cv[6], cw[6], cn[6], co[6];
  if (em_while_begin(e, &L, ci, 6, cv)) return -1;
  tp_val cgo = and_(e, any_(e, cmp(e, "GT", abs_(e, sub(e, cv[5], one)), K(e, one, 1e-15))),
                    cmp(e, "LT", cv[0], em_const(e, maxit, TP_F64)));
  if (em_while_body(e, &L, cgo, cw)) return -1;
  tp_val i1 = add(e, cw[0], em_const(e, 1, TP_F64));
  tp_val ib = em_bcast_to(e, i1, rank, dims);
  tp_val an = mul(e, un(e, "stablehlo.negate", ib), sub(e, ib, ac));
  tp_val b = add(e, cw[1], K(e, one, 2));
  tp_val d = add(e, mul(e, an, cw[3]), b);
  d = sel(e, cmp(e, "LT", abs_(e, d), K(e, d, tiny)), K(e, d, tiny), d);
  tp_val c = add(e, b, dv(e, an, cw[2]));
  c = sel(e, cmp(e, "LT", abs_(e, c), K(e, c, tiny)), K(e, c, tiny), c);
  d = dv(e, one, d);
  tp_val del = mul(e, d, c);
  cn[0] = i1;
  cn[1] = b;
  cn[2] = c;
  cn[3] = d;
  cn[4] = mul(e, cw[4], del);
  cn[5] = del;
  if (em_while_end(e, &L, cn, co)) return -1;
  tp_val cf_conv = cmp(e, "LE", abs_(e, sub(e, co[5], one)), K(e, one, 1e-15));
  tp_val lg = un(e, "chlo.lgamma", ac);
  tp_val q_cf = mul(e, exp_(e, sub(e, sub(e, mul(e, ac, log_(e, xc)), xc), lg)), co[4]);
  tp_val r = want_q ? sel(e, use_ser, sub(e, one, p_ser), q_cf) : sel(e, use_ser, p_ser, sub(e, one, q_cf));
  tp_val conv = sel(e, use_ser, ser_conv, cf_conv);
  r = sel(e, conv, r, K(e, r, NAN));
  /* boundary values, in PyTorch's order (the last select wins) */
  tp_val zero = K(e, a, 0), nan = K(e, a, NAN);
  tp_val P1 = want_q ? zero : one, P0 = want_q ? one : zero;
  r = sel(e, isinf_(e, x), P1, r);
  r = sel(e, isinf_(e, a), sel(e, isinf_(e, x), nan, P0), r);
  r = sel(e, cmp(e, "EQ", x, zero), P0, r);
  r = sel(e, cmp(e, "EQ", a, zero), sel(e, cmp(e, "GT", x, zero), P1, nan), r);
  r = sel(e, or_(e, cmp(e, "LT", x, zero), cmp(e, "LT", a, zero)), nan, r);
  return sel(e, or_(e, isnan_(e, a), isnan_(e, x)), nan, r);
}

static void r_igamma_any(tp_emit *e, const tp_node *n, tp_val *o, int want_q) {
  if (!isf(OUT0->dt)) {
    o[0] = lw_not_for(e, want_q ? "igammac_cpu" : "igamma_cpu", OUT0->dt);
    return;
  }
  tp_type ct = out_as(n, TP_F64);
  o[0] = em_convert(e, igamma64(e, in_as(e, n, 0, &ct), in_as(e, n, 1, &ct), want_q), OUT0->dt);
}
static void r_igamma(tp_emit *e, const tp_node *n, tp_val *o) { r_igamma_any(e, n, o, 0); }
static void r_igammac(tp_emit *e, const tp_node *n, tp_val *o) { r_igamma_any(e, n, o, 1); }

/* ---- orthogonal polynomials ------------------------------------------------------ */

typedef enum { CHEB_T, CHEB_U, CHEB_V, CHEB_W, SCHEB_T, SCHEB_U, SCHEB_V, SCHEB_W, HERM_H, HERM_HE, LAGUERRE,
               LEGENDRE } poly_kind;

/* n (already in the compute dtype, as PyTorch converts it) as int64 the way
 * static_cast<int64_t> does on x86-64: truncation, INT64_MIN for NaN and
 * out-of-range values. */
static tp_val degree_i64(tp_emit *e, tp_val nf) {
  tp_val c = em_convert(e, nf, TP_I64);
  tp_val ok = cmp(e, "LT", abs_(e, nf), K(e, nf, 9223372036854775808.0));
  tp_type t = *em_type(e, c);
  return sel(e, ok, c, em_bcast_to(e, em_const_i(e, INT64_MIN, TP_I64), t.rank, t.dims));
}

static void r_poly(tp_emit *e, const tp_node *n, tp_val *o, poly_kind kind, const char *kname) {
  tp_dtype dt = OUT0->dt;
  if (dt != TP_F32 && dt != TP_F64) {
    o[0] = lw_not_for(e, kname, dt);
    return;
  }
  tp_type ct = out_as(n, dt);
  tp_val x = in_as(e, n, 0, &ct), nf = in_as(e, n, 1, &ct);
  tp_val ni = degree_i64(e, nf);
  tp_val nT = em_convert(e, ni, dt);
#define I(v) K(e, ni, (double)(v))
#define T(v) K(e, x, (double)(v))
  tp_val one = T(1), ax = abs_(e, x);
  int shifted = kind >= SCHEB_T && kind <= SCHEB_W;
  /* the Chebyshev argument: x, or 2x - 1 for the shifted ones (PyTorch's x + x - 1) */
  tp_val y = shifted ? sub(e, add(e, x, x), one) : x;
  tp_val y2 = add(e, y, y);
  tp_val even = cmp(e, "EQ", em_binary(e, "stablehlo.remainder", ni, I(2)), I(0));
  tp_val np1 = em_convert(e, add(e, ni, I(1)), dt);                 /* n + 1 */
  tp_val n2p1 = em_convert(e, add(e, add(e, ni, ni), I(1)), dt);    /* n + n + 1 */
  tp_val neg = un(e, "stablehlo.negate", one);
  /* recurrence start (n == 1 value) and the loop's first k and last k */
  tp_val q0;
  switch (kind) {
    case CHEB_T: case SCHEB_T: q0 = y; break;
    case CHEB_U: case SCHEB_U: q0 = y2; break;
    case CHEB_V: case SCHEB_V: q0 = sub(e, y2, one); break;
    case CHEB_W: case SCHEB_W: q0 = add(e, y2, one); break;
    case HERM_H: q0 = add(e, x, x); break;
    case HERM_HE: q0 = x; break;
    case LAGUERRE: q0 = sub(e, one, x); break;
    default: q0 = x; break;
  }
  int cheb = kind <= SCHEB_W;
  /* elements whose value comes from the recurrence (PyTorch's branches before it) */
  tp_type bt = out_as(n, TP_BOOL);
  tp_val closed = T(0), use_closed = em_full(e, 0, &bt);
  tp_val special = use_closed;                              /* an earlier special case applies */
  tp_val special_v = T(0);
  tp_val ay = abs_(e, y);
  if (kind <= CHEB_W || kind == LEGENDRE) {
    tp_val at1 = cmp(e, "EQ", ax, one), pos = cmp(e, "GT", x, T(0));
    tp_val pm1 = sel(e, or_(e, pos, even), one, neg);
    tp_val v = pm1;
    if (kind == CHEB_U) v = sel(e, or_(e, pos, even), np1, un(e, "stablehlo.negate", np1));
    if (kind == CHEB_V) v = sel(e, pos, one, sel(e, even, n2p1, un(e, "stablehlo.negate", n2p1)));
    if (kind == CHEB_W) v = sel(e, pos, n2p1, sel(e, even, one, neg));
    special = at1;
    special_v = v;
  } else if (shifted) {
    tp_val is1 = cmp(e, "EQ", x, one), is0 = cmp(e, "EQ", x, T(0));
    tp_val v1 = kind == SCHEB_T || kind == SCHEB_V ? one : kind == SCHEB_U ? np1 : n2p1;
    tp_val v0 = kind == SCHEB_T || kind == SCHEB_W ? sel(e, even, one, neg)
                : kind == SCHEB_U ? sel(e, even, np1, un(e, "stablehlo.negate", np1))
                                  : sel(e, even, n2p1, un(e, "stablehlo.negate", n2p1));
    special = or_(e, is1, is0);
    special_v = sel(e, is1, v1, v0);
  } else if (kind == LAGUERRE) {
    special = cmp(e, "EQ", ax, T(0));
    special_v = one;
  }
  if (cheb) {
    int lim = kind == CHEB_T || shifted ? 6 : 8;
    if (kind == SCHEB_W) lim = 4;
    use_closed = and_(e, cmp(e, "GT", ni, I(lim)), cmp(e, "LT", ay, one));
    /* acos in f64, rounded once (XLA's f32 acos is less accurate; the
     * closed forms amplify its error by up to n / sin(acos x)) */
    tp_val th = em_convert(e, un(e, "chlo.acos", em_convert(e, y, TP_F64)), dt);
    /* sin/cos of the dt-rounded argument, evaluated in f64: XLA's f32 sine
     * and cosine lose accuracy for large arguments (n in the millions) */
#define COS(v) em_convert(e, un(e, "stablehlo.cosine", em_round_to(e, em_convert(e, (v), TP_F64), dt)), dt)
#define SIN(v) em_convert(e, un(e, "stablehlo.sine", em_round_to(e, em_convert(e, (v), TP_F64), dt)), dt)
    tp_val half = dv(e, th, T(2));
    tp_val nh = add(e, nT, T(0.5));
    switch (kind) {
      case CHEB_T: case SCHEB_T: closed = COS(mul(e, nT, th)); break;
      case CHEB_U: case SCHEB_U: {
        tp_val s = SIN(th);
        tp_val a = dv(e, SIN(mul(e, np1, th)), s);
        tp_val b = dv(e, mul(e, np1, COS(mul(e, np1, th))), y);
        closed = sel(e, cmp(e, "NE", s, T(0)), a, b);
        break;
      }
      case CHEB_V: case SCHEB_V: {
        tp_val a = dv(e, COS(mul(e, nh, th)), COS(half));
        closed = sel(e, cmp(e, "NE", SIN(half), one), a,
                     sel(e, even, n2p1, un(e, "stablehlo.negate", n2p1)));
        break;
      }
      default: { /* W */
        tp_val a = dv(e, SIN(mul(e, nh, th)), SIN(half));
        tp_val b = kind == CHEB_W ? sel(e, cmp(e, "GT", x, T(0)), n2p1, sel(e, even, one, neg)) : sel(e, even, one, neg);
        closed = sel(e, cmp(e, "NE", COS(half), one), a, b);
        break;
      }
    }
  }
#undef COS
#undef SIN
  tp_val too_big = em_full(e, 0, &bt); /* hermite: n above PyTorch's limit gives NaN */
  if (kind == HERM_H || kind == HERM_HE) too_big = cmp(e, "GT", ni, I(dt == TP_F32 ? 128 : 512));
  /* loop over k; per element the step runs while k <= last (and q is not
   * NaN where PyTorch checks it) */
  int k0 = cheb ? 2 : 1;
  tp_val last = cheb ? ni : sub(e, ni, I(1));
  int nan_stop = kind != HERM_H && kind != HERM_HE;
  tp_val looping = not_(e, or_(e, or_(e, special, use_closed), or_(e, too_big, cmp(e, "LT", ni, I(2)))));
  tp_val init[3] = {em_const_i(e, k0, TP_I64), one, q0};
  tp_val a[3], b[3], next[3], res[3];
  em_loop L;
  if (em_while_begin(e, &L, init, 3, a)) return;
  tp_val ka = em_bcast_to(e, a[0], ct.rank, ct.dims);
  tp_val act = and_(e, looping, cmp(e, "LE", ka, last));
  if (nan_stop) act = and_(e, act, not_(e, isnan_(e, a[2])));
  if (em_while_body(e, &L, any_(e, act), b)) return;
  tp_val kb = em_bcast_to(e, b[0], ct.rank, ct.dims);
  tp_val upd = and_(e, looping, cmp(e, "LE", kb, last));
  if (nan_stop) upd = and_(e, upd, not_(e, isnan_(e, b[2])));
  tp_val p = b[1], q = b[2], kt = em_convert(e, kb, dt), r;
  switch (kind) {
    case HERM_H: /* k steps by 2 in PyTorch: (x + x) q - 2j p */
      r = sub(e, mul(e, add(e, x, x), q), mul(e, em_convert(e, add(e, kb, kb), dt), p));
      break;
    case HERM_HE: r = sub(e, mul(e, x, q), mul(e, kt, p)); break;
    case LAGUERRE:
      r = dv(e, sub(e, mul(e, add(e, em_convert(e, add(e, kb, kb), dt), sub(e, one, x)), q), mul(e, kt, p)),
             em_convert(e, add(e, kb, em_bcast_to(e, em_const_i(e, 1, TP_I64), ct.rank, ct.dims)), dt));
      break;
    case LEGENDRE:
      r = dv(e, sub(e, mul(e, mul(e, em_convert(e, add(e, add(e, kb, kb), em_bcast_to(e, em_const_i(e, 1, TP_I64), ct.rank, ct.dims)), dt), x), q), mul(e, kt, p)),
             em_convert(e, add(e, kb, em_bcast_to(e, em_const_i(e, 1, TP_I64), ct.rank, ct.dims)), dt));
      break;
    default: r = sub(e, mul(e, y2, q), p); break;
  }
  next[0] = add(e, b[0], em_const_i(e, 1, TP_I64));
  next[1] = sel(e, upd, q, p);
  next[2] = sel(e, upd, r, q);
  if (em_while_end(e, &L, next, res)) return;
  /* assemble in PyTorch's order of checks */
  tp_val v = res[2];
  v = sel(e, cmp(e, "EQ", ni, I(1)), q0, v);
  v = sel(e, cmp(e, "EQ", ni, I(0)), one, v);
  if (kind == HERM_H || kind == HERM_HE) v = sel(e, too_big, T(NAN), v);
  if (cheb) v = sel(e, use_closed, closed, v);
  v = sel(e, special, special_v, v);
  v = sel(e, cmp(e, "LT", ni, I(0)), T(0), v);
  o[0] = v;
#undef I
#undef T
}

#define POLY(fn, kind, name) \
  static void fn(tp_emit *e, const tp_node *n, tp_val *o) { r_poly(e, n, o, kind, name); }
POLY(r_cheb_t, CHEB_T, "chebyshev_polynomial_t_cpu")
POLY(r_cheb_u, CHEB_U, "chebyshev_polynomial_u_cpu")
POLY(r_cheb_v, CHEB_V, "chebyshev_polynomial_v_cpu")
POLY(r_cheb_w, CHEB_W, "chebyshev_polynomial_w_cpu")
POLY(r_scheb_t, SCHEB_T, "shifted_chebyshev_polynomial_t_cpu")
POLY(r_scheb_u, SCHEB_U, "shifted_chebyshev_polynomial_u_cpu")
POLY(r_scheb_v, SCHEB_V, "shifted_chebyshev_polynomial_v_cpu")
POLY(r_scheb_w, SCHEB_W, "shifted_chebyshev_polynomial_w_cpu")
POLY(r_herm_h, HERM_H, "hermite_polynomial_h_cpu")
POLY(r_herm_he, HERM_HE, "hermite_polynomial_he_cpu")
POLY(r_laguerre, LAGUERRE, "laguerre_polynomial_l_cpu")
POLY(r_legendre, LEGENDRE, "legendre_polynomial_p_cpu")
#undef POLY

/* ---- binary elementwise ---------------------------------------------------------- */

/* Compute type over arguments 0 and 1: PyTorch's common dtype in opmath,
 * integers to the output's float dtype when `to_float`. */
static tp_type common2(tp_emit *e, const tp_node *n, int to_float) {
  int idx[2] = {0, 1};
  tp_dtype dt = lw_result_type(e, n, idx, 2);
  if (to_float && !isf(dt)) dt = isf(OUT0->dt) ? OUT0->dt : TP_F32;
  return out_as(n, lw_opmath(dt));
}

/* fmax/fmin: the other operand where one is NaN. */
static void fmaxmin(tp_emit *e, const tp_node *n, tp_val *o, int is_max) {
  tp_type ct = common2(e, n, 0);
  if (tp_dtype_is_complex(ct.dt)) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "%s not implemented for complex tensors.", is_max ? "fmax" : "fmin");
    return;
  }
  tp_val a = in_as(e, n, 0, &ct), b = in_as(e, n, 1, &ct);
  tp_val r = em_binary(e, is_max ? "stablehlo.maximum" : "stablehlo.minimum", a, b);
  if (isf(ct.dt)) {
    r = sel(e, isnan_(e, a), b, r);
    r = sel(e, isnan_(e, b), a, r);
  }
  o[0] = em_convert(e, r, OUT0->dt);
}
static void r_fmax(tp_emit *e, const tp_node *n, tp_val *o) { fmaxmin(e, n, o, 1); }
static void r_fmin(tp_emit *e, const tp_node *n, tp_val *o) { fmaxmin(e, n, o, 0); }

/* hypot: sqrt(a^2 + b^2) in f64 for narrower floats (no overflow there);
 * for f64, max * sqrt(1 + (min/max)^2).  An infinite operand gives inf
 * even with a NaN (C's hypot). */
static void r_hypot(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_type ct = common2(e, n, 0);
  if (!isf(ct.dt)) {
    o[0] = lw_not_for(e, "hypot_cpu", ct.dt);
    return;
  }
  int f64 = ct.dt == TP_F64;
  ct.dt = TP_F64;
  tp_val a = abs_(e, in_as(e, n, 0, &ct)), b = abs_(e, in_as(e, n, 1, &ct));
  tp_val r;
  if (!f64) {
    r = sqrt_(e, add(e, mul(e, a, a), mul(e, b, b)));
  } else {
    tp_val mx = em_binary(e, "stablehlo.maximum", a, b), mn = em_binary(e, "stablehlo.minimum", a, b);
    tp_val q = dv(e, mn, mx);
    r = mul(e, mx, sqrt_(e, add(e, K(e, q, 1), mul(e, q, q))));
    r = sel(e, cmp(e, "EQ", mx, K(e, mx, 0)), K(e, mx, 0), r);
    r = sel(e, or_(e, isnan_(e, a), isnan_(e, b)), K(e, a, NAN), r);
  }
  r = sel(e, or_(e, isinf_(e, a), isinf_(e, b)), K(e, a, INFINITY), r);
  o[0] = em_convert(e, r, OUT0->dt);
}

/* Same-width integer type of a float dtype. */
static tp_dtype bits_of(tp_dtype dt) { return dt == TP_F64 ? TP_I64 : dt == TP_F32 ? TP_I32 : TP_I16; }

/* Integer constant of the integer type t, broadcast. */
static tp_val ik(tp_emit *e, int64_t v, const tp_type *t) { return em_bcast_to(e, em_const_i(e, v, t->dt), t->rank, t->dims); }

/* Float bits as an integer that orders like the values (-0 and +0 both 0);
 * XLA:CPU flushes subnormals in float arithmetic and comparisons, so
 * nextafter and frexp work on the bits only.  The map is its own inverse. */
static tp_val ordered_key(tp_emit *e, tp_val bits) {
  const tp_type *t = em_type(e, bits);
  tp_type tt = *t;
  int64_t mn = tt.dt == TP_I64 ? INT64_MIN : tt.dt == TP_I32 ? INT32_MIN : INT16_MIN;
  return sel(e, cmp(e, "LT", bits, K(e, bits, 0)), sub(e, ik(e, mn, &tt), bits), bits);
}

/* nextafter(a, b): the next representable value of a's dtype toward b. */
static void r_nextafter(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_type ct = common2(e, n, 0);
  if (!isf(ct.dt)) {
    o[0] = lw_not_for(e, "nextafter_cpu", ct.dt);
    return;
  }
  ct.dt = OUT0->dt; /* no opmath: the step is in the output's own format */
  tp_val a = in_as(e, n, 0, &ct), b = in_as(e, n, 1, &ct);
  tp_type it = ct;
  it.dt = bits_of(ct.dt);
  tp_val ka = ordered_key(e, em_bitcast(e, a, &it)), kb = ordered_key(e, em_bitcast(e, b, &it));
  tp_val one = K(e, ka, 1);
  tp_val kr = sel(e, cmp(e, "LT", ka, kb), add(e, ka, one), sub(e, ka, one));
  tp_val r = em_bitcast(e, ordered_key(e, kr), &ct);
  r = sel(e, cmp(e, "EQ", ka, kb), b, r);
  r = sel(e, or_(e, isnan_(e, a), isnan_(e, b)), add(e, a, b), r);
  o[0] = r;
}

/* frexp(x) -> (mantissa in [0.5, 1) with x's sign, int32 exponent); 0, inf
 * and NaN give (x, 0).  f16/bf16 go through f32 (exact).  Bit operations
 * only (subnormals included: their leading one is found with clz). */
static void r_frexp(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_dtype dt = lw_dtype(e, n, 0);
  if (!isf(dt)) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "torch.frexp() only supports floating-point dtypes");
    return;
  }
  int f64 = dt == TP_F64;
  tp_type ct = out_as(n, f64 ? TP_F64 : TP_F32);
  tp_val x = in_as(e, n, 0, &ct);
  int mb = f64 ? 52 : 23, bias = f64 ? 1022 : 126, w = f64 ? 64 : 32;
  tp_type it = ct;
  it.dt = f64 ? TP_I64 : TP_I32;
  tp_val bits = em_bitcast(e, x, &it);
  int64_t fmask = ((int64_t)1 << mb) - 1;
  tp_val ex = and_(e, em_binary(e, "stablehlo.shift_right_logical", bits, ik(e, mb, &it)), ik(e, f64 ? 0x7ff : 0xff, &it));
  tp_val frac = and_(e, bits, ik(e, fmask, &it));
  tp_val sign = and_(e, bits, ik(e, f64 ? INT64_MIN : INT32_MIN, &it));
  /* subnormal: the leading one at bit p = w-1-clz; value = 1.f * 2^(p - mb - bias - mb + ...) */
  tp_val clz = un(e, "stablehlo.count_leading_zeros", frac);
  tp_val shift = sub(e, clz, ik(e, w - 1 - mb, &it)); /* moves the leading one to bit mb */
  tp_val subn = cmp(e, "EQ", ex, ik(e, 0, &it));
  tp_val frac_n = sel(e, subn, and_(e, em_binary(e, "stablehlo.shift_left", frac, shift), ik(e, fmask, &it)), frac);
  tp_val expo = sel(e, subn, sub(e, ik(e, 1 - bias, &it), shift), sub(e, ex, ik(e, bias, &it)));
  tp_val m = em_bitcast(e, or_(e, or_(e, sign, ik(e, (int64_t)bias << mb, &it)), frac_n), &ct);
  tp_val plain = or_(e, cmp(e, "EQ", ex, ik(e, f64 ? 0x7ff : 0xff, &it)),
                     and_(e, subn, cmp(e, "EQ", frac, ik(e, 0, &it))));
  m = sel(e, plain, x, m);
  expo = sel(e, plain, ik(e, 0, &it), expo);
  o[0] = em_convert(e, m, n->outs[0].dt);
  o[1] = em_convert(e, expo, n->outs[1].dt);
}

/* angle of a real number: pi for x < 0, 0 otherwise, NaN stays NaN; of a
 * complex one, atan2(imag, real) (std::arg, as the CPU kernel), in the real
 * dtype of its parts. */
static void r_angle(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_dtype in = lw_dtype(e, n, 0);
  if (tp_dtype_is_complex(in)) {
    tp_val z = lw_value(e, n, 0);
    if (z < 0) return;
    tp_type pt = *em_type(e, z);
    pt.dt = in == TP_C64 ? TP_F32 : TP_F64;
    tp_val re = em_op(e, "stablehlo.real", NULL, &z, 1, &pt), im = em_op(e, "stablehlo.imag", NULL, &z, 1, &pt);
    o[0] = em_convert(e, em_binary(e, "stablehlo.atan2", im, re), OUT0->dt);
    return;
  }
  if (!isf(OUT0->dt)) {
    o[0] = lw_not_for(e, "angle_cpu", OUT0->dt);
    return;
  }
  tp_type ct = out_as(n, lw_opmath(OUT0->dt));
  tp_val x = in_as(e, n, 0, &ct);
  tp_val r = sel(e, cmp(e, "LT", x, K(e, x, 0)), K(e, x, M_PI), K(e, x, 0));
  o[0] = em_convert(e, sel(e, isnan_(e, x), x, r), OUT0->dt);
}

/* gcd of integers (Euclid's algorithm in a while loop over all elements;
 * the result is non-negative, as PyTorch's |a|, |b| start). */
static void r_gcd(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_type ct = common2(e, n, 0);
  if (!tp_dtype_is_int(ct.dt) || ct.dt == TP_BOOL) {
    o[0] = lw_not_for(e, "gcd_cpu", ct.dt);
    return;
  }
  tp_val a = in_as(e, n, 0, &ct), b = in_as(e, n, 1, &ct);
  if (!tp_dtype_is_unsigned(ct.dt)) {
    a = abs_(e, a);
    b = abs_(e, b);
  }
  /* PyTorch: while (a != 0) { c = a; a = b % a; b = c; } return b; */
  tp_val init[2] = {a, b}, x[2], y[2], next[2], out[2];
  em_loop L;
  if (em_while_begin(e, &L, init, 2, x)) return;
  if (em_while_body(e, &L, any_(e, cmp(e, "NE", x[0], K(e, x[0], 0))), y)) return;
  tp_val nz = cmp(e, "NE", y[0], K(e, y[0], 0));
  tp_val safe = sel(e, nz, y[0], K(e, y[0], 1));
  next[0] = sel(e, nz, em_binary(e, "stablehlo.remainder", y[1], safe), y[0]);
  next[1] = sel(e, nz, y[0], y[1]);
  if (em_while_end(e, &L, next, out)) return;
  o[0] = em_convert(e, out[1], OUT0->dt);
}

/* Tensor shifts: PyTorch gives 0 (left) or the sign fill (right) for shift
 * amounts < 0 or >= the bit width. */
static void shift(tp_emit *e, const tp_node *n, tp_val *o, int left) {
  tp_type ct = common2(e, n, 0);
  if (!tp_dtype_is_int(ct.dt) || ct.dt == TP_BOOL) {
    o[0] = lw_not_for(e, left ? "lshift_cpu" : "rshift_cpu", ct.dt);
    return;
  }
  tp_val a = in_as(e, n, 0, &ct), b = in_as(e, n, 1, &ct);
  int bits = (int)tp_dtype_size(ct.dt) * 8;
  tp_val bad = cmp(e, "GE", b, K(e, b, bits));
  if (!tp_dtype_is_unsigned(ct.dt)) bad = or_(e, bad, cmp(e, "LT", b, K(e, b, 0)));
  tp_val r;
  if (left) {
    r = sel(e, bad, K(e, a, 0), em_binary(e, "stablehlo.shift_left", a, sel(e, bad, K(e, b, 0), b)));
  } else {
    int u = tp_dtype_is_unsigned(ct.dt); /* unsigned: 0; signed: the sign fill */
    r = em_binary(e, u ? "stablehlo.shift_right_logical" : "stablehlo.shift_right_arithmetic", a,
                  sel(e, bad, K(e, b, bits - 1), b));
    if (u) r = sel(e, bad, K(e, a, 0), r);
  }
  o[0] = em_convert(e, r, OUT0->dt);
}
static void r_lshift(tp_emit *e, const tp_node *n, tp_val *o) { shift(e, n, o, 1); }
static void r_rshift(tp_emit *e, const tp_node *n, tp_val *o) { shift(e, n, o, 0); }

/* ---- backward formulas -------------------------------------------------------------- */

/* hardshrink_backward / softshrink_backward(grad, self, lambd):
 * 0 where -lambd <= self <= lambd, else grad. */
static void r_shrink_backward(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_type ct = out_as(n, lw_opmath(OUT0->dt));
  tp_val g = in_as(e, n, 0, &ct), x = in_as(e, n, 1, &ct), l = lw_operand(e, n, 2, &ct);
  tp_val in = and_(e, cmp(e, "GE", x, un(e, "stablehlo.negate", l)), cmp(e, "LE", x, l));
  o[0] = em_convert(e, sel(e, in, K(e, g, 0), g), OUT0->dt);
}

/* logit_backward(grad, self, eps=None): grad / (x (1 - x)) inside the
 * domain; outside it NaN (no eps) or 0 (x outside [eps, 1 - eps]); at x = 0
 * or 1 (no eps) grad * inf. */
static void r_logit_backward(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_type ct = out_as(n, lw_opmath(OUT0->dt));
  tp_val g = in_as(e, n, 0, &ct), x = in_as(e, n, 1, &ct);
  tp_val zero = K(e, x, 0), one = K(e, x, 1);
  tp_val d = dv(e, g, mul(e, x, sub(e, one, x)));
  tp_val r;
  double eps = lw_is_none(n, 2) ? -1.0 : lw_float(n, 2, -1.0);
  if (eps < 0) {
    tp_val edge = or_(e, cmp(e, "EQ", x, zero), cmp(e, "EQ", x, one));
    r = sel(e, edge, mul(e, g, K(e, g, INFINITY)), d);
    r = sel(e, or_(e, cmp(e, "LT", x, zero), cmp(e, "GT", x, one)), K(e, x, NAN), r);
  } else {
    tp_val lo = K(e, x, eps), hi = sub(e, one, K(e, x, eps));
    r = sel(e, or_(e, cmp(e, "LT", x, lo), cmp(e, "GT", x, hi)), zero, d);
  }
  o[0] = em_convert(e, r, OUT0->dt);
}

const tp_lower_entry tp_lower_special[] = {
    {"aten::erfc", r_erfc, 0},
    {"aten::special_erfcx", r_erfcx, 0},
    {"aten::special_log_ndtr", r_log_ndtr, 0},
    {"aten::special_ndtri", r_ndtri, 0},
    {"aten::i0", r_i0, 0},
    {"aten::special_i0e", r_i0e, 0},
    {"aten::special_i1", r_i1, 0},
    {"aten::special_i1e", r_i1e, 0},
    {"aten::special_modified_bessel_i0", r_i0, 0},
    {"aten::special_modified_bessel_i1", r_i1, 0},
    {"aten::special_modified_bessel_k0", r_k0, 0},
    {"aten::special_modified_bessel_k1", r_k1, 0},
    {"aten::special_scaled_modified_bessel_k0", r_k0e, 0},
    {"aten::special_scaled_modified_bessel_k1", r_k1e, 0},
    {"aten::special_bessel_j0", r_j0, 0},
    {"aten::special_bessel_j1", r_j1, 0},
    {"aten::special_bessel_y0", r_y0, 0},
    {"aten::special_bessel_y1", r_y1, 0},
    {"aten::special_spherical_bessel_j0", r_sph_j0, 0},
    {"aten::special_airy_ai", r_airy_ai, 0},
    {"aten::polygamma", r_polygamma, 0},
    {"aten::polygamma_", r_polygamma_, 0},
    {"aten::special_zeta", r_zeta, 0},
    {"aten::igamma", r_igamma, 0},
    {"aten::igammac", r_igammac, 0},
    {"aten::special_chebyshev_polynomial_t", r_cheb_t, 0},
    {"aten::special_chebyshev_polynomial_u", r_cheb_u, 0},
    {"aten::special_chebyshev_polynomial_v", r_cheb_v, 0},
    {"aten::special_chebyshev_polynomial_w", r_cheb_w, 0},
    {"aten::special_shifted_chebyshev_polynomial_t", r_scheb_t, 0},
    {"aten::special_shifted_chebyshev_polynomial_u", r_scheb_u, 0},
    {"aten::special_shifted_chebyshev_polynomial_v", r_scheb_v, 0},
    {"aten::special_shifted_chebyshev_polynomial_w", r_scheb_w, 0},
    {"aten::special_hermite_polynomial_h", r_herm_h, 0},
    {"aten::special_hermite_polynomial_he", r_herm_he, 0},
    {"aten::special_laguerre_polynomial_l", r_laguerre, 0},
    {"aten::special_legendre_polynomial_p", r_legendre, 0},
    {"aten::fmax", r_fmax, 0},
    {"aten::fmin", r_fmin, 0},
    {"aten::hypot", r_hypot, 0},
    {"aten::nextafter", r_nextafter, 0},
    {"aten::frexp.Tensor", r_frexp, 0},
    {"aten::angle", r_angle, 0},
    {"aten::gcd", r_gcd, 0},
    {"aten::bitwise_left_shift.Tensor", r_lshift, 0},
    {"aten::bitwise_left_shift.Tensor_Scalar", r_lshift, 0},
    {"aten::bitwise_left_shift.Scalar_Tensor", r_lshift, 0},
    {"aten::bitwise_right_shift.Tensor", r_rshift, 0},
    {"aten::bitwise_right_shift.Tensor_Scalar", r_rshift, 0},
    {"aten::bitwise_right_shift.Scalar_Tensor", r_rshift, 0},
    {"aten::__lshift__.Tensor", r_lshift, 0},
    {"aten::__lshift__.Scalar", r_lshift, 0},
    {"aten::__ilshift__.Tensor", r_lshift, 0},
    {"aten::__ilshift__.Scalar", r_lshift, 0},
    {"aten::__rshift__.Tensor", r_rshift, 0},
    {"aten::__rshift__.Scalar", r_rshift, 0},
    {"aten::__irshift__.Tensor", r_rshift, 0},
    {"aten::__irshift__.Scalar", r_rshift, 0},
    {"aten::hardshrink_backward", r_shrink_backward, 0},
    {"aten::softshrink_backward", r_shrink_backward, 0},
    {"aten::logit_backward", r_logit_backward, 0},
    {NULL, NULL, 0},
};

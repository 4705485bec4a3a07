/* lower_random.c - random number ops: uniform_, normal_, random_, bernoulli,
 * dropout, exponential_, cauchy_, log_normal_, geometric_, randperm,
 * multinomial.
 *
 * Bits.  Every op asks the engine for one key per call (n->rng_key: a
 * tensor<2xui64> parameter holding (device seed, counter), where the
 * counter advances at every call).  Threefry-2x32-20 -- the counter-based
 * generator of Salmon et al. (Random123), the function JAX and XLA's
 * THREE_FRY use -- first hashes the pair into this call's key,
 *   K = Threefry(key = seed, counter = engine counter),
 * and element i of the call then gets the 64 bits Threefry(key = K,
 * counter = i).  So the same seed gives the same numbers, and calls with
 * different engine counters get independent streams whatever the counter's
 * step.  Ops that need more than 64 bits per element (float64 normals,
 * multinomial) draw further word pairs from keys with K's high word xor a
 * multiple of 0x9E3779B9.
 *
 * The generator is written as plain u32 StableHLO arithmetic rather than
 * stablehlo.rng_bit_generator: that op has two results, which the public
 * emitter API (em_op: one result) cannot express, and a counter-based
 * generator needs no state threading anyway.  The function is spelled out
 * in the comments of tf_words and checked bit for bit by the tests against
 * a NumPy transcription.
 *
 * Generators: the schemas' Generator? arguments arrive as None (the Python
 * layer does not pass generators); the device's default generator is
 * always used. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "lower_util.h"

#define OUT0 (&n->outs[0])
#define PI_D 3.14159265358979323846

/* ---- small emission helpers ----------------------------------------------- */

static tp_val cu(tp_emit *e, uint64_t v, tp_dtype dt) { return em_const_i(e, (int64_t)v, dt); }
static tp_val bin(tp_emit *e, const char *op, tp_val a, tp_val b) { return lw_bin(e, op, a, b); }
static tp_val add(tp_emit *e, tp_val a, tp_val b) { return bin(e, "stablehlo.add", a, b); }
static tp_val mul(tp_emit *e, tp_val a, tp_val b) { return bin(e, "stablehlo.multiply", a, b); }
/* x op constant (a rank-0 constant of x's dtype, broadcast). */
static tp_val bin_k(tp_emit *e, const char *op, tp_val x, double v) {
  return bin(e, op, x, em_const(e, v, em_type(e, x)->dt));
}
static tp_val bin_ku(tp_emit *e, const char *op, tp_val x, uint64_t v) {
  return bin(e, op, x, cu(e, v, em_type(e, x)->dt));
}
static tp_val cmp_b(tp_emit *e, const char *dir, tp_val a, tp_val b) {
  const tp_type *ta = em_type(e, a), *tb = em_type(e, b);
  if (ta->rank == 0 && tb->rank > 0) a = em_bcast_to(e, a, tb->rank, tb->dims);
  else if (tb->rank == 0 && ta->rank > 0) b = em_bcast_to(e, b, ta->rank, ta->dims);
  return em_compare(e, dir, a, b);
}

/* Low / high 32 bits of a u64 value as u32 (mask first so the narrowing
 * convert never sees an out-of-range value). */
static tp_val lo32(tp_emit *e, tp_val x) { return em_convert(e, bin_ku(e, "stablehlo.and", x, 0xffffffffu), TP_U32); }
static tp_val hi32(tp_emit *e, tp_val x) {
  return em_convert(e, bin_ku(e, "stablehlo.shift_right_logical", x, 32), TP_U32);
}
/* (hi << 32) | lo as u64. */
static tp_val join64(tp_emit *e, tp_val hi, tp_val lo) {
  tp_val h = bin_ku(e, "stablehlo.shift_left", em_convert(e, hi, TP_U64), 32);
  return bin(e, "stablehlo.or", h, em_convert(e, lo, TP_U64));
}

/* ---- Threefry-2x32 ------------------------------------------------------- */

typedef struct rng {
  tp_val k0, k1; /* rank-0 u32: this call's key (seed and counter hashed) */
} rng;

static void threefry(tp_emit *e, tp_val ctr, tp_val k0, tp_val k1, tp_val *w0, tp_val *w1);

/* This call's key: Threefry(key = seed, counter = engine counter).  Hashing
 * the engine's counter into the key (rather than using it as the base of
 * the element counters) keeps calls independent however far the engine
 * advances the counter per call (compiled graphs advance it by the graph's
 * output size, which can be smaller than what one RNG node draws). */
static rng rng_open(tp_emit *e, const tp_node *n) {
  rng r = {-1, -1};
  tp_val key = n->rng_key(e, n);
  if (key < 0 || em_failed(e)) return r;
  int64_t s0 = 0, l0 = 1, s1 = 1, l1 = 2, st = 1;
  tp_val seed = em_reshape(e, em_slice(e, key, &s0, &l0, &st), 0, NULL);
  tp_val ctr = em_reshape(e, em_slice(e, key, &s1, &l1, &st), 0, NULL);
  threefry(e, ctr, lo32(e, seed), hi32(e, seed), &r.k0, &r.k1);
  return r;
}

static tp_val rotl(tp_emit *e, tp_val x, int k) {
  return bin(e, "stablehlo.or", bin_ku(e, "stablehlo.shift_left", x, (uint64_t)k),
             bin_ku(e, "stablehlo.shift_right_logical", x, (uint64_t)(32 - k)));
}

/* Two u32 words for each of `count` elements (flat, tensor<count x ui32>):
 *   key   = (k0, k1 ^ stream * 0x9E3779B9)
 *   ctr_i = i (u64) split as (low word, high word)
 *   (w0, w1) = Threefry-2x32 with 20 rounds (Random123's threefry2x32_20):
 *     ks2 = 0x1BD11BDA ^ ks0 ^ ks1; x0 = c0 + ks0; x1 = c1 + ks1;
 *     round r: x0 += x1; x1 = rotl(x1, R[r % 8]) ^ x0,
 *       R = {13, 15, 26, 6, 17, 29, 16, 24};
 *     after rounds 4j (j = 1..5): x0 += ks[j % 3]; x1 += ks[(j + 1) % 3] + j. */
static void threefry(tp_emit *e, tp_val ctr, tp_val k0, tp_val k1, tp_val *w0, tp_val *w1) {
  static const int R[8] = {13, 15, 26, 6, 17, 29, 16, 24};
  tp_val x0 = lo32(e, ctr), x1 = hi32(e, ctr);
  tp_val ks[3] = {k0, k1, bin(e, "stablehlo.xor", bin(e, "stablehlo.xor", k0, k1), cu(e, 0x1BD11BDAu, TP_U32))};
  x0 = add(e, x0, ks[0]);
  x1 = add(e, x1, ks[1]);
  for (int rd = 0; rd < 20; rd++) {
    x0 = add(e, x0, x1);
    x1 = bin(e, "stablehlo.xor", rotl(e, x1, R[rd % 8]), x0);
    if (rd % 4 == 3) {
      int j = rd / 4 + 1;
      x0 = add(e, x0, ks[j % 3]);
      x1 = add(e, x1, bin(e, "stablehlo.add", ks[(j + 1) % 3], cu(e, (uint64_t)j, TP_U32)));
    }
  }
  *w0 = x0;
  *w1 = x1;
}

static tp_val stream_key(tp_emit *e, const rng *r, uint32_t stream) {
  return stream ? em_binary(e, "stablehlo.xor", r->k1, cu(e, (uint32_t)(stream * 0x9E3779B9u), TP_U32)) : r->k1;
}

static void tf_words(tp_emit *e, const rng *r, int64_t count, uint32_t stream, tp_val *w0, tp_val *w1) {
  *w0 = *w1 = -1;
  if (em_failed(e)) return;
  tp_type t64 = tp_type_make(TP_U64, 1, &count);
  threefry(e, em_iota(e, &t64, 0), r->k0, stream_key(e, r, stream), w0, w1);
}

/* Words for a shape `t` (any rank) whose elements share counters along
 * dimension `sdim`: element (..., j, ...) uses counter = its linear index
 * with dimension sdim removed, and key word k1 ^ ((j + 1) * 0x9E3779B9)
 * (distinct from every stream key of tf_words but stream 1, which this call
 * does not also use). */
static void tf_words_streams(tp_emit *e, const rng *r, const tp_type *t, int sdim, tp_val *w0, tp_val *w1) {
  *w0 = *w1 = -1;
  if (em_failed(e)) return;
  tp_type c = *t, rt = tp_type_make(TP_U64, 0, NULL);
  c.dt = TP_U64;
  int64_t map[TP_MAX_RANK];
  for (int i = 0; i < t->rank; i++)
    if (i != sdim) {
      map[rt.rank] = i;
      rt.dims[rt.rank++] = t->dims[i];
    }
  int64_t cnt = tp_type_numel(&rt);
  tp_type flat = tp_type_make(TP_U64, 1, &cnt);
  tp_val lin = em_reshape(e, em_iota(e, &flat, 0), rt.rank, rt.dims);
  tp_val ctr = em_bcast_in_dim(e, lin, &c, map);
  tp_type jt = *t;
  jt.dt = TP_U32;
  tp_val j = bin_ku(e, "stablehlo.add", em_iota(e, &jt, sdim), 1);
  tp_val k1 = bin(e, "stablehlo.xor", r->k1, bin_ku(e, "stablehlo.multiply", j, 0x9E3779B9u));
  threefry(e, ctr, r->k0, k1, w0, w1);
}

/* ---- bits -> numbers ------------------------------------------------------- */

enum { U_CO = 0, /* [0, 1) */ U_OC = 1, /* (0, 1] */ U_OO = 2 /* (0, 1) */ };

/* 24-bit uniform in f32 from one u32 word (exact: every value is k * 2^-24). */
static tp_val u_f32(tp_emit *e, tp_val w, int mode) {
  tp_val f;
  if (mode == U_OO) { /* (2k + 1) * 2^-24, k < 2^23 */
    tp_val k = bin_ku(e, "stablehlo.shift_right_logical", w, 9);
    k = bin_ku(e, "stablehlo.or", bin_ku(e, "stablehlo.shift_left", k, 1), 1);
    f = em_convert(e, k, TP_F32);
  } else {
    f = em_convert(e, bin_ku(e, "stablehlo.shift_right_logical", w, 8), TP_F32);
    if (mode == U_OC) f = bin_k(e, "stablehlo.add", f, 1.0);
  }
  return bin_k(e, "stablehlo.multiply", f, 0x1p-24);
}

/* 53-bit uniform in f64 from two u32 words. */
static tp_val u_f64(tp_emit *e, tp_val w0, tp_val w1, int mode) {
  tp_val b = join64(e, w0, w1), f;
  if (mode == U_OO) {
    tp_val k = bin_ku(e, "stablehlo.shift_right_logical", b, 12);
    k = bin_ku(e, "stablehlo.or", bin_ku(e, "stablehlo.shift_left", k, 1), 1);
    f = em_convert(e, k, TP_F64);
  } else {
    f = em_convert(e, bin_ku(e, "stablehlo.shift_right_logical", b, 11), TP_F64);
    if (mode == U_OC) f = bin_k(e, "stablehlo.add", f, 1.0);
  }
  return bin_k(e, "stablehlo.multiply", f, 0x1p-53);
}

/* Flat uniforms in compute type ct (f64: 53 bits, else f32: 24 bits). */
static tp_val uniform01(tp_emit *e, const rng *r, int64_t count, tp_dtype ct, int mode) {
  tp_val w0, w1;
  tf_words(e, r, count, 0, &w0, &w1);
  return ct == TP_F64 ? u_f64(e, w0, w1, mode) : u_f32(e, w0, mode);
}

/* Flat standard normals in ct (Box-Muller, cosine branch; u1 in (0, 1] so
 * log never sees 0). */
static tp_val normal01(tp_emit *e, const rng *r, int64_t count, tp_dtype ct) {
  tp_val w0, w1, u1, u2;
  tf_words(e, r, count, 0, &w0, &w1);
  if (ct == TP_F64) {
    tp_val v0, v1;
    tf_words(e, r, count, 1, &v0, &v1);
    u1 = u_f64(e, w0, w1, U_OC);
    u2 = u_f64(e, v0, v1, U_CO);
  } else {
    u1 = u_f32(e, w0, U_OC);
    u2 = u_f32(e, w1, U_CO);
  }
  tp_val rad = em_unary(e, "stablehlo.sqrt", bin_k(e, "stablehlo.multiply", em_unary(e, "stablehlo.log", u1), -2.0));
  tp_val th = bin_k(e, "stablehlo.multiply", u2, 2.0 * PI_D);
  return mul(e, rad, em_unary(e, "stablehlo.cosine", th));
}

/* Output i's element count and a flat value reshaped to its dims. */
static int64_t out_numel(const tp_node *n, int i) { return tp_type_numel(&n->outs[i]); }
static tp_val shape_out(tp_emit *e, const tp_node *n, int i, tp_val flat) {
  return em_reshape(e, flat, n->outs[i].rank, n->outs[i].dims);
}

static int out_is_float(tp_emit *e, const tp_node *n, const char *what) {
  if (tp_dtype_is_float(n->outs[0].dt)) return 1;
  em_fail(e, TP_INVALID_ARGUMENT, "%s: expected a floating point tensor, got %s", what, tp_dtype_name(n->outs[0].dt));
  return 0;
}

/* A complex tensor is filled through its real view, as PyTorch's CPU and
 * CUDA kernels do: `flat` holds 2 * numel parts (re, im, re, im, ...) of
 * the part dtype; the result is the complex output. */
static tp_val complex_from_parts(tp_emit *e, const tp_node *n, tp_val flat) {
  tp_dtype dt = OUT0->dt;
  int64_t cnt = out_numel(n, 0), pairs[2] = {cnt, 2}, lo[2] = {0, 0}, hi[2] = {cnt, 1}, lo1[2] = {0, 1},
          hi1[2] = {cnt, 2};
  tp_val p = em_reshape(e, flat, 2, pairs);
  tp_val parts[2] = {em_reshape(e, em_slice(e, p, lo, hi, NULL), 1, &cnt),
                     em_reshape(e, em_slice(e, p, lo1, hi1, NULL), 1, &cnt)};
  tp_type t = tp_type_make(dt, 1, &cnt);
  return shape_out(e, n, 0, em_op(e, "stablehlo.complex", NULL, parts, 2, &t));
}
static tp_dtype part_dtype(tp_dtype dt) { return dt == TP_C64 ? TP_F32 : dt == TP_C128 ? TP_F64 : dt; }

/* ---- exact values of a float dtype ---------------------------------------- */

static double f16_value(uint16_t h) {
  int s = h >> 15, ex = (h >> 10) & 0x1f, m = h & 0x3ff;
  double v;
  if (ex == 0x1f) v = m ? NAN : INFINITY;
  else if (ex == 0) v = ldexp((double)m, -24);
  else v = ldexp((double)(m | 0x400), ex - 25);
  return s ? -v : v;
}
static double bf16_value(uint16_t h) {
  uint32_t b = (uint32_t)h << 16;
  float f;
  memcpy(&f, &b, 4);
  return (double)f;
}

/* The largest finite value of dt strictly below x (x finite). */
static double below(double x, tp_dtype dt) {
  if (dt == TP_F64) return nextafter(x, -INFINITY);
  if (dt == TP_F32) {
    float f = (float)x;
    while ((double)f >= x) f = nextafterf(f, -INFINITY);
    while ((double)nextafterf(f, INFINITY) < x) f = nextafterf(f, INFINITY);
    return (double)f;
  }
  double best = -INFINITY;
  for (uint32_t h = 0; h < 0x10000; h++) {
    double v = dt == TP_F16 ? f16_value((uint16_t)h) : bf16_value((uint16_t)h);
    if (isfinite(v) && v < x && v > best) best = v;
  }
  return best;
}

/* ---- uniform_ -------------------------------------------------------------- */

/* uniform(self, from, to): from + u * (to - from), u in [0, 1); rounding can
 * reach `to`, so the result is clamped to the largest value below `to`. */
static void uniform_core(tp_emit *e, const tp_node *n, tp_val *o, double from, double to) {
  int cplx = tp_dtype_is_complex(OUT0->dt);
  if (!cplx && !out_is_float(e, n, "uniform_")) return;
  if (!(from <= to))
    return (void)em_fail(e, TP_INVALID_ARGUMENT, "uniform_ expects to return a [from, to) range, but found from=%g > to=%g",
                         from, to);
  tp_dtype dt = part_dtype(OUT0->dt), ct = lw_opmath(dt);
  rng r = rng_open(e, n);
  tp_val u = uniform01(e, &r, out_numel(n, 0) * (cplx ? 2 : 1), ct, U_CO);
  tp_val v = bin_k(e, "stablehlo.add", bin_k(e, "stablehlo.multiply", u, to - from), from);
  v = em_convert(e, v, dt);
  if (from < to && isfinite(to)) v = bin_k(e, "stablehlo.minimum", v, below(to, dt));
  o[0] = cplx ? complex_from_parts(e, n, v) : shape_out(e, n, 0, v);
}
static void r_uniform(tp_emit *e, const tp_node *n, tp_val *o) {
  uniform_core(e, n, o, lw_float(n, 1, 0.0), lw_float(n, 2, 1.0));
}
/* rand(size, ...), rand_like(self, ...) and their .generator overloads
 * (graphs from torch.compile; eager mode reaches uniform_ instead). */
static void r_rand(tp_emit *e, const tp_node *n, tp_val *o) { uniform_core(e, n, o, 0.0, 1.0); }

/* ---- normal ---------------------------------------------------------------- */

static int check_std(tp_emit *e, double std, const char *op) {
  if (std >= 0.0) return 1;
  em_fail(e, TP_INVALID_ARGUMENT, "%s expects std >= 0.0, but found std %g", op, std);
  return 0;
}

static void normal_core(tp_emit *e, const tp_node *n, tp_val *o, double mean, double std) {
  int cplx = tp_dtype_is_complex(OUT0->dt);
  if (!cplx && !out_is_float(e, n, "normal_")) return;
  if (!check_std(e, std, "normal")) return;
  /* complex: each part has half the variance */
  if (cplx) std /= sqrt(2.0);
  tp_dtype dt = part_dtype(OUT0->dt), ct = lw_opmath(dt);
  rng r = rng_open(e, n);
  tp_val z = normal01(e, &r, out_numel(n, 0) * (cplx ? 2 : 1), ct);
  tp_val v = em_convert(e, bin_k(e, "stablehlo.add", bin_k(e, "stablehlo.multiply", z, std), mean), dt);
  o[0] = cplx ? complex_from_parts(e, n, v) : shape_out(e, n, 0, v);
}
/* normal_(self, mean, std) / normal_functional / normal.out */
static void r_normal_(tp_emit *e, const tp_node *n, tp_val *o) {
  normal_core(e, n, o, lw_float(n, 1, 0.0), lw_float(n, 2, 1.0));
}
/* randn(size, ...), randn_like(self, ...) (graphs) */
static void r_randn(tp_emit *e, const tp_node *n, tp_val *o) { normal_core(e, n, o, 0.0, 1.0); }
/* normal.float_float(mean, std, size, ...) (graphs) */
static void r_normal_ff(tp_emit *e, const tp_node *n, tp_val *o) {
  normal_core(e, n, o, lw_float(n, 0, 0.0), lw_float(n, 1, 1.0));
}

/* normal.Tensor_float / float_Tensor / Tensor_Tensor: mean + std * z with
 * broadcasting; `mi`/`si` are the argument indices, tensors or floats. */
static void normal_tensors(tp_emit *e, const tp_node *n, tp_val *o) {
  if (!out_is_float(e, n, "normal")) return;
  tp_dtype dt = OUT0->dt, ct = lw_opmath(dt);
  tp_type t = lw_out_as(n, 0, ct);
  tp_val m, s;
  if (lw_arg(n, 0)->kind == TP_ARG_FLOAT) m = em_full(e, lw_float(n, 0, 0.0), &t);
  else m = lw_operand(e, n, 0, &t);
  if (lw_arg(n, 1)->kind == TP_ARG_FLOAT) {
    if (!check_std(e, lw_float(n, 1, 1.0), "normal")) return;
    s = em_full(e, lw_float(n, 1, 1.0), &t);
  } else {
    s = lw_operand(e, n, 1, &t);
    lw_check_range(e, n, em_convert(e, em_compare(e, "GE", s, lw_full_like(e, s, 0)), TP_I64), 1, 2,
                   TP_INVALID_ARGUMENT, "normal expects all elements of std >= 0.0");
  }
  rng r = rng_open(e, n);
  tp_val z = shape_out(e, n, 0, normal01(e, &r, out_numel(n, 0), ct));
  o[0] = em_convert(e, add(e, m, mul(e, s, z)), dt);
}

/* log_normal_(self, mean, std): exp(mean + std * z) */
static void r_log_normal(tp_emit *e, const tp_node *n, tp_val *o) {
  if (!out_is_float(e, n, "log_normal_")) return;
  double mean = lw_float(n, 1, 1.0), std = lw_float(n, 2, 2.0);
  if (!(std > 0.0))
    return (void)em_fail(e, TP_INVALID_ARGUMENT, "log_normal_ expects std > 0.0, but found std=%g", std);
  tp_dtype dt = OUT0->dt, ct = lw_opmath(dt);
  rng r = rng_open(e, n);
  tp_val z = normal01(e, &r, out_numel(n, 0), ct);
  tp_val v = em_unary(e, "stablehlo.exponential", bin_k(e, "stablehlo.add", bin_k(e, "stablehlo.multiply", z, std), mean));
  o[0] = shape_out(e, n, 0, em_convert(e, v, dt));
}

/* ---- exponential_, cauchy_, geometric_ -------------------------------------- */

static double eps_of(tp_dtype dt) {
  switch (dt) {
    case TP_F64: return 0x1p-52;
    case TP_F16: return 0x1p-10;
    case TP_BF16: return 0x1p-7;
    default: return 0x1p-23;
  }
}

/* exponential_(self, lambd): -log(u) / lambd with u in (0, 1]; log(u) near 0
 * is replaced by -eps/2 of the dtype so the result is never 0 (as PyTorch's
 * CUDA kernel does). */
static void r_exponential(tp_emit *e, const tp_node *n, tp_val *o) {
  if (!out_is_float(e, n, "exponential_")) return;
  double lambd = lw_float(n, 1, 1.0);
  if (!(lambd > 0.0))
    return (void)em_fail(e, TP_INVALID_ARGUMENT, "exponential_ expects lambda > 0.0, but found lambda=%g", lambd);
  tp_dtype dt = OUT0->dt, ct = lw_opmath(dt);
  double eps = eps_of(dt);
  rng r = rng_open(e, n);
  tp_val u = uniform01(e, &r, out_numel(n, 0), ct, U_OC);
  tp_val lg = em_unary(e, "stablehlo.log", u);
  tp_val near1 = cmp_b(e, "GE", u, em_const(e, 1.0 - eps / 2, ct));
  lg = em_select(e, near1, lw_full_like(e, lg, -eps / 2), lg);
  tp_val v = bin_k(e, "stablehlo.multiply", lg, -1.0 / lambd);
  o[0] = shape_out(e, n, 0, em_convert(e, v, dt));
}

/* cauchy_(self, median, sigma): median + sigma * tan(pi * (u - 1/2)), u in (0, 1) */
static void r_cauchy(tp_emit *e, const tp_node *n, tp_val *o) {
  if (!out_is_float(e, n, "cauchy_")) return;
  double median = lw_float(n, 1, 0.0), sigma = lw_float(n, 2, 1.0);
  if (!(sigma > 0.0))
    return (void)em_fail(e, TP_INVALID_ARGUMENT, "cauchy_ expects sigma > 0.0, but found sigma=%g", sigma);
  tp_dtype dt = OUT0->dt, ct = lw_opmath(dt);
  rng r = rng_open(e, n);
  tp_val u = uniform01(e, &r, out_numel(n, 0), ct, U_OO);
  tp_val x = bin_k(e, "stablehlo.multiply", bin_k(e, "stablehlo.subtract", u, 0.5), PI_D);
  tp_val t = em_binary(e, "stablehlo.divide", em_unary(e, "stablehlo.sine", x), em_unary(e, "stablehlo.cosine", x));
  tp_val v = bin_k(e, "stablehlo.add", bin_k(e, "stablehlo.multiply", t, sigma), median);
  o[0] = shape_out(e, n, 0, em_convert(e, v, dt));
}

/* geometric_(self, p): ceil(log(u) / log1p(-p)), u in (0, 1); any dtype. */
static void r_geometric(tp_emit *e, const tp_node *n, tp_val *o) {
  double p = lw_float(n, 1, 0.5);
  if (!(p > 0.0 && p < 1.0))
    return (void)em_fail(e, TP_INVALID_ARGUMENT, "geometric_ expects p to be in (0, 1), but got p=%g", p);
  tp_dtype dt = OUT0->dt;
  if (dt == TP_BOOL || tp_dtype_is_complex(dt))
    return (void)em_fail(e, TP_INVALID_ARGUMENT, "geometric_: unsupported dtype %s", tp_dtype_name(dt));
  tp_dtype ct = (dt == TP_F64 || tp_dtype_is_int(dt)) ? TP_F64 : TP_F32;
  rng r = rng_open(e, n);
  tp_val u = uniform01(e, &r, out_numel(n, 0), ct, U_OO);
  tp_val v = bin_k(e, "stablehlo.divide", em_unary(e, "stablehlo.log", u), log1p(-p));
  o[0] = shape_out(e, n, 0, em_convert(e, em_unary(e, "stablehlo.ceil", v), dt));
}

/* ---- random_ --------------------------------------------------------------- */

static int digits_of(tp_dtype dt) {
  switch (dt) {
    case TP_F64: return 53;
    case TP_F32: return 24;
    case TP_F16: return 11;
    case TP_BF16: return 8;
    default: return 0;
  }
}

static uint64_t max_of(tp_dtype dt) {
  switch (dt) {
    case TP_BOOL: return 1;
    case TP_U8: return 0xff;
    case TP_I8: return 0x7f;
    case TP_I16: return 0x7fff;
    case TP_U16: return 0xffff;
    case TP_I32: return 0x7fffffff;
    case TP_U32: return 0xffffffffu;
    case TP_I64: return INT64_MAX;
    case TP_U64: return UINT64_MAX;
    default: return (uint64_t)1 << digits_of(dt);
  }
}

/* Values from + (bits % range) (range 0 means 2^64: all 64 bits), PyTorch's
 * random_from_to: 32 random bits when range < 2^32, else 64. */
static void random_range(tp_emit *e, const tp_node *n, tp_val *o, int64_t from, uint64_t range) {
  tp_dtype dt = OUT0->dt;
  if (tp_dtype_is_complex(dt)) return (void)em_fail(e, TP_INVALID_ARGUMENT, "random_: unsupported dtype %s", tp_dtype_name(dt));
  rng r = rng_open(e, n);
  tp_val w0, w1;
  tf_words(e, &r, out_numel(n, 0), 0, &w0, &w1);
  tp_val b;
  if (range != 0 && range < ((uint64_t)1 << 32)) b = em_convert(e, w0, TP_U64);
  else b = join64(e, w0, w1);
  if (range != 0) b = bin(e, "stablehlo.remainder", b, cu(e, range, TP_U64));
  tp_type it = tp_type_make(TP_I64, 1, &em_type(e, b)->dims[0]);
  tp_val v = em_bitcast(e, b, &it);
  if (from != 0) v = add(e, v, em_const_i(e, from, TP_I64));
  o[0] = shape_out(e, n, 0, em_convert(e, v, dt));
}

static int64_t lowest_of(tp_dtype dt) {
  switch (dt) {
    case TP_I8: return -128;
    case TP_I16: return -32768;
    case TP_I32: return INT32_MIN;
    case TP_I64: return INT64_MIN;
    default: return 0;
  }
}

/* PyTorch's check_from_to_in_range for integral and bool dtypes (floats only
 * warn there). `to_inc` is the largest value asked for. */
static int check_int_range(tp_emit *e, tp_dtype dt, int64_t from, int64_t to_inc, int has_to) {
  if (tp_dtype_is_float(dt)) return 1;
  int uns = dt == TP_BOOL || tp_dtype_is_unsigned(dt);
  if (from < lowest_of(dt) || (!uns && from > (int64_t)max_of(dt)) || (uns && from > 0 && (uint64_t)from > max_of(dt))) {
    em_fail(e, TP_INVALID_ARGUMENT, "random_: from is out of bounds for %s", tp_dtype_name(dt));
    return 0;
  }
  if (has_to && (to_inc < lowest_of(dt) || (to_inc > 0 && (uint64_t)to_inc > max_of(dt)))) {
    em_fail(e, TP_INVALID_ARGUMENT, "random_: to - 1 is out of bounds for %s", tp_dtype_name(dt));
    return 0;
  }
  return 1;
}

/* random.from(self, from, to?) */
static void r_random_from(tp_emit *e, const tp_node *n, tp_val *o) {
  int64_t from = lw_int(n, 1, 0);
  tp_dtype dt = OUT0->dt;
  if (!lw_is_none(n, 2)) {
    int64_t to = lw_int(n, 2, 0);
    if (!(from < to))
      return (void)em_fail(e, TP_INVALID_ARGUMENT, "random_ expects 'from' to be less than 'to', but got from=%lld >= to=%lld",
                           (long long)from, (long long)to);
    if (!check_int_range(e, dt, from, to - 1, 1)) return;
    random_range(e, n, o, from, (uint64_t)to - (uint64_t)from);
    return;
  }
  if (from == INT64_MIN) { /* [lowest, max]: the full 64-bit range */
    if (dt != TP_I64 && dt != TP_F64 && dt != TP_F32 && dt != TP_BF16)
      return (void)em_fail(e, TP_INVALID_ARGUMENT,
                           "random_: the full 64-bit range handles only int64, double, float and bfloat16, not %s",
                           tp_dtype_name(dt));
    random_range(e, n, o, 0, 0);
    return;
  }
  if (!check_int_range(e, dt, from, 0, 0)) return;
  uint64_t top = max_of(dt);
  if (from > 0 && (uint64_t)from > top)
    return (void)em_fail(e, TP_INVALID_ARGUMENT, "random_ expects 'from' casted to dtype to be less than or equal to 'to_inc' "
                         "casted to dtype, but got from=%lld > to_inc=%llu", (long long)from, (unsigned long long)top);
  uint64_t range = top - (uint64_t)from + 1; /* wraps to 0 (= 2^64) for the full range */
  random_range(e, n, o, from, range);
}

/* random.to(self, to) */
static void r_random_to(tp_emit *e, const tp_node *n, tp_val *o) {
  int64_t to = lw_int(n, 1, 0);
  if (!(to > 0))
    return (void)em_fail(e, TP_INVALID_ARGUMENT, "random_ expects 'from' to be less than 'to', but got from=0 >= to=%lld",
                         (long long)to);
  if (!check_int_range(e, OUT0->dt, 0, to - 1, 1)) return;
  random_range(e, n, o, 0, (uint64_t)to);
}

/* random(self): [0, 2^digits] for floats, [0, max] for integers, {0, 1} for bool */
static void r_random(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_dtype dt = OUT0->dt;
  uint64_t range = max_of(dt) + 1; /* u64: 2^64 wraps to 0 = all bits */
  random_range(e, n, o, 0, range);
}

/* randint(high, size) / randint.low(low, high, size) and
 * randint_like(self, high) / randint_like.low_dtype(self, low, high) with
 * their .generator overloads (graphs; eager mode reaches random_.from). */
static void randint_core(tp_emit *e, const tp_node *n, tp_val *o, int64_t low, int64_t high) {
  if (!(low < high))
    return (void)em_fail(e, TP_INVALID_ARGUMENT, "random_ expects 'from' to be less than 'to', but got from=%lld >= to=%lld",
                         (long long)low, (long long)high);
  if (!check_int_range(e, OUT0->dt, low, high - 1, 1)) return;
  random_range(e, n, o, low, (uint64_t)high - (uint64_t)low);
}
static void r_randint(tp_emit *e, const tp_node *n, tp_val *o) { randint_core(e, n, o, 0, lw_int(n, 0, 0)); }
static void r_randint_low(tp_emit *e, const tp_node *n, tp_val *o) {
  randint_core(e, n, o, lw_int(n, 0, 0), lw_int(n, 1, 0));
}
static void r_randint_like(tp_emit *e, const tp_node *n, tp_val *o) { randint_core(e, n, o, 0, lw_int(n, 1, 0)); }
static void r_randint_like_low(tp_emit *e, const tp_node *n, tp_val *o) {
  randint_core(e, n, o, lw_int(n, 1, 0), lw_int(n, 2, 0));
}

/* ---- bernoulli ------------------------------------------------------------- */

/* keep[i] = w0[i] < round(p * 2^32): probability p to within 2^-33. */
static tp_val bern_mask(tp_emit *e, const rng *r, int64_t count, double p) {
  tp_val w0, w1;
  tf_words(e, r, count, 0, &w0, &w1);
  (void)w1;
  uint64_t th = (uint64_t)llround(p * 4294967296.0);
  return cmp_b(e, "LT", em_convert(e, w0, TP_U64), cu(e, th, TP_U64));
}

static int check_p(tp_emit *e, double p, const char *op) {
  if (p >= 0.0 && p <= 1.0) return 1;
  em_fail(e, TP_INVALID_ARGUMENT, "%s expects p to be in [0, 1], but got p=%g", op, p);
  return 0;
}

/* bernoulli_.float(self, p) / bernoulli.p(self, p) */
static void r_bernoulli_p(tp_emit *e, const tp_node *n, tp_val *o) {
  double p = lw_float(n, 1, 0.5);
  if (!check_p(e, p, "bernoulli_")) return;
  rng r = rng_open(e, n);
  tp_val m = bern_mask(e, &r, out_numel(n, 0), p);
  o[0] = shape_out(e, n, 0, em_convert(e, m, OUT0->dt));
}

/* Bernoulli with a tensor of probabilities (argument pi) broadcast to out. */
static void bern_tensor(tp_emit *e, const tp_node *n, tp_val *o, int pi) {
  tp_dtype pdt = lw_dtype(e, n, pi);
  if (!tp_dtype_is_float(pdt))
    return (void)em_fail(e, TP_INVALID_ARGUMENT, "bernoulli: expected a floating point probability tensor, got %s",
                         tp_dtype_name(pdt));
  tp_dtype ct = pdt == TP_F64 ? TP_F64 : TP_F32;
  tp_type t = lw_out_as(n, 0, ct);
  tp_val p = lw_operand(e, n, pi, &t);
  tp_val ok = em_binary(e, "stablehlo.and", em_compare(e, "GE", p, lw_full_like(e, p, 0)),
                        em_compare(e, "LE", p, lw_full_like(e, p, 1)));
  lw_check_range(e, n, em_convert(e, ok, TP_I64), 1, 2, TP_INVALID_ARGUMENT,
                 "Expected p_in >= 0 && p_in <= 1 to be true, but got false.");
  rng r = rng_open(e, n);
  tp_val u = shape_out(e, n, 0, uniform01(e, &r, out_numel(n, 0), ct, U_CO));
  o[0] = em_convert(e, em_compare(e, "LT", u, p), OUT0->dt);
}
static void r_bernoulli(tp_emit *e, const tp_node *n, tp_val *o) { bern_tensor(e, n, o, 0); }
static void r_bernoulli_t(tp_emit *e, const tp_node *n, tp_val *o) { bern_tensor(e, n, o, 1); }

/* ---- dropout --------------------------------------------------------------- */

/* native_dropout(input, p, train?) -> (input * mask * scale, mask),
 * mask ~ Bernoulli(1 - p), scale = 1 / (1 - p) (0 when p == 1, where the
 * output is all zeros); train=False: (input, all true). */
static void r_native_dropout(tp_emit *e, const tp_node *n, tp_val *o) {
  double p = lw_float(n, 1, 0.5);
  int train = lw_is_none(n, 2) ? 1 : lw_bool(n, 2, 1);
  tp_dtype dt = OUT0->dt;
  if (!train) {
    o[0] = lw_operand(e, n, 0, OUT0);
    o[1] = em_full(e, 1, &n->outs[1]);
    return;
  }
  if (!check_p(e, p, "dropout")) return;
  if (!tp_dtype_is_float(dt))
    return (void)em_fail(e, TP_INVALID_ARGUMENT, "dropout: result type Float can't be cast to the desired output type %s",
                         tp_dtype_name(dt));
  tp_dtype ct = lw_opmath(dt);
  rng r = rng_open(e, n);
  tp_val keep = shape_out(e, n, 1, bern_mask(e, &r, out_numel(n, 0), 1.0 - p));
  o[1] = em_convert(e, keep, n->outs[1].dt);
  if (p == 1.0) {
    o[0] = em_full(e, 0, OUT0);
    return;
  }
  tp_type t = lw_out_as(n, 0, ct);
  tp_val x = lw_operand(e, n, 0, &t);
  tp_val xm = mul(e, x, em_convert(e, keep, ct));
  o[0] = em_convert(e, bin_k(e, "stablehlo.multiply", xm, 1.0 / (1.0 - p)), dt);
}

/* native_dropout_backward(grad, mask, scale) = grad * mask * scale */
static void r_native_dropout_backward(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_dtype dt = OUT0->dt, ct = lw_opmath(dt);
  tp_type t = lw_out_as(n, 0, ct);
  tp_val g = lw_operand(e, n, 0, &t), m = lw_operand(e, n, 1, &t);
  double scale = lw_float(n, 2, 1.0);
  o[0] = em_convert(e, bin_k(e, "stablehlo.multiply", mul(e, g, m), scale), dt);
}

/* ---- random states (compiled graphs) ---------------------------------------- */

/* tp::rng_state() -> u8[16]: a fresh key as a random state, the seed and
 * counter as torch.tpu.get_rng_state() gives them.  Graph nodes given the
 * state (tp_graph_add's key) draw with this key, and so does an eager op
 * after torch.tpu.set_rng_state(state): a checkpointed random op and its
 * recomputation in the backward get the same numbers. */
static void r_rng_state(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val key = n->rng_key(e, n);
  if (key < 0 || em_failed(e)) return;
  int64_t d[2] = {2, 8}, flat = 16;
  tp_type t = tp_type_make(TP_U8, 2, d);
  o[0] = em_reshape(e, em_bitcast(e, key, &t), 1, &flat);
}

/* ---- sorting (randperm, multinomial) -------------------------------------- */

/* Sort a u64 tensor along `dim` (unsigned order, ascending or descending).
 * emit.h has no op-with-region helper for sort (see lower_reduce.c, which
 * does the same), so the op is written through em_op's op-name text: em_op
 * prints `%vV = "NAME"(%vX) : (T) -> T`, and NAME here is
 *   stablehlo.sort"(%vX) ({comparator}) {...} : (T) -> T
 *   %rsKd = "stablehlo.reshape
 * so %vV is bound to the sort's (single) result and the trailing reshape of
 * %vX is dead.  Keys must be distinct (they are: they embed an index), so
 * stability does not matter. */
static unsigned g_rsort_seq;

static tp_val sort_u64(tp_emit *e, tp_val x, int dim, int descending) {
  if (em_failed(e)) return -1;
  tp_type xt = *em_type(e, x);
  if (xt.dt != TP_U64) return em_fail(e, TP_INTERNAL, "sort_u64 on a non-u64 value");
  unsigned k = __atomic_fetch_add(&g_rsort_seq, 1, __ATOMIC_RELAXED);
  char tx[256], name[2048];
  tp_type_str(&xt, tx, sizeof tx);
  int len = snprintf(name, sizeof name,
                     "stablehlo.sort\"(%%v%d) ({\n"
                     "    ^bb0(%%rs%ua: tensor<ui64>, %%rs%ub: tensor<ui64>):\n"
                     "      %%rs%uc = \"stablehlo.compare\"(%%rs%ua, %%rs%ub) {comparison_direction = "
                     "#stablehlo<comparison_direction %s>, compare_type = #stablehlo<comparison_type UNSIGNED>} : "
                     "(tensor<ui64>, tensor<ui64>) -> tensor<i1>\n"
                     "      \"stablehlo.return\"(%%rs%uc) : (tensor<i1>) -> ()\n"
                     "    }) {dimension = %d : i64, is_stable = false} : (%s) -> %s\n"
                     "    %%rs%ud = \"stablehlo.reshape",
                     x, k, k, k, k, k, descending ? "GT" : "LT", k, dim, tx, tx, k);
  if (len < 0 || (size_t)len >= sizeof name) return em_fail(e, TP_INTERNAL, "sort: type text too long");
  return em_op(e, name, NULL, &x, 1, &xt);
}

static int bits_for(int64_t n) { /* smallest b with 2^b >= n */
  int b = 0;
  while (b < 63 && ((int64_t)1 << b) < n) b++;
  return b;
}

/* randperm.generator_out(n, generator, out) / randperm.out(n, out): sort
 * keys (64 - b random bits << b) | i, b = bits_for(n), and keep the low b bits. */
static void r_randperm(tp_emit *e, const tp_node *n, tp_val *o) {
  int64_t cnt = lw_int(n, 0, 0);
  if (cnt < 0) return (void)em_fail(e, TP_INVALID_ARGUMENT, "randperm: n must be non-negative, got %lld", (long long)cnt);
  if (out_numel(n, 0) != cnt)
    return (void)em_fail(e, TP_INTERNAL, "randperm: output has %lld elements, expected %lld", (long long)out_numel(n, 0),
                         (long long)cnt);
  if (cnt == 0) {
    o[0] = em_full(e, 0, OUT0);
    return;
  }
  int b = bits_for(cnt);
  rng r = rng_open(e, n);
  tp_val w0, w1;
  tf_words(e, &r, cnt, 0, &w0, &w1);
  tp_val key = bin_ku(e, "stablehlo.shift_left", join64(e, w0, w1), (uint64_t)b);
  tp_type it = tp_type_make(TP_U64, 1, &cnt);
  key = bin(e, "stablehlo.or", key, em_iota(e, &it, 0));
  tp_val sorted = sort_u64(e, key, 0, 0);
  tp_val idx = bin_ku(e, "stablehlo.and", sorted, b ? (((uint64_t)1 << b) - 1) : 0);
  o[0] = shape_out(e, n, 0, em_convert(e, em_convert(e, idx, TP_I64), OUT0->dt));
}

/* multinomial(self, num_samples, replacement).  With replacement: each
 * sample is argmax_c(log p_c + Gumbel) (the Gumbel-max trick) with fresh
 * noise per sample; without: the num_samples largest keys log p_c + Gumbel_c
 * (Gumbel-top-k, equivalent to sequential sampling without replacement).
 * Probabilities need not sum to 1.  Negative or non-finite probabilities,
 * and rows that sum to 0, raise PyTorch's errors through the device-side
 * checks (tp_node.check). */
static void r_multinomial(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val p = lw_value(e, n, 0);
  if (em_failed(e)) return;
  tp_type pt = *em_type(e, p);
  int64_t S = lw_int(n, 1, 1);
  int repl = lw_bool(n, 2, 0);
  if (!tp_dtype_is_float(pt.dt))
    return (void)em_fail(e, TP_INVALID_ARGUMENT, "multinomial only supports floating-point dtypes for input, got: %s",
                         tp_dtype_name(pt.dt));
  if (pt.rank < 1 || pt.rank > 2)
    return (void)em_fail(e, TP_INVALID_ARGUMENT, "multinomial: prob_dist must be 1 or 2 dim, got %d", pt.rank);
  int64_t rows = pt.rank == 2 ? pt.dims[0] : 1, cats = pt.dims[pt.rank - 1];
  if (S <= 0) return (void)em_fail(e, TP_INVALID_ARGUMENT, "multinomial: cannot sample n_sample <= 0 samples");
  if (!repl && S > cats)
    return (void)em_fail(e, TP_INVALID_ARGUMENT, "multinomial: cannot sample n_sample > prob_dist.size(-1) samples without replacement");
  if (cats <= 0) return (void)em_fail(e, TP_INVALID_ARGUMENT, "multinomial: number of categories cannot be zero");
  if (rows == 0) {
    o[0] = em_full(e, 0, OUT0);
    return;
  }
  tp_dtype ct = pt.dt == TP_F64 ? TP_F64 : TP_F32;
  int64_t d2[2] = {rows, cats};
  tp_val pc = em_reshape(e, em_convert(e, p, ct), 2, d2);
  tp_val zero = lw_full_like(e, pc, 0);
  tp_val ok = em_binary(e, "stablehlo.and", em_compare(e, "LT", pc, lw_full_like(e, pc, INFINITY)),
                        em_compare(e, "GE", pc, zero)); /* false for NaN */
  lw_check_range(e, n, em_convert(e, ok, TP_I64), 1, 2, TP_INVALID_ARGUMENT,
                 "probability tensor contains either `inf`, `nan` or element < 0");
  int64_t one = 1;
  tp_val sum = em_reduce(e, pc, em_const(e, 0, ct), &one, 1, "stablehlo.add");
  lw_check_range(e, n, em_convert(e, em_compare(e, "GT", sum, lw_full_like(e, sum, 0)), TP_I64), 1, 2,
                 TP_INVALID_ARGUMENT, "invalid multinomial distribution (sum of probabilities <= 0)");
  tp_val lp = em_unary(e, "stablehlo.log", pc);
  rng r = rng_open(e, n);
  if (em_failed(e)) return;
  if (repl) {
    int64_t d3[3] = {rows, S, cats}, map[2] = {0, 2};
    tp_type t3 = tp_type_make(ct, 3, d3);
    tp_val w0, w1;
    tf_words_streams(e, &r, &t3, 2, &w0, &w1); /* counter per (row, sample), key per category */
    tp_val u = ct == TP_F64 ? u_f64(e, w0, w1, U_OO) : u_f32(e, w0, U_OO);
    tp_val gum = em_unary(e, "stablehlo.negate",
                          em_unary(e, "stablehlo.log", em_unary(e, "stablehlo.negate", em_unary(e, "stablehlo.log", u))));
    tp_val keys = add(e, em_bcast_in_dim(e, lp, &t3, map), gum);
    tp_val best, idx;
    em_argreduce(e, keys, 2, 1, &best, &idx);
    o[0] = shape_out(e, n, 0, em_convert(e, idx, OUT0->dt));
    return;
  }
  tp_type t2 = tp_type_make(ct, 2, d2);
  tp_val w0, w1;
  tf_words_streams(e, &r, &t2, 1, &w0, &w1); /* counter per row, key per category */
  tp_val u = ct == TP_F64 ? u_f64(e, w0, w1, U_OO) : u_f32(e, w0, U_OO);
  tp_val gum = em_unary(e, "stablehlo.negate",
                        em_unary(e, "stablehlo.log", em_unary(e, "stablehlo.negate", em_unary(e, "stablehlo.log", u))));
  /* f32 keys (rounding f64 keys to f32 only merges near-ties) in an
   * order-preserving u32 code, above the complemented category index. */
  tp_val g = em_convert(e, add(e, lp, gum), TP_F32);
  tp_type ut = tp_type_make(TP_U32, 2, d2);
  tp_val bits = em_bitcast(e, g, &ut);
  tp_val neg = cmp_b(e, "NE", bin_ku(e, "stablehlo.and", bits, 0x80000000u), cu(e, 0, TP_U32));
  tp_val code = em_select(e, neg, em_unary(e, "stablehlo.not", bits), bin_ku(e, "stablehlo.or", bits, 0x80000000u));
  tp_val ci = em_iota(e, &ut, 1);
  tp_val key = join64(e, code, em_unary(e, "stablehlo.not", ci));
  tp_val sorted = sort_u64(e, key, 1, 1);
  int64_t st[2] = {0, 0}, lim[2] = {rows, S};
  tp_val top = em_slice(e, sorted, st, lim, NULL);
  tp_val idx = em_unary(e, "stablehlo.not", lo32(e, top));
  o[0] = shape_out(e, n, 0, em_convert(e, em_convert(e, idx, TP_I64), OUT0->dt));
}

const tp_lower_entry tp_lower_random[] = {
    {"aten::uniform", r_uniform, 0},
    {"aten::rand", r_rand, 0},
    {"aten::rand.generator", r_rand, 0},
    {"aten::rand_like", r_rand, 0},
    {"aten::rand_like.generator", r_rand, 0},
    {"aten::randn", r_randn, 0},
    {"aten::randn.generator", r_randn, 0},
    {"aten::randn_like", r_randn, 0},
    {"aten::randn_like.generator", r_randn, 0},
    {"aten::normal.float_float", r_normal_ff, 0},
    {"aten::randint", r_randint, 0},
    {"aten::randint.generator", r_randint, 0},
    {"aten::randint.low", r_randint_low, 0},
    {"aten::randint.low_generator", r_randint_low, 0},
    {"aten::randint_like", r_randint_like, 0},
    {"aten::randint_like.generator", r_randint_like, 0},
    {"aten::randint_like.low_dtype", r_randint_like_low, 0},
    {"aten::randint_like.low_generator_dtype", r_randint_like_low, 0},
    {"aten::randperm", r_randperm, 0},
    {"aten::randperm.generator", r_randperm, 0},
    {"aten::normal_", r_normal_, 0},
    {"aten::normal_functional", r_normal_, 0},
    {"aten::normal.out", r_normal_, 0},
    {"aten::normal.Tensor_float", normal_tensors, 0},
    {"aten::normal.float_Tensor", normal_tensors, 0},
    {"aten::normal.Tensor_Tensor", normal_tensors, 0},
    {"aten::log_normal", r_log_normal, 0},
    {"aten::log_normal_", r_log_normal, 0},
    {"aten::exponential", r_exponential, 0},
    {"aten::cauchy", r_cauchy, 0},
    {"aten::cauchy_", r_cauchy, 0},
    {"aten::geometric", r_geometric, 0},
    {"aten::geometric_", r_geometric, 0},
    {"aten::random.from", r_random_from, 0},
    {"aten::random.to", r_random_to, 0},
    {"aten::random", r_random, 0},
    {"aten::bernoulli", r_bernoulli, 0},
    {"aten::bernoulli.p", r_bernoulli_p, 0},
    {"aten::bernoulli_.float", r_bernoulli_p, 0},
    {"aten::bernoulli.Tensor", r_bernoulli_t, 0},
    {"aten::native_dropout", r_native_dropout, 0},
    {"aten::native_dropout_backward", r_native_dropout_backward, 0},
    {"aten::randperm.generator_out", r_randperm, 0},
    {"aten::randperm.out", r_randperm, 0},
    {"aten::multinomial", r_multinomial, 0},
    {"tp::rng_state", r_rng_state, 0},
    {NULL, NULL, 0},
};

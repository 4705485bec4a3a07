/* lower_elementwise.c - pointwise ops: arithmetic, comparisons, unary math,
 * activations and their backward formulas, copies and fills.
 *
 * Convention: the output dtype comes from PyTorch's meta function
 * (n->outs).  Binary arithmetic computes in PyTorch's common dtype of its
 * inputs (lw_result_type; it differs from the output's for out= and in-place
 * forms), unary ops in the output's; f16/bf16 compute in f32 (lw_opmath, as
 * PyTorch's CPU kernels do) and round once at the end.
 *
 * XLA facts the rules below work around (all checked by
 * tests/test_ops_elementwise.py):
 *  - stablehlo.maximum/minimum on XLA:CPU do not propagate NaN from their
 *    second operand; PyTorch's maximum/minimum/clamp do (fmaxmin).
 *  - XLA rewrites convert(bool) * x into select(bool, x, 0), losing
 *    0 * inf = NaN; bool tensors reach float arithmetic through u8 (opnd).
 *  - float -> int converts saturate (NaN -> 0) in XLA; PyTorch's CPU casts
 *    wrap through int64 for uint8 and give INT_MIN for NaN/inf/out of range
 *    (float_to_int).
 *  - integer power: XLA's looks at 6 exponent bits and returns 0 for
 *    negative exponents; PyTorch squares through every bit (int_pow). */
#include <math.h>
#include <string.h>

#include "lower_util.h"

#define OUT0 (&n->outs[0])

static int isf(tp_dtype d) { return tp_dtype_is_float(d); }
static int isc(tp_dtype d) { return tp_dtype_is_complex(d); }

static tp_val finish(tp_emit *e, const tp_node *n, tp_val v) { return em_convert(e, v, n->outs[0].dt); }

static tp_val k(tp_emit *e, tp_val like, double v) { return lw_full_like(e, like, v); }
static tp_val add(tp_emit *e, tp_val a, tp_val b) { return em_binary(e, "stablehlo.add", a, b); }
static tp_val sub(tp_emit *e, tp_val a, tp_val b) { return em_binary(e, "stablehlo.subtract", a, b); }
static tp_val mul(tp_emit *e, tp_val a, tp_val b) { return em_binary(e, "stablehlo.multiply", a, b); }
static tp_val dv(tp_emit *e, tp_val a, tp_val b) { return em_binary(e, "stablehlo.divide", a, b); }
static tp_val un(tp_emit *e, const char *op, tp_val a) { return em_unary(e, op, a); }
static tp_val isnan_(tp_emit *e, tp_val x) { return em_compare(e, "NE", x, x); }

/* Argument i converted to t's dtype and broadcast to its shape.  A bool
 * tensor headed for float arithmetic goes through u8 first: XLA simplifies
 * convert(pred) * x to select(pred, x, 0), which is wrong for x = inf/NaN. */
static tp_val opnd(tp_emit *e, const tp_node *n, int i, const tp_type *t) {
  const tp_arg *a = lw_arg(n, i);
  if (a->kind == TP_ARG_TENSOR && em_type(e, a->v)->dt == TP_BOOL && (isf(t->dt) || isc(t->dt))) {
    tp_val v = em_convert(e, em_convert(e, a->v, TP_U8), t->dt);
    return em_bcast_to(e, v, t->rank, t->dims);
  }
  return lw_operand(e, n, i, t);
}

/* Compute type of a unary op: the output's shape in its opmath dtype. */
static tp_type ctype(const tp_node *n) { return lw_out_as(n, 0, lw_opmath(n->outs[0].dt)); }

/* Compute type of an op over arguments 0..nin-1: PyTorch's common dtype of
 * the inputs (integers promoted to the default float when `to_float`: the
 * output's dtype when it is a float, as for a functional call), in its opmath
 * dtype, with the output's shape. */
static tp_type common_type(tp_emit *e, const tp_node *n, int nin, int to_float) {
  int idx[4] = {0, 1, 2, 3};
  tp_dtype dt = lw_result_type(e, n, idx, nin);
  if (to_float && !isf(dt) && !isc(dt)) dt = isf(OUT0->dt) ? OUT0->dt : TP_F32;
  return lw_out_as(n, 0, lw_opmath(dt));
}

/* NaN-propagating maximum (is_max) or minimum, like PyTorch's. */
static tp_val fmaxmin(tp_emit *e, tp_val a, tp_val b, int is_max) {
  tp_val r = em_binary(e, is_max ? "stablehlo.maximum" : "stablehlo.minimum", a, b);
  if (!isf(em_type(e, r)->dt)) return r;
  r = em_select(e, isnan_(e, b), b, r);
  return em_select(e, isnan_(e, a), a, r);
}

/* ---- binary arithmetic ------------------------------------------------------ */

static int is_bool_arg(tp_emit *e, const tp_node *n, int i) { return lw_dtype(e, n, i) == TP_BOOL; }

/* out = a OP (alpha * b), or for rsub (reversed) b - alpha * a; alpha is
 * argument `alpha_i` (or -1). */
static void arith(tp_emit *e, const tp_node *n, tp_val *o, const char *op, int alpha_i, int reversed) {
  tp_type ct = common_type(e, n, 2, 0);
  tp_val a = opnd(e, n, 0, &ct), b = opnd(e, n, 1, &ct);
  if (reversed) {
    tp_val t = a;
    a = b;
    b = t;
  }
  if (alpha_i >= 0 && !lw_is_none(n, alpha_i)) b = mul(e, b, lw_operand(e, n, alpha_i, &ct));
  o[0] = finish(e, n, em_binary(e, op, a, b));
}

static void r_add(tp_emit *e, const tp_node *n, tp_val *o) { arith(e, n, o, "stablehlo.add", 2, 0); }
static void r_sub(tp_emit *e, const tp_node *n, tp_val *o) {
  if (is_bool_arg(e, n, 0) || is_bool_arg(e, n, 1)) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT,
                   "Subtraction, the `-` operator, with a bool tensor is not supported. If you are trying to "
                   "invert a mask, use the `~` or `logical_not()` operator instead.");
    return;
  }
  arith(e, n, o, "stablehlo.subtract", 2, 0);
}
/* rsub(self, other, alpha) = other - alpha * self */
static void r_rsub(tp_emit *e, const tp_node *n, tp_val *o) {
  if (is_bool_arg(e, n, 0) || is_bool_arg(e, n, 1)) {
    r_sub(e, n, o);
    return;
  }
  arith(e, n, o, "stablehlo.subtract", 2, 1);
}
static void r_mul(tp_emit *e, const tp_node *n, tp_val *o) {
  /* bool * bool is logical and (stablehlo.multiply on i1 is too). */
  arith(e, n, o, "stablehlo.multiply", -1, 0);
}
static void minmax(tp_emit *e, const tp_node *n, tp_val *o, int is_max) {
  tp_type ct = common_type(e, n, 2, 0);
  o[0] = finish(e, n, fmaxmin(e, opnd(e, n, 0, &ct), opnd(e, n, 1, &ct), is_max));
}
static void r_maximum(tp_emit *e, const tp_node *n, tp_val *o) { minmax(e, n, o, 1); }
static void r_minimum(tp_emit *e, const tp_node *n, tp_val *o) { minmax(e, n, o, 0); }
static void r_atan2(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_type ct = common_type(e, n, 2, 1);
  o[0] = finish(e, n, em_binary(e, "stablehlo.atan2", opnd(e, n, 0, &ct), opnd(e, n, 1, &ct)));
}
/* Integer division by zero raises ZeroDivisionError on PyTorch's CPU (XLA
 * gives -1 or the dividend): an integer divisor must not be 0, checked like
 * an index (the error comes at a later read; see tp_node.check). */
static void check_divisor(tp_emit *e, const tp_node *n, tp_val b) {
  if (isf(em_type(e, b)->dt) || isc(em_type(e, b)->dt)) return;
  tp_val nz = em_convert(e, em_compare(e, "NE", b, k(e, b, 0)), TP_I64);
  lw_check_range(e, n, nz, 1, 2, TP_INVALID_ARGUMENT, "ZeroDivisionError");
}

/* fmod: C's fmod (truncated remainder) for floats and ints alike. */
static void r_fmod(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_type ct = common_type(e, n, 2, 0);
  tp_val b = opnd(e, n, 1, &ct);
  check_divisor(e, n, b);
  o[0] = finish(e, n, em_binary(e, "stablehlo.remainder", opnd(e, n, 0, &ct), b));
}
static void bitwise(tp_emit *e, const tp_node *n, tp_val *o, const char *op, const char *name) {
  tp_type ct = common_type(e, n, 2, 0);
  if (isf(ct.dt) || isc(ct.dt)) {
    o[0] = lw_not_for(e, name, ct.dt);
    return;
  }
  o[0] = finish(e, n, em_binary(e, op, opnd(e, n, 0, &ct), opnd(e, n, 1, &ct)));
}
static void r_band(tp_emit *e, const tp_node *n, tp_val *o) { bitwise(e, n, o, "stablehlo.and", "bitwise_and_cpu"); }
static void r_bor(tp_emit *e, const tp_node *n, tp_val *o) { bitwise(e, n, o, "stablehlo.or", "bitwise_or_cpu"); }
static void r_bxor(tp_emit *e, const tp_node *n, tp_val *o) { bitwise(e, n, o, "stablehlo.xor", "bitwise_xor_cpu"); }

/* a ** b for integers, as PyTorch's powi: square-and-multiply over every bit
 * of b (wrapping like C); for signed b < 0: 1 if a == 1, +-1 if a == -1, else 0. */
static tp_val int_pow(tp_emit *e, tp_val a, tp_val b) {
  tp_dtype dt = em_type(e, a)->dt;
  int bits = (int)tp_dtype_size(dt) * 8;
  tp_val one = k(e, a, 1), zero = k(e, a, 0);
  tp_val acc = one, base = a, x = b;
  for (int i = 0; i < bits; i++) {
    tp_val odd = em_compare(e, "NE", em_binary(e, "stablehlo.and", x, one), zero);
    acc = em_select(e, odd, mul(e, acc, base), acc);
    if (i + 1 < bits) {
      base = mul(e, base, base);
      x = em_binary(e, "stablehlo.shift_right_logical", x, one);
    }
  }
  if (tp_dtype_is_unsigned(dt)) return acc;
  tp_val m1 = k(e, a, -1);
  tp_val odd = em_compare(e, "NE", em_binary(e, "stablehlo.and", b, one), zero);
  tp_val neg_res = em_select(e, em_compare(e, "EQ", a, one), one,
                             em_select(e, em_compare(e, "EQ", a, m1), em_select(e, odd, m1, one), zero));
  return em_select(e, em_compare(e, "LT", b, zero), neg_res, acc);
}

/* x ** s for a number s, as PyTorch's CPU kernel for float, double and
 * bfloat16 picks its kernel by s's value: 2, 3 and -2 by multiplying
 * (bfloat16 rounds after each product), -1 a reciprocal, 0.5 / -0.5 sqrt /
 * rsqrt (which differ from pow at -0 and -inf), others pow.  In eager
 * programs s is a runtime scalar, so a stablehlo.case picks the kernel on
 * the device and runs only that one: XLA CPU's pow costs about ten
 * multiplies (x ** 2 in RMSNorm).  In graphs s is a constant and XLA folds
 * the case away. */
static tp_val pow_scalar(tp_emit *e, const tp_node *n, tp_val a, tp_val b, tp_dtype cdt) {
  static const double special[] = {2, 3, -2, -1, 0.5, -0.5};
  enum { NSPECIAL = (int)(sizeof special / sizeof special[0]) };
  tp_val s = lw_tensor(e, n, 1, TP_F64);
  tp_val idx = em_const_i(e, NSPECIAL, TP_I32);
  for (int i = NSPECIAL - 1; i >= 0; i--)
    idx = em_select(e, em_compare(e, "EQ", s, em_const(e, special[i], TP_F64)), em_const_i(e, i, TP_I32), idx);
  em_case C;
  if (em_case_begin(e, &C, idx, NSPECIAL + 1) < 0) return -1;
  em_case_next(e, &C, mul(e, a, a));
  em_case_next(e, &C, mul(e, em_round_to(e, mul(e, a, a), cdt), a));
  em_case_next(e, &C, dv(e, k(e, a, 1), em_round_to(e, mul(e, a, a), cdt)));
  em_case_next(e, &C, dv(e, k(e, a, 1), a));
  em_case_next(e, &C, un(e, "stablehlo.sqrt", a));
  em_case_next(e, &C, un(e, "stablehlo.rsqrt", a));
  em_case_next(e, &C, em_binary(e, "stablehlo.power", a, b));
  return em_case_end(e, &C);
}

static void r_pow(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_type ct = common_type(e, n, 2, 0);
  tp_val a = opnd(e, n, 0, &ct), b = opnd(e, n, 1, &ct);
  if (ct.dt == TP_BOOL) {
    /* PyTorch's pow(Tensor, Scalar) answers exponents 0 (ones) and 1 (self)
     * before its kernel, which refuses bool; x ** 0 = 1 and x ** 1 = x are
     * what this computes. */
    if (strcmp(n->op, "aten::pow.Tensor_Scalar")) o[0] = lw_not_for(e, "pow", ct.dt);
    else o[0] = finish(e, n, em_select(e, b, a, k(e, a, 1)));
    return;
  }
  if (tp_dtype_is_int(ct.dt)) {
    /* the CPU refuses a negative number exponent: pow.Tensor_Scalar, and
     * pow_.Scalar, which reaches here as aten::pow.Scalar with a tensor
     * base.  A tensor of them is computed, also a CPU 0-d tensor
     * (pow.Tensor_Tensor, pow_.Tensor), which reaches here as a number.
     * The number is a runtime scalar, so checked on the device. */
    if (!strcmp(n->op, "aten::pow.Tensor_Scalar") ||
        (!strcmp(n->op, "aten::pow.Scalar") && lw_arg(n, 0)->kind == TP_ARG_TENSOR))
      lw_check_text(e, n, lw_tensor(e, n, 1, TP_I64), 0, INT64_MAX, TP_INVALID_ARGUMENT,
                    "Integers to negative integer powers are not allowed.");
    o[0] = finish(e, n, int_pow(e, a, b));
    return;
  }
  tp_dtype cdt = lw_result_type(e, n, (const int[]){0, 1}, 2);
  if (!strcmp(n->op, "aten::pow.Tensor_Scalar") && (cdt == TP_F32 || cdt == TP_F64 || cdt == TP_BF16)) {
    o[0] = finish(e, n, pow_scalar(e, n, a, b, cdt));
    return;
  }
  o[0] = finish(e, n, em_binary(e, "stablehlo.power", a, b));
}

/* x rounded to the values of `lowp` when it is f16/bf16: PyTorch's CPU
 * kernels for div's rounding modes compute f16/bf16 with c10::Half/BFloat16
 * arithmetic, which rounds after every operation. */
static tp_val rnd(tp_emit *e, tp_val x, tp_dtype lowp) { return em_round_to(e, x, lowp); }

/* Python-style floor division of a by b, rounding each step to `lowp` (see
 * rnd). */
static tp_val floor_div(tp_emit *e, tp_val a, tp_val b, tp_dtype lowp) {
  tp_dtype dt = em_type(e, a)->dt;
  tp_val zero = k(e, a, 0);
  if (!isf(dt)) {
    tp_val q = dv(e, a, b), r = em_binary(e, "stablehlo.remainder", a, b);
    tp_val adjust = em_binary(e, "stablehlo.and", em_compare(e, "NE", r, zero),
                              em_compare(e, "NE", em_compare(e, "LT", r, zero), em_compare(e, "LT", b, zero)));
    return em_select(e, adjust, sub(e, q, k(e, a, 1)), q);
  }
  /* PyTorch's div_floor_floating */
  tp_val mod = em_binary(e, "stablehlo.remainder", a, b);
  tp_val d = rnd(e, dv(e, rnd(e, sub(e, a, mod), lowp), b), lowp);
  tp_val fix = em_binary(e, "stablehlo.and", em_compare(e, "NE", mod, zero),
                         em_compare(e, "NE", em_compare(e, "LT", b, zero), em_compare(e, "LT", mod, zero)));
  d = em_select(e, fix, rnd(e, sub(e, d, k(e, a, 1)), lowp), d);
  tp_val fl = un(e, "stablehlo.floor", d);
  tp_val up = em_compare(e, "GT", rnd(e, sub(e, d, fl), lowp), k(e, a, 0.5));
  fl = em_select(e, up, rnd(e, add(e, fl, k(e, a, 1)), lowp), fl);
  tp_val q = rnd(e, dv(e, a, b), lowp);
  /* a zero quotient keeps the sign of a / b */
  tp_val res = em_select(e, em_compare(e, "EQ", d, zero), mul(e, zero, un(e, "stablehlo.sign", q)), fl);
  return em_select(e, em_compare(e, "EQ", b, zero), q, res);
}

/* A number divisor: in a compiled graph a constant of the program, which
 * XLA folds into a multiplication by its reciprocal, one ulp off a true
 * division in most elements (x / 127.5: 70% of them, flipping torchao's
 * int8 rounding; issue 40).  Behind an optimization barrier its value is
 * opaque, as a runtime number is in eager mode.  A barrier anywhere else
 * costs a compiled step time, so only divisors get one. */
static tp_val divisor(tp_emit *e, const tp_node *n, int i, const tp_type *t) {
  if (lw_arg(n, i)->kind != TP_ARG_SCALAR || !isf(t->dt)) return opnd(e, n, i, t);
  tp_val b = lw_tensor(e, n, i, t->dt); /* rank 0: the barrier before the broadcast */
  tp_type bt = *em_type(e, b);
  b = em_op(e, "stablehlo.optimization_barrier", NULL, &b, 1, &bt);
  return em_bcast_to(e, b, t->rank, t->dims);
}

static void r_div(tp_emit *e, const tp_node *n, tp_val *o) {
  const char *mode = lw_str(n, 2, NULL);
  if (!mode) {
    tp_type ct = common_type(e, n, 2, 1);
    o[0] = finish(e, n, dv(e, opnd(e, n, 0, &ct), divisor(e, n, 1, &ct)));
    return;
  }
  /* rounding modes compute in the promoted input type (= output type). */
  tp_type ct = common_type(e, n, 2, 0);
  tp_dtype lowp = lw_result_type(e, n, (const int[]){0, 1}, 2);
  tp_val a = opnd(e, n, 0, &ct), b = divisor(e, n, 1, &ct);
  check_divisor(e, n, b);
  if (!strcmp(mode, "trunc")) {
    tp_val q = rnd(e, dv(e, a, b), lowp);
    if (isf(ct.dt)) {
      tp_val neg = em_compare(e, "LT", q, k(e, q, 0));
      q = em_select(e, neg, un(e, "stablehlo.ceil", q), un(e, "stablehlo.floor", q));
    }
    o[0] = finish(e, n, q);
  } else if (!strcmp(mode, "floor")) {
    o[0] = finish(e, n, floor_div(e, a, b, lowp));
  } else {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT,
                   "div expected rounding_mode to be one of None, 'trunc', or 'floor' but found '%s'", mode);
  }
}

static void r_floor_divide(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_type ct = common_type(e, n, 2, 0);
  tp_dtype lowp = lw_result_type(e, n, (const int[]){0, 1}, 2);
  tp_val b = divisor(e, n, 1, &ct);
  check_divisor(e, n, b);
  o[0] = finish(e, n, floor_div(e, opnd(e, n, 0, &ct), b, lowp));
}

/* Python's modulo: the result takes the divisor's sign. */
static void r_remainder(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_type ct = common_type(e, n, 2, 0);
  tp_val a = opnd(e, n, 0, &ct), b = opnd(e, n, 1, &ct);
  check_divisor(e, n, b);
  tp_val m = em_binary(e, "stablehlo.remainder", a, b), zero = k(e, a, 0);
  tp_val fix = em_binary(e, "stablehlo.and", em_compare(e, "NE", m, zero),
                         em_compare(e, "NE", em_compare(e, "LT", m, zero), em_compare(e, "LT", b, zero)));
  o[0] = finish(e, n, em_select(e, fix, add(e, m, b), m));
}

/* ---- comparisons and logic ---------------------------------------------------- */

static void cmp(tp_emit *e, const tp_node *n, tp_val *o, const char *dir) {
  int idx[2] = {0, 1};
  tp_type ct = lw_out_as(n, 0, lw_result_type(e, n, idx, 2));
  tp_val a = opnd(e, n, 0, &ct), b = opnd(e, n, 1, &ct);
  o[0] = finish(e, n, em_compare(e, dir, a, b));
}
static void r_eq(tp_emit *e, const tp_node *n, tp_val *o) { cmp(e, n, o, "EQ"); }
static void r_ne(tp_emit *e, const tp_node *n, tp_val *o) { cmp(e, n, o, "NE"); }
static void r_lt(tp_emit *e, const tp_node *n, tp_val *o) { cmp(e, n, o, "LT"); }
static void r_le(tp_emit *e, const tp_node *n, tp_val *o) { cmp(e, n, o, "LE"); }
static void r_gt(tp_emit *e, const tp_node *n, tp_val *o) { cmp(e, n, o, "GT"); }
static void r_ge(tp_emit *e, const tp_node *n, tp_val *o) { cmp(e, n, o, "GE"); }

/* Logical ops: x != 0 (so NaN is true), then the op on booleans. */
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
  if (isf(OUT0->dt) || isc(OUT0->dt)) {
    o[0] = lw_not_for(e, "bitwise_not_cpu", OUT0->dt);
    return;
  }
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

/* clamp(self, min, max) = minimum(maximum(self, min), max): NaN anywhere
 * gives NaN, and min > max gives max, as in PyTorch. */
static void r_clamp(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_type ct = common_type(e, n, 3, 0);
  if (ct.dt == TP_BOOL) { /* (clamp_min / clamp_max take bools) */
    o[0] = lw_not_for(e, "clamp_cpu", ct.dt);
    return;
  }
  tp_val x = opnd(e, n, 0, &ct);
  if (!lw_is_none(n, 1)) x = fmaxmin(e, x, opnd(e, n, 1, &ct), 1);
  if (!lw_is_none(n, 2)) x = fmaxmin(e, x, opnd(e, n, 2, &ct), 0);
  o[0] = finish(e, n, x);
}
static void clamp1(tp_emit *e, const tp_node *n, tp_val *o, int is_min) {
  tp_type ct = common_type(e, n, 2, 0);
  o[0] = finish(e, n, fmaxmin(e, opnd(e, n, 0, &ct), opnd(e, n, 1, &ct), is_min));
}
static void r_clamp_min(tp_emit *e, const tp_node *n, tp_val *o) { clamp1(e, n, o, 1); }
static void r_clamp_max(tp_emit *e, const tp_node *n, tp_val *o) { clamp1(e, n, o, 0); }

/* lerp: |weight| < 0.5 ? self + w*(end-self) : end - (end-self)*(1-w) (PyTorch's form) */
static void r_lerp(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_type ct = ctype(n);
  tp_val a = opnd(e, n, 0, &ct), b = opnd(e, n, 1, &ct), w = opnd(e, n, 2, &ct);
  tp_val d = sub(e, b, a);
  tp_val lo = add(e, a, mul(e, w, d)), hi = sub(e, b, mul(e, d, sub(e, k(e, w, 1), w)));
  tp_val aw = lw_abs(e, w);
  tp_val small = em_compare(e, "LT", aw, k(e, aw, 0.5));
  o[0] = finish(e, n, em_select(e, small, lo, hi));
}

/* addcmul: self + value * t1 * t2, addcdiv: self + value * (t1 / t2), in
 * PyTorch's order of operations. */
static void r_addcmul(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_type ct = common_type(e, n, 3, 0);
  tp_val s = opnd(e, n, 0, &ct), t1 = opnd(e, n, 1, &ct), t2 = opnd(e, n, 2, &ct);
  tp_val v = lw_operand(e, n, 3, &ct);
  o[0] = finish(e, n, add(e, s, mul(e, mul(e, v, t1), t2)));
}
static void r_addcdiv(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_type ct = common_type(e, n, 3, 0);
  if (!isf(ct.dt) && !isc(ct.dt)) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT,
                   "Integer division with addcdiv is no longer supported, and in a future release addcdiv will "
                   "perform a true division of tensor1 and tensor2.");
    return;
  }
  tp_val s = opnd(e, n, 0, &ct), t1 = opnd(e, n, 1, &ct), t2 = opnd(e, n, 2, &ct);
  tp_val v = lw_operand(e, n, 3, &ct);
  o[0] = finish(e, n, add(e, s, mul(e, v, dv(e, t1, t2))));
}

/* prims::fma(a, b, c) = a * b + c (PyTorch's decompositions of optimizers use it). */
static void r_fma(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_type ct = ctype(n);
  tp_val a = opnd(e, n, 0, &ct), b = opnd(e, n, 1, &ct), c = opnd(e, n, 2, &ct);
  o[0] = finish(e, n, add(e, mul(e, a, b), c));
}

/* ---- unary -------------------------------------------------------------------- */

static tp_val x_in(tp_emit *e, const tp_node *n) {
  tp_type ct = ctype(n);
  return opnd(e, n, 0, &ct);
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
UNARY(r_erf, "chlo.erf")
UNARY(r_asin, "chlo.asin")
UNARY(r_acos, "chlo.acos")
UNARY(r_sinh, "chlo.sinh")
UNARY(r_cosh, "chlo.cosh")
UNARY(r_asinh, "chlo.asinh")
UNARY(r_acosh, "chlo.acosh")
UNARY(r_atanh, "chlo.atanh")
UNARY(r_lgamma, "chlo.lgamma")
#undef UNARY

/* erfinv in f64 and rounded once: XLA's f32 approximation is a few ulps off
 * near +-1 (PyTorch's CPU kernel refines with Newton steps), and its
 * derivative exp(erfinv(x)^2) magnifies that. */
static void r_erfinv(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = x_in(e, n);
  tp_dtype dt = em_type(e, x)->dt;
  tp_val y = un(e, "chlo.erf_inv", dt == TP_F64 ? x : em_convert(e, x, TP_F64));
  o[0] = finish(e, n, em_convert(e, y, dt));
}

static void r_neg(tp_emit *e, const tp_node *n, tp_val *o) {
  if (OUT0->dt == TP_BOOL) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT,
                   "Negation, the `-` operator, on a bool tensor is not supported. If you are trying to invert a "
                   "mask, use the `~` or `logical_not()` operator instead.");
    return;
  }
  o[0] = finish(e, n, un(e, "stablehlo.negate", x_in(e, n)));
}

/* conj_physical: (re, -im) for complex inputs, the input itself otherwise. */
static void r_conj_physical(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = lw_value(e, n, 0);
  tp_type t = *em_type(e, x);
  if (isc(t.dt)) {
    tp_val parts[2];
    lw_complex_parts(e, x, &parts[0], &parts[1]);
    parts[1] = un(e, "stablehlo.negate", parts[1]);
    x = em_op(e, "stablehlo.complex", NULL, parts, 2, &t);
  }
  o[0] = finish(e, n, x);
}

/* complex(real, imag), and polar(abs, angle) = complex(abs cos(angle), abs
 * sin(angle)): parts broadcast to the output's shape in its real dtype (the
 * meta function has checked that both are float or double, alike). */
static void complex_of(tp_emit *e, const tp_node *n, tp_val *o, int polar) {
  if (!isc(OUT0->dt)) {
    o[0] = em_fail(e, TP_UNIMPLEMENTED, "%s: a %s result is not supported on tpu yet", n->op, tp_dtype_name(OUT0->dt));
    return;
  }
  tp_type pt = lw_out_as(n, 0, OUT0->dt == TP_C64 ? TP_F32 : TP_F64);
  tp_val parts[2] = {lw_operand(e, n, 0, &pt), lw_operand(e, n, 1, &pt)};
  if (polar) {
    tp_val r = parts[0], a = parts[1];
    parts[0] = mul(e, r, un(e, "stablehlo.cosine", a));
    parts[1] = mul(e, r, un(e, "stablehlo.sine", a));
  }
  tp_type t = lw_out_as(n, 0, OUT0->dt);
  o[0] = em_op(e, "stablehlo.complex", NULL, parts, 2, &t);
}
static void r_complex(tp_emit *e, const tp_node *n, tp_val *o) { complex_of(e, n, o, 0); }
static void r_polar(tp_emit *e, const tp_node *n, tp_val *o) { complex_of(e, n, o, 1); }

/* digamma(+-0) = -+inf (PyTorch, C++ and SciPy); chlo.digamma gives NaN there. */
tp_val lw_digamma(tp_emit *e, tp_val x) {
  tp_val at0 = un(e, "stablehlo.negate", dv(e, k(e, x, 1), x)); /* copysign(inf, -x) */
  return em_select(e, em_compare(e, "EQ", x, k(e, x, 0)), at0, un(e, "chlo.digamma", x));
}
static void r_digamma(tp_emit *e, const tp_node *n, tp_val *o) { o[0] = finish(e, n, lw_digamma(e, x_in(e, n))); }

/* abs: complex inputs give their magnitude (a real result); unsigned ints are their own. */
static void r_abs(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = lw_value(e, n, 0);
  const tp_type *t = em_type(e, x);
  if (isc(t->dt)) {
    o[0] = finish(e, n, lw_abs(e, x));
    return;
  }
  if (t->dt == TP_BOOL) {
    o[0] = lw_not_for(e, "abs_cpu", t->dt);
    return;
  }
  if (tp_dtype_is_unsigned(t->dt)) {
    o[0] = finish(e, n, x);
    return;
  }
  o[0] = finish(e, n, un(e, "stablehlo.abs", x_in(e, n)));
}

/* floor/ceil/round/trunc: integers are returned unchanged (PyTorch copies
 * them); bool is refused, as by PyTorch's CPU kernels. */
static int int_rounding(tp_emit *e, const tp_node *n, tp_val *o, const char *what) {
  tp_dtype dt = lw_dtype(e, n, 0);
  if (dt == TP_BOOL) {
    o[0] = lw_not_for(e, what, dt);
    return 1;
  }
  if (!isf(dt)) {
    o[0] = finish(e, n, lw_operand(e, n, 0, OUT0));
    return 1;
  }
  return 0;
}
static void r_floor(tp_emit *e, const tp_node *n, tp_val *o) {
  if (!int_rounding(e, n, o, "floor_vml_cpu")) o[0] = finish(e, n, un(e, "stablehlo.floor", x_in(e, n)));
}
static void r_ceil(tp_emit *e, const tp_node *n, tp_val *o) {
  if (!int_rounding(e, n, o, "ceil_vml_cpu")) o[0] = finish(e, n, un(e, "stablehlo.ceil", x_in(e, n)));
}
static tp_val trunc_f(tp_emit *e, tp_val x) {
  tp_val neg = em_compare(e, "LT", x, k(e, x, 0));
  return em_select(e, neg, un(e, "stablehlo.ceil", x), un(e, "stablehlo.floor", x));
}
static void r_trunc(tp_emit *e, const tp_node *n, tp_val *o) {
  if (!int_rounding(e, n, o, "trunc_vml_cpu")) o[0] = finish(e, n, trunc_f(e, x_in(e, n)));
}

/* round(x) rounds half to even; round(x, decimals) is PyTorch's
 * nearbyint(x * 10^d) / 10^d (or nearbyint(x / 10^-d) * 10^-d for d < 0),
 * which PyTorch refuses for integers. */
static void r_round(tp_emit *e, const tp_node *n, tp_val *o) {
  int has_dec = !strcmp(n->op, "aten::round.decimals");
  tp_dtype dt = lw_dtype(e, n, 0);
  if (has_dec && !isf(dt)) {
    o[0] = lw_not_for(e, "round_cpu", dt);
    return;
  }
  if (int_rounding(e, n, o, "round_vml_cpu")) return;
  tp_val x = x_in(e, n);
  int64_t dec = has_dec ? lw_int(n, 1, 0) : 0;
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

static void r_frac(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_dtype dt = lw_dtype(e, n, 0);
  if (!isf(dt)) {
    o[0] = lw_not_for(e, "frac_cpu", dt);
    return;
  }
  tp_val x = x_in(e, n);
  o[0] = finish(e, n, sub(e, x, trunc_f(e, x)));
}

/* sign: (0 < x) - (x < 0), so sign(NaN) = 0 and sign(-0.0) = 0 as in PyTorch. */
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
  if (!isf(dt)) {
    o[0] = finish(e, n, un(e, "stablehlo.sign", x));
    return;
  }
  tp_val zero = k(e, x, 0);
  tp_val s = em_select(e, em_compare(e, "LT", x, zero), k(e, x, -1), zero);
  o[0] = finish(e, n, em_select(e, em_compare(e, "GT", x, zero), k(e, x, 1), s));
}

/* signbit: the sign bit of floats (true for -0.0 and -NaN), x < 0 for ints. */
static void r_signbit(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = lw_value(e, n, 0);
  tp_type t = *em_type(e, x);
  if (isf(t.dt)) {
    t.dt = t.dt == TP_F64 ? TP_I64 : t.dt == TP_F32 ? TP_I32 : TP_I16;
    tp_val bits = em_bitcast(e, x, &t);
    o[0] = em_compare(e, "LT", bits, k(e, bits, 0));
  } else if (t.dt == TP_BOOL || tp_dtype_is_unsigned(t.dt)) {
    o[0] = em_full(e, 0, OUT0);
  } else if (tp_dtype_is_int(t.dt)) {
    o[0] = em_compare(e, "LT", x, k(e, x, 0));
  } else {
    o[0] = lw_not_for(e, "signbit_cpu", t.dt);
  }
}

static void r_reciprocal(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = x_in(e, n);
  o[0] = finish(e, n, dv(e, k(e, x, 1), x));
}

/* log2/log10 as log(x) / log(base), except that log2 of a power of two is
 * exact (its exponent), as with PyTorch's log2. */
static void r_log2(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = x_in(e, n);
  tp_val y = dv(e, un(e, "stablehlo.log", x), k(e, x, M_LN2));
  tp_type t = *em_type(e, x);
  if (t.dt == TP_F32 || t.dt == TP_F64) {
    int f64 = t.dt == TP_F64;
    t.dt = f64 ? TP_I64 : TP_I32;
    tp_val bits = em_bitcast(e, x, &t);
    tp_val mant = em_binary(e, "stablehlo.and", bits, k(e, bits, f64 ? (double)((1LL << 52) - 1) : (double)((1 << 23) - 1)));
    tp_val ex = em_binary(e, "stablehlo.shift_right_logical", bits, k(e, bits, f64 ? 52 : 23));
    tp_val exact = sub(e, ex, k(e, ex, f64 ? 1023 : 127));
    /* a positive normal power of two: zero mantissa, exponent field in (0, max) */
    tp_val pow2 = em_binary(e, "stablehlo.and", em_compare(e, "EQ", mant, k(e, mant, 0)),
                            em_binary(e, "stablehlo.and", em_compare(e, "GT", ex, k(e, ex, 0)),
                                      em_compare(e, "LT", ex, k(e, ex, f64 ? 2047 : 255))));
    y = em_select(e, pow2, em_convert(e, exact, em_type(e, x)->dt), y);
  }
  o[0] = finish(e, n, y);
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
  o[0] = isnan_(e, x);
}
static void r_isinf(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = lw_value(e, n, 0);
  if (isc(em_type(e, x)->dt)) { /* either part infinite */
    tp_val re, im;
    lw_complex_parts(e, x, &re, &im);
    o[0] = em_binary(e, "stablehlo.or", em_compare(e, "EQ", un(e, "stablehlo.abs", re), k(e, re, INFINITY)),
                     em_compare(e, "EQ", un(e, "stablehlo.abs", im), k(e, im, INFINITY)));
    return;
  }
  if (!isf(em_type(e, x)->dt)) {
    o[0] = em_full(e, 0, OUT0);
    return;
  }
  o[0] = em_compare(e, "EQ", un(e, "stablehlo.abs", x), k(e, x, INFINITY));
}
static void r_isfinite(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = lw_value(e, n, 0);
  if (!isf(em_type(e, x)->dt)) {
    o[0] = em_full(e, 1, OUT0);
    return;
  }
  o[0] = em_compare(e, "LT", un(e, "stablehlo.abs", x), k(e, x, INFINITY));
}

/* nan_to_num(x, nan=0, posinf=None, neginf=None): None means the dtype's
 * largest / lowest finite value. */
static void r_nan_to_num(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = lw_value(e, n, 0);
  tp_dtype dt = em_type(e, x)->dt;
  if (!isf(dt)) {
    o[0] = x;
    return;
  }
  double big = dt == TP_F64 ? 1.7976931348623157e308 : dt == TP_F32 ? 3.4028234663852886e38
               : dt == TP_BF16 ? 3.3895313892515355e38 : 65504.0;
  double nanv = lw_is_none(n, 1) ? 0.0 : lw_float(n, 1, 0.0);
  double pinf = lw_is_none(n, 2) ? big : lw_float(n, 2, big);
  double ninf = lw_is_none(n, 3) ? -big : lw_float(n, 3, -big);
  x = em_select(e, isnan_(e, x), k(e, x, nanv), x);
  x = em_select(e, em_compare(e, "EQ", x, k(e, x, INFINITY)), k(e, x, pinf), x);
  x = em_select(e, em_compare(e, "EQ", x, k(e, x, -INFINITY)), k(e, x, ninf), x);
  o[0] = x;
}

/* ---- activations ------------------------------------------------------------------ */

static int bool_input(tp_emit *e, const tp_node *n, tp_val *o, const char *msg) {
  if (lw_dtype(e, n, 0) != TP_BOOL) return 0;
  o[0] = em_fail(e, TP_UNIMPLEMENTED, "%s", msg);
  return 1;
}

/* relu = clamp_min(x, 0): NaN stays NaN. */
static void r_relu(tp_emit *e, const tp_node *n, tp_val *o) {
  if (bool_input(e, n, o, "Boolean inputs not supported for relu")) return;
  tp_val x = lw_operand(e, n, 0, OUT0);
  o[0] = fmaxmin(e, x, k(e, x, 0), 1);
}

/* threshold_backward(grad, self, threshold): self <= threshold ? 0 : grad,
 * compared in opmath like PyTorch (a bf16 0.1 is not <= the threshold 0.1). */
static void r_threshold_backward(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_type ct = ctype(n);
  tp_val g = opnd(e, n, 0, &ct), x = opnd(e, n, 1, &ct), t = lw_operand(e, n, 2, &ct);
  o[0] = finish(e, n, em_select(e, em_compare(e, "LE", x, t), k(e, g, 0), g));
}

/* threshold(self, threshold, value): self <= threshold ? value : self, in opmath. */
static void r_threshold(tp_emit *e, const tp_node *n, tp_val *o) {
  if (bool_input(e, n, o, "\"threshold_cpu\" not implemented for 'Bool'")) return;
  tp_type ct = ctype(n);
  tp_val x = opnd(e, n, 0, &ct), t = lw_operand(e, n, 1, &ct), v = lw_operand(e, n, 2, &ct);
  o[0] = finish(e, n, em_select(e, em_compare(e, "LE", x, t), v, x));
}

/* gelu(x) = x / 2 * lw_normal_cdf2(x), so gelu(-inf) = -inf * 0 = NaN like PyTorch.
 * tanh: PyTorch's formula. */
static void r_gelu(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = x_in(e, n);
  const char *approx = lw_str(n, 1, "none");
  tp_val y;
  if (!strcmp(approx, "tanh")) {
    tp_val inner = mul(e, k(e, x, sqrt(2.0 / M_PI)), add(e, x, mul(e, k(e, x, 0.044715), mul(e, x, mul(e, x, x)))));
    y = mul(e, mul(e, k(e, x, 0.5), x), add(e, k(e, x, 1), un(e, "stablehlo.tanh", inner)));
  } else if (!strcmp(approx, "none")) {
    y = mul(e, mul(e, x, k(e, x, 0.5)), lw_normal_cdf2(e, x));
  } else {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "approximate argument must be either none or tanh.");
    return;
  }
  o[0] = finish(e, n, y);
}

static void r_gelu_backward(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_type ct = ctype(n);
  tp_val g = opnd(e, n, 0, &ct), x = opnd(e, n, 1, &ct);
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
  } else if (!strcmp(approx, "none")) {
    tp_val cdf = mul(e, k(e, x, 0.5), lw_normal_cdf2(e, x));
    tp_val pdf = mul(e, un(e, "stablehlo.exponential", mul(e, k(e, x, -0.5), mul(e, x, x))), k(e, x, 0.3989422804014327));
    d = add(e, cdf, mul(e, x, pdf));
  } else {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "approximate argument must be either none or tanh.");
    return;
  }
  o[0] = finish(e, n, mul(e, g, d));
}

static void r_silu(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x = x_in(e, n);
  o[0] = finish(e, n, mul(e, x, un(e, "stablehlo.logistic", x)));
}
/* silu_backward: grad * s * (1 + x * (1 - s)), s = sigmoid(x) */
static void r_silu_backward(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_type ct = ctype(n);
  tp_val g = opnd(e, n, 0, &ct), x = opnd(e, n, 1, &ct);
  tp_val s = un(e, "stablehlo.logistic", x);
  o[0] = finish(e, n, mul(e, g, mul(e, s, add(e, k(e, x, 1), mul(e, x, sub(e, k(e, x, 1), s))))));
}
/* sigmoid_backward(grad, y) = grad * (1 - y) * y */
static void r_sigmoid_backward(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_type ct = ctype(n);
  tp_val g = opnd(e, n, 0, &ct), y = opnd(e, n, 1, &ct);
  o[0] = finish(e, n, mul(e, mul(e, g, sub(e, k(e, y, 1), y)), y));
}
/* tanh_backward(grad, y) = grad * (1 - y * y) */
static void r_tanh_backward(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_type ct = ctype(n);
  tp_val g = opnd(e, n, 0, &ct), y = opnd(e, n, 1, &ct);
  o[0] = finish(e, n, mul(e, g, sub(e, k(e, y, 1), mul(e, y, y))));
}
/* leaky_relu(x, slope) = x > 0 ? x : x * slope */
static void r_leaky_relu(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_type ct = ctype(n);
  tp_val x = opnd(e, n, 0, &ct), s = lw_operand(e, n, 1, &ct);
  o[0] = finish(e, n, em_select(e, em_compare(e, "GT", x, k(e, x, 0)), x, mul(e, x, s)));
}
/* hardtanh = clamp(x, min_val, max_val), NaN-propagating. */
static void r_hardtanh(tp_emit *e, const tp_node *n, tp_val *o) {
  if (bool_input(e, n, o, "Bool inputs not supported for hardtanh")) return;
  tp_type ct = ctype(n);
  tp_val x = opnd(e, n, 0, &ct), lo = lw_operand(e, n, 1, &ct), hi = lw_operand(e, n, 2, &ct);
  o[0] = finish(e, n, fmaxmin(e, fmaxmin(e, x, lo, 1), hi, 0));
}

/* hardtanh_backward(grad, self, min_val, max_val): self <= min || self >= max
 * ? 0 : grad, compared in opmath (PyTorch's scalar CPU and CUDA kernels;
 * its vectorised f32 CPU path gives 0 instead of grad at NaN). */
static void r_hardtanh_backward(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_type ct = ctype(n);
  tp_val g = opnd(e, n, 0, &ct), x = opnd(e, n, 1, &ct);
  tp_val lo = lw_operand(e, n, 2, &ct), hi = lw_operand(e, n, 3, &ct);
  tp_val out = em_binary(e, "stablehlo.or", em_compare(e, "LE", x, lo), em_compare(e, "GE", x, hi));
  o[0] = finish(e, n, em_select(e, out, k(e, g, 0), g));
}

/* ---- copies and fills ---------------------------------------------------------------- */

/* A float value converted to integer dtype dt the way PyTorch's CPU casts
 * do on x86-64: through int64 for uint8 (PyTorch's documented choice: -1.0
 * -> 255), uint16/uint32 and int64; through int32 (the hardware truncating
 * conversion) for int8/int16/int32, the narrower types wrapping; NaN, inf and
 * out-of-range values give the intermediate type's INT_MIN (x86's "integer
 * indefinite" value).  XLA's convert saturates instead and maps NaN to 0.
 * uint64 keeps XLA's conversion. */
static tp_val float_to_int(tp_emit *e, tp_val x, tp_dtype dt) {
  if (dt == TP_U64) return em_convert(e, x, dt);
  tp_dtype via = (dt == TP_I64 || dt == TP_U8 || dt == TP_U32) ? TP_I64 : TP_I32;
  if (em_type(e, x)->dt != TP_F64) x = em_convert(e, x, TP_F32);
  double lim = via == TP_I64 ? 9223372036854775808.0 : 2147483648.0;
  tp_val r = em_convert(e, x, via);
  tp_val ok = em_compare(e, "LT", un(e, "stablehlo.abs", x), k(e, x, lim));
  r = em_select(e, ok, r, k(e, r, -lim));
  return em_convert(e, r, dt);
}

/* Argument i converted (with copy_ semantics) to dtype t->dt and broadcast to t. */
static tp_val copy_operand(tp_emit *e, const tp_node *n, int i, const tp_type *t) {
  const tp_arg *a = lw_arg(n, i);
  if (a->kind == TP_ARG_TENSOR && tp_dtype_is_int(t->dt)) {
    tp_val v = a->v;
    tp_dtype from = em_type(e, v)->dt;
    if (isc(from)) v = em_convert(e, v, from == TP_C64 ? TP_F32 : TP_F64); /* the real part */
    if (isf(em_type(e, v)->dt)) return em_bcast_to(e, float_to_int(e, v, t->dt), t->rank, t->dims);
  }
  /* bool -> float through u8 (see opnd): in a compiled graph the copy may
   * feed a multiply, as in mask.float() * x. */
  return opnd(e, n, i, t);
}

/* tp::copy(src) -> out: convert and broadcast (copy_ semantics). */
static void r_copy(tp_emit *e, const tp_node *n, tp_val *o) { o[0] = copy_operand(e, n, 0, OUT0); }
/* copy(self, src, non_blocking): functional copy_ */
static void r_copy2(tp_emit *e, const tp_node *n, tp_val *o) { o[0] = copy_operand(e, n, 1, OUT0); }
static void r_fill(tp_emit *e, const tp_node *n, tp_val *o) { o[0] = copy_operand(e, n, 1, OUT0); }
static void r_zero(tp_emit *e, const tp_node *n, tp_val *o) { o[0] = em_full(e, 0, OUT0); }
static void r_full(tp_emit *e, const tp_node *n, tp_val *o) { o[0] = lw_operand(e, n, 1, OUT0); }

/* Factories (compiled graphs contain them; eager mode fills allocated outputs). */
static void r_ones(tp_emit *e, const tp_node *n, tp_val *o) { o[0] = em_full(e, 1, OUT0); }
static void r_scalar_tensor(tp_emit *e, const tp_node *n, tp_val *o) { o[0] = lw_operand(e, n, 0, OUT0); }
static void r_new_full(tp_emit *e, const tp_node *n, tp_val *o) { o[0] = lw_operand(e, n, 2, OUT0); }

const tp_lower_entry tp_lower_elementwise[] = {
    {"aten::empty.memory_format", r_zero, 0},
    {"aten::empty_strided", r_zero, 0},
    {"aten::empty_permuted", r_zero, 0},
    {"aten::empty_like", r_zero, 0},
    {"aten::new_empty", r_zero, 0},
    {"aten::new_empty_strided", r_zero, 0},
    {"aten::zeros", r_zero, 0},
    {"aten::zeros_like", r_zero, 0},
    {"aten::new_zeros", r_zero, 0},
    {"aten::ones", r_ones, 0},
    {"aten::ones_like", r_ones, 0},
    {"aten::new_ones", r_ones, 0},
    {"aten::full", r_full, TP_FITS(1)},
    {"aten::new_full", r_new_full, 0},
    {"aten::scalar_tensor", r_scalar_tensor, 0},
    {"tp::copy", r_copy, 0},
    {"aten::clone", r_copy, 0},
    {"aten::_to_copy", r_copy, 0},
    {"prims::convert_element_type", r_copy, 0}, /* (a, dtype): Dynamo's .item() of a captured float leaves it in graphs */
    {"aten::copy", r_copy2, 0},
    {"aten::fill.Scalar", r_fill, TP_FITS(1)},
    {"aten::fill.Tensor", r_fill, 0},
    {"aten::fill_.Scalar", r_fill, TP_FITS(1)},
    {"aten::fill_.Tensor", r_fill, 0},
    {"aten::zero", r_zero, 0},
    {"aten::zero_", r_zero, 0},
    {"aten::full_like", r_full, 0},
    {"aten::add.Tensor", r_add, 0},
    {"aten::add.Scalar", r_add, 0},
    {"aten::sub.Tensor", r_sub, 0},
    {"aten::sub.Scalar", r_sub, 0},
    {"aten::rsub.Tensor", r_rsub, 0},
    {"aten::rsub.Scalar", r_rsub, 0},
    {"aten::mul.Tensor", r_mul, 0},
    {"aten::mul.Scalar", r_mul, 0},
    {"aten::div.Tensor", r_div, 0},
    {"aten::div.Scalar", r_div, 0},
    {"aten::div.Tensor_mode", r_div, 0},
    {"aten::div.Scalar_mode", r_div, 0},
    {"aten::floor_divide", r_floor_divide, 0},
    {"aten::floor_divide.Scalar", r_floor_divide, 0},
    {"aten::remainder.Tensor", r_remainder, 0},
    {"aten::remainder.Scalar", r_remainder, 0},
    {"aten::remainder.Scalar_Tensor", r_remainder, 0},
    {"aten::fmod.Tensor", r_fmod, 0},
    {"aten::fmod.Scalar", r_fmod, 0},
    {"aten::pow.Tensor_Tensor", r_pow, 0},
    {"aten::pow.Tensor_Scalar", r_pow, 0},
    {"aten::pow.Scalar", r_pow, 0},
    {"aten::maximum", r_maximum, 0},
    {"aten::minimum", r_minimum, 0},
    {"aten::atan2", r_atan2, 0},
    {"aten::bitwise_and.Tensor", r_band, 0},
    {"aten::bitwise_and.Scalar", r_band, 0},
    {"aten::bitwise_and.Scalar_Tensor", r_band, 0},
    {"aten::bitwise_or.Tensor", r_bor, 0},
    {"aten::bitwise_or.Scalar", r_bor, 0},
    {"aten::bitwise_or.Scalar_Tensor", r_bor, 0},
    {"aten::bitwise_xor.Tensor", r_bxor, 0},
    {"aten::bitwise_xor.Scalar", r_bxor, 0},
    {"aten::bitwise_xor.Scalar_Tensor", r_bxor, 0},
    {"aten::bitwise_not", r_bnot, 0},
    {"aten::logical_and", r_land, 0},
    {"aten::logical_or", r_lor, 0},
    {"aten::logical_xor", r_lxor, 0},
    {"aten::logical_not", r_lnot, 0},
    {"aten::eq.Tensor", r_eq, 0},
    {"aten::eq.Scalar", r_eq, 0},
    {"aten::ne.Tensor", r_ne, 0},
    {"aten::ne.Scalar", r_ne, 0},
    {"aten::lt.Tensor", r_lt, 0},
    {"aten::lt.Scalar", r_lt, 0},
    {"aten::le.Tensor", r_le, 0},
    {"aten::le.Scalar", r_le, 0},
    {"aten::gt.Tensor", r_gt, 0},
    {"aten::gt.Scalar", r_gt, 0},
    {"aten::ge.Tensor", r_ge, 0},
    {"aten::ge.Scalar", r_ge, 0},
    {"aten::where.self", r_where, 0},
    {"aten::masked_fill.Scalar", r_masked_fill, TP_FITS(2)},
    {"aten::masked_fill.Tensor", r_masked_fill, 0},
    {"aten::clamp", r_clamp, TP_FITS(1) | TP_FITS(2)},
    {"aten::clamp.Tensor", r_clamp, 0},
    {"aten::clamp_min", r_clamp_min, TP_FITS(1)},
    {"aten::clamp_min.Tensor", r_clamp_min, 0},
    {"aten::clamp_max", r_clamp_max, TP_FITS(1)},
    {"aten::clamp_max.Tensor", r_clamp_max, 0},
    {"aten::lerp.Scalar", r_lerp, 0},
    {"aten::lerp.Tensor", r_lerp, 0},
    {"aten::addcmul", r_addcmul, 0},
    {"aten::addcdiv", r_addcdiv, 0},
    {"prims::fma", r_fma, 0},
    {"aten::exp", r_exp, 0},
    {"aten::expm1", r_expm1, 0},
    {"aten::exp2", r_exp2, 0},
    {"aten::log", r_log, 0},
    {"aten::log1p", r_log1p, 0},
    {"aten::log2", r_log2, 0},
    {"aten::log10", r_log10, 0},
    {"aten::sqrt", r_sqrt, 0},
    {"aten::rsqrt", r_rsqrt, 0},
    {"aten::sin", r_sin, 0},
    {"aten::cos", r_cos, 0},
    {"aten::tan", r_tan, 0},
    {"aten::tanh", r_tanh, 0},
    {"aten::asin", r_asin, 0},
    {"aten::acos", r_acos, 0},
    {"aten::atan", r_atan, 0},
    {"aten::sinh", r_sinh, 0},
    {"aten::cosh", r_cosh, 0},
    {"aten::asinh", r_asinh, 0},
    {"aten::acosh", r_acosh, 0},
    {"aten::atanh", r_atanh, 0},
    {"aten::sigmoid", r_sigmoid, 0},
    {"aten::abs", r_abs, 0},
    {"aten::neg", r_neg, 0},
    {"aten::conj_physical", r_conj_physical, 0},
    {"aten::_conj", r_conj_physical, 0}, /* graphs: values, not conjugate-bit views */
    {"aten::_neg_view", r_neg, 0},
    {"aten::complex", r_complex, 0},
    {"aten::polar", r_polar, 0},
    {"aten::sign", r_sign, 0},
    {"aten::floor", r_floor, 0},
    {"aten::ceil", r_ceil, 0},
    {"aten::round", r_round, 0},
    {"aten::round.decimals", r_round, 0},
    {"aten::trunc", r_trunc, 0},
    {"aten::frac", r_frac, 0},
    {"aten::reciprocal", r_reciprocal, 0},
    {"aten::square", r_square, 0},
    {"aten::erf", r_erf, 0},
    {"aten::erfinv", r_erfinv, 0},
    {"aten::lgamma", r_lgamma, 0},
    {"aten::digamma", r_digamma, 0},
    {"aten::signbit", r_signbit, 0},
    {"aten::isnan", r_isnan, 0},
    {"aten::isinf", r_isinf, 0},
    {"aten::isfinite", r_isfinite, 0},
    {"aten::nan_to_num", r_nan_to_num, 0},
    {"aten::relu", r_relu, 0},
    {"aten::threshold", r_threshold, 0},
    {"aten::threshold_backward", r_threshold_backward, 0},
    {"aten::gelu", r_gelu, 0},
    {"aten::gelu_backward", r_gelu_backward, 0},
    {"aten::silu", r_silu, 0},
    {"aten::silu_backward", r_silu_backward, 0},
    {"aten::sigmoid_backward", r_sigmoid_backward, 0},
    {"aten::tanh_backward", r_tanh_backward, 0},
    {"aten::leaky_relu", r_leaky_relu, 0},
    {"aten::hardtanh", r_hardtanh, 0},
    {"aten::hardtanh_backward", r_hardtanh_backward, 0},
    {NULL, NULL, 0},
};

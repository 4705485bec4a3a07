/* lower_fft.c - discrete Fourier transforms: aten::_fft_c2c, _fft_r2c and
 * _fft_c2r, the three ops every torch.fft function ends in.
 *
 * Conventions (see lower.h): arguments arrive in schema order; outputs have
 * the shapes and dtypes PyTorch's meta functions computed (n->outs).
 *
 * stablehlo.fft transforms the trailing len(fft_length) dims (at most 3).
 * ATen passes any list of dims, so each pass moves its dims to the end (in
 * the listed order), transforms, and moves them back; longer lists take
 * several passes (the transforms are separable).
 *
 * Normalization is ATen's fft_norm_mode, applied as the op says whatever the
 * direction (the torch.fft front end has already mapped norm= and the
 * direction to it): 0 none, 1 by 1/sqrt(n), 2 by 1/n, n the product of the
 * signal sizes over `dim` (the input's for c2c and r2c, the output's for
 * c2r).  XLA's inverse transforms (IFFT, IRFFT) divide by their length
 * themselves, which the final scale undoes.
 *
 * c2r follows PyTorch's CPU kernels (MKL and pocketfft alike): a c2c inverse
 * over all dims but the last, then a one-dimensional c2r on the last, so
 * inputs that are not exactly Hermitian give the CPU's values. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "lower_util.h"

#define OUT0 (&n->outs[0])
#define FFT_MAX_DIMS 3 /* stablehlo.fft transforms at most 3 dims at once */

static tp_dtype real_of(tp_dtype d) { return d == TP_C128 ? TP_F64 : TP_F32; }
static tp_dtype complex_of(tp_dtype d) { return d == TP_F64 ? TP_C128 : TP_C64; }

/* One stablehlo.fft of kind `kind` over dims[0..k) of x (1 <= k <= 3, in
 * that order).  IRFFT: the last transformed dim of the result has length
 * `irfft_len` (x holds irfft_len/2+1 entries there). */
static tp_val fft_pass(tp_emit *e, tp_val x, const int *dims, int k, const char *kind, int64_t irfft_len) {
  if (em_failed(e)) return -1;
  tp_type xt = *em_type(e, x);
  int r = xt.rank;
  int64_t perm[TP_MAX_RANK], inv[TP_MAX_RANK];
  int moved[TP_MAX_RANK] = {0};
  int p = 0;
  for (int i = 0; i < k; i++) moved[dims[i]] = 1;
  for (int d = 0; d < r; d++)
    if (!moved[d]) perm[p++] = d;
  for (int i = 0; i < k; i++) perm[p++] = dims[i];
  for (int i = 0; i < r; i++) inv[perm[i]] = i;
  x = em_transpose(e, x, perm);
  tp_type mt = *em_type(e, x);

  tp_type ot = mt;
  int64_t len[FFT_MAX_DIMS];
  for (int i = 0; i < k; i++) len[i] = mt.dims[r - k + i];
  if (!strcmp(kind, "RFFT")) {
    ot.dt = complex_of(mt.dt);
    ot.dims[r - 1] = mt.dims[r - 1] / 2 + 1;
  } else if (!strcmp(kind, "IRFFT")) {
    ot.dt = real_of(mt.dt);
    ot.dims[r - 1] = irfft_len;
    len[k - 1] = irfft_len;
  }
  char attrs[256];
  int at = snprintf(attrs, sizeof attrs, "fft_type = #stablehlo<fft_type %s>, fft_length = array<i64: ", kind);
  for (int i = 0; i < k; i++)
    at += snprintf(attrs + at, sizeof attrs - (size_t)at, "%s%lld", i ? ", " : "", (long long)len[i]);
  snprintf(attrs + at, sizeof attrs - (size_t)at, ">");
  tp_val y = em_op(e, "stablehlo.fft", attrs, &x, 1, &ot);
  return em_transpose(e, y, inv);
}

/* c2c passes (FFT or IFFT) over dims[0..k), at most 3 dims each. */
static tp_val fft_passes(tp_emit *e, tp_val x, const int *dims, int k, const char *kind) {
  for (int i = 0; i < k; i += FFT_MAX_DIMS) {
    int m = k - i < FFT_MAX_DIMS ? k - i : FFT_MAX_DIMS;
    x = fft_pass(e, x, dims + i, m, kind, 0);
  }
  return x;
}

/* x * s for a real constant s; complex x: each part scaled (a complex
 * multiply by (s, 0) would turn inf parts into NaN). */
static tp_val scale_by(tp_emit *e, tp_val x, double s) {
  if (s == 1.0 || em_failed(e)) return x;
  tp_type t = *em_type(e, x);
  if (!tp_dtype_is_complex(t.dt)) return em_binary(e, "stablehlo.multiply", x, em_full(e, s, &t));
  tp_type pt = t;
  pt.dt = real_of(t.dt);
  tp_val c = em_full(e, s, &pt);
  tp_val parts[2] = {em_binary(e, "stablehlo.multiply", em_op(e, "stablehlo.real", NULL, &x, 1, &pt), c),
                     em_binary(e, "stablehlo.multiply", em_op(e, "stablehlo.imag", NULL, &x, 1, &pt), c)};
  return em_op(e, "stablehlo.complex", NULL, parts, 2, &t);
}

/* The factor that turns XLA's result into ATen's: ATen's norm factor for
 * signal size n, times n where XLA's inverse transform divided by n. */
static double norm_factor(int64_t normalization, int64_t n, int xla_inverse) {
  double dn = (double)n;
  double f = normalization == 1 ? 1.0 / sqrt(dn) : normalization == 2 ? 1.0 / dn : 1.0;
  if (!xla_inverse) return f;
  return normalization == 1 ? sqrt(dn) : normalization == 2 ? 1.0 : dn;
}

/* Reads the common arguments (self, dim, normalization); fills dims[]
 * (wrapped, checked) and checks self's dtype: complex for c2c/c2r
 * (complex_in), float32/float64 for r2c, as PyTorch's CPU kernels.
 * Returns the number of dims, or -1 after em_fail. */
static int fft_args(tp_emit *e, const tp_node *n, const char *name, int complex_in, tp_val *x, int *dims,
                    int64_t *norm) {
  const tp_arg *a = lw_arg(n, 0);
  if (a->kind != TP_ARG_TENSOR) return (int)em_fail(e, TP_INVALID_ARGUMENT, "%s: expected a tensor input", n->op);
  *x = a->v;
  int r = em_type(e, *x)->rank;
  const int64_t *dl;
  int k = lw_ints(n, 1, &dl);
  int seen[TP_MAX_RANK] = {0};
  for (int i = 0; i < k; i++) {
    int d = lw_dim(dl[i], r);
    if (d < 0 || d >= r || r == 0)
      return (int)em_fail(e, TP_OUT_OF_RANGE, "%s: dim %lld out of range for a %d-d tensor", n->op, (long long)dl[i], r);
    if (seen[d]) return (int)em_fail(e, TP_INVALID_ARGUMENT, "%s: dim %d appears more than once", n->op, d);
    seen[d] = 1;
    dims[i] = d;
  }
  *norm = lw_int(n, 2, 0);
  if (*norm < 0 || *norm > 2)
    return (int)em_fail(e, TP_INVALID_ARGUMENT, "%s: unsupported normalization type %lld", n->op, (long long)*norm);
  tp_dtype dt = em_type(e, *x)->dt;
  if (complex_in && !tp_dtype_is_complex(dt))
    return (int)em_fail(e, TP_INVALID_ARGUMENT, "%s: expected a complex input, got %s", name, tp_scalar_type_name(dt));
  if (!complex_in && dt != TP_F32 && dt != TP_F64)
    return (int)em_fail(e, TP_INVALID_ARGUMENT, "%s: FFT doesn't support tensors of type: %s", name,
                        tp_scalar_type_name(dt));
  return k;
}

static int64_t signal_numel(const tp_type *t, const int *dims, int k) {
  int64_t s = 1;
  for (int i = 0; i < k; i++) s *= t->dims[dims[i]];
  return s;
}

/* _fft_c2c(Tensor self, SymInt[] dim, int normalization, bool forward) */
static void r_fft_c2c(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x;
  int dims[TP_MAX_RANK];
  int64_t norm;
  int k = fft_args(e, n, "_fft_c2c", 1, &x, dims, &norm);
  if (k < 0) return;
  tp_type xt = *em_type(e, x);
  if (k == 0 || tp_type_numel(&xt) == 0) { /* no transform: a copy (scaled by 1) */
    o[0] = tp_type_numel(OUT0) ? x : em_full(e, 0, OUT0);
    return;
  }
  int forward = lw_bool(n, 3, 1);
  x = fft_passes(e, x, dims, k, forward ? "FFT" : "IFFT");
  o[0] = scale_by(e, x, norm_factor(norm, signal_numel(&xt, dims, k), !forward));
}

/* _fft_r2c(Tensor self, int[] dim, int normalization, bool onesided) */
static void r_fft_r2c(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x;
  int dims[TP_MAX_RANK];
  int64_t norm;
  int k = fft_args(e, n, "_fft_r2c", 0, &x, dims, &norm);
  if (k < 0) return;
  tp_type xt = *em_type(e, x);
  if (k == 0) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "_fft_r2c: expected at least one dim to transform");
    return;
  }
  if (tp_type_numel(OUT0) == 0 || tp_type_numel(&xt) == 0) { /* empty sums are zero */
    o[0] = em_full(e, 0, OUT0);
    return;
  }
  if (lw_bool(n, 3, 1)) {
    /* RFFT over the last (up to 3) dims, the one-sided dim last; then FFT over the others */
    int m = k < FFT_MAX_DIMS ? k : FFT_MAX_DIMS;
    x = fft_pass(e, x, dims + (k - m), m, "RFFT", 0);
    x = fft_passes(e, x, dims, k - m, "FFT");
  } else {
    /* the full spectrum: a c2c transform of the input as complex */
    x = fft_passes(e, em_convert(e, x, complex_of(xt.dt)), dims, k, "FFT");
  }
  o[0] = scale_by(e, x, norm_factor(norm, signal_numel(&xt, dims, k), 0));
}

/* _fft_c2r(Tensor self, int[] dim, int normalization, SymInt last_dim_size):
 * the last dim of the input holds last_dim_size/2+1 entries (more are
 * ignored, fewer read as zeros). */
static void r_fft_c2r(tp_emit *e, const tp_node *n, tp_val *o) {
  tp_val x;
  int dims[TP_MAX_RANK];
  int64_t norm;
  int k = fft_args(e, n, "_fft_c2r", 1, &x, dims, &norm);
  if (k < 0) return;
  tp_type xt = *em_type(e, x);
  if (k == 0) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "_fft_c2r: expected at least one dim to transform");
    return;
  }
  int last = dims[k - 1];
  int64_t len = lw_int(n, 3, 0);
  if (len < 1) {
    o[0] = em_fail(e, TP_INVALID_ARGUMENT, "_fft_c2r: invalid number of data points (%lld) specified", (long long)len);
    return;
  }
  if (tp_type_numel(OUT0) == 0) {
    o[0] = em_full(e, 0, OUT0);
    return;
  }
  int64_t half = len / 2 + 1, have = xt.dims[last];
  if (have > half) {
    int64_t start[TP_MAX_RANK] = {0}, limit[TP_MAX_RANK], stride[TP_MAX_RANK];
    for (int d = 0; d < xt.rank; d++) limit[d] = xt.dims[d], stride[d] = 1;
    limit[last] = half;
    x = em_slice(e, x, start, limit, stride);
  } else if (have < half) {
    int64_t lo[TP_MAX_RANK] = {0}, hi[TP_MAX_RANK] = {0}, in[TP_MAX_RANK] = {0};
    hi[last] = half - have;
    x = em_pad(e, x, em_const(e, 0, xt.dt), lo, hi, in);
  }
  x = fft_passes(e, x, dims, k - 1, "IFFT");
  x = fft_pass(e, x, &last, 1, "IRFFT", len);
  o[0] = scale_by(e, x, norm_factor(norm, signal_numel(OUT0, dims, k), 1));
}

const tp_lower_entry tp_lower_fft[] = {
    {"aten::_fft_c2c", r_fft_c2c, 0},
    {"aten::_fft_r2c", r_fft_r2c, 0},
    {"aten::_fft_c2r", r_fft_c2r, 0},
    {NULL, NULL, 0},
};

/* lower.c - the lowering table and the helpers rules share.
 *
 * The table is the union of the per-family fragments listed in
 * k_fragments; a name may appear once.  Lookup is a binary search over a
 * sorted index built once (under pthread_once). */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph.h"
#include "lower_util.h"

/* Compiled graphs run through the eager engine as one pseudo-op. */
static const tp_lower_entry k_internal[] = {
    {"tp::graph", tp_graph_lower, 0},
    {NULL, NULL, 0},
};

static const tp_lower_entry *const k_fragments[] = {
    k_internal, tp_lower_elementwise, tp_lower_view, tp_lower_reduce, tp_lower_shape, tp_lower_nn, tp_lower_random,
    tp_lower_special,
    tp_lower_linalg,
    tp_lower_misc,
    tp_lower_fft,
};

static const tp_lower_entry **g_sorted;
static const char **g_names;
static size_t g_count;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static int cmp_entry(const void *a, const void *b) {
  return strcmp((*(const tp_lower_entry *const *)a)->name, (*(const tp_lower_entry *const *)b)->name);
}

static void build_index(void) {
  size_t n = 0;
  for (size_t f = 0; f < sizeof k_fragments / sizeof k_fragments[0]; f++)
    for (const tp_lower_entry *e = k_fragments[f]; e->name; e++) n++;
  g_sorted = calloc(n + 1, sizeof *g_sorted);
  g_names = calloc(n + 1, sizeof *g_names);
  if (!g_sorted || !g_names) return;
  for (size_t f = 0; f < sizeof k_fragments / sizeof k_fragments[0]; f++)
    for (const tp_lower_entry *e = k_fragments[f]; e->name; e++) g_sorted[g_count++] = e;
  qsort(g_sorted, g_count, sizeof *g_sorted, cmp_entry);
  for (size_t i = 0; i < g_count; i++) g_names[i] = g_sorted[i]->name;
}

tp_lower_fn tp_lower_find_ex(const char *op, unsigned *flags) {
  pthread_once(&g_once, build_index);
  size_t lo = 0, hi = g_count;
  *flags = 0;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    int c = strcmp(g_sorted[mid]->name, op);
    if (c == 0) {
      *flags = g_sorted[mid]->flags;
      return g_sorted[mid]->fn;
    }
    if (c < 0) lo = mid + 1;
    else hi = mid;
  }
  return NULL;
}

/* Ops PyTorch's CPU kernels refuse for complex inputs, with their messages
 * (a dispatch macro's "<kernel>" not implemented for 'ComplexFloat', else the
 * message as it is).  Their rules would compute something for the real parts,
 * or crash XLA (remainder, fmod): tp_lower_run refuses them first. */
typedef struct complex_refusal {
  const char *op; /* base name: "aten::X" of every overload, and "aten::X_" */
  tp_code code;
  const char *kernel, *msg;
} complex_refusal;

#define MACRO(op, kernel) {op, TP_UNIMPLEMENTED, kernel, NULL}
static const complex_refusal k_no_complex[] = {
    {"ceil", TP_UNIMPLEMENTED, NULL, "ceil is not supported for complex inputs"},
    {"floor", TP_UNIMPLEMENTED, NULL, "floor is not supported for complex inputs"},
    {"trunc", TP_UNIMPLEMENTED, NULL, "trunc is not supported for complex inputs"},
    {"sign", TP_UNIMPLEMENTED, NULL,
     "Unlike NumPy, torch.sign is not intended to support complex numbers. Please use torch.sgn instead."},
    {"clamp", TP_UNIMPLEMENTED, NULL, "clamp is not supported for complex types"},
    {"clamp_min", TP_UNIMPLEMENTED, NULL, "clamp is not supported for complex types"},
    {"clamp_max", TP_UNIMPLEMENTED, NULL, "clamp is not supported for complex types"},
    {"hardtanh", TP_UNIMPLEMENTED, NULL, "clamp is not supported for complex types"},
    {"relu", TP_UNIMPLEMENTED, NULL, "clamp is not supported for complex types"},
    {"maximum", TP_INVALID_ARGUMENT, NULL, "maximum not implemented for complex tensors."},
    {"minimum", TP_INVALID_ARGUMENT, NULL, "minimum not implemented for complex tensors."},
    MACRO("round", "round_vml_cpu"),
    MACRO("elu", "elu_cpu"),
    MACRO("leaky_relu", "leaky_relu_cpu"),
    MACRO("rrelu_with_noise", "rrelu_with_noise_out_cpu"),
    MACRO("hardshrink", "hardshrink_cpu"),
    MACRO("logit", "logit_cpu"),
    MACRO("erfinv", "erfinv_vml_cpu"),
    MACRO("xlogy", "xlogy_cpu"),
    MACRO("lt", "lt_cpu"),
    MACRO("le", "le_cpu"),
    MACRO("gt", "gt_cpu"),
    MACRO("ge", "ge_cpu"),
    MACRO("max_pool2d_with_indices", "max_pool2d"),
    MACRO("max_pool3d_with_indices", "max_pool3d"),
    MACRO("avg_pool2d", "avg_pool2d"),
    MACRO("avg_pool3d", "avg_pool3d"),
    MACRO("native_group_norm", "GroupNormKernelImpl"),
    MACRO("fmod", "fmod_cpu"),
    MACRO("remainder", "remainder_cpu"),
    MACRO("gelu", "GeluKernelImpl"),
    MACRO("atan2", "atan2_cpu"),
    MACRO("softplus", "softplus_cpu"),
    MACRO("mish", "mish_cpu"),
    MACRO("hardswish", "hardswish_cpu"),
    MACRO("hardsigmoid", "hardsigmoid_cpu"),
    MACRO("threshold", "threshold_cpu"),
    MACRO("searchsorted", "searchsorted_out_cpu"),
    MACRO("bucketize", "searchsorted_out_cpu"),
    MACRO("_softmax", "softmax_kernel_impl"),
    MACRO("_log_softmax", "log_softmax_kernel_impl"),
};
#undef MACRO

/* The dtype of the node's first complex tensor argument, or TP_DTYPE_INVALID. */
static tp_dtype complex_arg(tp_emit *e, const tp_node *n) {
  for (int i = 0; i < n->nargs; i++) {
    const tp_arg *a = lw_arg(n, i);
    if (a->kind == TP_ARG_TENSOR && tp_dtype_is_complex(em_type(e, a->v)->dt)) return em_type(e, a->v)->dt;
  }
  return TP_DTYPE_INVALID;
}

static tp_val refuse_complex(tp_emit *e, const tp_node *n) {
  tp_dtype cd = complex_arg(e, n);
  if (strncmp(n->op, "aten::", 6) || cd == TP_DTYPE_INVALID) return 0;
  const char *base = n->op + 6;
  size_t len = strcspn(base, ".");
  if (len > 1 && base[len - 1] == '_' && base[0] != '_') len--; /* in-place forms */
  const char *mode = !strncmp(base, "div", len) && len == 3 ? lw_str(n, 2, NULL) : NULL;
  if (mode) /* div with rounding_mode */
    return em_fail(e, TP_UNIMPLEMENTED, "\"div_%s_cpu\" not implemented for '%s'", mode, tp_scalar_type_name(cd));
  for (size_t k = 0; k < sizeof k_no_complex / sizeof k_no_complex[0]; k++) {
    const complex_refusal *r = &k_no_complex[k];
    if (strlen(r->op) != len || strncmp(r->op, base, len)) continue;
    if (r->kernel) return em_fail(e, r->code, "\"%s\" not implemented for '%s'", r->kernel, tp_scalar_type_name(cd));
    return em_fail(e, r->code, "%s", r->msg);
  }
  return 0;
}

void tp_lower_run(tp_lower_fn fn, tp_emit *e, const tp_node *n, tp_val *out) {
  if (em_failed(e) || refuse_complex(e, n) < 0) return;
  const char *outer = em_set_op(e, n->op);
  fn(e, n, out);
  em_set_op(e, outer);
}

tp_lower_fn tp_lower_find(const char *op) {
  unsigned fits;
  return tp_lower_find_ex(op, &fits);
}

const char *const *tp_lower_names(void) {
  pthread_once(&g_once, build_index);
  static const char *empty[1] = {NULL};
  return g_names ? g_names : empty;
}

/* ---- arguments ------------------------------------------------------------- */

static const tp_arg k_none = {.kind = TP_ARG_NONE};

tp_val tp_scalar_to_real(tp_emit *e, tp_dtype dt) {
  const char *name = dt == TP_F32 ? "float" : dt == TP_F64 ? "double" : dt == TP_I64 ? "int64_t" : tp_dtype_name(dt);
  return em_fail(e, TP_INVALID_ARGUMENT, "value cannot be converted to type %s without overflow", name);
}

const tp_arg *lw_arg(const tp_node *n, int i) { return (i >= 0 && i < n->nargs) ? &n->args[i] : &k_none; }
int lw_is_none(const tp_node *n, int i) { return lw_arg(n, i)->kind == TP_ARG_NONE; }

int64_t lw_int(const tp_node *n, int i, int64_t def) {
  const tp_arg *a = lw_arg(n, i);
  if (a->kind == TP_ARG_INT || a->kind == TP_ARG_BOOL) return a->i;
  if (a->kind == TP_ARG_SCALAR) return tp_dtype_is_float(a->sdt) ? (int64_t)a->f : a->i;
  if (a->kind == TP_ARG_INTS && a->n == 1) return a->ints[0];
  return def;
}

double lw_float(const tp_node *n, int i, double def) {
  const tp_arg *a = lw_arg(n, i);
  if (a->kind == TP_ARG_FLOAT) return a->f;
  if (a->kind == TP_ARG_INT || a->kind == TP_ARG_BOOL) return (double)a->i;
  return def;
}

int lw_bool(const tp_node *n, int i, int def) {
  const tp_arg *a = lw_arg(n, i);
  return (a->kind == TP_ARG_BOOL || a->kind == TP_ARG_INT) ? a->i != 0 : def;
}

tp_val lw_runtime_int(tp_emit *e, const tp_node *n, int i, int j) {
  if (n->runtime_int) return n->runtime_int(e, n, i, j);
  const int64_t *v;
  int k = lw_ints(n, i, &v);
  if (j < 0 || j >= k) return em_fail(e, TP_INTERNAL, "%s: argument %d has no element %d", n->op, i, j);
  return em_const_i(e, v[j], TP_I64);
}

int lw_ints(const tp_node *n, int i, const int64_t **v) {
  const tp_arg *a = lw_arg(n, i);
  static int64_t one[TP_MAX_RANK];
  if (a->kind == TP_ARG_INTS) {
    *v = a->ints;
    return a->n;
  }
  if (a->kind == TP_ARG_INT) { /* an int where a list is allowed (dim=1) */
    one[0] = a->i;
    *v = one;
    return 1;
  }
  *v = NULL;
  return 0;
}

const char *lw_str(const tp_node *n, int i, const char *def) {
  const tp_arg *a = lw_arg(n, i);
  return a->kind == TP_ARG_STR ? a->s : def;
}

tp_dtype lw_dtype(tp_emit *e, const tp_node *n, int i) {
  const tp_arg *a = lw_arg(n, i);
  if (a->kind == TP_ARG_TENSOR) return em_type(e, a->v)->dt;
  if (a->kind == TP_ARG_SCALAR) return a->sdt;
  return TP_DTYPE_INVALID;
}

/* Copies may drop the imaginary part (PyTorch warns and does); any other op
 * given a complex input it would compute in a real dtype must refuse (bool
 * is z != 0, as logical ops take it). */
static int is_copy_op(const char *op) {
  return !strcmp(op, "tp::copy") || !strcmp(op, "aten::copy") || !strcmp(op, "aten::_to_copy") ||
         !strcmp(op, "aten::clone") || !strcmp(op, "prims::convert_element_type");
}

tp_val lw_tensor(tp_emit *e, const tp_node *n, int i, tp_dtype dt) {
  const tp_arg *a = lw_arg(n, i);
  if (a->kind == TP_ARG_TENSOR) {
    tp_dtype from = em_type(e, a->v)->dt;
    if (tp_dtype_is_complex(from) && !tp_dtype_is_complex(dt) && dt != TP_BOOL && !is_copy_op(n->op))
      return em_fail(e, TP_UNIMPLEMENTED, "%s: complex inputs are not supported on tpu yet", n->op);
    return em_convert(e, a->v, dt);
  }
  if (a->kind == TP_ARG_SCALAR) return n->scalar(e, n, i, dt);
  return em_fail(e, TP_INTERNAL, "%s: argument %d is not a tensor", n->op, i);
}

tp_val lw_value(tp_emit *e, const tp_node *n, int i) { return lw_tensor(e, n, i, lw_dtype(e, n, i)); }

tp_val lw_operand(tp_emit *e, const tp_node *n, int i, const tp_type *t) {
  tp_val v = lw_tensor(e, n, i, t->dt);
  return em_bcast_to(e, v, t->rank, t->dims);
}

const char *tp_scalar_type_name(tp_dtype d) {
  switch (d) {
    case TP_U8: return "Byte";
    case TP_I8: return "Char";
    case TP_I16: return "Short";
    case TP_I32: return "Int";
    case TP_I64: return "Long";
    case TP_F16: return "Half";
    case TP_F32: return "Float";
    case TP_F64: return "Double";
    case TP_BOOL: return "Bool";
    case TP_BF16: return "BFloat16";
    case TP_F8E5M2: return "Float8_e5m2";
    case TP_F8E4M3FN: return "Float8_e4m3fn";
    case TP_F8E5M2FNUZ: return "Float8_e5m2fnuz";
    case TP_F8E4M3FNUZ: return "Float8_e4m3fnuz";
    case TP_C64: return "ComplexFloat";
    case TP_C128: return "ComplexDouble";
    default: return tp_dtype_name(d);
  }
}

void lw_complex_parts(tp_emit *e, tp_val x, tp_val *re, tp_val *im) {
  tp_type pt = *em_type(e, x);
  pt.dt = pt.dt == TP_C64 ? TP_F32 : TP_F64;
  *re = em_op(e, "stablehlo.real", NULL, &x, 1, &pt);
  *im = em_op(e, "stablehlo.imag", NULL, &x, 1, &pt);
}

tp_val lw_abs(tp_emit *e, tp_val x) {
  tp_type t = *em_type(e, x);
  if (!tp_dtype_is_complex(t.dt)) return em_op(e, "stablehlo.abs", NULL, &x, 1, &t);
  /* hypot's special values, as PyTorch's (C's cabs): an infinite part gives
   * inf, even beside NaN; else a NaN part gives NaN (XLA:CPU's expansion
   * gives |re| for an imaginary NaN). */
  tp_val re, im;
  lw_complex_parts(e, x, &re, &im);
  t.dt = em_type(e, re)->dt;
  tp_val a = em_op(e, "stablehlo.abs", NULL, &x, 1, &t), inf = lw_full_like(e, a, INFINITY);
  tp_val are = em_unary(e, "stablehlo.abs", re), aim = em_unary(e, "stablehlo.abs", im);
  tp_val anyinf = em_binary(e, "stablehlo.or", em_compare(e, "EQ", are, inf), em_compare(e, "EQ", aim, inf));
  tp_val anynan = em_binary(e, "stablehlo.or", em_compare(e, "NE", re, re), em_compare(e, "NE", im, im));
  a = em_select(e, anynan, lw_full_like(e, a, NAN), a);
  return em_select(e, anyinf, inf, a);
}

tp_val lw_not_for(tp_emit *e, const char *what, tp_dtype d) {
  return em_fail(e, TP_UNIMPLEMENTED, "\"%s\" not implemented for '%s'", what, tp_scalar_type_name(d));
}

/* Products and convolutions do not promote: mixed dtypes raise on the CPU
 * and CUDA, and neither has bool kernels. */
int lw_same_dtypes(tp_emit *e, const tp_node *n, int first, int last) {
  tp_dtype dt = TP_DTYPE_INVALID;
  for (int i = first; i <= last && i < n->nargs; i++) {
    if (lw_arg(n, i)->kind != TP_ARG_TENSOR) continue;
    tp_dtype d = lw_dtype(e, n, i);
    if (dt == TP_DTYPE_INVALID) {
      dt = d;
    } else if (d != dt) {
      em_fail(e, TP_INVALID_ARGUMENT, "%s: expected all operands to have the same dtype, but got %s and %s", n->op,
              tp_scalar_type_name(dt), tp_scalar_type_name(d));
      return 0;
    }
  }
  if (dt == TP_BOOL) {
    lw_not_for(e, n->op, dt);
    return 0;
  }
  return 1;
}

/* 1 + erf(x / sqrt 2), twice the normal distribution's CDF, as PyTorch's CPU
 * kernels compute it for gelu.  Not erfc(-x / sqrt 2), which avoids the
 * cancellation for x << 0 but which XLA:CPU expands into several unvectorised
 * kernels (a fifth of a small GPT's forward).  XLA's float32 erf saturates at
 * -1 + 1.8e-7 rather than -1 below -3.9, which x would magnify, so there the
 * sum is 0, as the CPU's float32 erf gives it. */
tp_val lw_normal_cdf2(tp_emit *e, tp_val x) {
  tp_val z = em_binary(e, "stablehlo.multiply", x, lw_full_like(e, x, M_SQRT1_2));
  tp_val s = em_binary(e, "stablehlo.add", lw_full_like(e, x, 1), em_unary(e, "chlo.erf", z));
  if (em_type(e, x)->dt == TP_F64) return s;
  return em_select(e, em_compare(e, "LT", z, lw_full_like(e, x, -3.9)), lw_full_like(e, x, 0), s);
}

/* ---- promotion ---------------------------------------------------------------- */

static int category(tp_dtype d) {
  if (d == TP_BOOL) return 0;
  if (tp_dtype_is_int(d)) return 1;
  if (tp_dtype_is_float(d)) return 2;
  return 3;
}

tp_dtype lw_promote(tp_dtype a, tp_dtype b) {
  if (a == b) return a;
  if (a == TP_DTYPE_INVALID) return b;
  if (b == TP_DTYPE_INVALID) return a;
  int ca = category(a), cb = category(b);
  if (ca != cb) {
    if (ca < cb) {
      tp_dtype t = a;
      a = b;
      b = t;
      int tc = ca;
      ca = cb;
      cb = tc;
    }
    /* a has the higher category */
    if (ca == 3 && cb == 2) { /* complex with float: widen the complex if the float is double */
      return (a == TP_C64 && b == TP_F64) ? TP_C128 : a;
    }
    return a;
  }
  if (ca == 2) {
    if (a == TP_F64 || b == TP_F64) return TP_F64;
    if (a == TP_F32 || b == TP_F32) return TP_F32;
    return TP_F32; /* f16 with bf16 */
  }
  if (ca == 3) return TP_C128;
  /* integers */
  int ua = tp_dtype_is_unsigned(a), ub = tp_dtype_is_unsigned(b);
  size_t sa = tp_dtype_size(a), sb = tp_dtype_size(b);
  if (ua == ub) return sa >= sb ? a : b;
  tp_dtype s = ua ? b : a, u = ua ? a : b;
  size_t ss = tp_dtype_size(s), us = tp_dtype_size(u);
  if (ss > us) return s;
  if (us == 1) return TP_I16;
  if (us == 2) return TP_I32;
  if (us == 4) return TP_I64;
  return TP_I64;
}

tp_dtype lw_result_type(tp_emit *e, const tp_node *n, const int *idx, int k) {
  /* Three priority classes: dimensioned tensors, zero-dim tensors, wrapped numbers. */
  tp_dtype cls[3] = {TP_DTYPE_INVALID, TP_DTYPE_INVALID, TP_DTYPE_INVALID};
  for (int j = 0; j < k; j++) {
    const tp_arg *a = lw_arg(n, idx[j]);
    if (a->kind == TP_ARG_TENSOR) {
      const tp_type *t = em_type(e, a->v);
      int c = t->rank > 0 ? 0 : 1;
      cls[c] = lw_promote(cls[c], t->dt);
    } else if (a->kind == TP_ARG_SCALAR) {
      int c = a->wrapped ? 2 : 1;
      tp_dtype d = a->sdt;
      if (a->wrapped) d = tp_dtype_is_float(d) ? TP_F32 : tp_dtype_is_complex(d) ? TP_C64 : d == TP_BOOL ? TP_BOOL : TP_I64;
      cls[c] = lw_promote(cls[c], d);
    }
  }
  tp_dtype r = cls[0];
  for (int c = 1; c < 3; c++) {
    if (cls[c] == TP_DTYPE_INVALID) continue;
    if (r == TP_DTYPE_INVALID) {
      r = cls[c];
    } else if (category(cls[c]) > category(r)) {
      /* A lower-priority class only matters when it is of a higher category. */
      tp_dtype d = cls[c]; /* wrapped numbers already hold the default dtype */
      r = (category(d) == 3 && category(r) == 2) ? (r == TP_F64 ? TP_C128 : TP_C64) : d;
    }
  }
  return r == TP_DTYPE_INVALID ? TP_F32 : r;
}

tp_dtype lw_opmath(tp_dtype dt) { return (dt == TP_F16 || dt == TP_BF16 || tp_dtype_is_f8(dt)) ? TP_F32 : dt; }

int lw_dim(int64_t d, int rank) {
  int r = rank > 0 ? rank : 1;
  if (d < 0) d += r;
  return (int)d;
}

tp_type lw_out_as(const tp_node *n, int i, tp_dtype dt) {
  tp_type t = n->outs[i];
  t.dt = dt;
  return t;
}

/* The device check of idx, and with arg >= 0 the host check of that argument. */
static void check_v(tp_emit *e, const tp_node *n, int arg, tp_val idx, int64_t lo, int64_t hi, tp_code code,
                    const char *fmt, va_list ap) {
  if (!n->check || em_failed(e) || idx < 0 || tp_type_numel(em_type(e, idx)) == 0) return;
  char msg[512];
  vsnprintf(msg, sizeof msg, fmt, ap);
  n->check(e, n, idx, lo, hi, code, msg);
  if (arg >= 0 && n->host_check) n->host_check(e, n, arg, lo, hi, code, msg);
}

void lw_check_range(tp_emit *e, const tp_node *n, tp_val idx, int64_t lo, int64_t hi, tp_code code,
                    const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  check_v(e, n, -1, idx, lo, hi, code, fmt, ap);
  va_end(ap);
}

void lw_check_arg(tp_emit *e, const tp_node *n, int arg, tp_val idx, int64_t lo, int64_t hi, tp_code code,
                  const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  check_v(e, n, arg, idx, lo, hi, code, fmt, ap);
  va_end(ap);
}

void lw_check_text(tp_emit *e, const tp_node *n, tp_val idx, int64_t lo, int64_t hi, tp_code code, const char *text) {
  char msg[512];
  size_t q = 0;
  for (const char *s = text; *s && q + 2 < sizeof msg; s++) {
    if (*s == '{') msg[q++] = '{';
    msg[q++] = *s;
  }
  msg[q] = 0;
  lw_check_range(e, n, idx, lo, hi, code, "%s", msg);
}

tp_val lw_full_like(tp_emit *e, tp_val like, double v) { return em_full(e, v, em_type(e, like)); }

tp_val lw_bin(tp_emit *e, const char *op, tp_val a, tp_val b) {
  const tp_type *ta = em_type(e, a), *tb = em_type(e, b);
  if (ta->rank == 0 && tb->rank > 0) a = em_bcast_to(e, a, tb->rank, tb->dims);
  else if (tb->rank == 0 && ta->rank > 0) b = em_bcast_to(e, b, ta->rank, ta->dims);
  return em_binary(e, op, a, b);
}

/* emit.c - StableHLO text builder (see emit.h). */
#include "emit.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct sbuf {
  char *p;
  size_t len, cap;
  int oom;
} sbuf;

static void sb_vprintf(sbuf *b, const char *fmt, va_list ap) {
  if (b->oom) return;
  for (;;) {
    va_list aq;
    va_copy(aq, ap);
    size_t room = b->cap - b->len;
    int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? room : 0, fmt, aq);
    va_end(aq);
    if (n < 0) {
      b->oom = 1;
      return;
    }
    if (b->p && (size_t)n < room) {
      b->len += (size_t)n;
      return;
    }
    size_t ncap = b->cap ? b->cap * 2 : 1024;
    while (ncap < b->len + (size_t)n + 1) ncap *= 2;
    char *np = realloc(b->p, ncap);
    if (!np) {
      b->oom = 1;
      return;
    }
    b->p = np;
    b->cap = ncap;
  }
}

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  sb_vprintf(b, fmt, ap);
  va_end(ap);
}

struct tp_emit {
  tp_type *types; /* indexed by value id */
  tp_val *reshaped; /* per value: what it is a reshape of, or -1 */
  tp_val *tsrc;     /* per value: S where it is S's 2-d transpose, perhaps converted (em_transpose_source), or -1 */
  tp_val *splat;    /* per value: the rank-0 value it broadcasts, or -1 */
  int nvals, capvals;
  tp_val *params;
  int *param_alias; /* per parameter: the result it may be donated to, or -1 */
  int nparams, capparams;
  sbuf body;
  sbuf module;
  sbuf funcs; /* functions besides main (em_add_function), in the module after it */
  tp_status *err;
  const char *op; /* the op being lowered (em_set_op), for messages */
  int cpu_codegen; /* em_set_cpu_codegen */
};

int64_t tp_type_numel(const tp_type *t) {
  int64_t n = 1;
  for (int i = 0; i < t->rank; i++) n *= t->dims[i];
  return n;
}

tp_type tp_type_make(tp_dtype dt, int rank, const int64_t *dims) {
  tp_type t;
  memset(&t, 0, sizeof(t));
  t.dt = dt;
  t.rank = rank;
  for (int i = 0; i < rank && i < TP_MAX_RANK; i++) t.dims[i] = dims[i];
  return t;
}

const char *tp_type_str(const tp_type *t, char *buf, size_t cap) {
  size_t n = (size_t)snprintf(buf, cap, "tensor<");
  for (int i = 0; i < t->rank && n < cap; i++) n += (size_t)snprintf(buf + n, cap - n, "%" PRId64 "x", t->dims[i]);
  const char *el = tp_dtype_mlir(t->dt);
  if (n < cap) snprintf(buf + n, cap - n, "%s>", el ? el : "?");
  return buf;
}

tp_emit *em_new(void) { return calloc(1, sizeof(tp_emit)); }

void em_free(tp_emit *e) {
  if (!e) return;
  free(e->types);
  free(e->reshaped);
  free(e->tsrc);
  free(e->splat);
  free(e->params);
  free(e->param_alias);
  free(e->body.p);
  free(e->module.p);
  free(e->funcs.p);
  tp_status_free(e->err);
  free(e);
}

tp_val em_fail(tp_emit *e, tp_code code, const char *fmt, ...) {
  if (e->err) return -1;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  e->err = tp_error(code, "%s", msg);
  return -1;
}

int em_failed(const tp_emit *e) { return e->err != NULL || e->body.oom; }

tp_status *em_take_error(tp_emit *e) {
  tp_status *s = e->err;
  e->err = NULL;
  if (!s && e->body.oom) s = tp_error(TP_RESOURCE_EXHAUSTED, "out of memory building a program");
  return s;
}

static tp_val new_val(tp_emit *e, const tp_type *tin) {
  tp_type t = *tin; /* tin may point into e->types, which realloc moves */
  if (e->nvals == e->capvals) {
    int nc = e->capvals ? e->capvals * 2 : 64;
    tp_type *nt = realloc(e->types, sizeof(tp_type) * (size_t)nc);
    if (nt) e->types = nt;
    tp_val *nr = nt ? realloc(e->reshaped, sizeof(tp_val) * (size_t)nc) : NULL;
    if (nr) e->reshaped = nr;
    tp_val *ns = nr ? realloc(e->splat, sizeof(tp_val) * (size_t)nc) : NULL;
    if (ns) e->splat = ns;
    tp_val *nts = ns ? realloc(e->tsrc, sizeof(tp_val) * (size_t)nc) : NULL;
    if (!nts) return em_fail(e, TP_RESOURCE_EXHAUSTED, "out of memory building a program");
    e->tsrc = nts;
    e->capvals = nc;
  }
  e->types[e->nvals] = t;
  e->reshaped[e->nvals] = e->splat[e->nvals] = e->tsrc[e->nvals] = -1;
  return e->nvals++;
}

const tp_type *em_type(const tp_emit *e, tp_val v) {
  static const tp_type bad = {TP_F32, 0, {0}};
  if (v < 0 || v >= e->nvals) return &bad;
  return &e->types[v];
}

void em_set_cpu_codegen(tp_emit *e, int on) { e->cpu_codegen = on; }

const char *em_set_op(tp_emit *e, const char *op) {
  const char *old = e->op;
  e->op = op;
  return old;
}

static int bad(tp_emit *e, tp_val v) {
  if (em_failed(e)) return 1;
  if (v < 0 || v >= e->nvals) {
    em_fail(e, TP_INTERNAL, "lowering used an invalid value id %d", v);
    return 1;
  }
  return 0;
}

tp_val em_param(tp_emit *e, const tp_type *t) {
  tp_val v = new_val(e, t);
  if (v < 0) return v;
  if (e->nparams == e->capparams) {
    int nc = e->capparams ? e->capparams * 2 : 8;
    tp_val *np = realloc(e->params, sizeof(tp_val) * (size_t)nc);
    if (!np) return em_fail(e, TP_RESOURCE_EXHAUSTED, "out of memory building a program");
    e->params = np;
    int *na = realloc(e->param_alias, sizeof(int) * (size_t)nc);
    if (!na) return em_fail(e, TP_RESOURCE_EXHAUSTED, "out of memory building a program");
    e->param_alias = na;
    e->capparams = nc;
  }
  e->param_alias[e->nparams] = -1;
  e->params[e->nparams++] = v;
  return v;
}

int em_param_alias(tp_emit *e, int param, int result) {
  if (em_failed(e) || param < 0 || param >= e->nparams || result < 0) return -1;
  e->param_alias[param] = result;
  return 0;
}

int em_num_params(const tp_emit *e) { return e->nparams; }

static int same_type(const tp_type *a, const tp_type *b) {
  if (a->dt != b->dt || a->rank != b->rank) return 0;
  for (int i = 0; i < a->rank; i++)
    if (a->dims[i] != b->dims[i]) return 0;
  return 1;
}

static void put_types(sbuf *b, const tp_emit *e, const tp_val *vs, int n) {
  char tb[256];
  for (int i = 0; i < n; i++) sb_printf(b, "%s%s", i ? ", " : "", tp_type_str(&e->types[vs[i]], tb, sizeof tb));
}

const char *em_finish(tp_emit *e, const tp_val *results, int n) {
  for (int i = 0; i < n; i++)
    if (bad(e, results[i])) return NULL;
  if (em_failed(e)) return NULL;
  sbuf *m = &e->module;
  m->len = 0;
  char tb[256];
  sb_printf(m, "module @tp_program attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {\n");
  sb_printf(m, "  func.func public @main(");
  for (int i = 0; i < e->nparams; i++) {
    sb_printf(m, "%s%%v%d: %s", i ? ", " : "", e->params[i], tp_type_str(&e->types[e->params[i]], tb, sizeof tb));
    int r = e->param_alias[i];
    if (r >= 0 && r < n && same_type(&e->types[e->params[i]], &e->types[results[r]]))
      sb_printf(m, " {tf.aliasing_output = %d : i32}", r);
  }
  sb_printf(m, ") -> (");
  put_types(m, e, results, n);
  sb_printf(m, ") {\n%s", e->body.p ? e->body.p : "");
  sb_printf(m, "    \"func.return\"(");
  for (int i = 0; i < n; i++) sb_printf(m, "%s%%v%d", i ? ", " : "", results[i]);
  sb_printf(m, ") : (");
  put_types(m, e, results, n);
  sb_printf(m, ") -> ()\n  }\n%s}\n", e->funcs.p ? e->funcs.p : "");
  if (m->oom || e->funcs.oom) {
    em_fail(e, TP_RESOURCE_EXHAUSTED, "out of memory building a program");
    return NULL;
  }
  return m->p;
}

/* StableHLO ops whose operands must be floating-point or complex, and
 * arithmetic it does not define on booleans (its verifier's rules).  A rule
 * that hands them such an operand, because the op got an input dtype
 * PyTorch's CPU kernels refuse too, fails here with NotImplementedError in
 * PyTorch's words rather than with a compiler error about the program. */
static const char *const kFloatOnly[] = {
    "stablehlo.exponential", "stablehlo.exponential_minus_one", "stablehlo.log", "stablehlo.log_plus_one",
    "stablehlo.logistic", "stablehlo.sqrt", "stablehlo.rsqrt", "stablehlo.cbrt", "stablehlo.tanh", "stablehlo.sine",
    "stablehlo.cosine", "stablehlo.tan", "stablehlo.atan2", "stablehlo.floor", "stablehlo.ceil",
    "stablehlo.round_nearest_even", "stablehlo.round_nearest_afz", "stablehlo.is_finite", "chlo.erf", "chlo.erfc",
    "chlo.erf_inv", "chlo.lgamma", "chlo.digamma"};
static const char *const kNoBool[] = {"stablehlo.subtract", "stablehlo.divide", "stablehlo.remainder",
                                      "stablehlo.negate"};
static const char *const kSigned[] = {"stablehlo.abs", "stablehlo.sign"}; /* nor unsigned integers */

static int listed(const char *name, const char *const *list, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(name, list[i]) == 0) return 1;
  return 0;
}

#define LISTED(name, list) listed(name, list, sizeof list / sizeof *list)

static int operand_dtype_ok(tp_emit *e, const char *name, const tp_val *in, int nin) {
  int float_only = LISTED(name, kFloatOnly), is_signed = !float_only && LISTED(name, kSigned);
  if (!float_only && !is_signed && !LISTED(name, kNoBool)) return 1;
  for (int i = 0; i < nin; i++) {
    tp_dtype dt = e->types[in[i]].dt;
    if (dt == TP_BOOL || (float_only && !tp_dtype_is_float(dt) && !tp_dtype_is_complex(dt)) ||
        (is_signed && tp_dtype_is_unsigned(dt))) {
      em_fail(e, TP_UNIMPLEMENTED, "\"%s\" not implemented for '%s' on tpu (its lowering needs %s, which takes %s "
              "operands)", e->op ? e->op : "this op", tp_dtype_name(dt), name,
              float_only ? "floating-point or complex" : is_signed ? "signed" : "numeric, not bool,");
      return 0;
    }
  }
  return 1;
}

/* Elementwise ops: the same whatever the shape their operands share. */
static const char *const kElementwise[] = {
    "stablehlo.abs", "stablehlo.add", "stablehlo.and", "stablehlo.atan2", "stablehlo.cbrt", "stablehlo.ceil",
    "stablehlo.clamp", "stablehlo.compare", "stablehlo.complex", "stablehlo.convert", "stablehlo.cosine",
    "stablehlo.count_leading_zeros", "stablehlo.divide", "stablehlo.exponential", "stablehlo.exponential_minus_one",
    "stablehlo.floor", "stablehlo.imag", "stablehlo.is_finite", "stablehlo.log", "stablehlo.log_plus_one",
    "stablehlo.logistic", "stablehlo.maximum", "stablehlo.minimum", "stablehlo.multiply", "stablehlo.negate",
    "stablehlo.not", "stablehlo.or", "stablehlo.popcnt", "stablehlo.power", "stablehlo.real",
    "stablehlo.reduce_precision", "stablehlo.remainder", "stablehlo.round_nearest_afz",
    "stablehlo.round_nearest_even", "stablehlo.rsqrt", "stablehlo.select", "stablehlo.shift_left",
    "stablehlo.shift_right_arithmetic", "stablehlo.shift_right_logical", "stablehlo.sign", "stablehlo.sine",
    "stablehlo.sqrt", "stablehlo.subtract", "stablehlo.tan", "stablehlo.tanh", "stablehlo.xor", "chlo.erf",
    "chlo.erfc", "chlo.erf_inv", "chlo.lgamma", "chlo.digamma"};

static tp_val emit_line(tp_emit *e, const char *name, const char *attrs, const tp_val *in, int nin,
                        const tp_type *out_in);

/* An elementwise op whose operands are reshapes of values of one shape (or
 * broadcast numbers) runs in that shape and its result is reshaped: a
 * storage's flat values, viewed as a tensor and updated elementwise (an
 * optimizer step), stay flat from input to output.  XLA then sees one value
 * where the reshapes would have had it compute two: XLA:CPU copies a cheap
 * elementwise producer into each consumer that can take it, the reshape to
 * the flat result included, and the copy that reads an input updated in
 * place forces XLA to keep that input's old value (a copy per tensor of an
 * optimizer's state).  Returns -2 where this does not apply. */
static tp_val emit_unreshaped(tp_emit *e, const char *name, const char *attrs, const tp_val *in, int nin,
                              const tp_type *out) {
  tp_val base = -1;
  for (int i = 0; i < nin; i++) {
    tp_val r = e->reshaped[in[i]];
    if (r >= 0) {
      const tp_type *a = &e->types[r], *b = base >= 0 ? &e->types[base] : a;
      if (a->rank != b->rank || memcmp(a->dims, b->dims, sizeof(int64_t) * (size_t)a->rank)) return -2;
      base = r;
    } else if (e->splat[in[i]] < 0 && e->types[in[i]].rank > 0) {
      return -2;
    }
  }
  if (base < 0 || !LISTED(name, kElementwise)) return -2;
  tp_type t = e->types[base];
  t.dt = out->dt;
  tp_val ops[8];
  if (nin > 8) return -2;
  for (int i = 0; i < nin; i++) {
    tp_val x = in[i];
    if (e->reshaped[x] >= 0) ops[i] = e->reshaped[x];
    else if (e->splat[x] >= 0) ops[i] = em_bcast_in_dim(e, e->splat[x], &t, NULL);
    else ops[i] = x; /* rank 0: clamp's bounds, select's predicate */
  }
  return em_reshape(e, emit_line(e, name, attrs, ops, nin, &t), out->rank, out->dims);
}

/* Write "%vN = "name"(ins) {attrs} : (in types) -> out type" */
static tp_val emit_line(tp_emit *e, const char *name, const char *attrs, const tp_val *in, int nin,
                        const tp_type *out_in) {
  for (int i = 0; i < nin; i++)
    if (bad(e, in[i])) return -1;
  if (!operand_dtype_ok(e, name, in, nin)) return -1;
  if (out_in->rank > 0) {
    tp_val v = emit_unreshaped(e, name, attrs, in, nin, out_in);
    if (v != -2) return v;
  }
  tp_type o = *out_in; /* out_in may point into e->types, which new_val moves */
  const tp_type *out = &o;
  tp_val v = new_val(e, out);
  if (v < 0) return v;
  char tb[256];
  sbuf *b = &e->body;
  sb_printf(b, "    %%v%d = \"%s\"(", v, name);
  for (int i = 0; i < nin; i++) sb_printf(b, "%s%%v%d", i ? ", " : "", in[i]);
  sb_printf(b, ")");
  if (attrs && attrs[0]) sb_printf(b, " {%s}", attrs);
  sb_printf(b, " : (");
  put_types(b, e, in, nin);
  sb_printf(b, ") -> %s\n", tp_type_str(out, tb, sizeof tb));
  return v;
}

tp_val em_op(tp_emit *e, const char *name, const char *attrs, const tp_val *in, int nin, const tp_type *out) {
  return emit_line(e, name, attrs, in, nin, out);
}

int em_add_function(tp_emit *e, const char *text) {
  if (em_failed(e)) return -1;
  if (e->funcs.p && strstr(e->funcs.p, text)) return 0; /* the same function, already there */
  sb_printf(&e->funcs, "%s\n", text);
  return e->funcs.oom ? -1 : 0;
}

int em_call(tp_emit *e, const char *callee, const tp_val *in, int nin, const tp_type *outs, int nout, tp_val *res) {
  for (int i = 0; i < nin; i++)
    if (bad(e, in[i])) return -1;
  if (nout < 1) {
    em_fail(e, TP_INVALID_ARGUMENT, "%s: a called function must return at least one value", e->op ? e->op : "call");
    return -1;
  }
  tp_val r = new_val(e, &outs[0]); /* reserves the id of the call's results: %rN */
  if (r < 0) return -1;
  char tb[256];
  sbuf *b = &e->body;
  sb_printf(b, "    %%r%d:%d = \"func.call\"(", r, nout);
  for (int i = 0; i < nin; i++) sb_printf(b, "%s%%v%d", i ? ", " : "", in[i]);
  sb_printf(b, ") {callee = @%s} : (", callee);
  put_types(b, e, in, nin);
  sb_printf(b, ") -> (");
  for (int i = 0; i < nout; i++) sb_printf(b, "%s%s", i ? ", " : "", tp_type_str(&outs[i], tb, sizeof tb));
  sb_printf(b, ")\n");
  for (int i = 0; i < nout; i++) { /* each result as an ordinary value */
    tp_type t = outs[i];
    tp_val v = new_val(e, &t);
    if (v < 0) return -1;
    tp_type_str(&t, tb, sizeof tb);
    sb_printf(b, "    %%v%d = \"stablehlo.reshape\"(%%r%d#%d) : (%s) -> %s\n", v, r, i, tb, tb);
    res[i] = v;
  }
  return 0;
}

/* ---- constants ------------------------------------------------------------ */

static tp_val const_text(tp_emit *e, const char *lit, tp_dtype dt) {
  tp_type t = tp_type_make(dt, 0, NULL);
  char attrs[160], tb[64];
  snprintf(attrs, sizeof attrs, "value = dense<%s> : %s", lit, tp_type_str(&t, tb, sizeof tb));
  return emit_line(e, "stablehlo.constant", attrs, NULL, 0, &t);
}

tp_val em_const(tp_emit *e, double v, tp_dtype dt) {
  char lit[64];
  if (dt == TP_BOOL) return const_text(e, v != 0 ? "true" : "false", TP_BOOL);
  if (tp_dtype_is_int(dt)) return em_const_i(e, (int64_t)v, dt);
  if (tp_dtype_is_complex(dt)) return em_const_c(e, v, 0, dt);
  if (dt == TP_F64) {
    uint64_t bits;
    memcpy(&bits, &v, 8);
    snprintf(lit, sizeof lit, "0x%016" PRIX64, bits);
    return const_text(e, lit, TP_F64);
  }
  /* f32 literal (exact for f32; f16/bf16 round from it like PyTorch's cast,
   * except for double-rounding corner cases that do not occur for the
   * constants lowerings use). */
  float f = (float)v;
  uint32_t bits;
  memcpy(&bits, &f, 4);
  snprintf(lit, sizeof lit, "0x%08" PRIX32, bits);
  tp_val c = const_text(e, lit, TP_F32);
  return dt == TP_F32 ? c : em_convert(e, c, dt);
}

tp_val em_const_c(tp_emit *e, double re, double im, tp_dtype dt) {
  tp_dtype part = dt == TP_C64 ? TP_F32 : TP_F64;
  tp_val in[2] = {em_const(e, re, part), em_const(e, im, part)};
  tp_type t = tp_type_make(dt, 0, NULL);
  return emit_line(e, "stablehlo.complex", NULL, in, 2, &t);
}

tp_val em_const_i(tp_emit *e, int64_t v, tp_dtype dt) {
  char lit[64];
  if (dt == TP_BOOL) return const_text(e, v ? "true" : "false", TP_BOOL);
  if (!tp_dtype_is_int(dt)) return em_const(e, (double)v, dt);
  if (tp_dtype_is_unsigned(dt))
    snprintf(lit, sizeof lit, "%" PRIu64,
             (uint64_t)v & (uint64_t)(dt == TP_U8 ? 0xffu : dt == TP_U16 ? 0xffffu : dt == TP_U32 ? 0xffffffffu : UINT64_MAX));
  else
    snprintf(lit, sizeof lit, "%" PRId64, v);
  return const_text(e, lit, dt);
}

tp_val em_full(tp_emit *e, double v, const tp_type *tin) {
  tp_type t = *tin; /* tin may point into e->types */
  tp_val c = em_const(e, v, t.dt);
  return em_bcast_in_dim(e, c, &t, NULL);
}

tp_val em_iota(tp_emit *e, const tp_type *t, int dim) {
  char attrs[64];
  snprintf(attrs, sizeof attrs, "iota_dimension = %d : i64", dim);
  return emit_line(e, "stablehlo.iota", attrs, NULL, 0, t);
}

tp_val em_round_to(tp_emit *e, tp_val x, tp_dtype dt) {
  if (bad(e, x)) return -1;
  tp_type t = e->types[x];
  int narrower = (dt == TP_F32 && t.dt == TP_F64) || ((dt == TP_F16 || dt == TP_BF16) && (t.dt == TP_F32 || t.dt == TP_F64));
  if (!narrower) return x;
  const char *attrs = dt == TP_F16   ? "exponent_bits = 5 : i32, mantissa_bits = 10 : i32"
                      : dt == TP_F32 ? "exponent_bits = 8 : i32, mantissa_bits = 23 : i32"
                                     : "exponent_bits = 8 : i32, mantissa_bits = 7 : i32";
  tp_val r = emit_line(e, "stablehlo.reduce_precision", attrs, &x, 1, &t);
  if (dt != TP_F16) return r; /* f32/bf16 subnormals: XLA:CPU flushes them anyway */
  /* XLA:CPU's reduce_precision flushes f16 subnormals (|x| < 2^-14) to zero;
   * there the f16 grid is the multiples of 2^-24: scale, round half to even,
   * scale back (all exact). */
  tp_val up = em_full(e, 16777216.0, &t), down = em_full(e, 1.0 / 16777216.0, &t);
  tp_val sub = em_binary(e, "stablehlo.multiply", em_unary(e, "stablehlo.round_nearest_even",
                                                            em_binary(e, "stablehlo.multiply", x, up)), down);
  tp_val small = em_compare(e, "LT", em_unary(e, "stablehlo.abs", x), em_full(e, 1.0 / 16384.0, &t));
  return em_select(e, small, sub, r);
}

tp_val em_convert(tp_emit *e, tp_val x, tp_dtype dt) {
  if (bad(e, x)) return -1;
  tp_type t = e->types[x];
  if (t.dt == dt) return x;
  if (tp_dtype_is_complex(t.dt) && dt == TP_BOOL) {
    /* z != 0: either part nonzero (NaN parts count as nonzero). */
    tp_val z = em_full(e, 0, &t);
    return em_compare(e, "NE", x, z);
  }
  if (tp_dtype_is_complex(t.dt) && !tp_dtype_is_complex(dt)) {
    /* complex -> real takes the real part, like PyTorch (with a warning there). */
    tp_type r = t;
    r.dt = t.dt == TP_C64 ? TP_F32 : TP_F64;
    x = emit_line(e, "stablehlo.real", NULL, &x, 1, &r);
    return em_convert(e, x, dt);
  }
  if (dt == TP_BOOL) {
    /* x != 0, so NaN -> true as in PyTorch. */
    tp_val z = em_full(e, 0, &t);
    return em_compare(e, "NE", x, z);
  }
  if (t.dt == TP_BOOL && (tp_dtype_is_float(dt) || tp_dtype_is_complex(dt))) {
    /* bool -> float through u8: XLA rewrites convert(bool) * y into a select
     * that loses 0 * inf = NaN (seen on XLA:CPU). */
    x = em_convert(e, x, TP_U8);
    t.dt = TP_U8;
  }
  if (dt == TP_F8E4M3FN && t.dt != TP_BOOL) {
    /* PyTorch saturates at the largest float8_e4m3fn, +-448 (infinities
     * too); XLA's convert gives NaN beyond it. */
    if (!tp_dtype_is_float(t.dt) || tp_dtype_is_f8(t.dt)) {
      x = em_convert(e, x, TP_F32);
      t.dt = TP_F32;
    }
    x = em_clamp(e, em_const(e, -448.0, t.dt), x, em_const(e, 448.0, t.dt));
  }
  t.dt = dt;
  tp_val src = e->tsrc[x];
  tp_val v = emit_line(e, "stablehlo.convert", NULL, &x, 1, &t);
  if (v >= 0 && src >= 0 && tp_dtype_is_float(dt) && tp_dtype_is_float(e->types[src].dt)) e->tsrc[v] = src;
  return v;
}

tp_val em_bitcast(tp_emit *e, tp_val x, const tp_type *t) {
  return emit_line(e, "stablehlo.bitcast_convert", NULL, &x, 1, t);
}

/* Reinterpret a flat value as dtype `to` (like Tensor.view(dtype) of a
 * contiguous 1-d tensor): bitcast, regrouping elements when sizes differ. */
tp_val em_reinterpret(tp_emit *e, tp_val flat, tp_dtype to) {
  const tp_type *t = em_type(e, flat);
  tp_dtype from = t->dt;
  if (from == to) return flat;
  int64_t n = t->dims[0];
  /* Complex <-> real: bitcast_convert refuses complex types, so a complex
   * value goes through its (re, im) pairs as 2n parts of the part dtype. */
  if (tp_dtype_is_complex(from)) {
    tp_dtype part = from == TP_C64 ? TP_F32 : TP_F64;
    tp_type pt = tp_type_make(part, 1, &n);
    int64_t d2[2] = {n, 1}, m = 2 * n;
    tp_val re = em_reshape(e, em_op(e, "stablehlo.real", NULL, &flat, 1, &pt), 2, d2);
    tp_val im = em_reshape(e, em_op(e, "stablehlo.imag", NULL, &flat, 1, &pt), 2, d2);
    tp_val pair[2] = {re, im};
    return em_reinterpret(e, em_reshape(e, em_concat(e, pair, 2, 1), 1, &m), to);
  }
  if (tp_dtype_is_complex(to)) {
    tp_dtype part = to == TP_C64 ? TP_F32 : TP_F64;
    tp_val p = em_reinterpret(e, flat, part);
    int64_t m = em_type(e, p)->dims[0];
    if (m % 2) return em_fail(e, TP_INVALID_ARGUMENT, "storage of %" PRId64 " %s elements cannot be viewed as %s", m, tp_dtype_name(part), tp_dtype_name(to));
    int64_t d2[2] = {m / 2, 2}, h = m / 2, lo[2] = {0, 0}, mid[2] = {m / 2, 1}, lo2[2] = {0, 1}, hi2[2] = {m / 2, 2};
    tp_val pairs = em_reshape(e, p, 2, d2);
    tp_val in[2] = {em_reshape(e, em_slice(e, pairs, lo, mid, NULL), 1, &h),
                    em_reshape(e, em_slice(e, pairs, lo2, hi2, NULL), 1, &h)};
    tp_type ct = tp_type_make(to, 1, &h);
    return em_op(e, "stablehlo.complex", NULL, in, 2, &ct);
  }
  if (from == TP_BOOL) return em_reinterpret(e, em_convert(e, flat, TP_U8), to);
  if (to == TP_BOOL) {
    tp_val u = em_reinterpret(e, flat, TP_U8);
    return em_convert(e, u, TP_BOOL);
  }
  size_t fs = tp_dtype_size(from), ts = tp_dtype_size(to);
  if (!fs || !ts) return em_fail(e, TP_INTERNAL, "reinterpret between unknown dtypes %d and %d", from, to);
  if (fs == ts) {
    tp_type r = tp_type_make(to, 1, &n);
    return em_bitcast(e, flat, &r);
  }
  if (fs < ts) {
    int64_t ratio = (int64_t)(ts / fs);
    if (n % ratio) return em_fail(e, TP_INVALID_ARGUMENT, "storage of %" PRId64 " %s elements cannot be viewed as %s", n, tp_dtype_name(from), tp_dtype_name(to));
    int64_t d2[2] = {n / ratio, ratio};
    tp_val g = em_reshape(e, flat, 2, d2);
    tp_type r = tp_type_make(to, 1, d2);
    return em_bitcast(e, g, &r);
  }
  int64_t ratio = (int64_t)(fs / ts);
  int64_t d2[2] = {n, ratio};
  tp_type r = tp_type_make(to, 2, d2);
  tp_val g = em_bitcast(e, flat, &r);
  int64_t m = n * ratio;
  return em_reshape(e, g, 1, &m);
}

tp_val em_reshape(tp_emit *e, tp_val x, int rank, const int64_t *dims) {
  if (bad(e, x)) return -1;
  tp_type t = tp_type_make(e->types[x].dt, rank, dims);
  if (tp_type_numel(&t) != tp_type_numel(&e->types[x]))
    return em_fail(e, TP_INTERNAL, "reshape of %" PRId64 " elements to %" PRId64, tp_type_numel(&e->types[x]),
                   tp_type_numel(&t));
  if (e->reshaped[x] >= 0) x = e->reshaped[x]; /* a reshape of a reshape: one reshape */
  const tp_type *s = &e->types[x];
  if (s->rank == rank && !memcmp(s->dims, dims, sizeof(int64_t) * (size_t)rank)) return x;
  tp_val v = emit_line(e, "stablehlo.reshape", NULL, &x, 1, &t);
  if (v >= 0) e->reshaped[v] = x;
  return v;
}

static void attr_ints(char *buf, size_t cap, const char *name, const int64_t *v, int n) {
  size_t k = (size_t)snprintf(buf, cap, "%s = array<i64", name);
  for (int i = 0; i < n && k < cap; i++) k += (size_t)snprintf(buf + k, cap - k, "%s%" PRId64, i ? ", " : ": ", v[i]);
  if (k < cap) snprintf(buf + k, cap - k, ">");
}

tp_val em_transpose(tp_emit *e, tp_val x, const int64_t *perm) {
  if (bad(e, x)) return -1;
  const tp_type *s = &e->types[x];
  int ident = 1;
  tp_type t = *s;
  for (int i = 0; i < s->rank; i++) {
    t.dims[i] = s->dims[perm[i]];
    if (perm[i] != i) ident = 0;
  }
  if (ident) return x;
  char attrs[512];
  int swap2 = s->rank == 2;
  attr_ints(attrs, sizeof attrs, "permutation", perm, s->rank);
  tp_val v = emit_line(e, "stablehlo.transpose", attrs, &x, 1, &t);
  if (v >= 0 && swap2) e->tsrc[v] = x;
  return v;
}

tp_val em_transpose_source(const tp_emit *e, tp_val v) { return v >= 0 && v < e->nvals ? e->tsrc[v] : -1; }

tp_val em_bcast_in_dim(tp_emit *e, tp_val x, const tp_type *out, const int64_t *map) {
  if (bad(e, x)) return -1;
  const tp_type *s = &e->types[x];
  tp_type t = *out;
  t.dt = s->dt;
  if (s->rank == t.rank && !memcmp(s->dims, t.dims, sizeof(int64_t) * (size_t)t.rank)) {
    int ident = 1;
    for (int i = 0; map && i < s->rank; i++) ident &= map[i] == i;
    if (ident) return x;
  }
  char attrs[512];
  int scalar = s->rank == 0;
  attr_ints(attrs, sizeof attrs, "broadcast_dimensions", map, map ? s->rank : 0);
  tp_val v = emit_line(e, "stablehlo.broadcast_in_dim", attrs, &x, 1, &t);
  if (v >= 0 && scalar) e->splat[v] = x;
  return v;
}

tp_val em_bcast_to(tp_emit *e, tp_val x, int rank, const int64_t *dims) {
  if (bad(e, x)) return -1;
  const tp_type *s = &e->types[x];
  if (s->rank > rank) return em_fail(e, TP_INTERNAL, "broadcast to a lower rank");
  int64_t map[TP_MAX_RANK];
  for (int i = 0; i < s->rank; i++) {
    map[i] = rank - s->rank + i;
    if (s->dims[i] != 1 && s->dims[i] != dims[map[i]])
      return em_fail(e, TP_INVALID_ARGUMENT, "shapes are not broadcastable (%" PRId64 " vs %" PRId64 ")", s->dims[i],
                     dims[map[i]]);
  }
  tp_type t = tp_type_make(s->dt, rank, dims);
  return em_bcast_in_dim(e, x, &t, map);
}

tp_val em_slice(tp_emit *e, tp_val x, const int64_t *start, const int64_t *limit, const int64_t *stride) {
  if (bad(e, x)) return -1;
  const tp_type *s = &e->types[x];
  tp_type t = *s;
  int64_t ones[TP_MAX_RANK];
  int ident = 1;
  for (int i = 0; i < s->rank; i++) {
    ones[i] = 1;
    int64_t st = stride ? stride[i] : 1;
    t.dims[i] = limit[i] > start[i] ? (limit[i] - start[i] + st - 1) / st : 0;
    if (start[i] != 0 || limit[i] != s->dims[i] || st != 1) ident = 0;
  }
  if (ident) return x;
  char a1[256], a2[256], a3[256], attrs[800];
  attr_ints(a1, sizeof a1, "start_indices", start, s->rank);
  attr_ints(a2, sizeof a2, "limit_indices", limit, s->rank);
  attr_ints(a3, sizeof a3, "strides", stride ? stride : ones, s->rank);
  snprintf(attrs, sizeof attrs, "%s, %s, %s", a1, a2, a3);
  return emit_line(e, "stablehlo.slice", attrs, &x, 1, &t);
}

tp_val em_pad(tp_emit *e, tp_val x, tp_val padval, const int64_t *lo, const int64_t *hi, const int64_t *interior) {
  if (bad(e, x)) return -1;
  const tp_type *s = &e->types[x];
  tp_type t = *s;
  int64_t zeros[TP_MAX_RANK] = {0};
  int ident = 1;
  for (int i = 0; i < s->rank; i++) {
    int64_t in = interior ? interior[i] : 0;
    t.dims[i] = lo[i] + hi[i] + s->dims[i] + (s->dims[i] > 0 ? (s->dims[i] - 1) * in : 0);
    if (lo[i] || hi[i] || in) ident = 0;
  }
  if (ident) return x;
  char a1[256], a2[256], a3[256], attrs[800];
  attr_ints(a1, sizeof a1, "edge_padding_low", lo, s->rank);
  attr_ints(a2, sizeof a2, "edge_padding_high", hi, s->rank);
  attr_ints(a3, sizeof a3, "interior_padding", interior ? interior : zeros, s->rank);
  snprintf(attrs, sizeof attrs, "%s, %s, %s", a1, a2, a3);
  tp_val in[2] = {x, padval};
  return emit_line(e, "stablehlo.pad", attrs, in, 2, &t);
}

tp_val em_concat(tp_emit *e, const tp_val *xs, int n, int dim) {
  if (n <= 0) return em_fail(e, TP_INTERNAL, "concatenate of nothing");
  if (n == 1) return xs[0];
  for (int i = 0; i < n; i++)
    if (bad(e, xs[i])) return -1;
  tp_type t = e->types[xs[0]];
  t.dims[dim] = 0;
  for (int i = 0; i < n; i++) t.dims[dim] += e->types[xs[i]].dims[dim];
  char attrs[64];
  snprintf(attrs, sizeof attrs, "dimension = %d : i64", dim);
  return emit_line(e, "stablehlo.concatenate", attrs, xs, n, &t);
}

tp_val em_update_slice(tp_emit *e, tp_val x, tp_val upd, const int64_t *start) {
  if (bad(e, x) || bad(e, upd)) return -1;
  const tp_type *s = &e->types[x];
  int r = s->rank;
  tp_val in[TP_MAX_RANK + 2];
  in[0] = x;
  in[1] = upd;
  for (int i = 0; i < r; i++) in[2 + i] = em_const_i(e, start[i], TP_I64);
  tp_type t = e->types[x];
  return emit_line(e, "stablehlo.dynamic_update_slice", NULL, in, r + 2, &t);
}

tp_val em_dyn_slice(tp_emit *e, tp_val x, const tp_val *start, const int64_t *sizes) {
  if (bad(e, x)) return -1;
  tp_type t = e->types[x];
  int r = t.rank;
  tp_val in[TP_MAX_RANK + 1];
  in[0] = x;
  for (int i = 0; i < r; i++) {
    in[1 + i] = start[i];
    t.dims[i] = sizes[i];
  }
  char attrs[256];
  attr_ints(attrs, sizeof attrs, "slice_sizes", sizes, r);
  return emit_line(e, "stablehlo.dynamic_slice", attrs, in, r + 1, &t);
}

tp_val em_dyn_update_slice(tp_emit *e, tp_val x, tp_val upd, const tp_val *start) {
  if (bad(e, x) || bad(e, upd)) return -1;
  tp_type t = e->types[x];
  int r = t.rank;
  tp_val in[TP_MAX_RANK + 2];
  in[0] = x;
  in[1] = upd;
  for (int i = 0; i < r; i++) in[2 + i] = start[i];
  return emit_line(e, "stablehlo.dynamic_update_slice", NULL, in, r + 2, &t);
}

/* ---- elementwise ------------------------------------------------------------ */

tp_val em_unary(tp_emit *e, const char *op, tp_val x) {
  if (bad(e, x)) return -1;
  tp_type t = e->types[x];
  return emit_line(e, op, NULL, &x, 1, &t);
}

tp_val em_binary(tp_emit *e, const char *op, tp_val a, tp_val b) {
  if (bad(e, a) || bad(e, b)) return -1;
  tp_type t = e->types[a];
  tp_val in[2] = {a, b};
  return emit_line(e, op, NULL, in, 2, &t);
}

tp_val em_compare(tp_emit *e, const char *dir, tp_val a, tp_val b) {
  if (bad(e, a) || bad(e, b)) return -1;
  tp_type t = e->types[a];
  const char *ct = tp_dtype_is_float(t.dt) ? "FLOAT"
                   : (tp_dtype_is_unsigned(t.dt) || t.dt == TP_BOOL) ? "UNSIGNED"
                                                                     : "SIGNED";
  if (tp_dtype_is_complex(t.dt)) ct = "FLOAT";
  t.dt = TP_BOOL;
  char attrs[160];
  snprintf(attrs, sizeof attrs, "comparison_direction = #stablehlo<comparison_direction %s>, compare_type = #stablehlo<comparison_type %s>", dir, ct);
  tp_val in[2] = {a, b};
  return emit_line(e, "stablehlo.compare", attrs, in, 2, &t);
}

tp_val em_select(tp_emit *e, tp_val pred, tp_val a, tp_val b) {
  if (bad(e, pred) || bad(e, a) || bad(e, b)) return -1;
  tp_type t = e->types[a];
  tp_val in[3] = {pred, a, b};
  return emit_line(e, "stablehlo.select", NULL, in, 3, &t);
}

tp_val em_clamp(tp_emit *e, tp_val lo, tp_val x, tp_val hi) {
  if (bad(e, x)) return -1;
  tp_type t = e->types[x];
  tp_val in[3] = {lo, x, hi};
  return emit_line(e, "stablehlo.clamp", NULL, in, 3, &t);
}

/* ---- reductions ------------------------------------------------------------ */

/* XLA CPU rewrites a reduction over a dimension longer than 32 into a
 * reduce-window plus a reduce: two kernels, where one would also fuse the
 * reduction's producers.  A reduced dimension split into two of at most 32
 * (em_split_dim) reduces in one kernel.  Floating-point sums and products
 * split only up to EM_SPLIT_SUM_MAX elements, beyond which XLA's two-level
 * sum is the more accurate (measured: 1024 zero-mean values summed in one
 * pass had 3x the error of the two-level sum; 256, the same as PyTorch's). */
#define SPLIT_DIM 32
int64_t em_split_dim(int64_t n, int64_t max) {
  if (n <= SPLIT_DIM || n > max || n > SPLIT_DIM * SPLIT_DIM) return 0;
  for (int64_t b = SPLIT_DIM; b > 1; b--)
    if (n % b == 0 && n / b <= SPLIT_DIM) return n / b;
  return 0;
}

/* A column reduction: the reduced dims are the leading ones and the kept
 * dims the trailing ones (a bias gradient: [B, T, C] summed over B and T). */
static int is_column_reduction(const tp_type *s, const int64_t *dims, int ndims) {
  if (ndims == 0 || ndims >= s->rank) return 0;
  for (int j = 0; j < ndims; j++)
    if (dims[j] >= ndims) return 0; /* dims are distinct: all leading iff all < ndims */
  return 1;
}

/* x reshaped so that em_reduce's dims split where em_split_dim allows; the
 * new reduced dims in dims2[0..*nd2). */
static tp_val split_reduced_dims(tp_emit *e, tp_val x, const int64_t *dims, int ndims, const char *body_op,
                                 int64_t *dims2, int *nd2) {
  const tp_type s = e->types[x];
  int64_t count = 1;
  for (int j = 0; j < ndims; j++) count *= s.dims[dims[j]];
  int inexact = tp_dtype_is_float(s.dt) &&
                (strcmp(body_op, "stablehlo.add") == 0 || strcmp(body_op, "stablehlo.multiply") == 0);
  int64_t max = inexact ? (count <= EM_SPLIT_SUM_MAX ? EM_SPLIT_SUM_MAX : 0) : INT64_MAX;
  int64_t a[TP_MAX_RANK] = {0}; /* per dim: the leading factor of its split, 0 = none */
  int extra = 0;
  for (int j = 0; j < ndims; j++) extra += (a[dims[j]] = em_split_dim(s.dims[dims[j]], max)) != 0;
  if (!extra || s.rank + extra > TP_MAX_RANK) {
    memcpy(dims2, dims, (size_t)ndims * sizeof *dims);
    *nd2 = ndims;
    return x;
  }
  int64_t shape[TP_MAX_RANK];
  int r = 0, k = 0;
  for (int i = 0; i < s.rank; i++) {
    int reduced = 0;
    for (int j = 0; j < ndims; j++) reduced |= dims[j] == i;
    if (reduced) dims2[k++] = r;
    if (reduced && a[i]) {
      shape[r++] = a[i];
      dims2[k++] = r;
      shape[r++] = s.dims[i] / a[i];
    } else {
      shape[r++] = s.dims[i];
    }
  }
  *nd2 = k;
  return em_reshape(e, x, r, shape);
}

/* One reduction op: "stablehlo.reduce" over dims, or "stablehlo.reduce_window"
 * (window `attrs`) giving type t. */
static tp_val emit_reduce_op(tp_emit *e, const char *op, tp_val x, tp_val init, const char *body_op,
                             const char *attrs, const tp_type *t) {
  tp_val v = new_val(e, t);
  if (v < 0) return v;
  const tp_type s = e->types[x], st = tp_type_make(s.dt, 0, NULL);
  tp_val a = new_val(e, &st), b = new_val(e, &st), r = new_val(e, &st);
  if (r < 0) return r;
  char tb[256], sb[64], ib[256];
  const char *scal = tp_type_str(&st, sb, sizeof sb);
  sbuf *o = &e->body;
  sb_printf(o, "    %%v%d = \"%s\"(%%v%d, %%v%d) ({\n", v, op, x, init);
  sb_printf(o, "    ^bb0(%%v%d: %s, %%v%d: %s):\n", a, scal, b, scal);
  sb_printf(o, "      %%v%d = \"%s\"(%%v%d, %%v%d) : (%s, %s) -> %s\n", r, body_op, a, b, scal, scal, scal);
  sb_printf(o, "      \"stablehlo.return\"(%%v%d) : (%s) -> ()\n", r, scal);
  sb_printf(o, "    }) {%s} : (%s, %s) -> %s\n", attrs, tp_type_str(&s, ib, sizeof ib), scal,
            tp_type_str(t, tb, sizeof tb));
  return v;
}

/* A column reduction, as [R, C] reduced over R by windows of at most 32 rows
 * (the last padded with init), until one row is left.  XLA CPU fuses a
 * reduction's producers into it and evaluates them, scalar, once per output
 * element along the strided rows: for a column reduction that walk is 3-6x
 * slower than computing the producers in one vectorized kernel and then
 * reducing (measured: [512, 256] after GELU's backward, 150 us fused against
 * 50 us; [4096, 1024] 12.3 ms against 2.2 ms).  XLA does not fuse producers
 * into a reduce-window, and, unlike a reduce, does not fold the reshape to
 * [R, C] back into the producers' shape.  Only for XLA:CPU (cpu_codegen):
 * other backends' reduction emitters tile column reductions themselves. */
static tp_val column_reduce(tp_emit *e, tp_val x, tp_val init, const char *body_op, const tp_type *in,
                            int nreduced) {
  int64_t rc[2] = {1, 1};
  for (int i = 0; i < in->rank; i++) rc[i >= nreduced] *= in->dims[i];
  x = em_reshape(e, x, 2, rc);
  while (!bad(e, x) && rc[0] != 1) {
    const int64_t w = rc[0] < SPLIT_DIM ? rc[0] : SPLIT_DIM, n = (rc[0] + w - 1) / w;
    char attrs[256];
    snprintf(attrs, sizeof attrs,
             "window_dimensions = array<i64: %" PRId64 ", 1>, window_strides = array<i64: %" PRId64
             ", 1>, padding = dense<[[0, %" PRId64 "], [0, 0]]> : tensor<2x2xi64>",
             w, w, n * w - rc[0]);
    rc[0] = n;
    tp_type t = tp_type_make(in->dt, 2, rc);
    x = emit_reduce_op(e, "stablehlo.reduce_window", x, init, body_op, attrs, &t);
  }
  return em_reshape(e, x, in->rank - nreduced, in->dims + nreduced);
}

tp_val em_reduce(tp_emit *e, tp_val x, tp_val init, const int64_t *dims_in, int ndims_in, const char *body_op) {
  if (bad(e, x) || bad(e, init)) return -1;
  int64_t dims[TP_MAX_RANK];
  int ndims;
  if (ndims_in > TP_MAX_RANK) return em_fail(e, TP_INVALID_ARGUMENT, "reduce: too many dimensions");
  const tp_type in = e->types[x];
  if (e->cpu_codegen && is_column_reduction(&in, dims_in, ndims_in) && tp_type_numel(&in) > 0)
    return column_reduce(e, x, init, body_op, &in, ndims_in);
  x = split_reduced_dims(e, x, dims_in, ndims_in, body_op, dims, &ndims);
  if (bad(e, x)) return -1;
  const tp_type s = e->types[x];
  if (ndims == 0) return x;
  tp_type t = tp_type_make(s.dt, 0, NULL);
  for (int i = 0; i < s.rank; i++) {
    int reduced = 0;
    for (int j = 0; j < ndims; j++) reduced |= dims[j] == i;
    if (!reduced) t.dims[t.rank++] = s.dims[i];
  }
  char dims_attr[512];
  attr_ints(dims_attr, sizeof dims_attr, "dimensions", dims, ndims);
  return emit_reduce_op(e, "stablehlo.reduce", x, init, body_op, dims_attr, &t);
}

void em_argreduce(tp_emit *e, tp_val x, int dim, int is_max, tp_val *values, tp_val *indices) {
  *values = *indices = -1;
  if (bad(e, x)) return;
  tp_type s = e->types[x];
  tp_type it = s;
  it.dt = TP_I64;
  tp_val idx = em_iota(e, &it, dim);
  /* The identity of the reduction: -inf/+inf for floats, the type's limits for ints. */
  tp_val init;
  if (tp_dtype_is_float(s.dt)) {
    init = em_const(e, is_max ? -INFINITY : INFINITY, s.dt);
  } else if (s.dt == TP_BOOL) {
    init = em_const_i(e, is_max ? 0 : 1, s.dt);
  } else if (tp_dtype_is_unsigned(s.dt)) {
    init = em_const_i(e, is_max ? 0 : -1, s.dt); /* -1 masks to the type's maximum */
  } else {
    int64_t lim = s.dt == TP_I8 ? INT8_MAX : s.dt == TP_I16 ? INT16_MAX : s.dt == TP_I32 ? INT32_MAX : INT64_MAX;
    init = em_const_i(e, is_max ? -lim - 1 : lim, s.dt);
  }
  tp_val iinit = em_const_i(e, 0, TP_I64);
  if (em_failed(e)) return;
  tp_type vt = tp_type_make(s.dt, 0, NULL), ot = vt;
  ot.rank = 0;
  for (int i = 0; i < s.rank; i++)
    if (i != dim) ot.dims[ot.rank++] = s.dims[i];
  tp_type oi = ot;
  oi.dt = TP_I64;
  tp_type st = tp_type_make(s.dt, 0, NULL), si = tp_type_make(TP_I64, 0, NULL), sb = tp_type_make(TP_BOOL, 0, NULL);
  tp_val res = new_val(e, &ot);
  tp_val resi = new_val(e, &oi); /* second result, printed as %vN#1 alias below */
  tp_val a = new_val(e, &st), ai = new_val(e, &si), b = new_val(e, &st), bi = new_val(e, &si);
  if (bi < 0) return;
  char ts[64], tis[64], tbs[64], tx[256], tix[256], to[256], toi[256];
  tp_type_str(&st, ts, sizeof ts);
  tp_type_str(&si, tis, sizeof tis);
  tp_type_str(&sb, tbs, sizeof tbs);
  tp_type_str(&s, tx, sizeof tx);
  tp_type_str(&it, tix, sizeof tix);
  tp_type_str(&ot, to, sizeof to);
  tp_type_str(&oi, toi, sizeof toi);
  (void)vt;
  const char *ct = tp_dtype_is_float(s.dt) ? "FLOAT" : (tp_dtype_is_unsigned(s.dt) || s.dt == TP_BOOL) ? "UNSIGNED" : "SIGNED";
  int base = e->nvals; /* body temporaries %t<base..base+12>: reserve the ids */
  for (int i = 0; i < 13; i++)
    if (new_val(e, &sb) < 0) return;
  sbuf *o = &e->body;
  sb_printf(o, "    %%r%d:2 = \"stablehlo.reduce\"(%%v%d, %%v%d, %%v%d, %%v%d) ({\n", res, x, idx, init, iinit);
  sb_printf(o, "    ^bb0(%%v%d: %s, %%v%d: %s, %%v%d: %s, %%v%d: %s):\n", a, ts, ai, tis, b, ts, bi, tis);
#define CMP(id, dir, l, r, ty) \
  sb_printf(o, "      %%t%d = \"stablehlo.compare\"(%s, %s) {comparison_direction = #stablehlo<comparison_direction %s>, compare_type = #stablehlo<comparison_type %s>} : (%s, %s) -> %s\n", id, l, r, dir, ty, ts, ts, tbs)
  char A[32], B[32], AI[32], BI[32];
  snprintf(A, sizeof A, "%%v%d", a);
  snprintf(B, sizeof B, "%%v%d", b);
  snprintf(AI, sizeof AI, "%%v%d", ai);
  snprintf(BI, sizeof BI, "%%v%d", bi);
  CMP(base + 0, "NE", A, A, ct);                     /* a is nan */
  CMP(base + 1, "NE", B, B, ct);                     /* b is nan */
  CMP(base + 2, is_max ? "GT" : "LT", A, B, ct);     /* a strictly better */
  CMP(base + 3, "EQ", A, B, ct);
#undef CMP
  sb_printf(o, "      %%t%d = \"stablehlo.compare\"(%s, %s) {comparison_direction = #stablehlo<comparison_direction LT>, compare_type = #stablehlo<comparison_type SIGNED>} : (%s, %s) -> %s\n", base + 4, AI, BI, tis, tis, tbs);
  /* pick_a = a_nan ? (!b_nan | ai<bi) : (!b_nan & (gt | (eq & ai<bi))) */
  sb_printf(o, "      %%t%d = \"stablehlo.not\"(%%t%d) : (%s) -> %s\n", base + 5, base + 1, tbs, tbs);
  sb_printf(o, "      %%t%d = \"stablehlo.or\"(%%t%d, %%t%d) : (%s, %s) -> %s\n", base + 6, base + 5, base + 4, tbs, tbs, tbs);
  sb_printf(o, "      %%t%d = \"stablehlo.and\"(%%t%d, %%t%d) : (%s, %s) -> %s\n", base + 7, base + 3, base + 4, tbs, tbs, tbs);
  sb_printf(o, "      %%t%d = \"stablehlo.or\"(%%t%d, %%t%d) : (%s, %s) -> %s\n", base + 8, base + 2, base + 7, tbs, tbs, tbs);
  sb_printf(o, "      %%t%d = \"stablehlo.and\"(%%t%d, %%t%d) : (%s, %s) -> %s\n", base + 9, base + 5, base + 8, tbs, tbs, tbs);
  sb_printf(o, "      %%t%d = \"stablehlo.select\"(%%t%d, %%t%d, %%t%d) : (%s, %s, %s) -> %s\n", base + 10, base + 0, base + 6, base + 9, tbs, tbs, tbs, tbs);
  sb_printf(o, "      %%t%d = \"stablehlo.select\"(%%t%d, %s, %s) : (%s, %s, %s) -> %s\n", base + 11, base + 10, A, B, tbs, ts, ts, ts);
  sb_printf(o, "      %%t%d = \"stablehlo.select\"(%%t%d, %s, %s) : (%s, %s, %s) -> %s\n", base + 12, base + 10, AI, BI, tbs, tis, tis, tis);
  sb_printf(o, "      \"stablehlo.return\"(%%t%d, %%t%d) : (%s, %s) -> ()\n", base + 11, base + 12, ts, tis);
  char dims_attr[64];
  int64_t d = dim;
  attr_ints(dims_attr, sizeof dims_attr, "dimensions", &d, 1);
  sb_printf(o, "    }) {%s} : (%s, %s, %s, %s) -> (%s, %s)\n", dims_attr, tx, tix, ts, tis, to, toi);
  /* Name the two results as ordinary values. */
  tp_val vv = new_val(e, &ot), vi = new_val(e, &oi);
  if (vi < 0) return;
  sb_printf(o, "    %%v%d = \"stablehlo.reshape\"(%%r%d#0) : (%s) -> %s\n", vv, res, to, to);
  sb_printf(o, "    %%v%d = \"stablehlo.reshape\"(%%r%d#1) : (%s) -> %s\n", vi, res, toi, toi);
  (void)resi;
  *values = vv;
  *indices = vi;
}

tp_val em_dot(tp_emit *e, tp_val a, tp_val b, const int64_t *lb, const int64_t *rb, int nbatch, const int64_t *lc,
              const int64_t *rc, int ncontract, tp_dtype out_dt) {
  if (bad(e, a) || bad(e, b)) return -1;
  const tp_type *ta = &e->types[a], *tb_ = &e->types[b];
  /* Result dims: batch, lhs free, rhs free. */
  tp_type t = tp_type_make(out_dt, 0, NULL);
  for (int i = 0; i < nbatch; i++) t.dims[t.rank++] = ta->dims[lb[i]];
  for (int i = 0; i < ta->rank; i++) {
    int used = 0;
    for (int j = 0; j < nbatch; j++) used |= lb[j] == i;
    for (int j = 0; j < ncontract; j++) used |= lc[j] == i;
    if (!used) t.dims[t.rank++] = ta->dims[i];
  }
  for (int i = 0; i < tb_->rank; i++) {
    int used = 0;
    for (int j = 0; j < nbatch; j++) used |= rb[j] == i;
    for (int j = 0; j < ncontract; j++) used |= rc[j] == i;
    if (!used) t.dims[t.rank++] = tb_->dims[i];
  }
  char attrs[1024];
  size_t k = (size_t)snprintf(attrs, sizeof attrs, "dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = [");
#define LIST(v, n)                                                                                         \
  for (int i = 0; i < (n); i++) k += (size_t)snprintf(attrs + k, sizeof attrs - k, "%s%" PRId64, i ? ", " : "", (v)[i])
  LIST(lb, nbatch);
  k += (size_t)snprintf(attrs + k, sizeof attrs - k, "], rhs_batching_dimensions = [");
  LIST(rb, nbatch);
  k += (size_t)snprintf(attrs + k, sizeof attrs - k, "], lhs_contracting_dimensions = [");
  LIST(lc, ncontract);
  k += (size_t)snprintf(attrs + k, sizeof attrs - k, "], rhs_contracting_dimensions = [");
  LIST(rc, ncontract);
#undef LIST
  snprintf(attrs + k, sizeof attrs - k,
           "]>, precision_config = [#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>]");
  tp_val in[2] = {a, b};
  return emit_line(e, "stablehlo.dot_general", attrs, in, 2, &t);
}

/* ---- gather / scatter ------------------------------------------------------ */

tp_val em_gather_flat(tp_emit *e, tp_val x1d, tp_val index) {
  if (bad(e, x1d) || bad(e, index)) return -1;
  tp_type t = e->types[index];
  t.dt = e->types[x1d].dt;
  char attrs[400];
  snprintf(attrs, sizeof attrs,
           "dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0], start_index_map = [0], "
           "index_vector_dim = %d>, slice_sizes = array<i64: 1>, indices_are_sorted = false",
           t.rank);
  tp_val in[2] = {x1d, index};
  return emit_line(e, "stablehlo.gather", attrs, in, 2, &t);
}

tp_val em_scatter_flat(tp_emit *e, tp_val x1d, tp_val index, tp_val upd, const char *combine) {
  if (bad(e, x1d) || bad(e, index) || bad(e, upd)) return -1;
  tp_type t = e->types[x1d];
  tp_type st = tp_type_make(t.dt, 0, NULL);
  tp_val v = new_val(e, &t);
  tp_val a = new_val(e, &st), b = new_val(e, &st), r = new_val(e, &st);
  if (r < 0) return r;
  char ts[64], tx[256], ti[256], tu[256];
  tp_type_str(&st, ts, sizeof ts);
  tp_type_str(&t, tx, sizeof tx);
  tp_type_str(&e->types[index], ti, sizeof ti);
  tp_type_str(&e->types[upd], tu, sizeof tu);
  sbuf *o = &e->body;
  sb_printf(o, "    %%v%d = \"stablehlo.scatter\"(%%v%d, %%v%d, %%v%d) ({\n", v, x1d, index, upd);
  sb_printf(o, "    ^bb0(%%v%d: %s, %%v%d: %s):\n", a, ts, b, ts);
  if (combine) {
    sb_printf(o, "      %%v%d = \"%s\"(%%v%d, %%v%d) : (%s, %s) -> %s\n", r, combine, a, b, ts, ts, ts);
    sb_printf(o, "      \"stablehlo.return\"(%%v%d) : (%s) -> ()\n", r, ts);
  } else {
    sb_printf(o, "      \"stablehlo.return\"(%%v%d) : (%s) -> ()\n", b, ts);
  }
  sb_printf(o,
            "    }) {scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0], "
            "scatter_dims_to_operand_dims = [0], index_vector_dim = %d>, indices_are_sorted = false, "
            "unique_indices = false} : (%s, %s, %s) -> %s\n",
            e->types[index].rank, tx, ti, tu, tx);
  return v;
}

/* ---- structured while loop ------------------------------------------------ */

/* Print "^bb0(%vA: T, ...):" for fresh block arguments typed like vals[]. */
static int block_args(tp_emit *e, const tp_val *like, int n, tp_val *args) {
  char tb[256];
  sbuf *o = &e->body;
  sb_printf(o, "    ^bb0(");
  for (int i = 0; i < n; i++) {
    tp_type t = e->types[like[i]];
    args[i] = new_val(e, &t);
    if (args[i] < 0) return -1;
    sb_printf(o, "%s%%v%d: %s", i ? ", " : "", args[i], tp_type_str(&t, tb, sizeof tb));
  }
  sb_printf(o, "):\n");
  return 0;
}

int em_while_begin(tp_emit *e, em_loop *L, const tp_val *init, int n, tp_val *args) {
  memset(L, 0, sizeof *L);
  L->res = -1;
  if (n < 1 || n > EM_LOOP_MAX) {
    em_fail(e, TP_INTERNAL, "while loop with %d carried values (1..%d)", n, EM_LOOP_MAX);
    return -1;
  }
  for (int i = 0; i < n; i++)
    if (bad(e, init[i])) return -1;
  L->n = n;
  memcpy(L->init, init, sizeof(tp_val) * (size_t)n);
  tp_type st = tp_type_make(TP_BOOL, 0, NULL);
  L->res = new_val(e, &st); /* reserves the id used as %r<res> */
  if (L->res < 0) return -1;
  sbuf *o = &e->body;
  sb_printf(o, "    %%r%d:%d = \"stablehlo.while\"(", L->res, n);
  for (int i = 0; i < n; i++) sb_printf(o, "%s%%v%d", i ? ", " : "", init[i]);
  sb_printf(o, ") ({\n");
  return block_args(e, init, n, args);
}

int em_while_body(tp_emit *e, em_loop *L, tp_val pred, tp_val *args) {
  if (L->res < 0 || bad(e, pred)) return -1;
  const tp_type *pt = &e->types[pred];
  if (pt->dt != TP_BOOL || pt->rank != 0) {
    em_fail(e, TP_INTERNAL, "while loop condition must be a rank-0 bool");
    return -1;
  }
  sb_printf(&e->body, "      \"stablehlo.return\"(%%v%d) : (tensor<i1>) -> ()\n    }, {\n", pred);
  return block_args(e, L->init, L->n, args);
}

int em_while_end(tp_emit *e, em_loop *L, const tp_val *next, tp_val *outs) {
  if (L->res < 0) return -1;
  for (int i = 0; i < L->n; i++) {
    if (bad(e, next[i])) return -1;
    if (!same_type(&e->types[next[i]], &e->types[L->init[i]])) {
      em_fail(e, TP_INTERNAL, "while loop value %d changes type in the body", i);
      return -1;
    }
  }
  sbuf *o = &e->body;
  sb_printf(o, "      \"stablehlo.return\"(");
  for (int i = 0; i < L->n; i++) sb_printf(o, "%s%%v%d", i ? ", " : "", next[i]);
  sb_printf(o, ") : (");
  put_types(o, e, L->init, L->n);
  sb_printf(o, ") -> ()\n    }) : (");
  put_types(o, e, L->init, L->n);
  sb_printf(o, ") -> (");
  put_types(o, e, L->init, L->n);
  sb_printf(o, ")\n");
  /* Name the results as ordinary values (MLIR has no aliasing in text form). */
  char tb[256];
  for (int i = 0; i < L->n; i++) {
    tp_type t = e->types[L->init[i]];
    outs[i] = new_val(e, &t);
    if (outs[i] < 0) return -1;
    tp_type_str(&t, tb, sizeof tb);
    sb_printf(o, "    %%v%d = \"stablehlo.reshape\"(%%r%d#%d) : (%s) -> %s\n", outs[i], L->res, i, tb, tb);
  }
  return 0;
}

int em_case_begin(tp_emit *e, em_case *C, tp_val index, int n) {
  memset(C, 0, sizeof *C);
  C->res = -1;
  if (bad(e, index)) return -1;
  const tp_type *it = &e->types[index];
  if (n < 1 || it->dt != TP_I32 || it->rank != 0) {
    em_fail(e, TP_INTERNAL, "case needs a rank-0 i32 index and at least one branch");
    return -1;
  }
  tp_type st = tp_type_make(TP_BOOL, 0, NULL);
  C->res = new_val(e, &st); /* reserves the id used as %r<res> */
  if (C->res < 0) return -1;
  C->n = n;
  sb_printf(&e->body, "    %%r%d = \"stablehlo.case\"(%%v%d) ({\n", C->res, index);
  return 0;
}

int em_case_next(tp_emit *e, em_case *C, tp_val v) {
  if (C->res < 0 || bad(e, v)) return -1;
  if (C->done >= C->n || (C->done && !same_type(&e->types[v], &C->t))) {
    em_fail(e, TP_INTERNAL, "case branch %d: more branches than declared, or another type", C->done);
    return -1;
  }
  C->t = e->types[v];
  char tb[256];
  tp_type_str(&C->t, tb, sizeof tb);
  C->done++;
  sb_printf(&e->body, "      \"stablehlo.return\"(%%v%d) : (%s) -> ()\n    }%s", v, tb, C->done < C->n ? ", {\n" : ")");
  return 0;
}

tp_val em_case_end(tp_emit *e, em_case *C) {
  if (C->res < 0) return -1;
  if (C->done != C->n) return em_fail(e, TP_INTERNAL, "case with %d of %d branches", C->done, C->n);
  char tb[256];
  tp_type_str(&C->t, tb, sizeof tb);
  sb_printf(&e->body, " : (tensor<i32>) -> %s\n", tb);
  tp_val out = new_val(e, &C->t);
  if (out < 0) return -1;
  sb_printf(&e->body, "    %%v%d = \"stablehlo.reshape\"(%%r%d) : (%s) -> %s\n", out, C->res, tb, tb);
  return out;
}

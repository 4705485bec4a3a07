/* lower_util.h - helpers shared by the lowering rule files (lower_*.c).
 * Internal to the core; rules include this, nothing else does. */
#ifndef TP_LOWER_UTIL_H
#define TP_LOWER_UTIL_H

#include "lower.h"

/* One rule: the op's name, its lowering, and what the engine must know
 * about its arguments before it lowers (TP_FITS, TP_RUNTIME in lower.h). */
typedef struct tp_lower_entry {
  const char *name;
  tp_lower_fn fn;
  unsigned flags;
} tp_lower_entry;

/* Each rule file exports one NULL-terminated fragment of the table. */
extern const tp_lower_entry tp_lower_elementwise[];
extern const tp_lower_entry tp_lower_view[];
extern const tp_lower_entry tp_lower_reduce[];
extern const tp_lower_entry tp_lower_shape[];
extern const tp_lower_entry tp_lower_nn[];
extern const tp_lower_entry tp_lower_random[];
extern const tp_lower_entry tp_lower_special[];
extern const tp_lower_entry tp_lower_linalg[];
extern const tp_lower_entry tp_lower_misc[];
extern const tp_lower_entry tp_lower_fft[];

/* ---- argument access (bounds-checked; a missing arg reads as None) ---- */
const tp_arg *lw_arg(const tp_node *n, int i);
int lw_is_none(const tp_node *n, int i);
int64_t lw_int(const tp_node *n, int i, int64_t def);
double lw_float(const tp_node *n, int i, double def);
int lw_bool(const tp_node *n, int i, int def);
/* Int list argument; returns its length and points *v at it (0 if None). */
int lw_ints(const tp_node *n, int i, const int64_t **v);
/* Element j of integer argument i as a rank-0 i64 value: a runtime operand
 * where the rule's entry has TP_RUNTIME(i) and the engine provides one (its
 * static value then reads as 0), else a constant.  The count of a list
 * argument (lw_ints) stays static. */
tp_val lw_runtime_int(tp_emit *e, const tp_node *n, int i, int j);
const char *lw_str(const tp_node *n, int i, const char *def);
/* dtype of a tensor or scalar argument (TP_DTYPE_INVALID if neither). */
tp_dtype lw_dtype(tp_emit *e, const tp_node *n, int i);
/* Tensor or scalar argument i as a value of dtype dt. */
tp_val lw_tensor(tp_emit *e, const tp_node *n, int i, tp_dtype dt);
/* Argument i as a value (its own dtype). */
tp_val lw_value(tp_emit *e, const tp_node *n, int i);
/* Scalar or tensor argument i, converted to dt and broadcast to type t. */
tp_val lw_operand(tp_emit *e, const tp_node *n, int i, const tp_type *t);

/* The real and imaginary parts of complex x (f32 for c64, f64 for c128). */
void lw_complex_parts(tp_emit *e, tp_val x, tp_val *re, tp_val *im);
/* |x|; of a complex value, its real magnitude (f32 for c64, f64 for c128). */
tp_val lw_abs(tp_emit *e, tp_val x);

/* ---- dtypes ----------------------------------------------------------- */
/* PyTorch's ScalarType name of a dtype ("Float", "BFloat16", "Bool"). */
const char *tp_scalar_type_name(tp_dtype d);
/* Fail like PyTorch's dispatch macros: "<what>" not implemented for '<type>'
 * (TP_UNIMPLEMENTED); returns -1. */
tp_val lw_not_for(tp_emit *e, const char *what, tp_dtype d);
/* 1 if the tensor arguments first..last share a non-bool dtype, as products
 * and convolutions need; otherwise em_fail with the error PyTorch raises, and 0. */
int lw_same_dtypes(tp_emit *e, const tp_node *n, int first, int last);
/* 1 + erf(x / sqrt 2) for gelu, saturating to 0 where float32 erf does. */
tp_val lw_normal_cdf2(tp_emit *e, tp_val x);
tp_dtype lw_promote(tp_dtype a, tp_dtype b);
/* PyTorch's result_type over the listed arguments (tensors, 0-dim tensors
 * and wrapped numbers each in their own priority class). */
tp_dtype lw_result_type(tp_emit *e, const tp_node *n, const int *idx, int k);
/* dtype arithmetic runs in: f32 for f16/bf16 (PyTorch's opmath), else dt. */
tp_dtype lw_opmath(tp_dtype dt);

/* Normalise a possibly negative dim against rank (rank 0 acts as 1). */
int lw_dim(int64_t d, int rank);
/* Output type i of the node, with dtype replaced by dt. */
tp_type lw_out_as(const tp_node *n, int i, tp_dtype dt);

/* ---- index checks ------------------------------------------------------- */
/* Every element of the integer value idx must lie in [lo, hi); otherwise the
 * next synchronisation raises `code` (TP_OUT_OF_RANGE: IndexError) with the
 * printf-formatted message, where "{}" stands for the offending index.  See
 * tp_node.check. */
void lw_check_range(tp_emit *e, const tp_node *n, tp_val idx, int64_t lo, int64_t hi, tp_code code,
                    const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 7, 8)))
#endif
    ;

/* The same check, with a message taken as it is (no "{}" placeholder):
 * `text` is escaped for the flag's formatting ("{" -> "{{") and cut to fit. */
void lw_check_text(tp_emit *e, const tp_node *n, tp_val idx, int64_t lo, int64_t hi, tp_code code, const char *text);
/* lw_check_range of idx, the integer values of tensor argument `arg`
 * unchanged (converted or reshaped only): the engine also checks them on
 * the host before launch where it knows them (tp_node.host_check). */
void lw_check_arg(tp_emit *e, const tp_node *n, int arg, tp_val idx, int64_t lo, int64_t hi, tp_code code,
                  const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 8, 9)))
#endif
    ;

/* ---- emission shortcuts ------------------------------------------------ */
tp_val lw_full_like(tp_emit *e, tp_val like, double v);
tp_val lw_bin(tp_emit *e, const char *op, tp_val a, tp_val b); /* broadcasts rank-0 b or a */
/* PyTorch's digamma of a float value (digamma(+-0) = -+inf; lower_elementwise.c). */
tp_val lw_digamma(tp_emit *e, tp_val x);

#endif

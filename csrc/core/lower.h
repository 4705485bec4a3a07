/* lower.h - the ONE table of lowering rules: ATen op -> StableHLO.
 *
 * A rule receives one op call (a tp_node: the op's schema arguments in
 * order, tensor arguments already turned into SSA values, and the output
 * types PyTorch's meta functions computed) and emits StableHLO for it.
 * Eager mode calls rules on one-op programs; compiled mode calls the same
 * rules node by node on whole graphs.
 */
#ifndef TP_LOWER_H
#define TP_LOWER_H

#include "emit.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tp_arg_kind {
  TP_ARG_NONE = 0,
  TP_ARG_TENSOR,  /* .v: the value */
  TP_ARG_SCALAR,  /* a runtime number (Scalar, or a wrapped 0-dim CPU tensor): .sdt, .f/.i */
  TP_ARG_INT,     /* .i (also dtypes, layouts, memory formats, SymInt) */
  TP_ARG_FLOAT,   /* .f */
  TP_ARG_BOOL,    /* .i */
  TP_ARG_INTS,    /* .ints[.n] */
  TP_ARG_STR,     /* .s */
  TP_ARG_TENSORS, /* .vs[.n], -1 where an optional entry is None */
} tp_arg_kind;

typedef struct tp_arg {
  tp_arg_kind kind;
  int64_t i;
  double f;
  double fi;          /* SCALAR: the imaginary part of a complex number */
  tp_dtype sdt;       /* SCALAR: its natural dtype (I64, F64, BOOL, or the 0-dim tensor's) */
  int wrapped;        /* SCALAR came from a Python number (lowest promotion priority) */
  int n;
  const int64_t *ints;
  const char *s;
  tp_val v;
  const tp_val *vs;
} tp_arg;

typedef struct tp_lower_ctx tp_lower_ctx; /* owned by the caller (eager or graph) */

typedef struct tp_node {
  const char *op; /* "aten::add.Tensor" */
  int nargs;
  const tp_arg *args;
  int nouts;
  const tp_type *outs; /* output types from PyTorch's meta functions */
  tp_lower_ctx *ctx;
  /* Materialise SCALAR argument `i` as a rank-0 value of dtype `dt` (a
   * complex number with an imaginary part and a real `dt`: tp_scalar_to_real). */
  tp_val (*scalar)(tp_emit *e, const struct tp_node *n, int i, tp_dtype dt);
  /* A fresh random key (tensor<2xui64>) for RNG ops, different every call. */
  tp_val (*rng_key)(tp_emit *e, const struct tp_node *n);
  /* Declare that every element of the integer value `idx` must lie in
   * [lo, hi) (PyTorch checks indices on the host; a program cannot raise).
   * The engine records the first violation in a device-side flag and raises
   * an error of `code` with `msg` at the next point that waits for the
   * device; "{}" in msg stands for the offending value and "{{" for a
   * literal "{".  NULL: unchecked.
   * Rules call it through lw_check_range. */
  void (*check)(tp_emit *e, const struct tp_node *n, tp_val idx, int64_t lo, int64_t hi, tp_code code,
                const char *msg);
  /* Element j of integer argument i (TP_RUNTIME) as a rank-0 i64 runtime
   * operand; NULL (compiled graphs): rules use constants.  Rules call it
   * through lw_runtime_int. */
  tp_val (*runtime_int)(tp_emit *e, const struct tp_node *n, int i, int j);
  /* The same range as a check, on the values of tensor argument `arg` as
   * they are (lw_check_arg): where the host knows them when the op runs (an
   * index uploaded from a Python list or a CPU tensor), the engine checks
   * them before launch and raises at the op, as the CPU does.  NULL: only
   * the device check. */
  void (*host_check)(tp_emit *e, const struct tp_node *n, int arg, int64_t lo, int64_t hi, tp_code code,
                     const char *msg);
} tp_node;

/* The error of a complex number with an imaginary part where the op wants a
 * real scalar of dtype `dt` (PyTorch's, e.g. torch.zeros(2).fill_(1j)). */
tp_val tp_scalar_to_real(tp_emit *e, tp_dtype dt);

/* Emit the op; write one value per output into outs[0..nouts). */
typedef void (*tp_lower_fn)(tp_emit *e, const tp_node *n, tp_val *outs);

/* Look up the rule for an op name ("aten::add.Tensor"); NULL if none. */
tp_lower_fn tp_lower_find(const char *op);
/* Apply rule fn to node n (nothing if e has failed): refuses first, with
 * PyTorch's CPU messages, the ops its CPU kernels do not take complex
 * inputs for (lower.c: k_no_complex). */
void tp_lower_run(tp_lower_fn fn, tp_emit *e, const struct tp_node *n, tp_val *out);
/* A rule's flags (its entry's third field), per argument i < 16:
 * TP_FITS(i): PyTorch converts scalar argument i to the output's dtype with
 *   an overflow check, as its fill_/masked_fill/clamp/... kernels do ("value
 *   cannot be converted to type uint8_t without overflow").
 * TP_RUNTIME(i): integer argument i (an int or an int list) reaches an eager
 *   program as runtime operands, so a loop over its values runs one program
 *   (roll's shifts, triu's diagonal); the rule reads
 *   it with lw_runtime_int.  Arguments that shape the output stay static. */
#define TP_FITS(i) (1u << (i))
#define TP_RUNTIME(i) (1u << (16 + (i)))
/* The same, and the rule's flags. */
tp_lower_fn tp_lower_find_ex(const char *op, unsigned *flags);
/* Every op name in the table, NULL-terminated (for docs and tests). */
const char *const *tp_lower_names(void);

#ifdef __cplusplus
}
#endif
#endif

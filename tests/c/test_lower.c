/* test_lower.c - lowering rules survive the emitter's type table growing.
 *
 * em_type() points into a table that grows by realloc with each new value,
 * so a rule that keeps such a pointer across an emission reads freed memory
 * (seen as reshapes to garbage sizes).  Each case runs one rule after 0..299
 * dummy parameters, so that every emission in it lands once on a growth of
 * the table; under AddressSanitizer a stale read aborts the test.  The cases
 * are the rules where such reads were found, and the program must build. */
#include <stdlib.h>
#include <string.h>

#include "ctest.h"
#include "emit.h"
#include "lower.h"

static tp_type ty(tp_dtype dt, int rank, int64_t a, int64_t b, int64_t c) {
  int64_t d[3] = {a, b, c};
  return tp_type_make(dt, rank, d);
}
static tp_arg arg(tp_arg_kind kind) { return (tp_arg){.kind = kind}; }
#define a_int(x) ((tp_arg){.kind = TP_ARG_INT, .i = (x)})
#define a_bool(x) ((tp_arg){.kind = TP_ARG_BOOL, .i = (x)})
#define a_float(x) ((tp_arg){.kind = TP_ARG_FLOAT, .f = (x)})
#define a_str(x) ((tp_arg){.kind = TP_ARG_STR, .s = (x)})

/* One rule on `nin` parameters of types ins; args[i] becomes tensor input
 * tensor_of[i] where that is >= 0; with list_at >= 0 the last nlist inputs
 * become that argument's tensor list. */
typedef struct {
  const char *op;
  int nin;
  tp_type ins[4];
  int nargs;
  tp_arg args[9];
  int tensor_of[9];
  int nouts;
  tp_type outs[4];
  int list_at, nlist;
} rule_case;

static int run_case(const rule_case *c, int pad) {
  tp_emit *e = em_new();
  tp_type dummy = ty(TP_F32, 0, 0, 0, 0);
  for (int i = 0; i < pad; i++) em_param(e, &dummy);
  tp_val v[4], list[4], out[4];
  tp_arg args[9];
  for (int i = 0; i < c->nin; i++) v[i] = em_param(e, &c->ins[i]);
  for (int i = 0; i < c->nargs; i++) {
    args[i] = c->args[i];
    if (c->tensor_of[i] >= 0) {
      args[i] = arg(TP_ARG_TENSOR);
      args[i].v = v[c->tensor_of[i]];
    }
  }
  if (c->list_at >= 0) {
    for (int i = 0; i < c->nlist; i++) list[i] = v[c->nin - c->nlist + i];
    args[c->list_at] = arg(TP_ARG_TENSORS);
    args[c->list_at].vs = list;
    args[c->list_at].n = c->nlist;
  }
  tp_node n;
  memset(&n, 0, sizeof n);
  n.op = c->op;
  n.nargs = c->nargs;
  n.args = args;
  n.nouts = c->nouts;
  n.outs = c->outs;
  tp_lower_fn fn = tp_lower_find(c->op);
  int ok = fn != NULL;
  if (ok) {
    tp_lower_run(fn, e, &n, out);
    ok = !em_failed(e) && em_finish(e, out, c->nouts) != NULL;
    if (!ok) {
      tp_status *st = em_take_error(e);
      fprintf(stderr, "   %s after %d values: %s\n", c->op, pad, st ? tp_status_message(st) : "no program");
      tp_status_free(st);
    }
  }
  em_free(e);
  return ok;
}


TEST(test_rules_survive_type_table_growth) {
  const tp_arg none = arg(TP_ARG_NONE);
  const rule_case cases[] = {
      {"aten::view_as_complex", 1, {ty(TP_F32, 2, 3, 2, 0)}, 1, {none}, {0}, 1, {ty(TP_C64, 1, 3, 0, 0)}, -1, 0},
      {"aten::split.Tensor", 1, {ty(TP_F32, 2, 4, 3, 0)}, 3, {none, a_int(2), a_int(0)}, {0, -1, -1},
       2, {ty(TP_F32, 2, 2, 3, 0), ty(TP_F32, 2, 2, 3, 0)}, -1, 0},
      {"aten::diagonal", 1, {ty(TP_F32, 3, 3, 3, 2)}, 4, {none, a_int(0), a_int(0), a_int(1)}, {0, -1, -1, -1},
       1, {ty(TP_F32, 2, 2, 3, 0)}, -1, 0},
      {"aten::linalg_inv_ex", 1, {ty(TP_F32, 2, 3, 3, 0)}, 2, {none, a_bool(0)}, {0, -1},
       2, {ty(TP_F32, 2, 3, 3, 0), ty(TP_I32, 0, 0, 0, 0)}, -1, 0},
      {"aten::triangular_solve", 2, {ty(TP_F64, 2, 3, 2, 0), ty(TP_F64, 2, 3, 3, 0)}, 5,
       {none, none, a_bool(1), a_bool(0), a_bool(0)}, {0, 1, -1, -1, -1},
       2, {ty(TP_F64, 2, 3, 2, 0), ty(TP_F64, 2, 3, 3, 0)}, -1, 0},
      {"aten::_linalg_eigh", 1, {ty(TP_F64, 2, 3, 3, 0)}, 3, {none, a_str("L"), a_bool(1)}, {0, -1, -1},
       2, {ty(TP_F64, 1, 3, 0, 0), ty(TP_F64, 2, 3, 3, 0)}, -1, 0},
      {"aten::linalg_lstsq", 2, {ty(TP_F64, 2, 3, 2, 0), ty(TP_F64, 1, 3, 0, 0)}, 4,
       {none, none, none, a_str("gelsd")}, {0, 1, -1, -1},
       4, {ty(TP_F64, 1, 2, 0, 0), ty(TP_F64, 1, 0, 0, 0), ty(TP_I64, 0, 0, 0, 0), ty(TP_F64, 1, 2, 0, 0)}, -1, 0},
      {"aten::_linalg_svd", 1, {ty(TP_F64, 2, 3, 2, 0)}, 4, {none, a_bool(0), a_bool(1), none}, {0, -1, -1, -1},
       3, {ty(TP_F64, 2, 3, 2, 0), ty(TP_F64, 1, 2, 0, 0), ty(TP_F64, 2, 2, 2, 0)}, -1, 0},
      {"aten::cumsum", 1, {ty(TP_F64, 1, 40, 0, 0)}, 2, {none, a_int(0)}, {0, -1}, 1, {ty(TP_F64, 1, 40, 0, 0)}, -1, 0},
      {"aten::vdot", 2, {ty(TP_C64, 1, 3, 0, 0), ty(TP_C64, 1, 3, 0, 0)}, 2, {none, none}, {0, 1},
       1, {ty(TP_C64, 0, 0, 0, 0)}, -1, 0},
      {"aten::sort", 1, {ty(TP_F32, 1, 5, 0, 0)}, 3, {none, a_int(0), a_bool(0)}, {0, -1, -1},
       2, {ty(TP_F32, 1, 5, 0, 0), ty(TP_I64, 1, 5, 0, 0)}, -1, 0},
      {"aten::index.Tensor", 3, {ty(TP_F32, 2, 4, 5, 0), ty(TP_I64, 1, 3, 0, 0), ty(TP_I64, 1, 3, 0, 0)}, 2,
       {none, none}, {0, -1}, 1, {ty(TP_F32, 1, 3, 0, 0)}, 1, 2},
      {"aten::special_zeta", 2, {ty(TP_F64, 1, 3, 0, 0), ty(TP_F64, 1, 3, 0, 0)}, 2, {none, none}, {0, 1},
       1, {ty(TP_F64, 1, 3, 0, 0)}, -1, 0},
      {"aten::_pdist_forward", 1, {ty(TP_F64, 2, 3, 2, 0)}, 2, {none, a_float(1.0 / 0.0)}, {0, -1},
       1, {ty(TP_F64, 1, 3, 0, 0)}, -1, 0},
      {"aten::_embedding_bag", 4,
       {ty(TP_F16, 2, 5, 3, 0), ty(TP_I64, 1, 4, 0, 0), ty(TP_I64, 1, 2, 0, 0), ty(TP_F16, 1, 4, 0, 0)}, 9,
       {none, none, none, a_bool(0), a_int(0), a_bool(0), none, a_bool(0), a_int(-1)}, {0, 1, 2, -1, -1, -1, 3, -1, -1},
       4, {ty(TP_F16, 2, 2, 3, 0), ty(TP_I64, 1, 0, 0, 0), ty(TP_I64, 1, 2, 0, 0), ty(TP_I64, 1, 2, 0, 0)}, -1, 0},
      {"aten::_grouped_mm", 3, {ty(TP_F32, 2, 8, 16, 0), ty(TP_F32, 2, 16, 16, 0), ty(TP_I32, 1, 4, 0, 0)}, 5,
       {none, none, none, none, none}, {0, 1, 2, -1, -1}, 1, {ty(TP_F32, 3, 4, 8, 16)}, -1, 0},
      {"aten::_grouped_mm", 3, {ty(TP_F32, 2, 16, 16, 0), ty(TP_F32, 3, 4, 16, 8), ty(TP_I32, 1, 4, 0, 0)}, 5,
       {none, none, none, none, none}, {0, 1, 2, -1, -1}, 1, {ty(TP_F32, 2, 16, 8, 0)}, -1, 0},
      {"aten::histc", 1, {ty(TP_I32, 1, 40, 0, 0)}, 4, {none, a_int(4), a_float(0), a_float(3)}, {0, -1, -1, -1},
       1, {ty(TP_I32, 1, 4, 0, 0)}, -1, 0},
      /* grouped-query attention (4 query heads on 2 kv heads), a float bias, causal */
      {"tp::sdpa", 4, {ty(TP_F32, 3, 4, 5, 8), ty(TP_F32, 3, 2, 7, 8), ty(TP_F32, 3, 2, 7, 6), ty(TP_F32, 2, 5, 7, 0)}, 6,
       {none, none, none, none, a_bool(1), none}, {0, 1, 2, 3, -1, -1},
       2, {ty(TP_F32, 3, 4, 5, 6), ty(TP_F32, 2, 4, 5, 0)}, -1, 0},
      {"tp::sdpa_backward", 4, {ty(TP_BF16, 3, 4, 5, 6), ty(TP_BF16, 3, 4, 5, 8), ty(TP_BF16, 3, 2, 7, 8),
       ty(TP_BF16, 3, 2, 7, 6)}, 8, {none, none, none, none, none, a_bool(1), a_float(0.5), a_bool(0)},
       {0, 1, 2, 3, -1, -1, -1, -1},
       4, {ty(TP_BF16, 3, 4, 5, 8), ty(TP_BF16, 3, 2, 7, 8), ty(TP_BF16, 3, 2, 7, 6), ty(TP_BF16, 1, 0, 0, 0)}, -1, 0},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    int ok = 1;
    for (int pad = 0; pad < 300 && ok; pad++) ok = run_case(&cases[k], pad);
    CHECK(ok);
  }
}

int main(void) {
  RUN(test_rules_survive_type_table_growth);
  return ctest_finish();
}

/* test_eager.c - the eager engine against the real plugin: views of
 * storages materialised inside programs, writes through views, the program
 * cache, runtime scalars and errors.  Plugin from $TP_TEST_PLUGIN. */
#include <stdlib.h>
#include <string.h>

#include "ctest.h"
#include "eager.h"
#include "runtime.h"

static tp_tensor_ref ref(tp_storage *s, int rank, const int64_t *sizes, const int64_t *strides, int64_t off) {
  tp_tensor_ref r;
  memset(&r, 0, sizeof r);
  r.st = s;
  r.dt = TP_F32;
  r.rank = rank;
  for (int i = 0; i < rank; i++) {
    r.sizes[i] = sizes[i];
    r.strides[i] = strides[i];
  }
  r.offset = off;
  return r;
}

static tp_eager_arg tensor_arg(const tp_tensor_ref *r) {
  tp_eager_arg a;
  memset(&a, 0, sizeof a);
  a.a.kind = TP_ARG_TENSOR;
  a.t = r;
  return a;
}

static tp_eager_arg scalar_arg(double v) {
  tp_eager_arg a;
  memset(&a, 0, sizeof a);
  a.a.kind = TP_ARG_SCALAR;
  a.a.sdt = TP_F64;
  a.a.f = v;
  a.a.wrapped = 1;
  return a;
}

/* A 3x4 storage holding 0..11. */
static tp_storage *iota_storage(void) {
  tp_storage *s = tp_storage_new(0, 12 * sizeof(float));
  float v[12];
  for (int i = 0; i < 12; i++) v[i] = (float)i;
  int64_t sz[2] = {3, 4}, st[2] = {4, 1};
  tp_tensor_ref r = ref(s, 2, sz, st, 0);
  CHECK_OK(tp_eager_write_host(&r, v));
  return s;
}

TEST(test_add_with_views_and_scalars) {
  tp_storage *a = iota_storage();
  tp_storage *out = tp_storage_new(0, 12 * sizeof(float));
  int64_t sz[2] = {4, 3}, tst[2] = {1, 4}, cst[2] = {3, 1};
  tp_tensor_ref at = ref(a, 2, sz, tst, 0); /* a transposed */
  tp_tensor_ref o = ref(out, 2, sz, cst, 0);
  tp_eager_arg args[3] = {tensor_arg(&at), tensor_arg(&at), scalar_arg(10.0)};
  CHECK_OK(tp_eager_run("aten::add.Tensor", args, 3, NULL, &o, 1));
  float got[12];
  CHECK_OK(tp_eager_read_host(&o, got));
  int ok = 1;
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 3; j++) ok &= got[i * 3 + j] == (float)(j * 4 + i) * 11.0f;
  CHECK(ok);
  /* A new scalar value reuses the program. */
  tp_eager_stats s0, s1;
  tp_eager_get_stats(&s0);
  args[2] = scalar_arg(-1.0);
  CHECK_OK(tp_eager_run("aten::add.Tensor", args, 3, NULL, &o, 1));
  tp_eager_get_stats(&s1);
  CHECK_EQ_INT(s1.compiles, s0.compiles);
  CHECK_EQ_INT(s1.cache_hits, s0.cache_hits + 1);
  CHECK_OK(tp_eager_read_host(&o, got));
  CHECK(got[1] == 0.0f); /* element (0,1) = a[1][0] * 0 */
  tp_storage_free(a);
  tp_storage_free(out);
}

/* An op over more storages than storage_index searches linearly (a
 * compiled graph's hundreds): 40 one-element views, of 30 storages (every
 * third storage given twice, at another offset), concatenated; then the same
 * storages in another order hit the same program only where the pattern of
 * which arguments share a storage matches. */
TEST(test_many_storages_keep_their_identity) {
  enum { N = 40 };
  tp_storage *st[N];
  tp_tensor_ref r[N];
  const tp_tensor_ref *list[N];
  int64_t one[1] = {1}, unit[1] = {1};
  int ns = 0;
  for (int i = 0; i < N; i++) {
    int shared = i % 4 == 3; /* this one views the storage made just before */
    if (!shared) {
      st[ns] = tp_storage_new(0, 2 * sizeof(float));
      float v[2] = {(float)(10 * i), (float)(10 * i + 1)};
      int64_t two[1] = {2};
      tp_tensor_ref w = ref(st[ns], 1, two, unit, 0);
      CHECK_OK(tp_eager_write_host(&w, v));
      ns++;
    }
    r[i] = ref(st[ns - 1], 1, one, unit, shared ? 1 : 0);
    list[i] = &r[i];
  }
  tp_storage *out = tp_storage_new(0, N * sizeof(float));
  int64_t osz[1] = {N};
  tp_tensor_ref o = ref(out, 1, osz, unit, 0);
  tp_eager_arg args[2];
  memset(args, 0, sizeof args);
  args[0].a.kind = TP_ARG_TENSORS;
  args[0].a.n = N;
  args[0].ts = list;
  args[1].a.kind = TP_ARG_INT;
  args[1].a.i = 0;
  CHECK_OK(tp_eager_run("aten::cat", args, 2, NULL, &o, 1));
  float got[N];
  CHECK_OK(tp_eager_read_host(&o, got));
  int ok = 1;
  for (int i = 0; i < N; i++) ok &= got[i] == (float)(i % 4 == 3 ? 10 * (i - 1) + 1 : 10 * i);
  CHECK(ok);
  /* The same call again: a cache hit; with the first two arguments swapped
   * (two distinct storages): a hit as well, and the values follow. */
  tp_eager_stats s0, s1;
  tp_eager_get_stats(&s0);
  CHECK_OK(tp_eager_run("aten::cat", args, 2, NULL, &o, 1));
  list[0] = &r[1];
  list[1] = &r[0];
  CHECK_OK(tp_eager_run("aten::cat", args, 2, NULL, &o, 1));
  tp_eager_get_stats(&s1);
  CHECK_EQ_INT(s1.cache_hits, s0.cache_hits + 2);
  CHECK_OK(tp_eager_read_host(&o, got));
  CHECK(got[0] == 10.0f && got[1] == 0.0f && got[3] == 21.0f);
  /* Argument 3 given its own storage instead of argument 2's: another
   * aliasing pattern, another program. */
  tp_storage *lone = tp_storage_new(0, 2 * sizeof(float));
  float lv[2] = {-5, -6};
  int64_t two[1] = {2};
  tp_tensor_ref lw = ref(lone, 1, two, unit, 0);
  CHECK_OK(tp_eager_write_host(&lw, lv));
  tp_tensor_ref lr = ref(lone, 1, one, unit, 1);
  list[3] = &lr;
  tp_eager_get_stats(&s0);
  CHECK_OK(tp_eager_run("aten::cat", args, 2, NULL, &o, 1));
  tp_eager_get_stats(&s1);
  CHECK_EQ_INT(s1.cache_misses, s0.cache_misses + 1);
  CHECK_OK(tp_eager_read_host(&o, got));
  CHECK(got[3] == -6.0f && got[7] == 61.0f);
  for (int i = 0; i < ns; i++) tp_storage_free(st[i]);
  tp_storage_free(lone);
  tp_storage_free(out);
}

TEST(test_write_through_strided_view) {
  tp_storage *a = iota_storage();
  /* a[:, ::2] (3x2, strides 4,2, offset 0) and a[1:, 1] (2, stride 4, offset 5) */
  int64_t sz[2] = {3, 2}, st[2] = {4, 2};
  tp_tensor_ref v = ref(a, 2, sz, st, 0);
  tp_eager_arg args[2] = {tensor_arg(&v), scalar_arg(-1.0)};
  CHECK_OK(tp_eager_run("aten::fill.Scalar", args, 2, NULL, &v, 1));
  int64_t sz1[1] = {2}, st1[1] = {4};
  tp_tensor_ref col = ref(a, 1, sz1, st1, 5);
  tp_eager_arg args2[3] = {tensor_arg(&col), scalar_arg(100.0), scalar_arg(1.0)};
  CHECK_OK(tp_eager_run("aten::add.Tensor", args2, 3, NULL, &col, 1));
  float got[12];
  int64_t fsz[2] = {3, 4}, fst[2] = {4, 1};
  tp_tensor_ref full = ref(a, 2, fsz, fst, 0);
  CHECK_OK(tp_eager_read_host(&full, got));
  float want[12] = {-1, 1, -1, 3, -1, 105, -1, 7, -1, 109, -1, 11};
  CHECK(memcmp(got, want, sizeof want) == 0);
  /* Overlapping view (as_strided) read goes through a gather. */
  int64_t osz[2] = {3, 3}, ost[2] = {1, 1};
  tp_tensor_ref ov = ref(a, 2, osz, ost, 2);
  float g2[9];
  CHECK_OK(tp_eager_read_host(&ov, g2));
  CHECK(g2[0] == -1 && g2[1] == 3 && g2[3] == 3 && g2[5] == 105 && g2[8] == -1);
  tp_storage_free(a);
}

TEST(test_uninitialised_storage_reads_zero) {
  tp_storage *s = tp_storage_new(1, 8 * sizeof(float));
  int64_t sz[1] = {4}, st[1] = {2};
  tp_tensor_ref v = ref(s, 1, sz, st, 1);
  tp_eager_arg args[2] = {tensor_arg(&v), scalar_arg(2.5)};
  CHECK_OK(tp_eager_run("aten::fill.Scalar", args, 2, NULL, &v, 1));
  float got[8];
  int64_t fsz[1] = {8}, fst[1] = {1};
  tp_tensor_ref f = ref(s, 1, fsz, fst, 0);
  CHECK_OK(tp_eager_read_host(&f, got));
  float want[8] = {0, 2.5f, 0, 2.5f, 0, 2.5f, 0, 2.5f};
  CHECK(memcmp(got, want, sizeof want) == 0);
  tp_storage_free(s);
}

TEST(test_errors) {
  tp_storage *a = iota_storage();
  int64_t sz[2] = {3, 4}, st[2] = {4, 1};
  tp_tensor_ref r = ref(a, 2, sz, st, 0);
  tp_eager_arg arg = tensor_arg(&r);
  CHECK_ERR(tp_eager_run("aten::no_such_op", &arg, 1, NULL, &r, 1), TP_UNIMPLEMENTED);
  /* an output the operands do not broadcast to is an error, not a crash */
  int64_t bsz[2] = {4, 3}, bst[2] = {3, 1};
  tp_tensor_ref bad = ref(a, 2, bsz, bst, 0);
  tp_eager_arg args[3] = {tensor_arg(&r), tensor_arg(&r), scalar_arg(1)};
  CHECK_ERR(tp_eager_run("aten::add.Tensor", args, 3, NULL, &bad, 1), TP_INVALID_ARGUMENT);
  /* tensors on two devices */
  tp_storage *b = tp_storage_new(1, 12 * sizeof(float));
  tp_tensor_ref rb = ref(b, 2, sz, st, 0);
  tp_eager_arg mixed[3] = {tensor_arg(&r), tensor_arg(&rb), scalar_arg(1)};
  tp_storage *o = tp_storage_new(0, 12 * sizeof(float));
  tp_tensor_ref ro = ref(o, 2, sz, st, 0);
  CHECK_ERR(tp_eager_run("aten::add.Tensor", mixed, 3, NULL, &ro, 1), TP_INVALID_ARGUMENT);
  tp_storage_free(a);
  tp_storage_free(b);
  tp_storage_free(o);
}

/* The output-spec table: found only for the same op and signature, under
 * the context (default dtype) it was recorded in; a number's value matters
 * only when the op is keyed by values; tensor lists are never recorded; a
 * new context and the cap start the table over. */
TEST(test_output_specs) {
  tp_storage *a = iota_storage();
  int64_t sz[2] = {3, 4}, st[2] = {4, 1}, tst[2] = {1, 4};
  tp_tensor_ref r = ref(a, 2, sz, st, 0), rt = ref(a, 2, sz, tst, 0);
  tp_eager_arg args[2] = {tensor_arg(&r), scalar_arg(2.0)};
  tp_op_specs rec = {.n = 2}, got;
  rec.out[0] = (tp_out_spec){.defined = 1, .dt = TP_F32, .rank = 2, .sizes = {3, 4}, .strides = {4, 1}};
  CHECK(!tp_eager_specs_find("aten::mul.Tensor", args, 2, 0, TP_F32, &got));
  tp_eager_specs_record("aten::mul.Tensor", args, 2, 0, &rec);
  memset(&got, 0x5a, sizeof got);
  CHECK(tp_eager_specs_find("aten::mul.Tensor", args, 2, 0, TP_F32, &got));
  CHECK(got.n == 2 && got.out[0].defined && got.out[0].dt == TP_F32 && got.out[0].sizes[1] == 4 &&
        got.out[0].strides[0] == 4 && !got.out[1].defined);
  CHECK(!tp_eager_specs_find("aten::add.Tensor", args, 2, 0, TP_F32, &got)); /* another op */
  CHECK(!tp_eager_specs_find("aten::mul.Tensor", args, 2, 0, TP_F64, &got)); /* another default dtype */
  tp_eager_specs_context(TP_F32);                                            /* the same: kept */
  CHECK(tp_eager_specs_find("aten::mul.Tensor", args, 2, 0, TP_F32, &got));
  tp_eager_specs_context(TP_F64); /* a change drops every spec */
  CHECK(!tp_eager_specs_find("aten::mul.Tensor", args, 2, 0, TP_F64, &got));
  tp_eager_specs_context(TP_F32);
  CHECK(!tp_eager_specs_find("aten::mul.Tensor", args, 2, 0, TP_F32, &got));
  tp_eager_specs_record("aten::mul.Tensor", args, 2, 0, &rec);
  tp_eager_number_f64(&args[1].a, -7.5);                             /* another value, same type */
  CHECK(tp_eager_specs_find("aten::mul.Tensor", args, 2, 0, TP_F32, &got));
  CHECK(args[1].a.i == -7 && args[1].a.sdt == TP_F64 && args[1].a.wrapped);
  CHECK(!tp_eager_specs_find("aten::mul.Tensor", args, 2, 1, TP_F32, &got)); /* keyed by value */
  tp_eager_number_int(&args[1].a, 3, 0);                             /* an int: another signature */
  CHECK(!tp_eager_specs_find("aten::mul.Tensor", args, 2, 0, TP_F32, &got));
  tp_eager_number_f64(&args[1].a, 1e300); /* no integer view, and no overflow */
  CHECK(args[1].a.i == 0);
  args[0] = tensor_arg(&rt); /* other strides */
  CHECK(!tp_eager_specs_find("aten::mul.Tensor", args, 2, 0, TP_F32, &got));
  const tp_tensor_ref *list[1] = {&r};
  tp_eager_arg tl = {.a = {.kind = TP_ARG_TENSORS, .n = 1}, .ts = list};
  tp_eager_specs_record("aten::cat", &tl, 1, 0, &rec);
  CHECK(!tp_eager_specs_find("aten::cat", &tl, 1, 0, TP_F32, &got));
  /* over the cap the table starts over */
  setenv("TORCH_PJRT_SPEC_CACHE_SIZE", "4", 1);
  args[0] = tensor_arg(&r);
  for (int i = 0; i < 6; i++) {
    tp_eager_number_f64(&args[1].a, i);
    tp_eager_specs_record("aten::pow.Tensor_Scalar", args, 2, 1, &rec);
  }
  tp_eager_number_f64(&args[1].a, 5);
  CHECK(tp_eager_specs_find("aten::pow.Tensor_Scalar", args, 2, 1, TP_F32, &got));
  tp_eager_number_f64(&args[1].a, 0);
  CHECK(!tp_eager_specs_find("aten::pow.Tensor_Scalar", args, 2, 1, TP_F32, &got));
  unsetenv("TORCH_PJRT_SPEC_CACHE_SIZE");
  tp_eager_clear_cache();
  tp_eager_number_f64(&args[1].a, 5);
  CHECK(!tp_eager_specs_find("aten::pow.Tensor_Scalar", args, 2, 1, TP_F32, &got));
  tp_storage_free(a);
}

/* Index checks: an out-of-range index is found by the program and reported
 * at the next read (or synchronize) with PyTorch's message, once; in-range
 * and later reads succeed. */
TEST(test_index_check) {
  tp_storage *a = iota_storage();
  tp_storage *is = tp_storage_new(0, 2 * sizeof(int64_t));
  tp_storage *out = tp_storage_new(0, 8 * sizeof(float));
  int64_t sz[2] = {3, 4}, st[2] = {4, 1}, two = 2, one = 1, osz[2] = {2, 4};
  tp_tensor_ref x = ref(a, 2, sz, st, 0), o = ref(out, 2, osz, st, 0);
  tp_tensor_ref ix = ref(is, 1, &two, &one, 0);
  ix.dt = TP_I64;
  tp_eager_arg args[3] = {tensor_arg(&x), {.a = {.kind = TP_ARG_INT, .i = 0}}, tensor_arg(&ix)};
  float got[12];
  int64_t good[2] = {2, 0}, bad[2] = {1, 7};
  CHECK_OK(tp_eager_write_host(&ix, good));
  CHECK_OK(tp_eager_run("aten::index_select", args, 3, NULL, &o, 1));
  CHECK_OK(tp_eager_read_host(&o, got));
  CHECK(got[0] == 8 && got[4] == 0);
  /* values the host uploaded are checked before launch (lw_check_arg) */
  CHECK_OK(tp_eager_write_host(&ix, bad));
  tp_status *s = tp_eager_run("aten::index_select", args, 3, NULL, &o, 1);
  CHECK(s && tp_status_code(s) == TP_OUT_OF_RANGE);
  if (s) CHECK_CONTAINS(tp_status_message(s), "index out of range in self");
  tp_status_free(s);
  CHECK_OK(tp_eager_read_host(&o, got)); /* nothing deferred */
  /* gather reports the first offending value */
  int64_t gsz[2] = {1, 2}, gst[2] = {2, 1};
  tp_tensor_ref gi = ref(is, 2, gsz, gst, 0), go = ref(out, 2, gsz, gst, 0);
  gi.dt = TP_I64;
  int64_t gbad[2] = {-1, 9};
  CHECK_OK(tp_eager_write_host(&gi, gbad));
  tp_eager_arg gargs[3] = {tensor_arg(&x), {.a = {.kind = TP_ARG_INT, .i = 0}}, tensor_arg(&gi)};
  s = tp_eager_run("aten::gather", gargs, 3, NULL, &go, 1);
  CHECK(s != NULL);
  if (s) CHECK_CONTAINS(tp_status_message(s), "index -1 is out of bounds for dimension 0 with size 3");
  tp_status_free(s);
  CHECK_OK(tp_eager_synchronize(-1));
  /* x[i, j]: two checks in one program; the first failing one reports */
  tp_storage *js = tp_storage_new(0, 2 * sizeof(int64_t));
  tp_tensor_ref jx = ref(js, 1, &two, &one, 0), io = ref(out, 1, &two, &one, 0);
  jx.dt = TP_I64;
  const tp_tensor_ref *ij[2] = {&ix, &jx};
  tp_eager_arg iargs[2] = {tensor_arg(&x), {.a = {.kind = TP_ARG_TENSORS, .n = 2}, .ts = ij}};
  const struct {
    int64_t i[2], j[2];
    const char *msg;
  } cases[] = {{{2, 0}, {1, 9}, "index 9 is out of bounds for dimension 1 with size 4"},
               {{5, 0}, {7, 0}, "index 5 is out of bounds for dimension 0 with size 3"},
               {{0, 1}, {3, -5}, "index -5 is out of bounds for dimension 1 with size 4"}};
  CHECK_OK(tp_eager_write_host(&ix, good));
  CHECK_OK(tp_eager_write_host(&jx, (int64_t[2]){3, 1}));
  CHECK_OK(tp_eager_run("aten::index.Tensor", iargs, 2, NULL, &io, 1));
  CHECK_OK(tp_eager_read_host(&io, got));
  CHECK(got[0] == 11 && got[1] == 1);
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    CHECK_OK(tp_eager_write_host(&ix, cases[c].i));
    CHECK_OK(tp_eager_write_host(&jx, cases[c].j));
    CHECK_OK(tp_eager_run("aten::index.Tensor", iargs, 2, NULL, &io, 1));
    s = tp_eager_synchronize(-1);
    CHECK(s != NULL);
    if (s) CHECK_CONTAINS(tp_status_message(s), cases[c].msg);
    tp_status_free(s);
  }
  CHECK_OK(tp_eager_synchronize(-1));
  tp_storage_free(js);
  tp_storage_free(a);
  tp_storage_free(is);
  tp_storage_free(out);
}

int main(void) {
  tp_runtime_config cfg = {getenv("TP_TEST_PLUGIN"), 2};
  tp_status *st = tp_runtime_init(&cfg);
  if (st) {
    fprintf(stderr, "cannot open plugin: %s\n", tp_status_message(st));
    return 1;
  }
  RUN(test_add_with_views_and_scalars);
  RUN(test_many_storages_keep_their_identity);
  RUN(test_write_through_strided_view);
  RUN(test_uninitialised_storage_reads_zero);
  RUN(test_errors);
  RUN(test_output_specs);
  RUN(test_index_check);
  tp_eager_clear_cache();
  return ctest_finish();
}

/* test_pjrt.c - the PJRT layer (plus status and dtype) against the real
 * plugin named by $TP_TEST_PLUGIN (see `make ctest`). */
#include <dlfcn.h>
#include <link.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ctest.h"
#include "dtype.h"
#include "emit.h"
#include "pjrt.h"
#include "trace.h"
#include "status.h"

static tp_plugin *P; /* loaded once in main with cpu_device_count = 2 */

/* ---- StableHLO programs --------------------------------------------------- */

static const char kAdd[] =
    "module @add {\n"
    "  func.func public @main(%a: tensor<2x3xf32>, %b: tensor<2x3xf32>)"
    " -> tensor<2x3xf32> {\n"
    "    %0 = stablehlo.add %a, %b : tensor<2x3xf32>\n"
    "    return %0 : tensor<2x3xf32>\n"
    "  }\n"
    "}\n";

/* Two outputs: a @ b (2x3 x 3x2) and the scalar sum of a. */
static const char kDotAndSum[] =
    "module @dot_sum {\n"
    "  func.func public @main(%a: tensor<2x3xf32>, %b: tensor<3x2xf32>)"
    " -> (tensor<2x2xf32>, tensor<f32>) {\n"
    "    %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0]"
    " : (tensor<2x3xf32>, tensor<3x2xf32>) -> tensor<2x2xf32>\n"
    "    %z = stablehlo.constant dense<0.0> : tensor<f32>\n"
    "    %1 = stablehlo.reduce(%a init: %z) applies stablehlo.add across"
    " dimensions = [0, 1] : (tensor<2x3xf32>, tensor<f32>) -> tensor<f32>\n"
    "    return %0, %1 : tensor<2x2xf32>, tensor<f32>\n"
    "  }\n"
    "}\n";

/* Argument 0 may be donated to output 0. */
static const char kAddInPlace[] =
    "module @add_in_place {\n"
    "  func.func public @main(%a: tensor<2x3xf32> {tf.aliasing_output = 0 : i32},"
    " %b: tensor<2x3xf32>) -> tensor<2x3xf32> {\n"
    "    %0 = stablehlo.add %a, %b : tensor<2x3xf32>\n"
    "    return %0 : tensor<2x3xf32>\n"
    "  }\n"
    "}\n";

static const int64_t k2x3[] = {2, 3};
static const float kA[6] = {1, 2, 3, 4, 5, 6};
static const float kB[6] = {10, 20, 30, 40, 50, 60};

static tp_buffer *make_f32(int device, const float *data, const int64_t *dims,
                           int ndim) {
  tp_buffer *b = NULL;
  CHECK_OK(tp_buffer_from_host(P, device, TP_F32, dims, ndim, data, &b));
  return b;
}

static tp_exec *compile(const char *mlir) {
  tp_exec *e = NULL;
  CHECK_OK(tp_compile(P, mlir, strlen(mlir), &e));
  return e;
}

/* ---- status and dtype ----------------------------------------------------- */

TEST(test_status) {
  tp_status *st = tp_error(TP_OUT_OF_RANGE, "index %d of %s", 7, "x");
  CHECK_EQ_INT(tp_status_code(st), TP_OUT_OF_RANGE);
  CHECK_STR_EQ(tp_status_message(st), "index 7 of x");
  st = tp_error_wrap(st, "while indexing %s", "t");
  CHECK_EQ_INT(tp_status_code(st), TP_OUT_OF_RANGE);
  CHECK_STR_EQ(tp_status_message(st), "while indexing t: index 7 of x");
  tp_status_free(st);
  CHECK(tp_error_wrap(NULL, "nothing") == NULL);
  CHECK_EQ_INT(tp_status_code(NULL), TP_OK);
  tp_status_free(NULL);
  /* An error is never TP_OK. */
  st = tp_error(TP_OK, "odd");
  CHECK(tp_status_code(st) != TP_OK);
  tp_status_free(st);
}

TEST(test_dtype) {
  CHECK_EQ_INT(tp_dtype_size(TP_F32), 4);
  CHECK_EQ_INT(tp_dtype_size(TP_BF16), 2);
  CHECK_EQ_INT(tp_dtype_size(TP_C128), 16);
  CHECK_EQ_INT(tp_dtype_size(TP_BOOL), 1);
  CHECK_EQ_INT(tp_dtype_size((tp_dtype)99), 0);
  CHECK_STR_EQ(tp_dtype_name(TP_F32), "float32");
  CHECK_STR_EQ(tp_dtype_name(TP_BF16), "bfloat16");
  CHECK_STR_EQ(tp_dtype_name((tp_dtype)99), "invalid");
  CHECK_STR_EQ(tp_dtype_mlir(TP_BOOL), "i1");
  CHECK_STR_EQ(tp_dtype_mlir(TP_U8), "ui8");
  CHECK_STR_EQ(tp_dtype_mlir(TP_C64), "complex<f32>");
  CHECK(tp_dtype_mlir((tp_dtype)99) == NULL);
  const tp_dtype all[] = {TP_U8,  TP_I8,  TP_I16,  TP_I32, TP_I64,
                          TP_F16, TP_F32, TP_F64,  TP_C64, TP_C128,
                          TP_BOOL, TP_BF16, TP_U16, TP_U32, TP_U64};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
    CHECK(tp_dtype_to_pjrt(all[i]) != 0);
    CHECK_EQ_INT(tp_dtype_from_pjrt(tp_dtype_to_pjrt(all[i])), all[i]);
  }
  CHECK_EQ_INT(tp_dtype_to_pjrt((tp_dtype)99), 0);
  CHECK_EQ_INT(tp_dtype_from_pjrt(0), TP_DTYPE_INVALID);
  CHECK(tp_dtype_is_float(TP_BF16) && !tp_dtype_is_float(TP_I32));
  CHECK(tp_dtype_is_int(TP_U64) && !tp_dtype_is_int(TP_BOOL));
  CHECK(tp_dtype_is_unsigned(TP_U8) && !tp_dtype_is_unsigned(TP_I8));
  CHECK(tp_dtype_is_complex(TP_C64) && !tp_dtype_is_complex(TP_F64));
}

TEST(test_compile_options_encoding) {
  uint8_t buf[64];
  const uint8_t want[] = {0x1a, 0x04, 0x20, 0x01, 0x28, 0x01, 0x20, 0x01};
  size_t n = tp_encode_compile_options(buf, sizeof buf);
  CHECK_EQ_INT(n, sizeof want);
  CHECK(memcmp(buf, want, sizeof want) == 0);
  CHECK_EQ_INT(tp_encode_compile_options(buf, 3), 0);
}

/* ---- loading -------------------------------------------------------------- */

TEST(test_load_info) {
  CHECK_EQ_INT(tp_plugin_device_count(P), 2);
  CHECK_STR_EQ(tp_plugin_platform(P), "cpu");
  CHECK_CONTAINS(tp_plugin_api_version(P), "0.");
  CHECK(tp_plugin_xla_version(P) != NULL);
  CHECK(tp_plugin_device_kind(P, 0)[0] != '\0');
  CHECK_STR_EQ(tp_plugin_device_kind(P, 5), "");
  CHECK_STR_EQ(tp_plugin_path(P), getenv("TP_TEST_PLUGIN"));
  fprintf(stderr, "   api %s, xla_version '%s', device kind '%s'\n",
          tp_plugin_api_version(P), tp_plugin_xla_version(P),
          tp_plugin_device_kind(P, 0));
}

TEST(test_load_other_device_counts) {
  tp_plugin_options one = {.cpu_device_count = 0};
  tp_plugin *q = NULL;
  CHECK_OK(tp_plugin_load(getenv("TP_TEST_PLUGIN"), &one, &q));
  CHECK_EQ_INT(tp_plugin_device_count(q), 1);
  tp_plugin_destroy(q);
  q = NULL;
  CHECK_OK(tp_plugin_load(getenv("TP_TEST_PLUGIN"), NULL, &q));
  CHECK_EQ_INT(tp_plugin_device_count(q), 1);
  tp_plugin_destroy(q);
}

TEST(test_load_missing_file) {
  const char *path = "/nonexistent/dir/libnot_there.so";
  tp_plugin *q = NULL;
  tp_status *st = tp_plugin_load(path, NULL, &q);
  CHECK(q == NULL);
  CHECK_EQ_INT(tp_status_code(st), TP_NOT_FOUND);
  CHECK_CONTAINS(tp_status_message(st), path);
  tp_status_free(st);
}

TEST(test_load_not_a_shared_object) {
  char path[] = "/tmp/tp_not_a_plugin_XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  if (fd < 0) return;
  CHECK(write(fd, "not an ELF file\n", 16) == 16);
  close(fd);
  tp_plugin *q = NULL;
  tp_status *st = tp_plugin_load(path, NULL, &q);
  CHECK(q == NULL);
  CHECK(st != NULL);
  CHECK_CONTAINS(tp_status_message(st), path);
  CHECK_CONTAINS(tp_status_message(st), "not a loadable shared object");
  tp_status_free(st);
  unlink(path);
}

TEST(test_load_shared_object_without_pjrt) {
  /* libm is a real shared object but has no GetPjrtApi. */
  void *h = dlopen("libm.so.6", RTLD_NOW | RTLD_NOLOAD);
  if (!h) h = dlopen("libm.so.6", RTLD_NOW);
  struct link_map *lm = NULL;
  CHECK(h && dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name[0]);
  if (!lm) return;
  tp_plugin *q = NULL;
  tp_status *st = tp_plugin_load(lm->l_name, NULL, &q);
  CHECK(q == NULL);
  CHECK_EQ_INT(tp_status_code(st), TP_NOT_FOUND);
  CHECK_CONTAINS(tp_status_message(st), lm->l_name);
  CHECK_CONTAINS(tp_status_message(st), "GetPjrtApi");
  tp_status_free(st);
  dlclose(h);
}

/* ---- buffers -------------------------------------------------------------- */

/* Upload `n` bytes as dtype `dt`, check the cached metadata, download and
 * compare the raw bytes. */
static void round_trip(tp_dtype dt, const void *data, const int64_t *dims,
                       int ndim, size_t nbytes) {
  tp_buffer *b = NULL;
  CHECK_OK(tp_buffer_from_host(P, 0, dt, dims, ndim, data, &b));
  if (!b) return;
  CHECK_EQ_INT(tp_buffer_dtype(b), dt);
  CHECK_EQ_INT(tp_buffer_rank(b), ndim);
  CHECK_EQ_INT(tp_buffer_nbytes(b), nbytes);
  CHECK_EQ_INT(tp_buffer_device(b), 0);
  for (int i = 0; i < ndim; i++) CHECK_EQ_INT(tp_buffer_dims(b)[i], dims[i]);
  unsigned char back[64];
  memset(back, 0xAB, sizeof back);
  CHECK_OK(tp_buffer_to_host(b, back, nbytes));
  CHECK(memcmp(back, data, nbytes) == 0);
  CHECK_OK(tp_buffer_await(b));
  CHECK(tp_buffer_is_ready(b));
  tp_buffer_free(b);
}

TEST(test_buffer_round_trips) {
  float f[6] = {1.5f, -0.0f, 3e38f, -2.25f, INFINITY, NAN};
  round_trip(TP_F32, f, k2x3, 2, sizeof f);
  int64_t i[3] = {INT64_MIN, -1, INT64_MAX};
  const int64_t d3[] = {3};
  round_trip(TP_I64, i, d3, 1, sizeof i);
  /* bfloat16 as raw bits: 1.0, 2.0, -1.0, +inf, the smallest subnormal, 0. */
  uint16_t bf[6] = {0x3f80, 0x4000, 0xbf80, 0x7f80, 0x0001, 0x0000};
  round_trip(TP_BF16, bf, k2x3, 2, sizeof bf);
  uint8_t bl[4] = {1, 0, 1, 1};
  const int64_t d22[] = {2, 2};
  round_trip(TP_BOOL, bl, d22, 2, sizeof bl);
  /* A rank-0 scalar and an empty tensor. */
  double s = 3.25;
  round_trip(TP_F64, &s, NULL, 0, sizeof s);
  const int64_t d0[] = {0, 4};
  round_trip(TP_I32, "", d0, 2, 0);
}

TEST(test_buffer_bad_input) {
  tp_buffer *b = NULL;
  CHECK_ERR(tp_buffer_from_host(P, 2, TP_F32, k2x3, 2, kA, &b),
            TP_OUT_OF_RANGE);
  CHECK_ERR(tp_buffer_from_host(P, -1, TP_F32, k2x3, 2, kA, &b),
            TP_OUT_OF_RANGE);
  CHECK_ERR(tp_buffer_from_host(P, 0, (tp_dtype)99, k2x3, 2, kA, &b),
            TP_INVALID_ARGUMENT);
  const int64_t neg[] = {2, -3};
  CHECK_ERR(tp_buffer_from_host(P, 0, TP_F32, neg, 2, kA, &b),
            TP_INVALID_ARGUMENT);
  CHECK_ERR(tp_buffer_from_host(P, 0, TP_F32, k2x3, 2, NULL, &b),
            TP_INVALID_ARGUMENT);
  CHECK(b == NULL);
  b = make_f32(0, kA, k2x3, 2);
  float small[2];
  CHECK_ERR(tp_buffer_to_host(b, small, sizeof small), TP_INVALID_ARGUMENT);
  tp_buffer *c = NULL;
  CHECK_ERR(tp_buffer_copy_to_device(b, 0, &c), TP_INVALID_ARGUMENT);
  CHECK_ERR(tp_buffer_copy_to_device(b, 9, &c), TP_OUT_OF_RANGE);
  tp_buffer_free(b);
  tp_buffer_free(NULL);
}

TEST(test_copy_to_device) {
  tp_buffer *b = make_f32(0, kA, k2x3, 2);
  tp_buffer *c = NULL;
  CHECK_OK(tp_buffer_copy_to_device(b, 1, &c));
  if (!c) {
    tp_buffer_free(b);
    return;
  }
  CHECK_EQ_INT(tp_buffer_device(c), 1);
  CHECK_EQ_INT(tp_buffer_dtype(c), TP_F32);
  CHECK_EQ_INT(tp_buffer_numel(c), 6);
  tp_buffer_free(b); /* the copy must not depend on the source */
  float back[6] = {0};
  CHECK_OK(tp_buffer_to_host(c, back, sizeof back));
  CHECK(memcmp(back, kA, sizeof kA) == 0);
  tp_buffer_free(c);
}

TEST(test_memory_stats) {
  tp_mem_stats before, during, after;
  CHECK_OK(tp_plugin_mem_stats(P, 1, &before));
  CHECK_OK(tp_plugin_reset_peak(P, 1));
  tp_buffer *a = make_f32(1, kA, k2x3, 2);
  tp_buffer *b = make_f32(1, kB, k2x3, 2);
  CHECK_OK(tp_plugin_mem_stats(P, 1, &during));
  CHECK_EQ_INT(during.bytes_in_use, before.bytes_in_use + 48);
  CHECK_EQ_INT(during.live_buffers, before.live_buffers + 2);
  CHECK(during.peak_bytes >= during.bytes_in_use);
  tp_buffer_free(a);
  tp_buffer_free(b);
  CHECK_OK(tp_plugin_mem_stats(P, 1, &after));
  CHECK_EQ_INT(after.bytes_in_use, before.bytes_in_use);
  CHECK_EQ_INT(after.live_buffers, before.live_buffers);
  CHECK_EQ_INT(after.peak_bytes, before.bytes_in_use + 48);
  CHECK_OK(tp_plugin_reset_peak(P, 1));
  CHECK_OK(tp_plugin_mem_stats(P, 1, &after));
  CHECK_EQ_INT(after.peak_bytes, after.bytes_in_use);
  CHECK_ERR(tp_plugin_mem_stats(P, 7, &after), TP_OUT_OF_RANGE);

  /* The plugin's own view: either real numbers or TP_UNIMPLEMENTED. */
  int64_t total = -1, free_bytes = -1;
  tp_status *st = tp_plugin_device_memory(P, 0, &total, &free_bytes);
  if (st) {
    CHECK_EQ_INT(tp_status_code(st), TP_UNIMPLEMENTED);
    CHECK(tp_status_message(st)[0] != '\0');
    fprintf(stderr, "   device memory: %s\n", tp_status_message(st));
  } else {
    CHECK(total > 0 && free_bytes >= 0 && free_bytes <= total);
  }
  tp_status_free(st);
}

/* ---- compile and execute -------------------------------------------------- */

static void check_add(tp_exec *e, int device) {
  tp_buffer *a = make_f32(device, kA, k2x3, 2);
  tp_buffer *b = make_f32(device, kB, k2x3, 2);
  tp_buffer *args[2] = {a, b};
  tp_buffer *out[1] = {NULL};
  CHECK_OK(tp_execute(e, device, args, 2, NULL, out, 1));
  if (out[0]) {
    CHECK_EQ_INT(tp_buffer_device(out[0]), device);
    CHECK_EQ_INT(tp_buffer_dtype(out[0]), TP_F32);
    CHECK_EQ_INT(tp_buffer_rank(out[0]), 2);
    CHECK_EQ_INT(tp_buffer_dims(out[0])[0], 2);
    CHECK_EQ_INT(tp_buffer_dims(out[0])[1], 3);
    float r[6] = {0};
    CHECK_OK(tp_buffer_to_host(out[0], r, sizeof r));
    for (int i = 0; i < 6; i++) CHECK(r[i] == kA[i] + kB[i]);
  }
  /* Inputs were not donated, so they are still readable. */
  float back[6] = {0};
  CHECK_OK(tp_buffer_to_host(a, back, sizeof back));
  CHECK(memcmp(back, kA, sizeof kA) == 0);
  tp_buffer_free(out[0]);
  tp_buffer_free(a);
  tp_buffer_free(b);
}

TEST(test_execute_add) {
  tp_exec *e = compile(kAdd);
  if (!e) return;
  CHECK_EQ_INT(tp_exec_num_outputs(e), 1);
  check_add(e, 0);
  check_add(e, 1); /* the same portable executable on device 1 */
  tp_exec_free(e);
}

/* Under a trace, an execution is an event named after its program that
 * ends when the plugin says it completed; copies are events with bytes. */
TEST(test_trace_execution) {
  tp_exec *e = compile(kAdd);
  if (!e) return;
  tp_exec_set_name(e, "aten::add.Tensor");
  CHECK_OK(tp_trace_start());
  tp_trace_push_correlation(42);
  check_add(e, 1); /* two uploads, the add, two downloads (result, input) */
  tp_trace_pop_correlation();
  tp_trace_stop();
  check_add(e, 0); /* not recorded */
  tp_trace_event *ev = NULL;
  size_t n = 0, dropped = 1;
  CHECK_OK(tp_trace_take(10000, &ev, &n, &dropped));
  CHECK_EQ_INT(dropped, 0);
  CHECK_EQ_INT(n, 5);
  if (n == 5) {
    CHECK_EQ_INT(ev[0].kind, TP_TRACE_H2D);
    CHECK_EQ_INT(ev[0].bytes, 24);
    CHECK_EQ_INT(ev[1].kind, TP_TRACE_H2D);
    CHECK_EQ_INT(ev[2].kind, TP_TRACE_EXECUTE);
    CHECK_STR_EQ(ev[2].name, "aten::add.Tensor");
    CHECK_EQ_INT(ev[2].bytes, 24);
    CHECK_EQ_INT(ev[3].kind, TP_TRACE_D2H);
    CHECK_EQ_INT(ev[3].bytes, 24);
    CHECK_EQ_INT(ev[4].kind, TP_TRACE_D2H);
    for (size_t i = 0; i < n; i++) {
      CHECK_EQ_INT(ev[i].device, 1);
      CHECK_EQ_INT(ev[i].correlation, 42);
      CHECK(ev[i].end_ns > ev[i].start_ns);
      if (i) CHECK(ev[i].start_ns >= ev[i - 1].end_ns); /* one timeline */
    }
  }
  free(ev);
  tp_exec_free(e);
}

TEST(test_execute_two_outputs) {
  tp_exec *e = compile(kDotAndSum);
  if (!e) return;
  CHECK_EQ_INT(tp_exec_num_outputs(e), 2);
  const int64_t d32[] = {3, 2};
  const float bm[6] = {1, 0, 0, 1, 1, 1}; /* rows (1,0), (0,1), (1,1) */
  tp_buffer *a = make_f32(1, kA, k2x3, 2);
  tp_buffer *b = make_f32(1, bm, d32, 2);
  tp_buffer *args[2] = {a, b};
  tp_buffer *out[2] = {NULL, NULL};
  CHECK_OK(tp_execute(e, 1, args, 2, NULL, out, 2));
  if (out[0] && out[1]) {
    float dot[4] = {0}, sum = 0;
    CHECK_OK(tp_buffer_to_host(out[0], dot, sizeof dot));
    CHECK(dot[0] == 4 && dot[1] == 5 && dot[2] == 10 && dot[3] == 11);
    CHECK_EQ_INT(tp_buffer_rank(out[1]), 0);
    CHECK_EQ_INT(tp_buffer_nbytes(out[1]), 4);
    CHECK_OK(tp_buffer_to_host(out[1], &sum, sizeof sum));
    CHECK(sum == 21);
  }
  tp_buffer_free(out[0]);
  tp_buffer_free(out[1]);
  tp_buffer_free(a);
  tp_buffer_free(b);
  tp_exec_free(e);
}

/* A memory limit refuses uploads, copies and executions that would pass it,
 * before they happen: a donated input survives a refused execution. */
TEST(test_memory_limit) {
  tp_exec *e = compile(kAddInPlace);
  if (!e) return;
  tp_buffer *a = make_f32(0, kA, k2x3, 2);
  tp_buffer *b = make_f32(0, kB, k2x3, 2);
  tp_mem_stats m;
  CHECK_OK(tp_plugin_mem_stats(P, 0, &m));
  CHECK_EQ_INT(m.bytes_limit, -1);
  CHECK_OK(tp_plugin_set_mem_limit(P, 0, m.bytes_in_use + 12)); /* less than one more 2x3 f32 */
  tp_buffer *args[2] = {a, b};
  tp_buffer *out[1] = {NULL};
  tp_buffer *c = NULL;
  const unsigned char first[2] = {1, 0};
  CHECK_OK(tp_execute(e, 0, args, 2, first, out, 1)); /* donated: needs nothing more */
  tp_buffer_free(out[0]);
  out[0] = NULL;
  tp_buffer_free(a);
  a = make_f32(0, kA, k2x3, 2);
  args[0] = a;
  CHECK_ERR(tp_execute(e, 0, args, 2, NULL, out, 1), TP_RESOURCE_EXHAUSTED); /* 24 more bytes */
  CHECK(out[0] == NULL);
  float r[6] = {0};
  CHECK_OK(tp_buffer_to_host(a, r, sizeof r));
  CHECK(r[5] == 6);
  CHECK_ERR(tp_buffer_from_host(P, 0, TP_F32, k2x3, 2, kA, &c), TP_RESOURCE_EXHAUSTED);
  CHECK(c == NULL);
  CHECK_OK(tp_buffer_from_host(P, 1, TP_F32, k2x3, 2, kA, &c)); /* another device: no limit */
  tp_buffer_free(c);
  CHECK_OK(tp_plugin_set_mem_limit(P, 0, -1));
  CHECK_OK(tp_execute(e, 0, args, 2, NULL, out, 1));
  tp_buffer_free(out[0]);
  CHECK_ERR(tp_plugin_set_mem_limit(P, 9, 0), TP_OUT_OF_RANGE);
  tp_buffer_free(a);
  tp_buffer_free(b);
  tp_exec_free(e);
}

/* Freeing inputs while the program that reads them may still run: the
 * outputs stay right, and the byte count drops at once (the PJRT buffers
 * are destroyed later, off the caller's thread). */
TEST(test_free_while_running) {
  tp_exec *e = compile(kDotAndSum);
  if (!e) return;
  const int64_t d32[] = {3, 2};
  const float bm[6] = {1, 0, 0, 1, 1, 1};
  tp_mem_stats before, after;
  CHECK_OK(tp_plugin_mem_stats(P, 0, &before));
  tp_buffer *a = make_f32(0, kA, k2x3, 2);
  tp_buffer *b = make_f32(0, bm, d32, 2);
  tp_buffer *args[2] = {a, b};
  tp_buffer *out[2] = {NULL, NULL};
  CHECK_OK(tp_execute(e, 0, args, 2, NULL, out, 2));
  tp_buffer_free(a);
  tp_buffer_free(b);
  if (out[0] && out[1]) {
    CHECK_OK(tp_plugin_mem_stats(P, 0, &after));
    CHECK_EQ_INT(after.bytes_in_use, before.bytes_in_use + 16 + 4);
    float dot[4] = {0}, sum = 0;
    CHECK_OK(tp_buffer_to_host(out[0], dot, sizeof dot));
    CHECK(dot[0] == 4 && dot[1] == 5 && dot[2] == 10 && dot[3] == 11);
    CHECK_OK(tp_buffer_to_host(out[1], &sum, sizeof sum));
    CHECK(sum == 21);
  }
  tp_buffer_free(out[0]);
  tp_buffer_free(out[1]);
  tp_exec_free(e);
}

/* More frees than the queue holds: the rest are destroyed by the caller. */
TEST(test_free_many) {
  enum { N = 5000 };
  tp_mem_stats before, after;
  CHECK_OK(tp_plugin_mem_stats(P, 0, &before));
  tp_buffer **bufs = calloc(N, sizeof *bufs);
  CHECK(bufs != NULL);
  if (!bufs) return;
  for (int i = 0; i < N; i++) bufs[i] = make_f32(0, kA, k2x3, 2);
  for (int i = 0; i < N; i++) tp_buffer_free(bufs[i]);
  free(bufs);
  CHECK_OK(tp_plugin_mem_stats(P, 0, &after));
  CHECK_EQ_INT(after.bytes_in_use, before.bytes_in_use);
  CHECK_EQ_INT(after.live_buffers, before.live_buffers);
}

/* A forked child must not touch the parent's client: calls fail with a
 * message naming the spawn start method, and freeing a buffer or destroying
 * the plugin there neither hangs nor crashes. */
TEST(test_forked_child) {
  tp_buffer *a = make_f32(0, kA, k2x3, 2);
  fflush(NULL);
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    tp_buffer *b = NULL;
    tp_status *st = tp_buffer_from_host(P, 0, TP_F32, k2x3, 2, kA, &b);
    int ok = st && strstr(tp_status_message(st), "forked") && strstr(tp_status_message(st), "spawn");
    tp_status_free(st);
    float back[6];
    st = tp_buffer_to_host(a, back, sizeof back);
    ok = ok && st != NULL;
    tp_status_free(st);
    tp_buffer_free(a);
    tp_plugin_destroy(P);
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  float back[6] = {0};
  CHECK_OK(tp_buffer_to_host(a, back, sizeof back)); /* the parent still works */
  CHECK(memcmp(back, kA, sizeof kA) == 0);
  tp_buffer_free(a);
}

TEST(test_execute_bad_args) {
  tp_exec *e = compile(kAdd);
  if (!e) return;
  tp_buffer *a = make_f32(0, kA, k2x3, 2);
  tp_buffer *b1 = make_f32(1, kB, k2x3, 2);
  tp_buffer *args[2] = {a, b1};
  tp_buffer *out[1] = {NULL};
  /* An argument on the wrong device. */
  CHECK_ERR(tp_execute(e, 0, args, 2, NULL, out, 1), TP_INVALID_ARGUMENT);
  /* No room for the output. */
  CHECK_ERR(tp_execute(e, 0, args, 2, NULL, out, 0), TP_INVALID_ARGUMENT);
  /* Wrong number of arguments: the plugin's own error. */
  tp_status *st = tp_execute(e, 0, args, 1, NULL, out, 1);
  CHECK(st != NULL && tp_status_message(st)[0] != '\0');
  tp_status_free(st);
  CHECK_ERR(tp_execute(e, 2, args, 2, NULL, out, 1), TP_OUT_OF_RANGE);
  CHECK(out[0] == NULL);
  tp_buffer_free(a);
  tp_buffer_free(b1);
  tp_exec_free(e);
}

TEST(test_donation) {
  tp_exec *e = compile(kAddInPlace);
  if (!e) return;
  /* Not donated: the input survives. */
  tp_buffer *a = make_f32(0, kA, k2x3, 2);
  tp_buffer *b = make_f32(0, kB, k2x3, 2);
  tp_buffer *args[2] = {a, b};
  tp_buffer *out[1] = {NULL};
  CHECK_OK(tp_execute(e, 0, args, 2, NULL, out, 1));
  float r[6] = {0};
  CHECK_OK(tp_buffer_to_host(out[0], r, sizeof r));
  CHECK(r[5] == 66);
  CHECK_OK(tp_buffer_to_host(a, r, sizeof r));
  CHECK(r[5] == 6);
  tp_buffer_free(out[0]);
  out[0] = NULL;

  /* Donated: the output is right and the input is gone; reading it is an
   * error status, not a crash. */
  const unsigned char first[2] = {1, 0};
  CHECK_OK(tp_execute(e, 0, args, 2, first, out, 1));
  CHECK_OK(tp_buffer_to_host(out[0], r, sizeof r));
  CHECK(r[0] == 11 && r[5] == 66);
  tp_status *st = tp_buffer_to_host(a, r, sizeof r);
  CHECK(st != NULL);
  if (st) fprintf(stderr, "   reading a donated buffer: %s\n",
                  tp_status_message(st));
  tp_status_free(st);
  st = tp_buffer_await(a);
  CHECK(st != NULL);
  tp_status_free(st);
  /* Using it again as an argument fails cleanly too. */
  tp_buffer *out2[1] = {NULL};
  st = tp_execute(e, 0, args, 2, NULL, out2, 1);
  if (!st) st = tp_buffer_await(out2[0]);
  CHECK(st != NULL);
  tp_status_free(st);
  tp_buffer_free(out2[0]);
  tp_buffer_free(out[0]);
  tp_buffer_free(a); /* freeing a donated buffer is allowed */
  tp_buffer_free(b);
  tp_exec_free(e);
}

TEST(test_invalid_programs) {
  tp_exec *e = NULL;
  const char *garbage = "this is not MLIR";
  CHECK_ERR(tp_compile(P, garbage, strlen(garbage), &e), TP_INVALID_ARGUMENT);
  CHECK(e == NULL);
  /* Well-formed MLIR with a type error. */
  const char *bad_types =
      "module {\n"
      "  func.func public @main(%a: tensor<2xf32>, %b: tensor<3xf32>)"
      " -> tensor<2xf32> {\n"
      "    %0 = stablehlo.add %a, %b : (tensor<2xf32>, tensor<3xf32>)"
      " -> tensor<2xf32>\n"
      "    return %0 : tensor<2xf32>\n"
      "  }\n"
      "}\n";
  tp_status *st = tp_compile(P, bad_types, strlen(bad_types), &e);
  CHECK_EQ_INT(tp_status_code(st), TP_INVALID_ARGUMENT);
  CHECK(tp_status_message(st)[0] != '\0');
  fprintf(stderr, "   bad program: %.120s\n", tp_status_message(st));
  tp_status_free(st);
  CHECK(e == NULL);
  CHECK_ERR(tp_compile(P, "", 0, &e), TP_INVALID_ARGUMENT);
}

/* Measured on xla-cpu-pjrt with C API 0.81: serialize works and the bytes
 * load back in the same process and compute the right result. If a plugin
 * refuses, the refusal must be a status (a disk cache then recompiles). */
TEST(test_serialize_round_trip) {
  tp_exec *e = compile(kAdd);
  if (!e) return;
  void *data = NULL;
  size_t len = 0;
  tp_status *st = tp_exec_serialize(e, &data, &len);
  if (st) {
    CHECK(tp_status_message(st)[0] != '\0');
    fprintf(stderr, "   serialize refused: %s\n", tp_status_message(st));
    tp_status_free(st);
    tp_exec_free(e);
    return;
  }
  CHECK(len > 0);
  fprintf(stderr, "   serialized add: %zu bytes\n", len);
  tp_exec *e2 = NULL;
  st = tp_exec_deserialize(P, data, len, &e2);
  if (st) {
    CHECK(tp_status_message(st)[0] != '\0');
    fprintf(stderr, "   deserialize refused: %s\n", tp_status_message(st));
    tp_status_free(st);
  } else {
    CHECK_EQ_INT(tp_exec_num_outputs(e2), 1);
    check_add(e2, 0);
    check_add(e2, 1);
    tp_exec_free(e2);
  }
  /* Garbage bytes are an error, not a crash. */
  tp_exec *e3 = NULL;
  st = tp_exec_deserialize(P, "garbage", 7, &e3);
  CHECK(st != NULL && e3 == NULL);
  tp_status_free(st);
  free(data);
  tp_exec_free(e);
}

/* ---- threads -------------------------------------------------------------- */

static tp_exec *g_thread_exec;

static void *thread_body(void *arg) {
  int device = (int)(intptr_t)arg;
  int bad = 0;
  for (int it = 0; it < 20; it++) {
    tp_buffer *a = NULL, *b = NULL, *out[1] = {NULL};
    tp_status *st = tp_buffer_from_host(P, device, TP_F32, k2x3, 2, kA, &a);
    if (!st) st = tp_buffer_from_host(P, device, TP_F32, k2x3, 2, kB, &b);
    tp_buffer *args[2] = {a, b};
    if (!st) st = tp_execute(g_thread_exec, device, args, 2, NULL, out, 1);
    float r[6] = {0};
    if (!st) st = tp_buffer_to_host(out[0], r, sizeof r);
    if (st || r[2] != 33) bad++;
    tp_status_free(st);
    tp_buffer_free(out[0]);
    tp_buffer_free(a);
    tp_buffer_free(b);
  }
  return (void *)(intptr_t)bad;
}

TEST(test_threads) {
  g_thread_exec = compile(kAdd);
  if (!g_thread_exec) return;
  tp_mem_stats m0[2], m1[2];
  for (int d = 0; d < 2; d++) CHECK_OK(tp_plugin_mem_stats(P, d, &m0[d]));
  pthread_t t[4];
  for (int i = 0; i < 4; i++)
    pthread_create(&t[i], NULL, thread_body, (void *)(intptr_t)(i % 2));
  for (int i = 0; i < 4; i++) {
    void *bad = NULL;
    pthread_join(t[i], &bad);
    CHECK_EQ_INT((intptr_t)bad, 0);
  }
  for (int d = 0; d < 2; d++) {
    CHECK_OK(tp_plugin_mem_stats(P, d, &m1[d]));
    CHECK_EQ_INT(m1[d].bytes_in_use, m0[d].bytes_in_use);
    CHECK_EQ_INT(m1[d].live_buffers, m0[d].live_buffers);
  }
  tp_exec_free(g_thread_exec);
}

/* e failed with a message containing `what`; frees e. */
static void check_refused(tp_emit *e, const char *what) {
  tp_status *st = em_take_error(e);
  CHECK(st && strstr(tp_status_message(st), what));
  tp_status_free(st);
  em_free(e);
}

/* Run `ex` (one output) on device 0 and read its output into r. */
static void run_f32(tp_exec *ex, tp_buffer **in, int nin, float *r, size_t bytes) {
  tp_buffer *o[1] = {NULL};
  CHECK_OK(tp_execute(ex, 0, in, nin, NULL, o, 1));
  if (o[0]) CHECK_OK(tp_buffer_to_host(o[0], r, bytes));
  tp_buffer_free(o[0]);
}

/* ---- emitter: structured while loop ----------------------------------------- */

/* for (i = 0; i < 4; i++) acc = acc * 2 + x;  with x from outside the loop. */
TEST(test_emit_while) {
  tp_emit *e = em_new();
  tp_type t = tp_type_make(TP_F32, 2, k2x3);
  tp_val x = em_param(e, &t);
  tp_val init[2] = {em_const_i(e, 0, TP_I64), em_full(e, 1.0, &t)};
  tp_val a[2], b[2], next[2], out[2];
  em_loop L;
  CHECK(em_while_begin(e, &L, init, 2, a) == 0);
  tp_val pred = em_compare(e, "LT", a[0], em_const_i(e, 4, TP_I64));
  CHECK(em_while_body(e, &L, pred, b) == 0);
  next[0] = em_binary(e, "stablehlo.add", b[0], em_const_i(e, 1, TP_I64));
  next[1] = em_binary(e, "stablehlo.add", em_binary(e, "stablehlo.multiply", b[1], em_full(e, 2.0, &t)), x);
  CHECK(em_while_end(e, &L, next, out) == 0);
  const char *text = em_finish(e, &out[1], 1);
  CHECK(text != NULL);
  tp_exec *ex = text ? compile(text) : NULL;
  if (ex) {
    tp_buffer *xb = make_f32(0, kA, k2x3, 2);
    float r[6] = {0};
    run_f32(ex, &xb, 1, r, sizeof r);
    for (int i = 0; i < 6; i++) CHECK(r[i] == 16.0f + 15.0f * kA[i]);
    tp_buffer_free(xb);
    tp_exec_free(ex);
  }
  /* A body that changes a carried value's type is refused with a message. */
  tp_emit *e2 = em_new();
  tp_val i0 = em_const_i(e2, 0, TP_I64), c[1], d[1], o2[1];
  em_loop L2;
  em_while_begin(e2, &L2, &i0, 1, c);
  em_while_body(e2, &L2, em_compare(e2, "LT", c[0], em_const_i(e2, 4, TP_I64)), d);
  tp_val wrong = em_const(e2, 1.0, TP_F32);
  CHECK(em_while_end(e2, &L2, &wrong, o2) == -1);
  check_refused(e2, "changes type");
  em_free(e);
}

/* ---- emitter: conditional ---------------------------------------------------- */

/* out = case i of {x + 1, x * 2, -x} for a runtime index i: each index picks its
 * branch; an index out of range picks the last. */
TEST(test_emit_case) {
  tp_emit *e = em_new();
  tp_type t = tp_type_make(TP_F32, 2, k2x3), it = tp_type_make(TP_I32, 0, NULL);
  tp_val x = em_param(e, &t), i = em_param(e, &it);
  em_case C;
  CHECK(em_case_begin(e, &C, i, 3) == 0);
  CHECK(em_case_next(e, &C, em_binary(e, "stablehlo.add", x, em_full(e, 1.0, &t))) == 0);
  CHECK(em_case_next(e, &C, em_binary(e, "stablehlo.multiply", x, em_full(e, 2.0, &t))) == 0);
  CHECK(em_case_next(e, &C, em_unary(e, "stablehlo.negate", x)) == 0);
  tp_val out = em_case_end(e, &C);
  CHECK(out >= 0);
  const char *text = em_finish(e, &out, 1);
  CHECK(text != NULL);
  tp_exec *ex = text ? compile(text) : NULL;
  for (int32_t pick = 0; ex && pick < 4; pick++) {
    tp_buffer *in[2] = {make_f32(0, kA, k2x3, 2), NULL};
    CHECK_OK(tp_buffer_from_host(P, 0, TP_I32, NULL, 0, &pick, &in[1]));
    float r[6] = {0};
    run_f32(ex, in, 2, r, sizeof r);
    for (int j = 0; j < 6; j++) CHECK(r[j] == (pick == 0 ? kA[j] + 1 : pick == 1 ? kA[j] * 2 : -kA[j]));
    tp_buffer_free(in[0]);
    tp_buffer_free(in[1]);
  }
  tp_exec_free(ex);
  /* Branches of different types are refused with a message. */
  tp_emit *e2 = em_new();
  em_case C2;
  em_case_begin(e2, &C2, em_const_i(e2, 0, TP_I32), 2);
  em_case_next(e2, &C2, em_const(e2, 1.0, TP_F32));
  CHECK(em_case_next(e2, &C2, em_const(e2, 1.0, TP_F64)) == -1);
  check_refused(e2, "another type");
  em_free(e);
}

/* ---- emitter: elementwise ops on reshaped values ------------------------------- */

/* A flat value viewed as 2x3, updated elementwise with a number and a second
 * flat value, and flattened again: the ops run on the flat values (the
 * result is the flat select itself; the reshapes left unused are dead code
 * XLA drops), and the result is right.  An operand that is
 * not a reshape (a 2x3 parameter) keeps the op in its shape. */
TEST(test_emit_elementwise_on_reshapes) {
  tp_emit *e = em_new();
  int64_t six = 6;
  tp_type flat = tp_type_make(TP_F32, 1, &six), t = tp_type_make(TP_F32, 2, k2x3);
  tp_val a = em_param(e, &flat), b = em_param(e, &flat);
  tp_val a2 = em_reshape(e, a, 2, k2x3), b2 = em_reshape(e, b, 2, k2x3);
  tp_val y = em_binary(e, "stablehlo.add", em_binary(e, "stablehlo.multiply", a2, em_full(e, 3.0, &t)), b2);
  tp_val big = em_compare(e, "GT", y, em_full(e, 10.0, &t));
  tp_val z = em_select(e, big, y, em_unary(e, "stablehlo.negate", y));
  CHECK_EQ_INT(em_type(e, z)->rank, 2);
  tp_val out = em_reshape(e, z, 1, &six);
  const char *text = em_finish(e, &out, 1);
  char def[64];
  snprintf(def, sizeof def, "%%v%d = \"stablehlo.select\"", out); /* the result is the flat select */
  CHECK(text != NULL && strstr(text, def));
  tp_exec *ex = text ? compile(text) : NULL;
  if (ex) {
    tp_buffer *in[2] = {make_f32(0, kA, &six, 1), make_f32(0, kA, &six, 1)};
    float r[6] = {0};
    run_f32(ex, in, 2, r, sizeof r);
    for (int j = 0; j < 6; j++) CHECK(r[j] == (4 * kA[j] > 10 ? 4 * kA[j] : -4 * kA[j]));
    tp_buffer_free(in[0]);
    tp_buffer_free(in[1]);
    tp_exec_free(ex);
  }
  em_free(e);
  tp_emit *e2 = em_new();
  tp_val p = em_param(e2, &flat), q = em_param(e2, &t);
  tp_val s2 = em_binary(e2, "stablehlo.add", em_reshape(e2, p, 2, k2x3), q);
  CHECK_EQ_INT(em_type(e2, s2)->rank, 2);
  const char *text2 = em_finish(e2, &s2, 1);
  char def2[64];
  snprintf(def2, sizeof def2, "%%v%d = \"stablehlo.add\"", s2);
  CHECK(text2 != NULL && strstr(text2, def2));
  em_free(e2);
}

/* ---- emitter: column reductions ---------------------------------------------- */

/* Sums and maxima over the leading dims of [R1, R2, 3] (R = 1100 rows: windows
 * of 32, the last padded, three levels) and of [5, 3] (one window), against
 * the loops; small integers, so the sums are exact.  Only for XLA:CPU: other
 * targets get the plain reduce. */
TEST(test_emit_column_reduction) {
  const int64_t shapes[2][3] = {{50, 22, 3}, {5, 3, 0}};
  for (int k = 0; k < 2; k++) {
    const int rank = shapes[k][2] ? 3 : 2, nred = rank - 1;
    const int64_t rows = rank == 3 ? shapes[k][0] * shapes[k][1] : shapes[k][0], n = rows * 3;
    float *x = malloc((size_t)n * sizeof *x);
    for (int64_t i = 0; i < n; i++) x[i] = (float)((i * 7919) % 13) - 6.0f;
    const char *ops[2] = {"stablehlo.add", "stablehlo.maximum"};
    for (int o = 0; o < 2; o++) {
      tp_emit *e = em_new();
      em_set_cpu_codegen(e, 1);
      tp_type t = tp_type_make(TP_F32, rank, shapes[k]);
      tp_val p = em_param(e, &t);
      const int64_t dims[2] = {0, 1};
      tp_val r = em_reduce(e, p, em_const(e, o ? -INFINITY : 0.0, TP_F32), dims, nred, ops[o]);
      CHECK(em_type(e, r)->rank == 1 && em_type(e, r)->dims[0] == 3);
      const char *text = em_finish(e, &r, 1);
      CHECK(text != NULL && strstr(text, "stablehlo.reduce_window") && !strstr(text, "\"stablehlo.reduce\""));
      tp_exec *ex = text ? compile(text) : NULL;
      if (ex) {
        tp_buffer *in = make_f32(0, x, shapes[k], rank);
        float got[3] = {0};
        run_f32(ex, &in, 1, got, sizeof got);
        for (int c = 0; c < 3; c++) {
          float want = o ? -INFINITY : 0.0f;
          for (int64_t i = 0; i < rows; i++) want = o ? fmaxf(want, x[i * 3 + c]) : want + x[i * 3 + c];
          CHECK(got[c] == want);
        }
        tp_buffer_free(in);
        tp_exec_free(ex);
      }
      em_free(e);
    }
    free(x);
  }
  tp_emit *e = em_new();
  tp_type t = tp_type_make(TP_F32, 2, (const int64_t[]){50, 3});
  const int64_t d0 = 0;
  tp_val r = em_reduce(e, em_param(e, &t), em_const(e, 0.0, TP_F32), &d0, 1, "stablehlo.add");
  const char *text = em_finish(e, &r, 1);
  CHECK(text != NULL && strstr(text, "\"stablehlo.reduce\"") && !strstr(text, "reduce_window"));
  em_free(e);
}

/* ---- emitter: runtime-indexed slices ----------------------------------------- */

/* row = x[i:i+1, :] at a runtime i = 1; out = x with row 0 replaced by it. */
TEST(test_emit_dyn_slice) {
  tp_emit *e = em_new();
  tp_type t = tp_type_make(TP_F32, 2, k2x3);
  tp_val x = em_param(e, &t);
  tp_val zero = em_const_i(e, 0, TP_I64), one = em_const_i(e, 1, TP_I64);
  tp_val st[2] = {one, zero};
  int64_t sz[2] = {1, 3};
  tp_val row = em_dyn_slice(e, x, st, sz);
  CHECK(em_type(e, row)->dims[0] == 1 && em_type(e, row)->dims[1] == 3);
  tp_val st0[2] = {zero, zero};
  tp_val out = em_dyn_update_slice(e, x, row, st0);
  const char *text = em_finish(e, &out, 1);
  CHECK(text != NULL);
  tp_exec *ex = text ? compile(text) : NULL;
  if (ex) {
    tp_buffer *xb = make_f32(0, kA, k2x3, 2);
    float r[6] = {0};
    run_f32(ex, &xb, 1, r, sizeof r);
    for (int i = 0; i < 6; i++) CHECK(r[i] == kA[3 + i % 3]);
    tp_buffer_free(xb);
    tp_exec_free(ex);
  }
  em_free(e);
}

/* Float-only StableHLO ops refuse integer operands, and subtract a bool
 * one, in the emitter (NotImplementedError naming the op being lowered),
 * rather than in the compiler; float operands still emit. */
TEST(test_emit_refuses_operand_dtypes) {
  static const struct { const char *op; tp_dtype dt; } bad[] = {
      {"stablehlo.exponential", TP_I64}, {"stablehlo.sqrt", TP_BOOL}, {"stablehlo.subtract", TP_BOOL},
      {"stablehlo.abs", TP_U8}, {"chlo.erf", TP_I32}};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    tp_emit *e = em_new();
    tp_type t = tp_type_make(bad[i].dt, 2, k2x3);
    tp_val x = em_param(e, &t);
    CHECK(em_set_op(e, "aten::test_op") == NULL);
    tp_val y = em_unary(e, bad[i].op, x);
    CHECK(y < 0 && em_failed(e));
    tp_status *st = em_take_error(e);
    CHECK(st && tp_status_code(st) == TP_UNIMPLEMENTED);
    CHECK(st && strstr(tp_status_message(st), "\"aten::test_op\" not implemented for") != NULL);
    CHECK(st && strstr(tp_status_message(st), tp_dtype_name(bad[i].dt)) != NULL);
    tp_status_free(st);
    em_free(e);
  }
  tp_emit *e = em_new();
  tp_type f = tp_type_make(TP_F32, 2, k2x3), u = tp_type_make(TP_U8, 2, k2x3);
  tp_val a = em_unary(e, "stablehlo.exponential", em_param(e, &f));
  tp_val b = em_unary(e, "stablehlo.negate", em_param(e, &u));
  CHECK(a >= 0 && b >= 0 && !em_failed(e));
  em_free(e);
}

int main(void) {
  RUN(test_status);
  RUN(test_dtype);
  RUN(test_compile_options_encoding);
  RUN(test_load_missing_file);
  RUN(test_load_not_a_shared_object);
  RUN(test_load_shared_object_without_pjrt);

  const char *path = getenv("TP_TEST_PLUGIN");
  if (!path || !path[0]) {
    fprintf(stderr, "TP_TEST_PLUGIN is not set; run `make ctest`\n");
    CHECK(path && path[0]);
    return ctest_finish();
  }
  tp_plugin_options opts = {.cpu_device_count = 2, .asynchronous = 1};
  tp_status *st = tp_plugin_load(path, &opts, &P);
  if (st) {
    fprintf(stderr, "cannot load %s: %s\n", path, tp_status_message(st));
    tp_status_free(st);
    CHECK(P != NULL);
    return ctest_finish();
  }
  RUN(test_load_info);
  RUN(test_load_other_device_counts);
  RUN(test_buffer_round_trips);
  RUN(test_buffer_bad_input);
  RUN(test_copy_to_device);
  RUN(test_memory_stats);
  RUN(test_memory_limit);
  RUN(test_execute_add);
  RUN(test_trace_execution);
  RUN(test_execute_two_outputs);
  RUN(test_free_while_running);
  RUN(test_free_many);
  RUN(test_forked_child);
  RUN(test_execute_bad_args);
  RUN(test_donation);
  RUN(test_invalid_programs);
  RUN(test_serialize_round_trip);
  RUN(test_threads);
  RUN(test_emit_while);
  RUN(test_emit_case);
  RUN(test_emit_elementwise_on_reshapes);
  RUN(test_emit_column_reduction);
  RUN(test_emit_dyn_slice);
  RUN(test_emit_refuses_operand_dtypes);
  tp_plugin_destroy(P);
  return ctest_finish();
}

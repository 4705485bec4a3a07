/* module.c - torch_pjrt._C: the Python face of the C core (plain CPython API).
 *
 * Tensors cross this boundary as plain tuples the Python layer builds:
 *   ('T', storage_ptr, dtype_code, sizes, strides, storage_offset)  a tensor view
 *   ('S', dtype_code, value, wrapped)                               a runtime scalar
 *   ('L', [tensor tuple or None, ...])                              a tensor list
 * and other arguments as None, bool, int, float, str or a list of ints.
 * Errors become Python exceptions: TP_UNIMPLEMENTED -> NotImplementedError,
 * TP_OUT_OF_RANGE -> IndexError, everything else -> RuntimeError.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdlib.h>
#include <string.h>

#include "eager.h"
#include "graph.h"
#include "runtime.h"

static PyObject *raise_status(tp_status *st) {
  PyObject *exc = PyExc_RuntimeError, *oom = NULL;
  switch (tp_status_code(st)) {
    case TP_UNIMPLEMENTED: exc = PyExc_NotImplementedError; break;
    case TP_OUT_OF_RANGE: exc = PyExc_IndexError; break;
    case TP_RESOURCE_EXHAUSTED: { /* torch.OutOfMemoryError, as CUDA's allocator raises */
      PyObject *torch = PyImport_ImportModule("torch");
      oom = torch ? PyObject_GetAttrString(torch, "OutOfMemoryError") : NULL;
      Py_XDECREF(torch);
      PyErr_Clear();
      if (oom) exc = oom;
      break;
    }
    default: break;
  }
  PyErr_SetString(exc, tp_status_message(st));
  Py_XDECREF(oom);
  tp_status_free(st);
  return NULL;
}

static int parse_dims(PyObject *seq, int64_t *out, int *rank) {
  PyObject *f = PySequence_Fast(seq, "expected a sequence of ints");
  if (!f) return -1;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(f);
  if (n > TP_MAX_RANK) {
    Py_DECREF(f);
    PyErr_Format(PyExc_RuntimeError, "tensors of more than %d dimensions are not supported on tpu", TP_MAX_RANK);
    return -1;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    out[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(f, i));
    if (out[i] == -1 && PyErr_Occurred()) {
      Py_DECREF(f);
      return -1;
    }
  }
  Py_DECREF(f);
  *rank = (int)n;
  return 0;
}

/* ('T', ptr, dtype, sizes, strides, offset) */
static int parse_ref(PyObject *o, tp_tensor_ref *r) {
  if (!PyTuple_Check(o) || PyTuple_GET_SIZE(o) != 6) {
    PyErr_SetString(PyExc_TypeError, "internal: malformed tensor reference");
    return -1;
  }
  memset(r, 0, sizeof *r);
  r->st = (tp_storage *)PyLong_AsVoidPtr(PyTuple_GET_ITEM(o, 1));
  r->dt = (tp_dtype)PyLong_AsLong(PyTuple_GET_ITEM(o, 2));
  int rank2 = 0;
  if (parse_dims(PyTuple_GET_ITEM(o, 3), r->sizes, &r->rank) < 0) return -1;
  if (parse_dims(PyTuple_GET_ITEM(o, 4), r->strides, &rank2) < 0) return -1;
  r->offset = PyLong_AsLongLong(PyTuple_GET_ITEM(o, 5));
  if (PyErr_Occurred()) return -1;
  if (!r->st || rank2 != r->rank) {
    PyErr_SetString(PyExc_TypeError, "internal: malformed tensor reference");
    return -1;
  }
  if (!tp_dtype_mlir(r->dt)) {
    PyErr_Format(PyExc_TypeError, "dtype code %d is not supported on tpu", (int)r->dt);
    return -1;
  }
  return 0;
}

/* Everything one run() call allocates, freed in one place. */
typedef struct call_mem {
  tp_eager_arg *args;
  tp_tensor_ref *refs; /* all refs, args' and lists' */
  const tp_tensor_ref **ptrs;
  int64_t *ints;
  size_t nrefs, nptrs, nints;
} call_mem;

static void call_mem_free(call_mem *m) {
  free(m->args);
  free(m->refs);
  free(m->ptrs);
  free(m->ints);
}

/* First pass: count refs, list entries and ints so one allocation of each suffices. */
static int count_arg(PyObject *o, call_mem *m) {
  if (PyTuple_Check(o) && PyTuple_GET_SIZE(o) >= 1 && PyUnicode_Check(PyTuple_GET_ITEM(o, 0))) {
    const char *tag = PyUnicode_AsUTF8(PyTuple_GET_ITEM(o, 0));
    if (tag && tag[0] == 'T') m->nrefs++;
    if (tag && tag[0] == 'L' && PyTuple_GET_SIZE(o) == 2) {
      Py_ssize_t n = PySequence_Size(PyTuple_GET_ITEM(o, 1));
      if (n < 0) return -1;
      m->nrefs += (size_t)n;
      m->nptrs += (size_t)n;
    }
  } else if (PyList_Check(o) || PyTuple_Check(o)) {
    m->nints += (size_t)PySequence_Size(o);
  }
  return 0;
}

static int parse_arg(PyObject *o, tp_eager_arg *a, call_mem *m) {
  memset(a, 0, sizeof *a);
  if (o == Py_None) {
    a->a.kind = TP_ARG_NONE;
  } else if (PyBool_Check(o)) {
    a->a.kind = TP_ARG_BOOL;
    a->a.i = o == Py_True;
  } else if (PyLong_Check(o)) {
    a->a.kind = TP_ARG_INT;
    a->a.i = PyLong_AsLongLong(o);
  } else if (PyFloat_Check(o)) {
    a->a.kind = TP_ARG_FLOAT;
    a->a.f = PyFloat_AS_DOUBLE(o);
  } else if (PyUnicode_Check(o)) {
    a->a.kind = TP_ARG_STR;
    a->a.s = PyUnicode_AsUTF8(o);
  } else if (PyTuple_Check(o) && PyTuple_GET_SIZE(o) >= 1 && PyUnicode_Check(PyTuple_GET_ITEM(o, 0))) {
    const char *tag = PyUnicode_AsUTF8(PyTuple_GET_ITEM(o, 0));
    if (tag[0] == 'T') {
      tp_tensor_ref *r = &m->refs[m->nrefs++];
      if (parse_ref(o, r) < 0) return -1;
      a->a.kind = TP_ARG_TENSOR;
      a->t = r;
    } else if (tag[0] == 'S' && PyTuple_GET_SIZE(o) == 4) {
      a->a.kind = TP_ARG_SCALAR;
      a->a.sdt = (tp_dtype)PyLong_AsLong(PyTuple_GET_ITEM(o, 1));
      PyObject *v = PyTuple_GET_ITEM(o, 2);
      if (PyFloat_Check(v)) {
        a->a.f = PyFloat_AS_DOUBLE(v);
        a->a.i = (int64_t)a->a.f;
      } else if (PyComplex_Check(v)) {
        a->a.f = PyComplex_RealAsDouble(v);
        a->a.fi = PyComplex_ImagAsDouble(v);
      } else {
        int overflow = 0;
        a->a.i = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow) {
          /* uint64 values above INT64_MAX */
          a->a.i = (int64_t)PyLong_AsUnsignedLongLongMask(v);
        }
        a->a.f = PyLong_AsDouble(v);
        if (PyErr_Occurred()) PyErr_Clear();
      }
      a->a.wrapped = PyObject_IsTrue(PyTuple_GET_ITEM(o, 3));
    } else if (tag[0] == 'L' && PyTuple_GET_SIZE(o) == 2) {
      PyObject *f = PySequence_Fast(PyTuple_GET_ITEM(o, 1), "expected a list of tensors");
      if (!f) return -1;
      Py_ssize_t n = PySequence_Fast_GET_SIZE(f);
      a->a.kind = TP_ARG_TENSORS;
      a->a.n = (int)n;
      a->ts = &m->ptrs[m->nptrs];
      for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *it = PySequence_Fast_GET_ITEM(f, i);
        if (it == Py_None) {
          m->ptrs[m->nptrs++] = NULL;
          continue;
        }
        tp_tensor_ref *r = &m->refs[m->nrefs++];
        if (parse_ref(it, r) < 0) {
          Py_DECREF(f);
          return -1;
        }
        m->ptrs[m->nptrs++] = r;
      }
      Py_DECREF(f);
    } else {
      PyErr_SetString(PyExc_TypeError, "internal: unknown argument tag");
      return -1;
    }
  } else if (PyList_Check(o) || PyTuple_Check(o)) {
    Py_ssize_t n = PySequence_Size(o);
    a->a.kind = TP_ARG_INTS;
    a->a.n = (int)n;
    a->a.ints = &m->ints[m->nints];
    for (Py_ssize_t i = 0; i < n; i++) {
      PyObject *it = PySequence_GetItem(o, i);
      if (!it) return -1;
      m->ints[m->nints++] = PyLong_AsLongLong(it);
      Py_DECREF(it);
    }
  } else {
    PyErr_Format(PyExc_TypeError, "internal: cannot pass %s to the tpu runtime", Py_TYPE(o)->tp_name);
    return -1;
  }
  return PyErr_Occurred() ? -1 : 0;
}

/* run(op, args, out_types, outs) */
/* After an op ran: the engine's note of an op recompiled for new values of
 * one argument (eager.h), as torch_pjrt._dispatch._warn_recompile words it.
 * -1 with an exception where the warning is an error. */
static int warn_recompile(void) {
  char op[128];
  int arg, count, tensor;
  if (!tp_eager_recompile_pending() || !tp_eager_recompile_note(op, sizeof op, &arg, &count, &tensor)) return 0;
  PyObject *m = PyImport_ImportModule("torch_pjrt._dispatch");
  PyObject *r = m ? PyObject_CallMethod(m, "_warn_recompile", "siii", op, arg, count, tensor) : NULL;
  Py_XDECREF(m);
  if (!r) return -1;
  Py_DECREF(r);
  return 0;
}

static PyObject *py_run(PyObject *self, PyObject *pyargs) {
  (void)self;
  const char *op;
  PyObject *args, *out_types, *outs, *gen = Py_None;
  if (!PyArg_ParseTuple(pyargs, "sO!OO!|O", &op, &PyTuple_Type, &args, &out_types, &PyTuple_Type, &outs, &gen))
    return NULL;
  tp_rng_state rng = {0, 0};
  if (gen != Py_None && !PyArg_ParseTuple(gen, "KK", &rng.seed, &rng.offset)) return NULL;
  Py_ssize_t nargs = PyTuple_GET_SIZE(args), nouts = PyTuple_GET_SIZE(outs);
  call_mem m = {0};
  tp_type *ot = NULL;
  tp_tensor_ref *orefs = NULL;
  PyObject *ret = NULL;
  for (Py_ssize_t i = 0; i < nargs; i++)
    if (count_arg(PyTuple_GET_ITEM(args, i), &m) < 0) goto done;
  m.args = calloc((size_t)nargs + 1, sizeof(tp_eager_arg));
  m.refs = calloc(m.nrefs + 1, sizeof(tp_tensor_ref));
  m.ptrs = calloc(m.nptrs + 1, sizeof(tp_tensor_ref *));
  m.ints = calloc(m.nints + 1, sizeof(int64_t));
  orefs = calloc((size_t)nouts + 1, sizeof(tp_tensor_ref));
  if (!m.args || !m.refs || !m.ptrs || !m.ints || !orefs) {
    PyErr_NoMemory();
    goto done;
  }
  m.nrefs = m.nptrs = m.nints = 0;
  for (Py_ssize_t i = 0; i < nargs; i++)
    if (parse_arg(PyTuple_GET_ITEM(args, i), &m.args[i], &m) < 0) goto done;
  for (Py_ssize_t i = 0; i < nouts; i++)
    if (parse_ref(PyTuple_GET_ITEM(outs, i), &orefs[i]) < 0) goto done;
  if (out_types != Py_None) {
    if (!PyTuple_Check(out_types) || PyTuple_GET_SIZE(out_types) != nouts) {
      PyErr_SetString(PyExc_TypeError, "internal: out_types must match outs");
      goto done;
    }
    ot = calloc((size_t)nouts + 1, sizeof(tp_type));
    if (!ot) {
      PyErr_NoMemory();
      goto done;
    }
    for (Py_ssize_t i = 0; i < nouts; i++) {
      PyObject *t = PyTuple_GET_ITEM(out_types, i);
      if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 2) {
        PyErr_SetString(PyExc_TypeError, "internal: out_types entries are (dtype, sizes)");
        goto done;
      }
      ot[i].dt = (tp_dtype)PyLong_AsLong(PyTuple_GET_ITEM(t, 0));
      if (parse_dims(PyTuple_GET_ITEM(t, 1), ot[i].dims, &ot[i].rank) < 0) goto done;
    }
  }
  tp_status *st;
  Py_BEGIN_ALLOW_THREADS st = tp_eager_run_rng(op, m.args, (int)nargs, ot, orefs, (int)nouts, gen != Py_None ? &rng : NULL);
  Py_END_ALLOW_THREADS if (st) {
    raise_status(st);
    goto done;
  }
  if (warn_recompile() < 0) goto done;
  ret = gen != Py_None ? PyLong_FromUnsignedLongLong(rng.offset) : Py_NewRef(Py_None);
done:
  call_mem_free(&m);
  free(ot);
  free(orefs);
  return ret;
}

/* ---- graphs (compiled mode) ------------------------------------------------
 * Node arguments use ('V', value_id) for tensors and ('L', [('V', id) | None])
 * for tensor lists; numbers are ('S', dtype, value, wrapped) as in run(). */

static int parse_type(PyObject *t, tp_type *out) {
  if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 2) {
    PyErr_SetString(PyExc_TypeError, "internal: types are (dtype, sizes)");
    return -1;
  }
  memset(out, 0, sizeof *out);
  out->dt = (tp_dtype)PyLong_AsLong(PyTuple_GET_ITEM(t, 0));
  return parse_dims(PyTuple_GET_ITEM(t, 1), out->dims, &out->rank);
}

static int parse_types(PyObject *seq, tp_type **out, Py_ssize_t *n) {
  PyObject *f = PySequence_Fast(seq, "expected a sequence of types");
  if (!f) return -1;
  *n = PySequence_Fast_GET_SIZE(f);
  *out = calloc((size_t)*n + 1, sizeof(tp_type));
  if (!*out) {
    Py_DECREF(f);
    PyErr_NoMemory();
    return -1;
  }
  for (Py_ssize_t i = 0; i < *n; i++)
    if (parse_type(PySequence_Fast_GET_ITEM(f, i), &(*out)[i]) < 0) {
      Py_DECREF(f);
      return -1;
    }
  Py_DECREF(f);
  return 0;
}

static PyObject *py_graph_new(PyObject *self, PyObject *a) {
  (void)self;
  PyObject *types;
  if (!PyArg_ParseTuple(a, "O", &types)) return NULL;
  tp_type *t = NULL;
  Py_ssize_t n = 0;
  if (parse_types(types, &t, &n) < 0) {
    free(t);
    return NULL;
  }
  int id = 0;
  tp_status *st = tp_graph_new((int)n, t, &id);
  free(t);
  if (st) return raise_status(st);
  return PyLong_FromLong(id);
}

static PyObject *py_graph_add(PyObject *self, PyObject *a) {
  (void)self;
  int id;
  const char *op;
  PyObject *args, *types;
  int key = -1;
  if (!PyArg_ParseTuple(a, "isO!O|i", &id, &op, &PyTuple_Type, &args, &types, &key)) return NULL;
  Py_ssize_t nargs = PyTuple_GET_SIZE(args), nouts = 0;
  tp_arg *la = calloc((size_t)nargs + 1, sizeof(tp_arg));
  int64_t **lists = calloc((size_t)nargs + 1, sizeof(int64_t *));
  tp_type *ot = NULL;
  PyObject *ret = NULL;
  if (!la || !lists) {
    PyErr_NoMemory();
    goto done;
  }
  for (Py_ssize_t i = 0; i < nargs; i++) {
    PyObject *o = PyTuple_GET_ITEM(args, i);
    tp_arg *x = &la[i];
    if (PyTuple_Check(o) && PyTuple_GET_SIZE(o) >= 2 && PyUnicode_Check(PyTuple_GET_ITEM(o, 0))) {
      const char *tag = PyUnicode_AsUTF8(PyTuple_GET_ITEM(o, 0));
      if (tag[0] == 'V') {
        x->kind = TP_ARG_TENSOR;
        x->i = PyLong_AsLongLong(PyTuple_GET_ITEM(o, 1));
        continue;
      }
      if (tag[0] == 'L') {
        PyObject *f = PySequence_Fast(PyTuple_GET_ITEM(o, 1), "expected a list");
        if (!f) goto done;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(f);
        lists[i] = calloc((size_t)n + 1, sizeof(int64_t));
        if (!lists[i]) {
          Py_DECREF(f);
          PyErr_NoMemory();
          goto done;
        }
        for (Py_ssize_t j = 0; j < n; j++) {
          PyObject *it = PySequence_Fast_GET_ITEM(f, j);
          lists[i][j] = it == Py_None ? -1 : PyLong_AsLongLong(PyTuple_GET_ITEM(it, 1));
        }
        Py_DECREF(f);
        x->kind = TP_ARG_TENSORS;
        x->n = (int)n;
        x->ints = lists[i];
        continue;
      }
    }
    /* Everything else parses as in run(); tensors are not allowed here. */
    tp_eager_arg ea;
    call_mem m = {0};
    int64_t ints[64];
    m.ints = ints;
    if ((PyList_Check(o) || PyTuple_Check(o)) && PySequence_Size(o) > 64) {
      PyErr_SetString(PyExc_ValueError, "int list argument too long");
      goto done;
    }
    if (parse_arg(o, &ea, &m) < 0) goto done;
    *x = ea.a;
    if (x->kind == TP_ARG_INTS) {
      lists[i] = calloc((size_t)x->n + 1, sizeof(int64_t));
      if (!lists[i]) {
        PyErr_NoMemory();
        goto done;
      }
      memcpy(lists[i], ints, sizeof(int64_t) * (size_t)x->n);
      x->ints = lists[i];
    }
  }
  if (parse_types(types, &ot, &nouts) < 0) goto done;
  int first = 0;
  tp_status *st = tp_graph_add(id, op, la, (int)nargs, ot, (int)nouts, key, &first);
  if (st) {
    raise_status(st);
    goto done;
  }
  ret = PyLong_FromLong(first);
done:
  if (lists)
    for (Py_ssize_t i = 0; i < nargs; i++) free(lists[i]);
  free(lists);
  free(la);
  free(ot);
  return ret;
}

static PyObject *py_graph_outputs(PyObject *self, PyObject *a) {
  (void)self;
  int id;
  PyObject *vals;
  if (!PyArg_ParseTuple(a, "iO", &id, &vals)) return NULL;
  PyObject *f = PySequence_Fast(vals, "expected a list of value ids");
  if (!f) return NULL;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(f);
  int *v = calloc((size_t)n + 1, sizeof(int));
  if (!v) {
    Py_DECREF(f);
    return PyErr_NoMemory();
  }
  for (Py_ssize_t i = 0; i < n; i++) v[i] = (int)PyLong_AsLong(PySequence_Fast_GET_ITEM(f, i));
  Py_DECREF(f);
  tp_status *st = tp_graph_set_outputs(id, v, (int)n);
  free(v);
  if (st) return raise_status(st);
  Py_RETURN_NONE;
}

static PyObject *py_graph_free(PyObject *self, PyObject *a) {
  (void)self;
  int id;
  if (!PyArg_ParseTuple(a, "i", &id)) return NULL;
  tp_graph_free(id);
  Py_RETURN_NONE;
}

static PyObject *py_has_lowering(PyObject *self, PyObject *arg) {
  (void)self;
  const char *name = PyUnicode_AsUTF8(arg);
  if (!name) return NULL;
  return PyBool_FromLong(tp_lower_find(name) != NULL);
}

static PyObject *py_lowering_names(PyObject *self, PyObject *unused) {
  (void)self;
  (void)unused;
  PyObject *l = PyList_New(0);
  if (!l) return NULL;
  for (const char *const *p = tp_lower_names(); *p; p++) {
    PyObject *s = PyUnicode_FromString(*p);
    if (!s || PyList_Append(l, s) < 0) {
      Py_XDECREF(s);
      Py_DECREF(l);
      return NULL;
    }
    Py_DECREF(s);
  }
  return l;
}

/* write_host(ref, host_ptr) / read_host(ref, host_ptr) */
static PyObject *py_transfer(PyObject *pyargs, int to_device) {
  PyObject *ro;
  unsigned long long ptr;
  if (!PyArg_ParseTuple(pyargs, "OK", &ro, &ptr)) return NULL;
  tp_tensor_ref r;
  if (parse_ref(ro, &r) < 0) return NULL;
  tp_status *st;
  Py_BEGIN_ALLOW_THREADS st = to_device ? tp_eager_write_host(&r, (const void *)(uintptr_t)ptr)
                                        : tp_eager_read_host(&r, (void *)(uintptr_t)ptr);
  Py_END_ALLOW_THREADS if (st) return raise_status(st);
  Py_RETURN_NONE;
}
/* host_values(ref) -> bytes of the view's values where the host has them
 * (tp_eager_host_values), else None */
static PyObject *py_host_values(PyObject *self, PyObject *ro) {
  (void)self;
  tp_tensor_ref r;
  if (parse_ref(ro, &r) < 0) return NULL;
  unsigned char buf[TP_EAGER_HOST_COPY_MAX];
  int64_t n = 1;
  for (int i = 0; i < r.rank; i++) n *= r.sizes[i];
  size_t nb = (size_t)n * tp_dtype_size(r.dt);
  if (nb > sizeof buf || !tp_eager_host_values(&r, buf, sizeof buf)) Py_RETURN_NONE;
  return PyBytes_FromStringAndSize((const char *)buf, (Py_ssize_t)nb);
}

static PyObject *py_write_host(PyObject *self, PyObject *a) {
  (void)self;
  return py_transfer(a, 1);
}
static PyObject *py_read_host(PyObject *self, PyObject *a) {
  (void)self;
  return py_transfer(a, 0);
}

static PyObject *py_init(PyObject *self, PyObject *a) {
  (void)self;
  const char *path;
  int ndev;
  if (!PyArg_ParseTuple(a, "si", &path, &ndev)) return NULL;
  tp_runtime_config cfg = {path, ndev};
  tp_status *st;
  Py_BEGIN_ALLOW_THREADS st = tp_runtime_init(&cfg);
  Py_END_ALLOW_THREADS if (st) return raise_status(st);
  Py_RETURN_NONE;
}

static tp_plugin *plugin_or_raise(void) {
  tp_plugin *p = tp_runtime_plugin();
  if (!p) PyErr_SetString(PyExc_RuntimeError, "the tpu runtime is not initialised");
  return p;
}

static PyObject *py_info(PyObject *self, PyObject *unused) {
  (void)self;
  (void)unused;
  tp_plugin *p = plugin_or_raise();
  if (!p) return NULL;
  return Py_BuildValue("{s:s,s:s,s:s,s:s,s:i,s:s}", "path", tp_plugin_path(p), "platform", tp_plugin_platform(p),
                       "xla_version", tp_plugin_xla_version(p), "api_version", tp_plugin_api_version(p),
                       "device_count", tp_plugin_device_count(p), "device_kind", tp_plugin_device_kind(p, 0));
}

static PyObject *py_device_count(PyObject *self, PyObject *unused) {
  (void)self;
  (void)unused;
  return PyLong_FromLong(tp_runtime_device_count());
}

static int check_device(int d) {
  if (d < 0 || d >= tp_runtime_device_count()) {
    PyErr_Format(PyExc_RuntimeError, "Invalid device index tpu:%d: there are %d tpu device(s)", d,
                 tp_runtime_device_count());
    return -1;
  }
  return 0;
}

static PyObject *py_synchronize(PyObject *self, PyObject *a) {
  (void)self;
  int d;
  if (!PyArg_ParseTuple(a, "i", &d)) return NULL;
  tp_status *st;
  Py_BEGIN_ALLOW_THREADS st = tp_eager_synchronize(d);
  Py_END_ALLOW_THREADS if (st) return raise_status(st);
  Py_RETURN_NONE;
}

static PyObject *py_release_host_memory(PyObject *self, PyObject *a) {
  (void)self;
  (void)a;
  Py_BEGIN_ALLOW_THREADS tp_runtime_release_host_memory();
  Py_END_ALLOW_THREADS Py_RETURN_NONE;
}

static PyObject *py_mem_stats(PyObject *self, PyObject *a) {
  (void)self;
  int d;
  if (!PyArg_ParseTuple(a, "i", &d) || check_device(d) < 0) return NULL;
  tp_plugin *p = plugin_or_raise();
  if (!p) return NULL;
  tp_mem_stats ms;
  tp_status *st = tp_plugin_mem_stats(p, d, &ms);
  if (st) return raise_status(st);
  return Py_BuildValue("(LLL)", (long long)ms.bytes_in_use, (long long)ms.peak_bytes, (long long)ms.live_buffers);
}

static PyObject *py_reset_peak(PyObject *self, PyObject *a) {
  (void)self;
  int d;
  if (!PyArg_ParseTuple(a, "i", &d) || check_device(d) < 0) return NULL;
  tp_plugin *p = plugin_or_raise();
  if (!p) return NULL;
  tp_status *st = tp_plugin_reset_peak(p, d);
  if (st) return raise_status(st);
  Py_RETURN_NONE;
}

static PyObject *py_set_mem_limit(PyObject *self, PyObject *a) {
  (void)self;
  int d;
  long long bytes;
  if (!PyArg_ParseTuple(a, "iL", &d, &bytes) || check_device(d) < 0) return NULL;
  tp_plugin *p = plugin_or_raise();
  if (!p) return NULL;
  tp_status *st = tp_plugin_set_mem_limit(p, d, bytes);
  if (st) return raise_status(st);
  Py_RETURN_NONE;
}

static PyObject *py_manual_seed(PyObject *self, PyObject *a) {
  (void)self;
  int d;
  unsigned long long seed;
  if (!PyArg_ParseTuple(a, "iK", &d, &seed) || check_device(d) < 0) return NULL;
  tp_runtime_manual_seed(d, seed);
  Py_RETURN_NONE;
}

static PyObject *py_initial_seed(PyObject *self, PyObject *a) {
  (void)self;
  int d;
  if (!PyArg_ParseTuple(a, "i", &d) || check_device(d) < 0) return NULL;
  return PyLong_FromUnsignedLongLong(tp_runtime_initial_seed(d));
}

/* rng_state(device) -> (seed, counter) of the device's default random state */
static PyObject *py_rng_state(PyObject *self, PyObject *a) {
  (void)self;
  int d;
  if (!PyArg_ParseTuple(a, "i", &d) || check_device(d) < 0) return NULL;
  uint64_t seed = 0, offset = 0;
  tp_runtime_rng_advance(d, 0, &seed, &offset); /* reserves nothing */
  return Py_BuildValue("KK", (unsigned long long)seed, (unsigned long long)offset);
}

/* set_rng_state(device, seed, counter) */
static PyObject *py_set_rng_state(PyObject *self, PyObject *a) {
  (void)self;
  int d;
  unsigned long long seed, offset;
  if (!PyArg_ParseTuple(a, "iKK", &d, &seed, &offset) || check_device(d) < 0) return NULL;
  uint64_t s0 = 0, o0 = 0;
  tp_runtime_manual_seed(d, seed); /* counter 0, then reserve up to `offset` */
  tp_runtime_rng_advance(d, offset, &s0, &o0);
  Py_RETURN_NONE;
}

static int put_num(PyObject *d, const char *k, PyObject *v) {
  if (!v) return -1;
  int r = PyDict_SetItemString(d, k, v);
  Py_DECREF(v);
  return r;
}

static PyObject *py_stats(PyObject *self, PyObject *unused) {
  (void)self;
  (void)unused;
  tp_eager_stats s;
  tp_eager_get_stats(&s);
  PyObject *d = PyDict_New();
  if (!d) return NULL;
  const struct {
    const char *k;
    int64_t v;
  } ints[] = {
      {"compiles", s.compiles},           {"cache_hits", s.cache_hits},       {"cache_misses", s.cache_misses},
      {"disk_hits", s.disk_hits},         {"disk_misses", s.disk_misses},     {"disk_writes", s.disk_writes},
      {"disk_corrupt_dropped", s.disk_corrupt}, {"executions", s.executions}, {"h2d_transfers", s.h2d_transfers},
      {"h2d_bytes", s.h2d_bytes},         {"d2h_transfers", s.d2h_transfers}, {"d2h_bytes", s.d2h_bytes},
      {"cached_programs", s.cached_programs},
  };
  for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
    if (put_num(d, ints[i].k, PyLong_FromLongLong(ints[i].v)) < 0) goto fail;
  if (put_num(d, "compile_seconds", PyFloat_FromDouble((double)s.compile_ns / 1e9)) < 0) goto fail;
  if (put_num(d, "disk_load_seconds", PyFloat_FromDouble((double)s.load_ns / 1e9)) < 0) goto fail;
  return d;
fail:
  Py_DECREF(d);
  return NULL;
}

static PyObject *py_set_disk_cache(PyObject *self, PyObject *a) {
  (void)self;
  const char *dir;
  long long cap;
  if (!PyArg_ParseTuple(a, "zL", &dir, &cap)) return NULL;
  tp_status *st = tp_eager_set_disk_cache(dir, cap);
  if (st) return raise_status(st);
  Py_RETURN_NONE;
}

static PyObject *py_disk_cache_error(PyObject *self, PyObject *unused) {
  (void)self;
  (void)unused;
  char buf[512];
  if (!tp_eager_disk_cache_error(buf, sizeof buf)) Py_RETURN_NONE;
  return PyUnicode_FromString(buf);
}

static PyObject *py_specs_context(PyObject *self, PyObject *arg) {
  (void)self;
  long ctx = PyLong_AsLong(arg);
  if (ctx == -1 && PyErr_Occurred()) return NULL;
  tp_eager_specs_context((int)ctx);
  Py_RETURN_NONE;
}

static PyObject *py_clear_cache(PyObject *self, PyObject *unused) {
  (void)self;
  (void)unused;
  tp_eager_clear_cache();
  Py_RETURN_NONE;
}


/* ---- the eager fast path ----------------------------------------------------
 * fast_call(plan, args) runs one op whose output specs the Python handler
 * has already cached, without building the tuple encoding above: it reads
 * the tensors' metadata, looks the meta-cache key up, allocates the outputs
 * and calls the engine.  Anything unusual (keyword or CPU tensor arguments,
 * tensor lists, a meta-cache miss, zero-size tensors, mixed devices) returns
 * NotImplemented and the Python handler (torch_pjrt/_dispatch.py), which
 * owns the semantics, runs the op instead.  The key built here must equal
 * _Handler._encode_and_key's.
 *
 * plan = (lowering, defaults, number_is_scalar: bytes, by_value, meta_cache,
 *         dtype_codes, empty_strided, devices, inplace, TensorBase, dtype type,
 *         op name)
 * A call that runs here records its output specs in the core
 * (tp_eager_specs_record), where the op's C++ kernel finds them next time.
 */
#define FAST_MAX_ARGS 24
#define FAST_MAX_INTS 64

static PyObject *s_get_device, *s_shape, *s_stride, *s_dtype, *s_storage_offset, *s_data_ptr, *s_numel,
    *s_kwnames;

static int fast_init_names(void) {
  if (s_kwnames) return 0;
  s_get_device = PyUnicode_InternFromString("get_device");
  s_shape = PyUnicode_InternFromString("shape");
  s_stride = PyUnicode_InternFromString("stride");
  s_dtype = PyUnicode_InternFromString("dtype");
  s_storage_offset = PyUnicode_InternFromString("storage_offset");
  s_data_ptr = PyUnicode_InternFromString("data_ptr");
  s_numel = PyUnicode_InternFromString("numel");
  s_kwnames = Py_BuildValue("(ss)", "dtype", "device");
  return s_kwnames ? 0 : -1;
}

static int64_t call_i64(PyObject *o, PyObject *name) {
  PyObject *r = PyObject_CallMethodNoArgs(o, name);
  if (!r) return INT64_MIN;
  int64_t v = PyLong_AsLongLong(r);
  Py_DECREF(r);
  return (v == -1 && PyErr_Occurred()) ? INT64_MIN : v;
}

/* Fill r from a tpu tensor; 1 on success, 0 to fall back, -1 on error.
 * *key gets (shape, stride, dtype) like the Python key. */
static int fast_tensor(PyObject *v, PyObject *codes, int *device, tp_tensor_ref *r, PyObject **key) {
  int64_t dev = call_i64(v, s_get_device);
  if (dev == INT64_MIN) return -1;
  if (dev < 0 || (*device >= 0 && dev != *device)) return 0; /* CPU tensor or mixed devices */
  *device = (int)dev;
  PyObject *shape = PyObject_GetAttr(v, s_shape), *stride = PyObject_CallMethodNoArgs(v, s_stride),
           *dtype = PyObject_GetAttr(v, s_dtype);
  int ok = -1;
  if (!shape || !stride || !dtype) goto done;
  ok = 0;
  PyObject *code = PyDict_GetItemWithError(codes, dtype);
  if (!code || !PyTuple_Check(shape) || !PyTuple_Check(stride)) goto done;
  memset(r, 0, sizeof *r);
  r->dt = (tp_dtype)PyLong_AsLong(code);
  Py_ssize_t rank = PyTuple_GET_SIZE(shape);
  if (rank > TP_MAX_RANK || PyTuple_GET_SIZE(stride) != rank) goto done;
  r->rank = (int)rank;
  int64_t numel = 1;
  for (Py_ssize_t i = 0; i < rank; i++) {
    r->sizes[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
    r->strides[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(stride, i));
    numel *= r->sizes[i];
  }
  if (PyErr_Occurred()) {
    ok = -1;
    goto done;
  }
  if (numel == 0) goto done; /* data_ptr() is NULL: the slow path asks the storage */
  int64_t off = call_i64(v, s_storage_offset), ptr = off == INT64_MIN ? 0 : call_i64(v, s_data_ptr);
  if (off == INT64_MIN || ptr == INT64_MIN) {
    ok = -1;
    goto done;
  }
  size_t es = tp_dtype_size(r->dt);
  if (!es || !tp_dtype_mlir(r->dt)) goto done;
  r->offset = off;
  r->st = (tp_storage *)(intptr_t)(ptr - off * (int64_t)es);
  *key = PyTuple_Pack(3, shape, stride, dtype);
  ok = *key ? 1 : -1;
done:
  Py_XDECREF(shape);
  Py_XDECREF(stride);
  Py_XDECREF(dtype);
  return ok;
}

static void fast_scalar(PyObject *v, tp_arg *a) {
  if (PyFloat_CheckExact(v)) tp_eager_number_f64(a, PyFloat_AS_DOUBLE(v));
  else tp_eager_number_int(a, PyLong_AsLongLong(v), PyBool_Check(v));
}

static PyObject *py_fast_call(PyObject *self, PyObject *const *fa, Py_ssize_t nfa) {
  (void)self;
  if (nfa != 2 || !PyTuple_Check(fa[0]) || PyTuple_GET_SIZE(fa[0]) != 12 || !PyTuple_Check(fa[1])) {
    PyErr_SetString(PyExc_TypeError, "internal: fast_call(plan, args)");
    return NULL;
  }
  if (fast_init_names() < 0) return NULL;
  PyObject *plan = fa[0], *args = fa[1];
  PyObject *lowering = PyTuple_GET_ITEM(plan, 0), *defaults = PyTuple_GET_ITEM(plan, 1),
           *is_num = PyTuple_GET_ITEM(plan, 2), *meta_cache = PyTuple_GET_ITEM(plan, 4),
           *codes = PyTuple_GET_ITEM(plan, 5), *empty_strided = PyTuple_GET_ITEM(plan, 6),
           *devices = PyTuple_GET_ITEM(plan, 7), *tensor_type = PyTuple_GET_ITEM(plan, 9),
           *dtype_type = PyTuple_GET_ITEM(plan, 10), *opname = PyTuple_GET_ITEM(plan, 11);
  int by_value = PyTuple_GET_ITEM(plan, 3) == Py_True, inplace = PyTuple_GET_ITEM(plan, 8) == Py_True;
  if (!PyUnicode_Check(lowering) || !PyTuple_Check(defaults) || !PyBytes_Check(is_num) || !PyDict_Check(meta_cache) ||
      !PyDict_Check(codes) || !PyDict_Check(devices) || !PyType_Check(tensor_type) || !PyType_Check(dtype_type) || !PyUnicode_Check(opname)) {
    PyErr_SetString(PyExc_TypeError, "internal: malformed fast-path plan");
    return NULL;
  }
  Py_ssize_t nschema = PyTuple_GET_SIZE(defaults), nargs = PyTuple_GET_SIZE(args);
  if (nargs > nschema || nschema > FAST_MAX_ARGS || PyBytes_GET_SIZE(is_num) != nschema) Py_RETURN_NOTIMPLEMENTED;
  const char *num = PyBytes_AS_STRING(is_num);
  tp_eager_arg ea[FAST_MAX_ARGS];
  tp_tensor_ref refs[FAST_MAX_ARGS + 8];
  int64_t ints[FAST_MAX_INTS];
  int nrefs = 0, nints = 0, device = -1;
  PyObject *key = PyTuple_New(nschema), *ret = NULL, *outs = NULL;
  if (!key) return NULL;
  memset(ea, 0, sizeof(tp_eager_arg) * (size_t)nschema);
  for (Py_ssize_t i = 0; i < nschema; i++) {
    PyObject *v = i < nargs ? PyTuple_GET_ITEM(args, i) : PyTuple_GET_ITEM(defaults, i), *k = NULL;
    tp_arg *a = &ea[i].a;
    if (PyObject_TypeCheck(v, (PyTypeObject *)tensor_type)) {
      int r = fast_tensor(v, codes, &device, &refs[nrefs], &k);
      if (r <= 0) goto bail;
      a->kind = TP_ARG_TENSOR;
      ea[i].t = &refs[nrefs++];
    } else if (num[i] && (PyFloat_CheckExact(v) || PyLong_CheckExact(v) || PyBool_Check(v))) {
      fast_scalar(v, a);
      if (PyErr_Occurred()) { /* an int beyond int64: the slow path takes it */
        PyErr_Clear();
        goto bail;
      }
      k = Py_NewRef(by_value ? v : (PyObject *)Py_TYPE(v));
    } else if (v == Py_None) {
      a->kind = TP_ARG_NONE;
      k = Py_NewRef(v);
    } else if (PyBool_Check(v)) {
      a->kind = TP_ARG_BOOL;
      a->i = v == Py_True;
      k = Py_NewRef(v);
    } else if (PyLong_CheckExact(v)) {
      a->kind = TP_ARG_INT;
      a->i = PyLong_AsLongLong(v);
      if (PyErr_Occurred()) goto bail;
      k = Py_NewRef(v);
    } else if (PyFloat_CheckExact(v)) {
      a->kind = TP_ARG_FLOAT;
      a->f = PyFloat_AS_DOUBLE(v);
      k = Py_NewRef(v);
    } else if (PyUnicode_Check(v)) {
      a->kind = TP_ARG_STR;
      a->s = PyUnicode_AsUTF8(v);
      if (!a->s) goto bail;
      k = Py_NewRef(v);
    } else if (PyList_Check(v) || PyTuple_Check(v)) {
      Py_ssize_t n = PySequence_Fast_GET_SIZE(v);
      if (nints + n > FAST_MAX_INTS) goto bail;
      a->kind = TP_ARG_INTS;
      a->n = (int)n;
      a->ints = &ints[nints];
      for (Py_ssize_t j = 0; j < n; j++) {
        PyObject *x = PySequence_Fast_GET_ITEM(v, j);
        if (!PyLong_Check(x)) goto bail; /* tensor lists, float lists, None: slow path */
        ints[nints++] = PyLong_AsLongLong(x);
        if (PyErr_Occurred()) goto bail;
      }
      k = PyList_Check(v) ? PyList_AsTuple(v) : Py_NewRef(v);
      if (!k) goto bail;
    } else if (Py_TYPE(v) == (PyTypeObject *)dtype_type) {
      PyObject *code = PyDict_GetItemWithError(codes, v);
      if (!code) goto bail;
      a->kind = TP_ARG_INT;
      a->i = PyLong_AsLongLong(code);
      k = Py_NewRef(v);
    } else {
      goto bail; /* devices, layouts, memory formats, generators */
    }
    PyTuple_SET_ITEM(key, i, k);
  }
  if (device < 0) goto bail;
  PyObject *spec = PyDict_GetItemWithError(meta_cache, key);
  if (!spec || !PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 2) goto bail;
  int multi = PyTuple_GET_ITEM(spec, 0) == Py_True;
  PyObject *specs = PyTuple_GET_ITEM(spec, 1);
  if (!PyTuple_Check(specs) || PyTuple_GET_SIZE(specs) > TP_SPEC_MAX_OUTS) goto bail;
  Py_ssize_t nouts = PyTuple_GET_SIZE(specs);
  if (nouts == 0 && !inplace) goto bail; /* "-> ()" ops: the handler returns None */
  tp_tensor_ref *orefs = &refs[nrefs];
  int norefs = 0;
  if (inplace) {
    if (ea[0].a.kind != TP_ARG_TENSOR) goto bail;
    orefs[norefs++] = *ea[0].t;
    outs = Py_NewRef(nargs > 0 ? PyTuple_GET_ITEM(args, 0) : Py_None);
  } else {
    PyObject *dkey = PyLong_FromLong(device);
    if (!dkey) goto bail;
    PyObject *pydev = PyDict_GetItemWithError(devices, dkey);
    Py_DECREF(dkey);
    if (!pydev) goto bail;
    outs = PyTuple_New(nouts);
    if (!outs) goto bail;
    for (Py_ssize_t j = 0; j < nouts; j++) {
      PyObject *m = PyTuple_GET_ITEM(specs, j), *o;
      if (m == Py_None) {
        PyTuple_SET_ITEM(outs, j, Py_NewRef(Py_None));
        continue;
      }
      if (!PyTuple_Check(m) || PyTuple_GET_SIZE(m) != 3) goto bail;
      PyObject *argv[5] = {NULL, PyTuple_GET_ITEM(m, 0), PyTuple_GET_ITEM(m, 1), PyTuple_GET_ITEM(m, 2), pydev};
      o = PyObject_Vectorcall(empty_strided, argv + 1, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, s_kwnames);
      if (!o) goto bail;
      PyTuple_SET_ITEM(outs, j, o);
      PyObject *ok = NULL;
      int r = fast_tensor(o, codes, &device, &orefs[norefs], &ok);
      Py_XDECREF(ok);
      if (r <= 0) goto bail;
      norefs++;
    }
  }
  tp_status *st;
  Py_BEGIN_ALLOW_THREADS st = tp_eager_run(PyUnicode_AsUTF8(lowering), ea, (int)nschema, NULL, orefs, norefs);
  Py_END_ALLOW_THREADS if (st) {
    raise_status(st);
    goto done;
  }
  if (warn_recompile() < 0) goto done;
  tp_op_specs rec = {.n = (int)nouts};
  for (Py_ssize_t j = 0, o = 0; j < nouts; j++) {
    tp_out_spec *sp = &rec.out[j];
    if (!inplace && PyTuple_GET_ITEM(specs, j) == Py_None) continue; /* defined = 0 */
    const tp_tensor_ref *r = &orefs[inplace ? 0 : o++];
    *sp = (tp_out_spec){.defined = 1, .dt = r->dt, .rank = r->rank};
    memcpy(sp->sizes, r->sizes, sizeof(int64_t) * (size_t)r->rank);
    memcpy(sp->strides, r->strides, sizeof(int64_t) * (size_t)r->rank);
  }
  const char *opn = PyUnicode_AsUTF8(opname);
  if (opn) tp_eager_specs_record(opn, ea, (int)nschema, by_value, &rec);
  else PyErr_Clear(); /* the op ran; only the record is lost */
  if (inplace || multi) {
    ret = outs;
    outs = NULL;
  } else {
    ret = Py_NewRef(PyTuple_GET_ITEM(outs, 0));
  }
  goto done;
bail:
  if (!PyErr_Occurred()) ret = Py_NewRef(Py_NotImplemented);
done:
  Py_XDECREF(outs);
  Py_DECREF(key);
  return ret;
}

static PyMethodDef methods[] = {
    {"init", py_init, METH_VARARGS, "init(plugin_path, cpu_device_count): open the PJRT plugin"},
    {"info", py_info, METH_NOARGS, "plugin facts: path, platform, versions, device kind"},
    {"device_count", py_device_count, METH_NOARGS, "number of devices (0 before init)"},
    {"rng_state", py_rng_state, METH_VARARGS, "rng_state(device) -> (seed, counter) of the device's random state"},
    {"set_rng_state", py_set_rng_state, METH_VARARGS, "set_rng_state(device, seed, counter)"},
    {"run", py_run, METH_VARARGS,
     "run(op, args, out_types, outs[, (seed, offset)]): run one op; with a generator state, random ops draw from it "
     "and the new offset is returned"},
    {"fast_call", (PyCFunction)(void (*)(void))py_fast_call, METH_FASTCALL, "fast_call(plan, args): run a cached op, or NotImplemented"},
    {"graph_new", py_graph_new, METH_VARARGS, "graph_new(input_types) -> id"},
    {"graph_add", py_graph_add, METH_VARARGS, "graph_add(id, op, args, out_types[, key]) -> first output value id"},
    {"graph_outputs", py_graph_outputs, METH_VARARGS, "graph_outputs(id, value_ids)"},
    {"graph_free", py_graph_free, METH_VARARGS, "graph_free(id)"},
    {"has_lowering", py_has_lowering, METH_O, "has_lowering(name) -> bool"},
    {"lowering_names", py_lowering_names, METH_NOARGS, "all op names with a lowering rule"},
    {"write_host", py_write_host, METH_VARARGS, "write_host(ref, ptr): copy dense host data into a view"},
    {"read_host", py_read_host, METH_VARARGS, "read_host(ref, ptr): copy a view into dense host memory"},
    {"host_values", py_host_values, METH_O, "host_values(ref): bytes of an uploaded integer tensor, or None"},
    {"synchronize", py_synchronize, METH_VARARGS, "synchronize(device): wait for pending work (-1: all)"},
    {"release_host_memory", py_release_host_memory, METH_NOARGS,
     "release_host_memory(): return freed host memory kept for reuse to the system"},
    {"mem_stats", py_mem_stats, METH_VARARGS, "mem_stats(device) -> (bytes_in_use, peak, live_buffers)"},
    {"reset_peak", py_reset_peak, METH_VARARGS, "reset_peak(device)"},
    {"set_mem_limit", py_set_mem_limit, METH_VARARGS, "set_mem_limit(device, bytes): -1 for none"},
    {"manual_seed", py_manual_seed, METH_VARARGS, "manual_seed(device, seed)"},
    {"initial_seed", py_initial_seed, METH_VARARGS, "initial_seed(device) -> seed"},
    {"stats", py_stats, METH_NOARGS, "eager engine counters"},
    {"set_disk_cache", py_set_disk_cache, METH_VARARGS, "set_disk_cache(dir or None, cap_bytes)"},
    {"disk_cache_error", py_disk_cache_error, METH_NOARGS, "last disk cache warning, or None"},
    {"clear_cache", py_clear_cache, METH_NOARGS, "drop all cached programs"},
    {"specs_context", py_specs_context, METH_O,
     "specs_context(dtype_code): the default dtype the recorded output specs hold for (a change drops them)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "torch_pjrt._C", "torch-pjrt C core", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&moddef); }

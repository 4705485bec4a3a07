// fast.cpp - the eager fast path: per-op PrivateUse1 kernels without Python.
//
// torch_pjrt/_dispatch.py registers, for each op with a lowering that its
// fast path serves, a kernel made here (tp_glue_register_fast, called
// through ctypes), and the op's Python kernel under PrivateUse2.  A call
// reads its arguments off the dispatcher's stack into the core's argument
// form, looks the argument signature up in the core's table of output specs
// (tp_eager_specs_find, eager.h), allocates the outputs and runs the
// lowering (tp_eager_run).  Anything else -- the first calls of a signature,
// arguments the fast path does not take (CPU tensors other than wrapped
// numbers, tensor lists, devices, generators, zero-size tensors, mixed
// devices, conjugate or negative views) -- goes to the Python kernel, which owns the semantics: it checks
// the arguments and computes the specs with PyTorch's meta functions, and
// records them for the next call.  So this file decides nothing about an op;
// it only moves values between PyTorch's and the core's representations.

#include "glue.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/DefaultDtype.h>
#include <torch/library.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

extern "C" {
#include "dtype.h"
#include "eager.h"
}

namespace torch_pjrt {

[[noreturn]] void raise_status(tp_status* st) {
  const std::string msg = tp_status_message(st);
  const tp_code code = tp_status_code(st);
  tp_status_free(st);
  // The exception types _C's raise_status gives the Python path.
  TORCH_CHECK_NOT_IMPLEMENTED(code != TP_UNIMPLEMENTED, msg);
  TORCH_CHECK_INDEX(code != TP_OUT_OF_RANGE, msg);
  TORCH_CHECK_WITH(OutOfMemoryError, code != TP_RESOURCE_EXHAUSTED, msg);
  TORCH_CHECK(false, msg);
}

namespace {

constexpr size_t kMaxArgs = 24;
constexpr size_t kMaxInts = 64;

// How an argument's schema type lets the fast path take it.
enum ArgClass : char {
  kPlain = 'p',    // tensors, ints, floats, bools, strings, int/bool lists, dtypes
  kNumber = 'n',   // Tensor/Scalar: a Python number here is a runtime scalar
  kOnlyNone = 'x', // devices, layouts, generators, lists of tensors...: only None
};

ArgClass classify(const c10::Argument& arg, bool number) {
  c10::TypePtr t = arg.real_type();
  if (auto opt = t->cast<c10::OptionalType>()) t = opt->getElementType();
  switch (t->kind()) {
    case c10::TypeKind::TensorType:
    case c10::TypeKind::NumberType:
      return number ? kNumber : kPlain;
    case c10::TypeKind::IntType:
    case c10::TypeKind::SymIntType:
    case c10::TypeKind::FloatType:
    case c10::TypeKind::BoolType:
    case c10::TypeKind::StringType:
    case c10::TypeKind::ScalarTypeType:
      return kPlain;
    case c10::TypeKind::ListType: {
      const auto k = t->castRaw<c10::ListType>()->getElementType()->kind();
      return k == c10::TypeKind::IntType || k == c10::TypeKind::SymIntType || k == c10::TypeKind::BoolType
                 ? kPlain
                 : kOnlyNone;
    }
    default:
      return kOnlyNone;
  }
}

// Off: every call takes the Python kernel (tests that watch the Python
// entries into the core, and TORCH_PJRT_FAST_KERNELS=0).
std::atomic<bool> g_enabled{true};

// A fast kernel's call: served by run(stack), or handed to the op's Python
// kernel under PrivateUse2.
template <class Run>
void serve(const c10::OperatorHandle& h, torch::jit::Stack* stack, Run run) {
  if (!g_enabled.load(std::memory_order_relaxed) || !run(*stack))
    h.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::PrivateUse2), stack);
}

struct FastKernel final : c10::OperatorKernel {
  std::string op, lowering;
  std::vector<ArgClass> cls;
  bool by_value = false, inplace = false;
  size_t nreturns = 0;

  void operator()(const c10::OperatorHandle& h, c10::DispatchKeySet, torch::jit::Stack* stack) {
    serve(h, stack, [this](torch::jit::Stack& s) { return run(s); });
  }

  // A tpu tensor as the core sees it; false for anything the fast path
  // leaves to Python.
  static bool ref(const at::Tensor& t, int* device, tp_tensor_ref* r) {
    // conjugate and negative views: the Python kernel resolves their bits
    if (t.device().type() != kTpu || t.dim() > TP_MAX_RANK || t.numel() == 0 || t.is_conj() || t.is_neg())
      return false;
    const int dev = t.device().index();
    if (*device >= 0 && dev != *device) return false;
    *device = dev;
    const int dt = static_cast<int>(t.scalar_type());
    if (!tp_dtype_size(static_cast<tp_dtype>(dt)) || !tp_dtype_mlir(static_cast<tp_dtype>(dt))) return false;
    std::memset(r, 0, sizeof *r);
    r->st = static_cast<tp_storage*>(t.storage().data_ptr().get());
    r->dt = static_cast<tp_dtype>(dt);
    r->rank = static_cast<int>(t.dim());
    for (int i = 0; i < r->rank; i++) {
      r->sizes[i] = t.sizes()[i];
      r->strides[i] = t.strides()[i];
    }
    r->offset = t.storage_offset();
    return r->st != nullptr;
  }

  // A Python number the arg parser wrapped into a CPU tensor.
  static bool wrapped_number(const at::Tensor& t, tp_arg* a) {
    if (!t.unsafeGetTensorImpl()->is_wrapped_number()) return false;
    switch (t.scalar_type()) {
      case c10::ScalarType::Double: tp_eager_number_f64(a, *t.const_data_ptr<double>()); return true;
      case c10::ScalarType::Long: tp_eager_number_int(a, *t.const_data_ptr<int64_t>(), 0); return true;
      case c10::ScalarType::Bool: tp_eager_number_int(a, *t.const_data_ptr<bool>(), 1); return true;
      default: return false; // complex
    }
  }

  // An int or bool list as TP_ARG_INTS, its values appended to ints.
  template <class List>
  static bool ints_arg(const List& list, tp_arg* a, int64_t* ints, size_t* nints) {
    if (*nints + list.size() > kMaxInts) return false;
    a->kind = TP_ARG_INTS;
    a->n = static_cast<int>(list.size());
    a->ints = &ints[*nints];
    for (const auto x : list) ints[(*nints)++] = static_cast<int64_t>(x);
    return true;
  }

  bool run(torch::jit::Stack& stack) const {
    const size_t n = cls.size();
    if (n > kMaxArgs || stack.size() < n) return false;
    const c10::IValue* args = stack.data() + (stack.size() - n);
    tp_eager_arg ea[kMaxArgs];
    tp_tensor_ref refs[kMaxArgs + TP_SPEC_MAX_OUTS];
    int64_t ints[kMaxInts];
    size_t nints = 0;
    int nrefs = 0, device = -1;
    std::memset(ea, 0, sizeof(tp_eager_arg) * n);
    for (size_t i = 0; i < n; i++) {
      const c10::IValue& v = args[i];
      tp_arg* a = &ea[i].a;
      if (v.isNone()) {
        a->kind = TP_ARG_NONE;
      } else if (cls[i] == kOnlyNone) {
        return false;
      } else if (v.isTensor()) {
        const at::Tensor& t = v.toTensor();
        if (!t.defined()) {
          a->kind = TP_ARG_NONE;
        } else if (t.device().type() != kTpu) {
          if (cls[i] != kNumber || !wrapped_number(t, a)) return false;
        } else {
          if (!ref(t, &device, &refs[nrefs])) return false;
          a->kind = TP_ARG_TENSOR;
          ea[i].t = &refs[nrefs++];
        }
      } else if (cls[i] == kNumber && v.isDouble()) {
        tp_eager_number_f64(a, v.toDouble());
      } else if (cls[i] == kNumber && (v.isInt() || v.isBool())) {
        tp_eager_number_int(a, v.isBool() ? v.toBool() : v.toInt(), v.isBool());
      } else if (v.isBool()) {
        a->kind = TP_ARG_BOOL;
        a->i = v.toBool();
      } else if (v.isInt()) { // ints, dtypes
        a->kind = TP_ARG_INT;
        a->i = v.toInt();
      } else if (v.isDouble()) {
        a->kind = TP_ARG_FLOAT;
        a->f = v.toDouble();
      } else if (v.isString()) {
        a->kind = TP_ARG_STR;
        a->s = v.toStringRef().c_str(); // lives on the stack until we pop it
      } else if (v.isIntList()) {
        if (!ints_arg(v.toIntList(), a, ints, &nints)) return false;
      } else if (v.isBoolList()) { // as _C.fast_call reads them: ints 0/1
        if (!ints_arg(v.toBoolList(), a, ints, &nints)) return false;
      } else {
        return false; // symbolic numbers, float lists, complex numbers
      }
    }
    if (device < 0) return false;
    tp_op_specs specs;
    // Specs recorded under another default dtype do not count: the Python
    // kernel notices the change and starts the table over.
    const int ctx = static_cast<int>(c10::get_default_dtype_as_scalartype());
    if (!tp_eager_specs_find(op.c_str(), ea, static_cast<int>(n), by_value, ctx, &specs)) return false;
    if (static_cast<size_t>(specs.n) != nreturns) return false;

    std::vector<at::Tensor> outs;
    tp_tensor_ref* orefs = &refs[nrefs];
    int norefs = 0;
    if (inplace) {
      if (ea[0].a.kind != TP_ARG_TENSOR) return false;
      orefs[norefs++] = *ea[0].t;
    } else {
      outs.reserve(nreturns);
      for (int j = 0; j < specs.n; j++) {
        const tp_out_spec& s = specs.out[j];
        if (!s.defined) {
          outs.emplace_back();
          continue;
        }
        outs.push_back(at::empty_strided(
            c10::IntArrayRef(s.sizes, s.rank), c10::IntArrayRef(s.strides, s.rank),
            at::TensorOptions().dtype(static_cast<c10::ScalarType>(s.dt)).device(kTpu, device)));
        if (!ref(outs.back(), &device, &orefs[norefs])) {
          // zero-size outputs: the Python kernel handles them
          return false;
        }
        norefs++;
      }
    }
    if (tp_status* st = tp_eager_run(lowering.c_str(), ea, static_cast<int>(n), nullptr, orefs, norefs)) raise_status(st);

    c10::IValue self = inplace ? args[0] : c10::IValue();
    torch::jit::drop(stack, n);
    if (inplace) {
      stack.push_back(std::move(self));
    } else {
      for (auto& o : outs) stack.emplace_back(std::move(o));
    }
    return true;
  }
};

// _copy_from(src, dst) between two tpu tensors of one device:
// tp_eager_copy, so `x[i] = v` and `dst.copy_(src)` in a loop pay no
// Python.  Everything else -- host <-> device, another device,
// conjugate/negative bits, complex32, zero-size tensors -- is the Python
// kernel's (_dispatch._copy_from).
struct CopyKernel final : c10::OperatorKernel {
  void operator()(const c10::OperatorHandle& h, c10::DispatchKeySet, torch::jit::Stack* stack) {
    serve(h, stack, run);
  }

  static bool run(torch::jit::Stack& stack) {
    if (stack.size() < 3) return false;
    const c10::IValue* args = stack.data() + (stack.size() - 3);
    if (!args[0].isTensor() || !args[1].isTensor()) return false;
    const at::Tensor &src = args[0].toTensor(), &dst = args[1].toTensor();
    if (!src.defined() || !dst.defined()) return false;
    tp_tensor_ref refs[2];
    int device = -1;
    if (!FastKernel::ref(src, &device, &refs[0]) || !FastKernel::ref(dst, &device, &refs[1])) return false;
    if (tp_status* st = tp_eager_copy(&refs[0], &refs[1])) raise_status(st);
    c10::IValue out = args[1];
    torch::jit::drop(stack, 3);
    stack.push_back(std::move(out));
    return true;
  }
};

std::mutex g_register_mu;

// The library the fast kernels are registered in (under g_register_mu); it
// lives as long as the process, so its kernels stay registered.
torch::Library& fast_library() {
  static torch::Library* lib =
      new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  return *lib;
}

} // namespace
} // namespace torch_pjrt

// Register the fast kernel of `name` ("aten::add.Tensor").  `numbers` has
// one byte per schema argument: 1 where a Python number is a runtime scalar
// (the Python handler's number_is_scalar).  Returns 0; 1 if the op is not
// one the fast kernels serve (register its Python kernel under PrivateUse1
// instead); -1 with a message in err.  Called once per op by
// torch_pjrt/_dispatch.py.
extern "C" __attribute__((visibility("default"))) int tp_glue_register_fast(
    const char* name, const char* lowering, const char* numbers, int nargs, int numbers_by_value, int inplace,
    char* err, size_t errlen) {
  using namespace torch_pjrt;
  try {
    const std::lock_guard<std::mutex> lock(g_register_mu);
    const std::string full(name);
    const size_t colons = full.find("::"), dot = full.find('.', colons == std::string::npos ? 0 : colons);
    const std::string base = full.substr(0, dot), overload = dot == std::string::npos ? "" : full.substr(dot + 1);
    auto handle = c10::Dispatcher::singleton().findSchema({base, overload});
    TORCH_CHECK(handle.has_value(), "no operator ", full);
    const c10::FunctionSchema& schema = handle->schema();
    TORCH_CHECK(static_cast<size_t>(nargs) == schema.arguments().size(), full, ": expected ",
                schema.arguments().size(), " argument flags, got ", nargs);
    // Only ops returning tensors: a Tensor[] result (one list on the
    // stack) or none at all stays with the Python kernel.
    if (schema.returns().empty()) return 1;
    for (const c10::Argument& r : schema.returns())
      if (r.real_type()->kind() != c10::TypeKind::TensorType) return 1;
    auto k = std::make_unique<FastKernel>();
    k->op = full;
    k->lowering = lowering;
    k->by_value = numbers_by_value != 0;
    k->inplace = inplace != 0;
    k->nreturns = schema.returns().size();
    for (int i = 0; i < nargs; i++) k->cls.push_back(classify(schema.arguments()[i], numbers[i] != 0));
    TORCH_CHECK(base.rfind("aten::", 0) == 0, full, ": only aten operators take fast kernels");
    fast_library().impl(full.substr(6).c_str(), torch::CppFunction::makeFromBoxedFunctor(std::move(k)));
    return 0;
  } catch (const std::exception& e) {
    std::snprintf(err, errlen, "%s", e.what());
    return -1;
  }
}

// Register CopyKernel for aten::_copy_from (its Python kernel is under
// PrivateUse2).  Returns 0, or -1 with a message in err.
extern "C" __attribute__((visibility("default"))) int tp_glue_register_copy(char* err, size_t errlen) {
  using namespace torch_pjrt;
  try {
    const std::lock_guard<std::mutex> lock(g_register_mu);
    fast_library().impl("_copy_from", torch::CppFunction::makeFromBoxedFunctor(std::make_unique<CopyKernel>()));
    return 0;
  } catch (const std::exception& e) {
    std::snprintf(err, errlen, "%s", e.what());
    return -1;
  }
}

// Turn the fast kernels on or off; returns whether they were on.
extern "C" __attribute__((visibility("default"))) int tp_glue_set_fast(int on) {
  return torch_pjrt::g_enabled.exchange(on != 0);
}

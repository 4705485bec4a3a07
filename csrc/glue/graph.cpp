// graph.cpp - the call into a compiled graph's program.
//
// torch_pjrt/_compile.py lowers each FX graph once, into a core graph run by
// the tp::graph lowering; every call of the compiled function then runs
//
//   torch.ops.torch_pjrt.run_graph(graph, inputs, mutated, out_specs, device)
//
// which allocates the outputs (out_specs, flat: per output its rank, sizes,
// strides and dtype code), reads each tensor's storage handle and layout
// into the core's refs, and runs the program; the program also writes the
// new values of the `mutated` inputs into them.  It returns the outputs.
// Doing this in C++ rather than building a Python tuple per tensor is what
// keeps a compiled optimizer step (hundreds of tensors) cheap on the host.
// As in the rest of the glue nothing is decided here: _compile.py chose the
// inputs, the outputs and their layouts.

#include "glue.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_strided.h>
#include <torch/library.h>

#include <cstring>
#include <vector>

extern "C" {
#include "dtype.h"
#include "eager.h"
}

namespace torch_pjrt {
namespace {

void to_ref(const at::Tensor& t, c10::DeviceIndex device, tp_tensor_ref* r) {
  TORCH_CHECK(t.device().type() == kTpu && t.device().index() == device && t.has_storage(),
              "torch-pjrt compiled graph: expected tensors on ", c10::Device(kTpu, device), ", got one on ",
              t.device());
  TORCH_CHECK(t.dim() <= TP_MAX_RANK, "tensors of more than ", TP_MAX_RANK,
              " dimensions are not supported on tpu");
  std::memset(r, 0, sizeof *r);
  r->st = static_cast<tp_storage*>(t.storage().data_ptr().get());
  r->dt = static_cast<tp_dtype>(static_cast<int>(t.scalar_type()));
  r->rank = static_cast<int>(t.dim());
  for (int i = 0; i < r->rank; i++) {
    r->sizes[i] = t.sizes()[i];
    r->strides[i] = t.strides()[i];
  }
  r->offset = t.storage_offset();
}

std::vector<at::Tensor> run_graph(int64_t graph, at::TensorList inputs, at::TensorList mutated,
                                  at::IntArrayRef out_specs, c10::Device device) {
  TORCH_CHECK(device.type() == kTpu && device.has_index(), "run_graph: expected a tpu device with an index");
  const c10::DeviceIndex dev = device.index();
  std::vector<at::Tensor> outs;
  for (size_t k = 0; k < out_specs.size();) {
    const int64_t rank = out_specs[k];
    TORCH_CHECK(rank >= 0 && k + 2 * rank + 2 <= out_specs.size(), "run_graph: malformed out_specs");
    const at::IntArrayRef sizes = out_specs.slice(k + 1, rank), strides = out_specs.slice(k + 1 + rank, rank);
    const auto dtype = static_cast<c10::ScalarType>(out_specs[k + 1 + 2 * rank]);
    outs.push_back(at::empty_strided(sizes, strides, at::TensorOptions().dtype(dtype).device(device)));
    k += 2 * rank + 2;
  }
  std::vector<tp_tensor_ref> refs(inputs.size() + outs.size() + mutated.size());
  std::vector<tp_eager_arg> args(1 + inputs.size());
  std::memset(args.data(), 0, sizeof(tp_eager_arg) * args.size());
  args[0].a.kind = TP_ARG_INT;
  args[0].a.i = graph;
  // The program reads stored values: an input that is a lazy conjugate or
  // negative view (x.conj(), z.conj().imag; AOTAutograd saves such views
  // for complex backward graphs) is materialised first, as eager mode's
  // kernels do.
  std::vector<at::Tensor> resolved;
  resolved.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); i++) {
    const at::Tensor& t = inputs[i];
    resolved.push_back(t.is_conj() || t.is_neg() ? t.resolve_conj().resolve_neg() : t);
    to_ref(resolved.back(), dev, &refs[i]);
    args[1 + i].a.kind = TP_ARG_TENSOR;
    args[1 + i].t = &refs[i];
  }
  tp_tensor_ref* orefs = refs.data() + inputs.size();
  for (size_t i = 0; i < outs.size(); i++) to_ref(outs[i], dev, &orefs[i]);
  for (size_t i = 0; i < mutated.size(); i++) {
    TORCH_CHECK(!mutated[i].is_conj() && !mutated[i].is_neg(),
                "torch-pjrt compiled graph: updating a conjugate or negative view in place is not supported; "
                "call .resolve_conj() / .resolve_neg() on it first");
    to_ref(mutated[i], dev, &orefs[outs.size() + i]);
  }
  const int nouts = static_cast<int>(outs.size() + mutated.size());
  if (nouts > 0) {
    if (tp_status* st = tp_eager_run("tp::graph", args.data(), static_cast<int>(args.size()), nullptr, orefs, nouts))
      raise_status(st);
  }
  return outs;
}

} // namespace
} // namespace torch_pjrt

TORCH_LIBRARY(torch_pjrt, m) {
  m.def("run_graph(int graph, Tensor[] inputs, Tensor[] mutated, int[] out_specs, Device device) -> Tensor[]",
        &torch_pjrt::run_graph);
}

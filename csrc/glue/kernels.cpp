// kernels.cpp - the PrivateUse1 kernels that only touch tensor metadata.
//
// Registered here: ops whose only kernels in torch 2.13 are per-backend
// (CPU/CUDA/Meta) and that create tensors or change sizes, strides, offsets
// or storages without reading data.  Checked with
// torch._C._dispatch_has_kernel_for_dispatch_key: t, transpose, select,
// slice, expand, permute, squeeze, unsqueeze, alias, detach, diagonal,
// _unsafe_view, view.dtype, split, unbind, empty_like, clone, copy_,
// resize_as_, _to_copy have CompositeExplicitAutograd kernels, and
// reshape, flatten, narrow, contiguous have CompositeImplicitAutograd ones,
// so they already work on top of these.  Everything else (including
// _copy_from and _local_scalar_dense) must reach the Python boxed fallback,
// so no C++ fallback is registered.
//
// resize_ and set_ do not reuse the CPU kernels: those grow a storage with
// memcpy on its data pointer, which here is a tp_storage handle.

#include "glue.h"

#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <ATen/native/Resize.h>
#include <ATen/native/ResizeCommon.h>
#include <ATen/native/TensorFactories.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/is_set_to_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

namespace torch_pjrt {
namespace {

constexpr c10::DispatchKeySet kTpuKeys(c10::DispatchKey::PrivateUse1);

// torch.use_deterministic_algorithms(True) with
// torch.utils.deterministic.fill_uninitialized_memory (the default): new
// memory reads as NaN (integers: their largest value), as on the CPU and
// CUDA, so a read of uninitialised memory shows.
bool fill_uninitialized() {
  const at::Context& ctx = at::globalContext();
  return ctx.deterministicAlgorithms() && ctx.deterministicFillUninitializedMemory();
}

at::Tensor filled(at::Tensor t) {
  if (C10_UNLIKELY(fill_uninitialized()) && t.numel() > 0) at::native::fill_empty_deterministic_(t);
  return t;
}

void check_options(const c10::Device& device,
                   std::optional<c10::Layout> layout,
                   std::optional<bool> pin_memory) {
  TORCH_CHECK(device.type() == kTpu, "expected a ", kTpu, " device, got ",
              device);
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided,
              c10::get_privateuse1_backend(),
              " supports only strided tensors, got layout ", *layout);
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory),
              "only CPU tensors can be pinned");
}

at::Tensor empty_memory_format(c10::IntArrayRef size,
                               std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout,
                               std::optional<c10::Device> device,
                               std::optional<bool> pin_memory,
                               std::optional<c10::MemoryFormat> format) {
  const c10::Device dev = c10::device_or_default(device);
  check_options(dev, layout, pin_memory);
  // The allocator allocates on the current device: make it `dev`.
  const c10::DeviceGuard guard(dev);
  return filled(at::detail::empty_generic(size, allocator(), kTpuKeys,
                                          c10::dtype_or_default(dtype), format));
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                         std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout,
                         std::optional<c10::Device> device,
                         std::optional<bool> pin_memory) {
  const c10::Device dev = c10::device_or_default(device);
  check_options(dev, layout, pin_memory);
  const c10::DeviceGuard guard(dev);
  return filled(at::detail::empty_strided_generic(size, stride, allocator(),
                                                  kTpuKeys,
                                                  c10::dtype_or_default(dtype)));
}

// A ZeroTensor: all zeros by definition, no storage behind it (as the CPU
// kernel makes it).  Autograd's forward mode and some backward formulas
// create them; PyTorch's ZeroTensor fallback turns them into real zeros
// (at::zeros) before any kernel of ours reads one.
at::Tensor efficientzerotensor(c10::IntArrayRef size,
                               std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout,
                               std::optional<c10::Device> device,
                               std::optional<bool> pin_memory) {
  const c10::Device dev = c10::device_or_default(device);
  check_options(dev, layout, pin_memory);
  at::native::ZeroTensorAllocator zeros(dev);
  return at::detail::empty_generic(
      size, &zeros, kTpuKeys | c10::DispatchKeySet(c10::DispatchKey::ZeroTensor),
      c10::dtype_or_default(dtype), std::nullopt);
}

// Grow (never shrink) the storage so `nbytes` from its start are valid, as
// the CPU kernels' maybe_resize_storage_cpu does.  A tensor with no
// elements needs nothing, whatever its offset.
void ensure_storage(c10::TensorImpl* self, size_t nbytes) {
  if (self->numel() == 0) return;
  const c10::Storage& storage = self->unsafe_storage();
  if (nbytes > storage.nbytes()) resize_storage_bytes(storage, nbytes);
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<c10::MemoryFormat> format) {
  c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  const int64_t old_nbytes = static_cast<int64_t>(impl->unsafe_storage().nbytes());
  // Sizes and contiguous strides only; the storage is ours to grow.
  at::native::resize_impl_cpu_(impl, size, std::nullopt,
                               /*resize_storage=*/false);
  ensure_storage(impl, at::detail::computeStorageNbytesContiguous(
                           size, self.dtype().itemsize(),
                           impl->storage_offset()));
  if (C10_UNLIKELY(fill_uninitialized())) at::native::fill_resize_deterministic_(self, old_nbytes);
  if (format) {
    TORCH_CHECK(*format != c10::MemoryFormat::Preserve,
                "Unsupported memory format ", *format);
    impl->empty_tensor_restride(*format); // same extent, permuted strides
  }
  return self;
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source,
                        int64_t offset, c10::IntArrayRef size,
                        c10::IntArrayRef stride) {
  // Validates offset and bounds, checks devices match, swaps the storage.
  at::native::checkSetStorage(self, source, offset, size, stride);
  c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  impl->set_storage_offset(offset);
  const bool strided = stride.data() != nullptr; // "stride=[]": contiguous
  at::native::resize_impl_cpu_(
      impl, size, strided ? at::OptionalIntArrayRef(stride) : std::nullopt,
      /*resize_storage=*/false);
  const size_t itemsize = self.dtype().itemsize();
  ensure_storage(impl, strided ? at::detail::computeStorageNbytes(
                                     size, stride, itemsize, offset)
                               : at::detail::computeStorageNbytesContiguous(
                                     size, itemsize, offset));
  return self;
}

at::Tensor& set_empty(at::Tensor& self) {
  // A fresh 0-byte storage on the tensor's own device.
  const c10::DeviceGuard guard(self.device());
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, allocator(),
                       /*resizable=*/true);
  return set_storage(self, std::move(storage), 0, {0}, {});
}

// Whether `self.data = from` may swap self's contents in place.  ATen's
// answer lists CUDA and the other built-in accelerators next to the CPU but
// not PrivateUse1, so Module.to("tpu") would make new Parameter objects:
// weights tied by sharing one Parameter would come apart, and an optimizer
// built before .to() would hold stale ones.  Dense tpu and CPU tensors are as
// interchangeable as dense CUDA and CPU tensors.
bool has_compatible_shallow_copy_type(const at::Tensor& self,
                                      const at::Tensor& from) {
  if (self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(
          from.key_set()))
    return true;
  constexpr auto backends = c10::DispatchKeySet(
      {c10::BackendComponent::CPUBit, c10::BackendComponent::PrivateUse1Bit});
  auto dense = [&](const at::Tensor& t) {
    const c10::DispatchKeySet ks = t.key_set();
    return ks.has(c10::DispatchKey::Dense) && ks.has_any(backends) &&
           t.layout() == at::kStrided;
  };
  return dense(self) && dense(from);
}

} // namespace
} // namespace torch_pjrt

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  using namespace torch_pjrt;
  // Tensor creation: PyTorch's generic constructors with our allocator.
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("_efficientzerotensor", efficientzerotensor);
  // Views: ATen's device-independent metadata implementations.
  m.impl("as_strided", at::native::as_strided_tensorimpl);
  m.impl("view", at::native::view);
  m.impl("_reshape_alias", at::native::_reshape_alias);
  m.impl("unfold", at::native::unfold);
  m.impl("view_as_real", at::native::view_as_real);
  m.impl("view_as_complex", at::native::view_as_complex);
  m.impl("is_set_to", at::native::is_set_to); // compares metadata only
  // Storage changes: grown in place through tp_storage_resize.
  m.impl("resize_", resize_);
  m.impl("set_.source_Storage_storage_offset", set_storage);
  m.impl("set_.source_Storage", at::native::set_);       // -> set_storage
  m.impl("set_.source_Tensor", at::native::set_tensor_); // -> set_storage
  m.impl("set_", set_empty);
  m.impl("_has_compatible_shallow_copy_type", has_compatible_shallow_copy_type);
  // One in-order stream per device: nothing to record.
  m.impl("record_stream", [](at::Tensor&, c10::Stream) {});
}

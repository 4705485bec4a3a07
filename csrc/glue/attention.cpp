// attention.cpp - which backend scaled_dot_product_attention takes on tpu.
//
// PyTorch's scaled_dot_product_attention asks a per-device DispatchStub,
// _fused_sdp_choice_stub, for its backend; without a PrivateUse1 entry every
// call takes the math backend (about ten eager ops).  This entry hands the
// question to the aten::_fused_sdp_choice op, whose tpu kernel is Python
// (torch_pjrt/_attention.py: the rules for the fused "overrideable" backend
// and its kernels live there), so no attention logic is in C++.  Calls on
// wrapped tensors (vmap, tracing) take the math backend without asking.

#include "glue.h"

#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_fused_sdp_choice.h>

namespace torch_pjrt {
namespace {

// Tensors inside a transform or a trace: vmap's batched tensors (the op has
// no batching rule), fake and functional tensors, grad transforms' wrappers.
const c10::DispatchKeySet kWrapped({c10::DispatchKey::FuncTorchBatched,
                                    c10::DispatchKey::BatchedNestedTensor,
                                    c10::DispatchKey::FuncTorchGradWrapper,
                                    c10::DispatchKey::Functionalize,
                                    c10::DispatchKey::Python});

int64_t fused_sdp_choice(const at::Tensor& query, const at::Tensor& key,
                         const at::Tensor& value,
                         const std::optional<at::Tensor>& attn_mask,
                         double dropout_p, bool is_causal,
                         std::optional<double> scale, bool enable_gqa) {
  if (query.key_set().has_any(kWrapped)) return 0;  // SDPBackend::math
  return at::_fused_sdp_choice(query, key, value, attn_mask, dropout_p,
                               is_causal, scale, enable_gqa);
}

}  // namespace
}  // namespace torch_pjrt

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub,
                              &torch_pjrt::fused_sdp_choice)
}  // namespace at::native

// autocast.cpp - torch.autocast("tpu"): the AutocastPrivateUse1 kernels.
//
// PyTorch registers autocast's casting wrappers for its own devices only; a
// PrivateUse1 backend registers them itself.  These are PyTorch's own
// wrappers and op lists (ATen/autocast_mode.h), the ones CUDA uses: matmuls
// and convolutions in the autocast dtype (bfloat16 on a TPU), reductions,
// norms, losses and transcendental functions in float32, mixed-dtype ops
// promoted.  Ops not listed fall through to the next dispatch key.  No op
// logic lives here: the casts are PyTorch's, the ops run through the normal
// "tpu" kernels.

#include <ATen/autocast_mode.h>
#include <torch/library.h>

// The op lists and KERNEL macros name Tensor, Scalar, WrapFunction, CastPolicy
// unqualified, as in PyTorch's own registration file.
using namespace at;
using namespace at::autocast;

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
#define TP_LOWER_PRECISION_FP(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
  AT_FORALL_LOWER_PRECISION_FP(TP_LOWER_PRECISION_FP)
#define TP_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
  AT_FORALL_FP32(TP_FP32)
#define TP_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
  AT_FORALL_FP32_SET_OPT_DTYPE(TP_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
#define TP_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_PROMOTE(TP_PROMOTE)
#undef TP_LOWER_PRECISION_FP
#undef TP_FP32
#undef TP_FP32_SET_OPT_DTYPE
#undef TP_PROMOTE
}

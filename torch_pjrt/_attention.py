"""scaled_dot_product_attention on tpu: PyTorch's "overrideable" fused backend.

PyTorch asks each device which backend an SDPA call takes
(csrc/glue/attention.cpp routes tpu's question to `_fused_sdp_choice`
below).  The math backend is about ten eager ops, each its own program, and
each compiled again for every new key length (a growing KV cache in
`generate()`).  The overrideable backend is two ATen ops,
`_scaled_dot_product_fused_attention_overrideable` and its backward, with
PyTorch's own autograd formula between them; on tpu each runs as one
program: the `tp::sdpa` and `tp::sdpa_backward` ops defined here, lowered by
r_sdpa and r_sdpa_backward (csrc/core/lower_nn.c), which also say what they
compute.  Compiled graphs take the math backend (see fused_sdp_choice); one
that calls the ATen ops itself gets these kernels (`_compile._decompositions`).

Calls the fused kernels do not cover take the math backend, as before:
dropout (its random numbers stay those of the math backend's dropout op),
inputs that are not 4-d, mixed or non-floating dtypes, heads that do not
group evenly, empty sizes, calls under vmap or a trace, and calls made
while the user disabled the overrideable backend
(`torch.nn.attention.sdpa_kernel`).
"""
import torch

_MATH = 0  # torch.nn.attention.SDPBackend.MATH
_OVERRIDEABLE = 4  # SDPBackend.OVERRIDEABLE
_FLOATS = (torch.float32, torch.float64, torch.bfloat16, torch.float16)

_lib = torch.library.Library("tp", "DEF")
_lib.define("sdpa(Tensor q, Tensor k, Tensor v, Tensor? bias, bool is_causal, float? scale) -> (Tensor, Tensor)")
_lib.define("sdpa_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor? bias, bool is_causal, float? scale, "
            "bool bias_grad) -> (Tensor, Tensor, Tensor, Tensor)")


@torch.library.register_fake("tp::sdpa", lib=_lib)
def _sdpa_meta(q, k, v, bias, is_causal, scale):
    return q.new_empty(q.shape[:-1] + (v.shape[-1],)), q.new_empty(q.shape[:-1], dtype=torch.float32)


@torch.library.register_fake("tp::sdpa_backward", lib=_lib)
def _sdpa_backward_meta(grad_out, q, k, v, bias, is_causal, scale, bias_grad):
    db = bias.new_empty(bias.shape) if bias_grad else q.new_empty((0,))
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), db


def _fits(q, k, v, mask, dropout_p, enable_gqa):
    if dropout_p != 0.0 or q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return False
    if q.dtype not in _FLOATS or k.dtype != q.dtype or v.dtype != q.dtype:
        return False
    if any(t.is_nested for t in (q, k, v)) or 0 in (q.numel(), k.numel(), v.numel()):
        return False
    (b, h, _, e), (bk, hk, s, ek), (bv, hv, sv, _) = q.shape, k.shape, v.shape
    if not (b == bk == bv and hk == hv and s == sv and e == ek):
        return False
    if h != hk and not (enable_gqa and h % hk == 0):
        return False
    if mask is not None:
        if mask.dtype not in (torch.bool, q.dtype) or mask.dim() > 4:
            return False
        try:
            torch.broadcast_shapes(mask.shape, (b, h, q.shape[2], s))
        except RuntimeError:
            return False
    return True


def fused_sdp_choice(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                     enable_gqa=False):
    """The tpu kernel of aten::_fused_sdp_choice, asked for eager calls
    only: a graph being traced (fake or functional tensors) keeps the math
    backend without asking (csrc/glue/attention.cpp).  XLA fuses the math
    ops with their neighbours and their backward reuses the saved softmax,
    which the fused kernels' backward recomputes (docs/architecture.md,
    "Attention": as fast at 128 tokens, 10% slower at 512 in a compiled
    training step; 9-10% faster eager)."""
    if query.device.type != "tpu":
        return _MATH
    if torch._C._get_overrideable_sdp_enabled() and _fits(query, key, value, attn_mask, dropout_p, enable_gqa):
        return _OVERRIDEABLE
    return _MATH


def sdpa_overrideable(query, key, value, attn_bias=None, dropout_p=0.0, is_causal=False, return_debug_mask=False,
                      *, scale=None):
    """aten::_scaled_dot_product_fused_attention_overrideable on tpu (its meta function's outputs)."""
    if dropout_p != 0.0 or return_debug_mask:
        raise NotImplementedError("the tpu fused attention kernel takes no dropout and returns no debug mask; "
                                  "call torch.nn.functional.scaled_dot_product_attention, which picks the math "
                                  "backend for these")
    out, lse = torch.ops.tp.sdpa(query, key, value, attn_bias, is_causal, scale)
    # No RNG: the philox seed and offset stay undefined, as cum_seq_q/k do.
    return out, lse, None, None, query.shape[2], key.shape[2], None, None, None


def sdpa_overrideable_backward(grad_out, query, key, value, attn_bias, grad_input_mask, out, logsumexp,
                               cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, philox_seed,
                               philox_offset, *, scale=None):
    """Its backward on tpu: dq, dk, dv, and dbias where asked for."""
    bias_grad = bool(grad_input_mask[3]) and attn_bias is not None
    # (logsumexp goes unused: the kernel recomputes the forward's softmax)
    dq, dk, dv, db = torch.ops.tp.sdpa_backward(grad_out, query, key, value, attn_bias, is_causal, scale, bias_grad)
    return dq, dk, dv, (db if bias_grad else None)


# The backend's ops: tpu kernels (their default kernel raises, one meant for
# backends to override) and graphs' decompositions.
KERNELS = {
    "aten::_scaled_dot_product_fused_attention_overrideable": sdpa_overrideable,
    "aten::_scaled_dot_product_fused_attention_overrideable_backward": sdpa_overrideable_backward,
}

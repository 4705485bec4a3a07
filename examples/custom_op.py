"""Custom operators with a device body (torch_pjrt.library, docs/custom_ops.md).

    python examples/custom_op.py

Two fused RMSNorm ops, y = x * rsqrt(mean(x^2, -1) + eps) * w:
- `examples::rms_norm`: its "tpu" body written in StableHLO text;
- `examples::rms_norm_jax`: its "tpu" body a JAX function (when jax is
  installed; skipped otherwise).
Both are `torch.library.custom_op`s with a CPU implementation (the PyTorch
reference), a fake function (shapes for torch.compile) and a backward
(`register_autograd`, in PyTorch ops).  Each is checked against the
reference, forward and backward, eagerly and inside torch.compile, where the
body is inlined into the graph's one program.
"""
import torch

import torch_pjrt
import torch_pjrt.library as tpl


def reference(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


# ---- the StableHLO-bodied op ---------------------------------------------------------------------

@torch.library.custom_op("examples::rms_norm", mutates_args=())
def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return reference(x, w, eps)  # the CPU's implementation


@rms_norm.register_fake
def _(x, w, eps):
    return torch.empty_like(x)


@tpl.register_stablehlo("examples::rms_norm")
def _(x, w, eps):
    """x: [..., D] meta tensor, w: [D]; float32 math, the result in x's dtype."""
    n, d = x.numel() // x.shape[-1], x.shape[-1]
    tx, tw, el = tpl.mlir_type(x), tpl.mlir_type(w), tpl.mlir_type(((), x.dtype))[7:-1]
    flat, flat32, row = f"tensor<{n}x{d}x{el}>", f"tensor<{n}x{d}xf32>", f"tensor<{n}xf32>"
    lead = list(range(x.dim() - 1))
    return f"""
    func.func @main(%x: {tx}, %w: {tw}) -> {tx} {{
      %x2 = stablehlo.reshape %x : ({tx}) -> {flat}
      %xf = stablehlo.convert %x2 : ({flat}) -> {flat32}
      %sq = stablehlo.multiply %xf, %xf : {flat32}
      %zero = stablehlo.constant dense<0.0> : tensor<f32>
      %sum = stablehlo.reduce(%sq init: %zero) applies stablehlo.add across dimensions = [1]
             : ({flat32}, tensor<f32>) -> {row}
      %dd = stablehlo.constant dense<{float(d):e}> : {row}
      %mean = stablehlo.divide %sum, %dd : {row}
      %e = stablehlo.constant dense<{float(eps):e}> : {row}
      %me = stablehlo.add %mean, %e : {row}
      %r = stablehlo.rsqrt %me : {row}
      %rb = stablehlo.broadcast_in_dim %r, dims = [0] : ({row}) -> {flat32}
      %wf = stablehlo.convert %w : ({tw}) -> tensor<{d}xf32>
      %wb = stablehlo.broadcast_in_dim %wf, dims = [1] : (tensor<{d}xf32>) -> {flat32}
      %y = stablehlo.multiply %xf, %rb : {flat32}
      %z = stablehlo.multiply %y, %wb : {flat32}
      %zc = stablehlo.convert %z : ({flat32}) -> {flat}
      %out = stablehlo.reshape %zc : ({flat}) -> {tx}
      return %out : {tx}
    }}"""  # (lead dims {lead} are folded into the rows)


def _setup_context(ctx, inputs, output):
    x, w, eps = inputs
    ctx.save_for_backward(x, w)
    ctx.eps = eps


def _backward(ctx, grad):
    x, w = ctx.saved_tensors
    xf = x.float()
    r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + ctx.eps)
    g = grad.float()
    gw = (g * xf * r).reshape(-1, x.shape[-1]).sum(0)
    gn = g * w.float()
    gx = r * gn - xf * r.pow(3) * (gn * xf).mean(-1, keepdim=True)
    return gx.to(x.dtype), gw.to(w.dtype), None


rms_norm.register_autograd(_backward, setup_context=_setup_context)


# ---- the JAX-bodied op ---------------------------------------------------------------------------

@torch.library.custom_op("examples::rms_norm_jax", mutates_args=())
def rms_norm_jax(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return reference(x, w, eps)


@rms_norm_jax.register_fake
def _(x, w, eps):
    return torch.empty_like(x)


rms_norm_jax.register_autograd(_backward, setup_context=_setup_context)

try:
    import jax.numpy as jnp

    @tpl.register_jax("examples::rms_norm_jax")
    def _(x, w, eps):
        xf = x.astype(jnp.float32)
        r = 1.0 / jnp.sqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
        return (xf * r * w.astype(jnp.float32)).astype(x.dtype)

    HAVE_JAX = True
except ImportError:
    HAVE_JAX = False


def check(op, name):
    torch.manual_seed(0)
    x = torch.randn(4, 6, 64, requires_grad=True)
    w = (torch.rand(64) + 0.5).requires_grad_()
    g = torch.randn(4, 6, 64)
    ref = reference(x, w, 1e-6)
    ref.backward(g)
    rx, rw = x.grad, w.grad
    for mode in ("eager", "compiled"):
        xt = x.detach().to("tpu").requires_grad_()
        wt = w.detach().to("tpu").requires_grad_()
        fn = op if mode == "eager" else torch.compile(lambda a, b, e: op(a, b, e) * 1.0, backend="tpu")
        y = fn(xt, wt, 1e-6)
        y.backward(g.to("tpu"))
        errs = [(y.detach().cpu() - ref.detach()).abs().max().item(), (xt.grad.cpu() - rx).abs().max().item(),
                (wt.grad.cpu() - rw).abs().max().item()]
        print(f"{name:22s} {mode:8s} max |tpu - reference|: y {errs[0]:.1e}, dx {errs[1]:.1e}, dw {errs[2]:.1e}")
        assert max(errs) < 1e-4, errs
    counts = torch_pjrt.metrics()
    print(f"{'':22s} compiled graphs: {counts['graphs_lowered']} as one program, {counts['graphs_split']} split")


if __name__ == "__main__":
    check(rms_norm, "rms_norm (StableHLO)")
    if HAVE_JAX:
        check(rms_norm_jax, "rms_norm_jax (JAX)")
    else:
        print("jax is not installed: examples::rms_norm_jax skipped (pip install jax)")

"""Custom operators with a device body (torch_pjrt.library, issue 41 part 3):
StableHLO text and JAX functions as the "tpu" implementation of a
torch.library op, eagerly and inlined into compiled graphs, with autograd;
bad bodies raise errors naming the op."""
import os
import sys

import pytest
import torch

import torch_pjrt
import torch_pjrt.library as tpl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
import custom_op  # noqa: E402  (defines examples::rms_norm and examples::rms_norm_jax)

_n = [0]


def _new_op(schema_fn, fake):
    """A fresh custom op (each test its own name: registrations are global)."""
    _n[0] += 1
    name = f"tptest::op{_n[0]}"
    op = torch.library.custom_op(name, mutates_args=())(schema_fn)
    op.register_fake(fake)
    return name, op


def _scale_add(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    return x + alpha * y


def _scale_add_body(x, y, alpha):
    t = tpl.mlir_type(x)
    return f"""
    func.func @main(%x: {t}, %y: {t}) -> {t} {{
      %a = stablehlo.constant dense<{float(alpha):e}> : {t}
      %0 = stablehlo.multiply %a, %y : {t}
      %1 = stablehlo.add %x, %0 : {t}
      return %1 : {t}
    }}"""


def _counts():
    m = torch_pjrt.metrics()
    return m["graphs_lowered"], m["graphs_split"], m["graphs_eager"]


def test_mlir_type():
    assert tpl.mlir_type(torch.empty(4, 8)) == "tensor<4x8xf32>"
    assert tpl.mlir_type(torch.empty((), dtype=torch.bfloat16)) == "tensor<bf16>"
    assert tpl.mlir_type(((2, 3), torch.bool)) == "tensor<2x3xi1>"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_stablehlo_body_eager_and_inlined_in_one_program(dtype):
    name, op = _new_op(_scale_add, lambda x, y, alpha: torch.empty_like(x))
    tpl.register_stablehlo(name)(_scale_add_body)
    x = torch.randn(4, 8).to(dtype)
    y = torch.randn(4, 8).to(dtype)
    got = op(x.to("tpu"), y.to("tpu"), 0.5)
    assert got.device.type == "tpu" and got.dtype == dtype
    torch.testing.assert_close(got.cpu(), _scale_add(x, y, 0.5))  # XLA may fuse the body's multiply-add
    before = _counts()
    torch._dynamo.reset()

    def f(a, b):
        return torch.relu(op(a * 2, b, 0.25)) + 1

    c = torch.compile(f, backend="tpu")(x.to("tpu"), y.to("tpu"))
    after = _counts()
    torch.testing.assert_close(c.cpu(), f(x, y))
    assert after[1:] == before[1:] and after[0] == before[0] + 1, "the graph was cut around the op"


def test_body_per_shape_and_argument_values():
    """The body is built per call signature: new shapes and new Python
    argument values give new programs, the same ones reuse theirs."""
    name, op = _new_op(_scale_add, lambda x, y, alpha: torch.empty_like(x))
    calls = []

    def body(x, y, alpha):
        calls.append((tuple(x.shape), alpha))
        return _scale_add_body(x, y, alpha)

    tpl.register_stablehlo(name)(body)
    for shape, alpha in (((3,), 2.0), ((3,), 2.0), ((2, 5), 2.0), ((3,), -1.5)):
        x, y = torch.randn(shape), torch.randn(shape)
        torch.testing.assert_close(op(x.to("tpu"), y.to("tpu"), alpha).cpu(), _scale_add(x, y, alpha))
    assert calls == [((3,), 2.0), ((2, 5), 2.0), ((3,), -1.5)]


def test_reregistered_body_replaces_the_old_one():
    name, op = _new_op(_scale_add, lambda x, y, alpha: torch.empty_like(x))
    tpl.register_stablehlo(name)(_scale_add_body)
    x, y = torch.randn(3), torch.randn(3)
    assert torch.equal(op(x.to("tpu"), y.to("tpu"), 1.0).cpu(), x + y)

    def sub(x, y, alpha):
        t = tpl.mlir_type(x)
        return f"func.func @f(%x: {t}, %y: {t}) -> {t} {{\n %0 = stablehlo.subtract %x, %y : {t}\n return %0 : {t}\n}}"

    tpl.register_stablehlo(name)(sub)
    assert torch.equal(op(x.to("tpu"), y.to("tpu"), 1.0).cpu(), x - y)


def test_several_results_and_helper_functions():
    """A module whose @main calls a helper, returning two tensors of
    different dtypes."""
    def split(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x * x, (x > 0).to(torch.int32)

    name, op = _new_op(split, lambda x: (torch.empty_like(x), torch.empty_like(x, dtype=torch.int32)))

    @tpl.register_stablehlo(name)
    def _(x):
        t, ti = tpl.mlir_type(x), tpl.mlir_type((x.shape, torch.int32))
        tb = tpl.mlir_type((x.shape, torch.bool))
        return f"""
        module @m attributes {{mhlo.num_partitions = 1 : i32}} {{
          func.func private @square(%x: {t}) -> {t} {{
            %0 = stablehlo.multiply %x, %x : {t}
            return %0 : {t}
          }}
          func.func public @main(%x: {t}) -> ({t}, {ti}) {{
            %0 = func.call @square(%x) : ({t}) -> {t}
            %z = stablehlo.constant dense<0.0> : {t}
            %p = stablehlo.compare GT, %x, %z : ({t}, {t}) -> {tb}
            %i = stablehlo.convert %p : ({tb}) -> {ti}
            return %0, %i : {t}, {ti}
          }}
        }}"""

    x = torch.randn(2, 3)
    sq, pos = op(x.to("tpu"))
    assert torch.equal(sq.cpu(), x * x) and torch.equal(pos.cpu(), (x > 0).to(torch.int32))
    torch._dynamo.reset()
    c = torch.compile(lambda a: op(a)[0] + op(a)[1], backend="tpu")(x.to("tpu"))
    torch.testing.assert_close(c.cpu(), x * x + (x > 0).to(torch.int32))  # XLA may fuse a multiply-add


@pytest.mark.parametrize("op_name", ["rms_norm", "rms_norm_jax"])
def test_example_ops_forward_backward_eager_and_compiled(op_name):
    """examples/custom_op.py's fused RMSNorm ops against the PyTorch
    reference: values and both gradients, eager and compiled (one program per
    graph: the backward's ops too)."""
    if op_name == "rms_norm_jax" and not custom_op.HAVE_JAX:
        pytest.skip("jax is not installed")
    op = getattr(custom_op, op_name)
    torch.manual_seed(0)
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        x = torch.randn(3, 5, 32).to(dtype).requires_grad_()
        w = (torch.rand(32) + 0.5).to(dtype).requires_grad_()
        g = torch.randn(3, 5, 32).to(dtype)
        ref = custom_op.reference(x.float(), w.float(), 1e-6)
        ref.backward(g.float())
        for compiled in (False, True):
            before = _counts()
            torch._dynamo.reset()
            xt = x.detach().to("tpu").requires_grad_()
            wt = w.detach().to("tpu").requires_grad_()
            fn = torch.compile(lambda a, b: op(a, b, 1e-6), backend="tpu") if compiled else op
            y = fn(xt, wt) if compiled else fn(xt, wt, 1e-6)
            assert y.dtype == dtype
            y.backward(g.to("tpu"))
            torch.testing.assert_close(y.detach().cpu().float(), ref.detach(), rtol=tol, atol=tol)
            torch.testing.assert_close(xt.grad.cpu().float(), x.grad.float(), rtol=tol, atol=tol)
            torch.testing.assert_close(wt.grad.cpu().float(), w.grad.float(), rtol=tol * 4, atol=tol * 4)
            if compiled:
                after = _counts()
                assert after[1:] == before[1:] and after[0] >= before[0] + 2  # forward and backward graphs
        x.grad = w.grad = None


def test_jax_body_with_python_arguments():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    name, op = _new_op(_scale_add, lambda x, y, alpha: torch.empty_like(x))
    tpl.register_jax(name)(lambda x, y, alpha: x + alpha * jnp.tanh(y))
    x, y = torch.randn(6), torch.randn(6)
    for alpha in (0.5, 3.0):
        torch.testing.assert_close(op(x.to("tpu"), y.to("tpu"), alpha).cpu(), x + alpha * torch.tanh(y))


def _row_scale(x: torch.Tensor) -> torch.Tensor:
    return x * x.sum(-1, keepdim=True)


def test_pallas_kernel_in_interpret_mode_eager_and_compiled():
    # A Pallas kernel with a grid and block specs.  On the XLA CPU plugin it
    # runs through Pallas's interpreter (interpret=True), which lowers it to
    # ordinary StableHLO; a TPU plugin compiles the same kernel with Mosaic.
    jax = pytest.importorskip("jax")
    pl = pytest.importorskip("jax.experimental.pallas")
    jnp = jax.numpy
    name, op = _new_op(_row_scale, lambda x: torch.empty_like(x))

    def kernel(x_ref, o_ref):
        x = x_ref[...]
        o_ref[...] = x * jnp.sum(x, axis=-1, keepdims=True)

    @tpl.register_jax(name)
    def _(x):
        block = pl.BlockSpec((4, x.shape[1]), lambda i: (i, 0))
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(x.shape[0] // 4,),
                              in_specs=[block], out_specs=block, interpret=True)(x)

    x = torch.randn(16, 32)
    want = _row_scale(x)
    torch.testing.assert_close(op(x.to("tpu")).cpu(), want, rtol=1e-5, atol=1e-5)
    before = _counts()
    f = torch.compile(lambda t: op(t).relu(), backend="tpu", fullgraph=True)
    torch.testing.assert_close(f(x.to("tpu")).cpu(), want.relu(), rtol=1e-5, atol=1e-5)
    lowered, split, eager = (a - b for a, b in zip(_counts(), before))
    assert (lowered, split, eager) == (1, 0, 0)


# ---- bad bodies ---------------------------------------------------------------------------------


def _bad(body):
    name, op = _new_op(_scale_add, lambda x, y, alpha: torch.empty_like(x))
    tpl.register_stablehlo(name)(body)
    return name, lambda: op(torch.ones(3, device="tpu"), torch.ones(3, device="tpu"), 1.0)


def test_a_body_that_does_not_parse_raises_naming_the_op():
    name, call = _bad(lambda x, y, a: "func.func @main(%x: tensor<3xf32>, %y: tensor<3xf32>) -> tensor<3xf32> "
                                      "{\n %0 = stablehlo.bogus %x : tensor<3xf32>\n return %0 : tensor<3xf32>\n}")
    with pytest.raises(RuntimeError, match=name.split("::")[1]):
        call()
    ok = torch.ones(2, device="tpu") + 1  # the device still works
    assert ok.cpu().tolist() == [2.0, 2.0]


def test_result_types_must_be_the_fake_functions():
    name, call = _bad(lambda x, y, a: "func.func @main(%x: tensor<3xf32>, %y: tensor<3xf32>) -> tensor<3xf64> "
                                      "{\n %0 = stablehlo.convert %x : (tensor<3xf32>) -> tensor<3xf64>\n"
                                      " return %0 : tensor<3xf64>\n}")
    with pytest.raises(ValueError, match=r"returns \(tensor<3xf64>\).*fake function gives \(tensor<3xf32>\)"):
        call()


def test_argument_types_must_be_the_ops_tensors():
    name, call = _bad(lambda x, y, a: "func.func @main(%x: tensor<3xf32>) -> tensor<3xf32> {\n return %x : "
                                      "tensor<3xf32>\n}")
    with pytest.raises(ValueError, match="tensor arguments are"):
        call()


@pytest.mark.parametrize("body,err,match", [
    (lambda x, y, a: 42, TypeError, "must return a str"),
    (lambda x, y, a: "%0 = stablehlo.add", ValueError, "no func.func"),
])
def test_bodies_that_are_not_functions(body, err, match):
    _, call = _bad(body)
    with pytest.raises(err, match=match):
        call()


def test_registering_for_an_unknown_op():
    with pytest.raises(ValueError, match="no operator 'tptest::nosuchop'"):
        tpl.register_stablehlo("tptest::nosuchop", _scale_add_body)
    with pytest.raises(TypeError, match="expected a function"):
        tpl.register_stablehlo("examples::rms_norm", "not a function")


def test_mutating_ops_are_refused():
    _n[0] += 1
    name = f"tptest::mut{_n[0]}"

    @torch.library.custom_op(name, mutates_args=("x",))
    def mut(x: torch.Tensor) -> None:
        x.add_(1)

    with pytest.raises(NotImplementedError, match="mutates its arguments"):
        tpl.register_stablehlo(name, _scale_add_body)

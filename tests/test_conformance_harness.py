"""The conformance harness's own judgement: the cases where a result that
differs from the CPU's still passes (tied indices, closer to float64), and
which exceptions count as "unsupported".  Each check is shown to reject a
wrong result too."""
import os
import sys

import pytest
import torch
from torch.testing._internal.opinfo.core import SampleInput

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from tests.conformance import harness  # noqa: E402

TOL = harness.Tol(False, 0.0, 0.0)


def _op(name):
    return harness.op_db()[name]


def test_sort_ties_pass_only_when_indices_select_the_same_values():
    x = torch.tensor([1.0, 3.0, 3.0, 2.0])
    sample = SampleInput(x, args=(0, True))
    expected = torch.sort(x, 0, True)  # values [3, 3, 2, 1], indices [1, 2, 3, 0] or [2, 1, 3, 0]
    values = expected.values.to("tpu")
    other = expected.indices[[1, 0, 2, 3]]  # the tied pair swapped
    assert harness.ties_explain("sort", sample, (values, other.to("tpu")), expected, TOL) is None
    wrong = torch.tensor([1, 3, 2, 0])  # selects 3, 2, 3, 1
    assert harness.ties_explain("sort", sample, (values, wrong.to("tpu")), expected, TOL)
    repeated = torch.tensor([1, 1, 3, 0])
    assert harness.ties_explain("sort", sample, (values, repeated.to("tpu")), expected, TOL)
    # stable=True fixes the order: any difference is a mismatch.
    stable = SampleInput(x, args=(0, True), kwargs={"stable": True})
    assert harness.ties_explain("sort", stable, (values, other.to("tpu")), expected, TOL)


def test_kthvalue_ties_with_integer_values_and_keepdim_false():
    x = torch.tensor([[5, 1, 1, 7], [2, 2, 2, 0]])
    sample = SampleInput(x, args=(2, 1))
    expected = torch.kthvalue(x, 2, 1)
    vals = expected.values.to("tpu")
    # row 0: the 1 at index 1 or 2; row 1: a 2 at index 0, 1 or 2 (CPU picks one)
    alt = torch.tensor([1 if expected.indices[0] == 2 else 2, 0 if expected.indices[1] != 0 else 1])
    assert harness.ties_explain("kthvalue", sample, (vals, alt.to("tpu")), expected, TOL) is None
    wrong = torch.tensor([0, 3])  # values 5 and 0
    assert harness.ties_explain("kthvalue", sample, (vals, wrong.to("tpu")), expected, TOL)


def test_closer_than_cpu_measures_against_float64():
    tol = harness.Tol(False, 0.0, 0.0)
    r = torch.linspace(-3, 3, 101, dtype=torch.float64).exp()
    e = r.to(torch.bfloat16)  # the CPU: correctly rounded
    a = e.clone()
    a[7] = (e[7].float() * (1 + 2 ** -8)).to(torch.bfloat16)  # one bfloat16 step off: within tolerance
    assert not torch.equal(a, e) and harness._closer_than_cpu(a, e, r, tol)
    bad = e.clone()
    bad[50] = bad[50] * 1.1  # 10% off: far outside bfloat16's tolerance
    assert not harness._closer_than_cpu(bad, e, r, tol)
    nan = e.clone()
    nan[3] = float("nan")
    assert not harness._closer_than_cpu(nan, e, r, tol)


def test_explain_with_a_real_op():
    op = _op("exp")
    x = torch.linspace(-2, 2, 33, dtype=torch.bfloat16)
    sample = SampleInput(x)
    expected = torch.exp(x)
    ref = torch.exp(x.double()).to(torch.bfloat16)
    assert harness.explain(op, sample, ref.to("tpu"), expected, TOL) in (None, "closer_to_f64")
    if not torch.equal(ref, expected):  # a correctly rounded result is never rejected
        assert harness.explain(op, sample, ref.to("tpu"), expected, TOL) == "closer_to_f64"
    wrong = (expected.float() * 1.05).to(torch.bfloat16)
    assert harness.explain(op, sample, wrong.to("tpu"), expected, TOL) is None


def test_grad_reference_in_float64():
    op = _op("sin")
    x = torch.linspace(-1, 1, 5, requires_grad=True)
    sample = SampleInput(x)
    cots = [torch.ones(5)]
    (g,) = harness.grad_f64_ref(op, sample, cots)
    assert g.dtype == torch.float64
    torch.testing.assert_close(g, torch.cos(x.detach().double()))


def test_our_not_implemented_errors_are_unsupported():
    with pytest.raises(NotImplementedError) as ours:
        torch.zeros(2, dtype=torch.complex32, device="tpu")
    assert harness.classify_exception(ours.value)[0] == "unsupported"
    try:
        raise NotImplementedError("something else")
    except NotImplementedError as e:
        assert harness.classify_exception(e)[0] == "error"


def test_correctly_rounded_overflow_is_not_an_error():
    """A float16 result that overflows to inf where the CPU gives NaN (its
    matrix_exp does) is the exact value rounded: not less accurate."""
    r = torch.tensor([1.0, 7e4, 2.0], dtype=torch.float64)
    e = torch.tensor([1.0, float("nan"), 2.0], dtype=torch.float16)
    a = torch.tensor([1.0, float("inf"), 2.0], dtype=torch.float16)
    assert harness._closer_than_cpu(a, e, r, TOL)
    assert not harness._closer_than_cpu(torch.tensor([1.0, float("inf"), 3.0], dtype=torch.float16), e, r, TOL)


def test_float32_sums_judged_normwise():
    """A float32 gradient summed in another order: the tpu's error lands on a
    small element, the CPU's on a large one, same size; a wrong element fails."""
    r = torch.tensor([179.0, 2.95, -40.0], dtype=torch.float64)
    e = (r + torch.tensor([2.5e-5, 0.0, 0.0], dtype=torch.float64)).float()
    a = (r + torch.tensor([0.0, 4.0e-5, 0.0], dtype=torch.float64)).float()
    assert harness._closer_than_cpu(a, e, r, TOL)
    wrong = (r + torch.tensor([0.0, 1e-3, 0.0], dtype=torch.float64)).float()
    assert not harness._closer_than_cpu(wrong, e, r, TOL)


def test_compiled_mode_runs_the_samples_through_torch_compile(monkeypatch):
    # `--compiled` (CONFORMANCE_COMPILED=1): each tpu sample is one compiled
    # graph, lowered as a whole; det's gradient there reads the LU of A^T.
    import torch_pjrt

    monkeypatch.setattr(harness, "COMPILED", True)
    before = torch_pjrt.metrics()["graphs_lowered"]
    rec = harness.run_node(_op("linalg.det"), "float32", grad=True, max_samples=3)
    assert rec["status"] == "pass" and rec["grad"]["status"] == "pass", rec
    assert torch_pjrt.metrics()["graphs_lowered"] - before >= 3

"""Out-of-range indices (and integer division by zero, invalid probabilities)
raise PyTorch's CPU error instead of giving clamped or made-up values.

A program cannot raise, so indexing programs record a violation in a device
flag and the next read or synchronize raises it (eager.c, "index checks").
Each case is compared with the error PyTorch's CPU kernel raises."""
import os
import subprocess
import sys
import time

import pytest
import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

X = torch.arange(15, dtype=torch.float32).reshape(5, 3)
I = torch.tensor([1, 7])
G = torch.tensor([[7, 0, 0]])

def _computed(t, device="tpu"):
    """t as the device's own result: the host does not know its values, so
    indexing with it keeps the deferred check (uploaded values are checked at
    the op: test_indexing_semantics.py)."""
    return t.to(device).add(0)


def _setitem(x, i, v):
    x[i] = v
    return x


# name -> (fn(x, T) where T moves CPU tensors to the device, the exception
# type, the message the CPU kernel gives; None: ours differs, see `ours`)
CASES = {
    "embedding": (lambda x, T: F.embedding(T(I), x), IndexError, "index out of range in self"),
    "index_select": (lambda x, T: x.index_select(0, T(I)), IndexError, "index out of range in self"),
    "index_select_neg": (lambda x, T: x.index_select(0, T(torch.tensor([-1]))), IndexError,
                         "index out of range in self"),
    "gather": (lambda x, T: x.gather(0, T(G)), RuntimeError, "index 7 is out of bounds for dimension 0 with size 5"),
    "gather_neg": (lambda x, T: x.gather(1, T(torch.tensor([[0], [-1]]))), RuntimeError,
                   "index -1 is out of bounds for dimension 1 with size 3"),
    "getitem": (lambda x, T: x[T(I)], IndexError, "index 7 is out of bounds for dimension 0 with size 5"),
    "getitem_neg": (lambda x, T: x[T(torch.tensor([0, -6]))], IndexError,
                    "index -6 is out of bounds for dimension 0 with size 5"),
    "getitem_2d": (lambda x, T: x[T(torch.tensor([0])), T(torch.tensor([3]))], IndexError,
                   "index 3 is out of bounds for dimension 1 with size 3"),
    "index_put": (lambda x, T: x.clone().index_put_((T(I),), T(torch.ones(2, 3))), IndexError,
                  "index 7 is out of bounds for dimension 0 with size 5"),
    "setitem": (lambda x, T: _setitem(x.clone(), T(I), 1.0), IndexError,
                "index 7 is out of bounds for dimension 0 with size 5"),
    "scatter": (lambda x, T: x.clone().scatter_(0, T(G), 1.0), RuntimeError,
                "index 7 is out of bounds for dimension 0 with size 5"),
    "scatter_add": (lambda x, T: x.clone().scatter_add_(0, T(G), T(torch.ones(1, 3))), RuntimeError,
                    "index 7 is out of bounds for dimension 0 with size 5"),
    "scatter_reduce": (lambda x, T: x.clone().scatter_reduce_(0, T(G), T(torch.ones(1, 3)), "amax"), RuntimeError,
                       "index 7 is out of bounds for dimension 0 with size 5"),
    "index_add": (lambda x, T: x.clone().index_add_(0, T(I), T(torch.ones(2, 3))), RuntimeError,
                  "index 7 is out of bounds for dimension 0 with size 5"),
    "index_copy": (lambda x, T: x.clone().index_copy_(0, T(I), T(torch.ones(2, 3))), IndexError,
                   "index_copy_(): index 7 is out of bounds for dimension 0 with size 5"),
    "index_fill": (lambda x, T: x.clone().index_fill_(0, T(I), 1.0), IndexError,
                   "index 7 is out of bounds for dimension 0 with size 5"),
    "take": (lambda x, T: x.take(T(torch.tensor([20]))), IndexError,
             "out of range: tried to access index 20 on a tensor of 15 elements."),
    "put": (lambda x, T: x.clone().put_(T(torch.tensor([-16])), T(torch.tensor([1.0]))), IndexError,
            "out of range: tried to access index -16 on a tensor of 15 elements."),
    "nll_loss": (lambda x, T: F.nll_loss(x, T(torch.tensor([0, 1, 2, 3, 9]))), IndexError,
                 "Target 3 is out of bounds."),
    "cross_entropy": (lambda x, T: F.cross_entropy(x, T(torch.tensor([0, -3, 2, 1, 0]))), IndexError,
                      "Target -3 is out of bounds."),
    "nll_loss2d": (lambda x, T: F.nll_loss(x.reshape(1, 3, 5, 1), T(torch.tensor([[[0], [1], [2], [5], [0]]]))),
                   IndexError, "Target 5 is out of bounds."),
    "masked_scatter": (lambda x, T: x.masked_scatter(T(x > 3), T(torch.ones(4))), RuntimeError,
                       "Number of elements of source < number of ones in mask"),
    "masked_scatter_empty_source": (lambda x, T: x.masked_scatter(T(x == 3), T(torch.ones(0))), RuntimeError,
                                    "Number of elements of source < number of ones in mask"),
    # integer division by zero (the CPU raises; XLA would give -1 or the dividend)
    "floor_divide_zero": (lambda x, T: T(torch.tensor([5, -7])) // T(torch.tensor([2, 0])), RuntimeError,
                          "ZeroDivisionError"),
    "floor_divide_zero_scalar": (lambda x, T: T(torch.tensor([5, -7])) // 0, RuntimeError, "ZeroDivisionError"),
    "remainder_zero": (lambda x, T: T(torch.tensor([5, -7])) % T(torch.tensor([0, 3])), RuntimeError,
                       "ZeroDivisionError"),
    "fmod_zero": (lambda x, T: torch.fmod(T(torch.tensor([5, -7], dtype=torch.int32)), 0), RuntimeError,
                  "ZeroDivisionError"),
    "div_trunc_zero": (lambda x, T: torch.div(T(torch.tensor([5])), T(torch.tensor([0])), rounding_mode="trunc"),
                       RuntimeError, "ZeroDivisionError"),
    # probabilities the CPU kernels refuse
    "multinomial_negative": (lambda x, T: torch.multinomial(T(torch.tensor([[0.5, -0.1, 0.6]])), 1), RuntimeError,
                             "probability tensor contains either `inf`, `nan` or element < 0"),
    "multinomial_inf": (lambda x, T: torch.multinomial(T(torch.tensor([[0.5, float("inf")]])), 1), RuntimeError,
                        "probability tensor contains either `inf`, `nan` or element < 0"),
    "multinomial_zero_row": (lambda x, T: torch.multinomial(T(torch.tensor([[0.2, 0.1], [0.0, 0.0]])), 1),
                             RuntimeError, "invalid multinomial distribution (sum of probabilities <= 0)"),
    "bernoulli_p": (lambda x, T: torch.bernoulli(T(torch.tensor([0.5, 1.5]))), RuntimeError,
                    "Expected p_in >= 0 && p_in <= 1 to be true, but got false."),
    "binary_cross_entropy": (lambda x, T: F.binary_cross_entropy(T(torch.tensor([0.5, 1.5])), T(torch.ones(2))),
                             RuntimeError, "all elements of input should be between 0 and 1"),
    "normal_negative_std": (lambda x, T: torch.normal(T(torch.zeros(2)), T(torch.tensor([1.0, -1.0]))), RuntimeError,
                            "normal expects all elements of std >= 0.0"),
    "searchsorted_sorter": (lambda x, T: torch.searchsorted(T(torch.tensor([1.0, 2.0])), T(torch.tensor([1.5])),
                                                            sorter=T(torch.tensor([0, 5]))),
                            RuntimeError, "torch.searchsorted(): sorter index out of range"),
    "embedding_bag_offsets": (lambda x, T: F.embedding_bag(T(torch.tensor([0, 1])), x, T(torch.tensor([1, 0]))),
                              RuntimeError, "offsets[0] has to be 0, i.e., the first sequence in the mini-batch has "
                                            "to start from position 0. However, got 1"),
    "max_unpool2d": (lambda x, T: F.max_unpool2d(T(torch.ones(2, 1, 2, 2)),
                                                 T(torch.tensor([[[[0, 1], [2, 3]]], [[[0, 1], [2, -1]]]])), 2),
                     RuntimeError, "Found an invalid max index: -1 (output volumes are of size 4x4)"),
    # ours name the value but not its position, and come from the ops these decompose into
    "embedding_bag": (lambda x, T: F.embedding_bag(T(I), x, T(torch.tensor([0]))), RuntimeError, None),
    "one_hot": (lambda x, T: F.one_hot(T(torch.tensor([5])), 3), RuntimeError, None),
}


def _tpu(t):
    # A copy made on the device: its values are not known on the host, so
    # the check is the program's (uploaded indices of advanced indexing are
    # checked at the op: tests/test_indexing_semantics.py).
    return t.to("tpu").clone()


def _cpu_error(fn):
    with pytest.raises(Exception) as ei:
        fn(X.clone(), lambda t: t)
    return ei.value


@pytest.mark.parametrize("name", sorted(CASES))
def test_out_of_range_raises_at_the_next_read(name):
    fn, exc, msg = CASES[name]
    cpu = _cpu_error(fn)
    assert isinstance(cpu, exc), (name, cpu)
    x = X.to("tpu")
    r = fn(x, _tpu)  # asynchronous: the op itself returns
    with pytest.raises(exc) as ei:
        r.cpu()
    text = str(ei.value)
    if msg is not None:
        assert msg in text, text
        assert msg in str(cpu)
    assert "TORCH_PJRT_LAUNCH_BLOCKING=1" in text and "ran asynchronously" in text, text
    # reported once: the device keeps working
    assert torch.equal(x.cpu(), X)
    torch.tpu.synchronize()


def test_in_range_and_ignored_indices_do_not_raise():
    x = X.to("tpu")
    t = torch.tensor([0, -100, 2, 1, -100])
    expected = F.nll_loss(X, t)
    got = F.nll_loss(x, t.to("tpu"))
    torch.testing.assert_close(got.cpu(), expected)
    idx = torch.tensor([-5, 4, -1])
    torch.testing.assert_close(x[idx.to("tpu")].cpu(), X[idx])
    torch.testing.assert_close(x.take(torch.tensor([-15, 14]).to("tpu")).cpu(), X.take(torch.tensor([-15, 14])))
    torch.tpu.synchronize()


def test_synchronize_raises():
    x = X.to("tpu")
    x.index_select(0, _computed(I))
    with pytest.raises(IndexError, match="index out of range in self"):
        torch.tpu.synchronize()
    torch.tpu.synchronize()


def test_a_read_raises_once_the_check_is_done():
    """A read of another tensor raises too once the checking program has run
    (a read never waits for it: that would cost the host its lead)."""
    x = X.to("tpu")
    y = x * 2
    x.index_select(0, _computed(I))
    deadline = time.time() + 30
    with pytest.raises(IndexError, match="index out of range in self"):
        while time.time() < deadline:
            y.cpu()
            time.sleep(0.01)


def test_compiled_graph_checks_indices():
    f = torch.compile(lambda w, i: F.embedding(i, w).sum(), backend="tpu")
    w = X.to("tpu")
    assert f(w, torch.tensor([0, 4]).to("tpu")).item() == X[[0, 4]].sum().item()
    r = f(w, torch.tensor([0, 5]).to("tpu"))
    with pytest.raises(IndexError, match="index out of range in self"):
        r.item()


def test_compiled_graph_reports_its_first_failing_check():
    """A graph's checks are combined into one flag update: the first failing
    one in graph order reports, with its first offending index."""
    def f(x, i, j, k):
        return x[i].sum() + x[j].sum() + x[:, k].sum()

    cf = torch.compile(f, backend="tpu")
    x = X.to("tpu")

    def call(i, j, k):
        return cf(x, *(torch.tensor(v, device="tpu") for v in (i, j, k)))

    ok = ([0, 4], [1, 2, 0], [2, 0, 1])
    assert call(*ok).item() == f(X, *map(torch.tensor, ok)).item()
    for (i, j, k), msg in [(([0, 4], [1, 9, 8], [5, 0, 0]), "index 9 is out of bounds for dimension 0 with size 5"),
                           (([0, 4], [1, -6, 0], [0, 0, 0]), "index -6 is out of bounds for dimension 0 with size 5"),
                           (([0, 4], [1, 2, 0], [0, 3, 7]), "index 3 is out of bounds for dimension 1 with size 3"),
                           (([5, 0], [1, 0, 0], [-4, 0, 0]), "index 5 is out of bounds for dimension 0 with size 5")]:
        r = call(i, j, k)
        with pytest.raises(IndexError) as ei:
            r.item()
        assert msg in str(ei.value), (i, j, k, str(ei.value))
    torch.tpu.synchronize()


def test_many_checks_in_one_graph():
    """150 gathers in one graph (a loop unrolled, as in RAFT's correlation
    lookups), their checks combined in one flag update: the result, and the
    report of the one bad index among them, are right."""
    def f(x, idx):
        acc = x.new_zeros(idx.shape[0], x.shape[1])
        for k in range(150):
            acc = acc + x[idx + k]
        return acc

    cf = torch.compile(f, backend="tpu")
    w = torch.randn(200, 4)
    idx = torch.tensor([0, 3, 7, 49])
    torch.testing.assert_close(cf(w.to("tpu"), idx.to("tpu")).cpu(), f(w, idx))
    r = cf(w.to("tpu"), torch.tensor([0, 3, 7, 51], device="tpu"))  # idx + 149 = 200 first at k = 149
    with pytest.raises(IndexError, match="index 200 is out of bounds for dimension 0 with size 200"):
        r.cpu()


SCRIPT = r"""
import os, torch, torch_pjrt
x = torch.arange(15.0).reshape(5, 3).to("tpu")
if os.environ.get("SHIFT") == "1":  # other messages first: the ids of this process differ
    for n in (2, 3, 4, 6):
        torch.zeros(n, device="tpu").index_select(0, torch.tensor([0], device="tpu"))
y = x.gather(0, torch.tensor([[7, 0, 0]], device="tpu").add(0))  # computed there: a deferred check
print("op returned", flush=True)
try:
    y.cpu()
except RuntimeError as e:
    print("ERR", e)
"""


def _run(env_extra, cache_dir):
    env = dict(os.environ, TORCH_PJRT_CACHE_DIR=str(cache_dir), TF_CPP_MIN_LOG_LEVEL="2", **env_extra)
    r = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, cwd=ROOT,
                       timeout=300)
    return r


def test_launch_blocking_raises_at_the_op(tmp_path):
    r = _run({"TORCH_PJRT_LAUNCH_BLOCKING": "1"}, tmp_path)
    assert r.returncode != 0 and "op returned" not in r.stdout, r.stdout
    assert "index 7 is out of bounds for dimension 0 with size 5" in r.stderr, r.stderr[-2000:]


def test_programs_from_the_disk_cache_report_this_process_messages(tmp_path):
    first = _run({}, tmp_path)
    assert "ERR index 7 is out of bounds for dimension 0 with size 5" in first.stdout, first.stderr[-2000:]
    second = _run({"SHIFT": "1"}, tmp_path)
    assert "ERR index 7 is out of bounds for dimension 0 with size 5" in second.stdout, second.stderr[-2000:]
    assert "aten::gather" in second.stdout


def test_each_device_has_its_own_flag():
    x1 = X.to("tpu:1")
    r = x1.index_select(0, _computed(I, "tpu:1"))
    torch.tpu.synchronize(0)  # device 0 has nothing to report
    with pytest.raises(IndexError, match="found on tpu:1 by aten::index_select"):
        r.cpu()


# torch._assert_async: the CPU kernel raises when the one value is zero
# (NaN and any nonzero complex pass; -0.0 fails).  On tpu the value is checked
# on the device with the index checks' flag: the op returns at once and the
# next synchronize (or read) raises the CPU's error.
@pytest.mark.parametrize("value", [torch.tensor(0), torch.tensor(3), torch.tensor(0.0), torch.tensor(-0.0),
                                   torch.tensor(float("nan")), torch.tensor(False), torch.tensor([True]),
                                   torch.tensor(0j), torch.tensor(1j), torch.tensor([[0.0]], dtype=torch.bfloat16),
                                   torch.tensor(0.5, dtype=torch.float16)],
                         ids=lambda t: f"{t.dtype}-{t.tolist()}")
@pytest.mark.parametrize("msg", [None, "", "x must be {} positive {x}"])
def test_assert_async_matches_cpu(value, msg):
    args = () if msg is None else (msg,)
    try:
        torch._assert_async(value, *args)
        cpu = None
    except RuntimeError as e:
        cpu = str(e)
    torch._assert_async(value.to("tpu"), *args)  # asynchronous: returns at once
    if cpu is None:
        torch.tpu.synchronize()
        return
    with pytest.raises(RuntimeError) as ei:
        torch.tpu.synchronize()
    assert str(ei.value).startswith(cpu + " (found on tpu:0 by aten::_assert_async"), (str(ei.value), cpu)
    torch.tpu.synchronize()  # reported once


def test_assert_async_element_count_raises_at_once():
    for v in (torch.tensor([1, 2]), torch.tensor([])):
        with pytest.raises(RuntimeError) as cpu:
            torch._assert_async(v)
        with pytest.raises(RuntimeError, match=str(cpu.value)):
            torch._assert_async(v.to("tpu"), "m")


def test_assert_async_in_compiled_graph():
    def f(x):
        torch._assert_async((x > 0).all(), "x must be positive")
        return x * 2

    cf = torch.compile(f, backend="tpu")
    from util import all_graphs_lowered

    with all_graphs_lowered():
        assert torch.equal(cf(torch.ones(3, device="tpu")).cpu(), torch.full((3,), 2.0))
        r = cf(torch.tensor([1.0, -1.0], device="tpu"))
    with pytest.raises(RuntimeError, match="x must be positive"):
        r.cpu()
        torch.tpu.synchronize()


def test_masked_setitem_count_raises_at_the_op():
    """x[mask] = v where v fits one count only: the count is read and the
    CPU's error raised at the op (PyTorch's test_indexing expects it there)."""
    x = X.to("tpu").clone()
    mask = torch.tensor([True, False, True, False, False]).to("tpu")
    with pytest.raises(RuntimeError, match=r"value tensor of shape \[3, 3\] cannot be broadcast to indexing "
                                           r"result of shape \[2, 3\]"):
        x[mask] = torch.ones(3, 3).to("tpu")
    torch.tpu.synchronize()

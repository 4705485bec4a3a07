"""minGPT trains on "tpu" with the same losses as on CPU."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))

from mingpt import GPTConfig, train  # noqa: E402


def test_mingpt_losses_match_cpu():
    steps = 20
    tpu = train("tpu", steps, GPTConfig())
    cpu = train("cpu", steps, GPTConfig())
    assert len(tpu) == len(cpu) == steps
    for i, (a, b) in enumerate(zip(tpu, cpu)):
        assert abs(a - b) <= 1e-4 * abs(b), f"step {i}: tpu {a} vs cpu {b}"
    assert cpu[-1] < cpu[0]  # it learns

"""The op-conformance CI subset: OpInfos of tests/conformance/ci_ops.txt on "tpu".

Runs the harness of tests/conformance (each OpInfo in a worker subprocess, so
a crashing op cannot take pytest down) and compares every (op, dtype) node
with tests/conformance/expected.json: a node expected to pass that does not
is a failure; nodes that pass now but were not expected to are printed, so
that expected.json can be regenerated:

    python -m tests.conformance --ci --update-expected

CONFORMANCE_WORKERS (default 2) sets the number of worker processes.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from tests.conformance import cli  # noqa: E402

WORKERS = int(os.environ.get("CONFORMANCE_WORKERS", "2"))


def test_conformance_subset(capsys):
    ops = cli.read_ops_file(cli.CI_OPS)
    report = cli.run_conformance(ops, workers=WORKERS, timeout=300, progress=lambda s: None)
    regress, new_pass, other = cli.check_expected(report)
    with capsys.disabled():
        print(f"\nconformance subset: {report['summary']} ({report['meta']['wall_seconds']:.0f} s, "
              f"{len(ops)} OpInfos)")
        if new_pass or other:
            print("Not failures; update tests/conformance/expected.json with "
                  "`python -m tests.conformance --ci --update-expected`:")
            for line in new_pass:
                print("  new pass: " + line)
            for line in other:
                print("  changed:  " + line)
    assert not regress, "conformance regressions (expected pass):\n" + "\n".join(regress)


def test_worker_crash_and_hang_are_isolated(monkeypatch):
    """A node that kills or hangs its worker is a crash; the rest still run."""
    monkeypatch.setenv("CONFORMANCE_INJECT", "abs:float32:segv,neg:int32:hang")
    report = cli.run_conformance(["abs", "neg"], dtypes=["float32", "int32"], grad=False, workers=1,
                                 timeout=15, progress=lambda s: None)
    res = report["results"]
    assert res["abs"]["float32"]["status"] == "crash"
    assert "SIGSEGV" in res["abs"]["float32"]["message"]
    assert res["neg"]["int32"]["status"] == "crash"
    assert "timed out" in res["neg"]["int32"]["message"]
    assert res["abs"]["int32"]["status"] == "pass"
    assert res["neg"]["float32"]["status"] == "pass"
    assert report["totals"]["all"]["crash"] == 2

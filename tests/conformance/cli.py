"""Command line and API of the conformance harness (see __init__.py)."""
import argparse
import datetime
import json
import os
import subprocess
import sys
import time

from . import report as rep
from . import runner
from .harness import ALL_DTYPES, DTYPES

HERE = os.path.dirname(os.path.abspath(__file__))
CI_OPS = os.path.join(HERE, "ci_ops.txt")
EXPECTED = os.path.join(HERE, "expected.json")


def read_ops_file(path):
    keys = []
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                keys.append(line)
    return keys


def select(ops=None, dtypes=None):
    """[(key, [dtype names])] in op_db's order, and the set of autograd keys."""
    from .harness import node_dtypes, op_db

    db = op_db()
    dtypes = list(dtypes or DTYPES)
    if ops is not None:
        unknown = [k for k in ops if k not in db]
        if unknown:
            raise SystemExit(f"unknown OpInfo(s): {', '.join(unknown)} (names are OpInfo name[.variant_test_name])")
        wanted = set(ops)
        keys = [k for k in db if k in wanted]
    else:
        keys = list(db)
    tasks = [(k, node_dtypes(db[k], dtypes)) for k in keys]
    autograd = {k for k in keys if db[k].supports_autograd}
    return tasks, autograd


def _git_commit():
    if os.environ.get("CONFORMANCE_COMMIT"):  # a run from an exported snapshot of a commit
        return os.environ["CONFORMANCE_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=runner.ROOT, capture_output=True,
                              text=True, timeout=10).stdout.strip() or "?"
    except Exception:
        return "?"


def _plugin():
    p = os.environ.get("TORCH_PJRT_PLUGIN")
    return os.path.basename(p) if p else "XLA CPU (xla-cpu-pjrt)"


def run_conformance(ops=None, dtypes=None, grad=True, workers=1, timeout=600.0, progress=None,
                    previous=None, checkpoint=None, max_tasks_per_worker=40, keep_logs=None, max_samples=None,
                    compiled=False):
    """Run the harness and return the report dict (meta, summary, totals,
    results).  `previous`: results of an earlier report to reuse (resume).
    `checkpoint(report)` is called now and then with a partial report."""
    import torch

    dtypes = list(dtypes or DTYPES)
    tasks, autograd = select(ops, dtypes)
    results = {}
    if previous:
        for key, dts in tasks:
            old = previous.get(key, {})
            keep = {dt: r for dt, r in old.items() if dt in dts and r.get("status") != "crash"
                    and (not grad or dt != "float32" or key not in autograd or "grad" in r
                         or r["status"] == "skipped")}
            if keep:
                results[key] = keep
        tasks = [(k, [d for d in dts if d not in results.get(k, {})]) for k, dts in tasks]
        tasks = [(k, dts) for k, dts in tasks if dts]
    t0 = time.time()
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "torch": torch.__version__,
        "commit": _git_commit(),
        "plugin": _plugin(),
        "python": sys.version.split()[0],
        "dtypes": dtypes,
        "grad": grad,
        "workers": workers,
        "timeout": timeout,
        "opinfos": len(select(ops, dtypes)[0]),
        "max_samples": max_samples,
        "compiled": compiled,
    }
    last = [time.time()]

    def make(partial):
        order = [k for k, _ in select(ops, dtypes)[0]]
        res = {k: {dt: results[k][dt] for dt in dtypes if dt in results.get(k, {})} for k in order if k in results}
        tot = rep.totals(res, dtypes, autograd)
        m = dict(meta, wall_seconds=round(time.time() - t0, 1), partial=partial,
                 autograd_ops=sorted(k for k in autograd if k in res))
        return {"meta": m, "summary": rep.summary_line(tot), "totals": tot, "results": res}

    def on_result(key, dtype, rec):
        results.setdefault(key, {})[dtype] = rec
        if checkpoint and time.time() - last[0] > 60:
            last[0] = time.time()
            checkpoint(make(True))

    runner.run(tasks, grad=grad, workers=workers, timeout=timeout, progress=progress, on_result=on_result,
               max_tasks_per_worker=max_tasks_per_worker, keep_logs=keep_logs,
               extra_env={"CONFORMANCE_MAX_SAMPLES": str(max_samples or 0),
                          "CONFORMANCE_COMPILED": "1" if compiled else "0"})
    return make(False)


def command_line(args):
    parts = ["python -m tests.conformance"]
    if args.ci:
        parts.append("--ci")
    if args.ops:
        parts.append(f"--ops {args.ops}")
    if args.ops_file:
        parts.append(f"--ops-file {args.ops_file}")
    if args.dtypes:
        parts.append(f"--dtypes {args.dtypes}")
    if not args.grad:
        parts.append("--no-grad")
    if args.compiled:
        parts.append("--compiled")
    parts.append(f"--workers {args.workers}")
    if args.json:
        parts.append(f"--json {args.json}")
    if args.markdown:
        parts.append(f"--markdown {args.markdown}")
    return " ".join(parts)


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m tests.conformance",
        description="Run PyTorch's OpInfo database on the tpu device and compare with the CPU.")
    p.add_argument("--json", help="write the per-(op, dtype) report here")
    p.add_argument("--markdown", help="write the Markdown summary here (e.g. docs/conformance.md)")
    p.add_argument("--ops", help="comma-separated OpInfo names (name or name.variant_test_name)")
    p.add_argument("--ops-file", help="a file of OpInfo names, one a line")
    p.add_argument("--ci", action="store_true", help="the CI subset (tests/conformance/ci_ops.txt)")
    p.add_argument("--dtypes", help=f"comma-separated, from {','.join(ALL_DTYPES)} (default: {','.join(DTYPES)})")
    p.add_argument("--grad", dest="grad", action="store_true", default=True, help="compare float32 gradients (default)")
    p.add_argument("--no-grad", dest="grad", action="store_false")
    p.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per (op, dtype) node before it is a crash")
    p.add_argument("--max-samples", type=int, default=0, help="at most this many samples per node (0: all)")
    p.add_argument("--compiled", action="store_true",
                   help="run the tpu side through torch.compile(backend='tpu'), one graph per sample")
    p.add_argument("--max-tasks-per-worker", type=int, default=40, help="replace a worker after this many OpInfos")
    p.add_argument("--resume", action="store_true", help="reuse the non-crash results already in --json")
    p.add_argument("--logs", help="keep the workers' stderr logs in this directory")
    p.add_argument("--update-expected", action="store_true",
                   help="write the statuses of this run to tests/conformance/expected.json (with --ci)")
    p.add_argument("--check-expected", action="store_true",
                   help="exit 1 if a node expected to pass in expected.json does not (with --ci)")
    p.add_argument("--render", action="store_true",
                   help="run nothing: write --markdown from the report already in --json")
    p.add_argument("-q", "--quiet", action="store_true", help="no per-op progress lines")
    args = p.parse_args(argv)
    if args.compiled and (args.update_expected or args.check_expected):
        raise SystemExit("expected.json holds eager-mode statuses: --update-expected/--check-expected take no --compiled")

    if args.render:
        if not (args.json and args.markdown):
            raise SystemExit("--render needs --json (input) and --markdown (output)")
        with open(args.json) as f:
            report = json.load(f)
        with open(args.markdown, "w") as f:
            f.write(rep.markdown(report, report["meta"].get("command", "python -m tests.conformance")))
        print(report["summary"])
        return 0

    ops = None
    if args.ci:
        ops = read_ops_file(CI_OPS)
    if args.ops_file:
        ops = (ops or []) + read_ops_file(args.ops_file)
    if args.ops:
        ops = (ops or []) + [s.strip() for s in args.ops.split(",") if s.strip()]
    dtypes = None
    if args.dtypes:
        dtypes = [s.strip() for s in args.dtypes.split(",") if s.strip()]
        bad = [d for d in dtypes if d not in ALL_DTYPES]
        if bad:
            raise SystemExit(f"unknown dtype(s) {bad}; choose from {list(ALL_DTYPES)}")

    previous = None
    previous_meta = {}
    if args.resume and args.json and os.path.exists(args.json):
        with open(args.json) as f:
            prev = json.load(f)
        previous = prev.get("results")
        previous_meta = prev.get("meta", {})

    def checkpoint(report):
        if args.json:
            tmp = args.json + ".tmp"
            rep.write_json(tmp, report)
            os.replace(tmp, args.json)

    progress = (lambda s: None) if args.quiet else (lambda s: print(s, file=sys.stderr, flush=True))
    report = run_conformance(ops, dtypes, grad=args.grad, workers=args.workers, timeout=args.timeout,
                             progress=progress, previous=previous, checkpoint=checkpoint,
                             max_tasks_per_worker=args.max_tasks_per_worker, keep_logs=args.logs,
                             max_samples=args.max_samples or None, compiled=args.compiled)
    report["meta"]["command"] = command_line(args)
    if previous:  # a resumed run: report the time of both
        report["meta"]["wall_seconds"] = round(report["meta"]["wall_seconds"]
                                               + previous_meta.get("wall_seconds", 0), 1)
        report["meta"]["resumed"] = previous_meta.get("resumed", 0) + 1
    if args.json:
        checkpoint(report)
    if args.markdown:
        os.makedirs(os.path.dirname(os.path.abspath(args.markdown)), exist_ok=True)
        with open(args.markdown, "w") as f:
            f.write(rep.markdown(report, report["meta"]["command"]))

    tot = report["totals"]
    print(report["summary"] + f" ({report['meta']['wall_seconds']:.0f} s)")
    for dt, c in tot["by_dtype"].items():
        print(f"  {dt:9s} " + "  ".join(f"{s} {c[s]}" for s in rep.ALL_STATUSES) + f"  pass rate {rep._pct(c['pass_rate'])}")
    g = tot["grad"]
    print(f"  grad      " + "  ".join(f"{s} {g[s]}" for s in rep.ALL_STATUSES) + f"  pass rate {rep._pct(g['pass_rate'])}")

    rc = 0
    if args.update_expected or args.check_expected:
        if args.update_expected:
            write_expected(report)
            print(f"wrote {EXPECTED}")
        else:
            regress, new_pass, other = check_expected(report)
            for line in regress:
                print("REGRESSION " + line)
            for line in new_pass:
                print("new pass   " + line)
            for line in other:
                print("changed    " + line)
            rc = 1 if regress else 0
    return rc


def write_expected(report):
    data = {
        "_comment": "Expected status of each (OpInfo, dtype) node of tests/conformance/ci_ops.txt; "
                    "'float32:grad' is the float32 gradient check. Regenerate with "
                    "`python -m tests.conformance --ci --update-expected`.",
        "torch": report["meta"]["torch"],
        "commit": report["meta"]["commit"],
        "ops": rep.expected_from(report["results"]),
    }
    with open(EXPECTED, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.write("\n")


def load_expected():
    with open(EXPECTED) as f:
        return json.load(f)["ops"]


def check_expected(report):
    return rep.compare_expected(report["results"], load_expected())

"""A conformance worker: runs the OpInfos the parent (runner.py) sends.

Protocol, one JSON object per line.  The parent writes tasks on our stdin:
``{"key": "add", "dtypes": ["float32", ...], "grad": true}`` or
``{"quit": true}``.  We answer on a private copy of the original stdout
(fd 1 itself is pointed at stderr, so that whatever an op or a library
prints cannot corrupt the protocol):

    {"event": "hello", "pid": ..., "torch": ...}
    {"event": "start", "key": ..., "dtype": ...}        before each node
    {"event": "result", "key": ..., "dtype": ..., "record": {...}}
    {"event": "done", "key": ...}

A node that kills or hangs this process is noticed by the parent (EOF, or
no message within its timeout), which records it as a crash.
"""
import faulthandler
import json
import os
import signal
import sys
import warnings


def _inject(key, dtype):
    """Testing the harness: CONFORMANCE_INJECT="key:dtype:segv,key2:dtype:hang"
    makes this worker die or hang on those nodes."""
    spec = os.environ.get("CONFORMANCE_INJECT")
    if not spec:
        return
    for item in spec.split(","):
        k, d, what = item.rsplit(":", 2)
        if k == key and d == dtype:
            if what == "segv":
                import ctypes

                ctypes.string_at(0)
            elif what == "abort":
                os.abort()
            elif what == "exit":
                os._exit(3)
            elif what == "hang":
                import time

                time.sleep(10**6)


def main():
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    faulthandler.enable()
    # The parent sends SIGUSR1 before killing a worker that timed out: the
    # Python stack of the hung node lands in our stderr, then in the report.
    faulthandler.register(signal.SIGUSR1, all_threads=False)
    warnings.simplefilter("ignore")
    os.environ.pop("TORCH_PJRT_CPU_FALLBACK", None)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    import torch
    import torch_pjrt

    torch_pjrt.set_cpu_fallback(False)
    torch.set_num_threads(int(os.environ.get("CONFORMANCE_THREADS", "1")))

    from tests.conformance import harness

    db = harness.op_db()
    max_samples = int(os.environ.get("CONFORMANCE_MAX_SAMPLES", "0")) or None

    def send(obj):
        proto.write(json.dumps(obj) + "\n")
        proto.flush()

    send({"event": "hello", "pid": os.getpid(), "torch": torch.__version__})
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        task = json.loads(line)
        if task.get("quit"):
            break
        key = task["key"]
        op = db[key]
        for dt in task["dtypes"]:
            send({"event": "start", "key": key, "dtype": dt})
            print(f"[worker {os.getpid()}] {key} {dt}", file=sys.stderr, flush=True)
            _inject(key, dt)
            rec = harness.run_node(op, dt, grad=task.get("grad", True), max_samples=max_samples)
            send({"event": "result", "key": key, "dtype": dt, "record": rec})
        send({"event": "done", "key": key})


if __name__ == "__main__":
    main()

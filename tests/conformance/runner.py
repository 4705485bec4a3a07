"""Run OpInfos in a pool of worker processes; a crash or hang costs one node.

The parent never imports torch_pjrt and never runs an op on "tpu": each
worker (worker.py) is a fresh ``python -m tests.conformance.worker`` that
takes one OpInfo at a time from the parent and streams back one record per
dtype.  The parent gives each (op, dtype) node `timeout` seconds: a worker
that exits, is killed by a signal, or stays silent past its node's deadline
is killed (by its process id), the node it was running is recorded as
"crash" with the exit status and the end of the worker's stderr, the
OpInfo's remaining dtypes go back to the front of the queue, and a fresh
worker takes the slot.  Workers are also replaced every
`max_tasks_per_worker` OpInfos to bound their memory.
"""
import collections
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

STARTUP_TIMEOUT = 240


def _signal_name(rc):
    if rc is not None and rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exited with status {rc}"


def _stderr_tail(path, marker=None, limit=500):
    """The informative end of a worker's stderr: lines after the last node
    marker, preferring fatal-error lines and the innermost Python frames."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = text.splitlines()
    if marker:
        for i in range(len(lines) - 1, -1, -1):
            if lines[i].startswith(marker):
                lines = lines[i + 1:]
                break
    lines = [ln.strip() for ln in lines if ln.strip()]
    keys = ("Fatal Python error", "Check failed", "terminate called", "Aborted", "Segmentation",
            "error", "Error", "what():", "F0", "E0")
    picked = [ln for ln in lines if any(k in ln for k in keys)][:3]
    frames = [ln for ln in lines if ln.startswith("File ")]
    if frames:
        picked.append("at " + frames[0])
    if not picked:
        picked = lines[-3:]
    s = " | ".join(picked)
    return s if len(s) <= limit else s[: limit - 3] + "..."


# A worker is replaced once it holds this many memory mappings or this much
# memory: every compiled program stays mapped (the program cache keeps its
# executables), and past vm.max_map_count (65530 by default) LLVM fails to
# allocate and the process dies.
MAX_MAPS = int(os.environ.get("CONFORMANCE_MAX_MAPS", "30000"))
MAX_RSS_KB = 6 << 20


def _worn_out(pid):
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            maps = sum(1 for _ in f)
        rss = 0
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
    except (OSError, ValueError):
        return None
    if maps > MAX_MAPS:
        return f"{maps} memory mappings"
    if rss > MAX_RSS_KB:
        return f"{rss >> 10} MiB resident"
    return None


class _Worker:
    _serial = 0

    def __init__(self, env, logdir, events):
        _Worker._serial += 1
        self.serial = _Worker._serial
        self.log = os.path.join(logdir, f"worker-{self.serial}.log")
        self._logf = open(self.log, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.conformance.worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._logf,
            cwd=ROOT, env=env, text=True, bufsize=1,
        )
        self.ready = False
        self.dead = False
        self.kill_reason = None
        self.task = None          # (key, [dtypes not yet reported])
        self.current = None       # dtype running now
        self.node_started = None
        self.deadline = time.time() + STARTUP_TIMEOUT
        self.tasks_done = 0
        self.nodes_done = 0
        self.max_tasks = 1 << 30
        self.retiring = False
        t = threading.Thread(target=self._read, args=(events,), daemon=True)
        t.start()

    def _read(self, events):
        try:
            for line in self.proc.stdout:
                line = line.strip()
                if not line:
                    continue
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                events.put((self, msg))
        except Exception:
            pass
        events.put((self, None))

    def send(self, obj):
        try:
            self.proc.stdin.write(json.dumps(obj) + "\n")
            self.proc.stdin.flush()
            return True
        except (BrokenPipeError, OSError):
            return False

    def kill(self, reason):
        if self.kill_reason is None:
            self.kill_reason = reason
        try:
            self.proc.kill()
        except OSError:
            pass

    def close(self):
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._logf.close()


def worker_env(cache_dir):
    env = dict(os.environ)
    env.pop("TORCH_PJRT_CPU_FALLBACK", None)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["TORCH_PJRT_CACHE_DIR"] = cache_dir
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run(tasks, grad=True, workers=1, timeout=600.0, max_tasks_per_worker=40, progress=None,
        on_result=None, keep_logs=None, extra_env=None):
    """Run `tasks`, a list of (key, [dtype names]), and return
    {key: {dtype: record}}.  `progress(text)` gets one line per OpInfo and
    per crash; `on_result(key, dtype, record)` is called for every node."""
    progress = progress or (lambda s: print(s, file=sys.stderr, flush=True))
    results = collections.defaultdict(dict)
    pending = collections.deque((k, list(d)) for k, d in tasks if d)
    total_ops = len(pending)
    done_ops = 0
    op_started = {}

    own_cache = None
    cache_dir = os.environ.get("TORCH_PJRT_CACHE_DIR")
    if not cache_dir or cache_dir.strip() in ("0", "off", "false"):
        own_cache = cache_dir = tempfile.mkdtemp(prefix="conformance_cache_")
    logdir = keep_logs or tempfile.mkdtemp(prefix="conformance_logs_")
    os.makedirs(logdir, exist_ok=True)
    env = worker_env(cache_dir)
    env.update(extra_env or {})
    events = queue.Queue()
    pool = []
    failed_starts = 0
    earlier_crash = {}

    def record(key, dtype, rec):
        results[key][dtype] = rec
        if on_result:
            on_result(key, dtype, rec)

    def spawn():
        w = _Worker(env, logdir, events)
        pool.append(w)
        return w

    def finish_op(key):
        nonlocal done_ops
        done_ops += 1
        recs = results.get(key, {})
        summary = ", ".join(f"{dt} {r['status']}" + (f"/grad {r['grad']['status']}" if "grad" in r else "")
                            for dt, r in recs.items())
        took = time.time() - op_started.get(key, time.time())
        progress(f"[{done_ops}/{total_ops}] {key}: {summary} ({took:.1f}s)")

    try:
        for _ in range(max(1, min(workers, len(pending)))):
            spawn()
        while True:
            busy = [w for w in pool if not w.dead and w.task is not None]
            if not pending and not busy:
                break
            # Hand out work.
            for w in pool:
                if w.dead or not w.ready or w.task is not None or w.retiring or not pending:
                    continue
                key, dts = pending.popleft()
                op_started.setdefault(key, time.time())
                w.task = (key, dts)
                w.current = None
                w.deadline = time.time() + timeout
                if not w.send({"key": key, "dtypes": dts, "grad": grad}):
                    w.kill("could not send a task")
            try:
                w, msg = events.get(timeout=0.5)
            except queue.Empty:
                w, msg = None, None
            now = time.time()
            if w is not None and not w.dead:
                if msg is None:  # the worker's output ended: it exited or was killed
                    w.dead = True
                    try:
                        rc = w.proc.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        w.proc.kill()
                        rc = w.proc.wait()
                    w.close()
                    pool.remove(w)
                    if not w.ready and not w.retiring:
                        failed_starts += 1
                        if failed_starts >= 3:
                            raise RuntimeError(
                                f"conformance workers fail to start ({_signal_name(rc)}): "
                                f"{_stderr_tail(w.log, limit=2000)}")
                    if w.task is not None:
                        key, dts = w.task
                        victim = w.current or (dts[0] if dts else None)
                        if victim is not None:
                            why = w.kill_reason or f"worker {_signal_name(rc)}"
                            tail = _stderr_tail(w.log, marker=f"[worker {w.proc.pid}] {key} {victim}")
                            took = round(now - (w.node_started or now), 2)
                            message = f"{why}" + (f": {tail}" if tail else "")
                            rest = [d for d in dts if d != victim]
                            if w.nodes_done > 0 and w.kill_reason is None and (key, victim) not in earlier_crash:
                                # The worker had run other nodes: its state (memory, maps,
                                # caches) may be to blame.  Once more in a fresh worker.
                                earlier_crash[(key, victim)] = message
                                progress(f"    worker died on {key} {victim} ({why}) after "
                                         f"{w.nodes_done} nodes: retrying in a fresh worker")
                                pending.appendleft((key, [victim] + rest))
                            else:
                                rec = {"status": "crash", "message": message, "seconds": took}
                                if (key, victim) in earlier_crash:
                                    rec["message"] += " (also in a fresh worker)"
                                record(key, victim, rec)
                                progress(f"    crash: {key} {victim}: {why}")
                                if rest:
                                    pending.appendleft((key, rest))
                                else:
                                    finish_op(key)
                        else:
                            finish_op(key)
                    if pending or any(x.task is not None for x in pool):
                        if len([x for x in pool if not x.dead]) < workers:
                            spawn()
                elif msg["event"] == "hello":
                    w.ready = True
                    failed_starts = 0
                    w.deadline = None
                elif msg["event"] == "start":
                    w.current = msg["dtype"]
                    w.node_started = now
                    w.deadline = now + timeout
                elif msg["event"] == "result":
                    key, dt = msg["key"], msg["dtype"]
                    rec = msg["record"]
                    if (key, dt) in earlier_crash:
                        rec["earlier_crash"] = earlier_crash[(key, dt)]
                    record(key, dt, rec)
                    w.nodes_done += 1
                    if w.task is not None:
                        w.task = (w.task[0], [d for d in w.task[1] if d != dt])
                    w.current = None
                    w.deadline = now + timeout
                    worn = _worn_out(w.proc.pid)
                    if worn and w.task is not None and w.task[1]:
                        # Replace the worker before its next node; the OpInfo's
                        # other dtypes go to the fresh one.
                        progress(f"    replacing worker {w.proc.pid} ({worn})")
                        pending.appendleft(w.task)
                        w.task = None
                        w.retiring = True
                        w.kill("retired")
                        spawn()
                    elif worn:
                        w.max_tasks = 0  # retire at the end of this OpInfo
                elif msg["event"] == "done":
                    finish_op(msg["key"])
                    w.task = None
                    w.current = None
                    w.deadline = None
                    w.tasks_done += 1
                    if w.tasks_done >= min(max_tasks_per_worker, w.max_tasks) and pending:
                        w.retiring = True
                        w.send({"quit": True})
                        spawn()
            # Deadlines.
            for x in pool:
                if not x.dead and x.deadline is not None and now > x.deadline and x.kill_reason is None:
                    if x.ready:
                        try:  # dump the hung worker's Python stack into its log first
                            x.proc.send_signal(signal.SIGUSR1)
                            time.sleep(1.0)
                        except OSError:
                            pass
                        x.kill(f"timed out after {timeout:.0f}s")
                    else:
                        x.kill(f"worker did not start within {STARTUP_TIMEOUT}s")
    finally:
        for w in pool:
            if not w.dead:
                w.send({"quit": True})
        for w in pool:
            if not w.dead:
                try:
                    w.proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    w.proc.kill()
                w.close()
        if own_cache:
            shutil.rmtree(own_cache, ignore_errors=True)
        if not keep_logs:
            shutil.rmtree(logdir, ignore_errors=True)
    return {k: dict(v) for k, v in results.items()}

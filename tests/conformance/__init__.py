"""Op conformance: PyTorch's OpInfo database run on the "tpu" device.

    python -m tests.conformance --json report.json --markdown docs/conformance.md
    python -m tests.conformance --ci --check-expected      # the CI subset

For each OpInfo of ``torch.testing._internal.common_methods_invocations.op_db``
and each dtype among float32, bfloat16, float16, int64, int32 and bool that it
supports on CPU, the samples of ``op.sample_inputs`` run on the CPU and on
"tpu" (through torch_pjrt, CPU fallback off) and the results are compared;
float32 gradients too.  Every (op, dtype) node ends as pass, unsupported,
mismatch, error or crash (or skipped, for random outputs; not counted).

Modules: harness.py (one node, inside a worker: imports torch_pjrt),
worker.py (the worker process), runner.py (the pool of workers, timeouts and
crash recovery), report.py (totals, JSON, Markdown, expected statuses),
cli.py (the command line).
"""

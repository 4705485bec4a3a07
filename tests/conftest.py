import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TORCH_PJRT_CPU_DEVICES", "2")
# A fresh persistent cache per test process: tests compile for real and do
# not depend on (or fill) the user's cache.  pytest-xdist workers inherit the
# controller's environment, so a directory made here (marked by
# _TORCH_PJRT_TEST_CACHE) is replaced by one of each worker's own: a test that
# counts disk hits must not see another worker's entries.
import tempfile  # noqa: E402

if "TORCH_PJRT_CACHE_DIR" not in os.environ or "_TORCH_PJRT_TEST_CACHE" in os.environ:
    import atexit
    import shutil

    _cache = tempfile.mkdtemp(prefix="torch_pjrt_test_cache_")
    os.environ["TORCH_PJRT_CACHE_DIR"] = _cache
    os.environ["_TORCH_PJRT_TEST_CACHE"] = "1"
    atexit.register(shutil.rmtree, _cache, True)

import torch  # noqa: E402
import torch_pjrt  # noqa: E402,F401

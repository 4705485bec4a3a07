import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TORCH_PJRT_CPU_DEVICES", "2")
# A fresh persistent cache per test session: tests compile for real and do
# not depend on (or fill) the user's cache.
import tempfile  # noqa: E402

if "TORCH_PJRT_CACHE_DIR" not in os.environ:
    import atexit
    import shutil

    _cache = tempfile.mkdtemp(prefix="torch_pjrt_test_cache_")
    os.environ["TORCH_PJRT_CACHE_DIR"] = _cache
    atexit.register(shutil.rmtree, _cache, True)

import torch  # noqa: E402
import torch_pjrt  # noqa: E402,F401

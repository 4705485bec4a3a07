import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TORCH_PJRT_CPU_DEVICES", "2")
# A fresh persistent cache per test session: tests compile for real and do
# not depend on (or fill) the user's cache.
import tempfile  # noqa: E402

os.environ.setdefault("TORCH_PJRT_CACHE_DIR", tempfile.mkdtemp(prefix="torch_pjrt_test_cache_"))

import torch  # noqa: E402
import torch_pjrt  # noqa: E402,F401

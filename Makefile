# torch-pjrt build.  Two entry points for users:
#   make demo   set up .venv, build, train minGPT on "tpu" and compare with CPU
#   make test   set up .venv, build, run the C unit tests (ASan+UBSan) and pytest
PY      ?= python3
VENV    := .venv
VPY     := $(VENV)/bin/python
STAMP   := $(VENV)/.installed-v4
PKG     := torch_pjrt
BUILD   := build

# Headers come from the installed wheels; nothing foreign is committed.
PJRT_INC  = $(shell $(VPY) -c "import os, xla_plugins.xla_cpu_pjrt as m; print(os.path.join(os.path.dirname(m.__file__), 'include'))")

CC      ?= gcc
CWARN   := -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE
CORE_SRC := $(sort $(wildcard csrc/core/*.c))
CORE_HDR := $(wildcard csrc/core/*.h)
CTEST_SRC := $(sort $(wildcard tests/c/test_*.c))
SAN     := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined

.PHONY: all setup build demo test ctest pytest bench clean
all: build

setup: $(STAMP)
# The package's own build (pyproject.toml, setup.py) as an editable install:
# PyTorch's autoload and torch.compile's backend entry points come from it.
# (Older checkouts made a hand-written dist-info and .pth: removed first.)
# vLLM (tests/test_vllm.py) is built for no device by tools/install_vllm.sh.
$(STAMP): requirements.txt pyproject.toml setup.py tools/install_vllm.sh
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip >/dev/null 2>&1 || true
	$(VPY) -m pip install -q -r requirements.txt
	tools/install_vllm.sh $(VPY)
	rm -rf $(VENV)/lib/python*/site-packages/torch_pjrt-0.1.0.dist-info $(VENV)/lib/python*/site-packages/torch_pjrt_dev.pth
	$(VPY) -m pip install -q --no-build-isolation --no-deps -e .
	touch $@

# The same build again, in place: recompiles what changed (setup.py).
build: $(STAMP)
	$(VPY) setup.py -q build_ext --inplace

# C unit tests: the core compiled again with AddressSanitizer and UBSan,
# run against the real XLA CPU plugin.
$(BUILD)/ctest_%: tests/c/test_%.c tests/c/ctest.h $(CORE_SRC) $(CORE_HDR) $(STAMP)
	@mkdir -p $(BUILD)
	$(CC) $(CWARN) -O1 -g $(SAN) -Icsrc/core -Itests/c -I$(PJRT_INC) -o $@ $< $(CORE_SRC) -ldl -lpthread -lm

ctest: $(patsubst tests/c/test_%.c,$(BUILD)/ctest_%,$(CTEST_SRC))
	@set -e; for t in $^; do \
	  echo "== $$t"; \
	  TP_TEST_PLUGIN=$$($(VPY) -c "import torch_pjrt.plugin_path as p; print(p.default_plugin())" 2>/dev/null || \
	    $(VPY) -c "import os, xla_plugins.xla_cpu_pjrt as m; print(os.path.join(os.path.dirname(m.__file__), 'xla_cpu_pjrt.so'))") \
	  ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 LSAN_OPTIONS=suppressions=tests/c/lsan.supp:print_suppressions=0 \
	  UBSAN_OPTIONS=print_stacktrace=1 TF_CPP_MIN_LOG_LEVEL=2 $$t; \
	done

# pytest-xdist: PYTEST_WORKERS processes share the tests (tests/conftest.py
# gives each its own compilation cache).  PYTEST_WORKERS=0 runs them in this
# process.
PYTEST_WORKERS ?= 2
pytest: build
	TF_CPP_MIN_LOG_LEVEL=2 $(VPY) -m pytest -q -n $(PYTEST_WORKERS) tests

test: build ctest pytest

demo: build
	TF_CPP_MIN_LOG_LEVEL=2 $(VPY) examples/mingpt_train.py

bench: build
	TF_CPP_MIN_LOG_LEVEL=2 $(VPY) bench/eager_overhead.py

clean:
	rm -rf $(BUILD) $(PKG)/*.so

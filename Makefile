# torch-pjrt build.  Two entry points for users:
#   make demo   set up .venv, build, train minGPT on "tpu" and compare with CPU
#   make test   set up .venv, build, run the C unit tests (ASan+UBSan) and pytest
PY      ?= python3
VENV    := .venv
VPY     := $(VENV)/bin/python
STAMP   := $(VENV)/.installed-v2
PKG     := torch_pjrt
BUILD   := build

# Headers come from the installed wheels; nothing foreign is committed.
PJRT_INC  = $(shell $(VPY) -c "import os, xla_plugins.xla_cpu_pjrt as m; print(os.path.join(os.path.dirname(m.__file__), 'include'))")
PY_INC    = $(shell $(VPY) -c "import sysconfig; print(sysconfig.get_paths()['include'])")
EXT       = $(shell $(VPY) -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
TORCH_DIR = $(shell $(VPY) -c "import os, torch; print(os.path.dirname(torch.__file__))")

CC      ?= gcc
CXX     ?= g++
CWARN   := -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE
CFLAGS  ?= -O2 -g
CORE_SRC := $(sort $(wildcard csrc/core/*.c))
CORE_HDR := $(wildcard csrc/core/*.h)
CORE_LIB := $(PKG)/libtpcore.so
PYMOD_SRC := $(sort $(wildcard csrc/python/*.c))
# csrc/glue/dist.cpp is the one glue file built apart (with Python headers, see below).
GLUE_SRC := $(filter-out csrc/glue/dist.cpp,$(sort $(wildcard csrc/glue/*.cpp)))
CTEST_SRC := $(sort $(wildcard tests/c/test_*.c))
SAN     := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined

.PHONY: all setup build demo test ctest pytest bench clean
all: build

setup: $(STAMP)
$(STAMP): requirements.txt tools/dev_install.py
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip >/dev/null 2>&1 || true
	$(VPY) -m pip install -q -r requirements.txt
	$(VPY) tools/dev_install.py
	touch $@

build: $(STAMP) $(CORE_LIB) $(PKG)/_C.so $(PKG)/_glue.so $(PKG)/_dist.so

$(CORE_LIB): $(CORE_SRC) $(CORE_HDR) $(STAMP)
	$(CC) $(CWARN) $(CFLAGS) -fPIC -shared -I$(PJRT_INC) -o $@ $(CORE_SRC) -ldl -lpthread -lm

$(PKG)/_C.so: $(PYMOD_SRC) $(CORE_HDR) | $(CORE_LIB)
	$(CC) $(CWARN) $(CFLAGS) -fPIC -shared -Icsrc/core -I$(PY_INC) -o $@ $(PYMOD_SRC) \
	  -L$(PKG) -ltpcore -Wl,-rpath,'$$ORIGIN'

# -std=c++20: torch 2.13's headers need it (c10/core/AutogradState.h uses
# bit-field initialisers) and torch.utils.cpp_extension builds with it; the
# glue's own code is plain C++17.  No Python headers: the glue is not a
# Python module, it is loaded with torch.ops.load_library.
$(PKG)/_glue.so: $(GLUE_SRC) $(wildcard csrc/glue/*.h) $(CORE_HDR) | $(CORE_LIB)
	$(CXX) -std=c++20 -O2 -fPIC -shared -Wall -Wextra -Werror -Wno-unused-parameter \
	  -D_GLIBCXX_USE_CXX11_ABI=1 -Icsrc/core -I$(TORCH_DIR)/include -o $@ $(GLUE_SRC) \
	  -L$(PKG) -ltpcore -L$(TORCH_DIR)/lib -lc10 -ltorch -ltorch_cpu \
	  -Wl,-rpath,'$$ORIGIN' -Wl,-rpath,$(TORCH_DIR)/lib

# torch.distributed's "tpu" backend: a c10d::Backend subclass that Python
# creates, so this one module is built with Python and pybind11 headers
# (torch ships both) and links torch_python.
$(PKG)/_dist.so: csrc/glue/dist.cpp | $(STAMP)
	$(CXX) -std=c++20 -O2 -fPIC -shared -Wall -Wextra -Werror -Wno-unused-parameter \
	  -D_GLIBCXX_USE_CXX11_ABI=1 -I$(PY_INC) -I$(TORCH_DIR)/include -I$(TORCH_DIR)/include/torch/csrc/api/include \
	  -o $@ $< -L$(TORCH_DIR)/lib -lc10 -ltorch -ltorch_cpu -ltorch_python -Wl,-rpath,$(TORCH_DIR)/lib

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

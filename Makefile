# Two entry points do all set-up on a fresh machine: `make demo` and `make test`.
#
# `make demo` installs what the viewer and the demo need (no llama.cpp, no test tools), runs
# `parity-xray doctor --for demo` and stops with its message when the window could not open.
# `make test` adds the dev and llama extras. llama-cpp-python is built from source with portable
# flags (no native tuning, AVX2/FMA/F16C on, AVX-512 and AMX off), so the tests' bits do not depend
# on the CPU, and an AMX build never runs where the OS does not grant AMX. The wheel is built once
# per machine and flags, into the user cache, and reused by every later clone.
# Separate stamps: `make demo` then `make test` installs only what the tests add.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
APP_STAMP := $(VENV)/.installed-app
TEST_STAMP := $(VENV)/.installed-test

UNAME_S := $(shell uname -s)
UNAME_M := $(shell uname -m)
ifeq ($(UNAME_S),Darwin)
  CACHE_HOME := $(HOME)/Library/Caches
else
  CACHE_HOME := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)
endif
ifeq ($(UNAME_S)-$(UNAME_M),Darwin-arm64)
  # Apple silicon: llama.cpp's defaults (Metal, Accelerate, NEON) are what every such Mac has.
  LLAMA_CMAKE_ARGS ?=
else ifeq ($(UNAME_M),x86_64)
  LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF \
    -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
else
  LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF
endif
LLAMA_VERSION := $(shell sed -n 's/^llama_cpp_python==//p' constraints.txt)
LLAMA_BUILD_ID := $(shell printf '%s' "$(LLAMA_CMAKE_ARGS)" | cksum | cut -d' ' -f1)
PYTHON_TAG := $(shell $(PYTHON) -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
# One wheel per llama-cpp-python version, build flags and Python: built once, reused by every clone.
LLAMA_WHEELS := $(CACHE_HOME)/parity-xray/wheels/llama-cpp-python-$(LLAMA_VERSION)-$(LLAMA_BUILD_ID)-$(PYTHON_TAG)

.PHONY: demo test llama doctor clean

$(APP_STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt -e .
	touch $(APP_STAMP)

$(TEST_STAMP): $(APP_STAMP)
	@if ! ls "$(LLAMA_WHEELS)"/llama_cpp_python-*.whl >/dev/null 2>&1; then \
		echo "Building llama-cpp-python $(LLAMA_VERSION) once (CMAKE_ARGS=$(LLAMA_CMAKE_ARGS)) into $(LLAMA_WHEELS) ..."; \
		CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PIP) wheel -q --no-deps --no-cache-dir -w "$(LLAMA_WHEELS)" \
			"llama-cpp-python==$(LLAMA_VERSION)" || { rm -rf "$(LLAMA_WHEELS)"; exit 1; }; \
	fi
	$(PIP) install -q -c constraints.txt --find-links "$(LLAMA_WHEELS)" --only-binary llama-cpp-python -e '.[dev,llama]'
	touch $(TEST_STAMP)

# What `make test` installs, without running the tests: llama.cpp's bindings for `record llama`.
llama: $(TEST_STAMP)

doctor: $(APP_STAMP)
	$(BIN)/parity-xray doctor

demo: $(APP_STAMP)
	@$(BIN)/parity-xray doctor --for demo
	$(BIN)/parity-xray demo

# Test files run side by side in worker processes, one per core this process may use (a container's
# affinity, not the host's count) and at most four (each worker holds Qt, MLX and the demo
# captures: about 1 GiB). A file's tests stay in one worker, so its fixtures
# are built once. `make test TEST_WORKERS=0` runs everything in this process.
TEST_WORKERS ?= $(shell $(PYTHON) -c 'import os; print(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count())')
test: $(TEST_STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --maxprocesses 4 --dist loadfile

clean:
	rm -rf $(VENV) test-artifacts .pytest_cache

# Two commands: `make run` serves the default model, `make test` runs the whole suite.
# Both build .venv on first use; it is reinstalled only when pyproject.toml changes (stamp files).
#   make run MODEL=qwen-0.5b        another catalog model (`lingcode models`; default: Qwen2.5-Coder-1.5B)
#   make run ARGS="--port 0"        extra arguments for `lingcode serve`
#   make test PYTEST_ARGS="-x -k cli"  extra arguments for pytest
# make test checks formatting and lint ([tool.ruff] in pyproject.toml) before the suite:
# `.venv/bin/ruff format .` lays the code out as it wants.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
ARGS ?=
MODEL ?=
PYTEST_ARGS ?=

# torch is pinned here, not in pyproject.toml: a plain `torch` requirement would download a
# multi-GB CUDA build, while 2.13.0 (CPU) is on disk on these machines.
TORCH := torch==2.13.0
# The SGLang contract test runs the launch profiles through SGLang's own argument parser. sglang's
# declared dependencies are a CUDA stack, so it goes in without them, plus the few packages its
# parser imports (tests/sglang-parser-requirements.txt). Keep in step with lingcode/engine/sglang/profiles.py.
SGLANG := sglang==0.5.23

# The llama.cpp peer of `lingcode bench --peers llama.cpp` (benchmarks only, never part of `make
# test`): llama-cpp-python compiles llama.cpp at install, 10-30 minutes on 2 cores, into a venv of
# its own (no torch there). GGML_NATIVE builds for this machine's CPU; where that build fails, try
# LLAMA_CPP_CMAKE_ARGS='-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON'.
LLAMA_CPP_VENV ?= .venv-llama-cpp
LLAMA_CPP := llama-cpp-python==0.3.36
LLAMA_CPP_CMAKE_ARGS ?= -DGGML_NATIVE=ON

.PHONY: run test clean tmux-if-missing llama-cpp-peer

run: $(VENV)/.installed-run
	$(BIN)/lingcode pull $(MODEL)
	$(BIN)/python -c 'from lingcode.engine.local import cpu_native; cpu_native.main()'
	exec $(BIN)/lingcode serve $(if $(MODEL),--model $(MODEL)) $(ARGS)

test: $(VENV)/.installed-test $(VENV)/.sglang-parser tmux-if-missing
	$(BIN)/lingcode pull
	$(BIN)/lingcode pull smollm2
	$(BIN)/lingcode pull qwen2.5-coder-0.5b-instruct
	$(BIN)/python -c 'from lingcode.engine.local import cpu_native; cpu_native.main()'
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

$(VENV)/.torch:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install $(TORCH)
	touch $@

$(VENV)/.installed-run: pyproject.toml $(VENV)/.torch
	$(BIN)/python -m pip install -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml $(VENV)/.torch
	$(BIN)/python -m pip install -e '.[dev]'
	touch $@

$(VENV)/.sglang-parser: tests/sglang-parser-requirements.txt Makefile $(VENV)/.torch
	$(BIN)/python -m pip install --no-deps $(SGLANG)
	$(BIN)/python -m pip install -r tests/sglang-parser-requirements.txt
	touch $@

# `lingcode chat` has one test that drives it inside tmux. Install tmux where we may (Debian or
# Ubuntu, as root or with passwordless sudo); otherwise that test is skipped and says why.
SUDO := $(shell test "$$(id -u)" -eq 0 || echo sudo -n)
tmux-if-missing:
	@command -v tmux >/dev/null || { command -v apt-get >/dev/null && \
	  { $(SUDO) apt-get install -y -q tmux || { $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q tmux; }; }; } \
	  || echo "tmux could not be installed: the tmux test of lingcode chat will be skipped"

llama-cpp-peer: $(LLAMA_CPP_VENV)/.installed

$(LLAMA_CPP_VENV)/.installed:
	test -x $(LLAMA_CPP_VENV)/bin/python || $(PYTHON) -m venv $(LLAMA_CPP_VENV)
	CMAKE_ARGS='$(LLAMA_CPP_CMAKE_ARGS)' CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) \
	  $(LLAMA_CPP_VENV)/bin/python -m pip install --no-binary llama-cpp-python $(LLAMA_CPP)
	$(LLAMA_CPP_VENV)/bin/python -c 'import llama_cpp; print(llama_cpp.llama_print_system_info().decode())'
	touch $@

clean:
	rm -rf $(VENV)

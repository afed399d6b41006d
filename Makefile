# Two commands: `make run` serves the default model, `make test` runs the whole suite.
# Both build .venv on first use; it is reinstalled only when pyproject.toml changes (stamp files).
#   make run ARGS="--port 0"        extra arguments for `lingcode serve`
#   make test PYTEST_ARGS="-x -k cli"  extra arguments for pytest

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
ARGS ?=
PYTEST_ARGS ?=

# torch is pinned here, not in pyproject.toml: a plain `torch` requirement would download a
# multi-GB CUDA build, while 2.13.0 (CPU) is on disk on these machines.
TORCH := torch==2.13.0
# The SGLang contract test runs the launch profiles through SGLang's own argument parser. sglang's
# declared dependencies are a CUDA stack, so it goes in without them, plus the few packages its
# parser imports (tests/sglang-parser-requirements.txt). Keep in step with lingcode/engine/sglang/profiles.py.
SGLANG := sglang==0.5.23

.PHONY: run test clean tmux-if-missing

run: $(VENV)/.installed-run
	$(BIN)/lingcode pull
	$(BIN)/python -c 'from lingcode.engine.local import cpu_native; cpu_native.main()'
	exec $(BIN)/lingcode serve $(ARGS)

test: $(VENV)/.installed-test $(VENV)/.sglang-parser tmux-if-missing
	$(BIN)/lingcode pull
	$(BIN)/python -c 'from lingcode.engine.local import cpu_native; cpu_native.main()'
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

clean:
	rm -rf $(VENV)

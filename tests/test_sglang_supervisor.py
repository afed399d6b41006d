"""The supervisor, with a real child process: tests/sglang_standin.py stands in for
`python -m sglang.launch_server` (configured the way users configure SGLang's interpreter).

What these cannot show here: real SGLang loading Ling-3.0-flash on 4 GPUs, its TP worker
processes and the GPU memory they hold. The stand-in's worker reproduces the part that matters
to the supervisor: a process in the same group that outlives its parent and ignores SIGTERM.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from lingcode.engine import EngineUnavailable, SamplingParams
from lingcode.engine.sglang.adapter import SGLangEngine
from lingcode.engine.sglang.model_dir import load_model_info
from lingcode.engine.sglang.supervisor import StartupFailed, Supervisor, group_members

STANDIN = Path(__file__).with_name("sglang_standin.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def wait_for(predicate, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def standin(tmp_path):
    """An "interpreter" that runs the stand-in: what [sglang] python would point at."""
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{STANDIN}" "$@"\n')
    python.chmod(0o755)
    return python


def make(standin, tmp_path, lines=None, backoff_s=(0.2, 0.4), **env) -> Supervisor:
    port = free_port()
    command = [
        str(standin),
        "-m",
        "sglang.launch_server",
        "--model-path",
        "m",
        "--port",
        str(port),
        "--api-key",
        "s3cret",
    ]
    env = {"STANDIN_DIR": str(tmp_path), **{k: str(v) for k, v in env.items()}}
    return Supervisor(
        command,
        env,
        url=f"http://127.0.0.1:{port}",
        log_file=tmp_path / "state" / "sglang.log",
        on_line=(lines.append if lines is not None else lambda line: None),
        backoff_s=backoff_s,
        max_failures=2,
        stop_grace_s=1.0,
    )


def pids(tmp_path: Path, name: str) -> list[int]:
    return [int(p) for p in (tmp_path / name).read_text().split()]


def test_start_waits_for_health_then_stop_leaves_no_process(standin, tmp_path):
    lines: list[str] = []
    sup = make(standin, tmp_path, lines, STANDIN_LOAD_S=0.5)
    sup.start()
    assert sup.state == "ready" and sup.unavailable() is None
    assert httpx.get(sup.url + "/health_generate").status_code == 200
    # tqdm's carriage-return progress arrives as separate lines, in the daemon log and in sglang.log
    assert any("50% Completed" in line for line in lines) and any("ready at" in line for line in lines)
    log = sup.log_file.read_text()
    assert "25% Completed" in log and "--api-key ***" in log and "s3cret" not in log
    pgid, worker = sup.status()["pid"], pids(tmp_path, "workers.txt")[0]
    assert worker in group_members(pgid)
    sup.stop()
    # the worker ignores SIGTERM: only the SIGKILL that follows the grace period ends it
    assert group_members(pgid) == [] and not alive(worker)
    assert sup.state == "stopped" and not (tmp_path / "state" / "sglang.pid").exists()


def test_a_crash_is_restarted_with_backoff_and_its_orphans_are_killed(standin, tmp_path):
    lines: list[str] = []
    sup = make(standin, tmp_path, lines)
    sup.start()
    first_worker = pids(tmp_path, "workers.txt")[0]
    with pytest.raises(httpx.HTTPError):
        httpx.post(sup.url + "/die")  # the server exits without answering
    assert wait_for(lambda: sup.state == "restarting")
    assert wait_for(lambda: not alive(first_worker))  # the dead server's worker does not keep its GPU
    assert wait_for(lambda: sup.state == "ready")
    assert sup.restarts == 1 and len(pids(tmp_path, "starts.txt")) == 2
    assert "[lingcode] SGLang exited with code 3 and is restarting (next try in 0.2 s)" in lines
    sup.stop()
    assert not any(alive(p) for p in pids(tmp_path, "starts.txt") + pids(tmp_path, "workers.txt"))


def test_a_server_that_dies_while_loading_is_one_line(standin, tmp_path):
    sup = make(standin, tmp_path, STANDIN_CRASH_FROM=1)
    with pytest.raises(StartupFailed) as failure:
        sup.start()
    message = str(failure.value)
    assert "exited with code 1 before it was ready" in message and "out of memory" in message
    assert str(sup.log_file) in message and "\n" not in message
    assert sup.state == "failed" and not any(alive(p) for p in pids(tmp_path, "workers.txt"))


def test_it_gives_up_after_repeated_failures(standin, tmp_path):
    sup = make(standin, tmp_path, STANDIN_CRASH_FROM=2)
    sup.start()
    with pytest.raises(httpx.HTTPError):
        httpx.post(sup.url + "/die")
    assert wait_for(lambda: sup.state == "failed", timeout=30)
    assert "exited 3 times in a row" in sup.unavailable()
    assert len(pids(tmp_path, "starts.txt")) == 3  # the first run, then max_failures=2 restarts
    sup.stop()
    assert not any(alive(p) for p in pids(tmp_path, "workers.txt"))


def test_a_group_left_by_a_killed_daemon_is_stopped_at_the_next_start(standin, tmp_path):
    """SIGKILL of the daemon cannot stop its child; the next daemon finds it through sglang.pid."""
    first = make(standin, tmp_path)
    script = textwrap.dedent(f"""
        from pathlib import Path
        from lingcode.engine.sglang.supervisor import Supervisor
        sup = Supervisor({first.command!r}, {first.env!r}, url={first.url!r}, log_file=Path({str(first.log_file)!r}),
                         on_line=lambda line: None)
        sup.start()
        print("ready", flush=True)
        input()
    """)
    daemon = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert daemon.stdout.readline().strip() == "ready"
    os.kill(daemon.pid, signal.SIGKILL)
    daemon.wait()
    orphan = pids(tmp_path, "starts.txt")[0]
    assert alive(orphan)  # its own session: it survived the daemon
    second = make(standin, tmp_path)
    second.start()
    assert not alive(orphan) and not alive(pids(tmp_path, "workers.txt")[0])
    second.stop()


async def test_in_flight_requests_get_503_while_sglang_restarts(standin, tmp_path, model_dir):
    sup = make(standin, tmp_path, backoff_s=(1.5,))
    await asyncio.to_thread(sup.start)
    engine = SGLangEngine(sup.url, load_model_info(model_dir), availability=sup.unavailable, status=sup.status)
    params = SamplingParams(max_tokens=10_000)
    with pytest.raises(EngineUnavailable):
        async for chunk in engine.generate("r1", [1, 2, 3], params):
            if len(chunk.token_ids):
                async with httpx.AsyncClient() as client:
                    with pytest.raises(httpx.HTTPError):
                        await client.post(sup.url + "/die")
    assert await asyncio.to_thread(wait_for, lambda: sup.state == "restarting")
    with pytest.raises(EngineUnavailable, match="restarting"):
        [c async for c in engine.generate("r2", [1, 2, 3], params)]
    assert await asyncio.to_thread(wait_for, lambda: sup.state == "ready")
    assert engine.stats()["server"]["restarts"] == 1
    await engine.close()
    sup.stop()


@pytest.fixture
def model_dir(tmp_path):
    from tokenizers import Tokenizer, models

    (tmp_path / "model").mkdir()
    Tokenizer(models.WordLevel({"a": 0, "b": 1}, unk_token="a")).save(str(tmp_path / "model" / "tokenizer.json"))
    (tmp_path / "model" / "config.json").write_text('{"max_position_embeddings": 1024}')
    return tmp_path / "model"


def test_an_interpreter_that_cannot_run_is_one_line(tmp_path):
    sup = Supervisor(
        [str(tmp_path / "nope" / "python"), "-m", "sglang.launch_server"],
        {},
        url="http://127.0.0.1:9",
        log_file=tmp_path / "sglang.log",
        on_line=lambda line: None,
    )
    with pytest.raises(StartupFailed, match="cannot run .*nope/python"):
        sup.start()
    assert sup.state == "failed"

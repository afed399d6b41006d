"""The daemon's files and socket (server/daemon.py), without a model: token, daemon.json, binding."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from conftest import share_built_caches

from lingcode import paths
from lingcode.server import daemon as d


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_token_is_created_once_0600_and_reused(tmp_path):
    path = tmp_path / "token"
    token = d.ensure_token(path)
    assert len(token) >= 43 and mode(path) == 0o600
    assert d.ensure_token(path) == token
    assert not [p for p in tmp_path.iterdir() if p != path]  # no temp files left behind


def test_loose_token_permissions_are_tightened_and_an_empty_token_replaced(tmp_path):
    path = tmp_path / "token"
    path.write_text("secret\n")
    path.chmod(0o644)
    assert d.ensure_token(path) == "secret"
    assert mode(path) == 0o600
    path.write_text("")
    token = d.ensure_token(path)
    assert token and path.read_text() == token and mode(path) == 0o600


def test_daemon_file_is_removed_only_if_it_is_ours(tmp_path):
    path = tmp_path / "daemon.json"
    d.write_daemon_file(path, {"url": "http://127.0.0.1:1", "pid": os.getpid() + 1})
    assert mode(path) == 0o600
    d.remove_daemon_file(path)
    assert path.exists()  # another daemon's: left alone
    d.write_daemon_file(path, {"url": "http://127.0.0.1:1", "pid": os.getpid()})
    d.remove_daemon_file(path)
    assert not path.exists()
    d.remove_daemon_file(path)  # already gone: fine


def test_a_stale_daemon_file_does_not_block_a_start(tmp_path):
    path = tmp_path / "daemon.json"
    assert d.running_daemon(path) is None
    path.write_text("{not json")
    assert d.running_daemon(path) is None
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path.write_text(json.dumps({"url": f"http://127.0.0.1:{port}", "pid": os.getppid()}))
    assert d.running_daemon(path) is None  # the process lives, but nothing answers there


def test_a_running_daemon_is_not_started_twice(daemon, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("LINGCODE_HOME", str(daemon.home))
    code = d.serve(
        engine="local",
        model_path=tmp_path / "never-loaded.gguf",
        model_name="m",
        host="127.0.0.1",
        port=0,
        device="cpu",
        max_queue=1,
        log_level="warning",
    )
    assert code == 1
    assert daemon.url in capsys.readouterr().err
    assert daemon.daemon_file.exists()  # the running daemon's file is untouched


def test_the_home_lock_is_held_by_one_until_it_is_released(tmp_path, monkeypatch, capsys):
    path = tmp_path / "daemon.lock"
    first = d.lock_home(path)
    assert first is not None and path.read_text() == f"{os.getpid()}\n" and mode(path) == 0o600
    assert d.lock_home(path) is None  # a second open file: flock refuses it, even in one process
    monkeypatch.setenv("LINGCODE_HOME", str(tmp_path / "home"))
    held = d.lock_home(paths.daemon_lock_file())
    code = d.serve(
        engine="local",
        model_path=tmp_path / "never-loaded.gguf",
        model_name="m",
        host="127.0.0.1",
        port=0,
        device="cpu",
        max_queue=1,
        log_level="warning",
    )
    assert (
        code == 1 and f"another lingcode daemon (pid {os.getpid()}) is starting or running" in capsys.readouterr().err
    )
    held.close()
    first.close()
    again = d.lock_home(path)
    assert again is not None
    again.close()


def test_two_daemons_started_at_once_on_one_home_one_serves(model_path, tmp_path):
    """Issue 18, item 10: both used to load and serve, and daemon.json named only the second."""
    env = {**os.environ, "LINGCODE_HOME": str(tmp_path)}
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
        "--log-level",
        "warning",
    ]
    logs = [tmp_path / f"daemon-{i}.log" for i in range(2)]
    processes = []
    for log_path in logs:
        with open(log_path, "wb") as log:
            processes.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT))
    try:
        daemon_file = tmp_path / "state" / "daemon.json"
        deadline = time.monotonic() + 180
        while not (daemon_file.exists() and any(p.poll() is not None for p in processes)):
            assert time.monotonic() < deadline, [log.read_text() for log in logs]
            assert all(p.poll() in (None, 1) for p in processes), [log.read_text() for log in logs]
            time.sleep(0.1)
        [loser] = [i for i, p in enumerate(processes) if p.poll() is not None]
        winner = processes[1 - loser]
        assert winner.poll() is None and processes[loser].returncode == 1
        message = logs[loser].read_text()
        assert "lingcode serve: another lingcode daemon" in message or "already serves" in message, message
        assert "loading" not in message  # it stopped before loading the model
        record = json.loads(daemon_file.read_text())
        assert record["pid"] == winner.pid
        token = (tmp_path / "config" / "token").read_text().strip()
        assert httpx.get(record["url"] + "/v1/models", headers={"x-api-key": token}).status_code == 200
        winner.send_signal(signal.SIGTERM)
        assert winner.wait(timeout=30) == 0
        assert not daemon_file.exists()
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()


def test_unknown_engine_is_a_usage_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LINGCODE_HOME", str(tmp_path))
    code = d.serve(
        engine="vllm",
        model_path=tmp_path / "m.gguf",
        model_name="m",
        host="127.0.0.1",
        port=0,
        device="cpu",
        max_queue=1,
        log_level="warning",
    )
    assert code == 2
    assert "engine 'vllm' is not available" in capsys.readouterr().err


def test_port_zero_binds_a_free_port_and_a_busy_port_fails():
    sock = d.bind_socket("127.0.0.1", 0)
    try:
        url = d.socket_url(sock)
        port = int(url.rsplit(":", 1)[1])
        assert url == f"http://127.0.0.1:{port}" and port > 0
        sock.listen()
        with pytest.raises(OSError):
            d.bind_socket("127.0.0.1", port).close()
    finally:
        sock.close()


def test_wildcard_addresses_get_a_loopback_url():
    sock = d.bind_socket("0.0.0.0", 0)
    try:
        assert d.socket_url(sock).startswith("http://127.0.0.1:")
    finally:
        sock.close()
    assert d.is_loopback("127.0.0.1") and d.is_loopback("::1") and d.is_loopback("localhost")
    assert not d.is_loopback("0.0.0.0") and not d.is_loopback("192.168.1.2")


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads Linux's /proc")
def test_an_idle_daemon_wakes_its_event_loop_about_once_a_second(daemon):
    """uvicorn looks for a stop signal 10 times a second and the daemon did 20 times more: 30
    wake-ups a second, each a core taken from a CPU engine's step. Now only the Date header's tick
    (once a second) and a connection's keep-alive timer may wake it."""
    status = Path(f"/proc/{daemon.process.pid}/task/{daemon.process.pid}/status")  # the loop's thread

    def sleeps() -> int:
        return int(re.search(r"^voluntary_ctxt_switches:\s+(\d+)", status.read_text(), re.M).group(1))

    before = sleeps()
    time.sleep(4)
    assert sleeps() - before <= 10  # 118 before DaemonServer


def test_an_idle_connection_stays_open_past_the_clients_own_expiry(daemon):
    """Clients reuse an idle connection until their own expiry (aiohttp, lingcode's front ends:
    15 s; httpx, the SDKs: 5 s). uvicorn closed one idle for 5 s, and a request sent as it did was
    lost (`lingcode bench daemon` failed on one). One idle for 6 s still answers."""
    url = urlsplit(daemon.url)
    request = (f"GET /health HTTP/1.1\r\nHost: {url.netloc}\r\nAuthorization: Bearer {daemon.token}\r\n\r\n").encode()
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        answers = sock.makefile("rb")
        for n in range(2):
            if n:
                time.sleep(6)
            sock.sendall(request)
            assert answers.readline().split()[1] == b"200"
            headers = dict(line.decode().lower().rstrip().split(": ", 1) for line in iter(answers.readline, b"\r\n"))
            assert json.loads(answers.read(int(headers["content-length"])))
            assert headers.get("connection") != "close"


def test_ctrl_c_mid_stream_ends_it_with_an_error_event_and_exits_0(model_path, tmp_path):
    """A second daemon of its own: Ctrl+C while a long stream runs (the session daemon covers SIGTERM)."""
    env = {**os.environ, "LINGCODE_HOME": str(share_built_caches(tmp_path))}
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
        "--log-level",
        "warning",
    ]
    log_path = tmp_path / "daemon.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        daemon_file = tmp_path / "state" / "daemon.json"
        deadline = time.monotonic() + 120
        while not daemon_file.exists():
            assert process.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)
        record = json.loads(daemon_file.read_text())
        headers = {"x-api-key": Path(record["token_file"]).read_text()}
        body = {"prompt": "Once upon a time", "max_tokens": 2000, "ignore_eos": True, "stream": True}
        with httpx.stream(
            "POST", record["url"] + "/v1/completions", headers=headers, json=body, timeout=60
        ) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data: ")
            process.send_signal(signal.SIGINT)
            events = [line.removeprefix("data: ") for line in lines if line]
        assert events[-1] == "[DONE]"
        error = json.loads(events[-2])["error"]  # not a normal-looking end: the client learns it was cut
        assert error["code"] == "engine_unavailable" and "shutting down" in error["message"]
        assert process.wait(timeout=30) == 0, log_path.read_text()
        assert not daemon_file.exists()
        assert "Traceback" not in log_path.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()

"""The one client of the daemon that lingcode's own front ends (LSP, chat UI) use.

It finds the running daemon through daemon.json and the token file, starts one when none runs
(detached, logging to the state dir, so it outlives the editor or terminal that started it),
and speaks the daemon's HTTP API: JSON calls and SSE streams. Closing a stream early closes
the connection, which makes the daemon abort the request in the engine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from lingcode import paths


class DaemonError(RuntimeError):
    """The daemon could not be reached or started; the message says what to do."""


class ErrorResponse(RuntimeError):
    """The daemon answered with an error (its OpenAI-shaped body's message)."""

    def __init__(self, status: int, message: str, body: dict | None = None):
        super().__init__(f"{status}: {message}")
        self.status, self.message, self.body = status, message, body or {}


@dataclass(frozen=True)
class Daemon:
    url: str
    token: str
    pid: int
    model: str
    engine: str


def read_daemon_file() -> Daemon | None:
    """The daemon that daemon.json names, if its process is alive (it may still be starting)."""
    try:
        record = json.loads(paths.daemon_file().read_text())
        token = Path(record["token_file"]).read_text().strip()
        daemon = Daemon(record["url"], token, int(record["pid"]), record.get("model", ""), record.get("engine", ""))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    try:
        os.kill(daemon.pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return daemon


def is_healthy(daemon: Daemon, timeout: float = 2.0) -> bool:
    try:
        return httpx.get(f"{daemon.url}/health", timeout=timeout).status_code == 200
    except httpx.HTTPError:
        return False


def log_file() -> Path:
    return paths.state_dir() / "daemon.log"


def start_daemon(
    serve_args: list[str] = (), on_progress: Callable[[str], None] | None = None, timeout: float = 600.0
) -> Daemon:
    """Start `lingcode serve` detached and wait until it answers; on_progress gets its log lines."""
    say = on_progress or (lambda _line: None)
    log = log_file()
    with open(log, "ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "lingcode", "serve", *serve_args],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    say(f"starting the lingcode daemon (pid {process.pid}, log {log})")
    seen = log.stat().st_size if log.exists() else 0
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = _report_new_lines(log, seen, say)
        daemon = read_daemon_file()
        if daemon is not None and is_healthy(daemon):
            say(f"daemon ready at {daemon.url}")
            return daemon
        if process.poll() is not None:
            # It may have lost a race with another client's daemon, which is then the one to use.
            daemon = read_daemon_file()
            if daemon is not None and is_healthy(daemon):
                return daemon
            raise DaemonError(f"the daemon exited with status {process.returncode}; see {log}")
        time.sleep(0.2)
    raise DaemonError(f"the daemon did not become ready in {timeout:.0f} s; see {log}")


def _report_new_lines(log: Path, offset: int, say: Callable[[str], None]) -> int:
    try:
        with open(log, "rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return offset
    complete = data.rfind(b"\n") + 1
    for line in data[:complete].decode(errors="replace").splitlines():
        if line.strip():
            say(line.strip())
    return offset + complete


def ensure_daemon(serve_args: list[str] = (), on_progress: Callable[[str], None] | None = None) -> Daemon:
    """The running daemon, or a new one started for us."""
    daemon = read_daemon_file()
    if daemon is not None and is_healthy(daemon):
        return daemon
    return start_daemon(serve_args, on_progress)


class Client:
    """Async HTTP calls to one daemon. Streams yield the SSE events' JSON objects."""

    def __init__(self, daemon: Daemon, timeout: float = 600.0):
        self.daemon = daemon
        self.http = httpx.AsyncClient(
            base_url=daemon.url,
            headers={"Authorization": f"Bearer {daemon.token}"},
            timeout=httpx.Timeout(timeout, connect=5.0),
        )

    async def aclose(self) -> None:
        await self.http.aclose()

    async def get(self, path: str) -> dict:
        response = await self.http.get(path)
        return _json_or_raise(response)

    async def post(self, path: str, body: dict) -> dict:
        response = await self.http.post(path, json=body)
        return _json_or_raise(response)

    async def stream(self, path: str, body: dict) -> AsyncIterator[dict]:
        """POST with stream=true; yields each `data:` event until [DONE]. Closing it aborts."""
        async with self.http.stream("POST", path, json={**body, "stream": True}) as response:
            if response.status_code != 200:
                await response.aread()
                _json_or_raise(response)
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    return
                event = json.loads(data)
                if "error" in event and "choices" not in event:
                    error = event["error"]
                    raise ErrorResponse(500, error.get("message", "error") if isinstance(error, dict) else str(error), event)
                yield event


def _json_or_raise(response: httpx.Response) -> dict:
    try:
        body = response.json()
    except ValueError:
        body = {}
    if response.status_code >= 400:
        error = body.get("error") if isinstance(body, dict) else None
        message = error.get("message") if isinstance(error, dict) else (response.text or response.reason_phrase)
        raise ErrorResponse(response.status_code, message, body)
    return body


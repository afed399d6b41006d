"""The one client of the daemon that lingcode's own front ends (LSP, chat UI) use.

It finds the running daemon through daemon.json and the token file, starts one when none runs
(detached, logging to the state dir, so it outlives the editor or terminal that started it),
and speaks the daemon's HTTP API: JSON calls and SSE streams. Closing a stream early closes
the connection, which makes the daemon abort the request in the engine. DaemonLink keeps a
front end connected: found, started, and found again after trouble, by one rule.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
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
    log = paths.private_file(log_file())
    with open(log, "ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "lingcode", "serve", *serve_args],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
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


class DaemonGone(DaemonError):
    """A request got no answer: the daemon went away, or never answered (mark_down, then connect again)."""


class Client:
    """Async HTTP calls to one daemon, on aiohttp: it costs a request a fraction of httpx's CPU time,
    which an editor pays on every keystroke that asks (docs/engine-notes.md). Streams yield the SSE
    events' JSON objects. A request that gets no answer raises DaemonGone; an error answer,
    ErrorResponse."""

    def __init__(self, daemon: Daemon, timeout: float = 600.0):
        self.daemon = daemon
        self._headers = {"Authorization": f"Bearer {daemon.token}"}
        # timeout: between two reads (a stream may run for minutes), as httpx's read timeout was
        self._timeout = aiohttp.ClientTimeout(total=None, connect=5.0, sock_read=timeout)
        self._session: aiohttp.ClientSession | None = None  # made on the event loop, at the first call

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(headers=self._headers, timeout=self._timeout)
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def get(self, path: str) -> dict:
        return await self._call("GET", path)

    async def post(self, path: str, body: dict) -> dict:
        return await self._call("POST", path, body)

    async def delete(self, path: str) -> dict:
        return await self._call("DELETE", path)

    async def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        try:
            async with self._http().request(method, self.daemon.url + path, json=body) as response:
                return _json_or_raise(response.status, await response.read(), response.reason)
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise _gone(self.daemon, exc) from exc

    async def stream(self, path: str, body: dict) -> AsyncIterator[dict]:
        """POST with stream=true; yields each `data:` event until [DONE]. Closing it aborts."""
        try:
            async with self._http().post(self.daemon.url + path, json={**body, "stream": True}) as response:
                if response.status != 200:
                    _json_or_raise(response.status, await response.read(), response.reason)
                async for raw in response.content:
                    line = raw.decode()
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return
                    event = json.loads(data)
                    if "error" in event and "choices" not in event:
                        error = event["error"]
                        message = error.get("message", "error") if isinstance(error, dict) else str(error)
                        raise ErrorResponse(500, message, event)
                    yield event
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise _gone(self.daemon, exc) from exc


def _gone(daemon: Daemon, exc: BaseException) -> DaemonGone:
    return DaemonGone(f"lost the daemon at {daemon.url} ({type(exc).__name__}: {exc})")


def _json_or_raise(status: int, raw: bytes, reason: str | None) -> dict:
    try:
        body = json.loads(raw)
    except ValueError:
        body = {}
    if status >= 400:
        error = body.get("error") if isinstance(body, dict) else None
        text = raw.decode("utf-8", "replace")
        message = error.get("message") if isinstance(error, dict) else (text or reason or "")
        raise ErrorResponse(status, message, body)
    return body


# --- DaemonLink: a front end's connection, kept ------------------------------------------------

RETRY_AFTER_S = 10.0  # a failed start is not repeated for this long
START_AFTER_S = 3.0  # after losing a daemon: how long none must answer before we start one
LOOK_EVERY_S = 1.0


@dataclass
class Progress:
    """Where a link reports starting a daemon; called on the event loop."""

    begin: Callable[[str], None]
    report: Callable[[str], None]  # each line of the daemon's log
    end: Callable[[str], None]


def _ignore(_message: str) -> None:
    pass


class DaemonLink:
    """A front end's connection to the daemon (`lingcode lsp` and `lingcode chat` each hold one).

    The rule, for every caller of ready():
    - Look first, every time: the daemon that daemon.json names is used once /health answers and it
      lists its model (a file read and a loopback request: cheap enough for a keystroke).
    - Start one only when none answers, and only with auto_start: at once the first time; after a
      daemon was lost (mark_down), once none has answered for START_AFTER_S, since a daemon that is
      restarting, or that another client is starting, names itself only once it serves. A started
      daemon is detached: it outlives this process, and the next front end finds it.
    - A failed start is not repeated for RETRY_AFTER_S: until then a caller whose look finds nothing
      gets its error at once, instead of each keystroke starting a daemon that cannot start.
    - One attempt at a time, in the background, shared by every caller; a caller cancelled while it
      waits does not cancel the attempt. reconnect() repeats attempts every LOOK_EVERY_S until one
      succeeds.
    """

    def __init__(
        self,
        serve_args: list[str] = (),
        auto_start: bool = True,
        progress: Progress | None = None,
        timeout: float = 600.0,
    ):
        self.serve_args = list(serve_args)
        self.auto_start = auto_start
        self.progress = progress or Progress(_ignore, _ignore, _ignore)
        self.timeout = timeout  # of each request to the daemon
        self.daemon: Daemon | None = None
        self.client: Client | None = None
        self.model_id = ""
        self.context_length = 0
        self._attempt: asyncio.Future[Client] | None = None
        self._lost = False  # a daemon was marked down and none found since
        self._failed_start: tuple[float, str] | None = None  # when, and why
        self._stale: list[Client] = []  # clients of lost daemons, to close

    @property
    def connected(self) -> bool:
        return self.client is not None

    def connect(self) -> None:
        """Start an attempt in the background, unless connected or one is under way."""
        if self.client is None and (self._attempt is None or self._attempt.done()):
            self._attempt = asyncio.ensure_future(self._connect())
            # Retrieved here, so that a failure nobody awaited yet is not reported as unhandled.
            self._attempt.add_done_callback(lambda done: done.cancelled() or done.exception())

    async def ready(self) -> Client:
        """The client of a daemon that answers, connecting first if need be. Raises DaemonError."""
        if self.client is not None:
            return self.client
        self.connect()
        return await asyncio.shield(self._attempt)

    async def reconnect(self, on_wait: Callable[[int], None]) -> Client:
        """Drop the current daemon and wait until one answers again; retries until cancelled.

        on_wait gets the attempt's number; a new reason for failing goes to progress.report."""
        self.mark_down()
        said = None
        for attempt in itertools.count(1):
            on_wait(attempt)
            try:
                return await self.ready()
            except DaemonError as e:
                if str(e) != said:
                    said = str(e)
                    self.progress.report(said)
            await asyncio.sleep(LOOK_EVERY_S)

    def mark_down(self) -> None:
        """Stop using the current daemon at once (a request to it failed); the next call finds one again."""
        if self.client is not None:
            self._stale.append(self.client)
            self.client, self.daemon, self._lost = None, None, True

    async def close(self) -> None:
        if self._attempt is not None and not self._attempt.done():
            self._attempt.cancel()
        self.mark_down()
        while self._stale:
            await self._stale.pop().aclose()

    async def _connect(self) -> Client:
        loop = asyncio.get_running_loop()
        start_at = loop.time() + (START_AFTER_S if self._lost and self.auto_start else 0.0)
        while (daemon := await _in_background_thread(_answering_daemon)) is None and loop.time() < start_at:
            await asyncio.sleep(LOOK_EVERY_S)
        return await self._use(daemon or await self._start())

    async def _start(self) -> Daemon:
        if not self.auto_start:
            raise DaemonError("no lingcode daemon is running; start one with `lingcode serve`")
        if self._failed_start is not None and time.monotonic() - self._failed_start[0] < RETRY_AFTER_S:
            raise DaemonError(self._failed_start[1])
        loop = asyncio.get_running_loop()
        self.progress.begin("starting the lingcode daemon")

        def on_line(line: str) -> None:  # called on the starting thread
            try:
                loop.call_soon_threadsafe(self.progress.report, line)
            except RuntimeError:  # the loop has closed: nobody is watching any more
                pass

        try:
            daemon = await _in_background_thread(start_daemon, self.serve_args, on_line)
        except (DaemonError, OSError) as exc:  # OSError: the state dir or its log refused
            self._failed_start = (time.monotonic(), str(exc))
            self.progress.end(f"the daemon did not start: {exc}")
            raise DaemonError(str(exc)) from exc
        self._failed_start = None
        self.progress.end(f"lingcode daemon ready at {daemon.url} ({daemon.model})")
        return daemon

    async def _use(self, daemon: Daemon) -> Client:
        client = Client(daemon, timeout=self.timeout)
        try:
            model = (await client.get("/v1/models"))["data"][0]
            model_id, context_length = model["id"], int(model.get("context_length") or 0)
        except BaseException as e:
            await client.aclose()
            if isinstance(e, (ErrorResponse, DaemonGone, LookupError, TypeError, ValueError)):
                raise DaemonError(f"the daemon at {daemon.url} answered, but not usefully: {e}") from e
            raise
        while self._stale:
            await self._stale.pop().aclose()
        self.daemon, self.client, self._lost = daemon, client, False
        self.model_id, self.context_length = model_id, context_length
        return client


def _answering_daemon() -> Daemon | None:
    daemon = read_daemon_file()
    return daemon if daemon is not None and is_healthy(daemon) else None


def _in_background_thread(function, *args) -> asyncio.Future:
    """Run a blocking call in a daemon thread: unlike asyncio.to_thread, quitting never waits for it
    (starting a daemon can take minutes while a model loads)."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(method, value):
        if not future.done():
            method(value)

    def target():
        try:
            outcome = (future.set_result, function(*args))
        except BaseException as e:  # handed to the awaiting task
            outcome = (future.set_exception, e)
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:  # the loop has closed: nobody waits any more
            pass

    threading.Thread(target=target, daemon=True, name=f"lingcode-link-{function.__name__}").start()
    return future

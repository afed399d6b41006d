"""The LSP server's way to the daemon: find it, or start it (reporting progress), and reconnect.

`initialize` never waits for this: the first connection starts in the background once the
editor says `initialized`, and completion requests wait for it (each one can still be
cancelled). Starting a daemon loads the model, which takes seconds; its log lines are reported
as they come, so the editor can show "loading ..." instead of nothing. A started daemon is
detached: it outlives the editor, and the next editor finds it through daemon.json.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from lingcode.client import Client, Daemon, DaemonError, ensure_daemon, is_healthy, read_daemon_file

RETRY_AFTER_S = 10.0


@dataclass
class Progress:
    """Where the start of a daemon is reported (the server maps these to $/progress)."""

    begin: Callable[[str], None]
    report: Callable[[str], None]
    end: Callable[[str], None]


class DaemonLink:
    def __init__(self, serve_args: list[str], auto_start: bool, progress: Progress):
        self.serve_args = serve_args
        self.auto_start = auto_start
        self.progress = progress
        self._ready: asyncio.Future[Client] | None = None
        self._attempted_at = 0.0
        self.daemon: Daemon | None = None

    def connect(self) -> None:
        """Start connecting in the background (again, if the last attempt failed or was reset).

        A failed attempt is not retried for RETRY_AFTER_S: until then requests get its error at
        once, instead of each keystroke starting a daemon that cannot start.
        """
        ready = self._ready
        failed = ready is not None and ready.done() and (ready.cancelled() or ready.exception() is not None)
        if ready is None or (failed and time.monotonic() - self._attempted_at > RETRY_AFTER_S):
            self._attempted_at = time.monotonic()
            self._ready = asyncio.ensure_future(self._connect())
            # Retrieved here, so that a failure nobody awaited yet is not reported as unhandled.
            self._ready.add_done_callback(lambda done: done.cancelled() or done.exception())

    async def client(self) -> Client:
        self.connect()
        # shield: a completion that is cancelled while it waits must not cancel the start itself.
        return await asyncio.shield(self._ready)

    async def reset(self) -> None:
        """The daemon went away: forget it, so that the next request finds (or starts) a new one."""
        ready, self._ready, self.daemon = self._ready, None, None
        if ready is not None and ready.done() and not ready.cancelled() and not ready.exception():
            await ready.result().aclose()

    async def close(self) -> None:
        if self._ready is not None and not self._ready.done():
            self._ready.cancel()
        await self.reset()

    async def _connect(self) -> Client:
        daemon = await asyncio.to_thread(_running_daemon)
        if daemon is None:
            if not self.auto_start:
                raise DaemonError("no lingcode daemon is running; start one with `lingcode serve`")
            daemon = await self._start()
        self.daemon = daemon
        return Client(daemon, timeout=120.0)

    async def _start(self) -> Daemon:
        loop = asyncio.get_running_loop()
        self.progress.begin("starting the lingcode daemon")

        def on_line(line: str) -> None:  # called on the starting thread
            loop.call_soon_threadsafe(self.progress.report, line)

        try:
            daemon = await asyncio.to_thread(ensure_daemon, self.serve_args, on_line)
        except DaemonError as exc:
            self.progress.end(f"the daemon did not start: {exc}")
            raise
        self.progress.end(f"lingcode daemon ready at {daemon.url} ({daemon.model})")
        return daemon


def _running_daemon() -> Daemon | None:
    daemon = read_daemon_file()
    return daemon if daemon is not None and is_healthy(daemon) else None


CONNECTION_ERRORS = (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)

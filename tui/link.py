"""The chat's connection to the daemon: found or started at launch, and found again after trouble.

The daemon may be starting (the chat started it, or another client did), restarting (a new port
and token in daemon.json), or gone. reconnect() waits for whichever daemon daemon.json names, and
starts one itself when none has shown up for a few seconds, as the LSP does.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Callable

import httpx

from lingcode.client import ErrorResponse, Client, Daemon, DaemonError, ensure_daemon, is_healthy, read_daemon_file

START_AFTER_S = 3.0  # no daemon.json for this long: start a daemon ourselves


class DaemonLink:
    def __init__(self, serve_args: list[str] | None = None, autostart: bool = True):
        self.serve_args = list(serve_args or [])
        self.autostart = autostart
        self.daemon: Daemon | None = None
        self.client: Client | None = None
        self._stale: list[Client] = []  # clients to close
        self.model_id = ""
        self.context_length = 0

    @property
    def connected(self) -> bool:
        return self.client is not None

    async def connect(self, on_progress: Callable[[str], None]) -> None:
        """The running daemon, or a new one (its log lines go to on_progress). Raises DaemonError."""
        daemon = await _in_background_thread(ensure_daemon, self.serve_args, on_progress)
        await self._use(daemon)

    async def reconnect(self, on_progress: Callable[[str], None], on_wait: Callable[[int], None]) -> None:
        """Wait until a daemon answers again, starting one if none appears; retries until cancelled."""
        await self.disconnect()
        missing_since: float | None = None
        loop = asyncio.get_running_loop()
        for attempt in itertools.count(1):
            on_wait(attempt)
            daemon = read_daemon_file()
            if daemon is not None:
                missing_since = None
                if await _in_background_thread(is_healthy, daemon):
                    try:
                        await self._use(daemon)
                        return
                    except (ErrorResponse, httpx.HTTPError, LookupError, ValueError) as e:  # still starting, or odd
                        on_progress(f"the daemon at {daemon.url} answered, but not yet usefully: {e}")
            elif self.autostart:
                missing_since = missing_since or loop.time()
                if loop.time() - missing_since >= START_AFTER_S:
                    try:
                        await self.connect(on_progress)
                        return
                    except DaemonError as e:
                        on_progress(f"could not start the daemon: {e}")
                        missing_since = None
            await asyncio.sleep(1.0)

    def mark_down(self) -> None:
        """Stop using the current daemon at once (a request to it failed); reconnect() finds one again."""
        if self.client is not None:
            self._stale.append(self.client)
            self.client = None

    async def disconnect(self) -> None:
        self.mark_down()
        while self._stale:
            await self._stale.pop().aclose()

    async def _use(self, daemon: Daemon) -> None:
        client = Client(daemon)
        try:
            listing = await client.get("/v1/models")
        except BaseException:
            await client.aclose()
            raise
        model = listing["data"][0]
        await self.disconnect()
        self.daemon, self.client = daemon, client
        self.model_id, self.context_length = model["id"], int(model.get("context_length") or 0)


def _in_background_thread(function, *args):
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
        except RuntimeError:  # the app has quit and its loop is closed: nobody waits any more
            pass

    threading.Thread(target=target, daemon=True, name=f"lingcode-chat-{function.__name__}").start()
    return future

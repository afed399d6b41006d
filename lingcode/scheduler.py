"""The scheduler: one engine slot, a bounded FIFO queue, and aborts that take effect at once.

At concurrency 1 the engine runs one request at a time. Others wait here in arrival order. A
request whose client goes away is dropped from the queue if it was waiting, or aborted in the
engine if it was running: no engine time is spent on work nobody will read.

When the daemon stops, shut_down() ends every running and waiting request with EngineUnavailable,
so that each client gets an error (an error event on a stream) rather than a normal-looking end,
and refuses new ones.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from contextlib import aclosing
from typing import AsyncIterator

from lingcode.engine import Engine, EngineUnavailable, SamplingParams, TokenChunk


class QueueFull(Exception):
    """More requests are waiting than the queue holds; the caller should retry later."""

    def __init__(self, depth: int):
        super().__init__(f"{depth} requests are already waiting for the model; retry shortly")
        self.depth = depth


class Scheduler:
    def __init__(self, engine: Engine, max_queue: int = 16):
        self.engine = engine
        self.max_queue = max_queue
        self._waiting: OrderedDict[str, asyncio.Future] = OrderedDict()
        self._running: str | None = None
        self._closing: str | None = None  # set by shut_down(): why requests are refused
        self._counters = dict.fromkeys(("submitted", "completed", "aborted", "dropped_while_queued", "rejected"), 0)

    async def generate(
        self, request_id: str, input_ids: list[int], params: SamplingParams
    ) -> AsyncIterator[TokenChunk]:
        """Wait for the slot, then stream the engine's chunks. Closing this iterator cancels."""
        if self._closing is not None:
            raise EngineUnavailable(self._closing)
        if len(self._waiting) >= self.max_queue:
            self._counters["rejected"] += 1
            raise QueueFull(len(self._waiting))
        self._counters["submitted"] += 1
        if not await self._acquire(request_id):
            if self._closing is not None:
                raise EngineUnavailable(self._closing)
            yield TokenChunk([], "abort")  # cancelled while waiting: it never reached the engine
            return
        finished = False
        try:
            # aclosing: when our consumer closes us, the engine's stream is closed too, which
            # aborts the request within a step instead of whenever the garbage collector runs.
            async with aclosing(self.engine.generate(request_id, input_ids, params)) as chunks:
                async for chunk in chunks:
                    if chunk.finish_reason == "abort" and self._closing is not None:
                        raise EngineUnavailable(self._closing)
                    finished = chunk.finish_reason not in (None, "abort")
                    yield chunk
                    if chunk.finish_reason is not None:
                        break
        finally:
            self._counters["completed" if finished else "aborted"] += 1
            self._release()

    async def cancel(self, request_id: str) -> bool:
        """Abort a running request or drop a waiting one; False if the id is unknown."""
        if request_id == self._running:
            await self.engine.abort(request_id)
            return True
        waiter = self._waiting.pop(request_id, None)
        if waiter is None:
            return False
        if not waiter.done():
            self._counters["dropped_while_queued"] += 1
            waiter.set_result(False)
        return True

    async def shut_down(self, reason: str) -> None:
        """Refuse new requests, and end the running and waiting ones with EngineUnavailable(reason)."""
        self._closing = reason
        for request_id in [self._running, *self._waiting]:
            if request_id is not None:
                await self.cancel(request_id)

    def stats(self) -> dict:
        return {**self._counters, "running": self._running, "queued": list(self._waiting), "max_queue": self.max_queue}

    # --- the slot -----------------------------------------------------------------------------

    async def _acquire(self, request_id: str) -> bool:
        """True once this request holds the slot; False if it was cancelled while waiting."""
        if self._running is None and not self._waiting:
            self._running = request_id
            return True
        waiter = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = waiter
        try:
            return await waiter  # resolved by _release when this request reaches the head of the line
        except asyncio.CancelledError:  # the client went away while waiting
            self._counters["dropped_while_queued"] += 1
            if waiter.done() and not waiter.cancelled() and waiter.result():
                self._release()  # the slot was handed over just as we were cancelled: pass it on
            raise
        finally:
            self._waiting.pop(request_id, None)

    def _release(self) -> None:
        self._running = None
        while self._waiting:
            request_id, waiter = self._waiting.popitem(last=False)
            if not waiter.done():
                self._running = request_id
                waiter.set_result(True)
                return

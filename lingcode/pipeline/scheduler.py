"""The scheduler: one engine slot, two priorities, bounded queues, and aborts that take effect at once.

At concurrency 1 the engine runs one request at a time. Others wait here, in arrival order within
their priority. A request whose client goes away is dropped from the queue if it was waiting, or
aborted in the engine if it was running: no engine time is spent on work nobody will read.

Editor completions come first. Someone is typing and waits for each keystroke's suggestion, while
a chat or an agent streams for seconds, so:
- a COMPLETION waits only for other completions: it goes ahead of every NORMAL request in the
  queue, and a running NORMAL request is preempted: aborted in the engine between two steps (within
  one decode step, or one prefill chunk), then queued again at the head of its line and resumed once
  the completions are done, from its prompt plus the tokens it had generated. Its client sees one
  unbroken stream. (We chose preempt-and-resume over letting completions only jump the queue: a
  queued completion would wait for a whole chat answer. The price: the engine has one KV cache, so
  the resumed request prefills its prompt again. A seeded sampled request that is preempted stays a
  valid sample but differs from an unpreempted run; greedy output is unaffected.)
- latest wins: a request submitted with a `latest_wins` key (the LSP sends the document) cancels
  the running or waiting request that holds the same key. The user has typed on; the old
  suggestion is stale.

When the daemon stops, shut_down() ends every running and waiting request with EngineUnavailable,
so that each client gets an error (an error event on a stream) rather than a normal-looking end,
and refuses new ones.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import OrderedDict
from contextlib import aclosing
from enum import IntEnum
from typing import AsyncIterator

from lingcode.engine import Engine, EngineUnavailable, SamplingParams, TokenChunk
from lingcode.pipeline import metrics


class Priority(IntEnum):
    COMPLETION = 0  # editor completions: served first, preempt NORMAL work between its steps
    NORMAL = 1  # chat, agents, the OpenAI routes


class QueueFull(Exception):
    """More requests are waiting than the queue holds; the caller should retry later."""

    def __init__(self, depth: int):
        super().__init__(f"{depth} requests are already waiting for the model; retry shortly")
        self.depth = depth


class Scheduler:
    def __init__(self, engine: Engine, max_queue: int = 16):
        self.engine = engine
        self.max_queue = max_queue
        self._waiting: dict[Priority, OrderedDict[str, asyncio.Future]] = {p: OrderedDict() for p in Priority}
        self._running: str | None = None
        self._running_priority = Priority.NORMAL
        self._preempting: set[str] = set()  # running requests told to yield the slot
        self._latest: dict[str, str] = {}  # latest_wins key -> the request that holds it
        self._counters = dict.fromkeys(
            (
                "submitted",
                "completed",
                "aborted",
                "dropped_while_queued",
                "rejected",
                "preempted",
                "resumed",
                "superseded",
            ),
            0,
        )
        self._closing: str | None = None  # set by shut_down(): why requests are refused

    def refusal(self) -> Exception | None:
        """What generate() would refuse a request with now (shutting down, a full queue), or None."""
        if self._closing is not None:
            return EngineUnavailable(self._closing)
        if self._queued() >= self.max_queue:
            return QueueFull(self._queued())
        return None

    async def generate(
        self,
        request_id: str,
        input_ids: list[int],
        params: SamplingParams,
        *,
        priority: Priority = Priority.NORMAL,
        latest_wins: str | None = None,
    ) -> AsyncIterator[TokenChunk]:
        """Wait for the slot, then stream the engine's chunks. Closing this iterator cancels."""
        if (refused := self.refusal()) is not None:
            if isinstance(refused, QueueFull):
                self._counters["rejected"] += 1
            raise refused
        self._counters["submitted"] += 1
        if latest_wins is not None:
            await self._supersede(latest_wins, request_id)
        finished = acquired = False
        waited_from = time.perf_counter()
        try:
            got_slot = await self._acquire(request_id, priority)
            if (trace := metrics.trace.get()) is not None:
                trace.add("queue", time.perf_counter() - waited_from)
            if not got_slot:
                if self._closing is not None:
                    raise EngineUnavailable(self._closing)
                yield TokenChunk([], "abort")  # cancelled while waiting: it never reached the engine
                return
            acquired = True  # from here on it ends completed or aborted; a dropped waiter is counted apart
            generated: list[int] = []
            cached = 0
            while True:
                # aclosing: when our consumer closes us, the engine's stream is closed too, which
                # aborts the request within a step instead of whenever the garbage collector runs.
                async with aclosing(self._segment(request_id, input_ids, generated, params)) as chunks:
                    async for chunk in chunks:
                        if chunk.finish_reason == "abort" and self._closing is not None:
                            raise EngineUnavailable(self._closing)
                        if chunk.finish_reason == "abort" and request_id in self._preempting:
                            break  # yielding the slot, not ending
                        if not generated:
                            cached = chunk.cached_tokens
                        generated += chunk.token_ids
                        finished = chunk.finish_reason not in (None, "abort")
                        # Usage describes the request as its client sent it, however many segments ran.
                        # (The chunk is this stream's own: set in place, not copied, once per chunk.)
                        chunk.prompt_tokens, chunk.cached_tokens = len(input_ids), cached
                        try:
                            yield chunk
                        except GeneratorExit:  # the consumer is done with it (a cut, a stop string, a disconnect):
                            self._forget(latest_wins, request_id)  # what comes next does not supersede it
                            raise
                        if chunk.finish_reason is not None:
                            return
                if not await self._resume_after_preemption(request_id, priority):
                    yield TokenChunk([], "abort", len(input_ids), cached)
                    return
        finally:
            self._preempting.discard(request_id)
            self._forget(latest_wins, request_id)
            if acquired:
                self._counters["completed" if finished else "aborted"] += 1
            if self._running == request_id:
                self._release()

    async def _resume_after_preemption(self, request_id: str, priority: Priority) -> bool:
        """The request yielded the slot between two steps: the completions run, then it takes the
        slot back. False if it was cancelled meanwhile."""
        if request_id not in self._preempting:
            return False  # a cancel came while it was yielding
        self._preempting.discard(request_id)
        self._counters["preempted"] += 1
        if self._waiting[Priority.COMPLETION]:  # (they may all have been cancelled meanwhile)
            self._release()
            if not await self._acquire(request_id, priority, front=True):
                return False
        self._counters["resumed"] += 1
        return True

    def _segment(
        self, request_id: str, input_ids: list[int], generated: list[int], params: SamplingParams
    ) -> AsyncIterator[TokenChunk]:
        """The engine stream for the request, or for its rest after a preemption."""
        if not generated:
            return self.engine.generate(request_id, input_ids, params)
        seed = None if params.seed is None else (params.seed + len(generated)) % 2**63
        rest = dataclasses.replace(params, max_tokens=params.max_tokens - len(generated), seed=seed)
        return self.engine.generate(request_id, input_ids + generated, rest)

    async def cancel(self, request_id: str) -> bool:
        """Abort a running request or drop a waiting one; False if the id is unknown."""
        if request_id == self._running:
            self._preempting.discard(request_id)  # a cancel wins over a preemption: no resume
            await self.engine.abort(request_id)
            return True
        for queue in self._waiting.values():
            waiter = queue.pop(request_id, None)
            if waiter is not None:
                if not waiter.done():
                    self._counters["dropped_while_queued"] += 1
                    waiter.set_result(False)
                return True
        return False

    async def shut_down(self, reason: str) -> None:
        """Refuse new requests, and end the running and waiting ones with EngineUnavailable(reason)."""
        self._closing = reason
        waiting = [request_id for queue in self._waiting.values() for request_id in queue]
        for request_id in [self._running, *waiting]:
            if request_id is not None:
                await self.cancel(request_id)

    def stats(self) -> dict:
        queued = [request_id for queue in self._waiting.values() for request_id in queue]
        return {**self._counters, "running": self._running, "queued": queued, "max_queue": self.max_queue}

    # --- the slot -----------------------------------------------------------------------------

    def _queued(self) -> int:
        return sum(len(queue) for queue in self._waiting.values())

    def _forget(self, key: str | None, request_id: str) -> None:
        if key is not None and self._latest.get(key) == request_id:
            del self._latest[key]

    async def _supersede(self, key: str, request_id: str) -> None:
        previous = self._latest.get(key)
        self._latest[key] = request_id
        if previous is not None and await self.cancel(previous):
            self._counters["superseded"] += 1

    async def _acquire(self, request_id: str, priority: Priority, front: bool = False) -> bool:
        """True once this request holds the slot; False if it was cancelled while waiting."""
        if self._running is None and not self._queued():
            self._running, self._running_priority = request_id, priority
            return True
        running = self._running
        if priority < self._running_priority and running is not None and running not in self._preempting:
            self._preempting.add(running)
            await self.engine.abort(running)  # it yields the slot between two steps, then waits to resume
        waiter = asyncio.get_running_loop().create_future()
        queue = self._waiting[priority]
        queue[request_id] = waiter
        if front:
            queue.move_to_end(request_id, last=False)
        try:
            return await waiter  # resolved by _release when this request reaches the head of the line
        except asyncio.CancelledError:  # the client went away while waiting
            self._counters["dropped_while_queued"] += 1
            if waiter.done() and not waiter.cancelled() and waiter.result():
                self._release()  # the slot was handed over just as we were cancelled: pass it on
            raise
        finally:
            queue.pop(request_id, None)

    def _release(self) -> None:
        self._running = None
        for priority, queue in self._waiting.items():  # COMPLETION first
            while queue:
                request_id, waiter = queue.popitem(last=False)
                if not waiter.done():
                    self._running, self._running_priority = request_id, priority
                    waiter.set_result(True)
                    return

"""Client disconnects: work nobody will read is cancelled at once, and streams always close their source.

Two places where a client can leave:
- before the response starts (a request waiting in the queue, or a non-streamed one being
  generated): Starlette does not notice, so `until_disconnected` races the work against the
  client's `http.disconnect` and cancels the work if the client goes first;
- while an SSE stream is being sent: Starlette cancels the sending task. `EventStream` then
  closes its event generator, shielded from that cancellation, so the generator's `finally`
  closes the text stream, which aborts the request in the engine within a step (instead of
  whenever the garbage collector finalizes a half-read generator).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

import anyio
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Send

T = TypeVar("T")


CLIENT_GONE = 499  # nginx's status for a client that left before its answer ended; logged, never sent


class ClientGone(Exception):
    """The client disconnected before the response started; its work was cancelled."""


async def _disconnected(request: Request) -> None:
    """Returns once the client has gone away (the body must have been read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await `work`; if the client disconnects first, cancel it, wait for its cleanup, raise ClientGone."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finished_first = task.done()
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.wait({task})  # its finally blocks abort the request; wait for them
    if not finished_first:
        if not task.cancelled():
            task.exception()  # retrieved: nobody is left to report it to
        raise ClientGone()
    return task.result()


async def aclose(iterator: AsyncIterator) -> None:
    """Close an async iterator even inside a cancelled scope (closing is what aborts the request)."""
    with anyio.CancelScope(shield=True):
        await iterator.aclose()


_closing: set[asyncio.Task] = set()  # strong references: the loop keeps only weak ones to tasks


def close_soon(iterator: AsyncIterator) -> None:
    """Close an async iterator in a task of its own, so the caller need not wait: closing a
    generation aborts it in the engine, which first finishes the step in flight."""
    task = asyncio.get_running_loop().create_task(aclose(iterator))
    _closing.add(task)
    task.add_done_callback(_closing.discard)


class EventStream(StreamingResponse):
    """A server-sent event stream whose generator is always closed, however the stream ends."""

    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[str]):
        super().__init__(events, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def stream_response(self, send: Send) -> None:
        try:
            await super().stream_response(send)
        finally:
            await aclose(self.body_iterator)

"""Streams and clients that leave: a turn's events answered as one JSON body or an SSE stream
(respond), a stream's head sent before its first events (StreamHead), and work nobody will read
cancelled at once (until_disconnected). server/serving.py's pipeline ends here.

A client can leave in two places, and its work is cancelled at once in both:
- before the response starts (a request waiting in the queue, or a non-streamed one being
  generated): Starlette does not notice, so `until_disconnected` cancels the work when the
  client's connection is lost (the daemon's HTTP protocol hands that over in the scope);
- while an SSE stream is being sent: `EventStream` sends it under `until_disconnected` too, which
  cancels the sending; it then closes its event generator, shielded from that cancellation, so
  the generator's `finally` closes the text stream, which aborts the request in the engine within
  a step (instead of whenever the garbage collector finalizes a half-read generator).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Coroutine
from contextvars import ContextVar
from typing import TYPE_CHECKING, TypeVar

import anyio

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from lingcode.engine import EngineError, on_handed_over
from lingcode.pipeline import metrics
from lingcode.pipeline.turns import TurnEnd, TurnEvent, TurnStart
from lingcode.server.errors import CLIENT_GONE, APIError, as_api_error
from lingcode.server.frameworks import DISCONNECTED, SEND_HEAD, ServingRequest

if TYPE_CHECKING:  # serving.py imports this module: a type only, not an import at run time
    from lingcode.server.serving import Shape

log = logging.getLogger("lingcode.server")

KEEP_ALIVE = b": keep-alive\n\n"  # an SSE comment: clients skip it, and their idle timers restart
KEEP_ALIVE_S = 10.0  # a stream's comments until its first token, at most this far apart (serve --stream-keep-alive)
T = TypeVar("T")


# --- clients that leave ------------------------------------------------------------------------


class ClientGone(Exception):
    """The client disconnected before the response started; its work was cancelled."""


async def _disconnected(request: Request) -> None:
    """Returns once the client has gone away (the body must have been read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def until_disconnected(request: Request, work: Coroutine[object, object, T]) -> T:
    """Await `work`; if the client disconnects first, cancel it, wait for its cleanup, raise ClientGone.

    The work runs in the caller's own task, which is cancelled if the client leaves. The daemon's
    HTTP protocol says so itself: the scope carries the connection's loss (server/frameworks.py), and
    nothing else runs. Under another ASGI server (the tests' TestClient) a watcher task awaits the
    client's `http.disconnect`, and starts before the work, so that nothing of the loop's runs
    once the work has handed the engine its request."""
    current = asyncio.current_task()
    finished = left = False

    def on_gone(gone: asyncio.Future) -> None:
        nonlocal left
        # a callback already queued when the work finished must not cancel what the caller does next
        if not finished and not gone.cancelled() and gone.exception() is None:
            left = True
            current.cancel()

    gone, watcher = request.scope.get(DISCONNECTED), None
    if gone is None:
        gone = watcher = asyncio.ensure_future(_disconnected(request))
    gone.add_done_callback(on_gone)
    try:
        if watcher is not None:
            await asyncio.sleep(0)  # the watcher takes its place before the work starts
        return await work
    except BaseException:
        if not left:
            raise
        current.uncancel()
        raise ClientGone() from None  # the work's own error, if any, has nobody to go to
    finally:
        finished = True
        gone.remove_done_callback(on_gone)
        if watcher is not None:
            watcher.cancel()
        work.close()  # a no-op once it ran; a client gone before it started: closed unstarted


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


# --- SSE streams and their head ----------------------------------------------------------------


class EventStream(StreamingResponse):
    """A server-sent event stream whose first frame goes out at once, with its head unless that went
    out already (StreamHead), and whose generator is always closed, however the stream ends."""

    media_type = "text/event-stream"
    HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

    def __init__(self, frames: AsyncIterator[str], head: StreamHead | None = None):
        super().__init__(frames, headers=self.HEADERS)
        self.head = head  # the stream's head, if it went out already (or is going: its task)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Every frame goes out from the handler's own task, guarded as the work before it was
        # (until_disconnected). Starlette's task group would start a second task a turn of the loop
        # after the first frame, while the engine waits for the loop to take its next chunk.
        try:
            first = await anext(self.body_iterator, "")
            if self.head is not None and self.head.task is not None:
                await self.head.task  # done long before: the engine has been computing since
            elif self.head is None or not self.head.sent:
                await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            if (trace := metrics.trace.get()) is not None:
                trace.mark("until_first_events")  # the first token's frames, handed to the socket
            await send({"type": "http.response.body", "body": first.encode(), "more_body": True})
        except BaseException:
            await aclose(self.body_iterator)
            raise
        try:
            await until_disconnected(Request(scope, receive), self.stream_response(send))
        except ClientGone:
            pass  # closing the frames (stream_response) aborted the request

    async def stream_response(self, send: Send) -> None:
        try:
            async for frame in self.body_iterator:
                await send({"type": "http.response.body", "body": frame.encode(), "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await aclose(self.body_iterator)


_SSE_HEAD = EventStream(iter(())).raw_headers  # what every stream's head carries


# The request's StreamHead while its prompt is built (Serving.prompt_ids opens it there)
stream_head: ContextVar[StreamHead | None] = ContextVar("lingcode_stream_head", default=None)


class StreamHead:
    """A stream's head (its status and headers), sent before its first events where it can be, so
    that the client reads it while the daemon and the engine work. Before it goes out an error is a
    proper HTTP error; after, an error frame in the stream.

    1. open(): once nothing can refuse the request any more (Serving.prompt_ids, for a stream whose
       prompt surely fits and that needs no grammar, to an engine that refuses nothing the daemon
       checked and whose first step takes every core: head_before_submit), the head alone, while
       the prompt is tokenized and the engine takes the request: the client reads it before that
       step, not during it.
    2. send_opening(), once the request is checked (its grammar compiled) and before the engine has
       it, to such an engine: the API's opening frames, with the head if 1 did not send it.
    3. handed_over(), from an engine whose first step leaves cores free (head_early): the opening,
       with the head, in a task that runs once the engine waits for its first step.
    4. Else the head goes with the first events (EventStream), in one write.
    From the head until the first events, keep_alive() sends a comment every keep_alive_s."""

    __slots__ = ("request", "keep_alive_s", "shape", "task", "sent", "opened", "_tokens")

    def __init__(self, request: ServingRequest, keep_alive_s: float = KEEP_ALIVE_S):
        self.request, self.keep_alive_s = request, keep_alive_s
        self.shape: Shape | None = None  # its frames: set by open() (1), send_opening() (2) or respond()
        self.task: asyncio.Task | None = None  # 3, sending the opening
        self.sent = False  # the head went out (1, 2 or 3)
        self.opened = False  # the opening went out (2 or 3)

    def __enter__(self) -> "StreamHead":
        self._tokens = (on_handed_over.set(self._hand_over), stream_head.set(self))
        return self

    def __exit__(self, *exc) -> None:
        on_handed_over.reset(self._tokens[0])
        stream_head.reset(self._tokens[1])

    async def open(self, shape: Shape) -> None:
        self.shape = shape
        await self._start()
        if (trace := metrics.trace.get()) is not None:
            trace.mark("until_head")
        if (send_head := self.request.scope.get(SEND_HEAD)) is not None:
            send_head()  # now, not held for the first body write (server/frameworks.py)

    async def send_opening(self, shape: Shape) -> None:
        self.shape = shape
        if not self.sent:
            await self._start()
        await self._write(shape.opening().encode())
        self.opened = True

    async def keep_alive(self) -> None:
        """A comment every keep_alive_s while the head is out and the first events are not: run as a
        task beside the wait for them, and cancelled when they come."""
        while True:
            await asyncio.sleep(self.keep_alive_s)
            if self.sent and (self.task is None or self.task.done()):  # never inside the opening's write
                await self._write(KEEP_ALIVE)

    def failed(self, error: APIError) -> Response:
        """The answer to a request that failed after open() and before its stream: the API's error
        frame, as its stream would have sent it."""
        log.error("a stream failed after its head went out: %s", error.message)
        return EventStream(iter((self.shape.error_frame(error) + self.shape.end_of_stream,)), self)

    def _hand_over(self) -> None:
        # called inside the engine's generate(); the task runs once the engine waits for its first step
        if self.shape is not None and self.task is None and not self.opened:
            self.task = asyncio.get_running_loop().create_task(self._send())

    async def _send(self) -> None:
        if not self.sent:
            await self._start()
        # the opening's write (even an empty one) sends the head the protocol holds for it
        await self._write(self.shape.opening().encode())
        self.opened = True

    async def _write(self, body: bytes) -> None:
        await self.request.send({"type": "http.response.body", "body": body, "more_body": True})

    async def _start(self) -> None:
        await self.request.send({"type": "http.response.start", "status": 200, "headers": _SSE_HEAD})
        self.sent = True


# --- stream or collect -------------------------------------------------------------------------


def error_after_start(exc: Exception) -> APIError:
    """What a client is told of `exc` once its stream has started: as_api_error's, or for a bug a
    plain 500 (the traceback goes to the daemon's log)."""
    error = as_api_error(exc)
    if error is None:
        log.exception("stream failed")
        error = APIError(500, "internal server error; the daemon's log has the details")
    return error


async def respond(
    request: ServingRequest, events: AsyncIterator[list[TurnEvent]], stream: bool, shape: Shape, head: StreamHead
) -> Response:
    """One JSON response (shape.whole) or an SSE stream (shape.opening + shape.frames per list)."""
    try:
        if stream:
            head.shape = shape
            keeper = asyncio.get_running_loop().create_task(head.keep_alive())
            try:
                first: list[TurnEvent] | Exception = await until_disconnected(request, _first(events))
            except Exception as exc:
                if not (head.sent or head.task) or isinstance(exc, ClientGone):
                    raise
                first = exc  # the response has started: the error goes in the stream
            finally:
                keeper.cancel()  # a comment goes out whole or not at all: the transport takes a write at once
            return EventStream(_frames(first, events, shape, opened=head.opened or head.task is not None), head)
        end = await until_disconnected(request, _collect(events))
        return JSONResponse(_shaped(shape.whole, end))
    except ClientGone:
        return Response(status_code=CLIENT_GONE)  # nobody reads it; uvicorn drops it
    except Exception as exc:
        await aclose(events)
        error = as_api_error(exc)
        if error is None:
            raise
        raise error from None


def _shaped(whole, end: TurnEnd) -> dict:
    started = time.perf_counter()
    body = whole(end)
    if (trace := metrics.trace.get()) is not None:
        trace.add("shape", time.perf_counter() - started)
    return body


async def _first(events: AsyncIterator[list[TurnEvent]]) -> list[TurnEvent]:
    try:
        return await anext(events)
    except BaseException:
        await aclose(events)
        raise


async def _collect(events: AsyncIterator[list[TurnEvent]]) -> TurnEnd:
    try:
        async for batch in events:
            if isinstance(batch[-1], TurnEnd):
                # The answer is whole. If a stop string or cut ended it, the engine is one step further
                # on: closing aborts that step, and nobody need wait for it.
                close_soon(events)
                return batch[-1]
    except BaseException:
        await aclose(events)
        raise
    raise EngineError("the turn ended without a finish reason")


async def _frames(
    first: list[TurnEvent] | Exception, events: AsyncIterator[list[TurnEvent]], shape: Shape, *, opened: bool
) -> AsyncIterator[str]:
    """The stream's frames from its first events (or the error that came instead), the opening
    first unless it went out with the head."""
    trace = metrics.trace.get() or metrics.Trace()
    clock = time.perf_counter
    try:
        if isinstance(first, Exception):
            raise first
        started = clock()
        start = next((event for event in first if isinstance(event, TurnStart)), None)
        out = ("" if opened else shape.opening(start)) + shape.frames(first)
        trace.add("shape", clock() - started)
        yield out
        batch = first
        while not isinstance(batch[-1], TurnEnd):
            batch = await anext(events)
            started = clock()
            out = shape.frames(batch)
            trace.add("shape", clock() - started)
            if out:
                yield out
    except Exception as exc:  # the response has started: report in the stream, in the API's shape
        yield shape.error_frame(error_after_start(exc))
    finally:
        close_soon(events)
    if shape.end_of_stream:
        yield shape.end_of_stream

"""Where lingcode overrides its web frameworks' internals, and what each override buys.

Every part of uvicorn, h11, Starlette or FastAPI that the daemon reaches past their public API is
here but one (the last below); pyproject.toml caps their versions and tests/test_frameworks.py
checks that the parts still exist.
  - uvicorn's HTTP/1.1 protocols (APIErrorH11Protocol, protocol_class()): broken requests answered
    in the API's shape, bounded request heads, timeouts and a connection cap, a response's head sent
    with its first body bytes, and each request's arrival and disconnection in its scope;
  - uvicorn's Server loop (DaemonServer): woken by a stop signal instead of 10 times a second, and
    open streams ended with an error a client can see before uvicorn waits for them;
  - Starlette's Request and FastAPI's routing (ServingRequest, RequestRoute, DirectRoutes): a handler
    may send its response's head before it returns, and an API's POST goes straight to its route,
    past dependency solving, the exception layers and the router's walk.
  - Starlette's StreamingResponse (server/streaming.py's EventStream, beside the stream logic it
    drives): every frame sent from the handler's own task.

The protocols. uvicorn parses requests with httptools (C, the faster; lingcode's default) or h11.
Either refuses a request whose framing it cannot trust (a Content-Length that is not a number, two
that disagree, a header line that is no header) before any ASGI app sees it, and uvicorn then
answers a plain-text "Invalid HTTP request received." Here the answer is the API's own: a 400
(or h11's status hint, such as 431 for headers too large) in OpenAI's error shape, Anthropic's
for a request line naming /v1/messages, with the parser's reason. The connection is closed, as before:
after broken framing nothing later on it can be read safely. These requests never reach the
app, so they are in neither the access log nor /metrics; uvicorn logs a warning for each.

Each response's head also goes out with its first body bytes, in one write (HeadWithBody):
uvicorn writes them apart, and on loopback each write wakes the client, so a streamed answer's
first token waited for a second wake-up. A stream that opens before it has anything to send sends
its head alone (SEND_HEAD, in the scope: server/streaming.py's StreamHead).

The connection layer's limits (SECURITY.md, guarantee 22): a request's line and headers are at
most HEAD_BYTES (h11's max_incomplete_event_size; counted here for httptools, whose parser has no
limit and copies a growing header over and over), else a 431; they must be in within
HEAD_TIMEOUT_S of the request's first byte (a new connection's first request: of its opening),
else a 408 and the connection is closed; between requests uvicorn's keep-alive timeout closes an
idle one. None of these runs while a response is going out, so a long stream is never cut.
Connections past uvicorn's limit_concurrency get a 503 for their request, in the API's shape, and
the connections opened before them are served on (uvicorn would refuse everyone's requests, in
plain text); past twice the limit a connection is closed as it opens, so the daemon's file
descriptors stay bounded however fast they come.

Each request's scope carries when its first bytes were read (ARRIVED_AT, perf_counter's clock):
the request's trace starts there, so parsing it and starting its task count as the daemon's. It
also carries its connection's loss (DISCONNECTED, a future), so the daemon learns that a client left
without a task of its own awaiting the next ASGI message (server/streaming.py: until_disconnected).
"""

from __future__ import annotations

import asyncio
import http
import sys
import time
from urllib.parse import urlsplit

import h11
import uvicorn
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from lingcode.server.errors import RETRY_AFTER_S, APIError

REQUEST_LINE_BYTES = 8192
HEAD_BYTES = 64 * 1024  # a request's line and headers, at most
HEAD_TIMEOUT_S = 30.0  # from a request's first byte until its head is all in
LINGER_S = 5.0  # after a refusal, what the client still sends is read and dropped this long at most
ARRIVED_AT = "lingcode.arrived_at"  # the scope's key: when the request's first bytes were read
DISCONNECTED = "lingcode.disconnected"  # the scope's key: a future, done once the connection is lost
SEND_HEAD = "lingcode.send_head"  # the scope's key: sends a response head held for the first body write now
_CONTINUE = b"HTTP/1.1 100 "  # an interim answer: the client waits for it before sending the body


# --- uvicorn's HTTP/1.1 protocols --------------------------------------------------------------------


class HeadWithBody:
    """One response's transport: holds the response head until the first body write, and sends both
    as one (everything else passes through). Every response sends its body right after its head:
    a stream's head goes with its opening frames, even empty ones (server/streaming.py). A response with no
    body write (HEAD) sends its head when it completes, a closed connection before it closes."""

    __slots__ = ("_transport", "_head", "_held")

    def __init__(self, transport):
        self._transport = transport
        self._head: bytes | None = None
        self._held = False  # the head was seen (held, then sent)

    def write(self, data: bytes) -> None:
        if not self._held and not data.startswith(_CONTINUE):
            self._held, self._head = True, data
            return
        if self._head is not None:
            data, self._head = self._head + data, None
        self._transport.write(data)

    def flush(self) -> None:
        if self._head is not None:
            self._transport.write(self._head)
            self._head = None

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str):
        return getattr(self._transport, name)


class DaemonCycles:
    """Both protocols' part: each new request's cycle writes through a HeadWithBody, whose held
    head goes out when the response completes (or when SEND_HEAD is called), and its scope gets
    the request's arrival and its connection's loss. Each protocol sets `arrived_at` and calls
    head_started() when a request's first bytes come, calls hold_heads() where its parser starts a
    cycle (h11: handle_events; httptools: on_headers_complete), read_on() where a request's body is
    all in, and path() for the path of the request being read. Here too: the connection cap and
    the head's timeout (the module's docstring)."""

    arrived_at: float | None = None
    lost: asyncio.Future  # done once the connection is lost
    head_timer: asyncio.TimerHandle | None = None  # while a request's head is awaited
    refused = False  # answered with a refusal: what comes now is dropped

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.cap = self.limit_concurrency
        self.limit_concurrency = None  # uvicorn's own check off: the cap is applied per connection (connection_made)

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self.lost = self.loop.create_future()
        if self.cap is not None and len(self.connections) > self.cap:
            if len(self.connections) > 2 * self.cap:
                transport.close()
                return
            self.app = self.over_capacity
        self.head_timer = self.loop.call_later(HEAD_TIMEOUT_S, self.head_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.head_done()
        if not self.lost.done():
            self.lost.set_result(None)

    def head_started(self) -> None:
        if self.head_timer is None:
            self.head_timer = self.loop.call_later(HEAD_TIMEOUT_S, self.head_timed_out)

    def head_done(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def head_timed_out(self) -> None:
        self.head_timer = None
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:  # a response is going out: never cut it
            self.head_started()
            return
        if self.arrived_at is None:  # not a byte of a request came
            self.transport.close()
            return
        error = APIError(
            408,
            f"the request's head did not arrive within {HEAD_TIMEOUT_S:g} s of its first byte",
            code="request_timeout",
        )
        self.logger.warning(error.message)  # as uvicorn logs the requests its parser refuses
        self.refuse(error)

    def refuse(self, error: APIError) -> None:
        """Answer the request being read with `error`, in the shape of the API it names, and close.

        A socket closed with bytes still unread resets the connection, and the client, still
        sending, would lose the answer: the answer is followed by our EOF, and the connection
        closes once the client closes its side (or after LINGER_S), what it sends meanwhile dropped."""
        body = error.response(self.path()).body
        head = (
            f"HTTP/1.1 {error.status} {http.HTTPStatus(error.status).phrase}\r\ncontent-type: application/json"
            f"\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n"
        )
        self.refused = True
        self.head_done()
        self.transport.write(head.encode("ascii") + body)
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        self.transport.write_eof()
        self.loop.call_later(LINGER_S, self.transport.close)

    async def over_capacity(self, scope, receive, send) -> None:
        """The app of a connection opened past the cap: every request on it gets a 503, and it closes."""
        error = APIError(
            503,
            f"the daemon has {self.cap} connections open, as many as it serves: close idle ones, or retry",
            code="too_many_connections",
            headers={"Retry-After": RETRY_AFTER_S, "Connection": "close"},
        )
        await error.response(scope.get("path", ""))(scope, receive, send)

    def hold_heads(self, before) -> None:
        """Give a cycle that the parser just started a HeadWithBody transport (before its task runs)."""
        cycle = self.cycle
        if cycle is not None and cycle is not before and not isinstance(cycle.transport, HeadWithBody):
            self.head_done()
            cycle.transport = HeadWithBody(cycle.transport)
            cycle.scope[ARRIVED_AT] = self.arrived_at
            cycle.scope[DISCONNECTED] = self.lost
            cycle.scope[SEND_HEAD] = cycle.transport.flush

    def read_on(self) -> None:
        """A request's body is all in: read on, so that its client leaving is seen while the app works
        (a body past uvicorn's high-water mark paused reading, and uvicorn reads on only once the app
        awaits another ASGI message). A request pipelined behind it pauses reading again."""
        self.flow.resume_reading()

    def on_response_complete(self) -> None:
        transport = getattr(self.cycle, "transport", None)
        if isinstance(transport, HeadWithBody):
            transport.flush()
        super().on_response_complete()


class APIErrorH11Protocol(DaemonCycles, H11Protocol):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.request_line = b""  # the current request's first line, as received: its path picks the error shape

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return
        if self.conn.their_state is h11.IDLE and not self.conn.trailing_data[0]:  # a new request starts here
            self.arrived_at = time.perf_counter()
            self.request_line = data.split(b"\n", 1)[0][:REQUEST_LINE_BYTES]
            self.head_started()
        super().data_received(data)

    def handle_events(self) -> None:
        before = self.cycle
        reading = before is not None and before.more_body
        super().handle_events()
        self.hold_heads(before)
        cycle = self.cycle
        if cycle is not None and not cycle.more_body and (reading or cycle is not before):
            self.read_on()  # the body's end came in these events

    def send_400_response(self, msg: str) -> None:
        # uvicorn answers from its `except h11.RemoteProtocolError:` and drops h11's reason: it is
        # the exception being handled
        refusal = sys.exception()
        if not isinstance(refusal, h11.RemoteProtocolError):
            refusal = None
        status = refusal.error_status_hint if refusal is not None and 400 <= refusal.error_status_hint < 500 else 400
        if status == 431:  # past max_incomplete_event_size: the head
            self.refuse(head_too_large())
            return
        reason = f": {refusal}" if refusal is not None and str(refusal) else ""
        self.refuse(APIError(status, f"the request is not valid HTTP/1.1{reason}", code="invalid_http_request"))

    def path(self) -> str:
        parts = self.request_line.split()
        if len(parts) < 2:
            return ""
        try:
            return urlsplit(parts[1].decode("ascii")).path
        except (UnicodeDecodeError, ValueError):
            return ""


def head_too_large() -> APIError:
    return APIError(
        431,
        f"the request's line and headers are over the limit of {HEAD_BYTES} bytes",
        code="request_headers_too_large",
    )


def protocol_class() -> type:
    """httptools' protocol where httptools is installed, else h11's; both answer refusals our way."""
    try:
        import httptools
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return APIErrorH11Protocol

    class APIErrorHttpToolsProtocol(DaemonCycles, HttpToolsProtocol):
        read_at = 0.0
        head_bytes = 0  # read since the request being read began, until its head is all in
        in_body = False  # between a request's head and its end

        def data_received(self, data: bytes) -> None:
            if self.refused:
                return
            self.read_at = time.perf_counter()  # the parser says below whether a request starts in it
            if self.in_body or self.head_bytes + len(data) <= HEAD_BYTES:
                if not self.in_body:
                    self.head_bytes += len(data)
                super().data_received(data)
                return
            # The parser takes a header of any size (copying it as it grows): it gets what fits the
            # limit, and if the head has not ended in it, the request is refused.
            room = HEAD_BYTES - self.head_bytes
            self.head_bytes = HEAD_BYTES
            super().data_received(data[:room])
            if self.refused:
                return
            if not self.in_body and self.head_bytes >= HEAD_BYTES:
                error = head_too_large()
                self.logger.warning(error.message)
                self.refuse(error)
                return
            self.data_received(data[room:])

        def on_message_begin(self) -> None:
            self.arrived_at = self.read_at
            self.head_started()
            super().on_message_begin()

        def on_headers_complete(self) -> None:
            self.in_body, self.head_bytes = True, 0
            before = self.cycle
            super().on_headers_complete()
            self.hold_heads(before)

        def on_message_complete(self) -> None:
            self.in_body, self.head_bytes = False, 0
            super().on_message_complete()
            if not self.pipeline:  # the body of the request being answered, not of one queued behind it
                self.read_on()

        def send_400_response(self, msg: str) -> None:
            # uvicorn answers from its `except httptools.HttpParserError:` and drops the parser's
            # reason: it is the exception being handled
            refusal = sys.exception()
            reason = f": {refusal}" if isinstance(refusal, httptools.HttpParserError) and str(refusal) else ""
            self.refuse(APIError(400, f"the request is not valid HTTP/1.1{reason}", code="invalid_http_request"))

        def path(self) -> str:
            try:
                return urlsplit(self.url.decode("ascii")).path
            except (AttributeError, UnicodeDecodeError, ValueError):
                return ""

    return APIErrorHttpToolsProtocol


# --- uvicorn's Server loop -------------------------------------------------------------------------


class DaemonServer(uvicorn.Server):
    """uvicorn looks for a stop 10 times a second, and the daemon looked 20 times more: an idle
    daemon woke 30 times a second, and on the CPU each wake-up takes a core from the engine's
    step. Here a stop signal wakes the loop itself; the one tick left (the Date header, once a
    second) also catches a signal that did not wake it (another thread took it)."""

    def __init__(self, config, scheduler, ready) -> None:
        super().__init__(config)
        self._scheduler, self._ready = scheduler, ready
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets=sockets)
        if self.started and not self.should_exit:
            self._ready()

    def handle_exit(self, sig, frame) -> None:  # a signal handler: on the loop's thread, between two bytecodes
        super().handle_exit(sig, frame)
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)

    async def main_loop(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        while not await self.on_tick(0):  # tick 0: uvicorn refreshes the Date header
            try:
                await asyncio.wait_for(self._stop.wait(), 1.0)
            except TimeoutError:
                pass
        # Before uvicorn waits for open responses to end: the scheduler ends them at once, each
        # with an error a client can see (a 503, or an error event then [DONE] on a stream),
        # instead of their being cut when the graceful-shutdown timeout runs out.
        await self._scheduler.shut_down("the daemon is shutting down; retry once it is back")


# --- Starlette's requests and FastAPI's routing ------------------------------------------------------


class ServingRequest(Request):
    """A request whose handler can send its response's head before it returns the response (a
    stream's, once the engine has the request: StreamHead)."""

    def __init__(self, scope: Scope, receive: Receive, send: Send):
        super().__init__(scope, receive, send)
        self.send = send


class RequestRoute(APIRoute):
    """A route whose endpoint takes a ServingRequest and reads its own body (Serving.handle):
    FastAPI's dependency solving would find nothing to inject, yet runs before the handler on
    every request (docs/engine-notes.md). The route answers its own APIErrors (the handler raises
    them before any response starts), so it needs none of the app's exception layers (DirectRoutes);
    an unexpected error still reaches the app's outermost handler, a 500. The route stays in the
    OpenAPI schema."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        endpoint = self.endpoint

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            try:
                response = await endpoint(ServingRequest(scope, receive, send))
            except APIError as exc:
                response = exc.response(scope["path"])
            await response(scope, receive, send)

        self.app = app

    def get_route_handler(self):
        return self.endpoint


class DirectRoutes:
    """The innermost of lingcode's middlewares: a POST to an API's own path (a RequestRoute without
    path parameters) goes straight to its route, past the exception layers, the router's walk over
    every route and the route's own dispatch, which the framework runs before each handler. Every
    other request goes on through the app as before (and 404s and 405s are still the router's)."""

    def __init__(self, app: ASGIApp, routes: list[BaseRoute]):
        self.app = app
        self.routes = routes  # the app's live list: the APIs install their routes after this middleware
        self._direct: dict[str, ASGIApp] = {}
        self._seen = -1  # how many routes there were when _direct was built

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            if len(self.routes) != self._seen:
                self._direct = {
                    r.path: r.app for r in self.routes if isinstance(r, RequestRoute) and not r.param_convertors
                }
                self._seen = len(self.routes)
            route = self._direct.get(scope["path"])
            if route is not None:
                await route(scope, receive, send)
                return
        await self.app(scope, receive, send)

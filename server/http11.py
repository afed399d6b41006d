"""The daemon's HTTP/1.1 protocol: uvicorn's, with the API's own error shape for broken requests.

uvicorn parses requests with httptools (C, the faster; lingcode's default) or h11. Either refuses a
request whose framing it cannot trust (a Content-Length that is not a number, two
that disagree, a header line that is no header) before any ASGI app sees it, and uvicorn then
answers a plain-text "Invalid HTTP request received." Here the answer is the API's own: a 400
(or h11's status hint, such as 431 for headers too large) in OpenAI's error shape, Anthropic's
for a request line naming /v1/messages, with the parser's reason. The connection is closed, as before:
after broken framing nothing later on it can be read safely. These requests never reach the
app, so they are in neither the access log nor /metrics; uvicorn logs a warning for each.

Each response's head also goes out with its first body bytes, in one write (HeadWithBody):
uvicorn writes them apart, and on loopback each write wakes the client, so a streamed answer's
first token waited for a second wake-up. A stream that opens before it has anything to send sends
its head alone (SEND_HEAD, in the scope: server/serving.py's StreamHead).

Each request's scope carries when its first bytes were read (ARRIVED_AT, perf_counter's clock):
the request's trace starts there, so parsing it and starting its task count as the daemon's. It
also carries its connection's loss (DISCONNECTED, a future), so the daemon learns that a client left
without a task of its own awaiting the next ASGI message (server/serving.py: until_disconnected).
"""

from __future__ import annotations

import asyncio
import sys
import time
from urllib.parse import urlsplit

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from lingcode.server.errors import APIError

REQUEST_LINE_BYTES = 8192
ARRIVED_AT = "lingcode.arrived_at"  # the scope's key: when the request's first bytes were read
DISCONNECTED = "lingcode.disconnected"  # the scope's key: a future, done once the connection is lost
SEND_HEAD = "lingcode.send_head"  # the scope's key: sends a response head held for the first body write now
_CONTINUE = b"HTTP/1.1 100 "  # an interim answer: the client waits for it before sending the body


class HeadWithBody:
    """One response's transport: holds the response head until the first body write, and sends both
    as one (everything else passes through). Every response sends its body right after its head:
    a stream's head goes with its opening frames, even empty ones (server/serving.py). A response with no
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
    the request's arrival and its connection's loss. Each protocol sets `arrived_at` when a
    request's first bytes come, calls hold_heads() where its parser starts a cycle (h11:
    handle_events; httptools: on_headers_complete), and read_on() where a request's body is all in."""

    arrived_at: float | None = None
    lost: asyncio.Future  # done once the connection is lost

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self.lost = self.loop.create_future()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if not self.lost.done():
            self.lost.set_result(None)

    def hold_heads(self, before) -> None:
        """Give a cycle that the parser just started a HeadWithBody transport (before its task runs)."""
        cycle = self.cycle
        if cycle is not None and cycle is not before and not isinstance(cycle.transport, HeadWithBody):
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
        if self.conn.their_state is h11.IDLE and not self.conn.trailing_data[0]:  # a new request starts here
            self.arrived_at = time.perf_counter()
            self.request_line = data.split(b"\n", 1)[0][:REQUEST_LINE_BYTES]
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
        reason = f": {refusal}" if refusal is not None and str(refusal) else ""
        error = APIError(status, f"the request is not valid HTTP/1.1{reason}", code="invalid_http_request")
        response = error.response(self.path())
        headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
        events = (h11.Response(status_code=status, headers=headers), h11.Data(data=response.body), h11.EndOfMessage())
        for event in events:
            self.transport.write(self.conn.send(event))
        self.transport.close()

    def path(self) -> str:
        parts = self.request_line.split()
        if len(parts) < 2:
            return ""
        try:
            return urlsplit(parts[1].decode("ascii")).path
        except (UnicodeDecodeError, ValueError):
            return ""


def _refusal_response(status: int, reason: str, path: str) -> bytes:
    """The whole HTTP/1.1 answer to a refused request, in the error shape of the API at `path`."""
    error = APIError(status, f"the request is not valid HTTP/1.1{': ' + reason if reason else ''}", code="invalid_http_request")
    body = error.response(path).body
    head = (f"HTTP/1.1 {status} Bad Request\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n")  # fmt: skip
    return head.encode("ascii") + body


def protocol_class() -> type:
    """httptools' protocol where httptools is installed, else h11's; both answer refusals our way."""
    try:
        import httptools
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return APIErrorH11Protocol

    class APIErrorHttpToolsProtocol(DaemonCycles, HttpToolsProtocol):
        read_at = 0.0

        def data_received(self, data: bytes) -> None:
            self.read_at = time.perf_counter()  # the parser says below whether a request starts in it
            super().data_received(data)

        def on_message_begin(self) -> None:
            self.arrived_at = self.read_at
            super().on_message_begin()

        def on_headers_complete(self) -> None:
            before = self.cycle
            super().on_headers_complete()
            self.hold_heads(before)

        def on_message_complete(self) -> None:
            super().on_message_complete()
            if not self.pipeline:  # the body of the request being answered, not of one queued behind it
                self.read_on()

        def send_400_response(self, msg: str) -> None:
            # uvicorn answers from its `except httptools.HttpParserError:` and drops the parser's
            # reason: it is the exception being handled
            refusal = sys.exception()
            try:
                path = urlsplit(self.url.decode("ascii")).path
            except (AttributeError, UnicodeDecodeError, ValueError):
                path = ""
            reason = str(refusal) if isinstance(refusal, httptools.HttpParserError) else ""
            self.transport.write(_refusal_response(400, reason, path))
            self.transport.close()

    return APIErrorHttpToolsProtocol

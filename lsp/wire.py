"""Reading LSP messages from stdin so that no input can stop `lingcode lsp`.

pygls' own loop (pygls.io_.run_async) trusts what it reads; tests/test_lsp_wire.py sends it each
of these. A Content-Length of a terabyte is allocated (MemoryError: the server exits). After a
header it cannot read, every later message is lost: it looks for `Content-Length` only at the
start of a line, and the next header follows the unread body on that same line. A request it
cannot structure is never answered, so its client waits forever.

Here instead:

- A message is at most MAX_MESSAGE_BYTES. A larger Content-Length is refused and logged, and the
  body that follows it, if any, is skipped as it comes (never held) until the next header. Header
  lines are read at most MAX_HEADER_BYTES at a time; longer ones are skipped piece by piece.
- `Content-Length: N` ends a line, wherever that line starts: after garbage, the next message is
  found again. A JSON body cannot fake one, since JSON allows no raw line break inside a string.
- Only JSON-RPC 2.0 objects reach pygls. Anything else is logged and dropped; a request among
  them that has an id gets an error answer. So does one with an integer longer than Python's
  int-string limit (4,300 digits), which json.loads would otherwise refuse before the id is known.

The protocol has no way to skip a body whose Content-Length is larger than what was sent but under
the limit: the messages after it are read as the rest of that body, up to its length.
"""

from __future__ import annotations

import json
import logging
import re
import reprlib
from collections.abc import Callable
from typing import BinaryIO

from pygls.exceptions import JsonRpcException, JsonRpcInternalError, JsonRpcInvalidParams, JsonRpcInvalidRequest
from pygls.protocol import JsonRPCProtocol

# Well over any source file an editor sends whole (didOpen), far under what a machine can hold.
MAX_MESSAGE_BYTES = 32 * 1024 * 1024
MAX_HEADER_BYTES = 4096
CONTENT_LENGTH = re.compile(rb"Content-Length:[ \t]*(\d+)\r?\n\Z", re.IGNORECASE)
# Any other header (Content-Type) is ignored; a Content-Length that is not a number is skipped input.
OTHER_HEADER = re.compile(rb"(?!content-length:)[A-Za-z][A-Za-z0-9-]*:[^\r\n]*\r?\n\Z", re.IGNORECASE)
BLANK = (b"\r\n", b"\n")

log = logging.getLogger("lingcode.lsp")

Report = Callable[[str], None]


class MessageReader:
    """Message bodies, one at a time, from a blocking binary stream (run it on a thread).

    `report` is called (on the reading thread) with each problem met: input skipped, a message refused.
    """

    def __init__(self, stream: BinaryIO, report: Report, max_bytes: int = MAX_MESSAGE_BYTES):
        self.stream, self.report, self.max_bytes = stream, report, max_bytes

    def read(self) -> bytes | None:
        """The next message's body; None once the input has ended."""
        length = self._headers()
        if length is None:
            return None
        body = self.stream.read(length)
        return body if len(body) == length else None  # shorter: the input ended inside the body

    def _headers(self) -> int | None:
        """The Content-Length of the next message whose headers are complete; None at the end of input."""
        length, skipped = None, 0
        while (read := self._line()) is not None:
            line, size = read
            if line in BLANK and length is not None:
                self._skipped(skipped)
                return length
            match = CONTENT_LENGTH.search(line)
            if match:
                skipped += size - len(match[0])  # what came before the header on its line
                length = self._allowed(match[1])
            elif not OTHER_HEADER.fullmatch(line):
                skipped += size
        self._skipped(skipped)
        return None

    def _allowed(self, digits: bytes) -> int | None:
        length = int(digits)  # lines are kept to MAX_HEADER_BYTES: never more digits than int() takes (4300)
        if length > self.max_bytes:
            self.report(f"a message of {length} bytes is over the limit of {self.max_bytes} bytes; it is skipped")
            return None
        return length

    def _line(self) -> tuple[bytes, int] | None:
        """The next line and its size; a line too long to keep is kept by its end only (where a
        header may follow garbage). None at the end of input."""
        line = self.stream.readline(MAX_HEADER_BYTES)
        size = len(line)
        while line and not line.endswith(b"\n"):
            piece = self.stream.readline(MAX_HEADER_BYTES)
            if not piece:
                break
            size += len(piece)
            line = (line + piece)[-MAX_HEADER_BYTES:]
        return (line, size) if size else None

    def _skipped(self, size: int) -> None:
        if size:
            self.report(f"skipped {size} bytes of input that were not an LSP message (no Content-Length header)")


def dispatch(protocol: JsonRPCProtocol, body: bytes, report: Report) -> None:
    """Hand one message body to pygls if it is a JSON-RPC 2.0 message; else report it, and answer it
    if it is a request with an id (its client would otherwise wait forever)."""
    too_long: list[int] = []  # the digit counts of integers int() refuses (read as null meanwhile)

    def parse_int(literal: str) -> int | None:
        try:
            return int(literal)
        except ValueError:
            too_long.append(len(literal))
            return None

    try:
        data = json.loads(body, parse_int=parse_int)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        report(f"a message that is not JSON was dropped: {exc}")
        return
    if too_long:
        problem = f"a message with an integer of {max(too_long)} digits was dropped"
        report(problem)
        _answer_error(protocol, data, JsonRpcInvalidParams(f"{problem}: no LSP field takes a number that long"))
        return
    if not isinstance(data, dict) or data.get("jsonrpc") != "2.0":
        report("a message that is not a JSON-RPC 2.0 object was dropped")
        _answer_error(protocol, data, JsonRpcInvalidRequest())
        return
    try:
        message = protocol.structure_message(data)
    except JsonRpcException as exc:
        report(f"a message that does not fit its method ({reprlib.repr(data.get('method'))}) was dropped: {exc}")
        _answer_error(protocol, data, exc)
        return
    except Exception as exc:  # whatever cattrs raises on odd input: the server stays up
        report(f"a message that could not be read was dropped: {exc!r}")
        _answer_error(protocol, data, JsonRpcInternalError())
        return
    try:
        protocol.handle_message(message)  # a handler's failure is answered by pygls itself
    except Exception as exc:  # a bug here must not end the session (exit's SystemExit still passes)
        log.exception("handling a message failed")
        report(f"a message could not be handled: {exc!r}")


def _answer_error(protocol: JsonRPCProtocol, data: object, error: JsonRpcException) -> None:
    """An error response to a request whose id can be read; notifications and responses get none."""
    if not (isinstance(data, dict) and "method" in data and type(data.get("id")) in (int, str)):
        return
    # pygls has no public way to answer a request it never structured; _send_response is how it
    # answers its own errors (pygls is pinned below 3 in pyproject.toml).
    protocol._send_response(data["id"], None, error.to_response_error())

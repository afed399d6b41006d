"""`initialize` answered before pygls is imported.

lsprotocol's types and pygls take ~0.3 s or more to import on 2 cores, the LSP's whole budget for
its first answer. This module imports nothing heavy: it reads the first message, and if that is
an `initialize` request it answers at once with the server's capabilities. The server (pygls)
then starts and handles the same message, so that its state is what it would have been, with
its own answer held back (HeldBack) and compared: a difference is logged, and
tests/test_lsp.py checks there is none for real editors' capabilities. Anything else that comes
first (another message, malformed input) is left for the server's reader, byte for byte (Replay).
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import BinaryIO

from lingcode import __version__

MAX_FIRST_BYTES = 1 << 20  # an initialize is a few KB; anything larger goes the normal way
HEADER = re.compile(rb"([A-Za-z][A-Za-z0-9-]*):[ \t]*([^\r\n]*)\r?\n\Z")
ENCODINGS = ("utf-8", "utf-16", "utf-32")

log = logging.getLogger("lingcode.lsp")


@dataclass
class First:
    raw: bytes  # every byte read from the input
    body: bytes | None  # the message's body, when it was a whole framed message
    answered_id: object = None  # the id of the initialize answered here, else None


def answer_initialize(stdin: BinaryIO, stdout: BinaryIO) -> First:
    """Read the first message; answer it here if it is an initialize request."""
    raw, length = b"", None
    while True:
        line = stdin.readline(4096)
        raw += line
        if not line.endswith(b"\n"):
            return First(raw, None)  # the end of input, or a line longer than any header
        if line in (b"\r\n", b"\n") and length is not None:
            break
        match = HEADER.fullmatch(line)
        if match is None:
            return First(raw, None)
        if match[1].lower() == b"content-length":
            if not match[2].strip().isdigit() or int(match[2]) > MAX_FIRST_BYTES:
                return First(raw, None)
            length = int(match[2])
    body = stdin.read(length)
    raw += body
    if len(body) != length:
        return First(raw, None)
    try:
        message = json.loads(body)
    except ValueError:
        return First(raw, body)
    if not (
        isinstance(message, dict)
        and message.get("jsonrpc") == "2.0"
        and message.get("method") == "initialize"
        and isinstance(message.get("id"), (int, str))
        and isinstance(message.get("params"), dict)
    ):
        return First(raw, body)
    send(stdout, {"jsonrpc": "2.0", "id": message["id"], "result": initialize_result(message["params"])})
    return First(raw, body, message["id"])


def initialize_result(params: dict) -> dict:
    """What pygls answers for lingcode's server (its features, incremental sync), in the encoding
    pygls picks: the client's first one that it supports, else UTF-16."""
    capabilities = params.get("capabilities") if isinstance(params.get("capabilities"), dict) else {}
    general = capabilities.get("general") if isinstance(capabilities.get("general"), dict) else {}
    offered = general.get("positionEncodings") if isinstance(general.get("positionEncodings"), list) else []
    encoding = next((e for e in offered if e in ENCODINGS), "utf-16")
    sync = {"openClose": True, "change": 2, "save": True}
    document = capabilities.get("textDocument") if isinstance(capabilities.get("textDocument"), dict) else {}
    client_sync = document.get("synchronization") if isinstance(document.get("synchronization"), dict) else {}
    for key in ("willSave", "willSaveWaitUntil"):  # named (false: no handler here) when the client names them
        if client_sync.get(key) is not None:
            sync[key] = False
    return {
        "capabilities": {
            "positionEncoding": encoding,
            "textDocumentSync": sync,
            "completionProvider": {},
            "executeCommandProvider": {"commands": []},
            "inlineCompletionProvider": {},
            "workspace": {"workspaceFolders": {"supported": True, "changeNotifications": True}, "fileOperations": {}},
        },
        "serverInfo": {"name": "lingcode", "version": __version__},
    }


def send(stdout: BinaryIO, message: dict) -> None:
    body = json.dumps(message, separators=(",", ":")).encode()
    stdout.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
    stdout.flush()


class Replay:
    """A stream that gives `head` first, then the rest of `stream` (readline and read, as MessageReader reads)."""

    def __init__(self, head: bytes, stream: BinaryIO):
        self.head, self.at, self.stream = head, 0, stream

    def readline(self, limit: int = -1) -> bytes:
        if self.at >= len(self.head):
            return self.stream.readline(limit)
        end = self.head.find(b"\n", self.at)
        end = len(self.head) if end < 0 else end + 1
        if limit > 0:
            end = min(end, self.at + limit)
        line, self.at = self.head[self.at : end], end
        if line.endswith(b"\n") or (limit > 0 and len(line) >= limit):
            return line
        return line + self.stream.readline(limit - len(line) if limit > 0 else -1)

    def read(self, size: int = -1) -> bytes:
        part = self.head[self.at :] if size < 0 else self.head[self.at : self.at + size]
        self.at += len(part)
        if size < 0:
            return part + self.stream.read()
        return part + (self.stream.read(size - len(part)) if len(part) < size else b"")


class HeldBack:
    """pygls' writer, holding back pygls' answer to the initialize answered early (and comparing)."""

    def __init__(self, writer, first: First, sent: dict):
        self.writer, self.first, self.sent = writer, first, sent

    def write(self, data: bytes):
        if self.first.answered_id is not None:
            try:
                message = json.loads(data.split(b"\r\n\r\n", 1)[-1])
            except ValueError:
                message = None
            if isinstance(message, dict) and message.get("id") == self.first.answered_id and "method" not in message:
                self.first.answered_id = None
                if message.get("result") != self.sent:
                    log.error("initialize was answered early with %s; pygls answers %s", self.sent, message)
                return None
        return self.writer.write(data)

    def close(self):
        return self.writer.close()

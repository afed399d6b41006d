"""`lingcode lsp` survives malformed and over-size input on stdin (lsp/wire.py).

A real `lingcode lsp --no-start` process is fed raw bytes: headers that are not numbers, bodies
that are not JSON or not JSON-RPC, requests that do not fit their method, unknown methods, a
20 MB message, a Content-Length of a petabyte, a message over the 32 MiB limit that is really
sent, and a 20 MB line with no header at all. After each kind of garbage it must still answer a
valid request, and at the end it must still be running, then exit when told to. No daemon is
needed: `initialize` and `lingcode/stats` never wait for one.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from lingcode.lsp.wire import MAX_MESSAGE_BYTES

TIMEOUT_S = 120  # a bound for a busy CI machine, not a timing assertion
BIG = 20 * 1024 * 1024
METHOD_NOT_FOUND, INVALID_REQUEST, INVALID_PARAMS = -32601, -32600, -32602


def frame(message: object) -> bytes:
    body = json.dumps(message).encode()
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


class RawLsp:
    """The server's stdin as bytes; its stdout parsed into messages (by a thread, so writes never block on it)."""

    def __init__(self, home):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "lingcode", "lsp", "--no-start"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=open(home / "lsp.log", "wb"),
            env={**os.environ, "LINGCODE_HOME": str(home)},
        )
        self.log_path = home / "lsp.log"
        self.received: queue.Queue[dict | None] = queue.Queue()
        self.notifications: list[dict] = []
        self.ids = iter(range(1, 1_000_000))
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        out = self.process.stdout
        while True:
            length = None
            while (line := out.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            if not line or length is None:
                self.received.put(None)  # the server closed its stdout
                return
            self.received.put(json.loads(out.read(length)))

    def send(self, raw: bytes) -> None:
        self.process.stdin.write(raw)
        self.process.stdin.flush()

    def notify(self, method: str, params: object = None) -> None:
        self.send(frame({"jsonrpc": "2.0", "method": method, "params": params}))

    def request(self, method: str, params: object = None) -> dict:
        request_id = next(self.ids)
        self.send(frame({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}))
        return self.answer(request_id)

    def answer(self, request_id: int | str) -> dict:
        """The response to request_id; notifications on the way are kept in self.notifications."""
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            try:
                message = self.received.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"no answer to request {request_id} within {TIMEOUT_S} s:\n{self.log()}")
            assert message is not None, f"the server closed its output (exit code {self.process.poll()}):\n{self.log()}"
            if "method" in message and "id" not in message:
                self.notifications.append(message)
            elif message.get("id") == request_id:
                return message

    def stats(self) -> dict:
        answer = self.request("lingcode/stats")
        assert "result" in answer, answer
        return answer["result"]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def logged(self) -> list[str]:
        return [n["params"]["message"] for n in self.notifications if n["method"] == "window/logMessage"]


@pytest.fixture
def lsp(tmp_path):
    server = RawLsp(tmp_path)
    yield server
    if server.process.poll() is None:
        server.process.kill()
    server.process.wait()


def initialize(lsp: RawLsp) -> dict:
    answer = lsp.request("initialize", {"processId": None, "rootUri": None, "capabilities": {}})
    assert "result" in answer and answer["result"]["serverInfo"]["name"] == "lingcode", answer
    lsp.notify("initialized", {})
    return answer


def did_open(uri: str, text: str) -> bytes:
    document = {"uri": uri, "languageId": "python", "version": 1, "text": text}
    return frame({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": document}})


def test_garbage_before_initialize_is_skipped_and_initialize_is_answered(lsp):
    lsp.send(b"Content-Length: 99999999999999999999\r\n\r\n{}")  # far over any limit: refused, not allocated
    lsp.send(b"Content-Length: twelve\r\n\r\n{}")  # not a number
    lsp.send(b"Content-Length: 5\r\n\r\nhello")  # not JSON
    lsp.send(b"\x00\xff" * 1000 + b"\r\n\r\n")  # not even a header
    initialize(lsp)
    assert lsp.process.poll() is None
    log = lsp.log()
    assert "over the limit of 33554432 bytes" in log and "not JSON" in log and "were not an LSP message" in log


def test_malformed_messages_are_dropped_answered_where_they_can_be_and_the_server_goes_on(lsp):
    initialize(lsp)
    lsp.send(b"Content-Length: 0\r\n\r\n")  # an empty body
    lsp.send(b'Content-Length: 7\r\n\r\n{"a": [')  # JSON cut short
    lsp.send(frame([1, 2, 3]))  # JSON, but a batch: no JSON-RPC 2.0 message
    lsp.send(frame({"hello": "world"}))
    lsp.send(frame({"jsonrpc": "1.0", "id": "old", "method": "initialize"}))
    assert lsp.answer("old")["error"]["code"] == INVALID_REQUEST  # a request with an id is answered
    lsp.send(frame({"jsonrpc": "2.0", "id": 41, "method": "textDocument/completion", "params": 7}))
    assert lsp.answer(41)["error"]["code"] == INVALID_PARAMS
    lsp.send(frame({"jsonrpc": "2.0", "id": 42, "method": ["not", "a", "name"]}))
    assert "error" in lsp.answer(42)
    lsp.notify("lingcode/no-such-notification", {"x": 1})  # ignored, as LSP says
    assert lsp.request("lingcode/no-such-method")["error"]["code"] == METHOD_NOT_FOUND
    lsp.send(frame({"jsonrpc": "2.0", "id": 999, "result": None}))  # a response to nothing we sent
    nested = b"[" * 100_000 + b"]" * 100_000  # deeper than the JSON parser's recursion limit
    lsp.send(b"Content-Length: %d\r\n\r\n" % len(nested) + nested)
    assert lsp.stats()["documents"] == []  # still answering
    logged = lsp.logged()  # the editor's log says what was dropped (after initialize it may)
    assert sum("not JSON" in m for m in logged) >= 3 and sum("not a JSON-RPC 2.0" in m for m in logged) >= 3
    assert lsp.process.poll() is None


def test_huge_messages_and_lengths_do_not_stop_it(lsp):
    initialize(lsp)
    # 20 MB, under the limit: a real document, opened and kept.
    big_text = "x = 1\n" * (BIG // 6)
    lsp.send(did_open("file:///tmp/big.py", big_text))
    # 20 MB that is not JSON: read, dropped.
    lsp.send(b"Content-Length: %d\r\n\r\n" % BIG + b"{" * BIG)
    # A petabyte announced, a few bytes sent: refused at once, then the next header is found again.
    lsp.send(b"Content-Length: 1000000000000000\r\n\r\n" + b'{"jsonrpc": "2.0"}')
    # Over the limit and really sent: skipped as it comes, never held.
    lsp.send(did_open("file:///tmp/too-big.py", "y" * (MAX_MESSAGE_BYTES + 1)))
    # 20 MB on one line, no header at all.
    lsp.send(b"garbage " * (BIG // 8) + b"\r\n")
    documents = [d["uri"] for d in lsp.stats()["documents"]]
    assert documents == ["file:///tmp/big.py"]
    logged = "\n".join(lsp.logged())
    assert "a message of 1000000000000000 bytes is over the limit" in logged
    assert logged.count("over the limit of 33554432 bytes") == 2 and "not JSON" in logged
    assert lsp.process.poll() is None

    # And it still ends when told to.
    assert lsp.request("shutdown")["result"] is None
    lsp.notify("exit")
    lsp.process.stdin.close()
    assert lsp.process.wait(timeout=TIMEOUT_S) == 0


def test_an_integer_past_pythons_limit_is_answered_with_an_error(lsp):
    """json.loads refuses an int of over 4,300 digits; the request was dropped unanswered (issue 18, item 5)."""
    initialize(lsp)
    digits = "9" * 5000
    for request_id, params in (
        (51, f'{{"textDocument": {{"uri": "file:///a.py"}}, "position": {{"line": {digits}, "character": 0}}}}'),
        ("s", f"[{digits}]"),
    ):
        body = (
            f'{{"jsonrpc": "2.0", "id": {json.dumps(request_id)}, "method": "textDocument/completion", '
            f'"params": {params}}}'.encode()
        )
        lsp.send(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        error = lsp.answer(request_id)["error"]
        assert error["code"] == INVALID_PARAMS and "5000 digits" in error["message"]
    body = f'{{"jsonrpc": "2.0", "method": "x", "params": {digits}}}'.encode()
    lsp.send(b"Content-Length: %d\r\n\r\n" % len(body) + body)
    assert lsp.stats()["documents"] == [] and lsp.process.poll() is None  # a notification: logged, not answered
    assert sum("an integer of 5000 digits" in m for m in lsp.logged()) == 3


def test_a_fifo_or_device_named_by_an_unopened_document_never_blocks_it(lsp, tmp_path):
    """Completion in an unopened document reads it from disk: only a regular file, bounded, on a thread.

    pygls' own read blocked the message loop on a FIFO for ever: nothing was answered any more,
    not even shutdown, and the process stayed after stdin closed (issue 18, item 8).
    """
    initialize(lsp)
    fifo = tmp_path / "pipe.py"
    os.mkfifo(fifo)
    regular = tmp_path / "unopened.py"
    regular.write_text("def add(a, b):\n    return a + b\n")
    position = {"line": 0, "character": 3}
    for method in ("textDocument/completion", "textDocument/inlineCompletion"):
        for uri in (fifo.as_uri(), "file:///dev/zero", "file:///dev/stdin", regular.as_uri()):
            params = {"textDocument": {"uri": uri}, "position": position}
            if method == "textDocument/inlineCompletion":
                params["context"] = {"triggerKind": 1}
            answer = lsp.request(method, params)
            assert "result" in answer and answer["result"]["items"] == [], (uri, answer)
    logged = "\n".join(lsp.logged())
    assert f"cannot complete in {fifo.as_uri()}" in logged and "not a regular file" in logged
    assert f"cannot complete in {regular.as_uri()}" not in logged  # read; then no daemon to ask (--no-start)
    assert lsp.request("shutdown")["result"] is None
    lsp.notify("exit")
    lsp.process.stdin.close()
    assert lsp.process.wait(timeout=TIMEOUT_S) == 0


# --- fuzzing the message loop -----------------------------------------------------------------------

METHODS = ["initialize", "initialized", "textDocument/didOpen", "textDocument/didChange", "textDocument/didSave",
           "textDocument/didClose", "textDocument/completion", "textDocument/inlineCompletion", "lingcode/stats",
           "$/cancelRequest", "$/setTrace", "workspace/didChangeConfiguration", "textDocument/hover"]  # fmt: skip
# LSP notifications: handled as such even when a client sends one with an id (pygls does), so not answered.
NOTIFICATIONS = {
    "initialized",
    "textDocument/didOpen",
    "textDocument/didChange",
    "textDocument/didSave",
    "textDocument/didClose",
    "$/cancelRequest",
    "$/setTrace",
    "workspace/didChangeConfiguration",
}
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)


@st.composite
def messages(draw, uris: list[str]) -> tuple[bytes, str | None]:
    """One framed message (or garbage), and the id of a request the server must answer, if any."""
    kind = draw(st.sampled_from(["lsp", "lsp", "lsp", "json", "garbage", "short", "huge-int"]))
    if kind == "garbage":  # bytes with no header: skipped
        return draw(st.binary(max_size=200)), None
    if kind == "json":  # any JSON value, framed
        return frame(draw(JSON)), None
    method = draw(st.sampled_from(METHODS) | st.text(max_size=12))
    uri = draw(st.sampled_from(uris) | st.text(max_size=12))
    position = {"line": draw(st.integers(-5, 2**33)), "character": draw(st.integers(-5, 2**33))}
    document = {
        "uri": uri,
        "languageId": "python",
        "version": draw(st.integers(-5, 2**33)),
        "text": draw(st.text(max_size=40)),
    }
    change = {"range": {"start": position, "end": position}, "text": draw(st.text(max_size=10))}
    params = draw(
        st.sampled_from(
            [
                {"textDocument": document, "position": position, "context": {"triggerKind": draw(st.integers(-1, 3))}},
                {"textDocument": document, "contentChanges": [change, {"text": "x = 1\n"}]},
                {"id": draw(st.integers(0, 100) | st.text(max_size=3))},
            ]
        )
        | JSON
    )
    request_id = draw(st.uuids()).hex
    message = {"jsonrpc": "2.0", "method": method, "params": params}
    if draw(st.booleans()):
        message["id"] = request_id
    body = json.dumps(message).encode()
    if kind == "huge-int":  # over Python's int-string limit: read as no number at all
        body = body.replace(b'"jsonrpc"', b'"big": %s, "jsonrpc"' % (b"7" * 4400), 1)
    if kind == "short":  # announces less than it sends: the rest is skipped as garbage
        return b"Content-Length: %d\r\n\r\n" % draw(st.integers(0, len(body))) + body, None
    must_answer = "id" in message and method not in NOTIFICATIONS
    return b"Content-Length: %d\r\n\r\n" % len(body) + body, request_id if must_answer else None


def test_fuzzed_messages_are_answered_or_ignored_never_hang_or_kill_it(tmp_path):
    """Random JSON, random JSON-RPC for the methods the server has (and none), documents on a FIFO,
    a device and stdin itself, garbage and short lengths: after each batch the server still answers,
    and every request it could read got its answer. Not shrunk on failure (minutes of re-runs): the
    server's log in the failure says what it met."""
    fifo = tmp_path / "pipe.py"
    os.mkfifo(fifo)
    (tmp_path / "a.py").write_text("import os\n")
    uris = [
        fifo.as_uri(),
        (tmp_path / "a.py").as_uri(),
        "file:///dev/zero",
        "file:///dev/stdin",
        (tmp_path / "absent.py").as_uri(),
        "untitled:Untitled-1",
    ]
    lsp = RawLsp(tmp_path)
    answers: dict[str, dict] = {}

    def wait_for(ids: set[str]) -> None:
        deadline = time.monotonic() + TIMEOUT_S
        while not ids <= set(answers):
            try:
                message = lsp.received.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"no answer to {sorted(ids - set(answers))} within {TIMEOUT_S} s:\n{lsp.log()}")
            assert message is not None, f"the server closed its output (exit code {lsp.process.poll()}):\n{lsp.log()}"
            if isinstance(message.get("id"), str):
                answers[message["id"]] = message

    @given(batch=st.lists(messages(uris), min_size=1, max_size=5))
    @settings(
        max_examples=120, deadline=None, database=None, suppress_health_check=list(HealthCheck), phases=[Phase.generate]
    )
    def run(batch):
        probe = f"probe-{len(answers)}"
        probe_message = {"jsonrpc": "2.0", "id": probe, "method": "lingcode/stats", "params": None}
        lsp.send(b"".join(raw for raw, _ in batch) + frame(probe_message))
        wait_for({probe} | {request_id for _, request_id in batch if request_id is not None})
        assert "result" in answers[probe]

    try:
        initialize(lsp)
        run()
        assert lsp.process.poll() is None
        assert lsp.request("shutdown")["result"] is None
        lsp.notify("exit")
        lsp.process.stdin.close()
        assert lsp.process.wait(timeout=TIMEOUT_S) == 0
    finally:
        if lsp.process.poll() is None:
            lsp.process.kill()
        lsp.process.wait()

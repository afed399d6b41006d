"""The embedded engine in a process of its own, behind the same Engine interface.

In one process the daemon's event loop and the engine's worker thread share the GIL: every chunk
the loop processes (detokenize, stop strings, parsers, an SSE frame) is time the worker's Python
between two GPU steps may wait for it, and with drafting on a GPU that slows the engine itself
(docs/engine-notes.md). Here the engine runs in a child (`python -m lingcode.engine.local.process`).
The daemon runs its GPU engine so (LINGCODE_ENGINE_PROCESS=1 or 0 says otherwise); on the CPU the
step's threads hold no GIL while they compute, and the hop would cost the first token for nothing.

The two talk over two socket pairs, each message a length-prefixed pickle:

    requests  daemon -> child   ("generate", rid, keep, new_ids, params, grammar)   ("close",)
              child -> daemon   ("ready", info, stats, head_early) or ("failed", text)   then per request:
                                ("chunk", rid, chunk)..., and ("last", rid, chunk, stats) or ("error", rid, exception, stats)
    control   daemon -> child   ("abort", rid)   ("close",)

A request's ids go as the number of leading ids it shares with the request before (`keep`) and
the rest: each side keeps the last ids sent, so a conversation's next turn sends its new tokens,
not its whole history again (pickled both ways, that grew with the context).

The child has no event loop and no hand-over between threads: its main thread reads a request,
runs it (LocalEngine.run) and writes its chunks to the socket as they come, then reads the next;
a thread of its own reads the control socket, so an abort reaches a running request within a
step. A grammar (a per-request matcher, not picklable) goes as its source and is
compiled again in the child. The last chunk comes with the engine's counters after the request was accounted, so
stats() is never behind a finished request. A request closed early is aborted and its stream
waited for, as the in-process engine's generate() does: the engine is free when it returns.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import pickle
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import replace

from lingcode.engine import (
    EngineError,
    ModelInfo,
    SamplingParams,
    TokenChunk,
    common_prefix,
    handed_over,
    merge_chunks,
)

_HEADER = struct.Struct("!I")


def _pack(message: tuple) -> bytes:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(data)) + data


def _recv_blocking(sock: socket.socket) -> tuple:
    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            part = sock.recv(n - len(data))
            if not part:
                raise EOFError("the engine process closed its end")
            data += part
        return data

    (size,) = _HEADER.unpack(exactly(_HEADER.size))
    return pickle.loads(exactly(size))


# --- the daemon's side ------------------------------------------------------------------------------


class EngineProcess:
    """An Engine whose model runs in a child process (start() loads it there)."""

    def __init__(
        self,
        process: subprocess.Popen,
        sock: socket.socket,
        control: socket.socket,
        info: ModelInfo,
        stats: dict,
        head_early: bool,
    ):
        self.process, self.info = process, info
        self._sock, self._control = sock, control
        self._buffer = b""
        self._streams: dict[str, asyncio.Queue] = {}
        self._stats = stats
        self._running: str | None = None
        self._reading = False
        self._gone: str | None = None  # why the child is no longer there
        self._sent: list[int] = []  # the last request's ids, as the child holds them too
        self._ids_sent = 0  # ids that went to the child, over all requests
        self.head_early = head_early  # as the engine in the child says (LocalEngine.head_early)
        self.head_before_submit = not head_early  # as LocalEngine's

    @classmethod
    def start(cls, model_path, **load_args) -> "EngineProcess":
        """Start the child and wait until it has loaded the model (raises EngineError with its reason)."""
        ours, theirs = socket.socketpair()
        control, their_control = socket.socketpair()
        args = json.dumps({"model_path": str(model_path), **load_args})
        fds = (theirs.fileno(), their_control.fileno())
        process = subprocess.Popen(
            [sys.executable, "-m", "lingcode.engine.local.process", *map(str, fds), args], pass_fds=fds
        )
        theirs.close()
        their_control.close()
        try:
            kind, payload, *ready = _recv_blocking(ours)
        except (EOFError, OSError):
            process.wait()
            ours.close()
            control.close()
            raise EngineError(f"the engine process exited with status {process.returncode} while loading") from None
        if kind != "ready":
            process.wait()
            ours.close()
            control.close()
            raise EngineError(payload)
        ours.setblocking(False)
        return cls(process, ours, control, payload, *ready)

    # --- the Engine interface -------------------------------------------------------------------

    async def generate(
        self, request_id: str, input_ids: list[int], params: SamplingParams
    ) -> AsyncIterator[TokenChunk]:
        if self._gone is not None:
            raise EngineError(self._gone)
        loop = asyncio.get_running_loop()
        if not self._reading:
            loop.add_reader(self._sock.fileno(), self._on_readable)
            self._reading = True
        grammar = params.constraint.source if params.constraint is not None else None
        queue: asyncio.Queue = asyncio.Queue()
        self._streams[request_id] = queue
        self._running = request_id
        finished = False
        try:
            # Only the ids past what the last request shared with this one: the child keeps them too.
            # Set before the send, whose first write is never put off: once any of it is out, the
            # child reads it whole (or the engine is lost).
            ids = list(input_ids)
            keep = common_prefix(self._sent, ids)
            self._sent = ids
            self._ids_sent += len(ids) - keep
            sendable = params if params.constraint is None else replace(params, constraint=None)
            data = _pack(("generate", request_id, keep, ids[keep:], sendable, grammar))
            # Sent at once where the socket takes it whole (between requests it is empty), and only
            # the rest through sock_sendall, whose coroutine costs more than the send on every first token.
            try:
                sent = self._sock.send(data)
            except BlockingIOError:
                sent = 0
            if sent < len(data):
                await loop.sock_sendall(self._sock, data[sent:])
            if self.head_early:
                handed_over()
            while True:
                kind, *rest = await queue.get()
                if kind == "chunk":
                    yield rest[0]
                    continue
                finished = True
                if kind == "error":
                    raise rest[0]
                yield rest[0]  # the last chunk
                return
        finally:
            if not finished and self._gone is None:
                # Closed early: abort it, and wait until the engine is free. A wait that is cancelled
                # leaves the drain running (shielded), so the stream is still read to its end.
                await asyncio.shield(self._abort_and_drain(request_id, queue))
            else:
                self._streams.pop(request_id, None)

    async def abort(self, request_id: str) -> None:
        if request_id in self._streams and self._gone is None:
            try:
                self._control.sendall(_pack(("abort", request_id)))  # a few bytes: never blocks
            except OSError:
                pass  # the child is gone: its stream ends with the error _lost() queued

    def stats(self) -> dict:
        return {**self._stats, "running": self._running, "process": self.process.pid, "ids_sent": self._ids_sent}

    async def close(self) -> None:
        if self._reading:
            asyncio.get_running_loop().remove_reader(self._sock.fileno())
            self._reading = False
        if self.process.poll() is None:
            try:  # the control socket aborts a running request; the request socket ends the child
                self._control.sendall(_pack(("close",)))
                self._sock.setblocking(True)
                self._sock.sendall(_pack(("close",)))
            except OSError:
                pass
            try:
                await asyncio.to_thread(self.process.wait, 30)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self._sock.close()
        self._control.close()

    # --- the child's messages ------------------------------------------------------------------------

    async def _abort_and_drain(self, request_id: str, queue: asyncio.Queue) -> None:
        try:
            await self.abort(request_id)
            while (await queue.get())[0] == "chunk":
                pass
        finally:
            self._streams.pop(request_id, None)

    def _on_readable(self) -> None:
        try:
            data = self._sock.recv(1 << 20)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._lost(f"the engine process exited (status {self.process.poll()})")
            return
        self._buffer += data
        while len(self._buffer) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self._buffer)
            if len(self._buffer) < _HEADER.size + size:
                break
            message = pickle.loads(self._buffer[_HEADER.size : _HEADER.size + size])
            self._buffer = self._buffer[_HEADER.size + size :]
            kind, request_id, *rest = message
            if kind in ("last", "error"):
                self._stats = rest[-1]
                rest = rest[:-1]
                if self._running == request_id:
                    self._running = None
            queue = self._streams.get(request_id)
            if queue is not None:
                queue.put_nowait((kind, *rest))

    def _lost(self, why: str) -> None:
        self._gone, self._running = why, None
        asyncio.get_running_loop().remove_reader(self._sock.fileno())
        self._reading = False
        for queue in self._streams.values():
            queue.put_nowait(("error", EngineError(why)))


# --- the child -------------------------------------------------------------------------------------


class _Stream:
    """One request's chunks, from the thread that runs it straight to the socket: the first at
    once, later ones merged and at most every interval (as ChunkChannel hands them to a loop), the
    last one, or the error, with the engine's counters once the worker is done with the request."""

    def __init__(self, request_id: str, send, interval_s: float, aborted: set[str], stop):
        self.request_id, self.send, self.interval_s = request_id, send, interval_s
        self.aborted, self.stop = aborted, stop
        self.pending: list[TokenChunk] = []
        self.sent_at: float | None = None
        self.end: TokenChunk | BaseException | None = None

    def put(self, item: TokenChunk | BaseException) -> None:  # the thread that runs the request
        if self.request_id in self.aborted:  # an abort that came before the request was registered
            self.stop(self.request_id)
        if not isinstance(item, TokenChunk) or item.finish_reason is not None:
            self.end = item  # sent by finish(), with the counters
            return
        self.pending.append(item)
        now = time.perf_counter()
        if self.sent_at is None or now - self.sent_at >= self.interval_s:
            self.send(("chunk", self.request_id, merge_chunks(self.pending)))
            self.pending, self.sent_at = [], now

    def finish(self, stats: dict) -> None:  # once the request is over and accounted for
        end = self.end if self.end is not None else EngineError("the engine ended a request without a finish reason")
        if isinstance(end, TokenChunk):
            self.send(("last", self.request_id, merge_chunks(self.pending + [end]), stats))
            return
        if self.pending:
            self.send(("chunk", self.request_id, merge_chunks(self.pending)))
        self.send(("error", self.request_id, _sendable(end), stats))


def _serve(engine, sock: socket.socket, control: socket.socket) -> None:
    """Run requests as the daemon sends them, one at a time, on this thread; until it says close."""
    from lingcode.agent.grammar import constraint

    aborted: set[str] = set()  # ids the daemon aborted: the running one, or the next, whose abort came first
    threading.Thread(target=_control, args=(engine, control, aborted), daemon=True, name="lingcode-control").start()

    def send(message: tuple) -> None:
        sock.sendall(_pack(message))

    last: list[int] = []  # the daemon's last request's ids (EngineProcess._sent)
    for message in _messages(sock):
        if message[0] == "close":
            break
        _, request_id, keep, new_ids, params, grammar = message
        del last[keep:]  # in place: a conversation's next turn costs its new ids, not a copy of all
        last += new_ids
        aborted.intersection_update((request_id,))  # requests run one at a time: any other id is over
        stream = _Stream(request_id, send, engine.chunk_interval(params), aborted, engine.stop)
        try:
            if request_id in aborted:  # aborted before it started
                stream.put(TokenChunk([], "abort"))
            else:
                if grammar is not None:
                    params = replace(params, constraint=constraint(engine.info.tokenizer, *grammar))
                engine.run(request_id, last, params, stream.put)  # it keeps a copy (_admit): `last` stays as sent
        except Exception as exc:  # noqa: BLE001 - every failure goes back to the request's caller
            stream.put(exc)
        stream.finish(engine.stats())
        engine.tidy()  # after the last chunk went out, while the daemon answers
    asyncio.run(engine.close())


def _control(engine, control: socket.socket, aborted: set[str]) -> None:
    """The control socket's reader: an abort stops the running request within a step."""
    for message in _messages(control):
        if message[0] == "abort":
            aborted.add(message[1])
            engine.stop(message[1])  # a no-op until the request runs: its first chunk stops it then
        else:  # close: end what runs, so that the request socket's close is read soon
            if (running := engine.stats()["running"]) is not None:
                engine.stop(running)
            return


def _messages(sock: socket.socket):
    """The daemon's messages on one socket, until it closes its end."""
    while True:
        try:
            yield _recv_blocking(sock)
        except (EOFError, OSError):
            return


def _sendable(exc: BaseException) -> BaseException:
    """The exception itself where it pickles, else an EngineError that says what it was."""
    try:
        pickle.dumps(exc)
        return exc
    except Exception:  # noqa: BLE001
        return EngineError(f"{type(exc).__name__}: {exc}")


def main(argv: list[str]) -> int:
    sock, control = socket.socket(fileno=int(argv[0])), socket.socket(fileno=int(argv[1]))
    args = json.loads(argv[2])
    # The daemon decides when the engine stops (Ctrl+C reaches the whole process group); if the
    # daemon dies, so does the child (Linux: PR_SET_PDEATHSIG), instead of holding the GPU.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform == "linux":
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)
    try:
        from lingcode.agent import grammar
        from lingcode.engine.local import load_engine

        engine = load_engine(args.pop("model_path"), **args)
        grammar.prepare(engine.info.tokenizer, engine.info.eos_token_ids)  # not in the first constrained request
    except Exception as exc:  # noqa: BLE001 - said to the daemon in one line
        sock.sendall(_pack(("failed", f"{type(exc).__name__}: {exc}")))
        return 1
    sock.sendall(_pack(("ready", engine.info, engine.stats(), engine.head_early)))
    _serve(engine, sock, control)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""`lingcode bench daemon`: what the daemon adds to the engine, measured from a real client.

The same requests go to the engine directly (in this process) and through a running daemon
(`lingcode serve` in a process of its own, streamed over SSE), alternating request by request,
with and without drafts. Two real clients read the daemon by default: httpx and aiohttp; their
own cost differs by more than a millisecond a request, which is the client's, not the daemon's.
`--clients ...,openai` adds the official openai SDK (its typed chunks over httpx2, the fork of
httpx it ships on since 3.x): what an SDK script meets. `--clients ...,socket` adds a reader with
no HTTP library (one `recv` per event): what is left against it is the daemon's, and what the
stream's events cost any client. Each client's requests are paired with direct ones of their own,
next to them in the round, so that both engines answer as often. Each request is sent twice in a
row, so the second one finds its prompt in the KV cache: the time to first token the daemon adds is
read there. Back to back by default: a direct request follows the one before at once, a daemon's
after HTTP; --pause-ms idles before every measured request on both sides instead.
Reported per workload and speculation mode (medians):

- ms per output token, direct and through the daemon, and their ratio;
- time to first token on a cached prompt, direct and through the daemon, and the difference;
  and each client's floor: the same client and request against a server that answers at once
  (what the client itself costs);
- that difference split by the clock the client and the daemon share (perf_counter's, one per
  machine): the client sending (until the daemon has the request), the daemon (from then until it
  writes the first events, less the direct request's time to its first token), the client reading;
- where the daemon's time went (`timings.trace`, asked for with the X-Lingcode-Trace header):
  body and validation, template and tokenization, queueing, the engine's first chunk,
  detokenization, stop strings, reasoning and tool parsing, response shaping (SSE framing),
  socket sends, and the event loop's CPU time; and the engine's own decode time in the daemon
  against the same engine's direct (a slower engine thread in the daemon means contention).

With --engine sglang the engine is SGLang's wire protocol: a stand-in
(lingcode/bench/sglang_standin.py) streams a token every --step-ms (0.78: Ling-3.0-flash +
DSpark at concurrency 1), "direct" reads its /generate stream as lingcode's adapter would ask for
it, and the daemon attaches to it with --engine sglang --engine-url. Its events carry only the new
tokens, as lingcode's launch profiles run SGLang (--sglang-stream cumulative: every token so far,
SGLang's default).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import importlib.util
import json
import os
import platform
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import asdict, dataclass, field
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import httpx

from lingcode.bench import share_kernels, source_commit, usable_cpus, write_result

# A code edit of a file that is not lingcode's own (a small JavaScript module), and a chat question.
CODE = """\
export function debounce(fn, wait = 100) {
  let timer = null;
  let lastArgs = [];
  function flush() {
    timer = null;
    fn(...lastArgs);
  }
  return function debounced(...args) {
    lastArgs = args;
    if (timer !== null) clearTimeout(timer);
    timer = setTimeout(flush, wait);
  };
}

export function groupBy(items, key) {
  const groups = new Map();
  for (const item of items) {
    const k = typeof key === "function" ? key(item) : item[key];
    if (!groups.has(k)) groups.set(k, []);
    groups.get(k).push(item);
  }
  return groups;
}
"""
WORKLOADS = {
    "chat": [{"role": "user", "content": "Explain how a hash map handles collisions, with an example."}],
    "code-edit": [
        {
            "role": "user",
            "content": "Rename `groupBy` to `groupItems` and `debounce` to `debounceCall`, "
            f"and output the whole edited file:\n```js\n{CODE}```",
        }
    ],
}
# Inputs that are not this bench's own: a function of Python's standard library, a different one each
# round, under one of a few everyday requests. (Python versions differ in their sources: each sample
# names its function.)
STDLIB_MODULES = ("argparse", "base64", "bisect", "calendar", "csv", "difflib", "fractions", "ftplib", "gettext",
                  "heapq", "ipaddress", "json.decoder", "json.encoder", "mailbox", "netrc", "pathlib", "pprint",
                  "shlex", "statistics", "string", "tarfile", "textwrap", "tokenize", "urllib.parse", "zipfile")  # fmt: skip
STDLIB_ASKS = (
    "Explain what this function does, step by step.",
    "Add type hints to this function and output it whole.",
    "Write pytest tests for this function.",
    "Find an edge case this function mishandles, and fix it.",
)


@functools.cache
def stdlib_functions() -> list[tuple[str, str]]:
    """(module.qualname, source) of the standard library's functions and methods of 300-2,500
    characters in STDLIB_MODULES, sorted by name."""
    import importlib
    import inspect

    found = {}
    for name in STDLIB_MODULES:
        module = importlib.import_module(name)
        members = [
            m
            for _, c in inspect.getmembers(module, inspect.isclass)
            if c.__module__ == name
            for _, m in vars(c).items()
            if inspect.isfunction(m)
        ]
        members += [f for _, f in inspect.getmembers(module, inspect.isfunction)]
        for fn in members:
            if fn.__module__ != name:
                continue
            try:
                source = inspect.getsource(fn)
            except (OSError, TypeError):
                continue
            if 300 <= len(source) <= 2500:
                found[f"{name}.{fn.__qualname__}"] = source
    return sorted(found.items())


def workload_request(workload: str, round_index: int, prompts: list[tuple[str, list[dict]]]) -> tuple[str, list[dict]]:
    """A round's request of a workload: a label naming its input, and its messages. The bench's own
    two are the same every round; `stdlib` and `prompts` (a --prompts file) change each round."""
    if workload in WORKLOADS:
        return workload, WORKLOADS[workload]
    if workload == "stdlib":
        functions = stdlib_functions()
        name, source = functions[(round_index * 37) % len(functions)]  # 37: neighbours come from other modules
        ask = STDLIB_ASKS[round_index % len(STDLIB_ASKS)]
        return name, [{"role": "user", "content": f"{ask}\n```python\n{textwrap.dedent(source)}```"}]
    if workload == "prompts" and prompts:
        return prompts[round_index % len(prompts)]
    raise SystemExit(
        f"lingcode bench daemon: unknown workload {workload!r} (chat, code-edit, stdlib, or --prompts FILE)"
    )


def read_prompts(path: Path) -> list[tuple[str, list[dict]]]:
    """A --prompts file: JSON Lines, each a chat request's {"messages": [...]} (other fields are
    ignored); each labelled with its line."""
    prompts = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            messages = json.loads(line)["messages"]
            if not isinstance(messages, list) or not messages:
                raise ValueError("no messages")
        except (ValueError, KeyError, TypeError) as exc:
            raise SystemExit(f'lingcode bench daemon: {path}:{number}: not a {{"messages": [...]}} line ({exc})')
        prompts.append((f"line {number}", messages))
    if not prompts:
        raise SystemExit(f"lingcode bench daemon: {path} holds no requests")
    return prompts


@dataclass
class Sample:
    side: str  # "direct" | "daemon" | "floor" (the client against a server that answers at once)
    workload: str
    speculation: str
    cached: bool  # the second of two identical requests: its prompt was in the KV cache
    tokens: int
    ttft_ms: float
    tpot_ms: float | None
    text: str = ""
    trace: dict = field(default_factory=dict)
    engine_decode_ms: float | None = None  # the engine's own decode time for this request
    client: str = ""  # the daemon's and the floor's: one of CLIENTS
    engine_steps: int | None = None  # the engine's decode steps (with drafts: fewer than tokens)
    engine_first_ms: float | None = None  # the engine's own time to its first chunk (last_request)
    engine_hand_over_ms: float | None = None  # the engine held by its first chunk's hand-over (last_request)
    # of the hop to the engine and back, the way there: from the daemon's hand-off (`until_engine`) to
    # the engine's taking the request (last_request.admitted_at_ms, on the clock both processes share)
    engine_hop_to_ms: float | None = None
    input: str = ""  # the workload's input this round (stdlib: the function; prompts: the file's line)
    engine_sleeps: int | None = None  # the native CPU step's barrier sleeps in this request (last_request)
    # the daemon's, on the clock it shares with the client: from the client's call to the request's
    # arrival in the daemon, and from the daemon's write of the first events to the client's first token
    to_daemon_ms: float | None = None
    after_first_events_ms: float | None = None


# --- the two sides ------------------------------------------------------------------------------


def _tpot(first: float | None, last: float, tokens: int) -> float | None:
    return (last - first) * 1e3 / (tokens - 1) if first is not None and tokens > 1 else None


async def direct_local(engine, input_ids: list[int], max_tokens: int) -> tuple[float, float | None, list[int]]:
    """The engine fed directly: ttft, tpot (ms), and the ids, timed as the daemon times them."""
    from lingcode.engine import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    started, first, ids = time.perf_counter(), None, []
    async for chunk in engine.generate(f"direct-{time.monotonic_ns()}", input_ids, params):
        if chunk.token_ids and first is None:
            first = time.perf_counter()
        ids += chunk.token_ids
    last = time.perf_counter()
    return (first - started) * 1e3, _tpot(first, last, len(ids)), ids


async def direct_sglang(
    client: httpx.AsyncClient,
    input_ids: list[int],
    max_tokens: int,
    eos: tuple[int, ...],
    context: int,
    incremental: bool,
) -> tuple[float, float | None, list[int]]:
    """SGLang's /generate stream read as lingcode's adapter asks for it (the same body)."""
    from lingcode.engine import SamplingParams
    from lingcode.engine.sglang.adapter import StreamDecoder, generate_body

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    body = generate_body(f"direct-{time.monotonic_ns()}", input_ids, params, eos, context - len(input_ids))
    decoder, ids = StreamDecoder(incremental), []
    started, first = time.perf_counter(), None
    async with client.stream("POST", "/generate", json=body) as response:
        async for line in response.aiter_lines():
            chunk = decoder.feed(line)
            if chunk is not None and chunk.token_ids:
                first = first or time.perf_counter()
                ids += chunk.token_ids
    last = time.perf_counter()
    return (first - started) * 1e3, _tpot(first, last, len(ids)), ids


async def through_daemon(
    client, messages: list[dict], max_tokens: int
) -> tuple[float, float | None, int, str, dict, tuple[float | None, float | None, float | None]]:
    """A streamed chat completion read by `client` (an httpx.AsyncClient or an aiohttp.ClientSession):
    client-side ttft and tpot, tokens, text, the daemon's trace, and the client's own share of the
    first token (ms): until the daemon had the request, and from its write of the first events on;
    and the request's arrival in the daemon on perf_counter's clock (ms) (None where the answer has
    no trace: the floor's)."""
    body = {
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started, first, last, parts, tokens, trace = time.perf_counter(), None, None, [], 0, {}
    async for content, finished, timings, completion_tokens in _deltas(client, body):
        if content:
            now = time.perf_counter()
            first = first or now
            last = now
            parts.append(content)
        if finished:
            trace = (timings or {}).get("trace", {})
        if completion_tokens:
            tokens = completion_tokens
    arrived = trace.pop("arrived_at", None)
    to_daemon = after_first_events = None
    if arrived is not None and "until_first_events" in trace:
        to_daemon = arrived - started * 1e3
        after_first_events = first * 1e3 - (arrived + trace["until_first_events"])
    return (
        (first - started) * 1e3,
        _tpot(first, last, tokens),
        tokens,
        "".join(parts),
        trace,
        (to_daemon, after_first_events, arrived),
    )


Delta = tuple[str | None, bool, dict | None, int | None]  # content, a choice finished, timings, completion tokens


async def _deltas(client, body: dict) -> AsyncIterator[Delta]:
    """A streamed chat completion's chunks as each client's user reads them: the content, whether
    a choice finished, the daemon's timings, and the usage's completion tokens."""
    if isinstance(client, OpenAISDK):
        async for each in client.deltas(body, {TRACE_HEADER: "1"}):
            yield each
        return
    async for line in _sse_lines(client, "/v1/chat/completions", body):
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        for choice in chunk.get("choices") or []:
            yield choice["delta"].get("content"), bool(choice.get("finish_reason")), chunk.get("timings"), None
        if chunk.get("usage"):
            yield None, False, None, chunk["usage"]["completion_tokens"]


async def _sse_lines(client, path: str, body: dict) -> AsyncIterator[str]:
    """The lines of a POST's streamed answer, as each client reads them."""
    headers = {TRACE_HEADER: "1"}
    if isinstance(client, SocketClient):
        for line in client.stream(path, body, headers):
            yield line
        return
    if isinstance(client, httpx.AsyncClient):
        async with client.stream("POST", path, json=body, headers=headers) as response:
            if response.status_code != 200:
                raise RuntimeError(f"daemon answered {response.status_code}: {(await response.aread())[:300]!r}")
            async for line in response.aiter_lines():
                yield line
        return
    async with client.post(path, json=body, headers=headers) as response:
        if response.status != 200:
            raise RuntimeError(f"daemon answered {response.status}: {(await response.read())[:300]!r}")
        async for raw in response.content:
            yield raw.decode().rstrip("\r\n")


class OpenAISDK:
    """The official openai SDK's async client: the request built and each chunk parsed into its
    typed model, as an SDK script reads a stream. lingcode's own fields (the usage's counts, the
    `timings` of the last chunk) come as the models' extras. Needs the openai package (a dev
    dependency, not the daemon's)."""

    def __init__(self, base_url: str, headers: dict):
        import openai

        token = headers.get("Authorization", "").removeprefix("Bearer ")
        self.sdk = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=token or "none", max_retries=0, timeout=600)

    async def deltas(self, body: dict, headers: dict) -> AsyncIterator[Delta]:
        standard = ("messages", "max_tokens", "temperature", "stream", "stream_options")
        stream = await self.sdk.chat.completions.create(
            model="lingcode",  # one model is served; any name reaches it
            **{key: body[key] for key in standard if key in body},
            extra_body={key: value for key, value in body.items() if key not in standard},
            extra_headers=headers,
        )
        async for chunk in stream:
            for choice in chunk.choices:
                yield choice.delta.content, bool(choice.finish_reason), (chunk.model_extra or {}).get("timings"), None
            if chunk.usage is not None:
                yield None, False, None, chunk.usage.completion_tokens

    async def aclose(self) -> None:
        await self.sdk.close()


class SocketClient:
    """No HTTP library: the request written and the chunked answer read on a blocking socket, one
    `recv` per event, the connection kept alive. What any client must pay to read the stream (the
    kernel waking it for each event); what httpx and aiohttp cost beyond it is their own. It blocks
    the bench's event loop while it reads, which has nothing else to do then."""

    def __init__(self, base_url: str, headers: dict):
        url = urlsplit(base_url)
        self.address, self.headers, self.sock = (url.hostname, url.port), headers, None

    def stream(self, path: str, body: dict, headers: dict) -> Iterator[str]:
        data = json.dumps(body).encode()
        fields = {
            "Host": "%s:%d" % self.address,
            "Content-Type": "application/json",
            "Content-Length": str(len(data)),
            **self.headers,
            **headers,
        }
        request = f"POST {path} HTTP/1.1\r\n".encode() + "".join(f"{k}: {v}\r\n" for k, v in fields.items()).encode()
        request += b"\r\n" + data
        for attempt in (1, 2):  # a kept connection the server has closed since: once more, on a new one
            try:
                if self.sock is None:
                    self.sock = socket.create_connection(self.address)
                    self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self.sock.sendall(request)
                first = self.sock.recv(65536)
            except ConnectionError:
                if attempt == 2:
                    raise
                first = b""
            if first:
                break
            self.close()
        else:
            raise RuntimeError("the server closed the connection without an answer")
        head = first
        while b"\r\n\r\n" not in head:
            head += self._recv()
        head, _, buffer = head.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        names = {
            line.split(b":", 1)[0].strip().lower(): line.split(b":", 1)[1].strip()
            for line in head.split(b"\r\n")[1:]
            if b":" in line
        }
        if names.get(b"transfer-encoding", b"").lower() != b"chunked":
            length = int(names.get(b"content-length", b"0"))
            while len(buffer) < length:
                buffer += self._recv()
            raise RuntimeError(f"daemon answered {status}: {buffer[:300]!r}")
        pending = b""
        while True:  # chunked: a size line, the bytes, CRLF; a size of 0 ends the answer
            while b"\r\n" not in buffer:
                buffer += self._recv()
            size_line, _, buffer = buffer.partition(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            while len(buffer) < size + 2:
                buffer += self._recv()
            chunk, buffer = buffer[:size], buffer[size + 2 :]
            if size == 0:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                yield line.decode().rstrip("\r")
        if status != 200:
            raise RuntimeError(f"daemon answered {status}: {pending[:300]!r}")
        if names.get(b"connection", b"").lower() == b"close":
            self.close()

    def _recv(self) -> bytes:
        data = self.sock.recv(65536)
        if not data:
            self.close()
            raise RuntimeError("the server closed the connection mid-answer")
        return data

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


CLIENTS = ("httpx", "aiohttp", "openai", "socket")  # the bench's order; --clients picks some
TRACE_HEADER = "x-lingcode-trace"  # asks the daemon for its trace in the last chunk's timings


def _clients(base_url: str, headers: dict, names: list[str]) -> dict:
    """The daemon's readers, by name (CLIENTS), each with one kept-alive connection."""
    make = {
        "httpx": lambda: httpx.AsyncClient(base_url=base_url, headers=headers, timeout=600),
        "aiohttp": lambda: aiohttp.ClientSession(base_url, headers=headers, timeout=aiohttp.ClientTimeout(total=600)),
        "openai": lambda: OpenAISDK(base_url, headers),
        "socket": lambda: SocketClient(base_url, headers),
    }
    return {name: make[name]() for name in names}


async def _close(clients: dict) -> None:
    for client in clients.values():
        if isinstance(client, SocketClient):
            client.close()
        else:
            await (client.aclose() if isinstance(client, (httpx.AsyncClient, OpenAISDK)) else client.close())


# --- daemons ------------------------------------------------------------------------------------


def _cpus() -> str:
    """The CPUs this run may use (a run pinned with taskset says how many of the machine's)."""
    allowed = usable_cpus()
    return f"{allowed} CPUs" if allowed == os.cpu_count() else f"{allowed} CPUs of {os.cpu_count()}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    """`lingcode serve --port 0` in a process of its own, under a private LINGCODE_HOME."""

    def __init__(self, serve_args: list[str], home: Path, extra_env: dict[str, str] | None = None):
        env = {**os.environ, "LINGCODE_HOME": str(home), "PYTHONUNBUFFERED": "1", **(extra_env or {})}
        self.log = open(home / "serve.log", "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "lingcode", "serve", "--port", "0", *serve_args],
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        record = home / "state" / "daemon.json"
        deadline = time.monotonic() + 900
        while not record.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"lingcode serve did not start: {(home / 'serve.log').read_text()[-2000:]}")
            time.sleep(0.2)
        info = json.loads(record.read_text())
        self.url, self.token = info["url"], Path(info["token_file"]).read_text().strip()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


# --- the client's own share ------------------------------------------------------------------------
# The added time to first token includes what the HTTP client itself costs to send a request and
# parse a stream (and the openai SDK its typed chunks). The floor measures it: the same client and
# request against a server (a process of its own) that answers every POST at once with one content
# event, a finish event and [DONE]. Nothing the daemon does can go below it.

_FLOOR_EVENTS = (
    b"".join(
        b"data: " + json.dumps(e, separators=(",", ":")).encode() + b"\n\n"
        for e in (
            {
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": {"content": "A"}, "finish_reason": None}],
            },
            {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
        )
    )
    + b"data: [DONE]\n\n"
)
_FLOOR_ANSWER = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    + b"%x\r\n%s\r\n0\r\n\r\n" % (len(_FLOOR_EVENTS), _FLOOR_EVENTS)
)


class _AnswerAtOnce(asyncio.Protocol):
    def connection_made(self, transport) -> None:
        self.transport, self.buffer = transport, b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while b"\r\n\r\n" in self.buffer:  # a whole request (head and Content-Length body): answer it
            head, _, rest = self.buffer.partition(b"\r\n\r\n")
            length = next(
                (
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ),
                0,
            )
            if len(rest) < length:
                return
            self.buffer = rest[length:]
            self.transport.write(_FLOOR_ANSWER)


def serve_floor(port: int) -> None:
    """The floor's server: `python -m lingcode.bench.daemon PORT`."""

    async def serve() -> None:
        server = await asyncio.get_running_loop().create_server(_AnswerAtOnce, "127.0.0.1", port)
        await server.serve_forever()

    asyncio.run(serve())


def _model_dir_from_gguf(gguf_path: Path, out: Path) -> tuple[Path, list[int]]:
    """A Hugging Face-style model directory (tokenizer, chat template) from a GGUF's metadata, for
    attaching the SGLang adapter to the stand-in; and token ids of real text for it to stream."""
    from gguf import GGUFReader

    from lingcode.text.tokenizer import Tokenizer

    reader = GGUFReader(str(gguf_path))
    fields = {k: reader.fields[k].contents() for k in reader.fields if k.startswith("tokenizer.")}
    tokenizer = Tokenizer.from_gguf_fields(fields)
    tokens = fields["tokenizer.ggml.tokens"]
    eos = fields.get("tokenizer.ggml.eos_token_id")
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_text(tokenizer.hf.to_str())
    (out / "config.json").write_text(
        json.dumps({"architectures": ["LlamaForCausalLM"], "max_position_embeddings": 8192, "eos_token_id": eos})
    )
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "chat_template": fields.get("tokenizer.chat_template"),
                "eos_token": tokens[eos] if eos is not None else None,
            }
        )
    )
    return out, tokenizer.encode(CODE * 4)


# --- the run ------------------------------------------------------------------------------------


async def _run(args: argparse.Namespace) -> list[Sample]:
    from lingcode import models

    samples: list[Sample] = []
    gguf = models.ensure(args.model)
    serve_env = dict(item.split("=", 1) for item in args.serve_env)
    workloads = [w for w in args.workload.split(",") if w] + (["prompts"] if args.prompts else [])
    prompts = read_prompts(args.prompts) if args.prompts else []
    for workload in workloads:
        workload_request(workload, 0, prompts)  # an unknown one fails now, not after the engines load
    floor_port = _free_port()
    floor = subprocess.Popen([sys.executable, "-m", "lingcode.bench.daemon", str(floor_port)])
    floor_clients = _clients(f"http://127.0.0.1:{floor_port}", {"Authorization": "Bearer floor"}, args.clients)
    for _ in range(100):  # until the floor's server listens
        try:
            socket.create_connection(("127.0.0.1", floor_port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.05)
    try:
        return await _rounds(args, gguf, serve_env, workloads, prompts, floor_clients, samples)
    finally:
        await _close(floor_clients)
        floor.terminate()


async def _rounds(
    args,
    gguf: Path,
    serve_env: dict,
    workloads: list[str],
    prompts: list[tuple[str, list[dict]]],
    floor_clients: dict,
    samples: list[Sample],
) -> list[Sample]:
    from lingcode.text.chat_template import render_chat

    for speculation in args.speculation.split(","):
        home = Path(tempfile.mkdtemp(prefix="lingcode-bench-daemon-"))
        share_kernels(home)
        standin = engine = daemon = None
        try:
            if args.engine == "sglang":
                if speculation != "off":
                    continue  # drafting happens inside SGLang: the stand-in streams what it accepted
                model_dir, ids = _model_dir_from_gguf(gguf, home / "model")
                port = _free_port()
                standin = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "lingcode.bench.sglang_standin",
                        "--port",
                        str(port),
                        "--step-ms",
                        str(args.step_ms),
                        "--ids",
                        ",".join(map(str, ids)),
                        *(["--incremental"] if args.sglang_stream == "incremental" else []),
                    ],
                    stdout=subprocess.DEVNULL,
                )
                engine_url = f"http://127.0.0.1:{port}"
                for _ in range(100):
                    try:
                        httpx.get(f"{engine_url}/health", timeout=1)
                        break
                    except httpx.HTTPError:
                        time.sleep(0.1)
                daemon = Daemon(
                    ["--engine", "sglang", "--engine-url", engine_url, "--model", str(model_dir)], home, serve_env
                )
                from lingcode.engine.sglang.model_dir import load_model_info

                info = load_model_info(model_dir)
                direct_client = httpx.AsyncClient(base_url=engine_url, timeout=600)
            else:
                from lingcode.engine.local import load_engine

                serve_args = ["--device", args.device, "--speculation", speculation, "--model", str(gguf)]
                if args.kernels != "auto":
                    serve_args += ["--kernels", args.kernels]
                daemon = Daemon(serve_args, home, serve_env)
                # From the daemon's home: its prepared model and the step costs its engine measured at
                # load. The drafter picks its draft length from those costs, so the two engines draft
                # alike only with the same ones (from homes of their own they took 17 and 28 steps).
                previous_home = os.environ.get("LINGCODE_HOME")
                os.environ["LINGCODE_HOME"] = str(home)
                try:
                    engine = load_engine(gguf, device=args.device, speculation=speculation, kernels=args.kernels)
                finally:
                    if previous_home is None:
                        del os.environ["LINGCODE_HOME"]
                    else:
                        os.environ["LINGCODE_HOME"] = previous_home
                info = engine.info
            auth = {"Authorization": f"Bearer {daemon.token}"}
            clients = _clients(daemon.url, auth, args.clients)
            # the daemon's stats after each request, on httpx's connection (one of its own if no reader's)
            owned = {} if "httpx" in clients else {"stats": _clients(daemon.url, auth, ["httpx"])["httpx"]}
            stats_client = clients.get("httpx") or owned["stats"]
            try:
                for workload in workloads:
                    for i in range(args.requests + 1):  # the first round warms every side up
                        label, messages = workload_request(workload, i, prompts)
                        input_ids = info.tokenizer.encode(
                            render_chat(
                                info.chat_template, messages, bos_token=info.bos_token, eos_token=info.eos_token
                            )
                        )

                        async def direct():
                            if engine is not None:
                                return await direct_local(engine, input_ids, args.max_tokens)
                            return await direct_sglang(
                                direct_client,
                                input_ids,
                                args.max_tokens,
                                info.eos_token_ids,
                                info.context_length,
                                args.sglang_stream == "incremental",
                            )

                        async def measure_direct(client: str, cached: bool) -> Sample:
                            ttft, tpot, ids = await direct()
                            last = engine.stats()["last_request"] if engine is not None else {}
                            # the same pause before the next request as on the daemon's side, which asks the
                            # daemon for its stats: a few ms idle slow the next first step on the CPU
                            # (docs/engine-notes.md), so both sides take it
                            await stats_client.get("/v1/lingcode/stats")
                            return Sample(
                                "direct",
                                workload,
                                speculation,
                                cached,
                                len(ids),
                                ttft,
                                tpot,
                                info.tokenizer.decode(ids),
                                engine_decode_ms=last.get("decode_ms"),
                                client=client,
                                engine_steps=last.get("decode_steps"),
                                engine_first_ms=last.get("first_chunk_ms"),
                                engine_hand_over_ms=last.get("hand_over_ms"),
                                engine_sleeps=last.get("barrier_sleeps"),
                                input=label,
                            )

                        async def measure_daemon(client: str, cached: bool) -> Sample:
                            ttft, tpot, n, text, trace, (to_daemon, after_first_events, arrived) = await through_daemon(
                                clients[client], messages, args.max_tokens
                            )
                            last = (
                                (await stats_client.get("/v1/lingcode/stats")).json()["engine"].get("last_request", {})
                            )
                            hop_to = None
                            if (
                                last.get("admitted_at_ms") is not None
                                and arrived is not None
                                and "until_engine" in trace
                            ):
                                hop_to = last["admitted_at_ms"] - arrived - trace["until_engine"]
                            return Sample(
                                "daemon",
                                workload,
                                speculation,
                                cached,
                                n,
                                ttft,
                                tpot,
                                text,
                                trace,
                                last.get("decode_ms"),
                                client=client,
                                engine_steps=last.get("decode_steps"),
                                engine_first_ms=last.get("first_chunk_ms"),
                                engine_hand_over_ms=last.get("hand_over_ms"),
                                engine_hop_to_ms=hop_to,
                                engine_sleeps=last.get("barrier_sleeps"),
                                input=label,
                                to_daemon_ms=to_daemon,
                                after_first_events_ms=after_first_events,
                            )

                        if label != workload:
                            # A new input: each engine answers it once first, unmeasured, so that every
                            # measured request finds an answer to it indexed by the n-gram drafter.
                            await direct()
                            await through_daemon(clients[args.clients[0]], messages, args.max_tokens)
                        # Each daemon client against a direct pair of its own, next to it in the round: the
                        # daemon's engine answers both clients, so the direct one answers as often, and each
                        # request finds its engine as its counterpart finds the other (the drafter's counts
                        # and the prefix store's saves follow how often an engine has seen a prompt). Who
                        # goes first, client or direct, and which client, change round by round.
                        order = list(clients)[i % len(clients) :] + list(clients)[: i % len(clients)]
                        for client in order:
                            for side in ("direct", client) if (i // 2) % 2 == 0 else (client, "direct"):
                                for cached in (False, True):
                                    if args.pause_ms > 0:
                                        await asyncio.sleep(args.pause_ms / 1e3)
                                    sample = await (
                                        measure_direct(client, cached)
                                        if side == "direct"
                                        else measure_daemon(client, cached)
                                    )
                                    if i > 0:
                                        samples.append(sample)
                                    print(
                                        f"  {speculation:>5} {workload:>9} {side:>7} {'cached' if cached else 'cold':>6}: "
                                        f"ttft {sample.ttft_ms:7.2f} ms  tpot {sample.tpot_ms or 0:7.3f} ms  "
                                        f"({sample.tokens} tokens){'' if i else '  (warm-up)'}"
                                        f"{'' if label == workload else '  ' + label}",
                                        flush=True,
                                    )
                        for name, floor_client in floor_clients.items():
                            ttft, *_ = await through_daemon(floor_client, messages, args.max_tokens)
                            if i > 0:
                                samples.append(
                                    Sample(
                                        "floor", workload, speculation, True, 0, ttft, None, client=name, input=label
                                    )
                                )
            finally:
                await _close(clients | owned)
        finally:
            if daemon is not None:
                daemon.stop()
            if engine is not None:
                await engine.close()
            if standin is not None:
                standin.terminate()
            shutil.rmtree(home, ignore_errors=True)  # the daemon's prepared model and log: a run leaves nothing
    return samples


def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def median_interval(values, rounds: int = 2000, seed: int = 0) -> tuple[float, float] | None:
    """The median's 95 % interval by the bootstrap (the values resampled `rounds` times; a fixed seed,
    so a report reproduces from its samples). On a shared machine a row's spread is wider than the
    goals' margins: the interval says whether a median is above a goal or only noise around it."""
    values = [v for v in values if v is not None]
    if len(values) < 4:
        return None
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(rounds))
    return medians[round(0.025 * rounds)], medians[round(0.975 * rounds) - 1]


def inputs(samples: list[Sample]) -> dict[str, list[str]]:
    """The inputs of the workloads that change each round, in round order (the floor's request: one a round)."""
    named: dict[str, list[str]] = {}
    first = next((s.client for s in samples if s.side == "floor"), None)
    for s in samples:
        if (
            s.side == "floor"
            and s.client == first
            and s.input != s.workload
            and s.speculation == samples[0].speculation
        ):
            named.setdefault(s.workload, []).append(s.input)
    return named


def summarize(samples: list[Sample]) -> list[dict]:
    rows = []
    for speculation in dict.fromkeys(s.speculation for s in samples):
        for workload in dict.fromkeys(s.workload for s in samples):
            group = [s for s in samples if s.speculation == speculation and s.workload == workload]
            if not group:
                continue
            for client in sorted({s.client for s in group if s.side == "daemon"}, key=CLIENTS.index):
                direct = [s for s in group if s.side == "direct" and s.client == client]  # its own counterparts
                rows.append(
                    _row(
                        speculation,
                        workload,
                        client,
                        direct,
                        [s for s in group if s.side == "daemon" and s.client == client],
                        _median(s.ttft_ms for s in group if s.side == "floor" and s.client == client),
                    )
                )
    return rows


def _paired_ratios(direct: list[Sample], daemon: list[Sample]) -> list[float]:
    """Each daemon request's time per token over the direct request of the same round: slow drifts
    of the machine cancel."""
    return [b.tpot_ms / a.tpot_ms for a, b in zip(direct, daemon) if a.tpot_ms and b.tpot_ms]


def _in_daemon(direct: list[Sample], daemon: list[Sample]) -> list[float]:
    """Of each cached pair's added first-token time, the daemon's part: from the request's arrival
    until it began writing the first events, less the direct request's whole time to its first token
    (the same engine work). The rest of the added time is the client's own, sending and reading."""
    return [
        b.trace["until_first_events"] - a.ttft_ms
        for a, b in zip(direct, daemon)
        if a.cached and b.cached and "until_first_events" in b.trace
    ]


def pooled(samples: list[Sample]) -> list[dict]:
    """Every workload's pairs together, per drafting mode and client: each daemon request against the
    direct request paired with it in its round. A row's 24-100 pairs leave an interval wider than
    the goals' margins on a shared machine; the pooled pairs say whether a goal is met overall."""
    rows = []
    for speculation in dict.fromkeys(s.speculation for s in samples):
        for client in CLIENTS:
            ratios, added, in_daemon = [], [], []
            for workload in dict.fromkeys(s.workload for s in samples):
                group = [
                    s for s in samples if s.speculation == speculation and s.workload == workload and s.client == client
                ]
                direct = [s for s in group if s.side == "direct"]
                daemon = [s for s in group if s.side == "daemon"]
                ratios += _paired_ratios(direct, daemon)
                added += [b.ttft_ms - a.ttft_ms for a, b in zip(direct, daemon) if a.cached and b.cached]
                in_daemon += _in_daemon(direct, daemon)
            if ratios or added:
                rows.append(
                    {
                        "speculation": speculation,
                        "client": client,
                        "pairs": len(ratios),
                        "ttft_pairs": len(added),
                        "tpot_ratio_paired": _median(ratios),
                        "tpot_ratio_paired_interval": median_interval(ratios),
                        "ttft_added_paired_ms": _median(added),
                        "ttft_added_paired_interval": median_interval(added),
                        "ttft_added_in_daemon_ms": _median(in_daemon),
                        "ttft_added_in_daemon_interval": median_interval(in_daemon),
                    }
                )
    return rows


def _row(
    speculation: str, workload: str, client: str, direct: list[Sample], daemon: list[Sample], floor: float | None
) -> dict:
    """One client's row: its daemon samples against the direct ones (both in the same rounds' order)."""
    tpot_direct, tpot_daemon = _median(s.tpot_ms for s in direct), _median(s.tpot_ms for s in daemon)
    ttft_direct = _median(s.ttft_ms for s in direct if s.cached)
    ttft_daemon = _median(s.ttft_ms for s in daemon if s.cached)
    stages = sorted({k for s in daemon for k in s.trace})
    trace = {k: _median(s.trace.get(k) for s in daemon if s.cached) for k in stages}
    decode_direct = _median(s.engine_decode_ms for s in direct)
    decode_daemon = _median(s.engine_decode_ms for s in daemon)
    added = ttft_daemon - ttft_direct if ttft_direct is not None and ttft_daemon is not None else None
    paired = _paired_ratios(direct, daemon)
    return {
        "speculation": speculation,
        "workload": workload,
        "client": client,
        "tokens": _median(s.tokens for s in direct + daemon),
        "tpot_direct_ms": tpot_direct,
        "tpot_daemon_ms": tpot_daemon,
        "tpot_ratio": tpot_daemon / tpot_direct if tpot_direct and tpot_daemon else None,
        "tpot_ratio_paired": _median(paired),
        "tpot_ratio_paired_interval": median_interval(paired),
        "ttft_cached_direct_ms": ttft_direct,
        "ttft_cached_daemon_ms": ttft_daemon,
        "ttft_added_ms": added,
        "client_floor_ms": floor,
        "ttft_added_less_floor_ms": added - floor if added is not None and floor is not None else None,
        "ttft_added_in_daemon_ms": _median(_in_daemon(direct, daemon)),
        "engine_decode_ratio": decode_daemon / decode_direct if decode_direct and decode_daemon else None,
        # the engine's own time to its first chunk, from when it took the request: what of the added
        # first-token time is the engine's (a slower first step) and what the way to and from it
        "engine_first_direct_ms": _median(s.engine_first_ms for s in direct if s.cached),
        "engine_first_daemon_ms": _median(s.engine_first_ms for s in daemon if s.cached),
        "engine_first_hop_ms": _median(
            s.trace["engine_first_chunk"] - s.engine_first_ms
            for s in daemon
            if s.cached and s.engine_first_ms is not None and "engine_first_chunk" in s.trace
        ),
        # of that hop, the way to the engine: from the daemon's hand-off (until_engine) to the engine's taking it
        "engine_first_hop_to_ms": _median(s.engine_hop_to_ms for s in daemon if s.cached),
        # how long the first chunk's hand-over held the engine: on the CPU until its reader took it
        "engine_hand_over_direct_ms": _median(s.engine_hand_over_ms for s in direct),
        "engine_hand_over_daemon_ms": _median(s.engine_hand_over_ms for s in daemon),
        # the CPU step's threads sleeping at a barrier, a token: each is a partner's core taken away
        "engine_sleeps_per_token_direct": _median(
            s.engine_sleeps / s.tokens for s in direct if s.engine_sleeps is not None and s.tokens
        ),
        "engine_sleeps_per_token_daemon": _median(
            s.engine_sleeps / s.tokens for s in daemon if s.engine_sleeps is not None and s.tokens
        ),
        # the same drafting on both sides: a daemon engine that drafted otherwise takes other steps
        "engine_steps_direct": _median(s.engine_steps for s in direct),
        "engine_steps_daemon": _median(s.engine_steps for s in daemon),
        "same_text": all(a.text == b.text for a, b in zip(direct, daemon)),
        "client_to_daemon_ms": _median(s.to_daemon_ms for s in daemon if s.cached),
        "client_after_first_events_ms": _median(s.after_first_events_ms for s in daemon if s.cached),
        "trace_cached_ms": trace,
    }


def _fmt(value, digits=3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _interval(bounds, digits: int = 3) -> str:
    return "" if not bounds else f" ({bounds[0]:.{digits}f}-{bounds[1]:.{digits}f})"


def markdown(report: dict) -> str:
    lines = [
        f"# lingcode bench daemon ({report['engine']})",
        "",
        f"- command: `{report['command']}`",
        f"- commit: {report['commit']}, {report['date']}",
        f"- machine: {report['machine']}",
        *(f"- {workload}, one a round: {', '.join(names)}" for workload, names in report.get("inputs", {}).items()),
        "",
        "| speculation | workload | client | tokens | ms/token direct | ms/token daemon | ratio | ratio, paired | "
        "TTFT cached direct | TTFT cached daemon | added TTFT (ms) | client floor (ms) | added less floor (ms) | "
        "added in the daemon (ms) | "
        "engine decode, daemon/direct | engine's first chunk, direct / daemon (ms) | hop to and from it / of it to (ms) | "
        "first chunk's hand-over, direct / daemon (ms) | "
        "decode steps, direct / daemon | barrier sleeps a token, direct / daemon | same text |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        lines.append(
            f"| {r['speculation']} | {r['workload']} | {r.get('client', 'httpx')} | {_fmt(r['tokens'], 0)} | "
            f"{_fmt(r['tpot_direct_ms'])} | {_fmt(r['tpot_daemon_ms'])} | {_fmt(r['tpot_ratio'])} | "
            f"{_fmt(r.get('tpot_ratio_paired'))}{_interval(r.get('tpot_ratio_paired_interval'))} | "
            f"{_fmt(r['ttft_cached_direct_ms'], 2)} | "
            f"{_fmt(r['ttft_cached_daemon_ms'], 2)} | {_fmt(r['ttft_added_ms'], 2)} | "
            f"{_fmt(r.get('client_floor_ms'), 2)} | {_fmt(r.get('ttft_added_less_floor_ms'), 2)} | "
            f"{_fmt(r.get('ttft_added_in_daemon_ms'), 2)} | "
            f"{_fmt(r['engine_decode_ratio'])} | {_fmt(r.get('engine_first_direct_ms'), 2)} / "
            f"{_fmt(r.get('engine_first_daemon_ms'), 2)} | {_fmt(r.get('engine_first_hop_ms'), 2)} / "
            f"{_fmt(r.get('engine_first_hop_to_ms'), 2)} | "
            f"{_fmt(r.get('engine_hand_over_direct_ms'), 2)} / "
            f"{_fmt(r.get('engine_hand_over_daemon_ms'), 2)} | "
            f"{_fmt(r.get('engine_steps_direct'), 1)} / {_fmt(r.get('engine_steps_daemon'), 1)} | "
            f"{_fmt(r.get('engine_sleeps_per_token_direct'), 2)} / "
            f"{_fmt(r.get('engine_sleeps_per_token_daemon'), 2)} | {r['same_text']} |"
        )
    if report.get("pooled"):
        lines += [
            "",
            "All workloads pooled (each daemon request against the direct request paired with it, "
            "median and 95 % interval):",
            "",
            "| speculation | client | pairs, per token / first token | ms/token, daemon over direct | "
            "added TTFT, cached (ms) | of it in the daemon (ms) |",
            "|---|---|---|---|---|---|",
        ]
        for r in report["pooled"]:
            lines.append(
                f"| {r['speculation']} | {r['client']} | {r['pairs']} / {r['ttft_pairs']} | "
                f"{_fmt(r['tpot_ratio_paired'])}{_interval(r['tpot_ratio_paired_interval'])} | "
                f"{_fmt(r['ttft_added_paired_ms'], 2)}{_interval(r['ttft_added_paired_interval'], 2)} | "
                f"{_fmt(r.get('ttft_added_in_daemon_ms'), 2)}{_interval(r.get('ttft_added_in_daemon_interval'), 2)} |"
            )
    lines += [
        "",
        "ratio: the medians' ratio; paired: the median of each daemon request's time per token over the "
        "direct request paired with it, with its 95 % interval (bootstrap). The client floor is the same client "
        "and request against a server that answers at once (the HTTP client's own cost, which no server can "
        "remove). Added in the daemon: from the request's arrival (its first bytes read, before they are parsed) "
        "until it began writing the first events, less "
        "the direct request's time to its first token; the rest of the added time is the client's, sending "
        "and reading (after an engine step it reads slower than the floor shows: caches the step evicted). "
        "The engine's first chunk: "
        "from when the engine took the request (its `last_request.first_chunk_ms`); the hop: the daemon's "
        "`engine_first_chunk` less that, per request (a thread hand-over, or the engine process's sockets); "
        "of it to: from the daemon's hand-off (`until_engine`) until the engine took the request (its "
        "`last_request.admitted_at_ms`, on the clock every process shares), the rest is the way back. "
        "The first chunk's hand-over: how long handing it on held the engine (on the CPU the engine gives its "
        "core to the reader until the reader has passed the chunk on; part of the engine's decode time). "
        "Barrier sleeps: how often the native CPU step's threads slept waiting for each other (a partner's "
        "core taken by other work), per token.",
        "",
        "Where the time went on the cached requests (ms, medians). On the client's side, by the clock "
        "it shares with the daemon: from its call until the daemon read the request's first bytes, and from the daemon's "
        "write of the first events until the client read the first token. In the daemon (`timings.trace`): "
        "`until_*` from the request's arrival, the rest summed over the request:",
        "",
    ]
    stages = sorted({k for r in report["rows"] for k in r["trace_cached_ms"]})
    lines.append(
        "| speculation | workload | client | client to daemon | first events to client | " + " | ".join(stages) + " |"
    )
    lines.append("|---|---|---|---|---|" + "---|" * len(stages))
    for r in report["rows"]:
        lines.append(
            f"| {r['speculation']} | {r['workload']} | {r.get('client', 'httpx')} | "
            f"{_fmt(r.get('client_to_daemon_ms'))} | {_fmt(r.get('client_after_first_events_ms'))} | "
            + " | ".join(_fmt(r["trace_cached_ms"].get(k)) for k in stages)
            + " |"
        )
    return "\n".join(lines) + "\n"


def pool_runs(reports: list[dict]) -> dict:
    """One report of several runs' samples. Pairs stay within their run: each (mode, workload,
    client) group holds as many direct samples as daemon ones in every run, in round order, so
    pairing the concatenated lists pairs each run's own."""
    if len(reports) == 1:
        return reports[0]
    joined = {
        key: "; ".join(dict.fromkeys(str(r[key]) for r in reports))
        for key in ("engine", "command", "commit", "date", "machine")
    }
    joined["command"] = f"{len(reports)} runs pooled: " + joined["command"]
    samples = [s for r in reports for s in r["samples"]]
    return joined | {"inputs": inputs([Sample(**s) for s in samples]), "samples": samples}


def _client_names(text: str) -> list[str]:
    names = [name for name in text.split(",") if name]
    if not names or any(name not in CLIENTS for name in names) or len(set(names)) < len(names):
        raise argparse.ArgumentTypeError(f"{text!r}: one or more of {', '.join(CLIENTS)}, each once")
    if "openai" in names and importlib.util.find_spec("openai") is None:
        raise argparse.ArgumentTypeError("the openai client is the openai SDK: pip install openai")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--engine",
        choices=["local", "sglang"],
        default="local",
        help="local: the embedded engine; sglang: the SGLang adapter against a stand-in (default: local)",
    )
    parser.add_argument("--device", default="auto", help="the local engine's device (auto, cpu, cuda)")
    parser.add_argument(
        "--kernels", default="auto", help="the local engine's forward pass (auto, torch, triton, native)"
    )
    parser.add_argument("--model", default=None, help="the model (default: the embedded default)")
    parser.add_argument(
        "--workload",
        default="chat,code-edit",
        help="comma-separated: chat, code-edit (the bench's own, the same each round), stdlib "
        "(a function of Python's standard library, another each round)",
    )
    parser.add_argument(
        "--prompts",
        type=Path,
        default=None,
        metavar="FILE",
        help='also your own requests: JSON Lines of {"messages": [...]}, one a round, in turn',
    )
    parser.add_argument(
        "--clients",
        type=_client_names,
        default=["httpx", "aiohttp"],
        help="comma-separated readers of the daemon, each paired with direct requests of its own: "
        "httpx, aiohttp, openai (the official SDK: its typed chunks, over httpx2), socket "
        "(no HTTP library: what reading the stream costs any client) (default: httpx,aiohttp)",
    )
    parser.add_argument("--speculation", default="off,ngram", help="comma-separated speculation modes (local engine)")
    parser.add_argument(
        "--requests",
        type=int,
        default=3,
        help="measured rounds per workload: in each, a cold and a cached request per client, "
        "and as many direct (default: 3)",
    )
    parser.add_argument("--max-tokens", type=int, default=256, help="tokens per request (ignore_eos; default: 256)")
    parser.add_argument(
        "--step-ms", type=float, default=0.78, help="the SGLang stand-in's time per token (default: 0.78)"
    )
    parser.add_argument(
        "--sglang-stream",
        choices=["incremental", "cumulative"],
        default="incremental",
        help="the stand-in's events: only the new tokens (--incremental-streaming-output, as lingcode's "
        "launch profiles run SGLang) or every token so far (SGLang's default)",
    )
    parser.add_argument(
        "--pause-ms",
        type=float,
        default=0.0,
        metavar="MS",
        help="idle this long before each measured request, direct or through the daemon, so that "
        "neither engine's threads are still awake from the request before (default: 0, back "
        "to back: a direct request follows the one before at once, a daemon's after HTTP)",
    )
    parser.add_argument(
        "--serve-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment variable for the daemon (e.g. LINGCODE_SWITCH_INTERVAL_MS=0.05)",
    )
    parser.add_argument(
        "--out", type=Path, default=None, metavar="PREFIX", help="write PREFIX.json and PREFIX.md (default: print only)"
    )
    parser.add_argument(
        "--report",
        type=Path,
        nargs="+",
        default=None,
        metavar="FILE.json",
        help="measure nothing: summarize an earlier run's samples again (its command, commit and "
        "machine kept), with what this version of the bench reports; several runs' samples "
        "pooled (each run is one daemon and one direct engine: pooled, the processes' own "
        "differences average out)",
    )


def main(args: argparse.Namespace) -> int:
    if args.report is not None:  # earlier runs: their commands, commits, machines and samples as they were
        report = pool_runs([json.loads(path.read_text()) for path in args.report])
        samples = [Sample(**s) for s in report["samples"]]
    else:
        samples = asyncio.run(_run(args))
        report = {
            "engine": (
                args.engine
                if args.engine == "local"
                else f"sglang stand-in, {args.step_ms} ms/token, {args.sglang_stream} stream"
            )
            + "".join(f", {e}" for e in args.serve_env),
            "command": "lingcode bench daemon " + " ".join(sys.argv[3:]),
            "commit": source_commit(),
            "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": f"{platform.machine()}, {_cpus()}, {platform.platform()}, loadavg {os.getloadavg()}",
            "inputs": inputs(samples),
            "samples": [asdict(s) | {"text": s.text[:80]} for s in samples],
        }
    report |= {"rows": summarize(samples), "pooled": pooled(samples)}
    text = markdown(report)
    print(text)
    write_result(args.out, report, text, indent=1)
    return 0


if __name__ == "__main__":
    serve_floor(int(sys.argv[1]))

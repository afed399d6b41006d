"""How long httpx takes to read a streamed answer's first token, by what the server did before it
wrote: answered at once; waited 4 ms idle; or streamed 64 MB through the caches first (an engine
step on this VM streams ~98 MB of weights). The server writes its perf_counter in the first event
(one clock per machine); the client reads it with the same calls as `lingcode bench daemon`.
Also the daemon's own first bytes (a recording: its headers and first two events) against the
floor's, answered at once. Usage: python client_read.py [rounds]; the servers run in a child.
"""

import asyncio
import json
import statistics
import subprocess
import sys
import time

import httpx

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
DAEMON_HEAD = (b"HTTP/1.1 200 OK\r\ndate: Sat, 05 Dec 2026 04:45:16 GMT\r\nserver: uvicorn\r\ncache-control: no-cache\r\n"
               b"x-accel-buffering: no\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
               b"x-request-id: req-840e627eea5362b6\r\ntransfer-encoding: chunked\r\n\r\n")
ROLE = (b'data: {"id":"chatcmpl-2e6d2e2554ec41abb0a6fc1ebdaee0e0","object":"chat.completion.chunk","created":1796445916,'
        b'"model":"smollm2-135m-instruct","choices":[{"index":0,"delta":{"role":"assistant","content":""},'
        b'"logprobs":null,"finish_reason":null}]}\n\n')
VARIANTS = ("at once", "4 ms idle", "64 MB swept", "daemon's bytes")


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def serve(ports: list[int]) -> None:
    import numpy as np

    swept = np.ones(16 * 1024 * 1024, dtype=np.float32)

    class Answer(asyncio.Protocol):
        def __init__(self, variant: str):
            self.variant = variant

        def connection_made(self, transport):
            self.transport, self.buffer = transport, b""

        def data_received(self, data: bytes) -> None:
            self.buffer += data
            while b"\r\n\r\n" in self.buffer:
                head, _, rest = self.buffer.partition(b"\r\n\r\n")
                n = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:")), 0)
                if len(rest) < n:
                    return
                self.buffer = rest[n:]
                if self.variant == "4 ms idle":
                    asyncio.get_running_loop().call_later(0.004, self.answer)
                    continue
                if self.variant == "64 MB swept":
                    swept.sum()
                self.answer()

        def answer(self) -> None:
            event = {"t": time.perf_counter(), "object": "chat.completion.chunk",
                     "choices": [{"index": 0, "delta": {"content": "A"}, "finish_reason": None}]}
            body = b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"
            if self.variant == "daemon's bytes":
                self.transport.write(DAEMON_HEAD + _chunk(ROLE + body))
            else:
                self.transport.write(HEAD + _chunk(body))
            self.transport.write(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")

    async def main() -> None:
        loop = asyncio.get_running_loop()
        servers = [await loop.create_server(lambda v=v: Answer(v), "127.0.0.1", p) for v, p in zip(VARIANTS, ports)]
        await asyncio.gather(*(s.serve_forever() for s in servers))

    asyncio.run(main())


async def one(client: httpx.AsyncClient) -> tuple[float, float]:
    body = {"messages": [{"role": "user", "content": "Write a Python function that returns the n-th Fibonacci number."}],
            "max_tokens": 4, "temperature": 0, "stream": True}
    started, first, written = time.perf_counter(), None, None
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if first is None and event["choices"] and event["choices"][0]["delta"].get("content"):
                first, written = time.perf_counter(), event["t"]
    return (first - started) * 1e3, (first - written) * 1e3


async def measure(rounds: int) -> None:
    import socket

    ports = []
    for _ in VARIANTS:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    child = subprocess.Popen([sys.executable, __file__, "serve", *map(str, ports)])
    time.sleep(3)
    try:
        clients = {v: httpx.AsyncClient(base_url=f"http://127.0.0.1:{p}") for v, p in zip(VARIANTS, ports)}
        got = {v: [] for v in VARIANTS}
        for i in range(rounds + 3):
            for v in VARIANTS:
                result = await one(clients[v])
                if i >= 3:
                    got[v].append(result)
        print("| server | first token, from the call (ms) | from the server's write (ms) |\n|---|---|---|")
        for v in VARIANTS:
            print(f"| {v} | {statistics.median(r[0] for r in got[v]):.3f} | {statistics.median(r[1] for r in got[v]):.3f} |")
    finally:
        child.terminate()


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve([int(p) for p in sys.argv[2:]])
    else:
        asyncio.run(measure(int(sys.argv[1]) if len(sys.argv) > 1 else 200))

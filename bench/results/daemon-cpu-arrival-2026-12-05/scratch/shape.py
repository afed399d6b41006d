"""Scratch: httpx's cost to read a streamed answer's first token, by the shape of the first write."""
import asyncio, time, statistics, json, sys
import httpx, numpy as np

HEAD_A = (b"HTTP/1.1 200 OK\r\ndate: Sat, 05 Dec 2026 20:40:07 GMT\r\nserver: uvicorn\r\ncache-control: no-cache\r\n"
          b"x-accel-buffering: no\r\ncontent-type: text/event-stream; charset=utf-8\r\nx-request-id: req-1b268f7dfd75db42\r\n"
          b"transfer-encoding: chunked\r\n\r\n")
HEAD_B = (b"HTTP/1.1 200 OK\r\ndate: Sat, 05 Dec 2026 20:40:07 GMT\r\ncache-control: no-cache\r\n"
          b"content-type: text/event-stream; charset=utf-8\r\nx-request-id: req-1b268f7dfd75db42\r\n"
          b"transfer-encoding: chunked\r\n\r\n")
ROLE = b'data: {"id":"chatcmpl-63c2938beeee493eba05ef11de71e13e","object":"chat.completion.chunk","created":1796503208,"model":"smollm2-135m-instruct","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n'
TOK = b'data: {"id":"chatcmpl-63c2938beeee493eba05ef11de71e13e","object":"chat.completion.chunk","created":1796503208,"model":"smollm2-135m-instruct","choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}]}\n\n'
MERGED = b'data: {"id":"chatcmpl-63c2938beeee493eba05ef11de71e13e","object":"chat.completion.chunk","created":1796503208,"model":"smollm2-135m-instruct","choices":[{"index":0,"delta":{"role":"assistant","content":"Hello"},"logprobs":null,"finish_reason":null}]}\n\n'
END = b'data: [DONE]\n\n'
def chunk(b): return b"%x\r\n" % len(b) + b + b"\r\n"
VARIANTS = {"A": HEAD_A + chunk(ROLE + TOK), "B": HEAD_B + chunk(ROLE + TOK), "C": HEAD_A + chunk(MERGED)}
REST = chunk(END) + b"0\r\n\r\n"
state = {"v": "A", "written": 0.0}

class Proto(asyncio.Protocol):
    def connection_made(self, t): self.t, self.buf = t, b""
    def data_received(self, d):
        self.buf += d
        if b"\r\n\r\n" in self.buf:
            head, _, body = self.buf.partition(b"\r\n\r\n")
            n = int([l.split(b":")[1] for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")][0])
            if len(body) >= n:
                self.buf = b""
                state["written"] = time.perf_counter()
                self.t.write(VARIANTS[state["v"]])
                asyncio.get_running_loop().call_later(0.002, self.t.write, REST)

big = np.ones(64 << 20 >> 3)
async def main():
    server = await asyncio.get_running_loop().create_server(Proto, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    res = {k: [] for k in VARIANTS}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as c:
        for i in range(int(sys.argv[1])):
            for v in (VARIANTS if i % 2 else reversed(list(VARIANTS))):
                state["v"] = v
                big.sum()  # the caches, as an engine step leaves them
                async with c.stream("POST", "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "stream": True}) as r:
                    got = None
                    async for line in r.aiter_lines():
                        if got is None and line.startswith("data: {") and '"content":"' in line and '"content":""' not in line:
                            got = time.perf_counter()
                if i >= 10: res[v].append((got - state["written"]) * 1e3)
    for k, v in res.items(): print(k, round(statistics.median(v), 3), len(v))
asyncio.run(main())

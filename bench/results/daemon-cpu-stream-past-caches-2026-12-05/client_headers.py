"""Scratch: httpx.AsyncClient against a server (a process of its own) that answers at once with a
daemon-like or a minimal response head, with or without OpenAI's separate role chunk; median us to
the first content event. usage: python client_headers.py min|ours role|norole"""
import asyncio, json, time, statistics, sys, threading, httpx
ev_role = b'data: {"id":"chatcmpl-2b79061a193647ed8bf1e0ff0068ba4e","object":"chat.completion.chunk","created":1796426496,"model":"smollm2-135m-instruct","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n'
ev_c = b'data: {"id":"chatcmpl-2b79061a193647ed8bf1e0ff0068ba4e","object":"chat.completion.chunk","created":1796426496,"model":"smollm2-135m-instruct","choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}]}\n\n'
ev_end = b'data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"length"}]}\n\ndata: [DONE]\n\n'
def chunk(b): return b"%x\r\n%s\r\n" % (len(b), b)
heads = {
 "min": b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n",
 "ours": b"HTTP/1.1 200 OK\r\ndate: Fri, 04 Dec 2026 23:21:35 GMT\r\nserver: uvicorn\r\ncache-control: no-cache\r\nx-accel-buffering: no\r\ncontent-type: text/event-stream; charset=utf-8\r\nx-request-id: req-0d3daa9bfdd97deb\r\ntransfer-encoding: chunked\r\n\r\n",
}
mode = sys.argv[1]; role = sys.argv[2] == "role"
ans = heads[mode] + chunk((ev_role if role else b"") + ev_c) + chunk(ev_end) + b"0\r\n\r\n"
class P(asyncio.Protocol):
    def connection_made(self, t): self.t, self.b = t, b""
    def data_received(self, d):
        self.b += d
        while b"\r\n\r\n" in self.b:
            head, _, rest = self.b.partition(b"\r\n\r\n")
            n = next(int(l.split(b":")[1]) for l in head.split(b"\r\n") if l.lower().startswith(b"content-length"))
            if len(rest) < n: return
            self.b = rest[n:]; self.t.write(ans)
def srv():
    loop = asyncio.new_event_loop()
    s = loop.run_until_complete(loop.create_server(P, "127.0.0.1", 8555)); loop.run_forever()
import multiprocessing
p = multiprocessing.Process(target=srv, daemon=True); p.start(); time.sleep(0.5)
body = {"messages": [{"role": "user", "content": "hi"*100}], "max_tokens": 8, "stream": True}
async def main():
    c = httpx.AsyncClient(base_url="http://127.0.0.1:8555")
    ts = []
    for i in range(600):
        t0 = time.perf_counter(); first = None
        async with c.stream("POST", "/v1/chat/completions", json=body) as r:
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]": continue
                ch = json.loads(line[6:])
                if first is None and ch["choices"][0]["delta"].get("content"): first = time.perf_counter()
        ts.append((first - t0) * 1e6)
    print(mode, sys.argv[2], "median us", round(statistics.median(ts[100:])))
asyncio.run(main()); p.terminate()

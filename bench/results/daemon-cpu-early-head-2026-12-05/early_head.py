"""Does an early response head take httpx's head work off the first token's path?
Server: answers each POST after DELAY ms; head either at once (early) or with the body (held)."""
import asyncio, json, sys, time, statistics
import httpx
sys.path.insert(0, "/work/main")
from lingcode.bench.daemon import _FLOOR_EVENTS

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
BODY = b"%x\r\n%s\r\n0\r\n\r\n" % (len(_FLOOR_EVENTS), _FLOOR_EVENTS)
DELAY = 0.003
MODE = {"early": True}

class P(asyncio.Protocol):
    def connection_made(self, t): self.t, self.buf = t, b""
    def data_received(self, data):
        self.buf += data
        while b"\r\n\r\n" in self.buf:
            head, _, rest = self.buf.partition(b"\r\n\r\n")
            n = next((int(l.split(b":",1)[1]) for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")), 0)
            if len(rest) < n: return
            self.buf = rest[n:]
            if MODE["early"]:
                self.t.write(HEAD)
                asyncio.get_running_loop().call_later(DELAY, self.t.write, BODY)
            else:
                asyncio.get_running_loop().call_later(DELAY, self.t.write, HEAD + BODY)

def server(port, mode):
    MODE["early"] = mode == "early"
    async def main():
        s = await asyncio.get_running_loop().create_server(P, "127.0.0.1", port)
        await s.serve_forever()
    asyncio.run(main())

async def client(port, n):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stream": True}
    out = []
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as c:
        for i in range(n):
            await asyncio.sleep(0.02)
            t0 = time.perf_counter()
            async with c.stream("POST", "/v1/chat/completions", json=body) as r:
                t1 = None
                async for line in r.aiter_lines():
                    if t1 is None and line.startswith("data: {"):
                        t1 = time.perf_counter()
            out.append((t1 - t0) * 1e3 - DELAY * 1e3)
    return out

if __name__ == "__main__":
    if sys.argv[1] == "serve":
        server(int(sys.argv[2]), sys.argv[3])
    else:
        import subprocess
        res = {"early": [], "held": []}
        for rnd in range(6):
            for mode in ("early", "held"):
                port = 18000 + rnd * 2 + (mode == "held")
                p = subprocess.Popen([sys.executable, __file__, "serve", str(port), mode])
                time.sleep(0.8)
                v = asyncio.run(client(port, 150))
                p.terminate(); p.wait()
                res[mode].append(statistics.median(v[20:]))
                print(rnd, mode, round(res[mode][-1], 3), flush=True)
        for m, v in res.items(): print(m, [round(x, 3) for x in v], "median", round(statistics.median(v), 3))

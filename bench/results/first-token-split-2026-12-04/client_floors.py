"""Scratch: each client's own cost, against lingcode.bench.daemon's answer-at-once server (in this process, on a thread)."""
import asyncio, time, statistics, json, threading
import httpx, openai
from lingcode.bench.daemon import _AnswerAtOnce
loop = asyncio.new_event_loop()
srv = loop.run_until_complete(loop.create_server(_AnswerAtOnce, "127.0.0.1", 0))
port = srv.sockets[0].getsockname()[1]
threading.Thread(target=loop.run_forever, daemon=True).start()
# separate process would be fairer; the server is tiny
base = f"http://127.0.0.1:{port}"
body = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stream": True}
def sync_httpx(c):
    t0 = time.perf_counter()
    with c.stream("POST", "/v1/chat/completions", json=body) as r:
        for line in r.iter_lines():
            if '"content"' in line: return time.perf_counter() - t0
async def async_httpx(c):
    t0 = time.perf_counter()
    async with c.stream("POST", "/v1/chat/completions", json=body) as r:
        async for line in r.aiter_lines():
            if '"content"' in line: t = time.perf_counter() - t0
    return t
def sdk(c):
    t0 = time.perf_counter()
    for ch in c.chat.completions.create(**body):
        if ch.choices and ch.choices[0].delta.content: t = time.perf_counter() - t0
    return t
sc = httpx.Client(base_url=base); oc = openai.OpenAI(base_url=base + "/v1", api_key="x")
ac = httpx.AsyncClient(base_url=base)
aloop = asyncio.new_event_loop()
for rnd in range(3):
    for name, f in [("httpx sync", lambda: sync_httpx(sc)), ("httpx async", lambda: aloop.run_until_complete(async_httpx(ac))), ("openai sdk sync", lambda: sdk(oc))]:
        xs = [f() for _ in range(60)][10:]
        print(f"{name:16s} {statistics.median(xs)*1e3:.3f} ms")

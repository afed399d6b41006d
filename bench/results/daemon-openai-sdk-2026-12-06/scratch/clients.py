"""Client-side first token of a cached 4-token chat through a running daemon: httpx, httpx2, the openai SDK, aiohttp, alternating."""
import asyncio, json, os, statistics, sys, time
import aiohttp, httpx, httpx2, openai

BASE, TOKEN = sys.argv[1], open(sys.argv[2]).read().strip()
N = int(sys.argv[3]) if len(sys.argv) > 3 else 60
MSG = [{"role": "user", "content": "Write a Python function that merges two sorted lists."}]
BODY = {"model": "x", "messages": MSG, "max_tokens": 4, "temperature": 0, "stream": True, "ignore_eos": True}
H = {"Authorization": f"Bearer {TOKEN}"}

async def via_httpx(c):
    t = time.perf_counter()
    first = None
    async with c.stream("POST", "/v1/chat/completions", json=BODY) as r:
        async for line in r.aiter_lines():
            if first is None and line.startswith("data: ") and line != "data: [DONE]":
                ch = json.loads(line[6:])
                if ch["choices"] and ch["choices"][0]["delta"].get("content"):
                    first = time.perf_counter()
    return (first - t) * 1e3

async def via_aiohttp(c):
    t = time.perf_counter()
    first = None
    async with c.post("/v1/chat/completions", json=BODY) as r:
        async for raw in r.content:
            line = raw.decode().rstrip("\r\n")
            if first is None and line.startswith("data: ") and line != "data: [DONE]":
                ch = json.loads(line[6:])
                if ch["choices"] and ch["choices"][0]["delta"].get("content"):
                    first = time.perf_counter()
    return (first - t) * 1e3

async def via_openai(c):
    t = time.perf_counter()
    first = None
    stream = await c.chat.completions.create(model="x", messages=MSG, max_tokens=4, temperature=0, stream=True,
                                             extra_body={"ignore_eos": True})
    async for ch in stream:
        if first is None and ch.choices and ch.choices[0].delta.content:
            first = time.perf_counter()
    return (first - t) * 1e3

async def main():
    clients = {
        "httpx": (httpx.AsyncClient(base_url=BASE, headers=H, timeout=600), via_httpx),
        "httpx2": (httpx2.AsyncClient(base_url=BASE, headers=H, timeout=600), via_httpx),
        "openai": (openai.AsyncOpenAI(base_url=BASE + "/v1", api_key=TOKEN), via_openai),
        "aiohttp": (aiohttp.ClientSession(BASE, headers=H), via_aiohttp),
    }
    res = {k: [] for k in clients}
    names = list(clients)
    for i in range(N + 2):
        order = names[i % len(names):] + names[:i % len(names)]
        for k in order:
            c, f = clients[k]
            await asyncio.sleep(0.005)
            v = await f(c)
            if i >= 2: res[k].append(v)
    for k, v in res.items():
        print(f"{k:8} first token p50 {statistics.median(v):6.2f} ms  (n={len(v)}, p25 {statistics.quantiles(v, n=4)[0]:.2f}, p75 {statistics.quantiles(v, n=4)[2]:.2f})")
    for k, (c, _) in clients.items():
        await (c.close() if k in ("aiohttp", "openai") else c.aclose())

asyncio.run(main())

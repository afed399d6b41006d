"""Scratch: against the running daemon, cached requests of 1, 2 and 16 tokens in turn (80 rounds,
10 ms apart), read by httpx.AsyncClient: does the engine's next step slow the client's first token?"""
import asyncio, json, sys, time, statistics, httpx
from lingcode.client import read_daemon_file
d = read_daemon_file()
msgs = [{"role": "user", "content": "Write a Python function that parses an ISO 8601 duration like P3DT4H into seconds."}]
c = httpx.AsyncClient(base_url=d.url, headers={"Authorization": f"Bearer {d.token}"})
async def hx(mt):
    body = {"model": "x", "messages": msgs, "max_tokens": mt, "ignore_eos": True, "temperature": 0, "stream": True}
    t0 = time.perf_counter(); first = None
    async with c.stream("POST", "/v1/chat/completions", json=body) as r:
        async for line in r.aiter_lines():
            if first is None and '"content":"' in line and '"content":""' not in line: first = time.perf_counter() - t0
    return first * 1e3
async def main():
    res = {1: [], 2: [], 16: []}
    for i in range(3): await hx(8)
    for i in range(80):
        for mt in res:
            res[mt].append(await hx(mt)); await asyncio.sleep(0.01)
    print(" ".join(f"mt{k} {statistics.median(v):.3f}" for k, v in res.items()))
asyncio.run(main())

import asyncio, json, time, httpx, statistics, sys, aiohttp
import os
ports = {"huge": 18781, "off": 18782} if os.environ.get("SWAP") != "1" else {"huge": 18782, "off": 18781}
toks = {k: open(f"/tmp/lh{p}/config/token").read().strip() for k, p in ports.items()}
N = int(sys.argv[1]) if len(sys.argv) > 1 else 100
MAXT = int(sys.argv[2]) if len(sys.argv) > 2 else 16
prompts = [l for l in open("/work/main/bench/results/daemon-h200-2026-12-02-inputs/prompts.jsonl")]
async def one(c, msgs):
    body = {"messages": msgs, "max_tokens": MAXT, "temperature": 0, "ignore_eos": True, "stream": True}
    t0 = time.perf_counter(); first = None; tr = None
    async with c.post("/v1/chat/completions", json=body, headers={"x-lingcode-trace": "1"}) as r:
        async for raw in r.content:
            line = raw.decode().rstrip("\r\n")
            if line.startswith("data: {"):
                d = json.loads(line[6:])
                if first is None and d["choices"] and d["choices"][0]["delta"].get("content"): first = time.perf_counter()
                if d.get("timings"): tr = d["timings"].get("trace")
    return (first - t0) * 1e3, tr
async def main():
    cs = {k: aiohttp.ClientSession(base_url=f"http://127.0.0.1:{p}", headers={"Authorization": f"Bearer {toks[k]}"}) for k, p in ports.items()}
    res = {k: [] for k in ports}
    msgs = [{"role": "user", "content": "Explain what a Python generator is, briefly."}]
    for k in ports:
        for _ in range(3): await one(cs[k], msgs)
    for i in range(N):
        order = list(ports) if i % 2 == 0 else list(ports)[::-1]
        for k in order:
            res[k].append(await one(cs[k], msgs))
    keys = ["ttft", "until_handler", "body", "validate", "prompt", "until_engine", "engine_first_chunk", "until_first_events", "loop_cpu"]
    print(f"{'':22s}" + "".join(f"{k:>10s}" for k in ports))
    for key in keys:
        vals = {}
        for k in ports:
            xs = [t if key == "ttft" else tr.get(key) for t, tr in res[k]]
            xs = [x for x in xs if x is not None]
            vals[k] = statistics.median(xs) if xs else float("nan")
        print(f"{key:22s}" + "".join(f"{vals[k]:10.3f}" for k in ports))
    # the daemon's own part: until_first_events - engine_first_chunk
    for k in ports:
        own = [tr["until_first_events"] - tr["engine_first_chunk"] for t, tr in res[k]]
        cl = [t - tr["until_first_events"] for t, tr in res[k]]
        print(k, "daemon own (first events - engine first chunk) p50 %.3f" % statistics.median(own), " client part p50 %.3f" % statistics.median(cl))
asyncio.run(main())

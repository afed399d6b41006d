"""Scratch: N cached short chats through httpx (each sent twice, the second read), the daemon's trace marks; json to argv[2]."""
import httpx, json, time, sys, asyncio, statistics
tok = open('/tmp/lh/config/token').read().strip()
prompts = ["Write a Python function that reverses a string.", "Explain list comprehensions briefly.", "What is a closure in Python?", "Sort a dict by value."]
async def main():
    rows = []
    async with httpx.AsyncClient(base_url="http://127.0.0.1:8931", headers={"Authorization": f"Bearer {tok}", "x-lingcode-trace": "1"}, timeout=60) as c:
        for i in range(int(sys.argv[1])):
            body = {"messages": [{"role": "user", "content": prompts[i % 4]}], "max_tokens": 16, "stream": True, "temperature": 0,
                    "ignore_eos": True, "stream_options": {"include_usage": True}}
            for rep in (0, 1):
                t0 = time.perf_counter(); first = None; trace = None
                async with c.stream("POST", "/v1/chat/completions", json=body) as r:
                    async for line in r.aiter_lines():
                        if line.startswith("data: {"):
                            ch = json.loads(line[6:])
                            if first is None and ch.get("choices") and ch["choices"][0]["delta"].get("content"):
                                first = time.perf_counter()
                            if ch.get("timings"):
                                trace = ch["timings"].get("trace")
                if rep == 1 and trace:
                    trace["client_ttft"] = (first - t0) * 1e3
                    rows.append(trace)
                await asyncio.sleep(0.03)
    json.dump(rows, open(sys.argv[2], "w"))
    for k in ("until_handler", "until_engine", "engine_first_chunk", "until_first_events", "client_ttft"):
        print(k, round(statistics.median(r[k] for r in rows if k in r), 3))
asyncio.run(main())

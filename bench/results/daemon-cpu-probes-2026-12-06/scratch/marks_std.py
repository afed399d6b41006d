import httpx, json, sys, time, statistics, collections
from pathlib import Path
home = Path(sys.argv[1]); n = int(sys.argv[2]); pause = float(sys.argv[3]) if len(sys.argv) > 3 else 0.02
mt = int(sys.argv[4]) if len(sys.argv) > 4 else 4
info = json.loads((home / "state" / "daemon.json").read_text())
tok = Path(info["token_file"]).read_text().strip()
c = httpx.Client(base_url=info["url"], headers={"authorization": f"Bearer {tok}", "x-lingcode-trace": "1"})
body = {"messages": [{"role": "user", "content": "What is a hash map?"}], "max_tokens": mt, "temperature": 0, "ignore_eos": True, "stream": True}
acc = collections.defaultdict(list)
for i in range(n):
    t0 = time.perf_counter(); first = None
    with c.stream("POST", "/v1/chat/completions", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                ch = json.loads(line[6:])
                if first is None and ch["choices"] and ch["choices"][0]["delta"].get("content"): first = time.perf_counter()
                if ch.get("timings", {}).get("trace"):
                    for k, v in ch["timings"]["trace"].items(): acc[k].append(v)
                    acc["tpot_ms"].append(ch["timings"].get("tpot_ms") or 0)
    acc["client_ttft"].append((first - t0) * 1e3)
    time.sleep(pause)
keys = ["until_handler", "body", "validate", "prompt", "until_engine", "engine_first_chunk", "until_first_events", "client_ttft", "tpot_ms", "loop_cpu"]
print(" ".join(f"{k}={statistics.median(acc[k]):.3f}" for k in keys))

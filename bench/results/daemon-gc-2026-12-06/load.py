"""N short chats (not streamed) through a running daemon, one after another; client-side latency of each."""
import json, statistics, sys, time, httpx
base, token, n = sys.argv[1], open(sys.argv[2]).read().strip(), int(sys.argv[3])
c = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=60)
lat = []
print("load starts", time.perf_counter(), flush=True)
for i in range(n):
    t = time.perf_counter()
    body = {"messages": [{"role": "user", "content": f"Question {i % 50}: name a sorting algorithm."}], "max_tokens": 4, "temperature": 0}
    r = c.post("/v1/chat/completions", json=body); r.raise_for_status()
    lat.append((time.perf_counter() - t) * 1e3)
lat.sort()
print(f"n={n} p50 {lat[n//2]:.2f} p99 {lat[int(n*0.99)]:.2f} max {lat[-1]:.2f} ms")

import httpx, json, time, sys, glob, collections, os
port = int(sys.argv[1]); n = int(sys.argv[2]) if len(sys.argv) > 2 else 10
base = f"http://127.0.0.1:{port}"
tok = open(os.path.expanduser(sys.argv[3])).read().strip() if len(sys.argv) > 3 and sys.argv[3] else None
h = {"Authorization": f"Bearer {tok}"} if tok else {}
body = {"model": "x", "messages": [{"role": "user", "content": "What is a hash map? Answer briefly."}],
        "max_tokens": 32, "stream": True, "temperature": 0}
marks = []
with httpx.Client(headers=h, timeout=60) as c:
    for i in range(n):
        t0 = time.perf_counter()
        first = None
        with c.stream("POST", base + "/v1/chat/completions", json=body) as r:
            for line in r.iter_lines():
                if first is None and '"content"' in line: first = time.perf_counter()
        t1 = time.perf_counter()
        marks.append((t0, first, t1))
        c.get(base + '/v1/lingcode/stats')
        time.sleep(0.005)
json.dump(marks, open("/tmp/gcprobe/marks.json", "w"))
print("ttft ms", [round((f - a) * 1e3, 2) for a, f, b in marks])

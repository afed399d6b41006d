# many requests of several kinds, gc events counted afterwards
import httpx, json, time, sys, random
port = int(sys.argv[1]); tok = open(sys.argv[2]).read().strip(); n = int(sys.argv[3])
h = {"Authorization": f"Bearer {tok}"}
marks = []
words = "alpha beta gamma delta list dict parse file code hash tree sort merge graph node edge".split()
with httpx.Client(headers=h, timeout=60) as c:
    for i in range(n):
        q = " ".join(random.choice(words) for _ in range(8))
        body = {"model": "x", "messages": [{"role": "user", "content": f"Explain {q}."}], "max_tokens": 16, "stream": i % 2 == 0}
        t0 = time.perf_counter()
        r = c.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body)
        marks.append((t0, time.perf_counter()))
json.dump(marks, open("/tmp/gcprobe/marks2.json", "w"))

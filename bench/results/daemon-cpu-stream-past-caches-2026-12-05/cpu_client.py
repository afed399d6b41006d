"""Scratch: 150 back-to-back cached 4-token chat requests to serve_cpu.py on a bare socket; medians of each point (us; ttft in ms)."""
import json, socket, statistics, sys, time
from lingcode.client import read_daemon_file
d = read_daemon_file(); host, port = d.url.split("//")[1].split(":")
n = int(sys.argv[1])
msgs = [{"role": "user", "content": "Write a Python function that parses an ISO 8601 duration like P3DT4H into seconds."}]
body = json.dumps({"model": "x", "messages": msgs, "max_tokens": 4, "ignore_eos": True, "temperature": 0, "stream": True}).encode()
req = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Lingcode-Trace: 1\r\nAuthorization: Bearer " + d.token.encode()
       + b"\r\nContent-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
s = socket.create_connection((host, int(port))); s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
rows = []
for i in range(n + 3):
    t0 = time.perf_counter(); s.sendall(req); buf = b""; first = None
    while b"0\r\n\r\n" not in buf[-16:]:
        buf += s.recv(65536)
        if first is None and b'"content":"' in buf: first = time.perf_counter()
    tr = json.loads(buf[buf.index(b'"trace":') + 8:].split(b"}", 1)[0] + b"}")
    tr["ttft"] = (first - t0) * 1e3
    rows.append(tr)
    time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 0)
keys = [k for k in rows[3] if k.startswith("cpu_")] + ["ttft"]
print("\n".join(f"{k.replace('cpu_','')}={statistics.median(r[k] for r in rows[3:]):.3f}" for k in keys))

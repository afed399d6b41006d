"""Scratch: back-to-back cached TTFT through the running daemon, read on a bare socket and by httpx.AsyncClient."""
import asyncio, json, socket, sys, time, statistics
import httpx
from lingcode.client import read_daemon_file
d = read_daemon_file()
host, port = d.url.split("//")[1].split(":")
n = int(sys.argv[1])
msgs = [{"role": "user", "content": "Write a Python function that parses an ISO 8601 duration like P3DT4H into seconds."}]
body = {"model": "x", "messages": msgs, "max_tokens": 8, "ignore_eos": True, "temperature": 0, "stream": True}
raw = json.dumps(body).encode()
req = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + d.token.encode() +
       b"\r\nContent-Type: application/json\r\nContent-Length: " + str(len(raw)).encode() + b"\r\n\r\n" + raw)
s = socket.create_connection((host, int(port))); s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
def sock():
    t0 = time.perf_counter(); s.sendall(req); buf = b""; first = None
    while b"0\r\n\r\n" not in buf[-16:]:
        buf += s.recv(65536)
        if first is None and b'"content":"' in buf: first = time.perf_counter() - t0
    return first * 1e3
c = httpx.AsyncClient(base_url=d.url, headers={"Authorization": f"Bearer {d.token}"})
async def hx():
    t0 = time.perf_counter(); first = None
    async with c.stream("POST", "/v1/chat/completions", json=body) as r:
        async for line in r.aiter_lines():
            if first is None and '"content":"' in line: first = time.perf_counter() - t0
    return first * 1e3
loop = asyncio.new_event_loop()
out = {}
for name, f in [("socket", sock), ("httpx", lambda: loop.run_until_complete(hx()))]:
    for _ in range(3): f()
    out[name] = statistics.median([f() for _ in range(n)])
print(" ".join(f"{k} {v:.3f}" for k, v in out.items()))

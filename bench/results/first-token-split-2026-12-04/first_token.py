"""Scratch: where a cached prompt's first token goes, against serve_timed.py, read on a bare socket.
Usage: python first_token.py N [PAUSE_S]; prints medians (ms) of N requests after 3 unmeasured ones."""
import json
import socket
import statistics
import sys
import time

from lingcode.client import read_daemon_file

d = read_daemon_file()
host, port = d.url.split("//")[1].split(":")
n = int(sys.argv[1])
pause = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
s = socket.create_connection((host, int(port)))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
msgs = [{"role": "user", "content": "Write a Python function that parses an ISO 8601 duration like P3DT4H into seconds."}]
body = json.dumps({"model": "x", "messages": msgs, "max_tokens": 4, "ignore_eos": True, "temperature": 0,
                   "stream": True}).encode()
req = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Lingcode-Trace: 1\r\nAuthorization: Bearer "
       + d.token.encode() + b"\r\nContent-Type: application/json\r\nContent-Length: " + str(len(body)).encode()
       + b"\r\n\r\n" + body)
rows = []
for i in range(n + 3):
    t0 = time.perf_counter()
    s.sendall(req)
    buf, first = b"", None
    while b"0\r\n\r\n" not in buf[-16:]:
        data = s.recv(65536)
        if not data:
            raise SystemExit("the daemon closed the connection")
        buf += data
        if first is None and b'"content":"' in buf:
            first = time.perf_counter()
    tr = json.loads(buf[buf.index(b'"trace":') + 8:].split(b"}", 1)[0] + b"}")
    t0, first = t0 * 1e3, first * 1e3
    rows.append({
        "sent -> received (kernel)": tr["recv_abs"] - t0,
        "uvicorn's parse": tr["parsed_abs"] - tr["recv_abs"],
        "parsed -> app": tr["app_abs"] - tr["parsed_abs"],
        "app -> daemon's trace": tr["started_abs"] - tr["app_abs"],
        "sent -> daemon's trace (arrive)": tr["started_abs"] - t0,
        "until_engine": tr["until_engine"],
        "engine_first_chunk": tr["engine_first_chunk"],
        "first chunk -> first write (post)": tr["until_first_body"] - tr["until_engine"] - tr["engine_first_chunk"],
        "the write": tr["write_ms"],
        "after the write -> client has it": first - tr["write_abs"] - tr["write_ms"],
        "client-side TTFT": first - t0,
    })
    time.sleep(pause)
for key in rows[0]:
    print(f"{key:36s} {statistics.median(r[key] for r in rows[3:]):7.3f} ms")

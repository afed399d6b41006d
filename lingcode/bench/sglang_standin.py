"""An SGLang-wire stand-in for `lingcode bench daemon --engine sglang`: SGLang 0.5.23's native
`/generate` stream, one token every --step-ms, so the adapter's cost per token shows at the
production engine's speed (Ling-3.0-flash + DSpark at concurrency 1: 0.78 ms per token).

It serves no model: it streams the token ids it is given (cycled up to max_new_tokens) in SGLang's
exact event format (see lingcode/engine/sglang/adapter.py for the format and its source), paced
against absolute deadlines so the average step is exact. It also answers /server_info, /health,
/health_generate and /abort_request, which is all lingcode's attach path asks of a server.

    python -m lingcode.bench.sglang_standin --port 30000 --step-ms 0.78 --ids 1,2,3 [--incremental]
"""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DONE = b"data: [DONE]\n\n"


def event(out: dict) -> bytes:
    return b"data: " + json.dumps(out, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


def meta(rid: str, prompt_tokens: int, n_out: int, finish=None) -> dict:
    return {
        "id": rid,
        "finish_reason": finish,
        "prompt_tokens": prompt_tokens,
        "weight_version": "default",
        "num_retractions": 0,
        "reasoning_tokens": 0,
        "completion_tokens": n_out,
        "cached_tokens": 0,
    }


class StandIn:
    def __init__(self, ids: list[int], step_s: float, incremental: bool, context_length: int):
        self.ids, self.step_s, self.incremental = ids, step_s, incremental
        self.aborted: set[str] = set()
        self.lock = threading.Lock()
        self.server_info = {
            "version": "0.5.23",
            "context_length": context_length,
            "max_req_input_len": context_length - 1,
            "incremental_streaming_output": incremental,
            "speculative_algorithm": None,
            "tp_size": 1,
            "model_path": "stand-in",
        }

    def stream(self, rid: str, body: dict, write) -> None:
        params = body.get("sampling_params") or {}
        n = int(params.get("max_new_tokens") or 16)
        stop_ids = set(params.get("stop_token_ids") or []) if not params.get("ignore_eos") else set()
        prompt_tokens = len(body.get("input_ids") or [])
        out: list[int] = []
        start = time.perf_counter()
        for i in range(n):
            deadline = start + (i + 1) * self.step_s
            while (left := deadline - time.perf_counter()) > 0:
                time.sleep(left if left > 0.0002 else 0)
            token = self.ids[i % len(self.ids)]
            out.append(token)
            with self.lock:
                aborted = rid in self.aborted
            finish = None
            if aborted:
                finish = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
            elif token in stop_ids:
                finish = {"type": "stop", "matched": token}
            elif i == n - 1:
                finish = {"type": "length", "length": n}
            ids = [token] if self.incremental else out
            write(event({"text": None, "output_ids": ids, "meta_info": meta(rid, prompt_tokens, len(out), finish)}))
            if finish is not None:
                break
        write(DONE)


def handler(standin: StandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            # SGLang serves with uvicorn, whose sockets have Nagle off; without this each event would
            # wait for the client's delayed ACK (40 ms).
            self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def log_message(self, *args) -> None:
            pass

        def _send(self, status: int, body: bytes = b"") -> None:
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path in ("/health", "/health_generate"):
                self._send(200)
            elif self.path == "/server_info":
                self._send(200, json.dumps(standin.server_info).encode())
            else:
                self._send(404, b'{"detail":"Not Found"}')

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
            if self.path == "/abort_request":
                with standin.lock:
                    standin.aborted.add(body.get("rid"))
                self._send(200)
                return
            if self.path != "/generate":
                self._send(404, b'{"detail":"Not Found"}')
                return
            self.send_response(200)
            self.send_header("content-type", "text/event-stream; charset=utf-8")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()

            def write(data: bytes) -> None:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

            try:
                standin.stream(body["rid"], body, write)
                self.wfile.write(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client went away

    return Handler


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--step-ms", type=float, default=0.78)
    parser.add_argument("--ids", required=True, help="comma-separated token ids to stream (cycled)")
    parser.add_argument("--incremental", action="store_true", help="as SGLang with --incremental-streaming-output")
    parser.add_argument("--context-length", type=int, default=8192)
    args = parser.parse_args(argv)
    standin = StandIn([int(i) for i in args.ids.split(",")], args.step_ms / 1e3, args.incremental, args.context_length)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), handler(standin))
    server.daemon_threads = True
    print(f"SGLang stand-in on 127.0.0.1:{args.port}, a token every {args.step_ms} ms", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()

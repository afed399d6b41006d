"""SGLang 0.5.23's `/generate` streaming wire format, byte for byte, and a tiny server that replays it.

This is a test fixture, not an engine: it generates nothing, it plays back event streams shaped
exactly as SGLang writes them, so the adapter's parser, abort and error paths can be tested
without GPUs. The shapes come from SGLang's source:

- entrypoints/http_server.py, `generate_request` / `stream_results`: each event is
  `b"data: " + dumps_json(out) + b"\\n\\n"` (orjson, compact), the stream ends with
  `b"data: [DONE]\\n\\n"`; an error mid-stream is one `{"error": {"message", "type", "code",
  "retryable"}}` event, then `[DONE]`. `/abort_request` takes `{"rid": ...}` and answers 200 with
  no body. Served by uvicorn: HTTP/1.1, chunked.
- managers/tokenizer_manager.py, `_handle_batch_output`: `out` is `{"text", "output_ids",
  "meta_info"}`; without --incremental-streaming-output `text` and `output_ids` hold everything so
  far. `meta_info` is built in this key order: id, finish_reason, prompt_tokens, weight_version,
  num_retractions, reasoning_tokens, completion_tokens, cached_tokens. `_stream_one_response` adds
  `response_sent_to_client_ts` to the first event only; the final event gets `e2e_latency` and,
  under speculation, `_calculate_spec_decoding_metrics`' spec_accept_rate, spec_accept_length,
  spec_num_correct_drafts, spec_num_proposed_drafts, spec_verify_ct.
- managers/schedule_batch.py: finish reasons `{"type": "stop", "matched": id}`,
  `{"type": "length", "length": n}`, `{"type": "abort", "message", "status_code", "err_type"}`.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DONE = b"data: [DONE]\n\n"

# A DSpark request as SGLang 0.5.23 streams it: a 5-token prompt with 3 tokens from the radix
# cache; the first event carries the prefill's token, each later one what verify steps accepted;
# the last ends on the eos id 156895 (kept in output_ids, trimmed from text). 10 tokens over 3
# verify steps of 8 drafts: accept length 10 / 3 (SGLang counts completion_tokens / verify_ct),
# 6 of 24 drafts correct. Checked against SGLang's own dumps_json by tests/test_sglang_contract.py.
DSPARK_STREAM = [
    b'data: {"text":"def","output_ids":[1293],"meta_info":{"id":"req-7-0a1b","finish_reason":null,"prompt_tokens":5,"weight_version":"default","num_retractions":0,"reasoning_tokens":0,"completion_tokens":1,"cached_tokens":3,"response_sent_to_client_ts":1764424800.5123}}\n\n',
    b'data: {"text":"def reverse(s):","output_ids":[1293,11911,1141,82,1438],"meta_info":{"id":"req-7-0a1b","finish_reason":null,"prompt_tokens":5,"weight_version":"default","num_retractions":0,"reasoning_tokens":0,"completion_tokens":5,"cached_tokens":3}}\n\n',
    b'data: {"text":"def reverse(s):\\n    return s[::-1]","output_ids":[1293,11911,1141,82,1438,198,262,470,274,156895],"meta_info":{"id":"req-7-0a1b","finish_reason":{"type":"stop","matched":156895},"prompt_tokens":5,"weight_version":"default","num_retractions":0,"reasoning_tokens":0,"completion_tokens":10,"cached_tokens":3,"e2e_latency":0.0412,"spec_accept_rate":0.25,"spec_accept_length":3.3333333333333335,"spec_num_correct_drafts":6,"spec_num_proposed_drafts":24,"spec_verify_ct":3}}\n\n',
    DONE,
]
DSPARK_TOKENS = [1293, 11911, 1141, 82, 1438, 198, 262, 470, 274, 156895]

ERROR_STREAM = [
    b'data: {"error":{"message":"The input (140000 tokens) is longer than the model\'s context length (131072 tokens).","type":"invalid_request_error","code":400,"retryable":false}}\n\n',
    DONE,
]


def event(out: dict) -> bytes:
    return b"data: " + json.dumps(out, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


def meta(rid: str, n_out: int, finish=None, prompt_tokens: int = 4, cached_tokens: int = 0) -> dict:
    return {
        "id": rid,
        "finish_reason": finish,
        "prompt_tokens": prompt_tokens,
        "weight_version": "default",
        "num_retractions": 0,
        "reasoning_tokens": 0,
        "completion_tokens": n_out,
        "cached_tokens": cached_tokens,
    }


def aborted(rid: str, ids: list[int], message: str = "Aborted", status_code=None) -> bytes:
    """The last event of a request aborted through /abort_request (FINISH_ABORT().to_json())."""
    finish = {"type": "abort", "message": message, "status_code": status_code, "err_type": None}
    return event({"text": "", "output_ids": ids, "meta_info": meta(rid, len(ids), finish)})


class Replay:
    """What the replay server does. `generate(rid, body)` returns the events for one request, or
    the string "endless" to stream one token every `step_s` until the rid is aborted, or "drop" to
    close the connection mid-stream (a crashed server). `idle_close_s`: a request that comes on a
    connection idle for longer is not read, and the connection closes: SGLang's server closing an
    idle connection (after 5 s) just as a request comes on it."""

    def __init__(self, generate=None, step_s: float = 0.02, status: int = 200, status_body: bytes = b""):
        self.generate = generate or (lambda rid, body: DSPARK_STREAM)
        self.step_s, self.status, self.status_body = step_s, status, status_body
        self.requests: list[dict] = []  # /generate bodies, in arrival order
        self.auth: list[str | None] = []  # the Authorization header of each /generate
        self.aborts: list[str] = []
        self.connections = 0  # TCP connections accepted (the adapter's pool should reuse one)
        self.idle_close_s: float | None = None
        self.idle_closed = 0  # requests lost so
        self.aborted = threading.Event()
        self.healthy = True
        self.server_info = {
            "version": "0.5.23",
            "context_length": 131072,
            "max_req_input_len": 131066,
            "incremental_streaming_output": False,
            "speculative_algorithm": "DSPARK",
            "tp_size": 4,
        }


def handler(replay: Replay) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            replay.connections += 1
            self.idle_since: float | None = None  # the end of the last answer on this connection

        def handle_one_request(self) -> None:
            if replay.idle_close_s is not None and self.idle_since is not None:
                # the next request's first bytes (the client's close, b"", is no lost request)
                if self.rfile.peek(1) and time.monotonic() - self.idle_since > replay.idle_close_s:
                    replay.idle_closed += 1
                    self.close_connection = True
                    return
            super().handle_one_request()
            self.idle_since = time.monotonic()

        def log_message(self, *args) -> None:
            pass

        def _send(self, status: int, body: bytes = b"", kind: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        def do_GET(self) -> None:
            if self.path in ("/health", "/health_generate"):
                self._send(200 if replay.healthy else 503)
            elif self.path == "/server_info":
                self._send(200, json.dumps(replay.server_info).encode())
            else:
                self._send(404, b'{"detail":"Not Found"}')

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
            if self.path == "/abort_request":
                replay.aborts.append(body.get("rid"))
                replay.aborted.set()
                self._send(200)
                return
            if self.path != "/generate":
                self._send(404, b'{"detail":"Not Found"}')
                return
            replay.requests.append(body)
            replay.auth.append(self.headers.get("authorization"))
            if replay.status != 200:
                self._send(replay.status, replay.status_body)
                return
            plan = replay.generate(body["rid"], body)
            self.send_response(200)
            self.send_header("content-type", "text/event-stream; charset=utf-8")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            try:
                if plan == "drop":
                    self._chunk(event({"text": "x", "output_ids": [7], "meta_info": meta(body["rid"], 1)}))
                    self.close_connection = True
                    return  # no terminating chunk: the connection just ends, as when SGLang dies
                if plan == "endless":
                    ids: list[int] = []
                    while body["rid"] not in replay.aborts:
                        ids.append(100 + len(ids))
                        self._chunk(event({"text": None, "output_ids": ids, "meta_info": meta(body["rid"], len(ids))}))
                        time.sleep(replay.step_s)
                    plan = [aborted(body["rid"], ids), DONE]
                for data in plan:
                    self._chunk(data)
                    time.sleep(replay.step_s)
                self._chunk(b"")
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client went away

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client that closed its idle connection
            super().handle_error(request, client_address)


def serve(replay: Replay, port: int = 0) -> ThreadingHTTPServer:
    """Start the replay server on 127.0.0.1 in a daemon thread; .server_address has the port."""
    server = _Server(("127.0.0.1", port), handler(replay))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server

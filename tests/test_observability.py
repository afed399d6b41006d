"""Observability on the session daemon: /metrics (Prometheus text), request ids, structured logs.

Metric assertions are deltas around one request, read back with prometheus-client's own parser.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def http(daemon) -> httpx.Client:
    with httpx.Client(base_url=daemon.url, headers={"Authorization": f"Bearer {daemon.token}"}, timeout=120) as c:
        yield c


def scrape(http: httpx.Client) -> dict[tuple, float]:
    """{(sample name, sorted labels): value} from GET /metrics."""
    response = http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def value(metrics: dict, name: str, **labels) -> float:
    return metrics.get((name, tuple(sorted(labels.items()))), 0.0)


def json_lines(log: Path) -> list[dict]:
    """The daemon's JSON log lines written so far (a line being written right now is left out)."""
    text = log.read_text()
    complete = text[: text.rfind("\n") + 1]
    # split("\n"), not splitlines(): JSON leaves U+2028 or U+0085 (fuzzed paths have them) unescaped.
    return [json.loads(line) for line in complete.split("\n") if line.startswith("{")]


def chat(http: httpx.Client, **extra) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4, "temperature": 0, **extra}
    return http.post(CHAT, json=body)


def test_metrics_need_the_token(daemon):
    assert httpx.get(daemon.url + "/metrics").status_code == 401


def test_a_request_is_measured_by_route(http):
    before = scrape(http)
    assert chat(http).status_code == 200
    after = scrape(http)

    def grew(name: str, **labels) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    for histogram in (
        "lingcode_time_to_first_token_seconds",
        "lingcode_time_per_output_token_seconds",
        "lingcode_accepted_tokens_per_step",
    ):
        assert grew(f"{histogram}_count", route=CHAT) == 1, histogram
    assert value(after, "lingcode_time_to_first_token_seconds_sum", route=CHAT) > 0
    assert grew("lingcode_http_requests_total", route=CHAT, method="POST", status="200") == 1
    finished = sum(grew("lingcode_generations_total", route=CHAT, finish_reason=r) for r in ("stop", "length"))
    assert finished == 1
    assert grew("lingcode_generated_tokens_total", route=CHAT) >= 1
    assert grew("lingcode_engine_stat", stat="requests") == 1
    assert grew("lingcode_scheduler_requests_total", outcome="completed") == 1
    assert value(after, "lingcode_queue_depth") == 0 and value(after, "lingcode_queue_limit") >= 1
    assert value(after, "process_resident_memory_bytes") > 0


def test_errors_and_aborts_by_route(http, daemon):
    before = scrape(http)
    assert chat(http, max_tokens=0).status_code == 400
    assert http.get("/v1/no-such-route").status_code == 404
    assert httpx.get(daemon.url + "/v1/models").status_code == 401
    client = openai.OpenAI(base_url=daemon.url + "/v1", api_key=daemon.token, max_retries=0, timeout=120)
    stream = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Tell me a long story."}],
        max_tokens=500,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    next(iter(stream))
    stream.close()  # the client leaves mid-stream
    deadline = time.monotonic() + 30
    while value(after := scrape(http), "lingcode_aborts_total", route=CHAT) == value(
        before, "lingcode_aborts_total", route=CHAT
    ):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert value(after, "lingcode_aborts_total", route=CHAT) == value(before, "lingcode_aborts_total", route=CHAT) + 1
    for route, method, status in ((CHAT, "POST", "400"), ("unmatched", "GET", "404"), ("/v1/models", "GET", "401")):
        key = dict(route=route, method=method, status=status)
        assert (
            value(after, "lingcode_http_requests_total", **key)
            == value(before, "lingcode_http_requests_total", **key) + 1
        )


def test_queue_depth_while_a_request_waits(http, daemon):
    body = {
        "messages": [{"role": "user", "content": "Tell me a long story."}],
        "max_tokens": 500,
        "ignore_eos": True,
        "stream": True,
    }
    with http.stream("POST", CHAT, json=body) as running:
        lines = running.iter_lines()  # kept: a dropped iterator closes the response
        next(lines)  # it holds the engine

        def wait_in_line() -> None:
            with httpx.Client(base_url=daemon.url, headers=http.headers, timeout=120) as other:
                chat(other)

        waiter = threading.Thread(target=wait_in_line)
        waiter.start()
        deadline = time.monotonic() + 30
        while value(now := scrape(http), "lingcode_queue_depth") != 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert value(now, "lingcode_engine_busy") == 1
    waiter.join(timeout=120)
    assert value(scrape(http), "lingcode_queue_depth") == 0


def test_request_ids_in_responses_and_in_the_json_logs(http, daemon):
    response = chat(http, max_tokens=2)
    generated = response.headers["x-request-id"]
    assert generated.startswith("req-")
    mine = "trace-42.abc"
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    response = http.post(CHAT, json=body, headers={"X-Request-Id": mine})
    assert response.headers["x-request-id"] == mine
    completion_id = response.json()["id"]
    odd = http.get("/v1/models", headers={"X-Request-Id": "has spaces\tand tabs"})
    assert odd.headers["x-request-id"].startswith("req-")  # not echoed: log lines stay one clean token

    deadline = time.monotonic() + 10
    while True:
        lines = json_lines(daemon.log)
        mine_lines = [line for line in lines if line.get("request_id") == mine]
        if len(mine_lines) >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    by_logger = {line["logger"]: line for line in mine_lines}
    access = by_logger["lingcode.access"]
    assert access["route"] == CHAT and access["status"] == 200 and access["method"] == "POST"
    assert access["duration_ms"] > 0 and {"ts", "level", "msg"} <= set(access)
    generation = by_logger["lingcode.generation"]
    assert generation["generation_id"] == completion_id and generation["completion_tokens"] == 2
    assert generation["finish_reason"] in ("stop", "length") and generation["ttft_ms"] > 0
    assert any(line.get("request_id") == generated for line in lines)
    assert daemon.token not in daemon.log.read_text()  # the token is never logged


def test_log_lines_carry_the_request_context_in_both_formats():
    import logging

    from lingcode.pipeline import metrics
    from lingcode.server.logs import JSONFormatter, TextFormatter

    record = logging.LogRecord("lingcode.access", logging.INFO, __file__, 1, "GET %s %d", ("/v1/models", 200), None)
    record.status = 200
    tokens = metrics.request_id.set("req-abc"), metrics.route.set("/v1/models")
    try:
        as_json = json.loads(JSONFormatter().format(record))
        as_text = TextFormatter().format(record)
    finally:
        metrics.request_id.reset(tokens[0])
        metrics.route.reset(tokens[1])
    assert as_json["msg"] == "GET /v1/models 200" and as_json["level"] == "info" and as_json["status"] == 200
    assert as_json["request_id"] == "req-abc" and as_json["route"] == "/v1/models"
    assert "INFO" in as_text and 'request_id="req-abc"' in as_text and "status=200" in as_text


def test_a_stream_its_client_left_is_logged_as_client_gone(http, daemon):
    """Issue 18.14: a stream abandoned after its headers was logged 200, one abandoned while it
    waited 499; both are a client that left: 499."""
    mine = "left-mid-stream"
    body = {
        "messages": [{"role": "user", "content": "Count to a thousand."}],
        "max_tokens": 400,
        "stream": True,
        "ignore_eos": True,
    }
    with http.stream("POST", CHAT, json=body, headers={"X-Request-Id": mine}) as response:
        assert response.status_code == 200
        next(response.iter_lines())  # the headers and the first event came: the stream has started
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        access = [
            line
            for line in json_lines(daemon.log)
            if line.get("request_id") == mine and line["logger"] == "lingcode.access"
        ]
        if access:
            break
        time.sleep(0.05)
    assert access and access[0]["status"] == 499, access


def test_a_requests_trace_starts_when_its_first_bytes_are_read(daemon):
    """The trace (`timings.trace`, which `lingcode bench daemon` splits the first token by) counts
    from the request's first bytes: parsing the head and starting the request's task are the
    daemon's time, not the client's. The head comes in two parts 0.3 s apart: the arrival is the
    first part's, and the handler starts only after the second."""
    import socket

    body = json.dumps(
        {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 2, "temperature": 0, "stream": True}
    ).encode()
    host, port = daemon.url.removeprefix("http://").split(":")
    head = (
        f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {daemon.token}\r\n"
        f"x-lingcode-trace: 1\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection((host, int(port)), timeout=60) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        before_first = time.perf_counter()
        conn.sendall(head[:20])
        time.sleep(0.3)
        before_rest = time.perf_counter()
        conn.sendall(head[20:] + body)
        reply = b""
        while b"data: [DONE]" not in reply:
            chunk = conn.recv(65536)
            assert chunk, reply
            reply += chunk
    events = [json.loads(line[6:]) for line in reply.decode().split("\n") if line.startswith("data: {")]
    trace = next(e["timings"]["trace"] for e in events if "trace" in e.get("timings", {}))
    arrived = trace["arrived_at"] / 1e3  # perf_counter's clock, which every process of the machine shares
    assert before_first <= arrived <= before_rest, (before_first, arrived, before_rest)
    assert arrived + trace["until_handler"] / 1e3 >= before_rest  # the handler waited for the whole head

"""Faults: a client that leaves mid-prefill, an exception inside the engine, and what the fuzzer found.

(A client leaving mid-stream: tests/test_server.py; SIGTERM mid-stream: tests/test_security.py;
SGLang dying under a request: tests/test_sglang_supervisor.py.)
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from lingcode.pipeline.scheduler import Scheduler
from lingcode.server.app import create_app

TOKEN = "fault-token"


# --- a client that leaves while its prompt is being prefilled ---------------------------------------


async def test_disconnect_mid_prefill_aborts_within_one_chunk(daemon, engine):
    nonce = secrets.token_hex(4)  # first, so that nothing of this prompt is in the KV cache
    prompt = nonce + " " + " ".join(str(i) for i in range(1500))
    n_tokens = len(engine.info.tokenizer.encode(prompt))
    chunks = len(engine.step.prefill_chunks(0, n_tokens))  # the daemon's engine runs the same step
    assert chunks >= 6 and n_tokens < engine.info.context_length, n_tokens
    headers = {"Authorization": f"Bearer {daemon.token}"}
    async with httpx.AsyncClient(base_url=daemon.url, headers=headers, timeout=120) as http:

        async def stats() -> dict:
            return (await http.get("/v1/lingcode/stats")).json()["engine"]

        async def idle() -> dict:
            deadline = time.monotonic() + 60
            while (now := await stats())["running"] is not None:
                assert time.monotonic() < deadline, now
                await asyncio.sleep(0.02)
            return now

        before = await idle()
        body = {"prompt": prompt, "max_tokens": 4, "stream": True}
        request = asyncio.create_task(http.post("/v1/completions", json=body))
        deadline = time.monotonic() + 60
        while (now := await stats())["forward_passes"] == before["forward_passes"]:
            assert time.monotonic() < deadline and not request.done()
            await asyncio.sleep(0.02)
        request.cancel()  # the client goes away: its connection closes mid-prefill
        with pytest.raises(asyncio.CancelledError):
            await request
        after = await idle()
    last = after["last_request"]
    assert last["finish_reason"] == "abort" and last["generated_tokens"] == 0
    assert after["aborted"] == before["aborted"] + 1
    ran = after["forward_passes"] - before["forward_passes"]
    # The chunk running when we looked, at most one more that began before the abort landed; then it stopped.
    assert ran <= now["forward_passes"] - before["forward_passes"] + 1
    assert ran < chunks, (ran, chunks)


# --- an exception inside the engine -----------------------------------------------------------------


@pytest.fixture
def in_process(engine, monkeypatch):
    """The daemon's app in this process on the real engine, and a switch that makes its forward pass
    raise on the Nth call from now (on the engine's worker thread, where real faults happen)."""
    app = create_app(Scheduler(engine), engine.info, TOKEN, model_id="m")
    client = TestClient(app, base_url="http://localhost", headers={"Authorization": f"Bearer {TOKEN}"},
                        raise_server_exceptions=False)  # fmt: skip
    fault = {"at": None, "calls": 0}

    class FaultyStep:  # the engine's step (steps.py), raising when told
        def __init__(self, step):
            self.step = step

        def __getattr__(self, name):
            return getattr(self.step, name)

        def __call__(self, *args, **kwargs):
            fault["calls"] += 1
            if fault["at"] is not None and fault["calls"] == fault["at"]:
                raise RuntimeError("injected fault: device lost")
            return self.step(*args, **kwargs)

    monkeypatch.setattr(engine, "step", FaultyStep(engine.step))

    def fail_at(n: int | None) -> None:
        fault["at"], fault["calls"] = n, 0

    with client:
        yield client, fail_at


def errors_metric(client: TestClient) -> float:
    families = text_string_to_metric_families(client.get("/metrics").text)
    return sum(sample.value for family in families if family.name == "lingcode_generation_errors"
               for sample in family.samples if sample.name.endswith("_total")
               and sample.labels == {"route": "/v1/completions", "error": "EngineError"})  # fmt: skip


def test_an_engine_exception_fails_the_request_cleanly_and_the_next_one_works(in_process, engine, monkeypatch):
    client, fail_at = in_process
    body = {"prompt": "def add(a, b):", "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    good = client.post("/v1/completions", json=body).json()
    before, errors_before = client.get("/v1/lingcode/stats").json()["engine"], errors_metric(client)

    fail_at(1)  # in the prefill, before any token: a plain HTTP error when not streamed
    response = client.post("/v1/completions", json=body)
    assert response.status_code == 500
    error = response.json()["error"]
    assert error["code"] == "engine_error" and "injected fault" in error["message"]
    # Streamed: where the head waits for the first chunk, a plain HTTP error too; where it went out
    # before the engine had the request (head_before_submit) or once it had it (head_early), an
    # error event, then [DONE].
    for at_once, head_early in ((False, False), (False, True), (True, False)):
        monkeypatch.setattr(engine, "head_before_submit", at_once)
        monkeypatch.setattr(engine, "head_early", head_early)
        fail_at(1)
        response = client.post("/v1/completions", json={**body, "stream": True})
        if at_once or head_early:
            assert response.status_code == 200
            events = [block.removeprefix("data: ") for block in response.text.split("\n\n") if block.strip()]
            assert events[-1] == "[DONE]" and len(events) == 2
            error = json.loads(events[0])["error"]
        else:
            assert response.status_code == 500
            error = response.json()["error"]
        assert error["code"] == "engine_error" and "injected fault" in error["message"]

    fail_at(4)  # mid-decode, after the stream has started: an error event, then [DONE]
    response = client.post("/v1/completions", json={**body, "stream": True})
    assert response.status_code == 200
    events = [block.removeprefix("data: ") for block in response.text.split("\n\n") if block.strip()]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["code"] == "engine_error"
    assert any(json.loads(e)["choices"][0]["text"] for e in events[:-2])  # some text came first

    fail_at(None)  # the fault is gone: the same request works, and the same answer comes back
    again = client.post("/v1/completions", json=body)
    assert again.status_code == 200
    assert again.json()["choices"][0]["text"] == good["choices"][0]["text"]
    # A failed request may leave the KV cache half written: the engine forgot it, nothing stale was reused.
    assert again.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    after = client.get("/v1/lingcode/stats").json()
    assert after["engine"]["errors"] == before["errors"] + 5
    assert after["engine"]["running"] is None and after["scheduler"]["running"] is None
    assert errors_metric(client) == errors_before + 5


# --- inputs the fuzzer found (each was a 500) -------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (b'{"prompt": "hi", "max_tokens": 2, "temperature": NaN}', "NaN is not a JSON number"),
        (b'{"prompt": "hi", "max_tokens": 2, "top_p": Infinity}', "Infinity is not a JSON number"),
        (b'{"prompt": "\\ud800 hi", "max_tokens": 2}', "lone UTF-16 surrogate"),
        (b'{"messages": [{"role": "user", "content": "hi"}], "\\udfff": 1}', "lone UTF-16 surrogate"),
        (b'{"prompt": "\xed\xa0\x80 hi", "max_tokens": 2}', "lone UTF-16 surrogate"),  # its UTF-8 bytes, unescaped
        ('{"prompt": "\\uD800 hi", "max_tokens": 2}'.encode("utf-16"), "lone UTF-16 surrogate"),  # a UTF-16 body
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    ],
)
def test_json_that_python_accepts_but_is_not_json_text_is_a_400(daemon, raw, says):
    headers = {"Authorization": f"Bearer {daemon.token}", "content-type": "application/json"}
    response = httpx.post(daemon.url + "/v1/completions", content=raw, headers=headers)
    assert response.status_code == 400, response.text
    assert says in response.json()["error"]["message"]


def test_a_vanishingly_small_temperature_samples_the_most_likely_token(daemon):
    headers = {"Authorization": f"Bearer {daemon.token}"}
    body = {"prompt": "The capital of France is", "max_tokens": 4}
    greedy = httpx.post(daemon.url + "/v1/completions", json={**body, "temperature": 0}, headers=headers, timeout=60)
    for temperature in (5e-324, 1e-300):
        tiny = httpx.post(daemon.url + "/v1/completions", json={**body, "temperature": temperature, "seed": 1},
                          headers=headers, timeout=60)  # fmt: skip
        assert tiny.status_code == 200, tiny.text
        assert tiny.json()["choices"][0]["text"] == greedy.json()["choices"][0]["text"]


# Fuzzing the routes that document their bodies since issue 8 (tests/test_fuzz.py) found these: each was
# a 500, except the nameless tool_choice, which was answered as if no tool had been forced.
WEATHER = {"name": "weather", "description": "The weather in a city.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}  # fmt: skip
NO_FUNCTION = [{"id": "call_1", "type": "function"}]  # an earlier tool call without its function


def _session(daemon, headers) -> str:
    return httpx.post(daemon.url + "/v1/sessions", json={}, headers=headers).json()["id"]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/messages/count_tokens", {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": True},
         "tools"),
        ("/v1/messages", {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}],
                          "tools": [WEATHER], "tool_choice": {"type": "tool"}}, "tool_choice"),
        ("/v1/chat/completions", {"max_tokens": 2, "messages": [{"role": "assistant", "tool_calls": NO_FUNCTION},
                                                                {"role": "user", "content": "hi"}]},
         "messages[0].tool_calls[0].function"),
        ("/v1/sessions/{session}/turns", {"max_tokens": 2, "messages": [{"role": "assistant", "tool_calls": [{}]}]},
         "messages[0].tool_calls[0].function"),
    ],
)  # fmt: skip
def test_malformed_bodies_of_the_newer_routes_are_400s_in_their_apis_shape(daemon, path, body, param):
    headers = {"Authorization": f"Bearer {daemon.token}"}
    path = path.format(session=_session(daemon, headers) if "{session}" in path else "")
    response = httpx.post(daemon.url + path, json=body, headers=headers, timeout=60)
    assert response.status_code == 400, response.text
    if path.startswith("/v1/messages"):  # Anthropic's shape
        answer = response.json()
        assert answer["type"] == "error" and answer["error"]["type"] == "invalid_request_error"
        assert answer["error"]["message"].startswith(f"{param}:")
    else:
        assert response.json()["error"]["param"] == param


# --- numbers Python cannot hold, on every route that takes a body (issue 18, item 5) -----------------

HUGE_INT = "9" * 5000  # over Python's int-string limit (4,300 digits): json.loads raised ValueError, a 500


def _post_routes(daemon, headers) -> list[str]:
    """Every POST route of the daemon's OpenAPI document, with a real session where it names one."""
    document = httpx.get(daemon.url + "/openapi.json", headers=headers).json()
    routes = [path for path, operations in document["paths"].items() if "post" in operations]
    session = _session(daemon, headers)
    return [path.replace("{session_id}", session) for path in routes]


@pytest.mark.parametrize("number", [HUGE_INT, "-" + HUGE_INT, "1e400"], ids=["5000-digits", "-5000-digits", "1e400"])
def test_a_number_python_cannot_hold_is_a_400_on_every_post_route(daemon, number):
    headers = {"Authorization": f"Bearer {daemon.token}", "content-type": "application/json"}
    routes = _post_routes(daemon, headers)
    assert len(routes) >= 8 and "/v1/messages" in routes, routes
    for path in routes:
        for raw in (f'{{"max_tokens": {number}}}', f'{{"prompt": "hi", "messages": [], "seed": [{number}]}}'):
            response = httpx.post(daemon.url + path, content=raw.encode(), headers=headers, timeout=60)
            assert response.status_code == 400, (path, response.text[:300])
            answer = response.json()
            error = answer["error"]
            if path.startswith("/v1/messages"):  # Anthropic's shape
                assert answer["type"] == "error" and error["type"] == "invalid_request_error", answer
            else:
                assert error["type"] == "invalid_request_error", answer
            assert ("5000 digits" in error["message"] or "5001 digits" in error["message"]
                    or "too large to hold" in error["message"]), (path, error)  # fmt: skip
    assert daemon.process.poll() is None


# --- HTTP the ASGI app never sees ----------------------------------------------------------------------


def _raw(daemon, request: bytes) -> tuple[str, dict[str, str], bytes]:
    """Send raw bytes; the status line, headers and body of the answer (the connection is then closed)."""
    import socket

    host, port = daemon.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(request)
        reply = b""
        while chunk := conn.recv(65536):
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    return status, {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}, body


@pytest.mark.parametrize("length", [b"abc", b"-1", b"1, 2", b"0x10", b"9" * 5000, b""],
                         ids=["abc", "negative", "two", "hex", "5000-digits", "empty"])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/messages?beta=true"])
def test_a_malformed_content_length_gets_the_apis_error_shape(daemon, length, path):
    """h11 refuses these before the app; uvicorn answered them in plain text (issue 18, minor)."""
    request = (b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"
               b"Content-Length: %s\r\n\r\n{}" % (path.encode(), daemon.token.encode(), length))  # fmt: skip
    status, headers, body = _raw(daemon, request)
    assert status.startswith("HTTP/1.1 400"), status
    assert headers["content-type"] == "application/json" and headers["connection"] == "close"
    answer = json.loads(body)
    if path.startswith("/v1/messages"):
        assert answer["type"] == "error" and answer["error"]["type"] == "invalid_request_error"
        assert "Content-Length" in answer["error"]["message"]
    else:
        assert answer["error"]["code"] == "invalid_http_request" and "Content-Length" in answer["error"]["message"]
    assert httpx.get(daemon.url + "/health").status_code == 200  # and the daemon serves on


def test_a_held_head_never_delays_an_interim_answer_or_gets_lost():
    """server/http11.py sends a response's head with its first body bytes. A 100 Continue (the
    client waits for it before it sends the body) goes out at once, and a connection closed after
    a head alone (an app that failed mid-answer) still sends the head."""
    from lingcode.server.http11 import HeadWithBody

    class Transport:
        def __init__(self):
            self.writes, self.closed = [], False

        def write(self, data: bytes) -> None:
            self.writes.append(data)

        def close(self) -> None:
            self.closed = True

        def is_closing(self) -> bool:
            return self.closed

    inner = Transport()
    held = HeadWithBody(inner)
    held.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    assert inner.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]
    held.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    assert len(inner.writes) == 1
    held.write(b"{}")
    held.write(b"")
    assert inner.writes[1:] == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}", b""]
    assert not held.is_closing()

    inner = Transport()
    held = HeadWithBody(inner)
    held.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")  # HEAD: no body write follows
    held.flush()  # when the response completes
    assert inner.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"] and not inner.closed

    inner = Transport()
    held = HeadWithBody(inner)
    held.write(b"HTTP/1.1 500 Internal Server Error\r\ntransfer-encoding: chunked\r\n\r\n")
    held.close()
    assert inner.writes == [b"HTTP/1.1 500 Internal Server Error\r\ntransfer-encoding: chunked\r\n\r\n"]
    assert inner.closed


def test_head_health_answers_like_get_without_a_body(daemon):
    status, headers, body = _raw(daemon, b"HEAD /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    get = httpx.get(daemon.url + "/health")
    assert status.startswith("HTTP/1.1 200") and body == b"", (status, body)
    assert headers["content-type"] == get.headers["content-type"]
    assert int(headers["content-length"]) == len(get.content)  # what GET would send, as HTTP says
    assert httpx.head(daemon.url + "/v1/models").status_code in (401, 405)  # the token still guards the rest


# --- a huge prompt is tokenized off the event loop -----------------------------------------------


async def test_tokenizing_a_huge_prompt_does_not_stall_other_requests(daemon):
    """Issue 18 (minor): count_tokens on 3.9 MB stalled /health for 6 s. Long prompts are rendered
    and tokenized on a thread, with the tokenizer's GIL released: /health answers meanwhile."""
    text = "".join(f"line {i}: the quick brown fox jumps over the lazy dog {i * 7919 % 10007}\n" for i in range(50_000))
    body = {"model": "m", "messages": [{"role": "user", "content": text}]}
    headers = {"x-api-key": daemon.token, "anthropic-version": "2023-06-01"}
    async with httpx.AsyncClient(base_url=daemon.url, headers=headers, timeout=300) as http:
        count = asyncio.create_task(http.post("/v1/messages/count_tokens", json=body))
        await asyncio.sleep(0.3)  # the body is sent and being tokenized
        health = await http.get("/health")
        assert health.status_code == 200 and not count.done()  # answered while the count was still running
        counted = await count
    assert counted.status_code == 200 and counted.json()["input_tokens"] > 500_000

"""The daemon, end to end: a real `lingcode serve` process on the real model, driven over HTTP.

Clients are the official `openai` SDK (what users point at lingcode) and plain httpx where the
exact bytes matter (error shapes, SSE framing, over-size bodies). Assertions are on outputs and
on the engine's and scheduler's counters (GET /v1/lingcode/stats), never on wall time. Generations
stay short (max_tokens <= 32) except where a long one is the point.
"""

from __future__ import annotations

import json
import secrets
import socket
import stat
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from conftest import serve, share_built_caches
from lingcode.text.chat_template import render_chat

GREEDY = {"temperature": 0}
CODE_QUESTION = "Write a Python function that reverses a string."
ERROR_FIELDS = {"message", "type", "param", "code"}


# --- helpers ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def client(daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=daemon.url + "/v1", api_key=daemon.token, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def http(daemon) -> httpx.Client:
    with httpx.Client(base_url=daemon.url, headers={"Authorization": f"Bearer {daemon.token}"}, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def info(engine):
    """The model's tokenizer and chat template, from the same lingcode code the daemon runs."""
    return engine.info


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def chat_prompt_ids(info, messages: list[dict]) -> list[int]:
    text = render_chat(info.chat_template, messages, bos_token=info.bos_token, eos_token=info.eos_token)
    return info.tokenizer.encode(text)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def stats(http: httpx.Client) -> dict:
    response = http.get("/v1/lingcode/stats")
    assert response.status_code == 200
    return response.json()


def wait_idle(http: httpx.Client, timeout_s: float = 30.0) -> dict:
    """Stats once nothing runs or waits (a bound against a hang, not a timing assertion)."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = stats(http)
        if now["engine"]["running"] is None and now["scheduler"]["running"] is None and not now["scheduler"]["queued"]:
            return now
        assert time.monotonic() < deadline, f"the engine is still busy: {now}"
        time.sleep(0.02)


def assert_error(response: httpx.Response, status: int, code: str | None = None, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == ERROR_FIELDS
    assert error["message"]
    if code is not None:
        assert error["code"] == code
    if param is not None:
        assert error["param"] == param
    return error


def sse_events(response: httpx.Response) -> list[str]:
    """The `data:` payloads of an SSE response, in order."""
    events = []
    for block in response.text.split("\n\n"):
        if block.strip():
            assert block.startswith("data: "), block
            events.append(block.removeprefix("data: "))
    return events


# --- the daemon process -----------------------------------------------------------------------


def test_daemon_file_and_token_file(daemon):
    record = daemon.record
    assert record["pid"] == daemon.process.pid
    assert record["engine"] == "local"
    assert record["url"].startswith("http://127.0.0.1:") and not record["url"].endswith(":0")
    token_file = Path(record["token_file"])
    assert token_file == daemon.home / "config" / "token"
    for path in (token_file, daemon.daemon_file):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert len(daemon.token) >= 43  # 32 random bytes, url-safe base64
    assert "OPENAI_BASE_URL=" + record["url"] + "/v1" in daemon.log.read_text()


def test_health_needs_no_token(daemon):
    response = httpx.get(daemon.url + "/health")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "model": daemon.record["model"]}


def test_models(client, daemon):
    models = client.models.list().data
    assert [m.id for m in models] == [daemon.record["model"]]


# --- auth -------------------------------------------------------------------------------------


def test_401_without_or_with_a_wrong_token(daemon):
    assert_error(httpx.get(daemon.url + "/v1/models"), 401, code="invalid_api_key")
    bad = openai.OpenAI(base_url=daemon.url + "/v1", api_key="not-the-token", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model="m", messages=user("hi"), max_tokens=1)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    # Unknown routes are guarded too: nothing is revealed without the token.
    assert httpx.post(daemon.url + "/v1/nope").status_code == 401


def test_x_api_key_works(daemon):
    response = httpx.get(daemon.url + "/v1/models", headers={"x-api-key": daemon.token})
    assert response.status_code == 200
    assert httpx.get(daemon.url + "/v1/models", headers={"x-api-key": "wrong"}).status_code == 401


# --- chat completions -------------------------------------------------------------------------


def test_reverse_string_sanity(client):
    """The issue's acceptance check on the real model."""
    response = client.chat.completions.create(model="m", messages=user(CODE_QUESTION), max_tokens=120, **GREEDY)
    content = response.choices[0].message.content
    assert "```python" in content
    assert "def reverse_string" in content


def test_chat_completion(client, http, info):
    messages = user("What is the capital of France?")
    before = stats(http)["engine"]
    response = client.chat.completions.create(model="m", messages=messages, max_tokens=24, **GREEDY)
    after = stats(http)["engine"]

    assert response.object == "chat.completion" and response.id.startswith("chatcmpl-")
    choice = response.choices[0]
    assert choice.message.role == "assistant" and choice.message.content.strip()
    assert choice.finish_reason in ("stop", "length")
    usage = response.usage
    assert usage.prompt_tokens == len(chat_prompt_ids(info, messages))
    assert usage.completion_tokens == after["generated_tokens"] - before["generated_tokens"]
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details.cached_tokens == after["cached_tokens"] - before["cached_tokens"]
    timings = response.model_extra["timings"]
    assert timings["prompt_tokens"] == usage.prompt_tokens
    assert timings["ttft_ms"] > 0 and timings["tpot_ms"] > 0 and timings["total_ms"] >= timings["ttft_ms"]


def test_chat_streamed_equals_unstreamed(client):
    messages = user("Name three colors.")
    whole = client.chat.completions.create(model="m", messages=messages, max_tokens=24, **GREEDY)
    chunks = list(client.chat.completions.create(model="m", messages=messages, max_tokens=24, stream=True, **GREEDY))

    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    assert all(c.usage is None for c in chunks)  # no include_usage: no usage chunk
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == whole.choices[0].message.content
    last = chunks[-1]
    assert last.choices[0].finish_reason == whole.choices[0].finish_reason
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
    assert last.model_extra["timings"]["completion_tokens"] == whole.usage.completion_tokens


def test_stream_include_usage(client, info):
    messages = user("Count to five.")
    chunks = list(
        client.chat.completions.create(
            model="m", messages=messages, max_tokens=8, stream=True, stream_options={"include_usage": True}, **GREEDY
        )
    )
    *body, usage_chunk = chunks
    assert usage_chunk.choices == []
    assert usage_chunk.usage.prompt_tokens == len(chat_prompt_ids(info, messages))
    assert usage_chunk.usage.completion_tokens == 8
    assert usage_chunk.usage.total_tokens == usage_chunk.usage.prompt_tokens + 8
    assert all(c.usage is None for c in body)
    assert body[-1].choices[0].finish_reason == "length"


def test_sse_framing_ends_with_done(http):
    body = {"messages": user("Hi"), "max_tokens": 4, "stream": True, **GREEDY}
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] is not None
    timings = chunks[-1]["timings"]
    assert set(timings) >= {"ttft_ms", "tpot_ms", "total_ms", "tokens_per_s", "prompt_tokens", "cached_tokens"}


def test_a_streams_head_goes_out_before_the_engine_has_the_request(daemon):
    """Where nothing can refuse a stream once its prompt is rendered and surely fits (no grammar;
    the local engine), its head goes out then, alone, and the client reads it while the prompt is
    tokenized and the engine takes the request (issue 17): the daemon's trace marks the head before
    the engine. A stream that needs a grammar (a bad schema is a 400) keeps its head until its first
    events, and both go out in one write: over a plain socket, the first read holds the head and
    an event (uvicorn wrote them apart, and on loopback each write wakes the client)."""
    import socket

    def first_read(extra: dict) -> bytes:
        body = json.dumps({"messages": user("Hi"), "max_tokens": 4, "stream": True, **GREEDY, **extra}).encode()
        request = (
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (daemon.token.encode(), len(body), body)
        )
        host, port = daemon.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=60) as conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.sendall(request)
            return conn.recv(65536)

    for _ in range(3):
        first = first_read({"response_format": {"type": "json_object"}})
        assert first.startswith(b"HTTP/1.1 200"), first[:200]
        assert b"\r\n\r\n" in first and b"data: {" in first.partition(b"\r\n\r\n")[2], first
        assert first_read({}).startswith(b"HTTP/1.1 200")

    with httpx.Client(
        base_url=daemon.url, headers={"Authorization": f"Bearer {daemon.token}", "x-lingcode-trace": "1"}, timeout=60
    ) as http:
        for extra, early in (
            ({}, True),
            ({"response_format": {"type": "json_object"}}, False),
            ({"max_tokens": 8100, "stop": [" "]}, False),
        ):  # not sure to leave that room untokenized
            body = {"messages": user("Hi"), "max_tokens": 4, "stream": True, **GREEDY, **extra}
            events = sse_events(http.post("/v1/chat/completions", json=body))
            trace = next(json.loads(e)["timings"]["trace"] for e in events[:-1] if "timings" in json.loads(e))
            if early:
                assert trace["until_head"] < trace["until_engine"] < trace["until_first_events"], trace
            else:
                assert "until_head" not in trace, trace


@pytest.fixture(scope="module")
def keeping_daemon(model_path, tmp_path_factory):
    """A daemon whose streams send their keep-alive comments 20 ms apart (serve --stream-keep-alive)."""
    started = serve(
        model_path, share_built_caches(tmp_path_factory.mktemp("keep-alive-home")), "--stream-keep-alive", "0.02"
    )
    yield started
    started.process.terminate()
    assert started.process.wait(timeout=30) == 0, started.log.read_text()


# Each API's stream: its path, a body around a prompt, and whether its events begin with its opening.
OPENINGS = {
    "/v1/chat/completions": (
        lambda p: {"messages": user(p)},
        lambda e: (
            json.loads(e[0].removeprefix("data: "))["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        ),
    ),
    "/v1/responses": (lambda p: {"input": p}, lambda e: e[0].startswith("event: response.created\n")),
    "/v1/messages": (
        lambda p: {"model": "m", "messages": user(p)},
        lambda e: e[0].startswith("event: message_start\n"),
    ),
    "/v1/completions": (lambda p: {"prompt": p}, lambda e: e[0] == ": keep-alive"),  # no opening event: the comments
}


@pytest.mark.parametrize("path", OPENINGS)
def test_a_long_prefill_opens_its_stream_at_once_and_keeps_it_alive(keeping_daemon, path):
    """Issue 62.8: a checked stream sends its head and opening event before the engine prefills
    anything, then SSE comments until its first token, so that clients with a header or idle
    timeout wait out a long prompt. The order of what arrives is asserted, not its timing: the
    prompt takes many comment intervals to prefill."""
    body_of, is_opening = OPENINGS[path]
    nonce = secrets.token_hex(4)  # first, so that nothing of this prompt is in the KV cache
    prompt = nonce + " " + " ".join(str(i) for i in range(600))
    body = {**body_of(prompt), "max_tokens": 4, "stream": True, **GREEDY}
    headers = {"Authorization": f"Bearer {keeping_daemon.token}"}
    with httpx.stream("POST", keeping_daemon.url + path, json=body, headers=headers, timeout=300) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        events = [e for e in response.read().decode().split("\n\n") if e]
    comments = [i for i, e in enumerate(events) if e == ": keep-alive"]
    tokens = [
        i
        for i, e in enumerate(events)
        if any(k in e for k in ('"content":"', '"text":"', '"delta":"', "text_delta")) and '"content":""' not in e
    ]
    assert is_opening(events), events[:3]
    assert comments and tokens, events
    assert comments == list(range(comments[0], comments[-1] + 1)) and comments[-1] < tokens[0], events
    assert all(e.startswith(("data: ", "event: ")) for e in events[comments[-1] + 1 :]), events


def test_max_tokens(client):
    response = client.chat.completions.create(
        model="m", messages=user("Tell me a long story about a dragon."), max_tokens=5, **GREEDY
    )
    assert response.choices[0].finish_reason == "length"
    assert response.usage.completion_tokens == 5
    # OpenAI's newer name for the same limit.
    response = client.chat.completions.create(
        model="m", messages=user("Tell me a long story about a dragon."), max_completion_tokens=3, **GREEDY
    )
    assert response.choices[0].finish_reason == "length" and response.usage.completion_tokens == 3


def test_stop_strings(client):
    def chat(**kwargs):
        messages = user(CODE_QUESTION)
        return client.chat.completions.create(model="m", messages=messages, max_tokens=24, **GREEDY, **kwargs)

    full = chat().choices[0].message.content
    assert "def " in full, full
    expected = full[: full.index("def ")]

    response = chat(stop=["def ", "zzz"])
    assert response.choices[0].message.content == expected
    assert response.choices[0].finish_reason == "stop"

    chunks = list(chat(stop="def ", stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert streamed == expected and "def " not in streamed
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_seeded_sampling_is_reproducible(client):
    def sample(seed: int) -> str:
        response = client.chat.completions.create(
            model="m", messages=user("Write a short poem about the sea."), max_tokens=16, temperature=0.8, seed=seed
        )
        return response.choices[0].message.content

    first = sample(1234)
    assert first and sample(1234) == first


# --- text completions -------------------------------------------------------------------------


def test_completion(client, http, info):
    prompt = "def fibonacci(n):"
    before = stats(http)["engine"]
    response = client.completions.create(model="m", prompt=prompt, max_tokens=16, **GREEDY)
    after = stats(http)["engine"]
    assert response.object == "text_completion" and response.id.startswith("cmpl-")
    choice = response.choices[0]
    assert choice.text and choice.logprobs is None
    assert response.usage.prompt_tokens == len(info.tokenizer.encode(prompt))
    assert response.usage.completion_tokens == after["generated_tokens"] - before["generated_tokens"]
    assert response.model_extra["timings"]["ttft_ms"] > 0

    chunks = list(client.completions.create(model="m", prompt=prompt, max_tokens=16, stream=True, **GREEDY))
    assert "".join(c.choices[0].text for c in chunks) == choice.text
    assert chunks[-1].choices[0].finish_reason == choice.finish_reason


def test_completion_prompt_as_token_ids(client, info):
    prompt = "The quick brown fox"
    as_text = client.completions.create(model="m", prompt=prompt, max_tokens=8, **GREEDY)
    as_ids = client.completions.create(model="m", prompt=info.tokenizer.encode(prompt), max_tokens=8, **GREEDY)
    assert as_ids.choices[0].text == as_text.choices[0].text
    assert as_ids.usage.prompt_tokens == as_text.usage.prompt_tokens


def test_completion_stop_and_usage_chunk(client):
    prompt = "1, 2, 3, 4,"
    full = client.completions.create(model="m", prompt=prompt, max_tokens=16, **GREEDY).choices[0].text
    assert " 7" in full, full
    options = {"include_usage": True}
    chunks = list(
        client.completions.create(
            model="m", prompt=prompt, max_tokens=16, stop=[" 7"], stream=True, stream_options=options, **GREEDY
        )
    )
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    assert "".join(c.choices[0].text for c in chunks[:-1]) == full[: full.index(" 7")]
    assert chunks[-2].choices[0].finish_reason == "stop"


def test_suffix_needs_fill_in_the_middle_tokens(http, info):
    from lingcode.completion.prompt import completion_family

    response = http.post("/v1/completions", json={"prompt": "def f(", "suffix": "\n    return x\n", "max_tokens": 4})
    if completion_family(info).fim:
        assert response.status_code == 200
    else:
        assert_error(response, 400, param="suffix")


# --- errors -----------------------------------------------------------------------------------


def test_unknown_route_and_method(http):
    assert_error(http.get("/v1/nope"), 404)
    assert_error(http.post("/v2/chat/completions", json={}), 404)
    assert_error(http.get("/v1/chat/completions"), 405)


def test_malformed_and_invalid_bodies(http):
    for raw in (b'{"messages": [', b"[1, 2]", b"", b"\xff\xfe"):
        response = http.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
        assert_error(response, 400)
    ok = {"messages": user("hi"), "max_tokens": 1}
    cases = [
        ({**ok, "n": 2}, "n"),
        ({**ok, "max_tokens": 0}, "max_tokens"),
        ({**ok, "max_tokens": "5"}, "max_tokens"),
        ({**ok, "temperature": 2.5}, "temperature"),
        ({**ok, "top_p": 0}, "top_p"),
        ({**ok, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({**ok, "seed": "x"}, "seed"),
        ({**ok, "messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
        ({**ok, "messages": []}, "messages"),
        ({"max_tokens": 1}, "messages"),
    ]
    for body, param in cases:
        assert_error(http.post("/v1/chat/completions", json=body), 400, param=param)
    assert_error(http.post("/v1/completions", json={"prompt": ["a", "b"], "max_tokens": 1}), 400, param="prompt")
    assert_error(http.post("/v1/completions", json={"prompt": "a", "n": 3}), 400, param="n")


def test_n_other_than_one_through_the_sdk(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="m", messages=user("hi"), max_tokens=1, n=2)
    assert caught.value.status_code == 400


def test_context_overflow_is_a_400_never_a_truncation(client, http, info):
    before = stats(http)["engine"]["requests"]
    too_long = user("hello " * 9000)  # over the 8192-token context on its own
    assert len(chat_prompt_ids(info, too_long)) > info.context_length
    response = http.post("/v1/chat/completions", json={"messages": too_long, "max_tokens": 1})
    error = assert_error(response, 400, code="context_length_exceeded")
    assert str(info.context_length) in error["message"]
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="m", messages=too_long)
    assert caught.value.code == "context_length_exceeded"

    # The prompt fits, but not with the completion asked for.
    prompt = "hello" + " hello" * 7999
    n_prompt = len(info.tokenizer.encode(prompt))
    assert n_prompt < info.context_length < n_prompt + 500
    response = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 500})
    assert_error(response, 400, code="context_length_exceeded", param="max_tokens")
    assert stats(http)["engine"]["requests"] == before  # nothing reached the engine


def test_over_size_body_is_413(http):
    big = json.dumps({"messages": user("x" * (4 * 1024 * 1024 + 1))}).encode()
    assert_error(http.post("/v1/chat/completions", content=big, headers={"content-type": "application/json"}), 413)

    def chunked():  # no Content-Length: the limit is checked while reading
        for _ in range(5):
            yield b" " * (1024 * 1024)
        yield b"{}"

    assert_error(http.post("/v1/completions", content=chunked(), headers={"content-type": "application/json"}), 413)
    assert http.get("/health").status_code == 200  # and the daemon is fine


# --- the engine slot: disconnects and prefix reuse -------------------------------------------


def test_disconnect_mid_stream_frees_the_engine_within_a_step(client, http):
    before = wait_idle(http)
    stream = client.chat.completions.create(
        model="m",
        messages=user("Tell me a very long story."),
        max_tokens=2000,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()  # the client goes away after a few tokens

    after = wait_idle(http)
    assert after["engine"]["aborted"] == before["engine"]["aborted"] + 1
    assert after["scheduler"]["aborted"] == before["scheduler"]["aborted"] + 1
    last = after["engine"]["last_request"]
    assert last["finish_reason"] == "abort"
    assert last["steps_after_abort"] <= 1
    assert last["generated_tokens"] < 100  # stopped right away, nowhere near max_tokens
    # The engine is free for the next request.
    response = client.chat.completions.create(model="m", messages=user("Hi"), max_tokens=4, **GREEDY)
    assert response.choices[0].finish_reason in ("stop", "length")


def assert_dropped_while_queued(client, http, queue_and_leave) -> None:
    """Hold the engine with a long stream, run queue_and_leave() (a request that waits in the queue
    and whose client leaves), and check that the request was dropped without ever running."""
    before = wait_idle(http)
    running = client.chat.completions.create(
        model="m",
        messages=user("Tell me a very long story."),
        max_tokens=2000,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    next(iter(running))  # it holds the engine now
    queue_and_leave()
    deadline = time.monotonic() + 30
    while stats(http)["scheduler"]["queued"]:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    running.close()
    after = wait_idle(http)
    assert after["scheduler"]["dropped_while_queued"] == before["scheduler"]["dropped_while_queued"] + 1
    assert after["engine"]["requests"] == before["engine"]["requests"] + 1  # the dropped one never ran


def test_disconnect_while_queued_drops_the_request(client, http, daemon):
    def queue_and_leave():
        with pytest.raises(httpx.TimeoutException):  # this one waits in the queue; its client gives up
            httpx.post(
                daemon.url + "/v1/completions",
                headers={"x-api-key": daemon.token},
                json={"prompt": "Hello", "max_tokens": 4},
                timeout=0.5,
            )

    assert_dropped_while_queued(client, http, queue_and_leave)


def test_disconnect_while_queued_is_seen_after_a_large_body(client, http, daemon):
    """The body's last 100 KB come in one write, past uvicorn's high-water mark (64 KiB), which
    pauses reading the connection; the daemon reads on once the body is in, so that the client
    leaving while its request waits in the queue is still seen."""
    start = json.dumps({"prompt": "Hello", "max_tokens": 4}).encode()
    rest = b" " * 100_000  # JSON's whitespace: a large body, a short prompt
    url = httpx.URL(daemon.url)
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {url.host}:{url.port}\r\nx-api-key: {daemon.token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(start) + len(rest)}\r\n\r\n"
    ).encode()

    def queue_and_leave():
        with socket.create_connection((url.host, url.port)) as sock:
            sock.sendall(head + start)
            time.sleep(0.2)  # the handler has read the start of the body and waits for the rest
            sock.sendall(rest)
            deadline = time.monotonic() + 30
            while not stats(http)["scheduler"]["queued"]:  # it waits in the queue; then its client leaves
                assert time.monotonic() < deadline
                time.sleep(0.02)

    assert_dropped_while_queued(client, http, queue_and_leave)


def test_full_queue_is_429_with_retry_after(client, http, daemon):
    before = wait_idle(http)
    max_queue = before["scheduler"]["max_queue"]
    running = client.chat.completions.create(
        model="m",
        messages=user("Tell me a very long story."),
        max_tokens=2000,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    next(iter(running))

    def queued_request(i: int) -> httpx.Response:
        body = {"prompt": f"Request {i}:", "max_tokens": 1}
        return httpx.post(daemon.url + "/v1/completions", headers={"x-api-key": daemon.token}, json=body, timeout=120)

    with ThreadPoolExecutor(max_queue) as pool:
        waiting = []
        for i in range(max_queue):  # one at a time, so that they queue in this order
            waiting.append(pool.submit(queued_request, i))
            deadline = time.monotonic() + 30
            while len(stats(http)["scheduler"]["queued"]) < i + 1:
                assert time.monotonic() < deadline
                time.sleep(0.01)
        order = stats(http)["scheduler"]["queued"]
        response = http.post("/v1/completions", json={"prompt": "One too many", "max_tokens": 1})
        assert_error(response, 429, code="queue_full")
        assert int(response.headers["retry-after"]) >= 1
        running.close()
        results = [w.result() for w in waiting]
    assert all(r.status_code == 200 for r in results)
    assert [r.json()["id"] for r in results] == order  # they waited in arrival order
    after = wait_idle(http)
    assert after["scheduler"]["rejected"] == before["scheduler"]["rejected"] + 1


def test_prefix_reuse_prefills_only_the_new_tokens(client, http, info):
    first_turn = user("What is the capital of Germany?")
    first = client.chat.completions.create(model="m", messages=first_turn, max_tokens=32, **GREEDY)
    answer = first.choices[0].message.content
    assert first.choices[0].finish_reason == "stop", answer  # ended by <|im_end|>: the cache holds it all

    follow_up = first_turn + [{"role": "assistant", "content": answer}, {"role": "user", "content": "And of Italy?"}]
    prompt_1, prompt_2 = chat_prompt_ids(info, first_turn), chat_prompt_ids(info, follow_up)
    # The cache holds the first prompt and the answer's tokens (all but <|im_end|>, never fed back).
    shared = common_prefix(prompt_1 + info.tokenizer.encode(answer), prompt_2)
    assert shared > len(prompt_1)

    before = stats(http)["engine"]
    second = client.chat.completions.create(model="m", messages=follow_up, max_tokens=8, **GREEDY)
    after = stats(http)["engine"]

    usage = second.usage
    assert usage.prompt_tokens == len(prompt_2)
    assert usage.prompt_tokens_details.cached_tokens == shared
    assert after["cached_tokens"] - before["cached_tokens"] == shared
    assert after["prefilled_tokens"] - before["prefilled_tokens"] == usage.prompt_tokens - shared
    assert second.model_extra["timings"]["cached_tokens"] == shared

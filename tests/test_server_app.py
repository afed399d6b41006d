"""The HTTP app in process, over a scripted engine: what reaches the engine, and how failures look.

The real model's tokenizer and template are used (so text is real text), but the engine is a
script, which makes engine failures, before or during a stream, reproducible.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re

import pytest
from fastapi.testclient import TestClient

from lingcode.engine import EngineError, SamplingParams, TokenChunk, handed_over
from lingcode.pipeline.scheduler import Scheduler
from lingcode.server.app import create_app

TOKEN = "test-token"


class ScriptedEngine:
    """Plays `script` (token ids, or an exception to raise) for every request, then finishes on length."""

    head_before_submit = False  # a stream's head waits for the engine (handed_over) or the first chunk

    def __init__(self, info, script):
        self.info = info
        self.script = script
        self.calls: list[tuple[list[int], SamplingParams]] = []

    async def generate(self, request_id, input_ids, params):
        self.calls.append((input_ids, params))
        for step in self.script:
            if isinstance(step, BaseException):
                raise step
            yield TokenChunk([step], None, len(input_ids), 0)
        yield TokenChunk([], "length", len(input_ids), 0)

    async def abort(self, request_id):
        pass

    def stats(self):
        return {"calls": len(self.calls)}

    async def close(self):
        pass


@pytest.fixture
def serve(engine):
    """serve(script) -> (TestClient, ScriptedEngine) on the real model's tokenizer and template."""

    def make(script):
        scripted = ScriptedEngine(engine.info, script)
        app = create_app(Scheduler(scripted), engine.info, TOKEN, model_id="scripted")
        client = TestClient(
            app,
            base_url="http://localhost",
            raise_server_exceptions=False,
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        return client, scripted

    return make


def events(response) -> list:
    blocks = [b.removeprefix("data: ") for b in response.text.split("\n\n") if b.strip()]
    return [b if b == "[DONE]" else json.loads(b) for b in blocks]


def test_request_fields_reach_the_engine_as_sampling_params(serve, engine):
    tokens = engine.info.tokenizer.encode("Hello world")
    client, scripted = serve(tokens)
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 300,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 40,
        "seed": 7,
        "ignore_eos": True,
        "repetition_penalty": 1.1,
    }
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "Hello world"
    _, params = scripted.calls[0]
    # What the client set is used exactly as sent.
    assert params == SamplingParams(
        max_tokens=300, temperature=0.5, top_p=0.9, top_k=40, seed=7, ignore_eos=True, repetition_penalty=1.1
    )
    assert client.get("/v1/lingcode/stats").json()["engine"] == {"calls": 1}


def test_fields_left_out_get_the_model_familys_defaults(serve, engine):
    """SmolLM2's defaults (lingcode/data/families.toml): greedy, and with no max_tokens the family's
    answer length (1024), not the whole context."""
    client, scripted = serve(engine.info.tokenizer.encode("Paris"))
    for route, body in [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/completions", {"prompt": "The capital of France is"}),
        ("/v1/responses", {"input": "hi"}),
    ]:
        assert client.post(route, json=body).status_code == 200, route
    for _, params in scripted.calls:
        assert (params.max_tokens, params.temperature, params.top_p, params.top_k) == (1024, 0.0, 1.0, 0)
    # Anthropic requires max_tokens; the temperature left out is the family's too.
    response = client.post(
        "/v1/messages", json={"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    )
    assert response.status_code == 200, response.text
    assert (scripted.calls[-1][1].max_tokens, scripted.calls[-1][1].temperature) == (5, 0.0)
    # A prompt that leaves less room than the default length gets the rest of the context.
    long = {"prompt": [1] * (engine.info.context_length - 10)}
    assert client.post("/v1/completions", json=long).status_code == 200
    assert scripted.calls[-1][1].max_tokens == 10


def test_an_editors_completion_takes_no_repetition_penalty_it_did_not_ask_for(qwen_engine):
    """Qwen2.5-Coder's defaults include its card's repetition penalty; code completion repeats the
    names around the cursor, so fill-in-the-middle (/v1/completions with a suffix) leaves it out,
    and the editor route (what the LSP sends) stays greedy with none, as before the family had any."""
    fim = {"prefix": "<|fim_prefix|>", "suffix": "<|fim_suffix|>", "middle": "<|fim_middle|>"}
    info = dataclasses.replace(qwen_engine.info, fim_tokens=fim)
    scripted = ScriptedEngine(info, info.tokenizer.encode("x"))
    app = create_app(Scheduler(scripted), info, TOKEN, model_id="scripted")
    client = TestClient(app, base_url="http://localhost", headers={"Authorization": f"Bearer {TOKEN}"})

    def sent(route: str, body: dict) -> tuple:
        assert client.post(route, json=body).status_code == 200, route
        params = scripted.calls[-1][1]
        return params.temperature, params.top_p, params.top_k, params.repetition_penalty

    card = (0.7, 0.8, 20, 1.05)
    assert sent("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}) == card
    assert sent("/v1/completions", {"prompt": "def f(", "max_tokens": 2}) == card
    assert sent("/v1/completions", {"prompt": "def f(", "suffix": ")\n", "max_tokens": 2}) == (0.7, 0.8, 20, 1.0)
    asked = {"prompt": "def f(", "suffix": ")\n", "max_tokens": 2, "repetition_penalty": 1.2}
    assert sent("/v1/completions", asked)[3] == 1.2
    lsp = {"prefix": "def f(", "suffix": ")\n", "path": "f.py", "max_tokens": 2, "multiline": None}
    assert sent("/v1/lingcode/complete", lsp) == (0.0, 1.0, 0, 1.0)


def test_a_looping_answer_stops_when_the_client_set_no_max_tokens(serve, engine):
    loop = engine.info.tokenizer.encode(" and then")  # repeated until the script ends
    client, scripted = serve(loop * 200)
    answer = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    assert answer["choices"][0]["finish_reason"] == "stop" and answer["lingcode"] == {"stop_reason": "loop"}
    assert answer["usage"]["completion_tokens"] < 100  # stopped once the loop was plain, not after 600 tokens
    # With max_tokens set, the client gets exactly what it asked for (OpenAI's semantics).
    answer = client.post(
        "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 600}
    ).json()
    assert answer["usage"]["completion_tokens"] == len(loop) * 200


def test_a_loop_stop_is_a_normal_stop_in_every_api_and_says_why(serve, engine, caplog):
    """Issue 62.9: no limit was reached, so clients must not read "out of tokens" (aider said
    "token limit", Codex `max_output_tokens`): each API's normal stop, with lingcode's own field
    saying why, and a log line. Read with the official SDKs, as agents read it."""
    import anthropic
    import openai

    from lingcode.pipeline.generation import Usage
    from lingcode.pipeline.turns import TurnEnd
    from lingcode.server.anthropic.messages import MessageShape

    client, _ = serve(engine.info.tokenizer.encode(" and then") * 200)
    sdk = openai.OpenAI(base_url="http://localhost/v1", api_key=TOKEN, http_client=client, max_retries=0)
    why = {"stop_reason": "loop"}
    hi = [{"role": "user", "content": "hi"}]
    with caplog.at_level("INFO", logger="lingcode.generation"):
        chat = sdk.chat.completions.create(model="m", messages=hi)
    assert chat.choices[0].finish_reason == "stop" and chat.model_extra["lingcode"] == why
    assert chat.usage.completion_tokens < 100
    assert any("repeat" in r.getMessage() and getattr(r, "stop_reason", None) == "loop" for r in caplog.records)
    last = [c for c in sdk.chat.completions.create(model="m", messages=hi, stream=True) if c.choices][-1]
    assert last.choices[0].finish_reason == "stop" and last.model_extra["lingcode"] == why
    text = sdk.completions.create(model="m", prompt="hi")
    assert text.choices[0].finish_reason == "stop" and text.model_extra["lingcode"] == why
    last = [c for c in sdk.completions.create(model="m", prompt="hi", stream=True) if c.choices][-1]
    assert last.choices[0].finish_reason == "stop" and last.model_extra["lingcode"] == why
    response = sdk.responses.create(model="m", input="hi")
    assert (response.status, response.incomplete_details) == ("completed", None)
    assert response.model_extra["lingcode"] == why
    events = list(sdk.responses.create(model="m", input="hi", stream=True))
    assert events[-1].type == "response.completed" and events[-1].response.model_extra["lingcode"] == why
    # Anthropic's max_tokens is required, so its answers are never loop-stopped; the shape maps it all the same.
    end = TurnEnd("loop", "and then", "", [], Usage(3, 60, 0), None)
    message = anthropic.types.Message.model_validate(MessageShape("msg_1", "m").whole(end))
    assert message.stop_reason == "end_turn" and message.model_extra["lingcode"] == why
    delta = MessageShape("msg_1", "m").frames([end]).split("event: message_delta\ndata: ")[1].split("\n\n")[0]
    delta = anthropic.types.RawMessageDeltaEvent.model_validate_json(delta)
    assert delta.delta.stop_reason == "end_turn" and delta.model_extra["lingcode"] == why


def test_the_context_limit_reads_the_same_in_every_apis_errors(serve, engine):
    """Issue 62.9: Anthropic's error said 8191, OpenAI's 8192, for one context."""
    import anthropic
    import openai

    client, _ = serve([])
    context = engine.info.context_length
    long = [{"role": "user", "content": "hi " * context}]
    oai = openai.OpenAI(base_url="http://localhost/v1", api_key=TOKEN, http_client=client, max_retries=0)
    ant = anthropic.Anthropic(base_url="http://localhost", api_key=TOKEN, http_client=client, max_retries=0)
    said = []
    for call in (
        lambda: oai.chat.completions.create(model="m", messages=long),
        lambda: oai.responses.create(model="m", input="hi " * context),
        lambda: ant.messages.create(model="m", max_tokens=5, messages=long),
        lambda: ant.messages.create(model="m", max_tokens=context, messages=[{"role": "user", "content": "hi"}]),
    ):
        with pytest.raises((openai.BadRequestError, anthropic.BadRequestError)) as caught:
            call()
        said.append(caught.value.message)
    assert str(context) in said[0] and str(context) in said[1], said
    assert re.search(rf"prompt is too long: \d+ tokens > {context} maximum", said[2]), said
    assert re.search(rf"exceed context limit: \d+ \+ {context} > {context}", said[3]), said
    # A prompt of exactly the context leaves no room for the answer's first token: the same number.
    from lingcode.server.errors import ContextLengthExceeded

    message = ContextLengthExceeded(context, context).anthropic_body()["error"]["message"]
    assert f"{context} + 1 > {context}" in message, message


def test_an_unexpected_failure_is_a_bare_500(serve):
    client, _ = serve([RuntimeError("secret internals")])
    for stream in (False, True):
        response = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 4, "stream": stream})
        assert response.status_code == 500
        error = response.json()["error"]
        assert error["type"] == "server_error"
        assert "secret" not in response.text and "Traceback" not in response.text


def test_an_engine_error_before_the_first_token_is_a_500_with_its_reason(serve):
    client, _ = serve([EngineError("engine failed: out of memory")])
    for stream in (False, True):
        response = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 4, "stream": stream})
        assert response.status_code == 500
        assert response.json()["error"]["code"] == "engine_error"
        assert "out of memory" in response.json()["error"]["message"]


def test_an_engine_error_mid_stream_is_an_error_event(serve, engine):
    tokens = engine.info.tokenizer.encode("Hello world")
    client, _ = serve([*tokens, EngineError("engine failed: device lost")])
    response = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 8, "stream": True})
    assert response.status_code == 200  # the stream had started
    *chunks, error, done = events(response)
    assert "".join(c["choices"][0]["text"] for c in chunks) == "Hello world"
    assert error["error"]["code"] == "engine_error" and "device lost" in error["error"]["message"]
    assert done == "[DONE]"


class GatedEngine(ScriptedEngine):
    """Takes the request (handed_over), then plays its script once `gate` is set."""

    def __init__(self, info, script):
        super().__init__(info, script)
        self.gate = asyncio.Event()

    async def generate(self, request_id, input_ids, params):
        self.seen = [m["type"] for m in self.sent]  # what the daemon had sent when the engine got the request
        handed_over()
        await self.gate.wait()
        async for chunk in super().generate(request_id, input_ids, params):
            yield chunk


async def _asgi_stream(engine, script, path: str, body: dict, before: bool = False) -> tuple[list[dict], GatedEngine]:
    """The ASGI messages of one streamed request; the engine's gate opens once the response has started.
    before: the engine's head_before_submit (the CPU engine's)."""
    gated = GatedEngine(engine.info, script)
    gated.head_before_submit = before
    app = create_app(Scheduler(gated), engine.info, TOKEN, model_id="scripted")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8000),
        "headers": [
            (b"host", b"127.0.0.1"),
            (b"authorization", f"Bearer {TOKEN}".encode()),
            (b"content-type", b"application/json"),
        ],
    }
    requests = [{"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}]
    sent: list[dict] = []
    gated.sent = sent

    async def receive():
        if requests:
            return requests.pop()
        await asyncio.Event().wait()  # the client stays

    async def send(message):
        sent.append(message)
        if message["type"] == "http.response.body" and not gated.gate.is_set():
            gated.gate.set()  # the head and the opening went out while the engine held the first token

    await asyncio.wait_for(app(scope, receive, send), 30)  # without an early head the gate never opens
    return sent, gated


async def test_a_streams_head_and_opening_go_out_once_the_engine_has_the_request(engine):
    """The client reads them while the engine computes the first token, not after it (issue 17)."""
    tokens = engine.info.tokenizer.encode("Hello world")
    sent, _ = await _asgi_stream(
        engine,
        tokens,
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stream": True},
    )
    start, opening, *bodies = sent
    assert start["type"] == "http.response.start" and start["status"] == 200
    assert json.loads(opening["body"].removeprefix(b"data: "))["choices"][0]["delta"] == {
        "role": "assistant",
        "content": "",
    }
    text = b"".join(m["body"] for m in bodies).decode()
    assert text.count('"role"') == 0  # the opening went out once
    deltas = [json.loads(b.removeprefix("data: ")) for b in text.split("\n\n") if b.startswith("data: {")]
    assert "".join(d["choices"][0]["delta"].get("content", "") for d in deltas) == "Hello world"
    assert text.endswith("data: [DONE]\n\n")


async def test_a_stream_opens_before_the_engine_has_it_once_nothing_can_refuse_it(engine):
    """With an engine that asks for it (head_before_submit: the CPU engine), a stream's head goes
    out once its prompt is rendered and surely leaves the answer room (issue 17), and its opening
    once the request is checked: both before the engine has the request (issue 62.8)."""
    tokens = engine.info.tokenizer.encode("Hello world")
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stream": True}
    sent, gated = await _asgi_stream(engine, tokens, "/v1/chat/completions", body, before=True)
    assert gated.seen == ["http.response.start", "http.response.body"]
    start, opening, *bodies = sent
    assert start["status"] == 200
    assert json.loads(opening["body"].removeprefix(b"data: "))["choices"][0]["delta"] == {
        "role": "assistant",
        "content": "",
    }
    deltas = [
        json.loads(b.removeprefix("data: "))
        for b in b"".join(m["body"] for m in bodies).decode().split("\n\n")
        if b.startswith("data: {")
    ]
    assert "".join(d["choices"][0]["delta"].get("content", "") for d in deltas) == "Hello world"
    # A grammar that might not compile (a 400) keeps the head until it compiled; then both go out.
    sent, gated = await _asgi_stream(
        engine, tokens, "/v1/chat/completions", {**body, "response_format": {"type": "json_object"}}, before=True
    )
    assert gated.seen == ["http.response.start", "http.response.body"] and sent[0]["status"] == 200


async def test_a_stream_that_fails_after_its_head_went_out_gets_an_error_frame(engine, monkeypatch):
    """Should the exact count overrule the bound the head went out on, the context error goes in
    the stream, as the API's own error frame, and the engine never sees the request."""
    from lingcode.server import serving

    monkeypatch.setattr(serving, "PROMPT_TOKENS_ADDED", -(10**6))  # a bound that says any prompt fits
    too_much = engine.info.context_length
    for path, body, frame in (
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "max_tokens": too_much, "stream": True},
            "data: ",
        ),
        (
            "/v1/messages",
            {"model": "m", "max_tokens": too_much, "stream": True, "messages": [{"role": "user", "content": "hi"}]},
            "event: error\ndata: ",
        ),
        ("/v1/responses", {"input": "hi", "max_output_tokens": too_much, "stream": True}, "event: error\ndata: "),
    ):
        sent, gated = await _asgi_stream(engine, [], path, body, before=True)
        assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
        text = b"".join(m.get("body", b"") for m in sent[1:]).decode()
        error = json.loads(text.split(frame)[1].split("\n\n")[0])
        assert "context" in json.dumps(error), text
        assert not gated.calls and not hasattr(gated, "seen")


async def test_an_engine_error_after_it_took_the_request_is_an_error_event(engine):
    """Once the engine has the request the response has started: its error is a frame in the API's shape."""
    sent, _ = await _asgi_stream(
        engine,
        [EngineError("engine failed: out of memory")],
        "/v1/messages",
        {"model": "m", "max_tokens": 5, "stream": True, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert sent[0]["status"] == 200
    text = b"".join(m.get("body", b"") for m in sent[1:]).decode()
    error = json.loads(text.split("event: error\ndata: ")[1].split("\n\n")[0])
    assert error["type"] == "error" and "out of memory" in error["error"]["message"], text


def test_what_first_requests_would_build_is_built_with_the_app(serve, engine):
    # Each of these cost the first request of its kind 3-240 ms on 2 cores; create_app builds them.
    from lingcode.agent import grammar, tool_prompt
    from lingcode.text import chat_template

    tokenizer = engine.info.tokenizer
    chat_template._compile.cache_clear()
    tool_prompt.template_variables.cache_clear()
    tokenizer._plain = None
    grammar._compilers.pop(id(tokenizer), None)
    client, _ = serve(tokenizer.encode("Hello"))
    assert chat_template._compile.cache_info().currsize == 1
    assert tool_prompt.template_variables.cache_info().currsize == 1
    assert tokenizer._plain is not None  # encode_text()'s, for the editor's prompts
    assert id(tokenizer) in grammar._compilers
    compiled = chat_template._compile.cache_info()
    response = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code == 200, response.text
    assert chat_template._compile.cache_info().misses == compiled.misses  # the request compiled nothing


def test_a_grammar_compiler_that_cannot_be_built_does_not_stop_the_app(serve, engine, monkeypatch):
    # Built at startup only to spare the first constrained request: that request reports a failure.
    from lingcode.agent import grammar

    def unreadable(*args):
        raise ValueError("a tokenizer llguidance cannot read")

    monkeypatch.setattr(grammar, "_Compiler", unreadable)
    grammar._compilers.pop(id(engine.info.tokenizer), None)
    client, _ = serve(engine.info.tokenizer.encode("Hello"))
    response = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code == 200, response.text
    constrained = client.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_object"}},
    )
    assert constrained.status_code == 500

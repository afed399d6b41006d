"""The HTTP app in process, over a scripted engine: what reaches the engine, and how failures look.

The real model's tokenizer and template are used (so text is real text), but the engine is a
script, which makes engine failures, before or during a stream, reproducible.
"""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from lingcode.engine import EngineError, SamplingParams, TokenChunk
from lingcode.pipeline.scheduler import Scheduler
from lingcode.server.app import create_app

TOKEN = "test-token"


class ScriptedEngine:
    """Plays `script` (token ids, or an exception to raise) for every request, then finishes on length."""

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
        client = TestClient(app, base_url="http://localhost", raise_server_exceptions=False,
                            headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip
        return client, scripted

    return make


def events(response) -> list:
    blocks = [b.removeprefix("data: ") for b in response.text.split("\n\n") if b.strip()]
    return [b if b == "[DONE]" else json.loads(b) for b in blocks]


def test_request_fields_reach_the_engine_as_sampling_params(serve, engine):
    tokens = engine.info.tokenizer.encode("Hello world")
    client, scripted = serve(tokens)
    body = {"messages": [{"role": "user", "content": "hi"}], "temperature": 0.5, "top_p": 0.9, "top_k": 40,
            "seed": 7, "ignore_eos": True}  # fmt: skip
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "Hello world"
    input_ids, params = scripted.calls[0]
    # No max_tokens: whatever the context has left, never more.
    expected = SamplingParams(max_tokens=engine.info.context_length - len(input_ids), temperature=0.5, top_p=0.9,
                              top_k=40, seed=7, ignore_eos=True)  # fmt: skip
    assert params == expected
    assert client.get("/v1/lingcode/stats").json()["engine"] == {"calls": 1}


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

"""Constrained decoding in process: the real engine under an xgrammar constraint, and its absence as a 400."""

from __future__ import annotations

import dataclasses
import json
import sys

from fastapi.testclient import TestClient

from lingcode.text.chat_template import render_chat
from lingcode.engine import SamplingParams
from lingcode.agent.grammar import constraint
from lingcode.pipeline.scheduler import Scheduler
from lingcode.server.app import create_app

TOKEN = "test-token"
SCHEMA = {"type": "object", "properties": {"language": {"type": "string", "enum": ["python", "rust", "go"]},
          "lines": {"type": "integer", "minimum": 1}}, "required": ["language", "lines"], "additionalProperties": False}  # fmt: skip


async def test_the_default_model_writes_schema_valid_json_under_a_constraint(engine):
    info = engine.info
    prompt = render_chat(info.chat_template, [{"role": "user", "content": "Which language is this project in?"}])
    grammar = constraint(info.tokenizer, info.eos_token_ids, "json_schema", SCHEMA)
    params = dataclasses.replace(SamplingParams(max_tokens=40, temperature=0.8, seed=7), constraint=grammar)
    out = []
    async for chunk in engine.generate("constrained", info.tokenizer.encode(prompt), params):
        out += chunk.token_ids
        finish = chunk.finish_reason
    assert finish == "stop" and grammar.is_terminated()
    value = json.loads(info.tokenizer.decode([t for t in out if t not in info.eos_token_ids]))
    assert set(value) == {"language", "lines"} and value["language"] in SCHEMA["properties"]["language"]["enum"]
    assert isinstance(value["lines"], int) and value["lines"] >= 1


def test_without_xgrammar_constrained_requests_are_a_clear_400(engine, monkeypatch):
    monkeypatch.setitem(sys.modules, "xgrammar", None)  # as if it were not installed
    # base_url: a loopback Host, as a local client sends (the access guard refuses others)
    client = TestClient(create_app(Scheduler(engine), engine.info, TOKEN, model_id="m"), base_url="http://127.0.0.1")
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    response = client.post("/v1/chat/completions", headers={"Authorization": f"Bearer {TOKEN}"},
                           json={"messages": [{"role": "user", "content": "hi"}], "tools": [tool], "tool_choice": "required"})  # fmt: skip
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "grammar_unavailable" and "lingcode[grammar]" in error["message"]
    assert error["param"] == "tool_choice"
    # an unconstrained request is unaffected
    plain = client.post("/v1/chat/completions", headers={"Authorization": f"Bearer {TOKEN}"},
                        json={"messages": [{"role": "user", "content": "hi"}], "tools": [tool], "max_tokens": 1})  # fmt: skip
    assert plain.status_code == 200

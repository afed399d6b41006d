"""Constrained decoding in process: the real engine under an llguidance constraint, its bounds, and its cancellation."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from pathlib import Path

import pytest

from fastapi.testclient import TestClient

from lingcode.text.chat_template import render_chat
from lingcode.engine import SamplingParams
from lingcode.agent.grammar import GrammarCancelled, constraint
from lingcode.agent.tool_parsers import Tool, tool_call_grammar
from lingcode.pipeline.scheduler import Scheduler
from lingcode.server.app import create_app

TOKEN = "test-token"
SCHEMA = {
    "type": "object",
    "properties": {
        "language": {"type": "string", "enum": ["python", "rust", "go"]},
        "lines": {"type": "integer", "minimum": 1},
    },
    "required": ["language", "lines"],
    "additionalProperties": False,
}


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


def _client(engine) -> TestClient:
    # base_url: a loopback Host, as a local client sends (the access guard refuses others)
    return TestClient(create_app(Scheduler(engine), engine.info, TOKEN, model_id="m"), base_url="http://127.0.0.1")


def _json_schema_request(client: TestClient, schema: dict, max_tokens: int = 24):
    return client.post(
        "/v1/chat/completions",
        headers={"Authorization": f"Bearer {TOKEN}"},
        json={
            "messages": [{"role": "user", "content": "Answer in JSON."}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}},
        },
    )


def test_forced_tool_choice_and_json_work_in_the_plain_install(engine):
    """llguidance is a plain dependency: no extra to install for a forced call or a JSON answer."""
    from importlib.metadata import requires

    assert any(r.startswith("llguidance") and "extra" not in r for r in requires("lingcode"))
    client = _client(engine)
    tool = {
        "type": "function",
        "function": {
            "name": "f",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string", "maxLength": 24}},
                "required": ["path"],
            },
        },
    }
    forced = client.post(
        "/v1/chat/completions",
        headers={"Authorization": f"Bearer {TOKEN}"},
        json={
            "messages": [{"role": "user", "content": "Read main.py"}],
            "tools": [tool],
            "tool_choice": "required",
            "parallel_tool_calls": False,
            "max_tokens": 100,
            "temperature": 0,
        },
    )
    assert forced.status_code == 200, forced.text
    (call,) = forced.json()["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "f" and isinstance(json.loads(call["function"]["arguments"])["path"], str)
    answer = _json_schema_request(client, SCHEMA, max_tokens=40)
    assert answer.status_code == 200, answer.text
    assert json.loads(answer.json()["choices"][0]["message"]["content"])["language"] in ("python", "rust", "go")


def test_pathological_schemas_get_a_400_at_once(engine):
    client = _client(engine)
    huge = {"type": "object", "properties": {"a": {"enum": [f"option-{i:05d}-" + "x" * 110 for i in range(10000)]}}}
    nested: dict = {"type": "string"}
    for _ in range(200):
        nested = {"type": "object", "properties": {"a": nested}, "required": ["a"]}
    wide = {
        "anyOf": [
            {"type": "object", "properties": {f"k{i}": {"type": "string"}}, "required": [f"k{i}"]} for i in range(3000)
        ]
    }
    for schema, words in ((huge, "at most 1048576"), (nested, "cannot compile"), (wide, "over lingcode's limits")):
        response = _json_schema_request(client, schema)
        assert response.status_code == 400, response.text[:300]
        error = response.json()["error"]
        assert error["code"] == "invalid_grammar" and words in error["message"], error


def test_a_long_compile_does_not_hold_up_another(engine):
    """Compiles hold no lock: a small grammar compiles while a large one (~0.4 s) still does."""
    info = engine.info
    constraint(info.tokenizer, info.eos_token_ids, "json")  # the tokenizer's view is built once, first
    edit = json.loads((Path(__file__).parent / "data" / "claude_code_tools.json").read_text())["tools"][7]
    tools = [Tool(f"edit{i}", "", edit["function"]["parameters"]) for i in range(1000)]
    done: list[str] = []

    def large() -> None:
        constraint(info.tokenizer, info.eos_token_ids, "lark", tool_call_grammar("hermes", tools, True))
        done.append("large")

    thread = threading.Thread(target=large)
    thread.start()
    time.sleep(0.1)  # the large compile is under way
    constraint(
        info.tokenizer, info.eos_token_ids, "json_schema", {"type": "object", "properties": {"n": {"type": "integer"}}}
    )
    done.append("small")
    thread.join()
    assert done == ["small", "large"]


def test_a_cancelled_compile_is_dropped(engine):
    info = engine.info
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(GrammarCancelled):
        constraint(
            info.tokenizer,
            info.eos_token_ids,
            "json_schema",
            {"type": "object", "properties": {"x": {}}},
            cancel=cancel,
        )


@pytest.mark.parametrize("family", ["hermes", "ling3"])
def test_tool_call_grammars_admit_the_calls_their_parsers_read(engine, family):
    """Each family's grammar, on the default model's tokenizer: a well-formed call passes token by
    token and parses to its arguments; a call of an unknown tool or with a bad value is refused."""
    from lingcode.agent.tool_parsers import make_parser

    tok = engine.info.tokenizer
    weather = Tool(
        "get_weather",
        "",
        {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city"],
        },
    )
    grammar = tool_call_grammar(family, [weather], parallel=False)
    if family == "hermes":
        good = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris </x>", "days": 3}}</tool_call>'
        bad = [
            '<tool_call>{"name": "get_time", ',
            '<tool_call>{"name": "get_weather", "arguments": {"city": "P", "days": "3"',
        ]
    else:
        good = (
            "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris </x></arg_value>\n"
            "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>"
        )
        bad = [
            "<tool_call>get_time\n",
            "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>P</arg_value>\n"
            "<arg_key>days</arg_key>\n<arg_value>three",
        ]
    matcher = constraint(tok, engine.info.eos_token_ids, "lark", grammar)
    for token in tok.encode(good):
        matcher.accept(token)
    assert matcher.is_terminated()
    parser = make_parser(family, [weather])
    (call,) = [e for e in parser.feed(good) + parser.finish() if hasattr(e, "name")]
    assert call.name == "get_weather"
    assert json.loads(parser.calls[0].arguments) == {"city": "Paris </x>", "days": 3}
    for text in bad:
        matcher = constraint(tok, engine.info.eos_token_ids, "lark", grammar)
        with pytest.raises(RuntimeError, match="rejected"):
            for token in tok.encode(text):
                matcher.accept(token)

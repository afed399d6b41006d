"""Token-exact agent sessions (/v1/sessions) against the real daemon, asserted on the engine's counters.

A turn's prompt is the session's history (the exact tokens of earlier prompts and of what the
model generated) plus the tokens of the new messages. The engine has computed keys/values for
all of the history but one token: the last token the model generated, which ended its answer
and was never fed back. So a turn prefills exactly its new messages' tokens plus that one.
"""

from __future__ import annotations

import time

import httpx
import pytest

READ_FILE = {"type": "function", "function": {"name": "read_file", "description": "Read a file of the project",
             "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}  # fmt: skip


@pytest.fixture(scope="module")
def http(daemon) -> httpx.Client:
    with httpx.Client(base_url=daemon.url, headers={"Authorization": f"Bearer {daemon.token}"}, timeout=120) as client:
        yield client


def engine_stats(http) -> dict:
    return http.get("/v1/lingcode/stats").json()["engine"]


def new_session(http, **body) -> dict:
    response = http.post("/v1/sessions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def turn(http, session_id: str, messages: list[dict], **body) -> dict:
    response = http.post(f"/v1/sessions/{session_id}/turns", json={"messages": messages, "temperature": 0, **body})
    assert response.status_code == 200, response.text
    return response.json()


def test_fifty_turn_tool_loop_prefills_only_new_tokens(http):
    session = new_session(http, messages=[{"role": "system", "content": "You are a coding agent. Use tools."}], tools=[READ_FILE])
    reply = turn(http, session["id"], [{"role": "user", "content": "Read main.py"}], max_tokens=24,
                 tool_choice="required", parallel_tool_calls=False)  # fmt: skip
    (call,) = reply["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "read_file"
    history = reply["session"]["history_tokens"]
    restores_before = engine_stats(http)["kv_store"]["restores"]
    for i in range(49):
        if i % 10 == 5:  # something else runs in between (an editor completion): the session's KV must survive it
            http.post("/v1/completions", json={"prompt": f"def unrelated_{i}(x):\n    return x * {i}\n" * 6, "max_tokens": 1})
        result = [{"role": "tool", "tool_call_id": call["id"], "content": f"line {i}: print({i})"}]
        reply = turn(http, session["id"], result, max_tokens=2)
        last = engine_stats(http)["last_request"]
        appended = reply["session"]["appended_tokens"]
        assert reply["usage"]["prompt_tokens"] == history + appended
        # Only the new tokens are prefilled, plus the last turn's final token when the engine had not
        # fed it yet (it was sampled, not fed; with speculation an accepted final draft was fed).
        cached = reply["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached in (history - 1, history), f"turn {i + 2}"
        assert last["prefilled_tokens"] == history + appended - cached <= appended + 1, f"turn {i + 2}"
        history = reply["session"]["history_tokens"]
        assert history == reply["usage"]["prompt_tokens"] + reply["usage"]["completion_tokens"]
    assert reply["session"]["turn"] == 50
    assert engine_stats(http)["kv_store"]["restores"] >= restores_before + 5


def test_streamed_turn_and_history_unchanged_by_a_failed_turn(http):
    session = new_session(http, tools=[READ_FILE])
    with http.stream("POST", f"/v1/sessions/{session['id']}/turns",
                     json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "stream": True}) as response:  # fmt: skip
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" and '"session"' in lines[-2]
    after_first = http.get(f"/v1/sessions/{session['id']}").json()
    assert after_first["turns"] == 1 and after_first["history_tokens"] > 0
    too_long = http.post(f"/v1/sessions/{session['id']}/turns",
                         json={"messages": [{"role": "user", "content": "word " * 9000}], "max_tokens": 1})  # fmt: skip
    assert too_long.status_code == 400 and too_long.json()["error"]["code"] == "context_length_exceeded"
    assert http.get(f"/v1/sessions/{session['id']}").json()["history_tokens"] == after_first["history_tokens"]


def test_list_get_delete_and_expiry(http):
    kept = new_session(http)
    short = new_session(http, idle_timeout_s=0.2)
    ids = {s["id"] for s in http.get("/v1/sessions").json()["data"]}
    assert {kept["id"], short["id"]} <= ids
    time.sleep(0.5)  # longer than the short session's idle timeout
    gone = http.get(f"/v1/sessions/{short['id']}")
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "session_not_found"
    assert http.delete(f"/v1/sessions/{kept['id']}").json() == {"id": kept["id"], "object": "session.deleted", "deleted": True}
    assert http.post(f"/v1/sessions/{kept['id']}/turns", json={"messages": [{"role": "user", "content": "hi"}]}).status_code == 404
    assert http.get("/v1/lingcode/stats").json()["sessions"]["expired"] >= 1


@pytest.mark.parametrize("body", [
    {"messages": [{"role": "user", "content": "hi"}], "tools": [READ_FILE]},  # tools belong to the session
    {"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required"},  # this session has no tools
    {"messages": []},
])  # fmt: skip
def test_bad_turns_are_400s(http, body):
    session = new_session(http)
    response = http.post(f"/v1/sessions/{session['id']}/turns", json=body)
    assert response.status_code == 400 and response.json()["error"]["message"]

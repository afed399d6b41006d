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

READ_FILE = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a file of the project",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    },
}


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
    session = new_session(
        http, messages=[{"role": "system", "content": "You are a coding agent. Use tools."}], tools=[READ_FILE]
    )
    reply = turn(
        http,
        session["id"],
        [{"role": "user", "content": "Read main.py"}],
        max_tokens=24,
        tool_choice="required",
        parallel_tool_calls=False,
    )
    (call,) = reply["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "read_file"
    history = reply["session"]["history_tokens"]
    restores_before = engine_stats(http)["kv_store"]["restores"]
    for i in range(49):
        if i % 10 == 5:  # something else runs in between (an editor completion): the session's KV must survive it
            http.post(
                "/v1/completions", json={"prompt": f"def unrelated_{i}(x):\n    return x * {i}\n" * 6, "max_tokens": 1}
            )
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
    with http.stream(
        "POST",
        f"/v1/sessions/{session['id']}/turns",
        json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "stream": True},
    ) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" and '"session"' in lines[-2]
    after_first = http.get(f"/v1/sessions/{session['id']}").json()
    assert after_first["turns"] == 1 and after_first["history_tokens"] > 0
    too_long = http.post(
        f"/v1/sessions/{session['id']}/turns",
        json={"messages": [{"role": "user", "content": "word " * 9000}], "max_tokens": 1},
    )
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
    assert http.delete(f"/v1/sessions/{kept['id']}").json() == {
        "id": kept["id"],
        "object": "session.deleted",
        "deleted": True,
    }
    assert (
        http.post(
            f"/v1/sessions/{kept['id']}/turns", json={"messages": [{"role": "user", "content": "hi"}]}
        ).status_code
        == 404
    )
    assert http.get("/v1/lingcode/stats").json()["sessions"]["expired"] >= 1


@pytest.mark.parametrize(
    "body",
    [
        {"messages": [{"role": "user", "content": "hi"}], "tools": [READ_FILE]},  # tools belong to the session
        {"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required"},  # this session has no tools
        {"messages": []},
    ],
)
def test_bad_turns_are_400s(http, body):
    session = new_session(http)
    response = http.post(f"/v1/sessions/{session['id']}/turns", json=body)
    assert response.status_code == 400 and response.json()["error"]["message"]


# --- bounds (issue 62, item 5) -------------------------------------------------------------------


def test_a_history_past_the_context_is_refused_when_the_session_is_created(http):
    """A 3 MB history was taken and kept for days, its history_tokens 0. Now it is counted when the
    session is created: past the context it is a 400 in OpenAI's shape, and nothing is kept."""
    open_before = http.get("/v1/lingcode/stats").json()["sessions"]["open"]
    context = http.get("/v1/models").json()["data"][0]["context_length"]
    response = http.post("/v1/sessions", json={"messages": [{"role": "user", "content": "word " * (2 * context)}]})
    error = response.json()["error"]
    assert response.status_code == 400 and error["code"] == "context_length_exceeded" and error["param"] == "messages"
    assert f"maximum context length is {context} tokens" in error["message"]
    assert http.get("/v1/lingcode/stats").json()["sessions"]["open"] == open_before
    kept = new_session(http, messages=[{"role": "user", "content": "word " * 100}])
    assert 100 <= kept["history_tokens"] < context  # what its first turn's prompt will hold


@pytest.fixture(scope="module")
def bounded(model_path, tmp_path_factory):
    """A daemon of its own whose session store keeps at most 3 sessions and 1 MiB of them."""
    from conftest import serve, share_built_caches

    home = share_built_caches(tmp_path_factory.mktemp("bounded-home"))
    daemon = serve(model_path, home, "--max-sessions", "3", "--session-memory", "1")
    with httpx.Client(base_url=daemon.url, headers={"Authorization": f"Bearer {daemon.token}"}, timeout=120) as client:
        yield client
    daemon.process.terminate()
    daemon.process.wait(timeout=30)


def test_the_store_forgets_the_sessions_idle_longest_past_its_count_and_bytes(bounded):
    """The store is bounded by count and by bytes; past either the sessions idle longest are
    forgotten first (a turn makes a session the latest used), and their ids get a 404 that says why."""
    first, second, third = (new_session(bounded) for _ in range(3))
    turn(bounded, first["id"], [{"role": "user", "content": "hi"}], max_tokens=1)  # now the latest used
    fourth = new_session(bounded)  # one too many: the one idle longest goes, which is the second
    gone = bounded.get(f"/v1/sessions/{second['id']}")
    assert gone.status_code == 404 and "at most 3 sessions and 1 MiB" in gone.json()["error"]["message"]
    assert {s["id"] for s in bounded.get("/v1/sessions").json()["data"]} == {first["id"], third["id"], fourth["id"]}
    for session in (first, third, fourth):
        bounded.delete(f"/v1/sessions/{session['id']}")
    # by bytes: 400 KB of history each (it fits the context: "#" * 80 is one token), the third is past 1 MiB
    big = [new_session(bounded, messages=[{"role": "user", "content": "#" * 400_000}]) for _ in range(3)]
    assert {s["id"] for s in bounded.get("/v1/sessions").json()["data"]} == {big[1]["id"], big[2]["id"]}
    stats = bounded.get("/v1/lingcode/stats").json()["sessions"]
    assert stats["evicted"] == 2 and stats["bytes"] <= stats["max_bytes"] == 2**20 and stats["max_sessions"] == 3
    reply = turn(bounded, big[2]["id"], [{"role": "user", "content": "hi"}], max_tokens=1)  # a kept one still works
    assert reply["session"]["turn"] == 1

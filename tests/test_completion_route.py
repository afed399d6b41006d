"""POST /v1/lingcode/complete on a real daemon: prompts, cuts, prefix reuse, latest wins, completions first.

Assertions are on outputs and on the daemon's counters (GET /v1/lingcode/stats), never on wall time.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from lingcode.completion.prompt import CompletionInput, build_prompt

ROUTE = "/v1/lingcode/complete"
PYTHON = 'def greet(name):\n    """Say hello."""\n    return "Hello, " + name\n\n\ndef main():\n    print(greet('
# A list the model keeps extending one line at a time: a completion that runs as long as we let it.
COUNTING = {
    "prefix": "NUMBERS = [\n    1,\n    2,\n    3,\n    ",
    "path": "numbers.py",
    "multiline": True,
    "max_tokens": 200,
    "time_budget_ms": None,
}


@pytest.fixture
async def api(daemon):
    headers = {"Authorization": f"Bearer {daemon.token}"}
    async with httpx.AsyncClient(base_url=daemon.url, headers=headers, timeout=120) as client:
        yield client


async def stats(api) -> dict:
    response = await api.get("/v1/lingcode/stats")
    assert response.status_code == 200
    return response.json()


async def wait_idle(api, timeout_s: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        now = await stats(api)
        if now["engine"]["running"] is None and now["scheduler"]["running"] is None and not now["scheduler"]["queued"]:
            return now
        assert time.monotonic() < deadline, f"the engine is still busy: {now}"
        await asyncio.sleep(0.02)


async def wait_running(api, what: str, timeout_s: float = 60.0) -> dict:
    """Stats once the engine runs a request (and has generated a token) — a bound, not a timing assertion."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = await stats(api)
        if now["engine"]["running"] is not None and (what == "any" or now["engine"]["running"].startswith(what)):
            return now
        assert time.monotonic() < deadline, f"nothing started running: {now}"
        await asyncio.sleep(0.01)


async def test_a_completion_comes_back_with_its_prompt_and_figures(api, engine):
    await wait_idle(api)
    body = {"prefix": PYTHON, "suffix": ")\n", "path": "hello.py", "repo": "demo", "max_tokens": 16}
    response = await api.post(ROUTE, json=body)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["object"] == "lingcode.completion" and "\n" not in answer["text"]  # mid-line: one line
    assert answer["finish_reason"] in ("stop", "length")
    assert answer["prompt"]["family"] == "smollm2" and answer["prompt"]["fim"] is False
    expected = build_prompt(engine.info, CompletionInput(prefix=PYTHON, suffix=")\n", path="hello.py", repo="demo"))
    assert answer["usage"]["prompt_tokens"] == len(expected.input_ids)
    assert answer["timings"]["ttft_ms"] is not None and answer["timings"]["total_ms"] > 0
    assert (await stats(api))["completions"]["requests"] >= 1
    # One line: the engine itself ended at the token holding the newline, and ran no step past it.
    assert answer["cut"] == "newline", answer
    last = (await wait_idle(api))["engine"]["last_request"]
    assert last["finish_reason"] == "stop" and last["steps_after_abort"] == 0
    assert last["generated_tokens"] == answer["usage"]["completion_tokens"]


async def test_typing_one_character_prefills_only_the_tail(api):
    body = {"prefix": PYTHON, "path": "hello.py", "max_tokens": 4, "multiline": False}
    first = (await api.post(ROUTE, json=body)).json()
    second = (await api.post(ROUTE, json={**body, "prefix": PYTHON + "n"})).json()
    usage = second["usage"]
    assert usage["prompt_tokens"] >= first["usage"]["prompt_tokens"]
    assert usage["prompt_tokens"] - usage["prompt_tokens_details"]["cached_tokens"] <= 3
    last = (await wait_idle(api))["engine"]["last_request"]
    assert last["prefilled_tokens"] <= 3 and last["prompt_tokens"] == usage["prompt_tokens"]


async def test_streamed_text_then_the_figures_then_done(api):
    body = {"prefix": PYTHON, "suffix": ")\n", "path": "hello.py", "max_tokens": 8, "stream": True}
    events = []
    async with api.stream("POST", ROUTE, json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data:"):
                events.append(line[5:].strip())
    assert events[-1] == "[DONE]"
    final = json.loads(events[-2])
    assert final["finish_reason"] in ("stop", "length") and final["usage"]["completion_tokens"] >= 1
    assert all("text" in json.loads(e) for e in events[:-2])


@pytest.mark.parametrize(
    "body, param",
    [
        ({"suffix": "x"}, "prefix"),
        ({"prefix": 3}, "prefix"),
        ({"prefix": "x", "max_tokens": 0}, "max_tokens"),
        ({"prefix": "x", "context": [{"path": "a"}]}, "context[0].text"),
        ({"prefix": "x", "budgets": {"prefix_tokens": -1}}, "budgets.prefix_tokens"),
    ],
)
async def test_bad_requests_are_400s_that_name_the_field(api, body, param):
    response = await api.post(ROUTE, json=body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param


async def test_a_prompt_over_the_context_is_a_400_not_a_truncation(api):
    body = {"prefix": "x = 1\n" * 3000, "budgets": {"prefix_tokens": 9000}, "max_tokens": 8}
    response = await api.post(ROUTE, json=body)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "context_length_exceeded"


async def test_a_new_completion_for_the_same_document_cancels_the_running_one(api):
    before = await wait_idle(api)
    first = asyncio.create_task(api.post(ROUTE, json={**COUNTING, "document": "file:///numbers.py"}))
    await wait_running(api, "lccmpl-")
    second = await api.post(ROUTE, json={**COUNTING, "max_tokens": 2, "document": "file:///numbers.py"})
    first = (await first).json()
    assert first["finish_reason"] == "abort" and first["usage"]["completion_tokens"] < 200
    assert second.json()["finish_reason"] in ("stop", "length")
    after = await wait_idle(api)
    assert after["scheduler"]["superseded"] == before["scheduler"]["superseded"] + 1


async def test_a_completion_goes_before_a_running_chat_which_then_finishes(api):
    before = await wait_idle(api)
    chat_body = {
        "messages": [{"role": "user", "content": "Tell me a story."}],
        "max_tokens": 24,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    order: list[str] = []

    async def chat() -> dict:
        async with api.stream("POST", "/v1/chat/completions", json=chat_body) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: {"):
                    event = json.loads(line[6:])
                    if event.get("usage"):
                        order.append("chat done")
                        return event["usage"]

    chat_task = asyncio.create_task(chat())
    await wait_running(api, "chatcmpl-")
    completion = (await api.post(ROUTE, json={"prefix": PYTHON, "path": "hello.py", "max_tokens": 4})).json()
    order.append("completion done")
    usage = await chat_task
    assert completion["finish_reason"] in ("stop", "length")
    assert order == ["completion done", "chat done"]
    assert usage["completion_tokens"] == 24  # the chat lost nothing to the preemption
    after = await wait_idle(api)
    assert after["scheduler"]["preempted"] == before["scheduler"]["preempted"] + 1
    assert after["scheduler"]["resumed"] == before["scheduler"]["resumed"] + 1


@pytest.mark.parametrize(
    ("prefix", "suffix", "path"),
    [
        ("def reverse(s):\n    ", "\n", "strings.py"),
        ("class Text:\n    def reverse(self, s):\n        ", "\n", "strings.py"),
        ('def reverse(s):\n    """Reverse a string."""\n    ', "\n", "strings.py"),
        ("function add(a, b) {\n  ", "\n}\n", "math.js"),
        ("int add(int a, int b) {\n    ", "\n}\n", "math.c"),
        ("func add(a, b int) int {\n\t", "\n}\n", "math.go"),
    ],
)
async def test_a_suggestion_after_indentation_does_not_indent_again(api, prefix, suffix, path):
    """The issue's case: after 4 spaces the model said " return s[::-1]", one space too many (its
    tokens put a run of spaces before a word: the prompt ended inside one)."""
    body = {"prefix": prefix, "suffix": suffix, "path": path, "max_tokens": 24, "time_budget_ms": None}
    response = await api.post(ROUTE, json=body)
    assert response.status_code == 200, response.text
    text = response.json()["text"]
    assert text and not text[0].isspace(), text
    if path == "strings.py" and "class" not in prefix:
        assert text.startswith("return s[::-1]"), text

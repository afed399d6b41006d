"""Anthropic Messages (/v1/messages) with the official anthropic client, against the real daemon.

The newest anthropic SDK no longer sends sampling knobs, so greedy decoding goes as extra_body.
Tool calls are forced with tool_choice {"type": "any"} or {"type": "tool"} (constrained decoding).
"""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest

GREEDY = {"extra_body": {"temperature": 0}}
WEATHER = {
    "name": "get_weather",
    "description": "Get the current weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
ANY_ONE = {"type": "any", "disable_parallel_tool_use": True}


@pytest.fixture(scope="module")
def client(daemon) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=daemon.url, api_key=daemon.token, max_retries=0, timeout=120)


def sse_events(response: httpx.Response) -> list[tuple[str, dict]]:
    events, name = [], None
    for line in response.iter_lines():
        if line.startswith("event: "):
            name = line[len("event: ") :]
        elif line.startswith("data: "):
            events.append((name, json.loads(line[len("data: ") :])))
    return events


def test_text_answer_with_usage(client, daemon):
    reply = client.messages.create(
        model="claude-whatever-4",
        max_tokens=12,
        messages=QUESTION,
        system="You answer in one short sentence.",
        **GREEDY,
    )
    assert reply.model == "claude-whatever-4"  # any model id is accepted and echoed
    assert reply.role == "assistant" and reply.content[0].type == "text" and reply.content[0].text
    assert reply.stop_reason in ("end_turn", "max_tokens")
    assert reply.usage.output_tokens <= 12
    again = client.messages.create(
        model="other", max_tokens=1, messages=QUESTION, system="You answer in one short sentence.", **GREEDY
    )
    # the same prompt again: all but the last token come from the KV cache
    assert again.usage.cache_read_input_tokens == again.usage.input_tokens + again.usage.cache_read_input_tokens - 1
    assert again.usage.input_tokens == 1


def test_forced_tool_use_and_tool_result_round_trip(client):
    reply = client.messages.create(
        model="m", max_tokens=32, messages=QUESTION, tools=[WEATHER], tool_choice=ANY_ONE, **GREEDY
    )
    assert reply.stop_reason == "tool_use"
    (use,) = [b for b in reply.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.id.startswith("toolu_") and isinstance(use.input["city"], str)
    follow_up = QUESTION + [
        {"role": "assistant", "content": reply.content},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 21 C"},
                {"type": "text", "text": "Summarize that for me."},
            ],
        },
    ]
    answer = client.messages.create(model="m", max_tokens=16, messages=follow_up, tools=[WEATHER], **GREEDY)
    assert answer.content and answer.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert answer.usage.cache_read_input_tokens > 0  # the conversation so far was reused


def test_named_tool_choice(client):
    read = {
        "name": "read_file",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    }
    reply = client.messages.create(
        model="m",
        max_tokens=32,
        messages=QUESTION,
        tools=[WEATHER, read],
        tool_choice={"type": "tool", "name": "read_file", "disable_parallel_tool_use": True},
        **GREEDY,
    )
    assert [b.name for b in reply.content if b.type == "tool_use"] == ["read_file"]


def test_streamed_events_in_documented_order(daemon):
    body = {
        "model": "m",
        "max_tokens": 32,
        "messages": QUESTION,
        "tools": [WEATHER],
        "tool_choice": ANY_ONE,
        "stream": True,
        "temperature": 0,
    }
    headers = {"x-api-key": daemon.token, "anthropic-version": "2023-06-01", "anthropic-beta": "tools-2024-04-04"}
    with httpx.stream(
        "POST", f"{daemon.url}/v1/messages?beta=true", json=body, headers=headers, timeout=120
    ) as response:
        assert response.status_code == 200
        events = sse_events(response)
    names = [name for name, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert all(name == data["type"] for name, data in events)
    blocks = [data for name, data in events if name == "content_block_start"]
    assert blocks[0]["content_block"]["type"] == "tool_use" and blocks[0]["content_block"]["name"] == "get_weather"
    deltas = [data["delta"] for name, data in events if name == "content_block_delta"]
    assert deltas and all(d["type"] == "input_json_delta" for d in deltas)
    assert isinstance(json.loads("".join(d["partial_json"] for d in deltas))["city"], str)
    start, stop = names.index("content_block_start"), names.index("content_block_stop")
    assert start < min(i for i, n in enumerate(names) if n == "content_block_delta") and stop < names.index(
        "message_delta"
    )
    message_delta = events[-2][1]
    assert message_delta["delta"]["stop_reason"] == "tool_use" and message_delta["usage"]["output_tokens"] > 0


def test_stream_with_the_sdk_and_stop_sequences(client):
    with client.messages.stream(
        model="m", max_tokens=32, messages=QUESTION, stop_sequences=["zzz", " "], **GREEDY
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == " "
    assert text and " " not in text and final.content[0].text == text


def test_count_tokens(client):
    counted = client.messages.count_tokens(model="m", messages=QUESTION, tools=[WEATHER])
    reply = client.messages.create(model="m", max_tokens=1, messages=QUESTION, tools=[WEATHER], **GREEDY)
    assert counted.input_tokens == reply.usage.input_tokens + reply.usage.cache_read_input_tokens


def test_system_messages_among_the_turns(daemon):
    """Claude Code sends a "system" message after the user's (not in Anthropic's older docs)."""
    body = {
        "model": "m",
        "max_tokens": 4,
        "temperature": 0,
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Say hello."}]},
            {"role": "system", "content": "Be brief."},
        ],
    }
    response = httpx.post(f"{daemon.url}/v1/messages", headers={"x-api-key": daemon.token}, json=body, timeout=120)
    assert response.status_code == 200, response.text
    assert response.json()["content"][0]["type"] == "text"


def test_head_root_and_errors_in_anthropic_shape(daemon):
    assert httpx.head(daemon.url + "/").status_code == 200
    unauthorized = httpx.post(f"{daemon.url}/v1/messages", json={})
    assert unauthorized.status_code == 401
    assert unauthorized.json()["type"] == "error" and unauthorized.json()["error"]["type"] == "authentication_error"
    bad = httpx.post(
        f"{daemon.url}/v1/messages?beta=true",
        headers={"x-api-key": daemon.token},
        json={"model": "m", "messages": QUESTION},
    )  # no max_tokens
    assert bad.status_code == 400
    assert bad.json() == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "max_tokens: this field is required"},
    }
    image = {
        "model": "m",
        "max_tokens": 4,
        "messages": [
            {
                "role": "user",
                "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}],
            }
        ],
    }
    rejected = httpx.post(f"{daemon.url}/v1/messages", headers={"x-api-key": daemon.token}, json=image)
    assert rejected.status_code == 400 and "image" in rejected.json()["error"]["message"]


def test_anthropic_sdk_raises_on_errors(client):
    with pytest.raises(anthropic.BadRequestError) as error:
        client.messages.create(
            model="m", max_tokens=4, messages=QUESTION, tools=[WEATHER], tool_choice={"type": "tool", "name": "nope"}
        )
    assert "nope" in str(error.value)


def test_a_tool_use_cut_by_max_tokens_leaks_no_markup(client):
    """Issue 18.11, Anthropic's side: no text block holding `<tool_call>{"name": "get_` ."""
    for max_tokens in (4, 8, 12):
        reply = client.messages.create(
            model="m", max_tokens=max_tokens, messages=QUESTION, tools=[WEATHER], tool_choice={"type": "any"}, **GREEDY
        )
        assert reply.stop_reason == "max_tokens"
        texts = [block.text for block in reply.content if block.type == "text"]
        assert not any("<tool_call>" in text for text in texts), (max_tokens, texts)


def test_message_start_carries_the_input_tokens(daemon):
    """Issue 18.12: clients read usage.input_tokens from message_start; it was always 0. It goes
    out before the engine has looked at its cache (issue 62.8): the whole prompt is its input
    tokens, and message_delta, which the SDKs read last, has the split."""
    body = {"model": "m", "max_tokens": 3, "messages": QUESTION, "stream": True, "temperature": 0}
    headers = {"x-api-key": daemon.token, "anthropic-version": "2023-06-01"}
    for _ in range(2):  # the second time the prompt comes from the KV cache
        with httpx.stream("POST", f"{daemon.url}/v1/messages", json=body, headers=headers, timeout=120) as response:
            events = sse_events(response)
        start = events[0][1]["message"]["usage"]
        end = next(data for name, data in events if name == "message_delta")["usage"]
        assert start["input_tokens"] > 0
        assert (
            start["input_tokens"] + start["cache_read_input_tokens"]
            == end["input_tokens"] + end["cache_read_input_tokens"]
        )
    assert end["cache_read_input_tokens"] > 0  # the second time

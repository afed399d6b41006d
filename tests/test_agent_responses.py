"""OpenAI Responses (/v1/responses) with the official openai client, against the real daemon."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.fixture(scope="module")
def client(daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=daemon.url + "/v1", api_key=daemon.token, max_retries=0, timeout=120)


def test_text_response(client):
    response = client.responses.create(
        model="codex-model", input="Say hello.", instructions="Be brief.", max_output_tokens=8, temperature=0
    )
    assert response.object == "response" and response.status in ("completed", "incomplete")
    assert response.output[0].type == "message" and response.output_text
    assert response.usage.output_tokens <= 8 and response.usage.input_tokens > 0


def test_function_call_and_output_round_trip(client):
    first = client.responses.create(
        model="m",
        input="What is the weather in Paris?",
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=32,
        temperature=0,
    )
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and isinstance(json.loads(call.arguments)["city"], str)
    assert call.call_id.startswith("call_") and first.status == "completed"
    history = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C"},
    ]
    second = client.responses.create(model="m", input=history, tools=[WEATHER], max_output_tokens=12, temperature=0)
    assert second.output and second.usage.input_tokens_details.cached_tokens > 0


def test_streamed_events_in_order(client):
    stream = client.responses.create(
        model="m",
        input="What is the weather in Paris?",
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        parallel_tool_calls=False,
        max_output_tokens=32,
        temperature=0,
        stream=True,
    )
    events = list(stream)
    types = [e.type for e in events]
    assert types[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert types[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert deltas and done[0].arguments == "".join(deltas)
    assert types.index("response.function_call_arguments.done") < types.index("response.output_item.done")
    final = events[-1].response
    assert final.output[0].type == "function_call" and final.output[0].arguments == done[0].arguments


def test_streamed_text_events(client):
    events = list(
        client.responses.create(model="m", input="Say hello.", max_output_tokens=6, temperature=0, stream=True)
    )
    types = [e.type for e in events]
    expected_order = [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    positions = [types.index(t) for t in expected_order]
    assert positions == sorted(positions)
    assert types[-1] in ("response.completed", "response.incomplete")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert events[-1].response.output[0].content[0].text == text


@pytest.mark.parametrize(
    "body",
    [
        {"input": "hi", "previous_response_id": "resp_123"},
        {"input": "hi", "tools": [{"type": "custom", "name": "apply_patch"}]},
        {"input": [{"type": "input_image", "image_url": "x"}]},
    ],
)
def test_unsupported_input_is_a_400(daemon, body):
    response = httpx.post(f"{daemon.url}/v1/responses", headers={"Authorization": f"Bearer {daemon.token}"}, json=body)
    assert response.status_code == 400 and response.json()["error"]["type"] == "invalid_request_error"


def test_codex_style_tools_namespaces_and_hosted_tools(client):
    """Codex CLI sends function tools, a namespace of function tools, and hosted tools (web_search)."""
    spawn = {
        "type": "function",
        "name": "spawn_agent",
        "description": "Spawn a sub-agent",
        "parameters": {"type": "object", "properties": {"task": {"type": "string"}}, "required": ["task"]},
    }
    tools = [
        WEATHER,
        {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents", "tools": [spawn]},
        {"type": "web_search", "external_web_access": False},
    ]
    response = client.responses.create(
        model="m",
        input=[{"role": "developer", "content": "Delegate."}, {"role": "user", "content": "Find the bug."}],
        tools=tools,
        tool_choice={"type": "function", "name": "spawn_agent"},
        parallel_tool_calls=False,
        max_output_tokens=32,
        temperature=0,
    )
    (call,) = [item for item in response.output if item.type == "function_call"]
    assert call.name == "spawn_agent" and call.namespace == "multi_agent_v1"
    assert isinstance(json.loads(call.arguments)["task"], str)

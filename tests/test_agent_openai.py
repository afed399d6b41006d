"""Tool calling on /v1/chat/completions with the official openai client, against the real daemon.

The default model (SmolLM2-135M) rarely calls tools by itself, so the tests that need a call force
one with tool_choice (required or named), which constrains decoding with llguidance: the arguments
must then validate against the tool's schema even from a 135M model.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest

GREEDY = {"temperature": 0}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                           "days": {"type": "integer", "minimum": 1, "maximum": 7}},
            "required": ["city", "unit", "days"],
            "additionalProperties": False,
        },
    },
}  # fmt: skip
READ_FILE = {
    "type": "function",
    "function": {"name": "read_file", "description": "Read a file of the project",
                 "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}},
}  # fmt: skip
QUESTION = [{"role": "user", "content": "What will the weather be in Paris for the next 3 days?"}]


@pytest.fixture(scope="module")
def client(daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=daemon.url + "/v1", api_key=daemon.token, max_retries=0, timeout=120)


def valid_weather_args(arguments: str) -> dict:
    """The schema of WEATHER, checked by hand: exact keys, types, enum and range."""
    args = json.loads(arguments)
    assert set(args) == {"city", "unit", "days"}
    assert isinstance(args["city"], str) and args["unit"] in ("celsius", "fahrenheit")
    assert isinstance(args["days"], int) and 1 <= args["days"] <= 7
    return args


def test_required_tool_choice_gives_a_schema_valid_call(client):
    reply = client.chat.completions.create(
        model="any",
        messages=QUESTION,
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=48,
        **GREEDY,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == "get_weather"
    valid_weather_args(call.function.arguments)


def test_named_tool_choice_calls_that_tool(client):
    reply = client.chat.completions.create(
        model="any",
        messages=QUESTION,
        tools=[WEATHER, READ_FILE],
        max_tokens=32,
        parallel_tool_calls=False,
        tool_choice={"type": "function", "function": {"name": "read_file"}},
        **GREEDY,
    )
    (call,) = reply.choices[0].message.tool_calls
    assert call.function.name == "read_file"
    assert isinstance(json.loads(call.function.arguments)["path"], str)


def test_streamed_tool_call_fragments(client):
    stream = client.chat.completions.create(
        model="any",
        messages=QUESTION,
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=48,
        stream=True,
        **GREEDY,
    )
    chunks = [c for c in stream if c.choices]
    fragments = [c.choices[0].delta.tool_calls[0] for c in chunks if c.choices[0].delta.tool_calls]
    first, rest = fragments[0], fragments[1:]
    assert first.index == 0 and first.id.startswith("call_") and first.function.name == "get_weather"
    assert first.function.arguments == ""
    # How many fragments the arguments take depends on how many engine steps the daemon merged while
    # the client read (merge_chunks); that they stream before the call closes is test_tool_parsers'.
    assert rest, "the arguments follow the name"
    assert all(f.index == 0 and f.id is None and f.function.name is None for f in rest)
    valid_weather_args("".join(f.function.arguments for f in rest))
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["tool_calls"]


def test_parallel_calls_have_their_own_index_and_id(client):
    messages = [{"role": "user", "content": "Read the file main.py and tell me the weather in Rome."}]
    reply = client.chat.completions.create(
        model="any", messages=messages, tools=[WEATHER, READ_FILE], tool_choice="required", max_tokens=64, **GREEDY
    )
    calls = reply.choices[0].message.tool_calls
    assert len(calls) >= 2
    assert len({c.id for c in calls}) == len(calls)
    complete = calls if reply.choices[0].finish_reason == "tool_calls" else calls[:-1]  # the last may be cut off
    for call in complete:
        args = json.loads(call.function.arguments)
        if call.function.name == "get_weather":
            valid_weather_args(call.function.arguments)
        else:
            assert call.function.name == "read_file" and isinstance(args["path"], str)


def test_tool_results_go_back_to_the_model(client):
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris", "unit": "celsius", "days": 3})},
    }
    messages = QUESTION + [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 degrees, all three days."},
    ]
    reply = client.chat.completions.create(model="any", messages=messages, tools=[WEATHER], max_tokens=24, **GREEDY)
    assert reply.choices[0].message.content
    assert reply.usage.prompt_tokens > 150  # the tools' system block, the call and its result are in the prompt


def test_tool_choice_none_leaves_text_alone(client):
    reply = client.chat.completions.create(
        model="any", messages=QUESTION, tools=[WEATHER], tool_choice="none", max_tokens=8, **GREEDY
    )
    assert reply.choices[0].message.tool_calls is None and reply.choices[0].finish_reason in ("stop", "length")


def test_json_schema_response_format(client):
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    reply = client.chat.completions.create(
        model="any",
        messages=[{"role": "user", "content": "Describe a person as JSON."}],
        max_tokens=40,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}},
        **GREEDY,
    )
    assert reply.choices[0].finish_reason == "stop", repr(reply.choices[0].message.content)
    person = json.loads(reply.choices[0].message.content)
    assert set(person) == {"name", "age"} and isinstance(person["name"], str) and isinstance(person["age"], int)
    assert len(person["name"]) <= 24  # the 135M model loops inside an unbounded string (seen: "Sakura-Sakura-...")


def test_cached_tokens_reported_on_a_repeated_prefix(client):
    first = client.chat.completions.create(model="any", messages=QUESTION, tools=[WEATHER], max_tokens=1, **GREEDY)
    again = client.chat.completions.create(model="any", messages=QUESTION, tools=[WEATHER], max_tokens=1, **GREEDY)
    assert again.usage.prompt_tokens == first.usage.prompt_tokens
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1


@pytest.mark.parametrize(
    "body,param",
    [
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools[0].function.name"),
        ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
    ],
)
def test_bad_tool_requests_are_400s(daemon, body, param):
    response = httpx.post(
        f"{daemon.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {daemon.token}"},
        json={"messages": QUESTION, "max_tokens": 1, **body},
        timeout=60,
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    assert (error["param"] or error["message"]).startswith(param.split("[")[0])


def test_a_call_cut_by_max_tokens_leaks_no_markup(client):
    """Issue 18.11: the tool-call markup of a call that max_tokens cut is never text."""
    for max_tokens in range(1, 9):
        reply = client.chat.completions.create(
            model="any",
            messages=[{"role": "user", "content": "Weather in Paris?"}],
            tools=[WEATHER],
            tool_choice="required",
            max_tokens=max_tokens,
            **GREEDY,
        )
        choice = reply.choices[0]
        assert choice.finish_reason == "length"
        assert "<tool_call>" not in (choice.message.content or ""), (max_tokens, choice.message.content)


def test_a_forced_call_is_not_repeated(client):
    """Issue 18.13: asked to call a tool, the small model writes the same calls again and again (on
    the native CPU step it cycles through celsius and fahrenheit); a call that repeats an earlier
    one exactly is dropped and ends the turn, with its usage."""
    reply = client.chat.completions.create(
        model="any",
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER],
        tool_choice="required",
        max_tokens=256,
        **GREEDY,
    )
    calls = [(c.function.name, c.function.arguments) for c in reply.choices[0].message.tool_calls]
    assert calls and len(set(calls)) == len(calls), calls
    assert reply.choices[0].finish_reason == "tool_calls"
    assert 0 < reply.usage.completion_tokens < 256

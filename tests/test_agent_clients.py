"""The requests real agents send, replayed with the official clients against the real daemon.

Each shape was captured from the agent itself, run against the daemon as the README configures it
(bench/results/agent-clients-2026-11-29.md): opencode 1.18.33 (Vercel AI SDK, openai-compatible),
aider 0.86.2 (litellm) and Claude Code 2.1.197 (Anthropic Messages). The agents also read the
daemon's context-overflow errors to react (compact, retry with a smaller max_tokens), so those
messages are checked against the patterns the agents match.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import anthropic
import openai
import pytest

OPENCODE_TOOLS = json.loads((Path(__file__).parent / "data" / "opencode_tools.json").read_text())["tools"]
OPENCODE_SYSTEM = (
    "You are a coding agent. To see a file, call the read tool. To change a file, call the edit tool.\n"
    "<env>\n  Working directory: /tmp/project\n  Platform: linux\n</env>"
)
# opencode sends the prompt in quotes, and an attached file (-f) as text parts of the user message.
OPENCODE_USER = {"role": "user", "content": [
    {"type": "text", "text": 'Called the Read tool with the following input: {"filePath":"/tmp/project/hello.py"}'},
    {"type": "text", "text": "<path>/tmp/project/hello.py</path>\n<content>\n1: def greet(name):\n</content>"},
    {"type": "text", "text": '"What does this file do?"'}]}  # fmt: skip
# What opencode (and litellm) match to recognize an overflow; opencode then compacts the conversation.
OPENCODE_OVERFLOW = [r"maximum context length is \d+ tokens", r"reduce the length of the messages"]
# Claude Code 2.1.197: the first makes it retry with a max_tokens that fits, the second compact.
CLAUDE_MAX_TOKENS_OVERFLOW = r"input length and `max_tokens` exceed context limit: (\d+) \+ (\d+) > (\d+)"
CLAUDE_PROMPT_TOO_LONG = r"prompt is too long[^0-9]*(\d+)\s*tokens?\s*>\s*(\d+)"
CONTEXT = 8192
TOO_LONG = "lorem ipsum " * 2000  # 10K tokens
NEARLY_FULL = "lorem ipsum " * 1400  # 7K tokens: no room left for 2048 more


@pytest.fixture(scope="module")
def client(daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=daemon.url + "/v1", api_key=daemon.token, max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def claude(daemon) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=daemon.url, api_key=daemon.token, max_retries=0, timeout=120)


def opencode_turn(client: openai.OpenAI, messages: list[dict], **fields) -> tuple[list, object]:
    """One opencode request: streamed with usage, max_tokens from the model's limit, tools, tool_choice auto."""
    stream = client.chat.completions.create(
        model="smollm2-135m-instruct",
        messages=[{"role": "system", "content": OPENCODE_SYSTEM}, *messages],
        tools=OPENCODE_TOOLS,
        stream=True,
        stream_options={"include_usage": True},
        temperature=0,
        **fields,
    )
    chunks = list(stream)
    return [c for c in chunks if c.choices], chunks[-1].usage


def test_opencode_tool_loop(client):
    # The 135M model does not call tools on its own, so the first turn forces one: the
    # constraint also compiles opencode's schemas ($schema 2020-12, +-2**53 integer bounds).
    chunks, usage = opencode_turn(
        client, [OPENCODE_USER], max_tokens=64, tool_choice="required", parallel_tool_calls=False
    )
    assert chunks[-1].choices[0].finish_reason == "tool_calls" and usage.prompt_tokens > 1000
    start = next(c.choices[0].delta.tool_calls[0] for c in chunks if c.choices[0].delta.tool_calls)
    arguments = "".join(
        c.choices[0].delta.tool_calls[0].function.arguments or "" for c in chunks if c.choices[0].delta.tool_calls
    )
    json.loads(arguments)
    # opencode's next request: the call as an assistant message with empty content, then its result.
    call = {"id": start.id, "type": "function", "function": {"name": start.function.name, "arguments": arguments}}
    follow_up = [
        OPENCODE_USER,
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": start.id, "content": "<path>/tmp/project/hello.py</path>\n<type>file</type>"},
    ]
    chunks, usage = opencode_turn(client, follow_up, max_tokens=8, tool_choice="auto")
    assert chunks[-1].choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert usage.prompt_tokens_details.cached_tokens > 1000  # the first turn's prompt was reused


@pytest.mark.parametrize("system,max_tokens,param", [(NEARLY_FULL, 2048, "max_tokens"), (TOO_LONG, None, "messages")])
def test_opencode_sees_an_overflow_it_recognizes(client, system, max_tokens, param):
    # opencode's own prompt and ten tool schemas take ~7.7K tokens; with its max_tokens of 2048 even
    # the first request does not fit 8K. Nothing is truncated: a 400 opencode shows and compacts on.
    fields = {} if max_tokens is None else {"max_tokens": max_tokens}
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="smollm2-135m-instruct",
            stream=True,
            stream_options={"include_usage": True},
            messages=[{"role": "system", "content": system}, OPENCODE_USER],
            **fields,
        )
    error = caught.value
    assert error.code == "context_length_exceeded" and error.param == param
    assert all(re.search(pattern, error.message, re.I) for pattern in OPENCODE_OVERFLOW), error.message


AIDER_MESSAGES = [
    {"role": "system", "content": "Act as an expert software developer.\nTake requests for changes to the supplied code."},
    {"role": "user", "content": "Change the greeting to be more casual"},
    {"role": "assistant", "content": "Ok, I will:\n\nshow_greeting.py\n```\ndef greeting(name):\n    print(f\"Hey {name}\")\n```\n"},
    {"role": "user", "content": "I switched to a new code base. Please don't consider the above files or try to edit them any longer."},
    {"role": "assistant", "content": "Ok."},
    {"role": "user", "content": "I have *added these files to the chat* so you can go ahead and edit them.\n\nhello.py\n```\ndef greet(name):\n    return \"Hello \" + name\n```\n"},
    {"role": "assistant", "content": "Ok, any changes I propose will be to those files."},
    {"role": "user", "content": "Add a docstring to greet\n\nTo suggest changes to a file you MUST return the entire content of the updated file."},
]  # fmt: skip


def test_aider_streams_without_max_tokens(client):
    # aider (through litellm) streams with temperature 0, no max_tokens and no stream_options: the
    # answer may run to the end of the context, so the test reads the first text and leaves.
    with client.chat.completions.create(
        model="smollm2-135m-instruct", messages=AIDER_MESSAGES, stream=True, temperature=0
    ) as stream:
        text = next(c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content)
    assert text


def test_aider_commit_message_request(client):
    # --no-stream, and a weak-model request (commit message) with extra_params' max_tokens.
    reply = client.chat.completions.create(
        model="smollm2-135m-instruct",
        temperature=0,
        max_tokens=16,
        messages=[
            {
                "role": "system",
                "content": "You are an expert software engineer that generates concise, one-line Git commit messages.",
            },
            {"role": "user", "content": "diff --git a/hello.py b/hello.py\n+# says hello\n def greet(name):"},
        ],
    )
    assert reply.choices[0].message.content and reply.usage.completion_tokens <= 16


def test_aider_sees_a_context_window_error(client):
    with pytest.raises(openai.BadRequestError) as caught:  # litellm turns it into ContextWindowExceededError
        client.chat.completions.create(
            model="smollm2-135m-instruct",
            temperature=0,
            messages=[*AIDER_MESSAGES[:-1], {"role": "user", "content": TOO_LONG}],
        )
    assert caught.value.code == "context_length_exceeded" and "maximum context length" in caught.value.message


def test_claude_code_retries_with_a_max_tokens_that_fits(claude):
    # Claude Code sends max_tokens 32000; on Anthropic's own wording of the overflow it retries
    # with contextLimit - inputTokens - 1000, which must then be accepted.
    messages = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "What does hello.py do?", "cache_control": {"type": "ephemeral"}}],
        }
    ]
    system = [{"type": "text", "text": "You are a coding assistant.", "cache_control": {"type": "ephemeral"}}]
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.create(model="smollm2-135m-instruct", max_tokens=32000, system=system, messages=messages)
    match = re.search(CLAUDE_MAX_TOKENS_OVERFLOW, caught.value.message)
    assert match, caught.value.message
    input_tokens, max_tokens, limit = map(int, match.groups())
    counted = claude.messages.count_tokens(model="m", system=system, messages=messages).input_tokens
    assert (input_tokens, max_tokens, limit) == (counted, 32000, CONTEXT)
    # The retry is accepted (an error would raise here); its first event is enough.
    with claude.messages.create(
        model="m", max_tokens=limit - input_tokens - 1000, system=system, messages=messages, stream=True
    ) as retried:
        assert next(iter(retried)).type == "message_start"


def test_claude_code_sees_prompt_is_too_long(claude):
    # Claude Code's own prompt and tools take ~23K tokens; it reports how much of that is its own.
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.create(
            model="m", max_tokens=1024, system=TOO_LONG, messages=[{"role": "user", "content": "hi"}]
        )
    match = re.search(CLAUDE_PROMPT_TOO_LONG, caught.value.message, re.I)
    assert match, caught.value.message
    actual, limit = map(int, match.groups())
    assert actual > CONTEXT and limit == CONTEXT  # the number OpenAI's message says (issue 62.9)

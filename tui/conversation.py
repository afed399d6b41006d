"""Between the stored session and the daemon: the messages to send, and the streamed reply read back.

stream_reply() speaks OpenAI's Chat Completions stream: text in `delta.content`, tool calls as
`delta.tool_calls[]` fragments (index, then id and name, then argument pieces), `finish_reason`,
lingcode's `timings` on the finishing chunk, and `usage` on the last one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from lingcode.client import Client
from lingcode.tui.store import ChatMessage, ChatSession
from lingcode.tui.tools.calls import Call

INTERRUPTED_RESULT = "(no result: the tool call was interrupted before it ran)"


@dataclass
class Reply:
    text: str = ""
    tool_calls: list[Call] = field(default_factory=list)
    finish_reason: str | None = None
    timings: dict = field(default_factory=dict)
    usage: dict = field(default_factory=dict)

    def stats(self) -> dict:
        return {"timings": self.timings, "usage": self.usage, "finish_reason": self.finish_reason}


def model_messages(session: ChatSession, messages: list[ChatMessage]) -> list[dict]:
    """The conversation in OpenAI's shape, from the session's context start (after /clear).

    An answer that failed (the daemon went away mid-answer) stays in the session but is not sent:
    the answer is asked for again. An assistant's tool calls that have no stored result (the app
    was killed) get one saying so, since chat templates expect every call answered. A result whose
    call is gone (its row's tool_calls was damaged and read as empty) is not sent.
    """
    out: list[dict] = [{"role": "system", "content": session.system}] if session.system else []
    answered = {m.tool_call_id for m in messages if m.role == "tool"}
    called = {call.get("id") for m in messages if m.role == "assistant" for call in m.tool_calls}
    for message in messages:
        if message.id <= session.context_start:
            continue
        if message.role == "user":
            out.append({"role": "user", "content": with_attachments(message.content, message.attachments)})
        elif message.role == "tool" and message.tool_call_id in called:  # else its call was lost (a damaged row)
            out.append({"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content})
        elif message.role == "assistant" and message.state != "error" and (message.content or message.tool_calls):
            entry: dict = {"role": "assistant", "content": message.content or None}
            if message.tool_calls:
                entry["tool_calls"] = message.tool_calls
            out.append(entry)
            for call in message.tool_calls:
                if call.get("id") not in answered:
                    out.append({"role": "tool", "tool_call_id": call.get("id"), "content": INTERRUPTED_RESULT})
    return out


def with_attachments(text: str, attachments: list[dict]) -> str:
    parts = [text]
    for attachment in attachments:
        parts.append(f"\n\nFile `{attachment['path']}`:\n```\n{attachment['text']}\n```")
    return "".join(parts)


def context_used(messages: list[ChatMessage]) -> int:
    """Tokens the conversation held after its last answer (its prompt plus what was generated)."""
    for message in reversed(messages):
        usage = message.stats.get("usage") or {}
        if usage.get("total_tokens"):
            return usage["total_tokens"]
    return 0


class ReplyReader:
    """Builds a Reply from a Chat Completions stream's events, one event at a time."""

    def __init__(self):
        self.reply = Reply()
        self.parts: list[str] = []
        self.calls: dict[int, dict] = {}

    def feed(self, event: dict) -> str:
        """Take one event; returns the text it adds ("" if none)."""
        if event.get("usage"):
            self.reply.usage = event["usage"]
        if event.get("timings"):
            self.reply.timings = event["timings"]
        text = ""
        for choice in event.get("choices") or []:
            delta = choice.get("delta") or {}
            text += delta.get("content") or ""
            for fragment in delta.get("tool_calls") or []:
                _merge_tool_call(self.calls.setdefault(fragment.get("index", 0), {}), fragment)
            if choice.get("finish_reason"):
                self.reply.finish_reason = choice["finish_reason"]
        if text:
            self.parts.append(text)
        return text

    def result(self) -> Reply:
        self.reply.text = "".join(self.parts)
        self.reply.tool_calls = [
            Call(c.get("id") or f"call_{index}", c.get("name", ""), c.get("arguments", ""))
            for index, c in sorted(self.calls.items())
        ]
        return self.reply


async def stream_reply(client: Client, body: dict) -> AsyncIterator[str | Reply]:
    """Yield each text fragment as it comes, then the whole Reply once the stream ends."""
    reader = ReplyReader()
    async for event in client.stream("/v1/chat/completions", {**body, "stream_options": {"include_usage": True}}):
        text = reader.feed(event)
        if text:
            yield text
    yield reader.result()


def _merge_tool_call(call: dict, fragment: dict) -> None:
    if fragment.get("id"):
        call["id"] = fragment["id"]
    function = fragment.get("function") or {}
    if function.get("name"):
        call["name"] = call.get("name", "") + function["name"]
    if function.get("arguments"):
        call["arguments"] = call.get("arguments", "") + function["arguments"]


def request_body(
    model: str, messages: list[dict], *, tools: list[dict] | None, max_tokens: int | None, temperature: float | None
) -> dict:
    body: dict = {"model": model, "messages": messages}
    if tools:
        body["tools"] = tools
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    if temperature is not None:
        body["temperature"] = temperature
    return body


def tool_calls_json(calls: list[Call]) -> list[dict]:
    return [call.as_openai() for call in calls]

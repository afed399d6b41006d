"""Tool calls in a model's text stream, parsed incrementally, one parser per model family's format.

A parser is fed the generated text as it arrives and returns events: plain text, the start of a
tool call (index, id, name), and fragments of the call's arguments (JSON text). Text is held back
only while it could still be the start of a tag, so an answer without tool calls streams as fast
as it is generated. The non-streamed answer is the same events folded, so both paths agree.

Formats (chosen per model family in lingcode/data/families.toml):
    hermes  <tool_call>{"name": "f", "arguments": {...}}</tool_call>   (generic models, SmolLM2, Qwen)
    ling3   <tool_call>f\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>\n</tool_call>   (Ling-3.0, GLM-4.7)
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Tool:
    """A function the model may call: its name, what it does, and a JSON schema of its arguments."""

    name: str
    description: str = ""
    parameters: dict = field(default_factory=lambda: {"type": "object", "properties": {}})

    def openai(self) -> dict:
        """The OpenAI function-tool shape chat templates expect."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}  # fmt: skip


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as the model wrote it


@dataclass
class Text:
    text: str


@dataclass
class CallStart:
    index: int
    id: str
    name: str


@dataclass
class CallArgs:
    index: int
    fragment: str


Event = Text | CallStart | CallArgs


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def partial_tag_len(buffer: str, tags: tuple[str, ...]) -> int:
    """Length of the longest suffix of buffer that is a proper prefix of one of the tags."""
    longest = 0
    for tag in tags:
        for n in range(min(len(tag) - 1, len(buffer)), longest, -1):
            if buffer.endswith(tag[:n]):
                longest = n
                break
    return longest


class ToolParser:
    """feed() text as it comes, finish() at the end; both return events. `calls` is the result."""

    OPEN = "<tool_call>"

    def __init__(self, tools: list[Tool]):
        self.tools = {t.name: t for t in tools}
        self.calls: list[ToolCall] = []
        self.buffer = ""  # text not yet handled

    def _text_before_call(self) -> tuple[list[Event], bool]:
        """Outside a call: the text that is surely not part of one, and whether a call opened.

        Consumes the buffer up to and including OPEN, or up to what could be the start of OPEN.
        Whitespace right after a call (the separator between parallel calls) is held back while
        nothing else follows it, and dropped at the end.
        """
        i = self.buffer.find(self.OPEN)
        if i >= 0:
            text, self.buffer = self.buffer[:i], self.buffer[i + len(self.OPEN) :]
            return _text(text if text.strip() or not self.calls else ""), True
        keep = partial_tag_len(self.buffer, (self.OPEN,))
        text = self.buffer[: len(self.buffer) - keep]
        if self.calls and not text.strip():
            return [], False  # held: only whitespace since the last call
        self.buffer = self.buffer[len(self.buffer) - keep :]
        return _text(text), False

    def _text_at_end(self, text: str) -> list[Event]:
        return _text(text if text.strip() or not self.calls else "")

    def feed(self, text: str) -> list[Event]:
        raise NotImplementedError

    def finish(self) -> list[Event]:
        raise NotImplementedError

    # Helpers for subclasses: record what is emitted, so `calls` always matches the events.
    def _start(self, name: str) -> CallStart:
        call = ToolCall(new_call_id(), name, "")
        self.calls.append(call)
        return CallStart(len(self.calls) - 1, call.id, name)

    def _args(self, fragment: str) -> list[CallArgs]:
        if not fragment:
            return []
        self.calls[-1].arguments += fragment
        return [CallArgs(len(self.calls) - 1, fragment)]


def _text(text: str) -> list[Event]:
    return [Text(text)] if text else []


def make_parser(name: str, tools: list[Tool]) -> ToolParser:
    from lingcode.tool_parsers.hermes import HermesParser
    from lingcode.tool_parsers.ling3 import Ling3Parser

    parsers = {"hermes": HermesParser, "ling3": Ling3Parser}
    if name not in parsers:
        raise ValueError(f"unknown tool-call parser {name!r} (known: {', '.join(parsers)})")
    return parsers[name](tools)


def tool_call_grammar(name: str, tools: list[Tool], parallel: bool) -> dict:
    """An xgrammar structural tag (as a dict) that admits only well-formed calls of these tools."""
    from lingcode.tool_parsers.hermes import structural_tag as hermes_tag
    from lingcode.tool_parsers.ling3 import structural_tag as ling3_tag

    return {"hermes": hermes_tag, "ling3": ling3_tag}[name](tools, parallel)

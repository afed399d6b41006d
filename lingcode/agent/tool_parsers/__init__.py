"""Tool calls in a model's text stream, parsed incrementally, one parser per model family's format.

A parser is fed the generated text as it arrives and returns events: plain text, the start of a
tool call (index, id, name), and fragments of the call's arguments (JSON text). Text is held back
only while it could still be the start of a tag, so an answer without tool calls streams as fast
as it is generated. The non-streamed answer is the same events folded, so both paths agree.
ToolParser holds that streaming for every format; a format's module gives only its tags and how
a call's body becomes a name and arguments.

Formats (chosen per model family in lingcode/data/families.toml):
    hermes  <tool_call>{"name": "f", "arguments": {...}}</tool_call>   (generic models, SmolLM2, Qwen)
    ling3   <tool_call>f\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>\n</tool_call>   (Ling-3.0, GLM-4.7)
"""

from __future__ import annotations

import json
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
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


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


def split_at_tag(buffer: str, tags: tuple[str, ...]) -> tuple[str, str | None, str]:
    """(text before the first tag, that tag, text after it); while no tag has arrived,
    (the text that cannot be part of one, None, a possible start of one, held back).

    Of tags found at the same place the smallest wins, as min() orders them.
    """
    found = min(((i, tag) for tag in tags if (i := buffer.find(tag)) >= 0), default=None)
    if found is not None:
        i, tag = found
        return buffer[:i], tag, buffer[i + len(tag) :]
    cut = len(buffer) - partial_tag_len(buffer, tags)
    return buffer[:cut], None, buffer[cut:]


class ToolParser:
    """feed() text as it comes, finish() at the end; both return events. `calls` is the result.

    The streaming is shared by every format: text outside calls goes out as soon as it cannot be
    the start of OPEN, and a call's body (what lies between OPEN and CLOSE) is collected as it
    arrives. A format says only how a body becomes a call, in three methods:
        _stream()   the body grew: start the call and emit argument fragments once they are sure
        _close()    CLOSE arrived: the rest of the call, or the body as text if it is no call
        _cut_off()  the stream ended inside a call that had started (max_tokens)
    Each emits through _start() and _args(), so `calls` always matches the events.
    """

    OPEN: str  # the tags around a call, set by each format
    CLOSE: str

    def __init__(self, tools: list[Tool]):
        self.tools = {t.name: t for t in tools}
        self.calls: list[ToolCall] = []
        self.buffer = ""  # text not yet handled
        self.body: str | None = None  # inside a call: its text so far
        self.started = False  # inside a call: whether its CallStart went out

    def feed(self, text: str) -> list[Event]:
        self.buffer += text
        events: list[Event] = []
        while True:
            if self.body is None:
                before, opened = self._text_before_call()
                events += before
                if not opened:
                    return events
                self.body, self.started = "", False
            else:
                body, closed, self.buffer = split_at_tag(self.buffer, (self.CLOSE,))
                self.body += body
                if closed is None:
                    return events + self._stream()
                events += self._close()
                self.body = None

    def finish(self) -> list[Event]:
        if self.body is None:
            events = self._after_calls(self.buffer)
        else:
            self.body += self.buffer
            # A call cut off by max_tokens is what arrived of it. Markup of a call that never named its
            # function is no text: the client would show `<tool_call>{"` as the answer.
            events = self._cut_off() if self.started else []
        self.buffer, self.body = "", None
        return events

    def _text_before_call(self) -> tuple[list[Event], bool]:
        """Outside a call: the text that is surely not part of one, and whether a call opened.

        Consumes the buffer up to and including OPEN, or up to what could be the start of OPEN.
        Whitespace right after a call (the separator between parallel calls) is held back while
        nothing else follows it, and dropped at the end.
        """
        text, opened, rest = split_at_tag(self.buffer, (self.OPEN,))
        if opened is None and self.calls and not text.strip():
            return [], False  # held: only whitespace since the last call
        self.buffer = rest
        return self._after_calls(text), opened is not None

    def _after_calls(self, text: str) -> list[Event]:
        """Text outside calls; once a call was made, whitespace alone is only their separator."""
        return _text(text if text.strip() or not self.calls else "")

    def _stream(self) -> list[Event]:
        raise NotImplementedError

    def _close(self) -> list[Event]:
        raise NotImplementedError

    def _cut_off(self) -> list[Event]:
        raise NotImplementedError

    def _start(self, name: str) -> CallStart:
        call = ToolCall(new_call_id(), name, "")
        self.calls.append(call)
        self.started = True
        return CallStart(len(self.calls) - 1, call.id, name)

    def _args(self, fragment: str) -> list[CallArgs]:
        if not fragment:
            return []
        self.calls[-1].arguments += fragment
        return [CallArgs(len(self.calls) - 1, fragment)]


def _text(text: str) -> list[Event]:
    return [Text(text)] if text else []


def make_parser(name: str, tools: list[Tool]) -> ToolParser:
    from lingcode.agent.tool_parsers.hermes import HermesParser
    from lingcode.agent.tool_parsers.ling3 import Ling3Parser

    parsers = {"hermes": HermesParser, "ling3": Ling3Parser}
    if name not in parsers:
        raise ValueError(f"unknown tool-call parser {name!r} (known: {', '.join(parsers)})")
    return parsers[name](tools)


def tool_call_grammar(name: str, tools: list[Tool], parallel: bool) -> str:
    """A Lark grammar (llguidance's dialect) that admits only well-formed calls of these tools."""
    from lingcode.agent.tool_parsers.hermes import tool_call_grammar as hermes_grammar
    from lingcode.agent.tool_parsers.ling3 import tool_call_grammar as ling3_grammar

    return {"hermes": hermes_grammar, "ling3": ling3_grammar}[name](tools, parallel)


# JSON in a grammar is written as json.dumps writes it (what models saw, what the parsers read):
# llguidance's options, in a schema's "x-guidance" or as a compile's defaults.
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def closed(schema):
    """The schema with objects that list properties closed to others unless they say otherwise
    (additionalProperties false), as OpenAI's strict mode and xgrammar read schemas: the model
    writes the arguments a tool declares, not whatever else it may think of."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: closed(value) if key in _SUBSCHEMAS else value for key, value in schema.items()}
    if "properties" in out:
        out["properties"] = {name: closed(value) for name, value in out["properties"].items()}
        out.setdefault("additionalProperties", False)
    for key in ("$defs", "definitions"):
        if isinstance(out.get(key), dict):
            out[key] = {name: closed(value) for name, value in out[key].items()}
    return out


_SUBSCHEMAS = ("items", "prefixItems", "anyOf", "oneOf", "allOf", "additionalProperties", "not", "if", "then", "else")


def lark_literal(text: str) -> str:
    """text as a Lark string literal."""
    return json.dumps(text)

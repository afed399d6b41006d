"""Hermes-style JSON tool calls: <tool_call>{"name": "f", "arguments": {...}}</tool_call>.

Streaming: once `{"name": "f", "arguments": ` has arrived, the call starts and the arguments
stream as the model writes them; only a trailing `}` (which may be the outer object's) and
whitespace are held back. A block that never names a function is returned as plain text.
"""

from __future__ import annotations

import json
import re

from lingcode.agent.tool_parsers import JSON_STYLE, Event, Tool, ToolParser, _text, closed, lark_literal

_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=[^\s"])')
_OUTER_END = re.compile(r"\s*\}\s*$")


def _held_from(raw: str) -> int:
    """Where the tail that could still be the outer object's end begins: whitespace, an optional `}`,
    whitespace. Found from the end, so each chunk costs the tail, not the arguments so far."""
    end = len(raw.rstrip())
    if end and raw[end - 1] == "}":
        end = len(raw[: end - 1].rstrip())
    return end


class HermesParser(ToolParser):
    OPEN, CLOSE = "<tool_call>", "</tool_call>"

    def __init__(self, tools: list[Tool]):
        super().__init__(tools)
        self.args_at = 0  # in a started call: where the arguments begin in body
        self.sent = 0  # characters of the arguments already emitted

    def _stream(self) -> list[Event]:
        events: list[Event] = []
        if not self.started:
            head = _HEAD.match(self.body)
            if head is None:
                return events
            events.append(self._start(json.loads(f'"{head.group(1)}"')))
            self.args_at, self.sent = head.end(), 0
        raw = self.body[self.args_at :]
        safe = _held_from(raw)
        if safe > self.sent:
            events += self._args(raw[self.sent : safe])
            self.sent = safe
        return events

    def _close(self) -> list[Event]:
        if self.started:
            raw = _OUTER_END.sub("", self.body[self.args_at :], count=1)
            return self._args(raw[self.sent :])
        # The head never matched (arguments first, arguments as a string, ...): parse it whole.
        try:
            call = json.loads(self.body)
        except ValueError:
            call = None
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return _text(self.OPEN + self.body + self.CLOSE)  # not a tool call after all
        args = call.get("arguments", call.get("parameters", {}))
        if not isinstance(args, str):
            args = json.dumps(args, ensure_ascii=False)
        return [self._start(call["name"]), *self._args(args)]

    def _cut_off(self) -> list[Event]:
        return self._args(self.body[self.args_at + self.sent :])


def tool_call_grammar(tools: list[Tool], parallel: bool) -> str:
    """Calls of these tools only, one or more (one if not parallel), with schema-valid arguments (Lark)."""
    call = {
        "anyOf": [
            {
                "type": "object",
                "properties": {"name": {"const": t.name}, "arguments": closed(t.parameters or {"type": "object"})},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for t in tools
        ],
        "x-guidance": JSON_STYLE,
    }
    return "\n".join(
        [
            'start: call ("\\n" call)*' if parallel else "start: call",
            f"call: {lark_literal(HermesParser.OPEN)} body {lark_literal(HermesParser.CLOSE)}",
            f"body: %json {json.dumps(call)}",
        ]
    )

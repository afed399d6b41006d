"""Hermes-style JSON tool calls: <tool_call>{"name": "f", "arguments": {...}}</tool_call>.

Streaming: once `{"name": "f", "arguments": ` has arrived, the call starts and the arguments
stream as the model writes them; only a trailing `}` (which may be the outer object's) and
whitespace are held back. A block that never names a function is returned as plain text.
"""

from __future__ import annotations

import json
import re

from lingcode.tool_parsers import Event, Tool, ToolParser, _text, partial_tag_len

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=[^\s"])')
_HELD = re.compile(r"\s*(\}\s*)?$")  # could still be the end of the outer object
_OUTER_END = re.compile(r"\s*\}\s*$")


class HermesParser(ToolParser):
    def __init__(self, tools: list[Tool]):
        super().__init__(tools)
        self.body: str | None = None  # inside a call: its text so far
        self.args_at = -1  # where the arguments begin in body, once the call has started
        self.sent = 0  # characters of the arguments already emitted

    def feed(self, text: str) -> list[Event]:
        self.buffer += text
        events: list[Event] = []
        while True:
            if self.body is None:
                text, opened = self._text_before_call()
                events += text
                if not opened:
                    return events
                self.body, self.args_at, self.sent = "", -1, 0
            else:
                j = self.buffer.find(CLOSE)
                if j < 0:
                    keep = partial_tag_len(self.buffer, (CLOSE,))
                    self.body += self.buffer[: len(self.buffer) - keep]
                    self.buffer = self.buffer[len(self.buffer) - keep :]
                    return events + self._stream()
                self.body += self.buffer[:j]
                self.buffer = self.buffer[j + len(CLOSE) :]
                events += self._close()

    def finish(self) -> list[Event]:
        if self.body is None:
            events = self._text_at_end(self.buffer)
        elif self.args_at >= 0:  # cut off mid-call (max_tokens): what arrived is what there is
            self.body += self.buffer
            events = self._args(self.body[self.args_at + self.sent :])
        else:
            events = _text(OPEN + self.body + self.buffer)
        self.buffer, self.body = "", None
        return events

    def _stream(self) -> list[Event]:
        events: list[Event] = []
        if self.args_at < 0:
            head = _HEAD.match(self.body)
            if head is None:
                return events
            events.append(self._start(json.loads(f'"{head.group(1)}"')))
            self.args_at = head.end()
        raw = self.body[self.args_at :]
        safe = _HELD.search(raw).start()
        if safe > self.sent:
            events += self._args(raw[self.sent : safe])
            self.sent = safe
        return events

    def _close(self) -> list[Event]:
        body, self.body = self.body, None
        if self.args_at >= 0:
            raw = _OUTER_END.sub("", body[self.args_at :], count=1)
            return self._args(raw[self.sent :])
        # The head never matched (arguments first, arguments as a string, ...): parse it whole.
        try:
            call = json.loads(body)
        except ValueError:
            call = None
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return _text(OPEN + body + CLOSE)  # not a tool call after all
        args = call.get("arguments", call.get("parameters", {}))
        if not isinstance(args, str):
            args = json.dumps(args, ensure_ascii=False)
        return [self._start(call["name"]), *self._args(args)]



def structural_tag(tools: list[Tool], parallel: bool) -> dict:
    """Calls of these tools only, one or more (one if not parallel), with schema-valid arguments."""
    call = {
        "anyOf": [
            {"type": "object",
             "properties": {"name": {"const": t.name}, "arguments": t.parameters or {"type": "object"}},
             "required": ["name", "arguments"], "additionalProperties": False}
            for t in tools
        ]
    }  # fmt: skip
    tag = {"type": "tag", "begin": OPEN, "content": {"type": "json_schema", "json_schema": call, "max_whitespace_cnt": 1},
           "end": CLOSE}  # fmt: skip
    return {"type": "structural_tag",
            "format": {"type": "tags_with_separator", "tags": [tag], "separator": "\n", "at_least_one": True,
                       "stop_after_first": not parallel}}  # fmt: skip

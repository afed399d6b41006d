"""Ling-3.0 (GLM-4.7-style) XML tool calls:

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    </tool_call>

Values are text; a value whose parameter the schema does not declare a string is read as JSON
when it parses (numbers, booleans, objects), as SGLang's ling3/glm47 parsers do. Streaming: the
call starts once its name line is complete, and each argument is emitted as a JSON fragment
(`{"city": "Paris"`, `, "days": 3`, ..., `}`) as soon as its </arg_value> arrives.
"""

from __future__ import annotations

import json
import re

from lingcode.tool_parsers import Event, Tool, ToolParser, _text, partial_tag_len

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_NAME_END = re.compile(r"\n|<arg_key>")
_PAIR = re.compile(r"\s*<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)


class Ling3Parser(ToolParser):
    def __init__(self, tools: list[Tool]):
        super().__init__(tools)
        self.body: str | None = None  # inside a call: its text so far
        self.pos = -1  # inside a started call: where the next argument pair begins in body
        self.n_args = 0

    def feed(self, text: str) -> list[Event]:
        self.buffer += text
        events: list[Event] = []
        while True:
            if self.body is None:
                text, opened = self._text_before_call()
                events += text
                if not opened:
                    return events
                self.body, self.pos, self.n_args = "", -1, 0
            else:
                j = self.buffer.find(CLOSE)
                if j < 0:
                    keep = partial_tag_len(self.buffer, (CLOSE,))
                    self.body += self.buffer[: len(self.buffer) - keep]
                    self.buffer = self.buffer[len(self.buffer) - keep :]
                    return events + self._stream()
                self.body += self.buffer[:j]
                self.buffer = self.buffer[j + len(CLOSE) :]
                events += self._stream(closing=True)
                self.body = None

    def finish(self) -> list[Event]:
        if self.body is None:
            events = self._text_at_end(self.buffer)
        elif self.pos >= 0:  # cut off mid-call: close the arguments that did arrive
            events = self._args("}" if self.n_args else "{}")
        else:
            events = _text(OPEN + self.body + self.buffer)
        self.buffer, self.body = "", None
        return events

    def _stream(self, closing: bool = False) -> list[Event]:
        events: list[Event] = []
        if self.pos < 0:
            end = _NAME_END.search(self.body)
            if end is None and not closing:
                return events
            name = (self.body[: end.start()] if end else self.body).strip()
            if not name:
                return _text(OPEN + self.body + CLOSE) if closing else events
            events.append(self._start(name))
            self.pos = end.end() if end and end.group() == "\n" else (end.start() if end else len(self.body))
        while (pair := _PAIR.match(self.body, self.pos)) is not None:
            key, value = pair.group(1).strip(), pair.group(2)
            fragment = ("{" if self.n_args == 0 else ", ") + json.dumps(key) + ": "
            events += self._args(fragment + json.dumps(self._value(key, value), ensure_ascii=False))
            self.n_args += 1
            self.pos = pair.end()
        if closing:
            events += self._args("}" if self.n_args else "{}")
        return events

    def _value(self, key: str, text: str):
        tool = self.tools.get(self.calls[-1].name)
        declared = ((tool.parameters if tool else {}).get("properties") or {}).get(key) or {}
        if declared.get("type") == "string":
            return text
        try:
            return json.loads(text)
        except ValueError:
            return text



def structural_tag(tools: list[Tool], parallel: bool) -> dict:
    """One tag per tool (`<tool_call>NAME\\n` ... `</tool_call>`), arguments in GLM's XML style."""
    tags = [
        {"type": "tag", "begin": f"{OPEN}{t.name}\n",
         "content": {"type": "json_schema", "json_schema": t.parameters or {"type": "object"}, "style": "glm_xml",
                     "max_whitespace_cnt": 1},
         "end": CLOSE}
        for t in tools
    ]  # fmt: skip
    return {"type": "structural_tag",
            "format": {"type": "tags_with_separator", "tags": tags, "separator": "\n", "at_least_one": True,
                       "stop_after_first": not parallel}}  # fmt: skip

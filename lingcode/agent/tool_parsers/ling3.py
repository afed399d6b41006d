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

from lingcode.agent.tool_parsers import JSON_STYLE, Event, Tool, ToolParser, _text, closed, lark_literal

_NAME_END = re.compile(r"\n|<arg_key>")
_PAIR = re.compile(r"\s*<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)


class Ling3Parser(ToolParser):
    OPEN, CLOSE = "<tool_call>", "</tool_call>"

    def __init__(self, tools: list[Tool]):
        super().__init__(tools)
        self.pos = 0  # in a started call: where the next argument pair begins in body
        self.n_args = 0

    def _stream(self, closing: bool = False) -> list[Event]:
        events: list[Event] = []
        if not self.started:
            end = _NAME_END.search(self.body)
            if end is None and not closing:
                return events
            name = (self.body[: end.start()] if end else self.body).strip()
            if not name:
                return _text(self.OPEN + self.body + self.CLOSE) if closing else events
            events.append(self._start(name))
            self.pos = end.end() if end and end.group() == "\n" else (end.start() if end else len(self.body))
            self.n_args = 0
        while (pair := _PAIR.match(self.body, self.pos)) is not None:
            key, value = pair.group(1).strip(), pair.group(2)
            fragment = ("{" if self.n_args == 0 else ", ") + json.dumps(key) + ": "
            events += self._args(fragment + json.dumps(self._value(key, value), ensure_ascii=False))
            self.n_args += 1
            self.pos = pair.end()
        if closing:
            events += self._end_arguments()
        return events

    def _close(self) -> list[Event]:
        return self._stream(closing=True)

    def _cut_off(self) -> list[Event]:
        return self._end_arguments()  # the arguments that did arrive, closed

    def _end_arguments(self) -> list[Event]:
        return self._args("}" if self.n_args else "{}")

    def _value(self, key: str, text: str):
        tool = self.tools.get(self.calls[-1].name)
        declared = ((tool.parameters if tool else {}).get("properties") or {}).get(key) or {}
        if declared.get("type") == "string":
            return text
        try:
            return json.loads(text)
        except ValueError:
            return text


def tool_call_grammar(tools: list[Tool], parallel: bool) -> str:
    """One rule per tool (`<tool_call>NAME\\n` ... `</tool_call>`), arguments in GLM's XML style (Lark):
    the declared properties in schema order, the required ones present; a string is raw text up to
    </arg_value>, any other value JSON valid against its schema. At most one whitespace character
    between the tags."""
    rules = [
        'start: call ("\\n" call)*' if parallel else "start: call",
        "call: " + " | ".join(f"call_{i}" for i in range(len(tools))),
        "ws: /[ \\n\\r\\t]/",
        'text[stop="</arg_value>"]: /(?s:.*)/',  # the stop string is consumed with the text
        "any_key: /[a-zA-Z_][a-zA-Z0-9_]*/",
    ]
    for i, tool in enumerate(tools):
        schema = tool.parameters or {"type": "object"}
        properties = schema.get("properties") or {}
        required = set(schema.get("required") or ())
        pairs = []
        for j, (key, declared) in enumerate(properties.items()):
            rules.append(f"value_{i}_{j}: " + _value_rule(declared))
            pair = f'ws? "<arg_key>" {lark_literal(key)} "</arg_key>" ws? "<arg_value>" value_{i}_{j}'
            pairs.append(pair if key in required else f"({pair})?")
        if not properties:  # free-form arguments: any keys, text values
            pairs.append('(ws? "<arg_key>" any_key "</arg_key>" ws? "<arg_value>" text)*')
        head = lark_literal(f"{Ling3Parser.OPEN}{tool.name}\n")
        rules.append(f"call_{i}: {head} {' '.join(pairs)} ws? {lark_literal(Ling3Parser.CLOSE)}")
    return "\n".join(rules)


def _value_rule(declared: dict) -> str:
    """A value up to and including </arg_value>: raw text for a string (one of its enum's, if it has
    one; a pattern or format is not checked in raw text), JSON valid against its schema otherwise."""
    options = declared.get("enum") or ([declared["const"]] if "const" in declared else [])
    if options and all(isinstance(v, str) for v in options):
        return "(" + " | ".join(lark_literal(v) for v in options) + ') "</arg_value>"'
    if declared.get("type") == "string":
        return "text"
    return f'%json {json.dumps({**closed(declared), "x-guidance": JSON_STYLE})} "</arg_value>"'

"""What SGLang 0.5.23's own OpenAI server answers for a Ling-3.0 output: the oracle of tests/test_ling3_answers.py.

Run in a child process (importing sglang changes the importing process's environment): JSON in
on stdin, `[{"text", "deltas", "thinking", "tools", "finish"}, ...]`; JSON out on stdout, for
each `{"whole": answer, "stream": answer}`, an answer being `{"reasoning", "content", "calls":
[[name, arguments object], ...]}`.

It runs SGLang's own parsers, `ReasoningParser("ling3")` and the ling3 `FunctionCallParser`
(Ling3Detector), as serving_chat.py does:
- whole reply (`_build_chat_response`): the reasoning parser's parse_non_stream with
  force_reasoning when thinking is on (`_get_reasoning_from_request`: Ling-3.0's template is not
  one SGLang's template detection reads, so the ling3 detector's `enable_thinking` default
  decides), then, with tools, the tool parser's parse_non_stream when it finds a call;
- stream (`_process_reasoning_stream`): parse_stream_chunk per text delta, parse_stream_end
  with the last delta unless the finish is an abort. The normal text that comes out, all of it,
  then goes through the tool parser whole: SGLang's streaming tool detector depends on where
  the deltas fall (it drops text that shares a delta with the start of a call, and a second call
  that arrives in the delta of the first), which would make it an oracle of chunking, not of
  answers.
"""

from __future__ import annotations

import json
import sys

from sglang.srt.entrypoints.openai.protocol import Function, Tool
from sglang.srt.function_call.function_call_parser import FunctionCallParser
from sglang.srt.parser.reasoning_parser import ReasoningParser


def tool_calls(text: str, tools: list[dict]) -> tuple[str, list]:
    if not tools:
        return text, []
    parser = FunctionCallParser([Tool(type="function", function=Function(**t)) for t in tools], "ling3")
    if not parser.has_tool_call(text):
        return text, []
    rest, calls = parser.parse_non_stream(text)
    if not calls:  # serving_chat keeps the text as it was when no call parsed whole
        return text, []
    return rest, [[c.name, json.loads(c.parameters)] for c in calls]


def answer(reasoning: str | None, normal: str | None, tools: list[dict]) -> dict:
    content, calls = tool_calls(normal or "", tools)
    return {"reasoning": reasoning or "", "content": content, "calls": calls}


def whole(case: dict) -> dict:
    parser = ReasoningParser("ling3", stream_reasoning=False, force_reasoning=case["thinking"])
    return answer(*parser.parse_non_stream("".join(case["deltas"])), case["tools"])


def stream(case: dict) -> dict:
    parser = ReasoningParser("ling3", stream_reasoning=True, force_reasoning=case["thinking"])
    reasoning = normal = ""
    for delta in case["deltas"]:
        r, n = parser.parse_stream_chunk(delta)
        reasoning, normal = reasoning + (r or ""), normal + (n or "")
    if case["finish"] != "abort":
        r, n = parser.parse_stream_end()
        reasoning, normal = reasoning + (r or ""), normal + (n or "")
    return answer(reasoning, normal, case["tools"])


if __name__ == "__main__":
    json.dump([{"whole": whole(case), "stream": stream(case)} for case in json.load(sys.stdin)], sys.stdout)

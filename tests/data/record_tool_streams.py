"""Record real tool-call streams from the default model into tool_streams.json (run by hand).

Each record is the text of every streamed chunk, exactly as lingcode.pipeline.generation.generate_text
yielded it while SmolLM2-135M-Instruct answered, constrained to call the tools (llguidance), or
free. The expected calls are read from the whole text by a regex and json.loads, independently of
the incremental parsers that tests/test_tool_parsers.py then runs over the chunks.

    python tests/data/record_tool_streams.py
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from pathlib import Path

from lingcode import models
from lingcode.engine import SamplingParams
from lingcode.engine.local import load_engine
from lingcode.text.families import family_of
from lingcode.pipeline.generation import generate_text
from lingcode.agent.grammar import constraint
from lingcode.pipeline.scheduler import Scheduler
from lingcode.agent.tool_parsers import Tool, tool_call_grammar
from lingcode.agent.tool_prompt import render_prompt

WEATHER = Tool(
    "get_weather",
    "Get the current weather in a city",
    {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"],
    },
)
READ = Tool(
    "read_file",
    "Read a file of the project",
    {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
)

CASES = [
    ("weather-required", [WEATHER], "What is the weather in Paris?", "required", False, 48),
    (
        "two-tools-parallel",
        [WEATHER, READ],
        "Read the file main.py and tell me the weather in Rome.",
        "required",
        True,
        96,
    ),
    ("read-file-named", [WEATHER, READ], "Show me what is in setup.py", "read_file", False, 32),
    ("free-answer", [WEATHER], "Say hello.", "auto", True, 24),
]


def oracle(text: str) -> tuple[list[dict], str]:
    calls = [json.loads(body) for body in re.findall(r"<tool_call>(.*?)</tool_call>", text, re.S)]
    content = re.sub(r"<tool_call>.*?</tool_call>", "", text, flags=re.S)
    return [{"name": c["name"], "arguments": c["arguments"]} for c in calls], content.strip()


async def main() -> None:
    engine = load_engine(models.ensure(models.DEFAULT_MODEL), device="cpu")
    info, scheduler = engine.info, Scheduler(engine)
    family = family_of(info.name)
    records = []
    for name, tools, question, choice, parallel, max_tokens in CASES:
        prompt = render_prompt(info, family, [{"role": "user", "content": question}], tools)
        params = SamplingParams(max_tokens=max_tokens, temperature=0)
        if choice != "auto":
            forced = tools if choice == "required" else [t for t in tools if t.name == choice]
            tag = tool_call_grammar(family.tool_parser, forced, parallel)
            params = dataclasses.replace(
                params, constraint=constraint(info.tokenizer, info.eos_token_ids, "structural_tag", tag)
            )
        chunks, finish = [], None
        async for chunk in generate_text(scheduler, info.tokenizer, name, info.tokenizer.encode(prompt), params):
            chunks.append(chunk.text)
            finish = chunk.finish_reason
        calls, content = oracle("".join(chunks))
        records.append(
            {
                "name": name,
                "model": info.name,
                "parser": family.tool_parser,
                "tool_choice": choice,
                "tools": [dataclasses.asdict(t) for t in tools],
                "finish_reason": finish,
                "chunks": chunks,
                "expected_calls": calls,
                "expected_content": content,
            }
        )
        print(name, finish, calls, repr(content))
    await engine.close()
    out = Path(__file__).with_name("tool_streams.json")
    out.write_text(json.dumps(records, indent=1, ensure_ascii=False) + "\n")
    print("wrote", out)


if __name__ == "__main__":
    asyncio.run(main())

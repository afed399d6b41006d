"""Chat messages + tools -> the prompt text, through the model's own chat template where it can.

Messages are OpenAI chat-shaped dicts ({role, content, tool_calls, tool_call_id, ...}); every API
(OpenAI chat, Anthropic Messages, Responses, sessions) converts to this shape first.

A template that takes `tools` (it names the variable) renders them itself, and gets tool-call
arguments as objects, as Hugging Face templates expect. A template that does not (SmolLM2's)
gets lingcode's own system block describing the tools and the call format of the model's family,
assistant tool calls written back in that format, and tool results as <tool_response> user turns,
so that what the model sees of earlier calls looks like what it writes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.meta

from lingcode.text.chat_template import render_chat
from lingcode.engine import ModelInfo
from lingcode.text.families import Family
from lingcode.agent.tool_parsers import Tool

_HERMES_BLOCK = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""

_LING3_BLOCK = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, output the function name and arguments within the following XML format:
<tool_call>{{function-name}}
<arg_key>{{arg-key-1}}</arg_key>
<arg_value>{{arg-value-1}}</arg_value>
...
</tool_call>"""


@lru_cache(maxsize=8)
def template_variables(template: str) -> frozenset[str]:
    """The variables a chat template reads (e.g. "tools"), from its parsed source."""
    try:
        return frozenset(jinja2.meta.find_undeclared_variables(jinja2.Environment().parse(template)))
    except jinja2.TemplateSyntaxError:
        return frozenset()


def template_takes_tools(template: str | None) -> bool:
    return bool(template) and "tools" in template_variables(template)


def render_prompt(
    info: ModelInfo,
    family: Family,
    messages: list[dict],
    tools: list[Tool],
    add_generation_prompt: bool = True,
    template_kwargs: Mapping[str, Any] | None = None,
) -> str:
    """The prompt text for these messages and tools (raises TemplateError for bad messages).

    Everything the client sent (messages, tool results, tools, template variables) goes into the
    template with its special-token text marked, so that info.tokenizer.encode() gives special ids
    only for what the template and lingcode write themselves.
    `template_kwargs` are extra template variables (lingcode.agent.thinking: enable_thinking, ...).
    """
    mark = info.tokenizer.mark_specials
    extra = mark(dict(template_kwargs or {}))
    # arguments parsed first: JSON can spell a token's text in escapes (\u003c|im_start|\u003e)
    messages = mark([_with_object_arguments(m) for m in messages])
    if tools and template_takes_tools(info.chat_template):
        return render_chat(
            info.chat_template,
            messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=info.bos_token,
            eos_token=info.eos_token,
            tools=mark([t.openai() for t in tools]),
            **extra,
        )
    if tools or any(m.get("tool_calls") or m["role"] == "tool" for m in messages):
        messages = _as_plain_chat(messages, family, tools, mark)
    return render_chat(
        info.chat_template,
        messages,
        add_generation_prompt=add_generation_prompt,
        bos_token=info.bos_token,
        eos_token=info.eos_token,
        **extra,
    )


def tool_system_block(family: Family, tools: list[Tool], mark=lambda value: value) -> str:
    listing = "\n".join(json.dumps(mark(t.openai()), ensure_ascii=False) for t in tools)
    return (_LING3_BLOCK if family.tool_parser == "ling3" else _HERMES_BLOCK).format(tools=listing)


def format_call(family: Family, name: str, arguments: str) -> str:
    """A tool call written the way this family's models write it (and its parser reads it)."""
    args = _parse_arguments(arguments)
    if family.tool_parser == "ling3":
        pairs = "".join(
            f"<arg_key>{k}</arg_key>\n<arg_value>{v if isinstance(v, str) else json.dumps(v)}</arg_value>\n"
            for k, v in (args.items() if isinstance(args, dict) else ())
        )
        return f"<tool_call>{name}\n{pairs}</tool_call>"
    return f"<tool_call>{json.dumps({'name': name, 'arguments': args}, ensure_ascii=False)}</tool_call>"


def _as_plain_chat(messages: list[dict], family: Family, tools: list[Tool], mark) -> list[dict]:
    out: list[dict] = []
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = [
                format_call(family, c["function"]["name"], c["function"].get("arguments") or "{}")
                for c in m["tool_calls"]
            ]
            content = "\n".join(filter(None, [m.get("content") or "", *calls]))
            out.append({"role": "assistant", "content": content})
        elif m["role"] == "tool":
            response = f"<tool_response>\n{m.get('content') or ''}\n</tool_response>"
            if out and out[-1].get("_tool_responses"):  # consecutive results: one user turn
                out[-1]["content"] += "\n" + response
            else:
                out.append({"role": "user", "content": response, "_tool_responses": True})
        else:
            out.append(dict(m))
    for m in out:
        m.pop("_tool_responses", None)
    if tools:
        block = tool_system_block(family, tools, mark)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{block}" if out[0]["content"] else block}
        else:
            out.insert(0, {"role": "system", "content": block})
    return out


def _with_object_arguments(message: dict) -> dict:
    if not message.get("tool_calls"):
        return message
    calls = [
        {**c, "function": {**c["function"], "arguments": _parse_arguments(c["function"].get("arguments"))}}
        for c in message["tool_calls"]
    ]
    return {**message, "tool_calls": calls}


def _parse_arguments(arguments) -> object:
    if not isinstance(arguments, str):
        return arguments if arguments is not None else {}
    try:
        return json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return arguments

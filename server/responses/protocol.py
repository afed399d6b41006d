"""What a client may send to POST /v1/responses (OpenAI Responses), and its translation to chat messages.

Input items: messages (string or input_text / output_text parts), function_call and
function_call_output items, reasoning items (skipped: the model's own reasoning is not fed back).
Function tools, also inside a `namespace` tool (Codex CLI groups some that way; a call of one
names its namespace). Hosted tools (web_search, file_search, ...) run on OpenAI's servers, not
here: they are left out of what the model is offered. Other tool types, images, files and
`previous_response_id` (this server stores nothing: send the whole input, as Codex CLI does with
store=false) are a 400.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from lingcode.server.openai.protocol import GenerationRequest, ReasoningEffort, TemplateKwargs
from lingcode.server.validation import StrictModel, TokenCount, ToolName, check_tool_choice
from lingcode.agent.thinking import Thinking
from lingcode.agent.tool_parsers import Tool
from lingcode.pipeline.turns import ToolChoice


HOSTED_TOOLS = (
    "web_search",
    "web_search_preview",
    "file_search",
    "code_interpreter",
    "image_generation",
    "mcp",
    "computer_use_preview",
)


class ResponsesTool(StrictModel):
    type: Literal["function"]
    name: ToolName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    namespace: str | None = None  # set when the tool came inside a namespace tool


class NamedFunction(StrictModel):
    type: Literal["function"]
    name: str


class TextFormat(StrictModel):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class TextOptions(StrictModel):
    format: TextFormat | None = None


class ReasoningOptions(StrictModel):
    effort: ReasoningEffort | None = None  # "none" turns thinking off (lingcode.agent.thinking)
    summary: Literal["auto", "concise", "detailed"] | None = None  # accepted; the reasoning is given whole


_ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")
_PART_TYPES = ("input_text", "output_text", "text")


class ResponsesRequest(GenerationRequest):
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[ResponsesTool] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedFunction | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: TokenCount | None = None
    text: TextOptions | None = None
    previous_response_id: str | None = None
    store: bool | None = None
    reasoning: ReasoningOptions | None = None
    chat_template_kwargs: TemplateKwargs | None = None

    def template_variables(self) -> dict[str, Any]:
        effort = self.reasoning.effort if self.reasoning else None
        return Thinking(effort=effort, template_kwargs=self.chat_template_kwargs or {}).template_variables()

    @field_validator("tools", mode="before")
    @classmethod
    def _function_tools(cls, tools):
        """Function tools, namespaces flattened, hosted tools left out; anything else is a 400."""
        if not isinstance(tools, list):
            return tools
        out = []
        for tool in tools:
            kind = tool.get("type") if isinstance(tool, dict) else None
            if kind == "function":
                out.append(tool)
            elif kind == "namespace" and isinstance(tool.get("tools"), list):
                for inner in tool["tools"]:
                    if not isinstance(inner, dict) or inner.get("type") != "function":
                        raise ValueError(f"namespace {tool.get('name')!r}: only function tools are supported inside")
                    out.append({**inner, "namespace": tool.get("name")})
            elif kind in HOSTED_TOOLS:
                continue
            else:
                raise ValueError(f"only function tools are supported, not {kind!r}")
        return out

    @field_validator("previous_response_id")
    @classmethod
    def _stateless(cls, value):
        if value:
            raise ValueError("this server stores no responses: send the whole conversation as `input` (store=false)")
        return value

    @model_validator(mode="after")
    def _fits(self):
        check_tool_choice(self.choice(), [t.name for t in self.tools or []])
        if self.max_output_tokens is not None:
            self.max_tokens = self.max_output_tokens
        return self

    def tool_list(self) -> list[Tool]:
        return [
            Tool(t.name, t.description or "", t.parameters or {"type": "object", "properties": {}})
            for t in self.tools or []
        ]

    def namespaces(self) -> dict[str, str]:
        return {t.name: t.namespace for t in self.tools or [] if t.namespace}

    def choice(self) -> ToolChoice:
        if isinstance(self.tool_choice, NamedFunction):
            return ToolChoice("function", self.tool_choice.name)
        return ToolChoice(self.tool_choice or "auto")

    def json_format(self) -> tuple[str, dict | None] | None:
        fmt = self.text.format if self.text else None
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_object":
            return ("json", None)
        if fmt.schema_ is None:
            raise ValueError("text.format: a json_schema format needs `schema`")
        return ("json_schema", fmt.schema_)

    def chat_messages(self) -> list[dict]:
        """OpenAI chat-shaped messages; raises ValueError naming the item that cannot be used."""
        out: list[dict] = [{"role": "system", "content": self.instructions}] if self.instructions else []
        if isinstance(self.input, str):
            return out + [{"role": "user", "content": self.input}]
        for i, item in enumerate(self.input):
            kind = item.get("type", "message")
            if kind not in _ITEM_TYPES:
                raise ValueError(f"input[{i}]: {kind!r} items are not supported")
            if kind == "message":
                role = item.get("role")
                if role not in ("user", "assistant", "system", "developer"):
                    raise ValueError(f"input[{i}].role: {role!r} is not a message role")
                out.append(
                    {"role": "system" if role == "developer" else role, "content": _text(item.get("content"), i)}
                )
            elif kind == "function_call":
                call = {
                    "id": _str(item, "call_id", i),
                    "type": "function",
                    "function": {"name": _str(item, "name", i), "arguments": item.get("arguments") or "{}"},
                }
                if out and out[-1]["role"] == "assistant":
                    out[-1].setdefault("tool_calls", []).append(call)
                else:
                    out.append({"role": "assistant", "content": "", "tool_calls": [call]})
            elif kind == "function_call_output":
                output = item.get("output")
                content = output if isinstance(output, str) else _text(output, i)
                out.append({"role": "tool", "tool_call_id": _str(item, "call_id", i), "content": content})
        return out


def _str(item: dict, key: str, i: int) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise ValueError(f"input[{i}].{key}: a non-empty string is required")
    return value


def _text(content, i: int) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ValueError(f"input[{i}].content: a string or a list of text parts is required")
    parts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in _PART_TYPES or not isinstance(part.get("text"), str):
            raise ValueError(f"input[{i}].content: {kind!r} parts are not supported (text only)")
        parts.append(part["text"])
    return "".join(parts)

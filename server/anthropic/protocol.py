"""What a client may send to POST /v1/messages (Anthropic Messages), and its translation to chat messages.

Blocks supported: text, tool_use, tool_result (text content, `is_error`), thinking (kept as the
assistant's reasoning); images and documents are a 400 (this daemon serves a text model). Any
model id is accepted, since Claude Code asks for several; `cache_control`, `metadata` and other
fields that do not change the output are ignored.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from lingcode.server.validation import StrictModel, TokenCount, ToolName, TopP, check_tool_choice
from lingcode.agent.thinking import Thinking
from lingcode.agent.tool_parsers import Tool
from lingcode.pipeline.turns import ToolChoice

MAX_STOP_SEQUENCES = 8


class TextBlock(StrictModel):
    type: Literal["text"]
    text: str


class ToolUseBlock(StrictModel):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(StrictModel):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock] = ""
    is_error: bool = False

    @field_validator("content", mode="before")
    @classmethod
    def _text_only(cls, content):
        if isinstance(content, list):
            for part in content:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind != "text":
                    raise ValueError(f"only text tool results are supported, not {kind!r} blocks")
        return content

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "\n".join(b.text for b in self.content)


class ThinkingBlock(StrictModel):
    type: Literal["thinking", "redacted_thinking"]
    thinking: str = ""


Block = Annotated[TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock, Field(discriminator="type")]


class AnthropicMessage(StrictModel):
    role: Literal["user", "assistant", "system"]  # Claude Code sends system messages amid the turns
    content: str | list[Block]

    @field_validator("content", mode="before")
    @classmethod
    def _known_blocks(cls, content):
        if isinstance(content, list):
            for block in content:
                kind = block.get("type") if isinstance(block, dict) else None
                if kind not in ("text", "tool_use", "tool_result", "thinking", "redacted_thinking"):
                    raise ValueError(f"{kind!r} content blocks are not supported by this server (text models only)")
        return content


class AnthropicTool(StrictModel):
    name: ToolName
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None


class AnthropicToolChoice(StrictModel):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False

    @model_validator(mode="after")
    def _tool_has_a_name(self):
        if self.type == "tool" and self.name is None:
            raise ValueError("a tool_choice of type 'tool' needs the tool's name")
        return self


class JSONOutputFormat(StrictModel):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(StrictModel):
    format: JSONOutputFormat | None = None
    effort: str | None = None  # accepted; one model, one effort


class ThinkingConfig(StrictModel):
    """Extended thinking: the chat template's thinking switch (lingcode.agent.thinking)."""

    type: Literal["enabled", "adaptive", "disabled"]
    budget_tokens: int | None = Field(None, ge=1024)  # Anthropic's minimum; accepted, not enforced (as in SGLang)

    @model_validator(mode="after")
    def _budget_with_enabled_only(self):
        if (self.type == "enabled") != (self.budget_tokens is not None):
            raise ValueError("budget_tokens is required with type 'enabled', and allowed only there")
        return self


class CountTokensRequest(StrictModel):
    model: str
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: AnthropicToolChoice | None = None
    thinking: ThinkingConfig | None = None

    def template_variables(self) -> dict[str, Any]:
        return Thinking.anthropic(self.thinking.type if self.thinking else None).template_variables()

    @field_validator("tools", mode="before")
    @classmethod
    def _custom_tools_only(cls, tools):
        if not isinstance(
            tools, list
        ):  # the type check that follows says what is wrong (fuzzing: tools=true was a 500)
            return tools
        for tool in tools:
            kind = tool.get("type") if isinstance(tool, dict) else None
            if kind not in (None, "custom"):
                raise ValueError(f"server tools ({kind!r}) are not supported; send custom tools with an input_schema")
        return tools

    def chat_messages(self) -> list[dict]:
        """OpenAI chat-shaped messages (lingcode.agent.tool_prompt's input)."""
        out: list[dict] = []
        if self.system:
            system = self.system if isinstance(self.system, str) else "\n".join(b.text for b in self.system)
            out.append({"role": "system", "content": system})
        for message in self.messages:
            blocks = (
                [TextBlock(type="text", text=message.content)] if isinstance(message.content, str) else message.content
            )
            if message.role == "system":
                out.append({"role": "system", "content": "\n".join(b.text for b in blocks if isinstance(b, TextBlock))})
            else:
                out += _assistant(blocks) if message.role == "assistant" else _user(blocks)
        return out

    def tool_list(self) -> list[Tool]:
        return [Tool(t.name, t.description or "", t.input_schema) for t in self.tools or []]

    def choice(self) -> ToolChoice:
        choice = self.tool_choice
        if choice is None or choice.type == "auto":
            return ToolChoice("auto")
        if choice.type == "none":
            return ToolChoice("none")
        if choice.type == "any":
            return ToolChoice("required")
        return ToolChoice("function", choice.name)

    def parallel(self) -> bool:
        return not (self.tool_choice and self.tool_choice.disable_parallel_tool_use)


class MessagesRequest(CountTokensRequest):
    max_tokens: TokenCount
    stop_sequences: list[str] | None = Field(None, max_length=MAX_STOP_SEQUENCES)
    temperature: float | None = Field(None, ge=0, le=1)  # Anthropic's range: 0 to 1, not OpenAI's 2
    top_p: TopP | None = None
    top_k: int | None = Field(None, ge=0)
    stream: bool = False
    output_config: OutputConfig | None = None  # structured outputs: the answer is JSON valid against the schema

    def json_format(self) -> tuple[str, dict] | None:
        fmt = self.output_config.format if self.output_config else None
        return None if fmt is None else ("json_schema", fmt.schema_)

    @field_validator("stop_sequences")
    @classmethod
    def _non_empty(cls, stops):
        if any(not s for s in stops or []):
            raise ValueError("stop sequences must not be empty")
        return stops

    @model_validator(mode="after")
    def _tool_choice_fits(self):
        check_tool_choice(self.choice(), [t.name for t in self.tools or []], required="any")
        return self


def _user(blocks: list) -> list[dict]:
    """Tool results become tool messages (in order); text becomes one user message after them."""
    out: list[dict] = []
    text: list[str] = []
    for block in blocks:
        if isinstance(block, ToolResultBlock):
            content = block.text()
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": block.tool_use_id,
                    "content": f"Error: {content}" if block.is_error else content,
                }
            )
        elif isinstance(block, TextBlock):
            text.append(block.text)
        elif isinstance(block, ToolUseBlock):
            raise ValueError("tool_use blocks belong in assistant messages")
    if text:
        out.append({"role": "user", "content": "\n".join(text)})
    return out


def _assistant(blocks: list) -> list[dict]:
    text = "".join(b.text for b in blocks if isinstance(b, TextBlock))
    calls = [
        {
            "id": b.id,
            "type": "function",
            "function": {"name": b.name, "arguments": json.dumps(b.input, ensure_ascii=False)},
        }
        for b in blocks
        if isinstance(b, ToolUseBlock)
    ]
    message: dict = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = calls
    thinking = "".join(b.thinking for b in blocks if isinstance(b, ThinkingBlock))
    if thinking:
        message["reasoning_content"] = thinking
    return [message]

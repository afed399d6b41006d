"""OpenAI's chat and text completions: what a client may send (validated before any work is
queued) and the parts of the answer both share.

Types are strict (a max_tokens of "5" or true is a 400, not a guess) and ranges are OpenAI's.
Fields this server does not implement are accepted only at their neutral value (n=1, no
presence or frequency penalty, no logprobs, ...), so that a client never gets output silently
different from what it asked for; any other value is a 400 that names the field. Unknown extra fields are ignored, as
OpenAI-compatible servers do, since SDKs and frameworks send many of them. The base model,
parse() and the rules other APIs share are in server/validation.py.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from lingcode.server.validation import (
    StrictModel,
    TokenCount,
    ToolName,
    TopP,
    check_tool_choice,
    check_unique_tool_names,
)
from lingcode.agent.thinking import Thinking, check_template_kwargs
from lingcode.agent.tool_parsers import Tool
from lingcode.pipeline.turns import ToolChoice
from lingcode.server.serving import Sampling

MAX_STOP_STRINGS = 4
# Chat template variables (enable_thinking, ...), as SGLang's server takes them: lingcode.agent.thinking
TemplateKwargs = Annotated[dict[str, Any], AfterValidator(check_template_kwargs)]
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]


class TextPart(StrictModel):
    type: Literal["text"]
    text: str


class CalledFunction(StrictModel):
    name: str
    arguments: str | dict[str, Any] = "{}"  # a JSON string, as OpenAI sends it; some clients send the object


class ToolCall(StrictModel):
    """An earlier tool call of the assistant's, as it is sent back. Checked here: a call without a
    function name was a 500 in the prompt renderer (fuzzing)."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: CalledFunction


class Message(StrictModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, content):
        if isinstance(content, list):
            for part in content:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind != "text":
                    raise ValueError(f"only text content parts are supported, not {kind!r}")
        return content

    @model_validator(mode="after")
    def _has_content(self):
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"a {self.role!r} message needs content")
        return self

    def for_template(self) -> dict[str, Any]:
        """The message as chat templates expect it: text content, "developer" read as "system"."""
        if isinstance(self.content, list):
            content = "\n".join(part.text for part in self.content)
        else:
            content = self.content or ""
        message: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role, "content": content}
        for key in ("name", "tool_call_id"):
            if getattr(self, key) is not None:
                message[key] = getattr(self, key)
        if self.tool_calls is not None:
            message["tool_calls"] = [call.model_dump(exclude_none=True) for call in self.tool_calls]
        return message


class StreamOptions(StrictModel):
    include_usage: bool = False


def _unsupported(value: object) -> ValueError:
    return ValueError(f"{value!r} is not supported by this server")


class GenerationRequest(StrictModel):
    """Fields both routes share: sampling, stopping, streaming."""

    model: str | None = None  # one model is served; any name reaches it
    max_tokens: TokenCount | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: TopP | None = None
    top_k: int | None = Field(None, ge=-1)  # an extension (vLLM's): -1 or 0 means no cut
    seed: int | None = Field(None, ge=-(2**63), lt=2**64)  # the range torch's generators take
    n: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False  # an extension (vLLM's): generate past the end-of-sequence token
    # An extension (vLLM's, SGLang's): 1 is off; SGLang's range, past 2 a model says little of sense
    repetition_penalty: float | None = Field(None, gt=0, le=2)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, Any] | None = None

    @field_validator("n", "best_of", check_fields=False)
    @classmethod
    def _one_choice(cls, value):
        if value not in (None, 1):
            raise ValueError("must be 1: this server returns one choice per request")
        return value

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, value):
        stops = [value] if isinstance(value, str) else value or []
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings are allowed")
        if any(not s for s in stops):
            raise ValueError("stop strings must not be empty")
        return value

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalties(cls, value):
        if value:
            raise _unsupported(value)
        return value

    @field_validator("logit_bias")
    @classmethod
    def _no_logit_bias(cls, value):
        if value:
            raise ValueError("logit_bias is not supported by this server")
        return value

    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def sampling(self) -> Sampling:
        return Sampling(
            self.max_tokens,
            self.temperature,
            self.top_p,
            self.top_k,
            self.seed,
            self.ignore_eos,
            self.repetition_penalty,
        )

    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


class FunctionDef(StrictModel):
    name: ToolName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(StrictModel):
    type: Literal["function"]
    function: FunctionDef


class FunctionName(StrictModel):
    name: str


class NamedToolChoice(StrictModel):
    type: Literal["function"]
    function: FunctionName


class JSONSchemaFormat(StrictModel):
    name: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None
    description: str | None = None


class ResponseFormat(StrictModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self):
        if self.type == "json_schema" and (self.json_schema is None or self.json_schema.schema_ is None):
            raise ValueError("a json_schema response format needs json_schema.schema")
        return self


class ChatCompletionRequest(GenerationRequest):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: TokenCount | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[ToolDef] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    chat_template_kwargs: TemplateKwargs | None = None
    reasoning_effort: ReasoningEffort | None = None

    def template_variables(self) -> dict[str, Any]:
        return Thinking(
            effort=self.reasoning_effort, template_kwargs=self.chat_template_kwargs or {}
        ).template_variables()

    @field_validator("logprobs", "top_logprobs")
    @classmethod
    def _no_logprobs(cls, value):
        if value:
            raise ValueError("logprobs are not supported by this server")
        return value

    @model_validator(mode="after")
    def _tool_choice_fits(self):
        names = [t.function.name for t in self.tools or []]
        check_unique_tool_names(names)
        check_tool_choice(self.choice(), names)
        return self

    def tool_list(self) -> list[Tool]:
        return [
            Tool(
                t.function.name,
                t.function.description or "",
                t.function.parameters or {"type": "object", "properties": {}},
            )
            for t in self.tools or []
        ]

    def choice(self) -> ToolChoice:
        if isinstance(self.tool_choice, NamedToolChoice):
            return ToolChoice("function", self.tool_choice.function.name)
        return ToolChoice(self.tool_choice or "auto")

    @model_validator(mode="after")
    def _one_max_tokens(self):
        # max_completion_tokens is OpenAI's newer name for max_tokens.
        if self.max_completion_tokens is not None:
            if self.max_tokens is not None and self.max_tokens != self.max_completion_tokens:
                raise ValueError("max_tokens and max_completion_tokens disagree; send one of them")
            self.max_tokens = self.max_completion_tokens
        return self


class CompletionRequest(GenerationRequest):
    # A string, or OpenAI's other forms of one prompt: [string], [token ids], [[token ids]].
    prompt: str | list[str] | list[int] | list[list[int]]
    suffix: str | None = None
    echo: bool | None = None
    best_of: int | None = None
    logprobs: int | None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value):
        if isinstance(value, list) and value and not isinstance(value[0], int):
            if len(value) != 1:
                raise ValueError("send one prompt per request (a list of prompts is not supported)")
            value = value[0]
        if not value:
            raise ValueError("the prompt is empty")
        return value

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, value):
        if value:
            raise _unsupported(value)
        return value

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, value):
        if value is not None:
            raise ValueError("logprobs are not supported by this server")
        return value


def json_format(fmt: ResponseFormat | None) -> tuple[str, dict | None] | None:
    """A response_format as the pipeline's grammar request: None, ("json", None), ("json_schema", schema)."""
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return ("json", None)
    return ("json_schema", fmt.json_schema.schema_)

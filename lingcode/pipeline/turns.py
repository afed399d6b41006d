"""One assistant turn: the text stream, split into reasoning, answer and tool calls, as events.

Every agent-facing API (OpenAI chat completions, Anthropic Messages, OpenAI Responses, sessions)
runs its generation through run_turn() and only shapes the events for its wire format:

    Reasoning(text)  Content(text)  CallStart(index, id, name)  CallArgs(index, fragment)  ...  TurnEnd

The last event, TurnEnd, also carries the whole turn (content, reasoning, tool calls, usage,
timing, the generated token ids), so a non-streamed response is the same turn, folded.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field

from lingcode.engine import ModelInfo, SamplingParams, TokenConstraint
from lingcode.text.families import Family
from lingcode.pipeline.generation import Timing, Usage, generate_text
from lingcode.agent.reasoning import ReasoningSplitter
from lingcode.pipeline.scheduler import Scheduler
from lingcode.agent.tool_parsers import CallArgs, CallStart, Text, Tool, ToolCall, make_parser, tool_call_grammar


@dataclass
class Content:
    text: str


@dataclass
class Reasoning:
    text: str


@dataclass
class TurnEnd:
    finish_reason: str  # "stop" | "length" | "tool_calls" | "abort"
    content: str
    reasoning: str
    tool_calls: list[ToolCall]
    usage: Usage
    timing: Timing | None
    output_ids: list[int] = field(default_factory=list)
    stop_string: str | None = None  # the stop string that ended the turn, if one did


TurnEvent = Content | Reasoning | CallStart | CallArgs | TurnEnd


@dataclass(frozen=True)
class ToolChoice:
    """OpenAI's tool_choice, normalized: "auto", "none", "required", or "function" with a name."""

    mode: str = "auto"
    name: str | None = None


@dataclass(frozen=True)
class TurnSpec:
    """What a turn needs besides its prompt: the model's family, the tools and how to treat them."""

    family: Family
    tools: tuple[Tool, ...] = ()
    tool_choice: ToolChoice = ToolChoice()
    parallel_tool_calls: bool = True
    starts_in_reasoning: bool = False  # the prompt opened a reasoning block (e.g. ends with <think>)

    @property
    def parses_tools(self) -> bool:
        return bool(self.tools) and self.tool_choice.mode != "none"

    def forced_tools(self) -> list[Tool] | None:
        """The tools the model must call one of (required / named), or None when it may answer freely."""
        if not self.parses_tools or self.tool_choice.mode == "auto":
            return None
        if self.tool_choice.mode == "function":
            return [t for t in self.tools if t.name == self.tool_choice.name]
        return list(self.tools)


def starts_in_reasoning(family: Family, prompt: str) -> bool:
    return family.reasoning is not None and prompt.rstrip().endswith(family.reasoning.start)


def tool_constraint(info: ModelInfo, spec: TurnSpec) -> TokenConstraint | None:
    """A grammar constraint for required / named tool choice; None when the model chooses freely."""
    tools = spec.forced_tools()
    if tools is None:
        return None
    from lingcode.agent.grammar import constraint

    grammar = tool_call_grammar(spec.family.tool_parser, tools, spec.parallel_tool_calls)
    return constraint(info.tokenizer, info.eos_token_ids, "lark", grammar)


def json_constraint(info: ModelInfo, schema: dict | None) -> TokenConstraint:
    """Any JSON object (schema None) or JSON valid against the schema."""
    from lingcode.agent.grammar import constraint

    if schema is None:
        return constraint(info.tokenizer, info.eos_token_ids, "json")
    return constraint(info.tokenizer, info.eos_token_ids, "json_schema", schema)


async def run_turn(
    scheduler: Scheduler,
    info: ModelInfo,
    request_id: str,
    input_ids: list[int],
    params: SamplingParams,
    spec: TurnSpec,
    stop: Sequence[str] = (),
) -> AsyncIterator[TurnEvent]:
    """Stream one turn's events. Closing this iterator early aborts the request in the engine."""
    reasoning_tags = spec.family.reasoning
    splitter = ReasoningSplitter(reasoning_tags, spec.starts_in_reasoning) if reasoning_tags else None
    parser = make_parser(spec.family.tool_parser, list(spec.tools)) if spec.parses_tools else None
    content: list[str] = []
    thought: list[str] = []

    def split(reasoning: str, answer: str) -> list[TurnEvent]:
        events: list[TurnEvent] = [Reasoning(reasoning)] if reasoning else []
        parsed = parser.feed(answer) if parser else ([Text(answer)] if answer else [])
        return events + [Content(e.text) if isinstance(e, Text) else e for e in parsed]

    def finish() -> list[TurnEvent]:
        events = split(*splitter.finish()) if splitter else []
        if parser:
            events += [Content(e.text) if isinstance(e, Text) else e for e in parser.finish()]
        return events

    async with aclosing(generate_text(scheduler, info.tokenizer, request_id, input_ids, params, stop)) as chunks:
        async for chunk in chunks:
            events = split(*splitter.feed(chunk.text)) if splitter else split("", chunk.text)
            if chunk.finish_reason is not None:
                events += finish()
            for event in events:
                if isinstance(event, Content):
                    content.append(event.text)
                elif isinstance(event, Reasoning):
                    thought.append(event.text)
                yield event
            if chunk.finish_reason is not None:
                calls = parser.calls if parser else []
                finish_reason = chunk.finish_reason
                if calls and finish_reason == "stop":
                    finish_reason = "tool_calls"
                text = "".join(content)
                if calls and not text.strip():
                    text = ""  # only the separators around the calls
                yield TurnEnd(finish_reason, text, "".join(thought), calls, chunk.usage, chunk.timing,
                              chunk.output_ids or [], chunk.stop_string)  # fmt: skip
                return

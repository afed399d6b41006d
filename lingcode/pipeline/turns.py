"""One turn of the model, for every API: a Turn goes in, lists of events come out.

Every API (OpenAI chat and completions, Anthropic Messages, Responses, sessions, the editor's
completions) converts its request into a Turn and shapes the events for its wire format:

    TurnStart(prompt_tokens, cached_tokens)  Reasoning(text)  Content(text)
    CallStart(index, id, name)  CallArgs(index, fragment)  ...  TurnEnd

run_turn() yields one list of events per text chunk, and a chunk is whatever the engine produced
since the reader last looked (often several steps' tokens at GPU speed): so the parsers run once
per chunk and an API writes one SSE frame per list. The last list ends with TurnEnd, which also
carries the whole turn (content, reasoning, tool calls, usage, timing, the generated token ids),
so a non-streamed response is the same turn, folded; except that where a family gives output
that is all reasoning as the answer (Ling-3.0), TurnEnd has it as the content alone, while the
stream had it as reasoning and then as content (as SGLang does).
"""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field

from lingcode.agent.reasoning import ReasoningSplitter
from lingcode.agent.tool_parsers import CallArgs, CallStart, Text, Tool, ToolCall, make_parser, tool_call_grammar
from lingcode.engine import ModelInfo, SamplingParams, TokenConstraint
from lingcode.pipeline import metrics
from lingcode.pipeline.generation import EndRequest, TextCut, Timing, Usage, generate_text
from lingcode.pipeline.scheduler import Priority, Scheduler
from lingcode.text.families import Family


@dataclass
class TurnStart:
    """The request reached the engine: its prompt, and how much of it came from the KV cache."""

    prompt_tokens: int
    cached_tokens: int


@dataclass
class Content:
    text: str


@dataclass
class Reasoning:
    text: str


@dataclass
class TurnEnd:
    finish_reason: str  # "stop" | "length" | "loop" (a looping answer, stopped) | "tool_calls" | "abort"
    content: str
    reasoning: str
    tool_calls: list[ToolCall]
    usage: Usage
    timing: Timing | None
    output_ids: list[int] = field(default_factory=list)
    stop_string: str | None = None  # the stop string that ended the turn, if one did


TurnEvent = TurnStart | Content | Reasoning | CallStart | CallArgs | TurnEnd


@dataclass(frozen=True)
class ToolChoice:
    """OpenAI's tool_choice, normalized: "auto", "none", "required", or "function" with a name."""

    mode: str = "auto"
    name: str | None = None


@dataclass(frozen=True)
class TurnSpec:
    """How to read the output: the model's family (None: plain text), the tools and how to treat them."""

    family: Family | None = None
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


@dataclass
class Turn:
    """What an API hands the pipeline: the prompt's ids, how to sample, and how to read the output."""

    request_id: str
    input_ids: list[int]
    params: SamplingParams
    spec: TurnSpec = TurnSpec()
    stop: Sequence[str] = ()
    cut: TextCut | None = None  # where the text ends besides stop strings (editor completions)
    priority: Priority = Priority.NORMAL
    latest_wins: str | None = None  # a key: a newer turn with the same key cancels this one
    stop_loops: bool = False  # end the turn if the output falls into a loop (the client set no max_tokens)


def starts_in_reasoning(family: Family, prompt: str) -> bool:
    return family.reasoning is not None and prompt.rstrip().endswith(family.reasoning.start)


# --- constrained decoding ---------------------------------------------------------------------


def build_constraint(
    info: ModelInfo, spec: TurnSpec, json_format: tuple[str, dict | None] | None, cancel: threading.Event | None = None
) -> TokenConstraint | None:
    """The grammar a turn needs: a forced tool call, else a JSON response format, else none.

    json_format: None, ("json", None) for any JSON object, ("json_schema", schema). Compiling can
    take a while, so callers run this off the event loop; setting `cancel` drops the compile
    (lingcode.agent.grammar.GrammarCancelled).
    """
    from lingcode.agent.grammar import constraint

    tools = spec.forced_tools()
    if tools is not None:
        grammar = tool_call_grammar(spec.family.tool_parser, tools, spec.parallel_tool_calls)
        return constraint(info.tokenizer, info.eos_token_ids, "lark", grammar, cancel=cancel)
    if json_format is None:
        return None
    kind, schema = json_format
    return constraint(info.tokenizer, info.eos_token_ids, kind, schema, cancel=cancel)


# --- the turn ---------------------------------------------------------------------------------


async def run_turn(scheduler: Scheduler, info: ModelInfo, turn: Turn) -> AsyncIterator[list[TurnEvent]]:
    """Stream one turn's events, a list per text chunk. Closing this iterator early aborts the request."""
    spec = turn.spec
    family = spec.family
    splitter = ReasoningSplitter(family.reasoning, spec.starts_in_reasoning) if family and family.reasoning else None
    parser = _CallFilter(make_parser(family.tool_parser, list(spec.tools))) if family and spec.parses_tools else None
    content: list[str] = []
    thought: list[str] = []

    def read(reasoning: str, answer: str) -> list[TurnEvent]:
        events: list[TurnEvent] = [Reasoning(reasoning)] if reasoning else []
        if parser is None:
            return events + [Content(answer)] if answer else events
        return events + parser.feed(answer)

    end = EndRequest()
    text = generate_text(
        scheduler,
        info.tokenizer,
        turn.request_id,
        turn.input_ids,
        turn.params,
        turn.stop,
        cut=turn.cut,
        priority=turn.priority,
        latest_wins=turn.latest_wins,
        stop_loops=turn.stop_loops,
        end=end,
    )
    started = False
    trace = metrics.trace.get() or metrics.Trace()
    async with aclosing(text) as chunks:
        async for chunk in chunks:
            parsing = time.perf_counter()
            events: list[TurnEvent] = []
            if not started:
                started = True
                events.append(TurnStart(len(turn.input_ids), chunk.cached_tokens))
            events += read(*splitter.feed(chunk.text)) if splitter else read("", chunk.text)
            finish_reason = chunk.finish_reason
            if finish_reason is None and parser is not None and parser.repeated:
                # The model began a call it had already made: the turn is over. The final chunk
                # (usage, timing) comes at once, and the engine stops.
                end.requested = True
                chunk = await anext(chunks)
                finish_reason = "stop"
            if finish_reason is not None:
                if splitter:
                    events += read(*splitter.finish(finish_reason != "abort"))
                if parser:
                    events += parser.finish()
            for event in events:
                if isinstance(event, Content):
                    content.append(event.text)
                elif isinstance(event, Reasoning):
                    thought.append(event.text)
            trace.add("parse", time.perf_counter() - parsing)
            if finish_reason is None:
                if events:
                    yield events
                continue
            calls = parser.calls if parser else []
            if calls and finish_reason == "stop":
                finish_reason = "tool_calls"
            answer, reasoning = "".join(content), "".join(thought)
            if calls and not answer.strip():
                answer = ""  # only the separators around the calls
            if splitter and splitter.answer_is_reasoning:  # the whole reply's view (see agent/reasoning.py)
                answer, reasoning = splitter.reasoning, ""
            events.append(
                TurnEnd(
                    finish_reason,
                    answer,
                    reasoning,
                    calls,
                    chunk.usage,
                    chunk.timing,
                    chunk.output_ids or [],
                    chunk.stop_string,
                )
            )
            yield events
            return


class _CallFilter:
    """A tool parser's events, as Content / call events, with two rules on top:

    - markup of an unfinished call is never text: a stream that ends inside `<tool_call>` before
      the call's name arrived yields nothing for it;
    - a call that repeats one made earlier in the turn (same name, same arguments) is not another
      call: its events are held while it matches an earlier call so far, and if it completes
      identical it is dropped and the turn ends (small models asked to call a tool repeat a call,
      or cycle through two, until the token limit; agents would run it twice). A call that differs
      from every earlier one is released as soon as it does.
    """

    def __init__(self, parser):
        self.parser = parser
        self.held: list = []  # events of a call that so far repeats an earlier one
        self.repeated = False  # a complete repeat was dropped: the turn should end
        self._end: int | None = None  # the dropped call's index: it and any after it are not calls

    @property
    def calls(self) -> list[ToolCall]:
        return self.parser.calls[: self._end]

    def feed(self, text: str) -> list[TurnEvent]:
        return self._filter(self.parser.feed(text), done=False) if not self.repeated else []

    def finish(self) -> list[TurnEvent]:
        if self.repeated:
            return []
        return self._filter(self.parser.finish(), done=True)

    def _filter(self, events: list, done: bool) -> list[TurnEvent]:
        out: list[TurnEvent] = []
        for event in events:
            if self.held and isinstance(event, (Text, CallStart)):  # the held call is complete
                if self._made_before():
                    self._drop()
                    return out
                out += self._release()
            if isinstance(event, Text):
                out.append(Content(event.text))
            elif isinstance(event, CallStart):
                self.held = [event] if event.index > 0 else []
                if not self.held:
                    out.append(event)
            elif self.held:
                self.held.append(event)
            else:
                out.append(event)
            out += self._check()
        if self.held and self._complete():  # the closing tag may come in a feed with no event of its own
            if self._made_before():
                self._drop()
                return out
            out += self._release()
        if self.held and done:
            out += self._release()
        return out

    def _current(self) -> tuple[list[ToolCall], ToolCall]:
        index = self.held[0].index
        return self.parser.calls[:index], self.parser.calls[index]

    def _check(self) -> list[TurnEvent]:
        """Release the held call once it differs from every earlier one."""
        if not self.held:
            return []
        earlier, current = self._current()
        if not any(c.name == current.name and c.arguments.startswith(current.arguments) for c in earlier):
            return self._release()
        return []

    def _complete(self) -> bool:
        # its closing tag arrived: a later call began, or the parser is between calls
        return self.held[0].index < len(self.parser.calls) - 1 or self.parser.body is None

    def _made_before(self) -> bool:
        earlier, current = self._current()
        return any(c.name == current.name and c.arguments == current.arguments for c in earlier)

    def _drop(self) -> None:
        self._end = self.held[0].index
        self.held = []
        self.repeated = True

    def _release(self) -> list[TurnEvent]:
        held, self.held = self.held, []
        return held

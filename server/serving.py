"""The one way through the daemon, for every API: validate -> convert -> run the turn -> stream or collect.

Each API (server/openai/, anthropic/, responses/, sessions/, editor/) is a Serving subclass that
fills in two steps, the way SGLang's entrypoints/openai/serving_base does it:

    prepare(body) -> Prepared   the request as a Turn (lingcode.pipeline.turns) and its Shape
    Shape                       how events become the API's JSON body or SSE frames

and handle() does the rest, the same for all: read and validate the body, compile a grammar if the
turn needs one (off the event loop, cancelled if the client leaves), run the turn, then answer once
(collect) or stream (server/streaming.py, which also cancels the work of a client that leaves). A
streamed response starts as soon as nothing can refuse it any more (StreamHead): its head goes out
while the prompt is tokenized and the engine takes the request, its opening event (the role chunk,
`response.created`, `message_start`) before the engine has it (or once the engine has it, for an
engine that may still refuse it), and then an SSE comment every keep_alive_s until the first token,
so that a client with an idle timeout waits out a long prefill; a full queue (429), a context
overflow or a bad grammar is still a proper HTTP error; a client that leaves is cancelled at once;
an error after the stream started is an error frame in the API's own shape. Each list of events
from the pipeline (one engine chunk) is one write.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from lingcode.agent.grammar import GrammarError, GrammarUnavailable
from lingcode.agent.tool_parsers import Tool
from lingcode.agent.tool_prompt import render_prompt
from lingcode.engine import ModelInfo, SamplingParams
from lingcode.pipeline import metrics
from lingcode.pipeline.generation import Timing, Usage
from lingcode.pipeline.scheduler import Scheduler
from lingcode.pipeline.turns import Turn, TurnEnd, TurnEvent, TurnSpec, TurnStart, build_constraint, run_turn
from lingcode.server.errors import CLIENT_GONE, APIError, ContextLengthExceeded, as_api_error, invalid
from lingcode.server.frameworks import RequestRoute, ServingRequest
from lingcode.server.openapi import request_body
from lingcode.server.streaming import (
    KEEP_ALIVE_S,
    StreamHead,
    error_after_start,
    respond,
    stream_head,
    until_disconnected,
)
from lingcode.server.validation import StrictModel, parse, read_json
from lingcode.text.chat_template import TemplateError
from lingcode.text.families import Family, family_for

DONE = "data: [DONE]\n\n"
# Prompts longer than this (characters) are rendered and tokenized on a thread, so one huge
# request cannot stall every other client's stream; shorter ones inline, which is faster.
INLINE_PROMPT_CHARS = 64 * 1024
# Tokens a tokenizer may add to a text's own (BOS, EOS, a leading space marker): Serving._leaves_room
PROMPT_TOKENS_ADDED = 16


def sse(payload: dict) -> str:
    """One server-sent event carrying a JSON object."""
    return f"data: {_json(payload)}\n\n"


def named_sse(name: str, payload: dict) -> str:
    """An SSE event with an `event:` name (Anthropic's and the Responses API's streams)."""
    return f"event: {name}\ndata: {_json(payload)}\n\n"


_json = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode  # built once, not per event


def usage_dict(usage: Usage) -> dict:
    """OpenAI's `usage` object (the editor's answers use it too)."""
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


def finish_reason(end: TurnEnd) -> str:
    """OpenAI's finish_reason for a turn's end: a looping answer lingcode stopped is a normal stop
    (not "length": no limit was reached), and stop_fields says why."""
    return "stop" if end.finish_reason == "loop" else end.finish_reason


def stop_fields(end: TurnEnd) -> dict:
    """lingcode's own field on a finished answer, where no API has a word for why it ended:
    {"lingcode": {"stop_reason": "loop"}} for a looping answer lingcode stopped; else nothing."""
    return {"lingcode": {"stop_reason": end.finish_reason}} if end.finish_reason == "loop" else {}


def timings_dict(usage: Usage | None, timing: Timing | None) -> dict:
    """lingcode's `timings` object: ttft_ms, tpot_ms, total_ms, tokens_per_s, and the token counts."""
    timings = timing.as_dict() if timing is not None else {}
    if usage is not None:
        timings.update(
            prompt_tokens=usage.prompt_tokens,
            cached_tokens=usage.cached_tokens,
            completion_tokens=usage.completion_tokens,
        )
    return timings


# --- what every API hands over ----------------------------------------------------------------


class Shape:
    """How one API writes a turn: one JSON body (whole) or SSE frames (opening, frames, error)."""

    end_of_stream: str = ""  # written after the last frame (OpenAI's `data: [DONE]`)

    def whole(self, end: TurnEnd) -> dict:
        raise NotImplementedError

    def opening(self, start: TurnStart | None = None) -> str:
        """The stream's opening frames. start: the turn's first event, if the opening goes out with
        it; None before the engine has the request (StreamHead)."""
        return ""

    def frames(self, events: list[TurnEvent]) -> str:
        raise NotImplementedError

    def error_frame(self, error: APIError) -> str:
        return sse(error.body())


@dataclass
class Prepared:
    """A request, converted: the turn to run, how to answer, and the grammar it needs (if any)."""

    turn: Turn
    shape: Shape
    stream: bool
    json_format: tuple[str, dict | None] | None = None  # ("json", None) or ("json_schema", schema)
    grammar_param: str = "response_format"  # the field a grammar error names
    release: Callable[[], None] | None = None  # undoes what prepare() claimed, if the turn never ran


@dataclass
class Sampling:
    """The sampling fields of a request, as the client sent them (None: left out)."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    ignore_eos: bool = False
    repetition_penalty: float | None = None


@dataclass
class Opening:
    """A stream that may open before its prompt is tokenized (Serving.opening): its sampling bounds
    the answer's room, its shape frames an error that comes after the head went out."""

    sampling: Sampling
    shape: Shape


# --- the pipeline -----------------------------------------------------------------------------


class Serving:
    """One API route over the one served model. Subclasses set `path` and `request_model`, and
    implement prepare(); handle() is the same for all."""

    path: str
    request_model: type[StrictModel]

    def __init__(
        self,
        scheduler: Scheduler,
        info: ModelInfo,
        model_id: str,
        max_body_bytes: int,
        *,
        keep_alive_s: float = KEEP_ALIVE_S,
    ):
        self.scheduler, self.info, self.model_id, self.max_body_bytes = scheduler, info, model_id, max_body_bytes
        self.keep_alive_s = keep_alive_s
        self.family: Family = family_for(info)

    def install(self, app: FastAPI) -> None:
        app.router.add_api_route(
            self.path,
            self.handle,
            methods=["POST"],
            openapi_extra=request_body(self.request_model),
            route_class_override=RequestRoute,
        )

    async def prepare(self, body: StrictModel, request: Request) -> Prepared:
        raise NotImplementedError

    def run(self, prepared: Prepared) -> AsyncIterator[list[TurnEvent]]:
        return run_turn(self.scheduler, self.info, prepared.turn)

    async def handle(self, request: ServingRequest) -> Response:
        trace = metrics.trace.get() or metrics.Trace()
        trace.mark("until_handler")  # HTTP parsing, the middlewares, routing
        clock = time.perf_counter
        # 1. read and validate the body
        started = clock()
        data = await read_json(request, self.max_body_bytes)
        read = clock()
        body = parse(self.request_model, data)
        trace.add("body", read - started)
        trace.add("validate", clock() - read)
        with StreamHead(request, self.keep_alive_s) as head:
            # 2. convert: the prompt, the sampling params, the shape (a stream's head may go out meanwhile)
            try:
                prepared = await self.prepare(body, request)
            except Exception as exc:
                if not head.sent:
                    raise
                return head.failed(error_after_start(exc))
            try:
                # 3. the grammar, if the turn needs one
                if prepared.turn.spec.forced_tools() is not None or prepared.json_format is not None:
                    compiled = clock()
                    await until_disconnected(request, self._constrain(prepared))
                    trace.add("grammar", clock() - compiled)
                # 4. a stream nothing can refuse any more opens now, before the engine has it
                if prepared.stream and self._opens_before_submit(head):
                    await head.send_opening(prepared.shape)
                # 5. run it, and answer once or stream
                response = await respond(request, self.run(prepared), prepared.stream, prepared.shape, head)
            except BaseException:
                if prepared.release is not None:
                    prepared.release()
                raise
        if response.status_code == CLIENT_GONE and prepared.release is not None:
            prepared.release()
        return response

    # --- conversions every API shares ---------------------------------------------------------

    async def prompt_ids(
        self,
        messages: list[dict],
        tools: Sequence[Tool] = (),
        *,
        param: str = "messages",
        template_kwargs: dict | None = None,
        opens: Opening | None = None,
    ) -> tuple[list[int], str]:
        """The chat template over the messages (and tools), ending with the assistant's turn, as
        token ids, and the prompt text; a message the template cannot take is a 400 naming `param`.

        opens: a stream that nothing after its prompt can refuse (no grammar to compile;
        opening()): once the rendered prompt is sure to leave the answer its room, the
        stream's head goes out, and the client reads it while the prompt is tokenized and the
        engine takes the request."""

        def render() -> str:
            try:
                return render_prompt(self.info, self.family, messages, list(tools), template_kwargs=template_kwargs)
            except TemplateError as exc:
                raise invalid(str(exc), param=param) from None

        def tokenize() -> tuple[list[int], str]:
            text = render()
            return self.info.tokenizer.encode(text), text

        started = time.perf_counter()
        size = sum(len(m.get("content") or "") for m in messages)
        if size >= INLINE_PROMPT_CHARS:
            result = await asyncio.to_thread(tokenize)
        else:
            text = render()
            if (
                opens is not None
                and self._leaves_room(text, opens.sampling)
                and (head := stream_head.get()) is not None
            ):
                opening = time.perf_counter()
                await head.open(opens.shape)
                started += time.perf_counter() - opening  # the trace counts the head's write as "send"
            result = self.info.tokenizer.encode(text), text
        if (trace := metrics.trace.get()) is not None:
            trace.add("prompt", time.perf_counter() - started)
        return result

    def opening(
        self, stream: bool | None, shape: Shape, sampling: Sampling, tools: Sequence[Tool], choice, json_format
    ) -> Opening | None:
        """prompt_ids' `opens` for a request: if it streams and needs no grammar (a grammar that
        does not compile is a 400), to an engine whose stream's head goes before it
        (head_before_submit: the CPU's), and if the scheduler would take it now (not full, not
        shutting down)."""
        if not stream or json_format is not None or not self.scheduler.engine.head_before_submit:
            return None
        if TurnSpec(self.family, tuple(tools), choice, True).forced_tools() is not None:
            return None
        return Opening(sampling, shape) if self.scheduler.refusal() is None else None

    def _opens_before_submit(self, head: StreamHead) -> bool:
        """Whether a checked stream opens before the engine has it: an engine that refuses nothing
        the daemon checked (head_before_submit), and a scheduler that would take it (or a head that
        went out already, after which a refusal is an error frame anyway)."""
        if head.opened or not self.scheduler.engine.head_before_submit:
            return False
        return head.sent or self.scheduler.refusal() is None

    def _leaves_room(self, text: str, sampling: Sampling) -> bool:
        """Whether the prompt `text` surely leaves the answer room in the context, before it is
        tokenized: a token stands for at least one byte of the text, bar a few a tokenizer adds
        (sampling_params then checks the exact count)."""
        bound = len(self.info.tokenizer.unmark(text).encode()) + PROMPT_TOKENS_ADDED
        return bound + (sampling.max_tokens or 1) <= self.info.context_length

    def sampling_params(self, fields: Sampling, prompt_tokens: int, what: str) -> tuple[SamplingParams, bool]:
        """The engine's sampling params, and whether to stop a looping answer.

        A field the client left out gets the model family's default (lingcode/data/families.toml);
        one it set is used as sent. max_tokens left out: the family's answer length, within what
        the context has left, and a looping answer is stopped. The context is checked here, before
        anything is queued: nothing is ever truncated silently (`what` names the prompt in errors).
        """
        context = self.info.context_length
        if prompt_tokens >= context:  # the model needs room for at least one new token
            raise ContextLengthExceeded(context, prompt_tokens, what=what)
        defaults = self.family.defaults
        max_tokens = fields.max_tokens
        if max_tokens is None:
            max_tokens = min(defaults.max_tokens or context, context - prompt_tokens)
        elif prompt_tokens + max_tokens > context:
            raise ContextLengthExceeded(context, prompt_tokens, max_tokens, what=what)
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=defaults.temperature if fields.temperature is None else fields.temperature,
            top_p=defaults.top_p if fields.top_p is None else fields.top_p,
            top_k=defaults.top_k if fields.top_k is None else max(fields.top_k, 0),
            repetition_penalty=defaults.repetition_penalty
            if fields.repetition_penalty is None
            else fields.repetition_penalty,
            seed=fields.seed,
            ignore_eos=fields.ignore_eos,
        )
        return params, fields.max_tokens is None

    def turn_spec(self, tools: Sequence[Tool], choice, parallel: bool, prompt: str) -> TurnSpec:
        from lingcode.pipeline.turns import starts_in_reasoning

        return TurnSpec(self.family, tuple(tools), choice, parallel, starts_in_reasoning(self.family, prompt))

    async def _constrain(self, prepared: Prepared) -> None:
        """Compile the turn's grammar on a thread, bounded in size and work (lingcode.agent.grammar)."""
        turn = prepared.turn
        cancel = threading.Event()  # set if the client leaves: the compile is dropped, not finished
        try:
            constraint = await asyncio.to_thread(build_constraint, self.info, turn.spec, prepared.json_format, cancel)
        except asyncio.CancelledError:
            cancel.set()
            raise
        except (GrammarUnavailable, GrammarError) as exc:
            error = as_api_error(exc)
            error.param = "tool_choice" if turn.spec.forced_tools() is not None else prepared.grammar_param
            raise error from None
        if constraint is not None:
            turn.params = dataclasses.replace(turn.params, constraint=constraint)

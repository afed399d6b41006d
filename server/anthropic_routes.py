"""Anthropic Messages: POST /v1/messages and /v1/messages/count_tokens, enough for Claude Code.

Point Claude Code at the daemon with ANTHROPIC_BASE_URL (no /v1) and the token as
ANTHROPIC_AUTH_TOKEN or ANTHROPIC_API_KEY. Routes match on the path, so `?beta=true` is fine;
`anthropic-version` / `anthropic-beta` headers are accepted; `HEAD /` answers (server/app.py).
Errors on these routes come in Anthropic's shape (server/errors.py).

A streamed answer follows Anthropic's event order:
    message_start, ping, (content_block_start, content_block_delta..., content_block_stop)...,
    message_delta (stop_reason, usage), message_stop
with thinking_delta for reasoning, text_delta for text and input_json_delta for tool arguments.
Usage: `input_tokens` counts the prompt tokens prefilled, `cache_read_input_tokens` those reused
from the KV cache (their sum is the prompt).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncIterator

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from lingcode.engine import ModelInfo
from lingcode.text.families import family_for
from lingcode.pipeline.generation import Usage
from lingcode.pipeline.scheduler import Scheduler
from lingcode.server import inputs
from lingcode.server.anthropic_api import CountTokensRequest, MessagesRequest
from lingcode.server.body import read_json
from lingcode.server.errors import APIError, invalid
from lingcode.server.openapi import request_body
from lingcode.server.turn_runner import as_api_error, constrained, respond
from lingcode.server.validation import parse
from lingcode.agent.tool_parsers import CallArgs, CallStart
from lingcode.pipeline.turns import Content, Reasoning, TurnEnd, TurnEvent, TurnSpec, run_turn, starts_in_reasoning

log = logging.getLogger("lingcode.server")

_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "abort": "end_turn"}


class AnthropicRoutes:
    def __init__(self, scheduler: Scheduler, info: ModelInfo, max_body_bytes: int):
        self.scheduler, self.info, self.max_body_bytes = scheduler, info, max_body_bytes
        self.family = family_for(info)

    def install(self, app: FastAPI) -> None:
        app.add_api_route("/v1/messages", self.messages, methods=["POST"], openapi_extra=request_body(MessagesRequest))
        app.add_api_route("/v1/messages/count_tokens", self.count_tokens, methods=["POST"],
                          openapi_extra=request_body(CountTokensRequest))  # fmt: skip

    def _prompt(self, body: CountTokensRequest) -> str:
        try:
            messages = body.chat_messages()
        except ValueError as exc:
            raise invalid(f"messages: {exc}", param="messages") from None
        return inputs.chat_prompt(self.info, messages, body.tool_list(), self.family, template_kwargs=body.template_variables())

    async def count_tokens(self, request: Request) -> dict:
        body = parse(CountTokensRequest, await read_json(request, self.max_body_bytes))
        return {"input_tokens": len(self.info.tokenizer.encode(self._prompt(body)))}

    async def messages(self, request: Request) -> Response:
        body = parse(MessagesRequest, await read_json(request, self.max_body_bytes))
        choice = body.choice()
        prompt = self._prompt(body)
        input_ids = self.info.tokenizer.encode(prompt)
        params = inputs.sampling_params(self.info, _Sampling(body), len(input_ids), "messages")
        spec = TurnSpec(self.family, tuple(body.tool_list()), choice, body.parallel(), starts_in_reasoning(self.family, prompt))
        params = await constrained(self.info, params, spec, body.json_format(),
                             "tool_choice" if spec.forced_tools() else "output_config.format")  # fmt: skip
        shape = MessageShape(f"msg_{uuid.uuid4().hex[:24]}", body.model)
        events = run_turn(self.scheduler, self.info, shape.id, input_ids, params, spec, body.stop_sequences or ())
        return await respond(request, events, body.stream, shape.whole, shape.stream)


class _Sampling:
    """A MessagesRequest seen as the sampling fields inputs.sampling_params reads."""

    def __init__(self, body: MessagesRequest):
        self.max_tokens, self.temperature, self.top_p = body.max_tokens, body.temperature, body.top_p
        self.top_k, self.seed, self.ignore_eos = body.top_k, None, False


def _usage(usage: Usage) -> dict:
    return {"input_tokens": usage.prompt_tokens - usage.cached_tokens, "output_tokens": usage.completion_tokens,
            "cache_read_input_tokens": usage.cached_tokens, "cache_creation_input_tokens": 0}  # fmt: skip


def _input(arguments: str) -> dict:
    """A tool call's arguments as the object Anthropic's `input` must be (invalid JSON kept, labelled)."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {"_invalid_json_arguments": arguments}


def _event(name: str, payload: dict) -> str:
    return f"event: {name}\ndata: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


class MessageShape:
    def __init__(self, message_id: str, model: str):
        self.id, self.model = message_id, model

    def _head(self) -> dict:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model}

    def whole(self, end: TurnEnd) -> dict:
        content: list[dict] = []
        if end.reasoning:
            content.append({"type": "thinking", "thinking": end.reasoning, "signature": ""})
        if end.content:
            content.append({"type": "text", "text": end.content})
        for call in end.tool_calls:
            content.append({"type": "tool_use", "id": _tool_use_id(call.id), "name": call.name, "input": _input(call.arguments)})
        return {**self._head(), "content": content, "stop_reason": self._stop_reason(end),
                "stop_sequence": end.stop_string, "usage": _usage(end.usage), "timings": end.timing.as_dict() if end.timing else {}}  # fmt: skip

    def _stop_reason(self, end: TurnEnd) -> str:
        return "stop_sequence" if end.stop_string else _STOP_REASONS[end.finish_reason]

    async def stream(self, events: AsyncIterator[TurnEvent]) -> AsyncIterator[str]:
        start = {**self._head(), "content": [], "stop_reason": None, "stop_sequence": None,
                 "usage": {"input_tokens": 0, "output_tokens": 0, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}}  # fmt: skip
        yield _event("message_start", {"type": "message_start", "message": start})
        yield _event("ping", {"type": "ping"})
        index, open_kind = -1, None  # the content block being written

        def open_block(kind: str, block: dict) -> str:
            nonlocal index, open_kind
            events = close_block()
            index, open_kind = index + 1, kind
            return events + _event("content_block_start", {"type": "content_block_start", "index": index, "content_block": block})

        def close_block() -> str:
            nonlocal open_kind
            if open_kind is None:
                return ""
            open_kind = None
            return _event("content_block_stop", {"type": "content_block_stop", "index": index})

        def delta(payload: dict) -> str:
            return _event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": payload})

        try:
            async for event in events:
                if isinstance(event, Reasoning):
                    if open_kind != "thinking":
                        yield open_block("thinking", {"type": "thinking", "thinking": "", "signature": ""})
                    yield delta({"type": "thinking_delta", "thinking": event.text})
                elif isinstance(event, Content):
                    if open_kind != "text":
                        yield open_block("text", {"type": "text", "text": ""})
                    yield delta({"type": "text_delta", "text": event.text})
                elif isinstance(event, CallStart):
                    yield open_block("tool_use", {"type": "tool_use", "id": _tool_use_id(event.id), "name": event.name, "input": {}})
                elif isinstance(event, CallArgs):
                    yield delta({"type": "input_json_delta", "partial_json": event.fragment})
                elif isinstance(event, TurnEnd):
                    yield close_block()
                    message_delta = {"type": "message_delta",
                                     "delta": {"stop_reason": self._stop_reason(event), "stop_sequence": event.stop_string},
                                     "usage": _usage(event.usage)}  # fmt: skip
                    yield _event("message_delta", message_delta)
                    yield _event("message_stop", {"type": "message_stop"})
        except Exception as exc:  # the stream has started: report in it, as Anthropic does
            error = as_api_error(exc)
            if error is None:
                log.exception("stream %s failed", self.id)
                error = APIError(500, "internal server error; the daemon's log has the details")
            yield _event("error", error.anthropic_body())
        finally:
            await events.aclose()


def _tool_use_id(call_id: str) -> str:
    return "toolu_" + call_id.removeprefix("call_")

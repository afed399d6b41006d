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
from the KV cache (their sum is the prompt). message_start goes out before the engine has the
request (server/streaming.py's StreamHead), when the cache has not been looked at: its
`input_tokens` is the whole prompt; message_delta carries the split.
"""

from __future__ import annotations

import json
import uuid

from fastapi import FastAPI
from starlette.requests import Request

from lingcode.agent.tool_parsers import CallArgs, CallStart
from lingcode.pipeline.generation import Usage
from lingcode.pipeline.turns import Content, Reasoning, Turn, TurnEnd, TurnEvent, TurnStart
from lingcode.server.anthropic.protocol import CountTokensRequest, MessagesRequest
from lingcode.server.validation import read_json
from lingcode.server.errors import APIError, invalid
from lingcode.server.openapi import request_body
from lingcode.server.serving import Opening, Prepared, Sampling, Serving, Shape, named_sse, stop_fields
from lingcode.server.validation import parse

_STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "loop": "end_turn",
    "tool_calls": "tool_use",
    "abort": "end_turn",
}


class MessagesServing(Serving):
    path = "/v1/messages"
    request_model = MessagesRequest

    def install(self, app: FastAPI) -> None:
        super().install(app)
        app.add_api_route(
            "/v1/messages/count_tokens",
            self.count_tokens,
            methods=["POST"],
            openapi_extra=request_body(CountTokensRequest),
        )

    async def _prompt(self, body: CountTokensRequest, opens: Opening | None = None) -> tuple[list[int], str]:
        try:
            messages = body.chat_messages()
        except ValueError as exc:
            raise invalid(f"messages: {exc}", param="messages") from None
        return await self.prompt_ids(messages, body.tool_list(), template_kwargs=body.template_variables(), opens=opens)

    async def count_tokens(self, request: Request) -> dict:
        body = parse(CountTokensRequest, await read_json(request, self.max_body_bytes))
        input_ids, _ = await self._prompt(body)
        return {"input_tokens": len(input_ids)}

    async def prepare(self, body: MessagesRequest, request: Request) -> Prepared:
        sampling, grammar = Sampling(body.max_tokens, body.temperature, body.top_p, body.top_k), body.json_format()
        shape = MessageShape(f"msg_{uuid.uuid4().hex[:24]}", body.model)
        input_ids, prompt = await self._prompt(
            body, self.opening(body.stream, shape, sampling, body.tool_list(), body.choice(), grammar)
        )
        shape.prompt_tokens = len(input_ids)
        params, stop_loops = self.sampling_params(sampling, len(input_ids), "messages")
        spec = self.turn_spec(body.tool_list(), body.choice(), body.parallel(), prompt)
        turn = Turn(shape.id, input_ids, params, spec, body.stop_sequences or (), stop_loops=stop_loops)
        return Prepared(turn, shape, body.stream, grammar, grammar_param="output_config.format")


def _usage(usage: Usage) -> dict:
    return {
        "input_tokens": usage.prompt_tokens - usage.cached_tokens,
        "output_tokens": usage.completion_tokens,
        "cache_read_input_tokens": usage.cached_tokens,
        "cache_creation_input_tokens": 0,
    }


def _input(arguments: str) -> dict:
    """A tool call's arguments as the object Anthropic's `input` must be (invalid JSON kept, labelled)."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {"_invalid_json_arguments": arguments}


def _tool_use_id(call_id: str) -> str:
    return "toolu_" + call_id.removeprefix("call_")


class MessageShape(Shape):
    def __init__(self, message_id: str, model: str):
        self.id, self.model = message_id, model
        self.index, self.open_kind = -1, None  # the content block being written
        self.prompt_tokens = 0  # set once the prompt is tokenized

    def _head(self) -> dict:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model}

    def whole(self, end: TurnEnd) -> dict:
        content: list[dict] = []
        if end.reasoning:
            content.append({"type": "thinking", "thinking": end.reasoning, "signature": ""})
        if end.content:
            content.append({"type": "text", "text": end.content})
        for call in end.tool_calls:
            content.append(
                {"type": "tool_use", "id": _tool_use_id(call.id), "name": call.name, "input": _input(call.arguments)}
            )
        return {
            **self._head(),
            "content": content,
            "stop_reason": self._stop_reason(end),
            "stop_sequence": end.stop_string,
            "usage": _usage(end.usage),
            "timings": end.timing.as_dict() if end.timing else {},
            **stop_fields(end),
        }

    def _stop_reason(self, end: TurnEnd) -> str:
        return "stop_sequence" if end.stop_string else _STOP_REASONS[end.finish_reason]

    def opening(self, start: TurnStart | None = None) -> str:
        prompt, cached = (start.prompt_tokens, start.cached_tokens) if start is not None else (self.prompt_tokens, 0)
        message = {
            **self._head(),
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": _usage(Usage(prompt, 0, cached)),
        }
        return named_sse("message_start", {"type": "message_start", "message": message}) + named_sse(
            "ping", {"type": "ping"}
        )

    def frames(self, events: list[TurnEvent]) -> str:
        out: list[str] = []
        for event in events:
            if isinstance(event, Reasoning):
                if self.open_kind != "thinking":
                    out += self._open("thinking", {"type": "thinking", "thinking": "", "signature": ""})
                out.append(self._delta({"type": "thinking_delta", "thinking": event.text}))
            elif isinstance(event, Content):
                if self.open_kind != "text":
                    out += self._open("text", {"type": "text", "text": ""})
                out.append(self._delta({"type": "text_delta", "text": event.text}))
            elif isinstance(event, CallStart):
                out += self._open(
                    "tool_use", {"type": "tool_use", "id": _tool_use_id(event.id), "name": event.name, "input": {}}
                )
            elif isinstance(event, CallArgs):
                out.append(self._delta({"type": "input_json_delta", "partial_json": event.fragment}))
            elif isinstance(event, TurnEnd):
                out += self._close()
                message_delta = {
                    "type": "message_delta",
                    "delta": {"stop_reason": self._stop_reason(event), "stop_sequence": event.stop_string},
                    "usage": _usage(event.usage),
                    **stop_fields(event),
                }
                out.append(named_sse("message_delta", message_delta))
                out.append(named_sse("message_stop", {"type": "message_stop"}))
        return "".join(out)

    def error_frame(self, error: APIError) -> str:
        return named_sse("error", error.anthropic_body())

    def _open(self, kind: str, block: dict) -> list[str]:
        out = self._close()
        self.index, self.open_kind = self.index + 1, kind
        out.append(
            named_sse(
                "content_block_start", {"type": "content_block_start", "index": self.index, "content_block": block}
            )
        )
        return out

    def _close(self) -> list[str]:
        if self.open_kind is None:
            return []
        self.open_kind = None
        return [named_sse("content_block_stop", {"type": "content_block_stop", "index": self.index})]

    def _delta(self, payload: dict) -> str:
        return named_sse("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": payload})

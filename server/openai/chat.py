"""POST /v1/chat/completions: chat with tools, tool_choice, parallel calls, reasoning, response_format.

Tool calls come back in OpenAI's shape: `message.tool_calls` and finish_reason "tool_calls";
streamed, a call's first `delta.tool_calls` fragment has its index, id and name, later ones
fragments of its arguments. Reasoning (for families that think) is `reasoning_content`. Every
finished response carries lingcode's `timings` (on the response, or on the stream's last choice
chunk); `stream_options.include_usage` adds a last chunk with `usage`.
"""

from __future__ import annotations

import time
import uuid

from starlette.requests import Request

from lingcode.agent.tool_parsers import CallArgs, CallStart
from lingcode.pipeline.turns import Content, Reasoning, Turn, TurnEnd, TurnEvent, TurnStart
from lingcode.server.openai.protocol import ChatCompletionRequest, json_format
from lingcode.server.serving import (
    DONE,
    Prepared,
    Serving,
    Shape,
    finish_reason,
    sse,
    stop_fields,
    timings_dict,
    usage_dict,
)


class ChatServing(Serving):
    path = "/v1/chat/completions"
    request_model = ChatCompletionRequest

    async def prepare(self, body: ChatCompletionRequest, request: Request) -> Prepared:
        tools, choice, sampling, grammar = (
            body.tool_list(),
            body.choice(),
            body.sampling(),
            json_format(body.response_format),
        )
        shape = ChatShape(f"chatcmpl-{uuid.uuid4().hex}", self.model_id, body.include_usage())
        input_ids, prompt = await self.prompt_ids(
            [m.for_template() for m in body.messages],
            tools,
            template_kwargs=body.template_variables(),
            opens=self.opening(body.stream, shape, sampling, tools, choice, grammar),
        )
        params, stop_loops = self.sampling_params(sampling, len(input_ids), "messages")
        spec = self.turn_spec(tools, choice, body.parallel_tool_calls is not False, prompt)
        turn = Turn(shape.request_id, input_ids, params, spec, body.stop_strings(), stop_loops=stop_loops)
        return Prepared(turn, shape, bool(body.stream), grammar)


class ChatShape(Shape):
    """chat.completion and chat.completion.chunk objects."""

    end_of_stream = DONE

    def __init__(self, request_id: str, model: str, include_usage: bool = False):
        self.request_id, self.model, self.include_usage = request_id, model, include_usage
        self.created = int(time.time())

    def _head(self, object_name: str) -> dict:
        return {"id": self.request_id, "object": object_name, "created": self.created, "model": self.model}

    def _chunk(self, delta: dict | None, finish_reason: str | None = None) -> dict:
        choices = (
            [] if delta is None else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]
        )
        chunk = {**self._head("chat.completion.chunk"), "choices": choices}
        if self.include_usage:
            chunk["usage"] = None  # OpenAI: null on every chunk but the usage chunk
        return chunk

    def whole(self, end: TurnEnd) -> dict:
        message: dict = {"role": "assistant", "content": end.content}
        if end.tool_calls:
            message["content"] = end.content or None
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in end.tool_calls
            ]
        if end.reasoning:
            message["reasoning_content"] = end.reasoning
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason(end)}
        return {
            **self._head("chat.completion"),
            "choices": [choice],
            "usage": usage_dict(end.usage),
            "timings": timings_dict(end.usage, end.timing),
            **stop_fields(end),
        }

    def opening(self, start: TurnStart | None = None) -> str:
        return sse(self._chunk({"role": "assistant", "content": ""}))  # OpenAI's first chunk: the role

    def frames(self, events: list[TurnEvent]) -> str:
        out = []
        for event in events:
            if isinstance(event, Content):
                out.append(sse(self._chunk({"content": event.text})))
            elif isinstance(event, Reasoning):
                out.append(sse(self._chunk({"reasoning_content": event.text})))
            elif isinstance(event, CallStart):  # its index, id and name, and empty arguments (OpenAI's order)
                call = {
                    "index": event.index,
                    "id": event.id,
                    "type": "function",
                    "function": {"name": event.name, "arguments": ""},
                }
                out.append(sse(self._chunk({"tool_calls": [call]})))
            elif isinstance(event, CallArgs):
                call = {"index": event.index, "function": {"arguments": event.fragment}}
                out.append(sse(self._chunk({"tool_calls": [call]})))
            elif isinstance(event, TurnEnd):
                out.append(sse(self.closing(event)))
                if self.include_usage:
                    out.append(sse({**self._chunk(None), "usage": usage_dict(event.usage)}))
        return "".join(out)

    def closing(self, end: TurnEnd) -> dict:
        """The stream's last choice chunk: the finish reason, and lingcode's timings."""
        return {
            **self._chunk({}, finish_reason(end)),
            "timings": timings_dict(end.usage, end.timing),
            **stop_fields(end),
        }

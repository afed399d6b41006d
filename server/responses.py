"""OpenAI's response shapes: whole responses and stream chunks, for chat and text completions.

Besides OpenAI's fields, every finished response carries `timings` (lingcode's: time to first
token, ms per output token, total, tokens/s, prompt and cached token counts), on the response
object, or on the stream's last choice chunk.
"""

from __future__ import annotations

import json
import time

from lingcode.pipeline.generation import Timing, Usage

DONE = "data: [DONE]\n\n"


def sse(payload: dict) -> str:
    """One server-sent event carrying a JSON object."""
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


def usage_dict(usage: Usage) -> dict:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


def timings_dict(usage: Usage | None, timing: Timing | None) -> dict:
    timings = timing.as_dict() if timing is not None else {}
    if usage is not None:
        timings.update(prompt_tokens=usage.prompt_tokens, cached_tokens=usage.cached_tokens,
                       completion_tokens=usage.completion_tokens)  # fmt: skip
    return timings


class Shape:
    """What both kinds share: id, created, model, and the usage-only chunk at a stream's end."""

    object_name: str
    chunk_object_name: str

    def __init__(self, request_id: str, model: str, include_usage: bool = False):
        self.request_id = request_id
        self.model = model
        self.created = int(time.time())
        self.include_usage = include_usage

    def _head(self, object_name: str) -> dict:
        return {"id": self.request_id, "object": object_name, "created": self.created, "model": self.model}

    def _chunk(self, choice: dict | None) -> dict:
        chunk = {**self._head(self.chunk_object_name), "choices": [choice] if choice else []}
        if self.include_usage:
            chunk["usage"] = None  # OpenAI: null on every chunk but the usage chunk
        return chunk

    def usage_chunk(self, usage: Usage) -> dict:
        """The extra last chunk that `stream_options.include_usage` asks for: no choices, usage."""
        return {**self._chunk(None), "usage": usage_dict(usage)}

    def response(self, text: str, finish_reason: str, usage: Usage, timing: Timing | None) -> dict:
        return {
            **self._head(self.object_name),
            "choices": [self._final_choice(text, finish_reason)],
            "usage": usage_dict(usage),
            "timings": timings_dict(usage, timing),
        }

    def closing(self, finish_reason: str, usage: Usage | None, timing: Timing | None) -> dict:
        """The stream's last choice chunk: the finish reason, and lingcode's timings."""
        return {**self._chunk(self._finish_choice(finish_reason)), "timings": timings_dict(usage, timing)}

    def opening(self) -> list[dict]:
        return []

    def _final_choice(self, text: str, finish_reason: str) -> dict:
        raise NotImplementedError

    def _finish_choice(self, finish_reason: str) -> dict:
        raise NotImplementedError

    def delta(self, text: str) -> dict:
        raise NotImplementedError


class ChatShape(Shape):
    object_name = "chat.completion"
    chunk_object_name = "chat.completion.chunk"

    def _final_choice(self, text: str, finish_reason: str) -> dict:
        message = {"role": "assistant", "content": text}
        return {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}

    def opening(self) -> list[dict]:
        # OpenAI's first chunk carries the role, and empty content.
        role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        return [self._chunk(role)]

    def delta(self, text: str) -> dict:
        return self._chunk({"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": None})

    def _finish_choice(self, finish_reason: str) -> dict:
        return {"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish_reason}

    # --- tool calls and reasoning (lingcode.pipeline.turns events) ---

    def turn_response(self, end) -> dict:
        """The whole response for a finished turn (lingcode.pipeline.turns.TurnEnd)."""
        response = self.response(end.content, end.finish_reason, end.usage, end.timing)
        message = response["choices"][0]["message"]
        if end.tool_calls:
            message["content"] = end.content or None
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in end.tool_calls
            ]
        if end.reasoning:
            message["reasoning_content"] = end.reasoning
        return response

    def _delta_chunk(self, delta: dict) -> dict:
        return self._chunk({"index": 0, "delta": delta, "logprobs": None, "finish_reason": None})

    def reasoning_delta(self, text: str) -> dict:
        return self._delta_chunk({"reasoning_content": text})

    def tool_call_start(self, index: int, call_id: str, name: str) -> dict:
        """The first fragment of a call: its index, id and name, and empty arguments (OpenAI's order)."""
        call = {"index": index, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}
        return self._delta_chunk({"tool_calls": [call]})

    def tool_call_arguments(self, index: int, fragment: str) -> dict:
        return self._delta_chunk({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]})


class CompletionShape(Shape):
    object_name = "text_completion"
    chunk_object_name = "text_completion"

    def _final_choice(self, text: str, finish_reason: str) -> dict:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}

    def delta(self, text: str) -> dict:
        return self._chunk({"index": 0, "text": text, "logprobs": None, "finish_reason": None})

    def _finish_choice(self, finish_reason: str) -> dict:
        return {"index": 0, "text": "", "logprobs": None, "finish_reason": finish_reason}

"""OpenAI Responses: POST /v1/responses, enough for Codex CLI (`wire_api = "responses"`).

Output items: a `reasoning` item (families that think), a `message` with one `output_text`
part, and one `function_call` item per tool call. Streamed, the events come in OpenAI's order,
each with a `sequence_number`:

    response.created, response.in_progress,
    per item: response.output_item.added,
        message:       response.content_part.added, response.output_text.delta..., response.output_text.done,
                       response.content_part.done
        function_call: response.function_call_arguments.delta..., response.function_call_arguments.done
        reasoning:     response.reasoning_text.delta..., response.reasoning_text.done
    response.output_item.done, ..., then response.completed (or response.incomplete at max_output_tokens)
"""

from __future__ import annotations

import time
import uuid

from starlette.requests import Request

from lingcode.agent.tool_parsers import CallArgs, CallStart
from lingcode.pipeline.generation import Usage
from lingcode.pipeline.turns import Content, Reasoning, Turn, TurnEnd, TurnEvent, TurnStart
from lingcode.text.families import Defaults
from lingcode.server.errors import APIError, invalid
from lingcode.server.responses.protocol import ResponsesRequest
from lingcode.server.serving import Prepared, Serving, Shape, named_sse, stop_fields


class ResponsesServing(Serving):
    path = "/v1/responses"
    request_model = ResponsesRequest

    async def prepare(self, body: ResponsesRequest, request: Request) -> Prepared:
        try:
            messages, json_format = body.chat_messages(), body.json_format()
        except ValueError as exc:
            raise invalid(str(exc), param="input") from None
        tools, choice, sampling = body.tool_list(), body.choice(), body.sampling()
        shape = ResponseShape(f"resp_{uuid.uuid4().hex}", body.model or self.model_id, body, self.family.defaults)
        input_ids, prompt = await self.prompt_ids(
            messages,
            tools,
            param="input",
            template_kwargs=body.template_variables(),
            opens=self.opening(body.stream, shape, sampling, tools, choice, json_format),
        )
        params, stop_loops = self.sampling_params(sampling, len(input_ids), "input")
        spec = self.turn_spec(tools, choice, body.parallel_tool_calls is not False, prompt)
        turn = Turn(shape.id, input_ids, params, spec, body.stop_strings(), stop_loops=stop_loops)
        return Prepared(turn, shape, bool(body.stream), json_format, grammar_param="text.format")


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def _usage(usage: Usage) -> dict:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.total_tokens,
    }


def _message(item_id: str, text: str, status: str) -> dict:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {
        "id": item_id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [part] if status == "completed" else [],
    }


def _reasoning(item_id: str, text: str) -> dict:
    return {"id": item_id, "type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": text}]}


def _function_call(
    item_id: str, call_id: str, name: str, arguments: str, status: str, namespace: str | None = None
) -> dict:
    item = {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }
    if namespace:
        item["namespace"] = namespace
    return item


class ResponseShape(Shape):
    def __init__(self, response_id: str, model: str, body: ResponsesRequest, defaults: Defaults = Defaults()):
        self.id, self.model, self.body = response_id, model, body
        # the response says what it was sampled with: the family's default for a field left out
        self.temperature = defaults.temperature if body.temperature is None else body.temperature
        self.top_p = defaults.top_p if body.top_p is None else body.top_p
        self.namespaces = body.namespaces()
        self.created_at = int(time.time())
        self.sequence = 0
        self.done: list[dict] = []  # finished output items (streamed)
        self.current: dict | None = None  # the item being written: {"kind", "id", "text", ...}

    def _response(self, status: str, output: list[dict], end: TurnEnd | None = None) -> dict:
        body = self.body
        fmt = (
            body.text.format.model_dump(by_alias=True, exclude_none=True)
            if body.text and body.text.format
            else {"type": "text"}
        )
        choice = (
            body.tool_choice.model_dump() if hasattr(body.tool_choice, "model_dump") else (body.tool_choice or "auto")
        )
        response = {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": None,
            "incomplete_details": None,
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": None,
            "store": False,
            "reasoning": {"effort": body.reasoning.effort if body.reasoning else None, "summary": None},
            "temperature": self.temperature,
            "text": {"format": fmt},
            "tool_choice": choice,
            "tools": [t.model_dump(exclude_none=True, exclude={"namespace"}) for t in body.tools or []],
            "top_p": self.top_p,
            "truncation": "disabled",
            "usage": None,
            "metadata": {},
        }
        if end is not None:
            response["usage"] = _usage(end.usage)
            response["timings"] = end.timing.as_dict() if end.timing else {}
            if end.finish_reason == "length":
                response["incomplete_details"] = {"reason": "max_output_tokens"}
            response.update(stop_fields(end))
        return response

    def whole(self, end: TurnEnd) -> dict:
        output = []
        if end.reasoning:
            output.append(_reasoning(_item_id("rs"), end.reasoning))
        if end.content or not end.tool_calls:
            output.append(_message(_item_id("msg"), end.content, "completed"))
        output += [
            _function_call(_item_id("fc"), c.id, c.name, c.arguments, "completed", self.namespaces.get(c.name))
            for c in end.tool_calls
        ]
        return self._response("incomplete" if end.finish_reason == "length" else "completed", output, end)

    def _event(self, name: str, payload: dict) -> str:
        payload = {"type": name, "sequence_number": self.sequence, **payload}
        self.sequence += 1
        return named_sse(name, payload)

    def opening(self, start: TurnStart | None = None) -> str:
        return self._event("response.created", {"response": self._response("in_progress", [])}) + self._event(
            "response.in_progress", {"response": self._response("in_progress", [])}
        )

    def frames(self, events: list[TurnEvent]) -> str:
        out: list[str] = []
        for event in events:
            current = self.current
            if isinstance(event, Reasoning):
                if current is None or current["kind"] != "reasoning":
                    out += self._open_item("reasoning")
                self.current["text"] += event.text
                out.append(
                    self._event(
                        "response.reasoning_text.delta",
                        {
                            "item_id": self.current["id"],
                            "output_index": len(self.done),
                            "content_index": 0,
                            "delta": event.text,
                        },
                    )
                )
            elif isinstance(event, Content):
                if current is None or current["kind"] != "message":
                    out += self._open_item("message")
                self.current["text"] += event.text
                out.append(
                    self._event(
                        "response.output_text.delta",
                        {
                            "item_id": self.current["id"],
                            "output_index": len(self.done),
                            "content_index": 0,
                            "delta": event.text,
                            "logprobs": [],
                        },
                    )
                )
            elif isinstance(event, CallStart):
                out += self._open_item("function_call", call_id=event.id, name=event.name)
            elif isinstance(event, CallArgs):
                self.current["text"] += event.fragment
                out.append(
                    self._event(
                        "response.function_call_arguments.delta",
                        {"item_id": self.current["id"], "output_index": len(self.done), "delta": event.fragment},
                    )
                )
            elif isinstance(event, TurnEnd):
                if not self.done and self.current is None:  # an empty answer is still one (empty) message
                    out += self._open_item("message")
                out += self._close_item()
                status = "incomplete" if event.finish_reason == "length" else "completed"
                out.append(self._event(f"response.{status}", {"response": self._response(status, self.done, event)}))
        return "".join(out)

    def error_frame(self, error: APIError) -> str:
        return self._event("error", {"code": error.code, "message": error.message, "param": error.param})

    def _close_item(self) -> list[str]:
        item, self.current, index = self.current, None, len(self.done)
        if item is None:
            return []
        out = []
        if item["kind"] == "message":
            part = {"type": "output_text", "text": item["text"], "annotations": [], "logprobs": []}
            out.append(
                self._event(
                    "response.output_text.done",
                    {
                        "item_id": item["id"],
                        "output_index": index,
                        "content_index": 0,
                        "text": item["text"],
                        "logprobs": [],
                    },
                )
            )
            out.append(
                self._event(
                    "response.content_part.done",
                    {"item_id": item["id"], "output_index": index, "content_index": 0, "part": part},
                )
            )
            final = _message(item["id"], item["text"], "completed")
        elif item["kind"] == "reasoning":
            out.append(
                self._event(
                    "response.reasoning_text.done",
                    {"item_id": item["id"], "output_index": index, "content_index": 0, "text": item["text"]},
                )
            )
            final = _reasoning(item["id"], item["text"])
        else:
            out.append(
                self._event(
                    "response.function_call_arguments.done",
                    {"item_id": item["id"], "output_index": index, "arguments": item["text"]},
                )
            )
            final = _function_call(
                item["id"], item["call_id"], item["name"], item["text"], "completed", self.namespaces.get(item["name"])
            )
        out.append(self._event("response.output_item.done", {"output_index": index, "item": final}))
        self.done.append(final)
        return out

    def _open_item(self, kind: str, **extra) -> list[str]:
        out = self._close_item()
        self.current = {
            "kind": kind,
            "id": _item_id({"message": "msg", "reasoning": "rs", "function_call": "fc"}[kind]),
            "text": "",
            **extra,
        }
        index = len(self.done)
        if kind == "message":
            item = _message(self.current["id"], "", "in_progress")
        elif kind == "reasoning":
            item = {"id": self.current["id"], "type": "reasoning", "summary": [], "content": []}
        else:
            item = _function_call(
                self.current["id"],
                extra["call_id"],
                extra["name"],
                "",
                "in_progress",
                self.namespaces.get(extra["name"]),
            )
        out.append(self._event("response.output_item.added", {"output_index": index, "item": item}))
        if kind == "message":
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            out.append(
                self._event(
                    "response.content_part.added",
                    {"item_id": self.current["id"], "output_index": index, "content_index": 0, "part": part},
                )
            )
        return out

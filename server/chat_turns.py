"""POST /v1/chat/completions as a turn: tools, tool_choice, parallel calls, reasoning, response_format.

Tool calls come back in OpenAI's shape: `message.tool_calls` and finish_reason "tool_calls";
streamed, a call's first `delta.tool_calls` fragment has its index, id and name, later ones
fragments of its arguments. Reasoning (for families that think) is `reasoning_content`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import Response

from lingcode.engine import ModelInfo
from lingcode.text.families import family_for
from lingcode.pipeline.scheduler import Scheduler
from lingcode.server import inputs
from lingcode.server.errors import APIError
from lingcode.server.openai_api import ChatCompletionRequest
from lingcode.server.responses import DONE, ChatShape, sse
from lingcode.server.turn_runner import as_api_error, constrained, respond
from lingcode.agent.tool_parsers import CallArgs, CallStart
from lingcode.pipeline.turns import Content, Reasoning, TurnEnd, TurnEvent, TurnSpec, run_turn, starts_in_reasoning

log = logging.getLogger("lingcode.server")


async def chat_turn(request: Request, scheduler: Scheduler, info: ModelInfo, model_id: str,
                    body: ChatCompletionRequest) -> Response:  # fmt: skip
    family = family_for(info)
    tools = body.tool_list()
    prompt = inputs.chat_prompt(info, [m.for_template() for m in body.messages], tools, family,
                                template_kwargs=body.template_variables())  # fmt: skip
    input_ids = info.tokenizer.encode(prompt)
    params = inputs.sampling_params(info, body, len(input_ids), "messages")
    spec = TurnSpec(family, tuple(tools), body.choice(), body.parallel_tool_calls is not False,
                    starts_in_reasoning(family, prompt))  # fmt: skip
    params = await constrained(info, params, spec, json_format(body), "tool_choice" if spec.forced_tools() else "response_format")
    shape = ChatShape(f"chatcmpl-{uuid.uuid4().hex}", model_id, body.include_usage())
    events = run_turn(scheduler, info, shape.request_id, input_ids, params, spec, body.stop_strings())
    return await respond(request, events, bool(body.stream), shape.turn_response, lambda ev: chat_sse(ev, shape))


def json_format(body: ChatCompletionRequest) -> tuple[str, dict | None] | None:
    fmt = body.response_format
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return ("json", None)
    return ("json_schema", fmt.json_schema.schema_)


async def chat_sse(events: AsyncIterator[TurnEvent], shape: ChatShape) -> AsyncIterator[str]:
    """Opening chunk, deltas (content, reasoning_content, tool_calls), the finish chunk, [usage], [DONE]."""
    try:
        for payload in shape.opening():
            yield sse(payload)
        async for event in events:
            if isinstance(event, Content):
                yield sse(shape.delta(event.text))
            elif isinstance(event, Reasoning):
                yield sse(shape.reasoning_delta(event.text))
            elif isinstance(event, CallStart):
                yield sse(shape.tool_call_start(event.index, event.id, event.name))
            elif isinstance(event, CallArgs):
                yield sse(shape.tool_call_arguments(event.index, event.fragment))
            elif isinstance(event, TurnEnd):
                yield sse(shape.closing(event.finish_reason, event.usage, event.timing))
                if shape.include_usage:
                    yield sse(shape.usage_chunk(event.usage))
    except Exception as exc:  # the response has started: report in the stream, as OpenAI does
        error = as_api_error(exc)
        if error is None:
            log.exception("stream %s failed", shape.request_id)
            error = APIError(500, "internal server error; the daemon's log has the details")
        yield sse(error.body())
    finally:
        await events.aclose()
    yield DONE

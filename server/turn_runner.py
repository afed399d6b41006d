"""Running a lingcode.pipeline.turns turn for any API: the request's inputs, then one response or a stream.

The same rules as the plain OpenAI routes (server/openai_routes.py): a streamed response starts
only once the turn has its first event, so a full queue (429), a context overflow or a missing
grammar package is still a proper HTTP error; a client that leaves is cancelled at once.
Each API only supplies how to shape a finished turn and how to shape its event stream.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from lingcode.engine import EngineError, ModelInfo, SamplingParams
from lingcode.agent.grammar import GrammarError, GrammarUnavailable
from lingcode.server.errors import APIError
from lingcode.server.openai_routes import as_api_error as _base_api_error
from lingcode.server.streaming import ClientGone, EventStream, aclose, until_disconnected
from lingcode.pipeline.turns import TurnEnd, TurnEvent, TurnSpec, json_constraint, tool_constraint


def as_api_error(exc: BaseException) -> APIError | None:
    if isinstance(exc, GrammarUnavailable):
        return APIError(400, str(exc), code="grammar_unavailable")
    if isinstance(exc, GrammarError):
        return APIError(400, str(exc), code="invalid_grammar")
    return _base_api_error(exc)


async def constrained(info: ModelInfo, params: SamplingParams, spec: TurnSpec,
                      json_format: tuple[str, dict | None] | None, param: str) -> SamplingParams:  # fmt: skip
    """params with the grammar this turn needs: a forced tool call, else a JSON response format, else none.

    json_format: None, ("json", None) for any JSON object, ("json_schema", schema). Compiling a
    grammar can take a while (the first one also indexes the vocabulary): it runs on a thread, so
    the event loop keeps streaming other responses meanwhile.
    """

    def build():
        if spec.forced_tools() is not None:
            return tool_constraint(info, spec)
        return json_constraint(info, json_format[1]) if json_format is not None else None

    if spec.forced_tools() is None and json_format is None:
        return params
    try:
        constraint = await asyncio.to_thread(build)
    except (GrammarUnavailable, GrammarError) as exc:
        error = as_api_error(exc)
        error.param = param
        raise error from None
    return params if constraint is None else dataclasses.replace(params, constraint=constraint)


async def respond(
    request: Request,
    events: AsyncIterator[TurnEvent],
    stream: bool,
    whole: Callable[[TurnEnd], dict],
    streamed: Callable[[AsyncIterator[TurnEvent]], AsyncIterator[str]],
) -> Response:
    """One JSON response (whole(turn end)) or an SSE stream (streamed(all events, first included))."""
    try:
        if stream:
            first = await until_disconnected(request, _first(events))
            return EventStream(streamed(_chain(first, events)))
        end = await until_disconnected(request, last_event(events))
        return JSONResponse(whole(end))
    except ClientGone:
        return Response(status_code=499)  # nobody reads it; uvicorn drops it
    except Exception as exc:
        await aclose(events)
        error = as_api_error(exc)
        if error is None:
            raise
        raise error from None


async def _first(events: AsyncIterator[TurnEvent]) -> TurnEvent:
    try:
        return await anext(events)
    except BaseException:
        await aclose(events)
        raise


async def _chain(first: TurnEvent, events: AsyncIterator[TurnEvent]) -> AsyncIterator[TurnEvent]:
    try:
        yield first
        if not isinstance(first, TurnEnd):
            async for event in events:
                yield event
    finally:
        await aclose(events)


async def last_event(events: AsyncIterator[TurnEvent]) -> TurnEnd:
    try:
        async for event in events:
            if isinstance(event, TurnEnd):
                return event
    finally:
        await aclose(events)
    raise EngineError("the turn ended without a finish reason")

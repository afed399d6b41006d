"""POST /v1/chat/completions and POST /v1/completions: OpenAI's routes on the one served model.

Both run the same way: validate the body, build the prompt's token ids (context checked), then
stream text through lingcode.pipeline.generation.generate_text, which handles detokenization, stop strings,
usage and timing. A streamed response starts only once the request has its first text, so that
a full queue (429), a context overflow (400) or an engine failure is still a proper HTTP error; a
client that leaves while waiting, or mid-stream, has its request dropped or aborted at once.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from lingcode.engine import ContextOverflow, EngineError, EngineUnavailable, ModelInfo, SamplingParams
from lingcode.pipeline.generation import TextChunk, generate_text
from lingcode.pipeline.scheduler import QueueFull, Scheduler
from lingcode.server import inputs
from lingcode.server.body import read_json
from lingcode.server.errors import APIError
from lingcode.server.openai_api import ChatCompletionRequest, CompletionRequest
from lingcode.server.openapi import request_body
from lingcode.server.responses import DONE, CompletionShape, Shape, sse
from lingcode.server.streaming import ClientGone, EventStream, aclose, until_disconnected
from lingcode.server.validation import parse

log = logging.getLogger("lingcode.server")

RETRY_AFTER_S = "1"


def as_api_error(exc: BaseException) -> APIError | None:
    """The client-facing error for what generation can raise; None for a bug (a plain 500)."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, QueueFull):
        return APIError(429, str(exc), code="queue_full", headers={"Retry-After": RETRY_AFTER_S})
    if isinstance(exc, ContextOverflow):
        return APIError(400, str(exc), code="context_length_exceeded")
    if isinstance(exc, EngineUnavailable):  # e.g. SGLang restarting after a crash
        return APIError(503, str(exc), code="engine_unavailable", headers={"Retry-After": RETRY_AFTER_S})
    if isinstance(exc, EngineError):
        return APIError(500, str(exc), code="engine_error")
    return None


class OpenAIRoutes:
    def __init__(self, scheduler: Scheduler, info: ModelInfo, model_id: str, max_body_bytes: int):
        self.scheduler = scheduler
        self.info = info
        self.model_id = model_id
        self.max_body_bytes = max_body_bytes

    def install(self, app: FastAPI) -> None:
        app.add_api_route("/v1/chat/completions", self.chat, methods=["POST"],
                          openapi_extra=request_body(ChatCompletionRequest))  # fmt: skip
        app.add_api_route("/v1/completions", self.completions, methods=["POST"],
                          openapi_extra=request_body(CompletionRequest))  # fmt: skip

    async def chat(self, request: Request) -> Response:
        """Chat with tools, reasoning and response formats: a lingcode.pipeline.turns turn (server/chat_turns.py)."""
        from lingcode.server.chat_turns import chat_turn

        body = parse(ChatCompletionRequest, await read_json(request, self.max_body_bytes))
        return await chat_turn(request, self.scheduler, self.info, self.model_id, body)

    async def completions(self, request: Request) -> Response:
        body = parse(CompletionRequest, await read_json(request, self.max_body_bytes))
        input_ids = inputs.completion_prompt_ids(self.info, body)
        params = inputs.sampling_params(self.info, body, len(input_ids), "prompt")
        shape = CompletionShape(f"cmpl-{uuid.uuid4().hex}", self.model_id, body.include_usage())
        return await self._run(request, shape, input_ids, params, body.stop_strings(), bool(body.stream))

    async def _run(
        self, request: Request, shape: Shape, input_ids: list[int], params: SamplingParams,
        stop: list[str], stream: bool,
    ) -> Response:  # fmt: skip
        text = generate_text(self.scheduler, self.info.tokenizer, shape.request_id, input_ids, params, stop)
        try:
            if stream:
                first = await until_disconnected(request, _first(text))
                return EventStream(_events(text, first, shape))
            whole, last = await until_disconnected(request, _collect(text))
            return JSONResponse(shape.response(whole, last.finish_reason, last.usage, last.timing))
        except ClientGone:
            return Response(status_code=499)  # nobody reads it; uvicorn drops it
        except Exception as exc:
            await aclose(text)
            error = as_api_error(exc)
            if error is None:
                raise
            raise error from None


async def _first(text: AsyncIterator[TextChunk]) -> TextChunk:
    """The stream's first chunk: the request has waited its turn and the model has started."""
    try:
        return await anext(text)
    except BaseException:
        await aclose(text)
        raise


async def _collect(text: AsyncIterator[TextChunk]) -> tuple[str, TextChunk]:
    """All the text, and the last chunk (finish reason, usage, timing)."""
    parts: list[str] = []
    try:
        async for chunk in text:
            parts.append(chunk.text)
            if chunk.finish_reason is not None:
                return "".join(parts), chunk
    finally:
        await aclose(text)
    raise EngineError("the text stream ended without a finish reason")


async def _events(text: AsyncIterator[TextChunk], first: TextChunk, shape: Shape) -> AsyncIterator[str]:
    """The SSE body: opening chunk, text deltas, the finish chunk, [usage chunk], [DONE]."""
    try:
        for payload in shape.opening():
            yield sse(payload)
        chunk: TextChunk | None = first
        while chunk is not None:
            if chunk.text:
                yield sse(shape.delta(chunk.text))
            if chunk.finish_reason is not None:
                yield sse(shape.closing(chunk.finish_reason, chunk.usage, chunk.timing))
                if shape.include_usage and chunk.usage is not None:
                    yield sse(shape.usage_chunk(chunk.usage))
                break
            chunk = await anext(text, None)
    except Exception as exc:  # the response has started: report in the stream, as OpenAI does
        error = as_api_error(exc)
        if error is None:
            log.exception("stream %s failed", shape.request_id)
            error = APIError(500, "internal server error; the daemon's log has the details")
        yield sse(error.body())
    finally:
        await aclose(text)
    yield DONE

"""POST /v1/lingcode/complete: code completion at a cursor, for editors (`lingcode lsp` uses it).

    {"prefix": "def add(a, b):\\n    ", "suffix": "\\n", "path": "src/calc.py", "language": "python",
     "repo": "calc", "context": [{"path": "src/util.py", "text": "..."}], "document": "file:///.../calc.py",
     "max_tokens": 64, "time_budget_ms": 500, "multiline": null, "stream": false}

The prompt is built per model family (lingcode.completion.prompt) and generation stops where the
cut rules say (lingcode.completion.cuts: one line mid-line, the block's indentation, no repeat of
the suffix, the time budget). Completions run before chat and agent work (Priority.COMPLETION),
and one sent with a `document` cancels the previous one for that document (latest wins).

The answer: {"text", "finish_reason", "cut", "usage", "timings", "prompt"}; streamed, `text`
deltas then one event with the rest, then `data: [DONE]`. A client that goes away has its request
aborted in the engine within a step.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import replace

from fastapi import FastAPI
from pydantic import Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from lingcode.completion.cuts import CutRules
from lingcode.completion.prompt import Budgets, Chunk, CompletionInput, CompletionPrompt, build_prompt
from lingcode.engine import ModelInfo, SamplingParams
from lingcode.pipeline.generation import TextChunk, generate_text
from lingcode.pipeline.scheduler import Priority, Scheduler
from lingcode.server.body import read_json
from lingcode.server.errors import APIError
from lingcode.server.openai_routes import as_api_error
from lingcode.server.openapi import request_body
from lingcode.server.responses import DONE, sse, timings_dict, usage_dict
from lingcode.server.streaming import ClientGone, EventStream, aclose, close_soon, until_disconnected
from lingcode.server.validation import StrictModel, TokenCount, TopP, parse

MAX_CONTEXT_CHUNKS = 32


class ContextChunk(StrictModel):
    path: str = Field(max_length=4096)
    text: str


class BudgetsBody(StrictModel):
    prefix_tokens: int = Field(Budgets.prefix_tokens, ge=0)
    suffix_tokens: int = Field(Budgets.suffix_tokens, ge=0)
    context_tokens: int = Field(Budgets.context_tokens, ge=0)


class CompleteRequest(StrictModel):
    prefix: str
    suffix: str = ""
    path: str | None = Field(None, max_length=4096)
    language: str | None = Field(None, max_length=64)
    repo: str | None = Field(None, max_length=256)
    context: list[ContextChunk] = Field(default_factory=list, max_length=MAX_CONTEXT_CHUNKS)
    document: str | None = Field(None, max_length=8192)  # latest wins per document
    max_tokens: TokenCount = Field(64, le=1024)
    time_budget_ms: float | None = Field(500, ge=0)  # null: no time budget
    multiline: bool | None = None  # null: decided by the cursor (one line mid-line)
    temperature: float = Field(0.0, ge=0, le=2)
    top_p: TopP = 1.0
    seed: int | None = Field(None, ge=0, lt=2**63)
    budgets: BudgetsBody = Field(default_factory=BudgetsBody)
    stream: bool = False


class CompletionRoutes:
    def __init__(self, scheduler: Scheduler, info: ModelInfo, model_id: str, max_body_bytes: int):
        self.scheduler = scheduler
        self.info = info
        self.model_id = model_id
        self.max_body_bytes = max_body_bytes
        self._counters = dict.fromkeys(("requests", "finished", "aborted", "client_gone", "errors"), 0)
        self._cuts: dict[str, int] = {}
        # The tokens whose text holds a newline: a single-line suggestion ends with the first one.
        tok = info.tokenizer
        self._newline_ids = frozenset(i for i in range(tok.vocab_size) if "\n" in tok.decode([i]))

    def install(self, app: FastAPI) -> None:
        app.add_api_route("/v1/lingcode/complete", self.complete, methods=["POST"],
                          openapi_extra=request_body(CompleteRequest))  # fmt: skip

    def stats(self) -> dict:
        return {**self._counters, "cuts": dict(self._cuts)}

    async def complete(self, request: Request) -> Response:
        body = parse(CompleteRequest, await read_json(request, self.max_body_bytes))
        prompt = self._prompt(body)
        params = SamplingParams(body.max_tokens, temperature=body.temperature, top_p=body.top_p, seed=body.seed)
        cut = CutRules(body.prefix, body.suffix, multiline=body.multiline, time_budget_ms=body.time_budget_ms)
        if cut.single_line:  # the engine ends the request at the line's end itself: the cut would
            # abort it there too, but only once the engine had gone on to another step
            params = replace(params, final_token_ids=self._newline_ids)
        request_id = f"lccmpl-{uuid.uuid4().hex}"
        latest_wins = f"complete:{body.document}" if body.document else None
        self._counters["requests"] += 1
        text = generate_text(self.scheduler, self.info.tokenizer, request_id, prompt.input_ids, params, cut=cut,
                             priority=Priority.COMPLETION, latest_wins=latest_wins)  # fmt: skip
        result = _Result(request_id, self.model_id, prompt, cut, on_done=self._count)
        try:
            if body.stream:
                first = await until_disconnected(request, anext(text))
                return EventStream(result.events(text, first))
            last = await until_disconnected(request, result.collect(text))
            return JSONResponse(result.final(last, text=result.text))
        except ClientGone:
            await aclose(text)
            self._counters["client_gone"] += 1
            return Response(status_code=499)  # nobody reads it; uvicorn drops it
        except Exception as exc:
            await aclose(text)
            self._counters["errors"] += 1
            error = as_api_error(exc)
            if error is None:
                raise
            raise error from None

    def _prompt(self, body: CompleteRequest) -> CompletionPrompt:
        request = CompletionInput(
            prefix=body.prefix, suffix=body.suffix, path=body.path, language=body.language, repo=body.repo,
            context=tuple(Chunk(c.path, c.text) for c in body.context),
        )  # fmt: skip
        budgets = Budgets(**body.budgets.model_dump())
        prompt = build_prompt(self.info, request, budgets)
        context = self.info.context_length
        if len(prompt.input_ids) + body.max_tokens > context:
            raise APIError(
                400,
                f"The completion prompt ({len(prompt.input_ids)} tokens within the budgets sent) plus "
                f"max_tokens ({body.max_tokens}) is over the model's context of {context} tokens; "
                "send smaller budgets or max_tokens",
                param="budgets",
                code="context_length_exceeded",
            )
        return prompt

    def _count(self, last: TextChunk, cut: CutRules) -> None:
        self._counters["finished" if last.finish_reason != "abort" else "aborted"] += 1
        reason = cut.reason or ("eos" if last.finish_reason == "stop" else last.finish_reason)
        self._cuts[reason] = self._cuts.get(reason, 0) + 1


class _Result:
    """One completion's answer, collected or streamed."""

    def __init__(self, request_id: str, model: str, prompt: CompletionPrompt, cut: CutRules, on_done):
        self.request_id, self.model, self.prompt, self.cut, self.on_done = request_id, model, prompt, cut, on_done
        self.text = ""

    async def collect(self, text: AsyncIterator[TextChunk]) -> TextChunk:
        try:
            async for chunk in text:
                self.text += chunk.text
                if chunk.finish_reason is not None:
                    # The answer is whole: send it now. When a cut rule ended it, the engine is one
                    # step further on; closing aborts that step, and the editor need not wait for it
                    # (the scheduler holds the engine until it is done).
                    close_soon(text)
                    return chunk
        except BaseException:
            await aclose(text)
            raise
        await aclose(text)
        raise RuntimeError("the text stream ended without a finish reason")

    def final(self, last: TextChunk, **extra) -> dict:
        self.on_done(last, self.cut)
        cut = self.cut.reason if last.finish_reason != "abort" else None
        return {
            "id": self.request_id, "object": "lingcode.completion", "model": self.model, **extra,
            "finish_reason": last.finish_reason, "cut": cut, "usage": usage_dict(last.usage),
            "timings": timings_dict(last.usage, last.timing), "prompt": self.prompt.as_dict(),
        }  # fmt: skip

    async def events(self, text: AsyncIterator[TextChunk], first: TextChunk) -> AsyncIterator[str]:
        head = {"id": self.request_id, "object": "lingcode.completion.chunk", "model": self.model}
        try:
            chunk: TextChunk | None = first
            while chunk is not None:
                if chunk.text:
                    yield sse({**head, "text": chunk.text})
                if chunk.finish_reason is not None:
                    yield sse({**self.final(chunk), "object": "lingcode.completion.chunk"})
                    break
                chunk = await anext(text, None)
        except Exception as exc:  # the response has started: report in the stream
            error = as_api_error(exc) or APIError(500, "internal server error; the daemon's log has the details")
            yield sse(error.body())
        finally:
            await aclose(text)
        yield DONE

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
from dataclasses import replace

from pydantic import Field
from starlette.requests import Request
from starlette.responses import Response

from lingcode.completion.cuts import CutRules
from lingcode.completion.prompt import (
    Budgets,
    Chunk,
    CompletionInput,
    CompletionPrompt,
    build_prompt,
    completion_family,
)
from lingcode.engine import SamplingParams
from lingcode.pipeline.scheduler import Priority
from lingcode.pipeline.turns import Content, Turn, TurnEnd, TurnEvent
from lingcode.server.errors import APIError
from lingcode.server.serving import DONE, Prepared, Serving, Shape, sse, timings_dict, usage_dict
from lingcode.server.errors import CLIENT_GONE
from lingcode.server.validation import StrictModel, TokenCount, TopP

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


class EditorServing(Serving):
    path = "/v1/lingcode/complete"
    request_model = CompleteRequest

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.completion_family = completion_family(self.info)
        self._counters = dict.fromkeys(("requests", "finished", "aborted", "client_gone", "errors"), 0)
        self._cuts: dict[str, int] = {}
        # The tokens whose text holds a newline: a single-line suggestion ends with the first one.
        tok = self.info.tokenizer
        if (pieces := tok.token_bytes) is not None:
            self._newline_ids = frozenset(i for i, piece in enumerate(pieces) if b"\n" in piece)
        else:
            self._newline_ids = frozenset(i for i in range(tok.vocab_size) if "\n" in tok.decode([i]))
        # A control token is never code: past the middle a FIM model writes <|endoftext|>, or starts
        # another file (<|file_sep|>) or turn; each ends the suggestion.
        self._stop_ids = tuple(sorted(tok.special_ids))

    def stats(self) -> dict:
        return {**self._counters, "cuts": dict(self._cuts)}

    async def handle(self, request: Request) -> Response:
        try:
            response = await super().handle(request)
        except APIError as exc:
            if exc.status >= 500 or exc.code in ("queue_full", "engine_unavailable"):
                self._counters["errors"] += 1
            raise
        except Exception:
            self._counters["errors"] += 1
            raise
        if response.status_code == CLIENT_GONE:
            self._counters["client_gone"] += 1
        return response

    async def prepare(self, body: CompleteRequest, request: Request) -> Prepared:
        prompt = self._prompt(body)
        params = SamplingParams(
            body.max_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            seed=body.seed,
            stop_token_ids=self._stop_ids,
        )
        cut = CutRules(body.prefix, body.suffix, multiline=body.multiline, time_budget_ms=body.time_budget_ms)
        if cut.single_line:  # the engine ends the request at the line's end itself: the cut would
            # abort it there too, but only once the engine had gone on to another step
            params = replace(params, final_token_ids=self._newline_ids)
        shape = EditorShape(f"lccmpl-{uuid.uuid4().hex}", self.model_id, prompt, cut, self._count)
        self._counters["requests"] += 1
        turn = Turn(
            shape.request_id,
            prompt.input_ids,
            params,
            cut=cut,
            priority=Priority.COMPLETION,
            latest_wins=f"complete:{body.document}" if body.document else None,
        )
        return Prepared(turn, shape, body.stream)

    def _prompt(self, body: CompleteRequest) -> CompletionPrompt:
        request = CompletionInput(
            prefix=body.prefix,
            suffix=body.suffix,
            path=body.path,
            language=body.language,
            repo=body.repo,
            context=tuple(Chunk(c.path, c.text) for c in body.context),
        )
        budgets = Budgets(**body.budgets.model_dump())
        prompt = build_prompt(self.info, request, budgets, self.completion_family)
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

    def _count(self, end: TurnEnd, cut: CutRules) -> None:
        self._counters["finished" if end.finish_reason != "abort" else "aborted"] += 1
        reason = cut.reason or ("eos" if end.finish_reason == "stop" else end.finish_reason)
        self._cuts[reason] = self._cuts.get(reason, 0) + 1


class EditorShape(Shape):
    """lingcode.completion objects: whole, or `text` deltas then the final object, then [DONE]."""

    end_of_stream = DONE

    def __init__(self, request_id: str, model: str, prompt: CompletionPrompt, cut: CutRules, on_done):
        self.request_id, self.model, self.prompt, self.cut, self.on_done = request_id, model, prompt, cut, on_done

    def whole(self, end: TurnEnd) -> dict:
        return self._final(end, text=end.content)

    def frames(self, events: list[TurnEvent]) -> str:
        head = {"id": self.request_id, "object": "lingcode.completion.chunk", "model": self.model}
        out = []
        for event in events:
            if isinstance(event, Content):
                out.append(sse({**head, "text": event.text}))
            elif isinstance(event, TurnEnd):
                out.append(sse({**self._final(event), "object": "lingcode.completion.chunk"}))
        return "".join(out)

    def _final(self, end: TurnEnd, **extra) -> dict:
        self.on_done(end, self.cut)
        cut = self.cut.reason if end.finish_reason != "abort" else None
        return {
            "id": self.request_id,
            "object": "lingcode.completion",
            "model": self.model,
            **extra,
            "finish_reason": end.finish_reason,
            "cut": cut,
            "usage": usage_dict(end.usage),
            "timings": timings_dict(end.usage, end.timing),
            "prompt": self.prompt.as_dict(),
        }

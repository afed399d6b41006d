"""POST /v1/completions: OpenAI's text completions (a prompt; `suffix` where the model has FIM tokens)."""

from __future__ import annotations

import time
import uuid
from dataclasses import replace

from starlette.requests import Request

from lingcode.completion.prompt import completion_family
from lingcode.pipeline.turns import Content, Turn, TurnEnd, TurnEvent
from lingcode.server.errors import APIError, invalid
from lingcode.server.openai.protocol import CompletionRequest
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


class CompletionsServing(Serving):
    path = "/v1/completions"
    request_model = CompletionRequest

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # The FIM tokens the editor's prompts use too: the family's, or ones the vocabulary has.
        self.fim = completion_family(self.info).fim

    async def prepare(self, body: CompletionRequest, request: Request) -> Prepared:
        input_ids = self.prompt_ids_of(body)
        if not input_ids:  # e.g. a control character that the vocabulary has no token for
            raise invalid(
                f"the prompt {body.prompt!r} has no token in model {self.info.name!r}'s vocabulary; "
                "the model needs at least one",
                param="prompt",
                code="empty_prompt",
            )
        sampling = body.sampling()
        if body.suffix is not None and sampling.repetition_penalty is None:
            # Filling in the middle is an editor's completion: code repeats the names around it,
            # which a chat model card's penalty steers away from (/v1/lingcode/complete has none).
            sampling.repetition_penalty = 1.0
        params, stop_loops = self.sampling_params(sampling, len(input_ids), "prompt")
        if body.suffix is not None and self.fim:  # the middle ends at any control token (a new file, a turn)
            params = replace(params, stop_token_ids=(*params.stop_token_ids, *sorted(self.info.tokenizer.special_ids)))
        shape = CompletionShape(f"cmpl-{uuid.uuid4().hex}", self.model_id, body.include_usage())
        turn = Turn(shape.request_id, input_ids, params, stop=body.stop_strings(), stop_loops=stop_loops)
        return Prepared(turn, shape, bool(body.stream))

    def prompt_ids_of(self, body: CompletionRequest) -> list[int]:
        """The prompt as token ids; with `suffix`, wrapped in the model's fill-in-the-middle tokens."""
        tokenizer = self.info.tokenizer
        if isinstance(body.prompt, list):
            ids = list(body.prompt)
            if any(not 0 <= i < tokenizer.vocab_size for i in ids):
                raise invalid(f"prompt token ids must be in [0, {tokenizer.vocab_size})", param="prompt")
        else:
            ids = tokenizer.encode(body.prompt)
        fim = self.fim
        if body.suffix is None or (body.suffix == "" and not fim):
            return ids
        if not fim:
            raise APIError(
                400,
                f"suffix: model {self.info.name!r} has no fill-in-the-middle tokens, so `suffix` "
                "is not supported; send the prompt alone",
                param="suffix",
                code="suffix_not_supported",
            )
        # PSM order: <prefix> prompt <suffix> suffix <middle>, and the model writes the middle.
        encode = tokenizer.encode
        return encode(fim["prefix"]) + ids + encode(fim["suffix"]) + encode(body.suffix) + encode(fim["middle"])


class CompletionShape(Shape):
    """text_completion objects, whole and as stream chunks."""

    end_of_stream = DONE

    def __init__(self, request_id: str, model: str, include_usage: bool = False):
        self.request_id, self.model, self.include_usage = request_id, model, include_usage
        self.created = int(time.time())

    def _head(self) -> dict:
        return {"id": self.request_id, "object": "text_completion", "created": self.created, "model": self.model}

    def _chunk(self, text: str | None, finish_reason: str | None = None) -> dict:
        choices = [] if text is None else [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}]
        chunk = {**self._head(), "choices": choices}
        if self.include_usage:
            chunk["usage"] = None
        return chunk

    def whole(self, end: TurnEnd) -> dict:
        choice = {"index": 0, "text": end.content, "logprobs": None, "finish_reason": finish_reason(end)}
        return {
            **self._head(),
            "choices": [choice],
            "usage": usage_dict(end.usage),
            "timings": timings_dict(end.usage, end.timing),
            **stop_fields(end),
        }

    def frames(self, events: list[TurnEvent]) -> str:
        out = []
        for event in events:
            if isinstance(event, Content):
                out.append(sse(self._chunk(event.text)))
            elif isinstance(event, TurnEnd):
                out.append(
                    sse(
                        {
                            **self._chunk("", finish_reason(event)),
                            "timings": timings_dict(event.usage, event.timing),
                            **stop_fields(event),
                        }
                    )
                )
                if self.include_usage:
                    out.append(sse({**self._chunk(None), "usage": usage_dict(event.usage)}))
        return "".join(out)

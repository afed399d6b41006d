"""The Engine interface: what every engine (the embedded "local" torch engine, SGLang) implements.

It is token level on purpose. Chat templates, detokenization, stop strings and tool parsing live
once, above the engines (lingcode.pipeline.generation), so each engine only has to turn input ids into
output ids as fast as its hardware allows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, AsyncIterator, Protocol

if TYPE_CHECKING:
    import torch

    from lingcode.text.tokenizer import Tokenizer


class EngineError(RuntimeError):
    """The engine failed while serving a request; the request ends, the engine stays usable."""


class EngineStartError(RuntimeError):
    """The engine cannot start here (no GPU, a missing model, a bad profile): str() is one line
    that says what to do, printed without a traceback (exit status 2, like other usage errors)."""


class EngineUnavailable(EngineError):
    """The engine cannot take requests now (starting, restarting, unreachable): retry later (503)."""


class ContextOverflow(ValueError):
    """The request does not fit the model's context (never truncated silently)."""


class TokenConstraint(Protocol):
    """Constrained decoding (e.g. an llguidance matcher for a JSON schema), applied by the engine.

    Before each sampled token the engine calls mask_logits() (disallowed tokens to -inf, in place);
    after it, accept(). is_terminated() ends the generation with finish_reason "stop". An engine
    decodes one token per step while a constraint is active (no speculation: drafts would have to
    be rolled back in the grammar too).
    """

    def mask_logits(self, logits: "torch.Tensor") -> None: ...

    def accept(self, token_id: int) -> None: ...

    def is_terminated(self) -> bool: ...


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 means no top-k cut
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()  # end the generation, besides the model's eos ids
    # End the generation once one of these is emitted, its text kept (a stop token's is not): what
    # a single-line completion ends at (tokens holding a newline), so the engine stops right there
    # instead of running a step that the text layer's cut then aborts. (The local engine honors
    # it; the SGLang adapter leaves the ending to the cut.)
    final_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    constraint: TokenConstraint | None = field(default=None, compare=False)  # stateful: one per request

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0 or self.top_k == 1


@dataclass
class TokenChunk:
    """New tokens of one request. The last chunk of a stream has finish_reason set."""

    token_ids: list[int]
    finish_reason: str | None = None  # "stop" (eos / stop id), "length", "abort"
    prompt_tokens: int = 0  # tokens in the request's input
    cached_tokens: int = 0  # of those, reused from the KV cache (not prefilled again)
    # Speculative decoding: mean tokens accepted per verify step, on the last chunk when known.
    spec_accept_length: float | None = None


@dataclass(frozen=True)
class ModelInfo:
    name: str
    context_length: int
    eos_token_ids: tuple[int, ...]
    tokenizer: "Tokenizer"
    chat_template: str | None
    bos_token: str | None = None  # as text, for chat templates that use {{ bos_token }}
    eos_token: str | None = None
    # Fill-in-the-middle special tokens, when the model has them: {"prefix", "suffix", "middle"}.
    fim_tokens: dict[str, str] | None = None
    extra: dict = field(default_factory=dict)


class Engine(Protocol):
    """One model, batch 1. generate() streams chunks; abort() ends a running request within a step."""

    info: ModelInfo

    def generate(
        self, request_id: str, input_ids: list[int], params: SamplingParams
    ) -> AsyncIterator[TokenChunk]: ...

    async def abort(self, request_id: str) -> None: ...

    def stats(self) -> dict: ...

    async def close(self) -> None: ...

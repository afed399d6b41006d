"""The Engine interface: what every engine (the embedded "local" torch engine, SGLang) implements.

It is token level on purpose. Chat templates, detokenization, stop strings and tool parsing live
once, above the engines (lingcode.pipeline.generation), so each engine only has to turn input ids into
output ids as fast as its hardware allows.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from contextvars import ContextVar
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
    # Each token id already in the sequence (prompt and output) has its logit divided by this when
    # positive, multiplied when negative (HF's, vLLM's, SGLang's, llama.cpp's); greedy too. 1: off.
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()  # end the generation, besides the model's eos ids
    # End the generation once one of these is emitted, its text kept (a stop token's is not): what
    # a single-line completion ends at (tokens holding a newline), so the engine stops right there
    # instead of running a step that the text layer's cut then aborts. (The local engine honors
    # it; the SGLang adapter leaves the ending to the cut.)
    final_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    constraint: TokenConstraint | None = field(default=None, compare=False)  # stateful: one per request
    # The text layer decides where this generation ends (stop strings, an editor's cut rules): hand
    # it the tokens at STREAM_INTERVAL_S even where the engine would wait longer (the CPU), so that
    # it answers and stops the engine soon after the end.
    text_ends: bool = False

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


def merge_chunks(chunks: list[TokenChunk]) -> TokenChunk:
    """Several chunks of one request as one: their tokens in order, the last one's ending."""
    if len(chunks) == 1:
        return chunks[0]
    last = chunks[-1]
    return TokenChunk(
        [t for c in chunks for t in c.token_ids],
        last.finish_reason,
        last.prompt_tokens,
        last.cached_tokens,
        last.spec_accept_length,
    )


def common_prefix(a, b) -> int:
    """How many leading items two token sequences (lists or tuples) share.

    On every request's way to its first token (the live cache, each saved prefix, the drafter, the
    ids sent to an engine's process), so slices are compared in C, halving the span that differs,
    not item by item in Python."""
    if type(a) is not type(b):
        a = type(b)(a)
    n = min(len(a), len(b))
    if (a if len(a) == n else a[:n]) == (b if len(b) == n else b[:n]):  # no copy of a whole list
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo]; a[:hi] != b[:hi]
    while hi - lo > 32:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    while a[lo] == b[lo]:
        lo += 1
    return lo


# How long a worker thread's chunks may wait for the event loop at most, once one is waiting: the
# loop then reads every chunk that piled up as one, instead of waking for each decode step.
STREAM_INTERVAL_S = 0.004
# The same where the engine's threads use every core (the CPU engine): each wake-up there takes a
# core from the step, for the loop's work and then the client's, so fewer of them (a text still
# streams at 10 updates a second, a terminal progress bar's rate).
CPU_STREAM_INTERVAL_S = 0.1
# There the woken loop may also wait for a timeslice before it runs, the first token with it: the
# worker hands its core over until the loop has passed the first chunk on, at most this long.
FIRST_HAND_OVER_S = 0.005


def _ends_stream(item: TokenChunk | BaseException) -> bool:
    """Whether a chunk ends its stream (the last chunk, or the worker's exception)."""
    return not isinstance(item, TokenChunk) or item.finish_reason is not None


class ChunkChannel:
    """From an engine's worker thread to the event loop, without waking the loop for every step.

    The worker put()s each step's chunk. The loop is woken for the first chunk, the last one, an
    error, and otherwise at most every STREAM_INTERVAL_S; get() returns everything that arrived
    since the last read, merged into one chunk. At GPU speed (a step in a fraction of a
    millisecond) the loop's per-chunk work (detokenize, stop strings, parsers, one SSE frame) then
    runs once per interval, not once per token, and leaves the worker's GIL time alone.

    With hand_over_first (an engine whose threads take every core), put() of the first chunk
    returns once the loop has passed it on and waits in get() again, or the reader has left
    (release()), or FIRST_HAND_OVER_S has passed. A first chunk that ends the stream is not waited on.
    """

    def __init__(
        self, loop: asyncio.AbstractEventLoop, interval_s: float = STREAM_INTERVAL_S, hand_over_first: bool = False
    ):
        self._loop = loop
        self._interval_s = interval_s
        self._hand_over_first = hand_over_first
        self._reading = threading.Event()  # the loop waits in get() with nothing left to read
        self._items: list = []  # TokenChunks, or one exception
        self._lock = threading.Lock()
        self._wake_pending = False
        self._woken_at = 0.0  # when the loop was last woken (the worker's clock)
        self._waiter: asyncio.Future | None = None

    def put(self, item: TokenChunk | BaseException) -> None:
        """Worker thread: hand over a chunk (or the exception that ends the stream)."""
        now = time.perf_counter()
        with self._lock:
            first = not self._items and self._woken_at == 0.0
            self._items.append(item)
            ends = _ends_stream(item)
            urgent = first or ends
            if self._wake_pending or not (urgent or now - self._woken_at >= self._interval_s):
                return
            self._wake_pending, self._woken_at = True, now
            hand_over = first and self._hand_over_first and not ends
            if hand_over:
                self._reading.clear()
        self._loop.call_soon_threadsafe(self._wake)
        if hand_over:
            self._reading.wait(FIRST_HAND_OVER_S)

    def release(self) -> None:
        """Loop side: the reader is done (finished or gone); a hand-over waits for it no longer."""
        with self._lock:
            self._hand_over_first = False
            self._reading.set()

    def _wake(self) -> None:
        with self._lock:
            self._wake_pending = False
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def get(self) -> TokenChunk:
        """The chunks that arrived since the last get(), as one; raises the worker's exception."""
        while True:
            with self._lock:
                items, self._items = self._items, []
                if not items:
                    self._reading.set()
            if items:
                break
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        errors = [i for i in items if not isinstance(i, TokenChunk)]
        chunks = [i for i in items if isinstance(i, TokenChunk)]
        if errors and not chunks:
            raise errors[0]
        if errors:  # deliver what came before the error first; the error on the next read
            with self._lock:
                self._items[:0] = errors
        return merge_chunks(chunks)


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
    """One model, batch 1. generate() streams chunks; abort() ends a running request within a step.
    generate() calls handed_over() once the engine has the request, before it waits for the first
    chunk (an error before that point means the engine never ran it); an engine whose first step
    needs every core of the host leaves it out, and a stream's head waits for the first chunk.
    head_before_submit: a stream's head goes out before the engine has the request, once the
    daemon has checked it (server/streaming.py's StreamHead): for an engine that refuses nothing
    the daemon checked (its context, a prompt not empty) and whose first step needs every core,
    so that the client reads the head before that step rather than during it."""

    info: ModelInfo
    head_before_submit: bool

    def generate(self, request_id: str, input_ids: list[int], params: SamplingParams) -> AsyncIterator[TokenChunk]: ...

    async def abort(self, request_id: str) -> None: ...

    def stats(self) -> dict: ...

    async def close(self) -> None: ...


# Who wants to know when the engine has a request: the daemon sends a stream's head then, so the
# client reads it while the engine computes the first token. Set per request, in the caller's task.
on_handed_over: ContextVar[Callable[[], None] | None] = ContextVar("lingcode_on_handed_over", default=None)


def handed_over() -> None:
    """Called by an engine's generate() once the request is the engine's (see Engine)."""
    if (callback := on_handed_over.get()) is not None:
        callback()

"""From token chunks to text: detokenization, stop strings, usage and timing, once for every engine.

Every turn (lingcode.pipeline.turns) streams through generate_text(), so every API cuts stop
strings, counts tokens, times requests and records metrics alike. A chunk is whatever the engine
produced since the last one was read, so this work is done once per chunk, not once per token.
"""

from __future__ import annotations

import asyncio
import codecs
import time
from contextlib import aclosing
from dataclasses import dataclass, replace
from typing import AsyncIterator, Protocol, Sequence

from lingcode.pipeline import metrics
from lingcode.engine import SamplingParams
from lingcode.pipeline.scheduler import Priority, Scheduler
from lingcode.text.tokenizer import Tokenizer


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass
class Timing:
    ttft_ms: float | None  # submitted -> first token
    tpot_ms: float | None  # mean time per output token after the first
    total_ms: float
    completion_tokens: int
    accept_length: float | None = None  # speculative decoding: tokens per verify step, if the engine says

    def as_dict(self) -> dict:
        tokens_per_s = None
        if self.tpot_ms:
            tokens_per_s = round(1000.0 / self.tpot_ms, 2)
        timing = {
            "ttft_ms": _round(self.ttft_ms),
            "tpot_ms": _round(self.tpot_ms),
            "total_ms": _round(self.total_ms),
            "tokens_per_s": tokens_per_s,
        }
        if self.accept_length is not None:
            timing["accept_length"] = _round(self.accept_length)
        trace = metrics.trace.get()
        if trace is not None and trace.report:
            timing["trace"] = trace.as_dict()
        return timing


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


class TextCut(Protocol):
    """Where a generation's text ends, decided as it streams (StopMatcher is one; the editor
    completion cut rules, lingcode.completion.cuts, are another)."""

    def feed(self, text: str) -> tuple[str, bool]:
        """New text -> (text safe to emit now, whether the text ends here)."""

    def flush(self) -> str:
        """At the end of the generation: what was held back."""


# --- detokenizing ------------------------------------------------------------------------------
# Byte-level BPE tokens can split a character (an emoji, a CJK character) across tokens. Decoding
# token by token would emit U+FFFD replacement characters; instead only text that no later token
# can change is emitted. Where the tokenizer's decoder is byte-level, a chunk's token bytes go
# through an incremental UTF-8 decoder, which holds back a partial character: work in proportion
# to the chunk. Otherwise a short window is decoded twice, and text emitted once it is whole.


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, skip_ids: frozenset[int] = frozenset()):
        self.tokenizer = tokenizer
        self.skip_ids = skip_ids  # e.g. the eos token: ends the text, is not part of it
        self.pieces = tokenizer.token_bytes
        self.utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self.ids: list[int] = []  # the window (no byte table)
        self.prefix_offset = 0  # ids[prefix_offset:read_offset] are context already emitted
        self.read_offset = 0

    def add(self, token_ids: list[int]) -> str:
        """Feed new ids, get the text they completed ("" while a character is still partial)."""
        if self.pieces is not None:
            pieces, skip = self.pieces, self.skip_ids
            return self.utf8.decode(b"".join([pieces[t] for t in token_ids if t not in skip]))
        self.ids.extend(t for t in token_ids if t not in self.skip_ids)
        prefix = self.tokenizer.decode(self.ids[self.prefix_offset : self.read_offset])
        text = self.tokenizer.decode(self.ids[self.prefix_offset :])
        if len(text) > len(prefix) and not text.endswith("\ufffd"):
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            return text[len(prefix) :]
        return ""

    def flush(self) -> str:
        """At the end of a generation: whatever is left, replacement characters and all."""
        if self.pieces is not None:
            return self.utf8.decode(b"", final=True)
        prefix = self.tokenizer.decode(self.ids[self.prefix_offset : self.read_offset])
        text = self.tokenizer.decode(self.ids[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(self.ids)
        return text[len(prefix) :]


# --- stop strings ------------------------------------------------------------------------------
# Cut at the first stop string, and hold back only what could be the start of one.


class StopMatcher:
    def __init__(self, stops: list[str] | tuple[str, ...]):
        self.stops = [s for s in stops if s]
        self.pending = ""  # text held back because it could be the start of a stop string
        self.hit: str | None = None  # the stop string that ended the text, once one has

    def feed(self, text: str) -> tuple[str, bool]:
        """New text -> (text safe to emit now, whether a stop string was hit)."""
        if not self.stops:
            return text, False
        buffer = self.pending + text
        hits = [(i, s) for s in self.stops if (i := buffer.find(s)) >= 0]
        if hits:
            self.pending = ""
            at, self.hit = min(hits)
            return buffer[:at], True
        keep = self._partial_tail(buffer)
        self.pending = buffer[len(buffer) - keep :] if keep else ""
        return buffer[: len(buffer) - keep], False

    def flush(self) -> str:
        text, self.pending = self.pending, ""
        return text

    def _partial_tail(self, buffer: str) -> int:
        """Length of the longest suffix of buffer that is a proper prefix of some stop string."""
        longest = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(buffer)), longest, -1):
                if buffer.endswith(stop[:n]):
                    longest = n
                    break
        return longest


# --- the text stream ---------------------------------------------------------------------------


@dataclass
class TextChunk:
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop" | "length" | "loop" | "abort" on the last chunk
    usage: Usage | None = None  # last chunk only
    timing: Timing | None = None  # last chunk only
    output_ids: list[int] | None = None  # last chunk only: every token id generated, as generated
    stop_string: str | None = None  # last chunk only: the stop string that ended the text, if one did
    cached_tokens: int = 0  # prompt tokens the engine reused from its KV cache


class EndRequest:
    """Handed to generate_text by a reader that decides the text is over (a turn whose model began
    to repeat a tool call): after setting `requested`, its next read is the final chunk (finish
    "stop", with usage and timing), without waiting for the engine; the engine is aborted."""

    requested = False


# A looping answer: its last LOOP_SPAN tokens (or more, for long blocks) repeat, with a period of at
# most LOOP_MAX_PERIOD tokens, what came just before them. Small models at low temperature fall
# into such loops and would otherwise fill the context.
LOOP_SPAN = 64
LOOP_MIN_COPIES = 4
LOOP_MAX_PERIOD = 128


def looping(ids: list[int]) -> bool:
    """Whether the tokens end in one block repeated (LOOP_MIN_COPIES + 1 copies, LOOP_SPAN tokens at least)."""
    n = len(ids)
    for period in range(1, LOOP_MAX_PERIOD + 1):
        span = max(LOOP_SPAN, LOOP_MIN_COPIES * period)
        if span + period > n:
            break
        if ids[n - span :] == ids[n - span - period : n - period]:
            return True
    return False


async def generate_text(
    scheduler: Scheduler,
    tokenizer: Tokenizer,
    request_id: str,
    input_ids: list[int],
    params: SamplingParams,
    stop: Sequence[str] = (),
    *,
    cut: TextCut | None = None,
    priority: Priority = Priority.NORMAL,
    latest_wins: str | None = None,
    stop_loops: bool = False,
    end: EndRequest | None = None,
) -> AsyncIterator[TextChunk]:
    """Stream a request's text. Closing this iterator early aborts the request in the engine.

    `cut` ends the text where the caller's rule says, after the stop strings; `priority` and
    `latest_wins` go to the scheduler; `stop_loops` ends a looping answer with finish_reason
    "loop" (no limit was reached: each API calls it a normal stop, and lingcode's own field says
    why); `end` lets the reader end the text early (EndRequest). Every stream's outcome (timings,
    finish reason, abort, failure) goes to lingcode.pipeline.metrics.
    """
    end_ids = frozenset(params.stop_token_ids) | (
        frozenset() if params.ignore_eos else frozenset(scheduler.engine.info.eos_token_ids)
    )
    detok = IncrementalDetokenizer(tokenizer, skip_ids=end_ids)
    stops = StopMatcher(list(stop))
    cuts: list[TextCut] = [stops] + ([cut] if cut is not None else [])
    trace = metrics.trace.get() or metrics.Trace()
    clock = time.perf_counter
    start = clock()
    first_token_at = None
    n_tokens = cached = 0
    accept_length = None
    text, last_ids, finish = "", [], None
    output_ids: list[int] = []
    label, ended = metrics.route.get(), False

    def final() -> TextChunk:
        nonlocal ended
        end = clock()
        ttft = None if first_token_at is None else (first_token_at - start) * 1e3
        tpot = (end - first_token_at) * 1e3 / (n_tokens - 1) if first_token_at and n_tokens > 1 else None
        timing = Timing(
            ttft_ms=ttft,
            tpot_ms=tpot,
            total_ms=(end - start) * 1e3,
            completion_tokens=n_tokens,
            accept_length=accept_length,
        )
        last = TextChunk(
            text,
            last_ids,
            finish or "abort",
            Usage(len(input_ids), n_tokens, cached),
            timing,
            output_ids,
            stops.hit,
            cached,
        )
        ended = True
        metrics.record_end(label, request_id, last)
        return last

    if stop or cut is not None:
        params = replace(params, text_ends=True)
    trace.mark("until_engine")  # what the daemon did before the engine got the request
    chunks = scheduler.generate(request_id, input_ids, params, priority=priority, latest_wins=latest_wins)
    try:
        async with aclosing(chunks):
            async for chunk in chunks:
                now = clock()
                if first_token_at is None:
                    trace.add("engine_first_chunk", now - start)
                    if chunk.token_ids:
                        first_token_at = now
                n_tokens += len(chunk.token_ids)
                last_ids = chunk.token_ids
                output_ids += chunk.token_ids
                cached = chunk.cached_tokens
                if chunk.spec_accept_length is not None:
                    accept_length = chunk.spec_accept_length
                text = detok.add(chunk.token_ids)
                ending = chunk.finish_reason is not None
                if ending:
                    text += detok.flush()
                detokenized = clock()
                trace.add("detokenize", detokenized - now)
                hit = False
                for each in cuts:  # what a cut holds back lies after an earlier cut's end: it is dropped
                    text, hit_here = each.feed(text)
                    if (ending or hit) and not hit_here:
                        text += each.flush()
                    hit = hit or hit_here
                finish = "stop" if hit else chunk.finish_reason
                if finish is None and stop_loops and looping(output_ids):
                    finish = "loop"
                    metrics.log.info(
                        "generation %s stopped: its last tokens repeat (after %d tokens)",
                        request_id,
                        n_tokens,
                        extra={"generation_id": request_id, "stop_reason": "loop"},
                    )
                    text += stops.flush() + (cut.flush() if cut is not None else "")
                trace.add("stops", clock() - detokenized)
                if finish is not None and chunk.finish_reason is None:
                    # The text is whole: answer now. Leaving the block afterwards (when the caller
                    # closes this stream, or reads on) aborts the engine, which first finishes the
                    # step in flight: nobody need wait for that.
                    yield final()
                    return
                if finish is not None:
                    break
                if text:
                    yield TextChunk(text, chunk.token_ids, cached_tokens=cached)
                    if end is not None and end.requested:
                        text, last_ids, finish = "", [], "stop"  # what came before was read already
                        yield final()
                        return
        yield final()
    except (GeneratorExit, asyncio.CancelledError):  # the consumer stopped reading, or was cancelled (its
        if not ended:  # client left) while it waited for the next chunk: nobody will read the rest
            metrics.record_abort(label, request_id)
        raise
    except Exception as exc:
        metrics.record_error(label, request_id, exc)
        raise

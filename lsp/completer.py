"""From a cursor to a suggestion: the typed-ahead cache, latest wins, and the daemon's completion route.

One Completer serves the whole LSP session. For each request:
1. the typed-ahead cache answers if the user is typing along a suggestion (no engine call);
   a second request for the same keystroke (ghost text and the popup) joins the running call;
2. otherwise a request still running for the same document is cancelled (latest wins): its HTTP
   connection closes and the daemon aborts it in the engine within a step. The daemon is also told the
   document, so it cancels the old one even before that close arrives;
3. the daemon builds the prompt, generates with priority over chat and agents, and cuts the
   suggestion (one line mid-line, the block's end, the time budget); we keep it in the cache.

A `$/cancelRequest` cancels the handler's task, and with it the daemon call, all the way into the
engine. Nothing here blocks the event loop, so didChange and other requests are handled while a
completion is in flight.

Also here, as the keystroke uses them: the typed-ahead cache, the context ring (chunks of other
files), and the running figures that `lingcode/stats` returns.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field, fields

from lingcode.client import DaemonError, DaemonGone, DaemonLink, ErrorResponse

ROUTE = "/v1/lingcode/complete"
log = logging.getLogger("lingcode.lsp")
PREFIX_ALIGN = 64  # the prefix sent starts at a multiple of this line: the prompt's start stays put


# --- settings and the cursor ---------------------------------------------------------------------


@dataclass
class Settings:
    """What an editor may set in `initializationOptions` (camelCase there: maxTokens, ...)."""

    max_tokens: int = 64
    time_budget_ms: float | None = 500.0  # multi-line suggestions end at the first newline after it
    multiline: bool | None = None  # None: one line when the cursor is mid-line, else a block
    prefix_lines: int = 256  # lines before the cursor sent to the daemon (it cuts to a token budget)
    suffix_lines: int = 64
    context: bool = True  # send chunks of other open files

    @classmethod
    def from_options(cls, options: object) -> tuple["Settings", list[str]]:
        """Settings from initializationOptions, and a warning for each value that was ignored."""
        settings, warnings = cls(), []
        if not isinstance(options, dict):
            return settings, ([] if options is None else ["initializationOptions must be an object; ignored"])
        for f in fields(cls):
            name = "".join(w.capitalize() if i else w for i, w in enumerate(f.name.split("_")))
            if name not in options:
                continue
            value = options[name]
            if _valid(f.name, value):
                setattr(settings, f.name, value)
            else:
                default = getattr(settings, f.name)
                warnings.append(f"initializationOptions.{name}: {value!r} is not valid; using {default!r}")
        return settings, warnings


def _valid(name: str, value: object) -> bool:
    if name in ("max_tokens", "prefix_lines", "suffix_lines"):
        return isinstance(value, int) and not isinstance(value, bool) and value >= (1 if name == "max_tokens" else 0)
    if name == "time_budget_ms":
        return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0)
    if name == "multiline":
        return value is None or isinstance(value, bool)
    return isinstance(value, bool)


@dataclass(frozen=True)
class Cursor:
    """A place to complete, read from the document when the request came."""

    uri: str
    text: str  # the whole document
    offset: int  # the cursor, as an index into text
    line: int  # the cursor's line
    path: str  # relative to the workspace root
    language: str | None = None
    repo: str | None = None

    @property
    def prefix(self) -> str:
        return self.text[: self.offset]

    @property
    def suffix(self) -> str:
        return self.text[self.offset :]


# --- the completer -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Call:
    place: tuple[str, int]  # the document's text and the cursor it was asked for
    task: asyncio.Task


class Completer:
    def __init__(self, link: DaemonLink, settings: Settings, log: Callable[[str], None]):
        self.link = link
        self.settings = settings
        self.log = log
        self.cache = TypedAheadCache()
        self.ring = ContextRing()
        self.stats = CompletionStats()
        self._inflight: dict[str, _Call] = {}  # per document: the engine call running for it

    async def complete(self, cursor: Cursor) -> str | None:
        """The suggestion at the cursor ("" or None: nothing to show)."""
        started = time.perf_counter()
        self.stats.requests += 1
        cached = self.cache.get(cursor.prefix, cursor.suffix)
        if cached is not None:  # not logged: a message per keystroke would cost more than the lookup
            self.stats.cache_hit((time.perf_counter() - started) * 1e3)
            return cached
        place = (cursor.text, cursor.offset)
        running = self._inflight.get(cursor.uri)
        shared = running is not None and running.place == place
        if shared:  # the same keystroke asked twice (ghost text and the popup): one engine call
            call = running.task
            self.stats.shared += 1
        else:
            if running is not None:
                running.task.cancel()  # latest wins
            call = asyncio.ensure_future(self._ask_daemon(cursor))
            self._inflight[cursor.uri] = _Call(place, call)
        try:
            text, final = await (asyncio.shield(call) if shared else call)
        except asyncio.CancelledError:
            if asyncio.current_task().cancelling():  # $/cancelRequest: the editor gets -32800
                self.stats.cancelled += 1
                raise
            self.stats.superseded += 1  # a newer request for this document cancelled ours
            return None
        except (DaemonError, ErrorResponse) as exc:
            self.stats.errors += 1
            self.log(f"lingcode: completion failed: {exc}")
            if isinstance(exc, DaemonGone):
                self.link.mark_down()  # the daemon went away: the next request finds or starts one
            return None
        except Exception as exc:  # a bug: the editor gets no suggestion and a log line, not a traceback
            self.stats.errors += 1
            log.exception("completion failed")
            self.log(f"lingcode: completion failed: {type(exc).__name__}: {exc} (details on stderr)")
            return None
        finally:
            current = self._inflight.get(cursor.uri)
            if current is not None and current.task is call and call.done():
                del self._inflight[cursor.uri]
        ms = (time.perf_counter() - started) * 1e3
        if final.get("finish_reason") == "abort":  # the daemon cancelled it for a newer one
            self.stats.superseded += 1
            return None
        if shared:
            return text
        self.stats.engine_answer(ms, final)
        self.cache.put(cursor.prefix, cursor.suffix, text)
        self.stats.empty += not text
        last = self.stats.last
        self.log(
            f"lingcode: {last['prompt_tokens']} prompt tokens, {last['cached_tokens']} cached "
            f"({last['prefilled_tokens']} prefilled), ttft {_ms(last['ttft_ms'])}, total {ms:.0f} ms, "
            f"{last['completion_tokens']} tokens, cut: {last['cut'] or last['finish_reason']}"
        )
        return text

    async def _ask_daemon(self, cursor: Cursor) -> tuple[str, dict]:
        """One POST, answered whole: a suggestion is shown only once its line is done, so a stream
        of tokens would only wake this process and the daemon's writer between steps (streamed or
        not made no measurable difference: docs/engine-notes.md). Cancelling the call closes the connection, which aborts the request in the engine."""
        client = await self.link.ready()
        self.stats.engine_calls += 1
        final = await client.post(ROUTE, self._body(cursor))
        return final.get("text", ""), final

    def _body(self, cursor: Cursor) -> dict:
        s = self.settings
        lines = cursor.text.splitlines(keepends=True)
        first = max(0, cursor.line - s.prefix_lines)
        first -= first % PREFIX_ALIGN
        start = sum(len(line) for line in lines[:first])
        end = start + sum(len(line) for line in lines[first : cursor.line + s.suffix_lines + 1])
        near = cursor.text[max(start, cursor.offset - 4000) : cursor.offset + 2000]
        return {
            "prefix": cursor.text[start : cursor.offset],
            "suffix": cursor.text[cursor.offset : end],
            "path": cursor.path,
            "language": cursor.language,
            "repo": cursor.repo,
            "document": cursor.uri,
            "context": self.ring.pick(cursor.uri, near) if s.context else [],
            "max_tokens": s.max_tokens,
            "time_budget_ms": s.time_budget_ms,
            "multiline": s.multiline,
        }

    async def close(self) -> None:
        for call in self._inflight.values():
            call.task.cancel()
        await self.link.close()


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms"


# --- the typed-ahead cache -----------------------------------------------------------------------
# Typing the first characters of a shown suggestion reuses it, no engine call. For a new cursor we
# walk back over what was typed since (up to WALK_BACK characters): if a suggestion made there starts
# with exactly what was typed, its rest is the answer: a dictionary lookup per keystroke.

WALK_BACK = 128  # characters typed along one suggestion that can still reuse it
PREFIX_KEY_CHARS = 2048  # the key holds this much text before the cursor ...
SUFFIX_KEY_CHARS = 512  # ... and this much after it: enough to tell places apart


class TypedAheadCache:
    """Suggestions by the text around the cursor they were made at (an LRU)."""

    def __init__(self, capacity: int = 256):
        self.capacity = capacity
        self._entries: OrderedDict[tuple[str, str], str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, prefix: str, suffix: str, suggestion: str) -> None:
        key = _cache_key(prefix, suffix)
        self._entries[key] = suggestion
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def get(self, prefix: str, suffix: str) -> str | None:
        """The rest of a suggestion that what was typed since agrees with; None if there is none.

        "" means: at this very place the model suggested nothing (no need to ask again).
        """
        for typed in range(min(WALK_BACK, len(prefix)) + 1):
            key = _cache_key(prefix[: len(prefix) - typed], suffix)
            suggestion = self._entries.get(key)
            if suggestion is None:
                continue
            if typed == 0 or (len(suggestion) > typed and suggestion.startswith(prefix[len(prefix) - typed :])):
                self._entries.move_to_end(key)
                return suggestion[typed:]
        return None


def _cache_key(prefix: str, suffix: str) -> tuple[str, str]:
    return prefix[-PREFIX_KEY_CHARS:], suffix[:SUFFIX_KEY_CHARS]


# --- the context ring ----------------------------------------------------------------------------
# After llama.vim's ring: a chunk is up to CHUNK_LINES lines of another file (its start when opened,
# the lines around the last edit when saved or left). A new chunk evicts nearly equal ones; chunks
# from the current file or much like the code at the cursor are not sent (the prompt has that text).
# The ring changes only on open, save or a switch of file, so the prompt's context part stays the
# same while someone types, and the engine reuses it.

RING_CAPACITY = 16
CHUNK_LINES = 64
EVICT_SIMILARITY = 0.9
DROP_SIMILARITY = 0.5


@dataclass(frozen=True)
class RingChunk:
    uri: str
    path: str
    text: str
    lines: frozenset[str]  # its non-blank lines, stripped: what similarity compares


def similarity(a: frozenset[str], b: frozenset[str]) -> float:
    """Share of lines the two have in common (Dice coefficient over non-blank lines)."""
    if not a or not b:
        return 0.0
    return 2 * len(a & b) / (len(a) + len(b))


def line_set(text: str) -> frozenset[str]:
    return frozenset(line.strip() for line in text.splitlines() if line.strip())


class ContextRing:
    """Chunks of other files the user opened or edited, newest last."""

    def __init__(self, capacity: int = RING_CAPACITY):
        self.capacity = capacity
        self.chunks: list[RingChunk] = []

    def add(self, uri: str, path: str, text: str, around_line: int = 0) -> None:
        """Take the CHUNK_LINES lines of `text` around `around_line` into the ring."""
        lines = text.splitlines(keepends=True)
        start = max(0, min(around_line - CHUNK_LINES // 2, len(lines) - CHUNK_LINES))
        body = "".join(lines[start : start + CHUNK_LINES])
        new = RingChunk(uri, path, body, line_set(body))
        if not new.lines:
            return
        self.chunks = [c for c in self.chunks if similarity(c.lines, new.lines) <= EVICT_SIMILARITY]
        self.chunks.append(new)
        del self.chunks[: -self.capacity]

    def pick(self, uri: str, local_text: str) -> list[dict]:
        """The chunks to send with a completion in `uri` whose text near the cursor is `local_text`."""
        local = line_set(local_text)
        return [
            {"path": c.path, "text": c.text}
            for c in self.chunks
            if c.uri != uri and similarity(c.lines, local) <= DROP_SIMILARITY
        ]


# --- the running figures -------------------------------------------------------------------------

RECENT = 1000  # latencies kept for the percentiles


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


@dataclass
class CompletionStats:
    """What `lingcode/stats` returns and each completion logs."""

    requests: int = 0
    cache_hits: int = 0  # answered by the typed-ahead cache
    engine_calls: int = 0  # sent to the daemon
    empty: int = 0  # answered with no suggestion
    cancelled: int = 0  # $/cancelRequest
    superseded: int = 0  # a newer request for the same document came
    shared: int = 0  # asked again for the same keystroke while its engine call ran: joined it
    errors: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0  # of the prompt tokens, reused from the engine's KV cache
    last: dict = field(default_factory=dict)  # the last engine call's figures
    _engine_ms: deque = field(default_factory=lambda: deque(maxlen=RECENT))
    _cache_ms: deque = field(default_factory=lambda: deque(maxlen=RECENT))

    def cache_hit(self, ms: float) -> None:
        self.cache_hits += 1
        self._cache_ms.append(ms)

    def engine_answer(self, ms: float, final: dict) -> None:
        usage = final.get("usage") or {}
        prompt = usage.get("prompt_tokens", 0)
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        self.prompt_tokens += prompt
        self.cached_tokens += cached
        self._engine_ms.append(ms)
        timings = final.get("timings") or {}
        self.last = {
            "prompt_tokens": prompt,
            "cached_tokens": cached,
            "prefilled_tokens": prompt - cached,
            "completion_tokens": usage.get("completion_tokens", 0),
            "ttft_ms": timings.get("ttft_ms"),
            "daemon_ms": timings.get("total_ms"),
            "total_ms": round(ms, 3),
            "finish_reason": final.get("finish_reason"),
            "cut": final.get("cut"),
        }

    def snapshot(self) -> dict:
        engine, cache = list(self._engine_ms), list(self._cache_ms)
        return {
            "requests": self.requests,
            "cache_hits": self.cache_hits,
            "engine_calls": self.engine_calls,
            "empty": self.empty,
            "cancelled": self.cancelled,
            "superseded": self.superseded,
            "shared": self.shared,
            "errors": self.errors,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "prefilled_tokens": self.prompt_tokens - self.cached_tokens,
            "engine_ms": {"p50": percentile(engine, 0.5), "p95": percentile(engine, 0.95), "n": len(engine)},
            "cache_ms": {"p50": percentile(cache, 0.5), "p95": percentile(cache, 0.95), "n": len(cache)},
            "last": dict(self.last),
        }

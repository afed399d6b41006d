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
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, fields

import httpx

from lingcode.client import ErrorResponse, DaemonError
from lingcode.lsp.context_ring import ContextRing
from lingcode.lsp.daemon_link import CONNECTION_ERRORS, DaemonLink
from lingcode.lsp.stats import CompletionStats
from lingcode.lsp.typed_ahead import TypedAheadCache

ROUTE = "/v1/lingcode/complete"
log = logging.getLogger("lingcode.lsp")
PREFIX_ALIGN = 64  # the prefix sent starts at a multiple of this line: the prompt's start stays put


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
        except (DaemonError, ErrorResponse, httpx.HTTPError) as exc:
            self.stats.errors += 1
            self.log(f"lingcode: completion failed: {exc}")
            if isinstance(exc, CONNECTION_ERRORS):
                await self.link.reset()  # the daemon went away: the next request finds or starts one
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
        of tokens would only wake this process and the daemon's writer between steps. (Measured on 2
        cores: no difference beyond run-to-run noise, bench/results/lsp-stream-cost-2026-11-30.txt.)
        Cancelling the call closes the connection, which aborts the request in the engine."""
        client = await self.link.client()
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
            "prefix": cursor.text[start : cursor.offset], "suffix": cursor.text[cursor.offset : end],
            "path": cursor.path, "language": cursor.language, "repo": cursor.repo, "document": cursor.uri,
            "context": self.ring.pick(cursor.uri, near) if s.context else [],
            "max_tokens": s.max_tokens, "time_budget_ms": s.time_budget_ms, "multiline": s.multiline,
        }  # fmt: skip

    async def close(self) -> None:
        for call in self._inflight.values():
            call.task.cancel()
        await self.link.close()


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms"

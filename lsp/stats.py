"""The LSP server's running figures: what `lingcode/stats` returns and each completion logs."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

RECENT = 1000  # latencies kept for the percentiles


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


@dataclass
class CompletionStats:
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
            "prompt_tokens": prompt, "cached_tokens": cached, "prefilled_tokens": prompt - cached,
            "completion_tokens": usage.get("completion_tokens", 0), "ttft_ms": timings.get("ttft_ms"),
            "daemon_ms": timings.get("total_ms"), "total_ms": round(ms, 3), "finish_reason": final.get("finish_reason"),
            "cut": final.get("cut"),
        }  # fmt: skip

    def snapshot(self) -> dict:
        engine, cache = list(self._engine_ms), list(self._cache_ms)
        return {
            "requests": self.requests, "cache_hits": self.cache_hits, "engine_calls": self.engine_calls,
            "empty": self.empty, "cancelled": self.cancelled, "superseded": self.superseded, "shared": self.shared,
            "errors": self.errors,
            "prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
            "prefilled_tokens": self.prompt_tokens - self.cached_tokens,
            "engine_ms": {"p50": percentile(engine, 0.5), "p95": percentile(engine, 0.95), "n": len(engine)},
            "cache_ms": {"p50": percentile(cache, 0.5), "p95": percentile(cache, 0.95), "n": len(cache)},
            "last": dict(self.last),
        }  # fmt: skip

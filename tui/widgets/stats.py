"""Live stats: the last answer's speed, tokens/s across the session, and how full the context is."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Sparkline, Static

WARN_AT = 0.8  # share of the context in use from which the meter warns


def answer_line(stats: dict) -> str:
    """One answer's figures from the daemon's `timings`: 'ttft 210 ms · 29.8 tok/s · 33.6 ms/tok · 16 tokens'."""
    timings = stats.get("timings") or {}
    usage = stats.get("usage") or {}
    parts = []
    if timings.get("ttft_ms") is not None:
        parts.append(f"ttft {timings['ttft_ms']:.0f} ms")
    if timings.get("tokens_per_s"):
        parts.append(f"{timings['tokens_per_s']:.1f} tok/s")
    if timings.get("tpot_ms"):
        parts.append(f"{timings['tpot_ms']:.1f} ms/tok")
    if timings.get("accept_length") is not None:
        parts.append(f"{timings['accept_length']:.2f} accepted/step")
    tokens = usage.get("completion_tokens", timings.get("completion_tokens"))
    if tokens is not None:
        parts.append(f"{tokens} tokens")
    cached = usage.get("prompt_tokens_details", {}).get("cached_tokens") if usage else None
    if usage.get("prompt_tokens"):
        parts.append(f"prompt {usage['prompt_tokens']}" + (f" ({cached} cached)" if cached else ""))
    return " · ".join(parts)


def context_line(used: int, length: int) -> str:
    if not length:
        return f"ctx {used}"
    return f"ctx {used}/{length} ({100 * used / length:.0f}%)"


class StatsBar(Horizontal):
    """The line under the input: daemon link, last answer, tokens/s sparkline, context meter."""

    def compose(self) -> ComposeResult:
        yield Static("connecting…", id="link")
        yield Static("", id="answer")
        yield Sparkline([], id="rates")
        yield Static("", id="context")

    def set_link(self, text: str, state: str) -> None:
        """state: ok | busy | trouble (colours the text)."""
        link = self.query_one("#link", Static)
        link.update(text)
        link.set_classes(state)

    def set_answer(self, stats: dict | None) -> None:
        self.query_one("#answer", Static).update(answer_line(stats) if stats else "")

    def set_rates(self, rates: list[float]) -> None:
        self.query_one("#rates", Sparkline).data = rates

    def set_context(self, used: int, length: int) -> None:
        context = self.query_one("#context", Static)
        context.update(context_line(used, length))
        context.set_class(bool(length) and used >= WARN_AT * length, "warning")

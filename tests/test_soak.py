"""A short soak in CI (the full 1,000 turns: `lingcode bench soak`, results in bench/results/).

Sequential agent turns on the session daemon, editor completions in between, cancellations
mid-stream and while queued; then: nothing stuck, every request accounted for, no engine error, the
KV cache within the context, resident memory within the bound after warm-up.
"""

from __future__ import annotations

from lingcode.bench.soak import Soak, SoakConfig

SHORT = SoakConfig(
    turns=20,
    max_tokens=10,
    completion_every=3,
    cancel_every=5,
    queued_cancel_every=7,
    conversation_turns=4,
    warmup_turns=5,
    sample_every=3,
    rss_growth_bound_mb=64,
)


def test_short_soak(daemon):
    lines = []
    report = Soak(daemon.url, daemon.token, SHORT, say=lines.append).run()
    assert report.ok, "\n".join(report.failures)
    counts = report.counts
    assert counts["agent_turns"] >= 12 and counts["completions"] >= 6
    assert counts["cancelled_mid_stream"] >= 3 and counts["cancelled_queued"] >= 2
    # The engine's KV prefix store (agent sessions) is bounded memory by design; the bound is for the rest.
    assert report.rss_growth_mb is not None and report.rss_growth_mb - report.kv_store_mb <= SHORT.rss_growth_bound_mb
    # An agent turn that follows one of its conversation extends its prompt: those prefixes come from the
    # KV cache (a completion in between takes the one cache over, so not every turn's do).
    assert report.cached_fraction is not None and report.cached_fraction > 0.1
    assert report.scheduler_after["completed"] > report.scheduler_before["completed"]

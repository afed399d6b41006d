"""What lingcode measures about generation, in Prometheus terms, once for every route and engine.

Every text stream (lingcode.pipeline.generation.generate_text) records its outcome here when it
ends: time to first token and time per output token (histograms), tokens accepted per
speculative step, and whether it finished, was aborted (its client left, or it was cancelled) or
failed. Queue depth and the engine's and scheduler's counters are read at scrape time
(StatsCollector), so they never drift from stats().

Labels come from two context variables that the HTTP layer sets for each request: the route
(a path template such as "/v1/chat/completions", never a raw path: bounded cardinality) and the
request id (for logs). Core code never needs to know which API it is serving.

A third context variable holds the request's Trace: where its time went inside the daemon, stage
by stage (`lingcode bench daemon` asks for it with the X-Lingcode-Trace header).
"""

from __future__ import annotations

import logging
import time
from contextvars import ContextVar
from typing import TYPE_CHECKING, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

if TYPE_CHECKING:
    from lingcode.pipeline.generation import TextChunk
    from lingcode.pipeline.scheduler import Scheduler

route: ContextVar[str] = ContextVar("lingcode_route", default="none")
request_id: ContextVar[str | None] = ContextVar("lingcode_request_id", default=None)


class Trace:
    """Where one request's time went inside the daemon: seconds per stage, and the event loop's CPU
    time (thread_time on the loop thread) from the Trace's creation to its last report."""

    __slots__ = ("stages", "report", "started", "_cpu_start")

    def __init__(self, report: bool = False, started: float | None = None):
        """started: when the request's first bytes were read (perf_counter), where the HTTP server
        knows it; else now."""
        self.stages: dict[str, float] = {}
        self.report = report  # the client asked to see it (in `timings.trace`)
        self.started = time.perf_counter() if started is None else started
        self._cpu_start = time.thread_time()

    def add(self, stage: str, seconds: float) -> None:
        self.stages[stage] = self.stages.get(stage, 0.0) + seconds

    def mark(self, point: str) -> None:
        """The time from the request's arrival to `point`, the first time it is reached."""
        if point not in self.stages:
            self.stages[point] = time.perf_counter() - self.started

    def as_dict(self) -> dict[str, float]:
        ms = {stage: round(seconds * 1e3, 3) for stage, seconds in self.stages.items()}
        ms["loop_cpu"] = round((time.thread_time() - self._cpu_start) * 1e3, 3)
        # the arrival on perf_counter's clock, which every process of the machine shares: a client
        # there places the daemon's marks on its own timeline (lingcode bench daemon)
        ms["arrived_at"] = round(self.started * 1e3, 3)
        return ms


trace: ContextVar[Trace | None] = ContextVar("lingcode_trace", default=None)

log = logging.getLogger("lingcode.generation")  # a log channel clients read: its name stays

# Metrics are created unregistered: each app's registry (registry_for) registers them, so that
# several apps in one process (tests) share the counts without clashing in a global registry.
TTFT = Histogram(
    "lingcode_time_to_first_token_seconds",
    "Time from submission (queueing included) to the first token.",
    ["route"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
    registry=None,
)
TPOT = Histogram(
    "lingcode_time_per_output_token_seconds",
    "Mean time per output token after the first, per request.",
    ["route"],
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.035, 0.05, 0.1, 0.2, 0.5, 1),
    registry=None,
)
ACCEPTED = Histogram(
    "lingcode_accepted_tokens_per_step",
    "Speculative decoding: mean tokens accepted per verify step, per request.",
    ["route"],
    buckets=(1, 1.25, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10, 12, 16),
    registry=None,
)
GENERATIONS = Counter(
    "lingcode_generations",
    "Generations that ended, by finish reason (stop, length, abort).",
    ["route", "finish_reason"],
    registry=None,
)
ABORTS = Counter(
    "lingcode_aborts",
    "Generations aborted: the client left, or the request was cancelled or superseded.",
    ["route"],
    registry=None,
)
ERRORS = Counter(
    "lingcode_generation_errors",
    "Generations that failed (queue full, engine error, engine unavailable), also after a stream had started.",
    ["route", "error"],
    registry=None,
)
GENERATED_TOKENS = Counter("lingcode_generated_tokens", "Output tokens.", ["route"], registry=None)
PROMPT_TOKENS = Counter("lingcode_prompt_tokens", "Prompt tokens, cached ones included.", ["route"], registry=None)

GENERATION_METRICS = (TTFT, TPOT, ACCEPTED, GENERATIONS, ABORTS, ERRORS, GENERATED_TOKENS, PROMPT_TOKENS)


def record_abort(label: str, generation_id: str) -> None:
    ABORTS.labels(label).inc()
    GENERATIONS.labels(label, "abort").inc()
    log.info(
        "generation %s aborted: the client stopped reading",
        generation_id,
        extra={"generation_id": generation_id, "finish_reason": "abort"},
    )


def record_error(label: str, generation_id: str, exc: Exception) -> None:
    ERRORS.labels(label, type(exc).__name__).inc()
    log.info(
        "generation %s failed: %s: %s",
        generation_id,
        type(exc).__name__,
        exc,
        extra={"generation_id": generation_id, "error": type(exc).__name__},
    )


def record_end(label: str, generation_id: str, chunk: "TextChunk") -> None:
    GENERATIONS.labels(label, chunk.finish_reason).inc()
    if chunk.finish_reason == "abort":
        ABORTS.labels(label).inc()
    timing, usage = chunk.timing, chunk.usage
    if timing is not None:
        if timing.ttft_ms is not None:
            TTFT.labels(label).observe(timing.ttft_ms / 1e3)
        if timing.tpot_ms is not None:
            TPOT.labels(label).observe(timing.tpot_ms / 1e3)
        if timing.accept_length is not None:
            ACCEPTED.labels(label).observe(timing.accept_length)
    if usage is not None:
        GENERATED_TOKENS.labels(label).inc(usage.completion_tokens)
        PROMPT_TOKENS.labels(label).inc(usage.prompt_tokens)
    fields = {"generation_id": generation_id, "finish_reason": chunk.finish_reason}
    if usage is not None:
        fields.update(
            prompt_tokens=usage.prompt_tokens,
            cached_tokens=usage.cached_tokens,
            completion_tokens=usage.completion_tokens,
        )
    if timing is not None:
        fields.update(ttft_ms=_round(timing.ttft_ms), tpot_ms=_round(timing.tpot_ms))
    log.info("generation %s finished: %s", generation_id, chunk.finish_reason, extra=fields)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


class StatsCollector:
    """Queue depth and the scheduler's and engine's counters, read from their stats() at scrape time."""

    def __init__(self, scheduler: "Scheduler"):
        self.scheduler = scheduler

    def collect(self) -> Iterator[Metric]:
        stats = self.scheduler.stats()
        yield GaugeMetricFamily("lingcode_queue_depth", "Requests waiting for the engine.", value=len(stats["queued"]))
        yield GaugeMetricFamily(
            "lingcode_queue_limit", "Requests that may wait before new ones get a 429.", value=stats["max_queue"]
        )
        yield GaugeMetricFamily(
            "lingcode_engine_busy", "1 while a request holds the engine.", value=int(stats["running"] is not None)
        )
        outcomes = CounterMetricFamily(
            "lingcode_scheduler_requests", "Scheduler counters (GET /v1/lingcode/stats).", labels=["outcome"]
        )
        for key, value in stats.items():
            if _is_number(value) and key != "max_queue":
                outcomes.add_metric([key], value)
        yield outcomes
        engine = GaugeMetricFamily(
            "lingcode_engine_stat", "The engine's own numbers (GET /v1/lingcode/stats).", labels=["stat"]
        )
        for key, value in self.scheduler.engine.stats().items():
            if _is_number(value):
                engine.add_metric([key], value)
        yield engine


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def registry_for(scheduler: "Scheduler") -> CollectorRegistry:
    """One daemon's registry: the process (memory, CPU, GC), generation metrics, and its scheduler's stats."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)  # process_resident_memory_bytes, process_cpu_seconds_total, ...
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    for metric in GENERATION_METRICS:
        registry.register(metric)
    registry.register(StatsCollector(scheduler))
    return registry

"""`lingcode bench soak`: weeks of a person's use, compressed: sequential agent turns with editor
completions and cancellations in between, against a real daemon, checking that nothing leaks.

The load is concurrency 1, as lingcode's users make it. Turn by turn:
- an agent turn: the conversation so far plus a new task (code in it, as agents send), streamed;
  the answer joins the history, so the next turn's prompt extends this one (the prefix cache at
  work). Conversations start over after a few turns, as agent tasks do;
- every few turns, an editor completion (/v1/completions, short) in between;
- some turns are cancelled mid-stream (the client closes the stream after a couple of events),
  and some completions are cancelled while they wait in the queue (their client gives up while a
  longer stream holds the engine).

Every few turns the daemon's resident memory (process_resident_memory_bytes from /metrics) is
sampled. At the end the daemon must be idle (nothing running, nothing queued), every request the
engine saw accounted for (finished + aborted + errors == requests, no errors), the KV cache
within the context, no request may have failed, and memory after warm-up may not have grown by
more than the bound. tests/test_soak.py runs a short one in CI; `lingcode bench soak` the full one.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from lingcode.bench import share_kernels, source_commit

if TYPE_CHECKING:
    import httpx

# httpx is imported where it is used: `lingcode --help` builds this command's options from here.

REPO = Path(__file__).resolve().parents[2]

TASKS = [
    "Explain what this function does, in two sentences.",
    "Find a bug in this code and say how to fix it.",
    "Suggest a better name for one variable here.",
    "Write a docstring for the first function.",
    "Is this code thread-safe? Answer briefly.",
    "Add a type hint to one function and show the line.",
]
COMPLETION_PREFIXES = [
    "def fibonacci(n):\n    ",
    "class Stack:\n    def __init__(self):\n        ",
    "import os\n\nfor name in os.listdir(",
    "def is_prime(n: int) -> bool:\n    ",
]


@dataclass
class SoakConfig:
    turns: int = 1000
    max_tokens: int = 24  # per agent turn
    completion_every: int = 3  # an editor completion after every third turn
    cancel_every: int = 7  # every seventh turn is cancelled mid-stream
    queued_cancel_every: int = 10  # every tenth turn, a completion is cancelled while it waits
    conversation_turns: int = 6  # an agent conversation starts over after this many turns
    warmup_turns: int = 20  # memory is measured from here on (allocators and caches settle first)
    sample_every: int = 10
    rss_growth_bound_mb: float = 256.0


@dataclass
class SoakReport:
    config: dict
    url: str
    started_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    duration_s: float = 0.0
    turns_done: int = 0
    counts: dict = field(default_factory=dict)
    rss_mb: list[tuple[int, float]] = field(default_factory=list)  # (turn, MB)
    rss_growth_mb: float | None = None
    kv_store_mb: float = 0.0  # saved KV prefixes at the end: bounded memory by design, outside the RSS bound
    ttft_ms: dict = field(default_factory=dict)
    cached_fraction: float | None = None  # of agent-turn prompt tokens, served from the KV cache
    engine_before: dict = field(default_factory=dict)
    engine_after: dict = field(default_factory=dict)
    scheduler_before: dict = field(default_factory=dict)
    scheduler_after: dict = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


class Soak:
    def __init__(self, url: str, token: str, config: SoakConfig, say: Callable[[str], None] = lambda _: None):
        self.config = config
        self.say = say
        import httpx

        self.http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=300)
        self.report = SoakReport(config=asdict(config), url=url)
        self.counts = dict.fromkeys(("agent_turns", "completions", "cancelled_mid_stream", "cancelled_queued"), 0)
        self.ttfts: list[float] = []
        self.prompt_tokens = self.cached_tokens = 0
        self.history: list[dict] = []
        self.code = (REPO / "lingcode" / "pipeline" / "scheduler.py").read_text().splitlines()

    # --- the load ---------------------------------------------------------------------------

    def run(self) -> SoakReport:
        started = time.perf_counter()
        before = self._stats()
        context_length = self.http.get("/v1/models").json()["data"][0]["context_length"]
        baseline = None
        try:
            for turn in range(self.config.turns):
                self._turn(turn)
                self.report.turns_done = turn + 1
                if turn + 1 == self.config.warmup_turns or (turn + 1) % self.config.sample_every == 0:
                    rss = self._rss_mb()
                    self.report.rss_mb.append((turn + 1, rss))
                    if turn + 1 >= self.config.warmup_turns and baseline is None:
                        baseline = rss
                    self.say(
                        f"turn {turn + 1}/{self.config.turns}: rss {rss:.0f} MB, {len(self.report.failures)} failures"
                    )
        except KeyboardInterrupt:  # Ctrl+C, or SIGTERM (see run()): check and report what ran so far
            self.report.failures.append(f"interrupted after {self.report.turns_done} of {self.config.turns} turns")
        after = self._wait_idle()
        self.report.duration_s = round(time.perf_counter() - started, 1)
        self._check(before, after, baseline, context_length)
        self.http.close()
        return self.report

    def _turn(self, turn: int) -> None:
        import httpx

        try:
            if (
                self.config.queued_cancel_every
                and turn % self.config.queued_cancel_every == self.config.queued_cancel_every - 1
            ):
                self._cancel_while_queued(turn)
            else:
                cancel = self.config.cancel_every and turn % self.config.cancel_every == self.config.cancel_every - 1
                self._agent_turn(turn, cancel=bool(cancel))
            if self.config.completion_every and turn % self.config.completion_every == self.config.completion_every - 1:
                self._completion(turn)
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            self.report.failures.append(f"turn {turn}: {type(exc).__name__}: {exc}")

    def _agent_messages(self, turn: int) -> list[dict]:
        if turn % self.config.conversation_turns == 0:
            self.history = [{"role": "system", "content": "You are a careful coding agent. Answer briefly."}]
        start = (turn * 7) % max(len(self.code) - 30, 1)
        snippet = "\n".join(self.code[start : start + 24])
        task = TASKS[turn % len(TASKS)]
        return [*self.history, {"role": "user", "content": f"{task}\n```python\n{snippet}\n```"}]

    def _agent_turn(self, turn: int, cancel: bool) -> None:
        messages = self._agent_messages(turn)
        body = {
            "messages": messages,
            "max_tokens": self.config.max_tokens,
            "temperature": 0.7,
            "seed": turn,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        text, events = [], 0
        with self.http.stream("POST", "/v1/chat/completions", json=body) as response:
            self._expect(response, turn, "agent turn")
            for event in _events(response):
                events += 1
                if "error" in event:
                    raise ValueError(f"error event: {event['error']}")
                if cancel and events == 2:
                    self.counts["cancelled_mid_stream"] += 1
                    return  # leaving the block closes the connection: the daemon aborts the request
                for choice in event.get("choices", []):
                    text.append(choice["delta"].get("content") or "")
                    if choice.get("finish_reason") and "timings" in event:
                        self.ttfts.append(event["timings"]["ttft_ms"])
                if event.get("usage"):
                    self.prompt_tokens += event["usage"]["prompt_tokens"]
                    self.cached_tokens += event["usage"]["prompt_tokens_details"]["cached_tokens"]
        self.counts["agent_turns"] += 1
        self.history = [*messages, {"role": "assistant", "content": "".join(text)}]

    def _completion(self, turn: int, timeout: float | None = None) -> None:
        prefix = COMPLETION_PREFIXES[turn % len(COMPLETION_PREFIXES)]
        body = {"prompt": prefix, "max_tokens": 8, "temperature": 0, "stop": ["\n\n"]}
        response = self.http.post("/v1/completions", json=body, timeout=timeout)
        self._expect(response, turn, "completion")
        self.counts["completions"] += 1

    def _cancel_while_queued(self, turn: int) -> None:
        """A long stream holds the engine; a completion waits behind it, and its client gives up; then
        the stream's client leaves too. The stream is long enough to outlast the wait on a fast
        engine (2048 tokens: ~5 s at the native CPU step's ~2.5 ms a token)."""
        import httpx

        messages = self._agent_messages(turn)
        body = {"messages": messages, "max_tokens": 2048, "ignore_eos": True, "stream": True, "temperature": 0}
        with self.http.stream("POST", "/v1/chat/completions", json=body) as response:
            self._expect(response, turn, "long stream")
            events = _events(response)
            next(events)  # it holds the engine now
            try:
                self._completion(turn, timeout=0.3)
            except httpx.TimeoutException:
                self.counts["cancelled_queued"] += 1
            for _, event in zip(range(8), events):  # it goes on after the completion left; then this client leaves
                if "error" in event:
                    raise ValueError(f"error event: {event['error']}")

    def _expect(self, response: httpx.Response, turn: int, what: str) -> None:
        if response.status_code != 200:
            response.read()
            raise ValueError(f"{what}: HTTP {response.status_code}: {response.text[:300]}")

    # --- measuring --------------------------------------------------------------------------

    def _stats(self) -> dict:
        return self.http.get("/v1/lingcode/stats").json()

    def _rss_mb(self) -> float:
        for line in self.http.get("/metrics").text.splitlines():
            if line.startswith("process_resident_memory_bytes "):
                return float(line.split()[1]) / 2**20
        raise ValueError("/metrics has no process_resident_memory_bytes")

    def _wait_idle(self, timeout_s: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout_s
        while True:
            now = self._stats()
            idle = now["scheduler"]["running"] is None and not now["scheduler"]["queued"]
            if (idle and now["engine"].get("running") is None) or time.monotonic() > deadline:
                return now
            time.sleep(0.05)

    def _check(self, before: dict, after: dict, baseline: float | None, context_length: int) -> None:
        report, fail = self.report, self.report.failures.append
        report.counts = dict(self.counts)
        report.engine_before, report.engine_after = _numbers(before["engine"]), _numbers(after["engine"])
        report.scheduler_before, report.scheduler_after = _numbers(before["scheduler"]), _numbers(after["scheduler"])
        if after["scheduler"]["running"] is not None or after["scheduler"]["queued"] or after["engine"].get("running"):
            fail(f"the daemon is not idle at the end (stuck): {after['scheduler']}")
        engine = {k: after["engine"][k] - before["engine"][k] for k in ("requests", "finished", "aborted", "errors")}
        if engine["requests"] != engine["finished"] + engine["aborted"] + engine["errors"]:
            fail(f"engine requests unaccounted for: {engine}")
        if engine["errors"]:
            fail(f"{engine['errors']} requests failed in the engine")
        sched = {
            k: after["scheduler"][k] - before["scheduler"][k]
            for k in ("submitted", "completed", "aborted", "dropped_while_queued")
        }
        # A request dropped while queued never ran: it is neither completed nor aborted.
        if sched["submitted"] != sched["completed"] + sched["aborted"] + sched["dropped_while_queued"]:
            fail(f"scheduler requests unaccounted for: {sched}")
        cancels = self.counts["cancelled_mid_stream"] + self.counts["cancelled_queued"]
        if sched["aborted"] + sched["dropped_while_queued"] < cancels:
            fail(
                f"{cancels} cancellations but only {sched['aborted']} aborts and {sched['dropped_while_queued']} drops"
            )
        if after["engine"].get("cached_context_tokens", 0) > context_length:
            fail(f"the KV cache holds {after['engine']['cached_context_tokens']} tokens, over the context")
        if baseline is not None and len(report.rss_mb) > 1:
            report.rss_growth_mb = round(
                max(mb for t, mb in report.rss_mb if t >= self.config.warmup_turns) - baseline, 1
            )
            # Saved KV prefixes (the engine's bounded store, for sessions) are memory by design: the
            # bound applies to everything else.
            store = after["engine"].get("kv_store", {})
            report.kv_store_mb = round(store.get("bytes", 0) / 2**20, 1)
            if store.get("bytes", 0) > store.get("max_bytes", 0):
                fail(f"the KV prefix store holds {store['bytes']} bytes, over its {store['max_bytes']}")
            if report.rss_growth_mb - report.kv_store_mb > self.config.rss_growth_bound_mb:
                fail(
                    f"resident memory grew by {report.rss_growth_mb} MB after warm-up, {report.kv_store_mb} MB "
                    f"of it saved KV prefixes (bound {self.config.rss_growth_bound_mb} MB for the rest)"
                )
        if self.ttfts:
            ordered = sorted(self.ttfts)
            report.ttft_ms = {
                "p50": round(statistics.median(ordered), 1),
                "p95": round(ordered[int(0.95 * (len(ordered) - 1))], 1),
            }
        if self.prompt_tokens:
            report.cached_fraction = round(self.cached_tokens / self.prompt_tokens, 3)


def _events(response: httpx.Response):
    for line in response.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line.removeprefix("data: "))


def _numbers(stats: dict) -> dict:
    return {k: v for k, v in stats.items() if isinstance(v, int | float) and not isinstance(v, bool)}


# --- `lingcode bench soak` ----------------------------------------------------------------------


def add_arguments(parser) -> None:
    defaults = SoakConfig()
    parser.add_argument("--turns", type=int, default=defaults.turns, help=f"agent turns (default: {defaults.turns})")
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=defaults.max_tokens,
        help=f"output tokens per agent turn (default: {defaults.max_tokens})",
    )
    parser.add_argument(
        "--rss-bound-mb",
        type=float,
        default=defaults.rss_growth_bound_mb,
        help="fail if resident memory grows more than this after warm-up (default: %(default)s)",
    )
    parser.add_argument("--model", help="model for the daemon the soak starts (default: the default model)")
    parser.add_argument("--device", default="cpu", choices=["auto", "cpu", "cuda"], help="(default: cpu)")
    parser.add_argument("--url", help="soak a daemon already running at URL instead of starting one")
    parser.add_argument("--token-file", help="with --url: its token file (default: this user's)")
    parser.add_argument("--out", help="write OUT.json and OUT.md (e.g. bench/results/soak-cpu-2026-11-29)")


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def run(args) -> int:
    config = SoakConfig(turns=args.turns, max_tokens=args.max_tokens, rss_growth_bound_mb=args.rss_bound_mb)
    signal.signal(signal.SIGTERM, _interrupt)  # a long run that is stopped still reports what it measured
    say = lambda line: print(line, flush=True)  # noqa: E731
    if args.url:
        from lingcode import paths

        token = Path(args.token_file or paths.token_file()).read_text().strip()
        report = Soak(args.url, token, config, say).run()
        stopped = None
    else:
        report, stopped = _with_own_daemon(args, config, say)
    result = {
        **asdict(report),
        "ok": report.ok and stopped in (None, True),
        "daemon_stopped_cleanly": stopped,
        "command": "lingcode " + " ".join(sys.argv[1:]),
        "commit": source_commit(),
    }
    print(summary(result))
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
        out.with_suffix(".md").write_text(summary(result) + "\n")
        print(f"results: {out.with_suffix('.json')}")
    return 0 if result["ok"] else 1


def _with_own_daemon(args, config: SoakConfig, say) -> tuple[SoakReport, bool]:
    """Start `lingcode serve` under a fresh LINGCODE_HOME, soak it, then SIGTERM it: it must exit 0, files gone."""
    from lingcode import models

    model_path = models.ensure(args.model)
    with tempfile.TemporaryDirectory(prefix="lingcode-soak-") as home:
        share_kernels(Path(home))
        env = {**os.environ, "LINGCODE_HOME": home}
        command = [
            sys.executable,
            "-m",
            "lingcode",
            "serve",
            "--model",
            str(model_path),
            "--port",
            "0",
            "--device",
            args.device,
            "--log-level",
            "warning",
        ]
        log_path = Path(home) / "daemon.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        daemon_file = Path(home) / "state" / "daemon.json"
        try:
            deadline = time.monotonic() + 300
            while not daemon_file.exists():
                if process.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"lingcode bench soak: the daemon did not start:\n{log_path.read_text()}")
                time.sleep(0.2)
            record = json.loads(daemon_file.read_text())
            say(f"soaking {record['model']} at {record['url']} (pid {record['pid']})")
            report = Soak(record["url"], Path(record["token_file"]).read_text().strip(), config, say).run()
            process.send_signal(signal.SIGTERM)
            stopped = process.wait(timeout=60) == 0 and not daemon_file.exists()
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    return report, stopped


def summary(result: dict) -> str:
    rss = result["rss_mb"]
    lines = [
        f"# lingcode bench soak, {result['started_at']}",
        "",
        f"- result: **{'pass' if result['ok'] else 'FAIL'}**",
        f"- command: `{result['command']}` (commit {result['commit']})",
        f"- turns: {result['turns_done']} of {result['config']['turns']} in {result['duration_s']} s; "
        f"counts: {result['counts']}",
        f"- resident memory: {rss[0][1]:.0f} MB at turn {rss[0][0]}, {rss[-1][1]:.0f} MB at turn {rss[-1][0]}; "
        f"growth after warm-up {result['rss_growth_mb']} MB (bound {result['config']['rss_growth_bound_mb']} MB)"
        if rss
        else "- resident memory: not sampled",
        f"- agent-turn TTFT ms: {result['ttft_ms']}; prompt tokens served from the KV cache: {result['cached_fraction']}",
        f"- engine counters, before -> after: {_delta(result['engine_before'], result['engine_after'])}",
        f"- scheduler counters, before -> after: {_delta(result['scheduler_before'], result['scheduler_after'])}",
        f"- daemon stopped cleanly (SIGTERM, exit 0, daemon.json removed): {result['daemon_stopped_cleanly']}",
        f"- failures: {result['failures'] or 'none'}",
    ]
    return "\n".join(lines)


def _delta(before: dict, after: dict) -> str:
    return ", ".join(f"{k} {before.get(k, 0)}->{v}" for k, v in after.items() if v != before.get(k))

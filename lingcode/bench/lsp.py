"""`lingcode bench lsp`: keystroke-to-suggestion latency of `lingcode lsp`, typing through a real file.

It opens a Python file of this repository in a real `lingcode lsp` process (which starts a
daemon with the options given; a daemon already running is refused unless --reuse-daemon, as
its options may not be the ones asked for, and the one started is stopped at the end) with a
stretch of it cut out, then types that stretch back one character
at a time: per keystroke, a didChange and a textDocument/inlineCompletion request, waiting for
each answer (a typist who waits for every suggestion). Per keystroke it records the time from
sending the keystroke to the answer, and from `lingcode/stats` whether the typed-ahead cache or
the engine answered and how many prompt tokens the engine prefilled.

The first request (a cold prompt, prefilled whole) is reported apart. This is a measurement, not
a test: numbers depend on the machine and on what else runs on it, so the load average and the
CPU are recorded with them.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

GOALS = {"fresh_p50_ms": 150.0, "typed_ahead_p50_ms": 5.0}


def main(args) -> int:
    import lingcode

    path = (args.file or Path(lingcode.__file__).parent / "pipeline" / "scheduler.py").resolve()
    if not path.is_file():
        print(f"lingcode bench lsp: {path} is not a file", file=sys.stderr)
        return 2
    lines = len(path.read_text().splitlines())
    if args.start_line is not None and not 0 <= args.start_line < lines:
        print(f"lingcode bench lsp: --start-line must be in [0, {lines}) for {path}", file=sys.stderr)
        return 2
    from lingcode.client import read_daemon_file

    running = read_daemon_file()
    if running is not None and not args.reuse_daemon:
        print(f"lingcode bench lsp: a lingcode daemon is already running (pid {running.pid}, {running.url}); "
              "the LSP would use it whatever its options. Stop it, or pass --reuse-daemon to measure it.",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        result = asyncio.run(replay(args, path))
    finally:
        started = read_daemon_file()
        if running is None and started is not None:  # the daemon the LSP started for this run
            stop_daemon(started.pid)
    result["daemon_started_by_bench"] = running is None
    table = render(result)
    print(table)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "lsp.md").write_text(table)
        (args.out / "lsp.json").write_text(json.dumps(result, indent=1) + "\n")
        print(f"\nwrote {args.out / 'lsp.md'} and {args.out / 'lsp.json'}", file=sys.stderr)
    return 0


async def replay(args, path: Path) -> dict:
    from lsprotocol import types
    from pygls.lsp.client import LanguageClient

    from lingcode import __version__
    from lingcode.cli import serve_options

    text = path.read_text()
    lines = text.splitlines(keepends=True)
    start_line = args.start_line if args.start_line is not None else len(lines) // 3
    start = sum(len(line) for line in lines[:start_line])
    typed = text[start : start + args.chars]
    document = text[:start] + text[start + len(typed) :]

    client = LanguageClient("lingcode-bench", __version__)
    client.feature(types.WINDOW_WORK_DONE_PROGRESS_CREATE)(lambda params: None)
    client.feature(types.PROGRESS)(lambda params: print(f"  {_message(params.value)}", file=sys.stderr))
    client.feature(types.WINDOW_LOG_MESSAGE)(lambda params: None)
    serve_args = serve_options(args, ("model", "device", "port"))
    options = {key: value for key, value in (("maxTokens", args.max_tokens), ("timeBudgetMs", args.time_budget_ms))
               if value is not None}  # fmt: skip
    await client.start_io(sys.executable, "-m", "lingcode", "lsp", *serve_args)
    capabilities = types.ClientCapabilities(window=types.WindowClientCapabilities(work_done_progress=True))
    await client.initialize_async(types.InitializeParams(
        capabilities=capabilities, root_uri=_root(path).as_uri(), initialization_options=options or None))  # fmt: skip
    client.initialized(types.InitializedParams())
    stats = await client.protocol.send_request_async("lingcode/stats", None)
    deadline = time.monotonic() + 600
    while stats.daemon is None:  # the LSP finds or starts the daemon: not part of the measurement
        if time.monotonic() > deadline:
            raise SystemExit("lingcode bench lsp: the daemon did not become ready in 600 s")
        await asyncio.sleep(0.2)
        stats = await client.protocol.send_request_async("lingcode/stats", None)
    uri = path.as_uri()
    client.text_document_did_open(types.DidOpenTextDocumentParams(types.TextDocumentItem(uri, "python", 1, document)))

    async def ask(position) -> tuple[float, str, dict]:
        context = types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic)
        began = time.perf_counter()
        answer = await client.text_document_inline_completion_async(
            types.InlineCompletionParams(context, types.TextDocumentIdentifier(uri), position))
        ms = (time.perf_counter() - began) * 1e3
        items = answer.items if answer is not None else []
        began = time.perf_counter()
        stats = await client.protocol.send_request_async("lingcode/stats", None)
        round_trips.append((time.perf_counter() - began) * 1e3)
        return ms, (items[0].insert_text if items else ""), stats

    round_trips: list[float] = []  # a request that does no work: what JSON-RPC over pipes costs here

    load_before = os.getloadavg()
    line, column, version = start_line, 0, 1
    ms, suggestion, stats = await ask(types.Position(line, column))
    cold = {"ms": round(ms, 3), **_figures(stats.last)}
    records = []
    for char in typed:
        matched = suggestion.startswith(char)
        version += 1
        at = types.Position(line, column)
        change = types.TextDocumentContentChangePartial(range=types.Range(at, at), text=char)
        began = time.perf_counter()
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            types.VersionedTextDocumentIdentifier(uri=uri, version=version), [change]))  # fmt: skip
        line, column = (line + 1, 0) if char == "\n" else (line, column + len(char.encode("utf-16-le")) // 2)
        before = stats
        ms, suggestion, stats = await ask(types.Position(line, column))
        ms = (time.perf_counter() - began) * 1e3
        source = "typed_ahead" if stats.cache_hits > before.cache_hits else "engine"
        record = {"char": char, "ms": round(ms, 3), "source": source, "typed_along": matched, "suggestion": suggestion}
        if source == "engine":
            record.update(_figures(stats.last))
        records.append(record)
    load_after = os.getloadavg()
    daemon = stats.daemon
    await client.shutdown_async(None)
    client.exit(None)
    await client.stop()
    return {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "file": str(path.relative_to(_root(path))) if path.is_relative_to(_root(path)) else str(path),
        "start_line": start_line, "chars": len(typed), "settings": options, "daemon_args": serve_args,
        "machine": {"cpu": _cpu(), "cores": os.cpu_count(), "python": platform.python_version(),
                    "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in load_after]},
        "daemon": None if daemon is None else {"url": daemon.url, "model": daemon.model},
        "cold": cold, "keystrokes": records, "summary": summarize(records),
        "lsp_internal_ms": {"typed_ahead": stats.cache_ms._asdict(), "engine": stats.engine_ms._asdict()},
        "stats_round_trip_ms": {"p50": _pct(round_trips, 0.5), "p95": _pct(round_trips, 0.95)},
    }  # fmt: skip


def stop_daemon(pid: int, timeout: float = 30.0) -> None:
    """SIGTERM the daemon (it removes daemon.json on the way out) and wait for it to exit."""
    import signal

    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    print(f"lingcode bench lsp: the daemon (pid {pid}) did not stop in {timeout:.0f} s", file=sys.stderr)


def _message(value) -> str:
    return value.get("message", "") if isinstance(value, dict) else getattr(value, "message", "") or ""


def _figures(last) -> dict:
    figures = {k: getattr(last, k, None) for k in ("prompt_tokens", "cached_tokens", "prefilled_tokens",
                                                    "completion_tokens", "ttft_ms", "daemon_ms")}  # fmt: skip
    figures["ended"] = getattr(last, "cut", None) or {"stop": "eos"}.get(last.finish_reason, last.finish_reason)
    return figures


def _root(path: Path) -> Path:
    for parent in path.parents:
        if (parent / "pyproject.toml").exists():
            return parent
    return path.parent


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)


def summarize(records: list[dict]) -> dict:
    fresh = [r for r in records if r["source"] == "engine"]
    hits = [r for r in records if r["source"] == "typed_ahead"]
    prefilled = [r["prefilled_tokens"] for r in fresh if r.get("prefilled_tokens") is not None]
    per_token = [(r["daemon_ms"] - r["ttft_ms"]) / (r["completion_tokens"] - 1)
                 for r in fresh if r.get("ttft_ms") and r.get("completion_tokens", 0) > 1]  # fmt: skip
    cuts: dict[str, int] = {}
    for r in fresh:
        cuts[str(r.get("ended"))] = cuts.get(str(r.get("ended")), 0) + 1
    return {
        "keystrokes": len(records),
        "typed_ahead_hits": len(hits),
        "typed_ahead_hit_rate": round(len(hits) / len(records), 3) if records else None,
        "engine_calls": len(fresh),
        "fresh_ms": {"p50": _pct([r["ms"] for r in fresh], 0.5), "p95": _pct([r["ms"] for r in fresh], 0.95)},
        "typed_ahead_ms": {"p50": _pct([r["ms"] for r in hits], 0.5), "p95": _pct([r["ms"] for r in hits], 0.95)},
        "all_ms": {"p50": _pct([r["ms"] for r in records], 0.5), "p95": _pct([r["ms"] for r in records], 0.95)},
        "ttft_ms": {"p50": _pct([r["ttft_ms"] for r in fresh if r.get("ttft_ms")], 0.5),
                    "p95": _pct([r["ttft_ms"] for r in fresh if r.get("ttft_ms")], 0.95)},
        "prefilled_tokens": {"p50": _pct(prefilled, 0.5), "p95": _pct(prefilled, 0.95),
                             "mean": round(statistics.fmean(prefilled), 2) if prefilled else None},
        "decode_ms_per_token": {"p50": _pct(per_token, 0.5), "p95": _pct(per_token, 0.95)},
        "prompt_tokens_mean": round(statistics.fmean(r["prompt_tokens"] for r in fresh), 1) if fresh else None,
        "non_empty_rate": round(sum(bool(r["suggestion"]) for r in records) / len(records), 3) if records else None,
        "cuts": cuts,
    }  # fmt: skip


def render(result: dict) -> str:
    s, m, cold = result["summary"], result["machine"], result["cold"]

    def goal(value, target):
        return "" if value is None else (" (goal <= %g ms: %s)" % (target, "met" if value <= target else "NOT met"))

    rows = [
        ("keystrokes typed", f"{s['keystrokes']} characters of {result['file']} from line {result['start_line']}"),
        ("typed-ahead hits", f"{s['typed_ahead_hits']} ({100 * (s['typed_ahead_hit_rate'] or 0):.1f} %)"),
        ("engine calls", str(s["engine_calls"])),
        ("keystroke -> suggestion, fresh (engine) p50 / p95",
         f"{s['fresh_ms']['p50']} / {s['fresh_ms']['p95']} ms{goal(s['fresh_ms']['p50'], GOALS['fresh_p50_ms'])}"),
        ("keystroke -> suggestion, typed-ahead hit p50 / p95",
         f"{s['typed_ahead_ms']['p50']} / {s['typed_ahead_ms']['p95']} ms"
         f"{goal(s['typed_ahead_ms']['p50'], GOALS['typed_ahead_p50_ms'])}"),
        ("keystroke -> suggestion, all keystrokes p50 / p95", f"{s['all_ms']['p50']} / {s['all_ms']['p95']} ms"),
        ("daemon time to first token, fresh p50 / p95", f"{s['ttft_ms']['p50']} / {s['ttft_ms']['p95']} ms"),
        ("daemon decode time per generated token p50 / p95",
         f"{s['decode_ms_per_token']['p50']} / {s['decode_ms_per_token']['p95']} ms"),
        ("typed-ahead lookup inside the LSP p50 / p95",
         f"{result['lsp_internal_ms']['typed_ahead']['p50']} / {result['lsp_internal_ms']['typed_ahead']['p95']} ms"),
        ("round trip of a request that does no work (`lingcode/stats`) p50 / p95",
         f"{result['stats_round_trip_ms']['p50']} / {result['stats_round_trip_ms']['p95']} ms"),
        ("tokens prefilled per engine call p50 / p95 / mean",
         f"{s['prefilled_tokens']['p50']} / {s['prefilled_tokens']['p95']} / {s['prefilled_tokens']['mean']}"),
        ("prompt tokens per engine call (mean)", str(s["prompt_tokens_mean"])),
        ("answers with a suggestion", f"{100 * (s['non_empty_rate'] or 0):.1f} %"),
        ("why suggestions ended", ", ".join(f"{k}: {v}" for k, v in sorted(s["cuts"].items()))),
        ("first request (cold prompt)", f"{cold['ms']:.0f} ms, {cold.get('prefilled_tokens')} tokens prefilled"),
    ]  # fmt: skip
    daemon = result["daemon"] or {}
    lines = [
        f"# lingcode bench lsp ({result['when']})",
        "",
        f"Model {daemon.get('model', '?')}; settings {result['settings'] or 'defaults'}; daemon options "
        f"{' '.join(result.get('daemon_args') or []) or 'defaults'}. Machine: {m['cpu']}, "
        f"{m['cores']} cores, Python {m['python']}; load average {m['load_before'][0]} before, "
        f"{m['load_after'][0]} after.",
        "",
        "| measure | value |",
        "|---|---|",
        *(f"| {name} | {value} |" for name, value in rows),
    ]
    return "\n".join(lines) + "\n"

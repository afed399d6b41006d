"""`lingcode bench load`: how long a fresh `lingcode serve` takes to be ready, and to its first token.

Each run starts a daemon process on a free port in a home of its own (LINGCODE_HOME in a temporary
directory; the model file and the built CPU kernels are this home's, shared, not copied), and times
from the process start to daemon.json (written once the daemon accepts connections) and a 200
from /health, then to the answer of a one-token completion. "cold": the prepared-model cache is
empty (the GGUF is read and prepared, the steps timed); "warm": a previous run left it. Runs
alternate cold, warm, cold, warm, ...; medians. The load average is recorded with the numbers.

Memory: the daemon's resident set once it answered, and after a prompt of --context tokens (the KV
cache takes memory as positions are used), with its peak; what a user needs free to run the model.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

from lingcode import models
from lingcode.bench import share_kernels, source_commit, usable_cpus, write_result

GOAL_S = 3.0


def one_run(home: Path, model: Path, context: int) -> dict:
    daemon_file = home / "state" / "daemon.json"
    env = {**os.environ, "LINGCODE_HOME": str(home)}
    argv = [sys.executable, "-m", "lingcode", "serve", "--port", "0", "--device", "cpu", "--model", str(model)]
    started = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        while not daemon_file.exists():
            if proc.poll() is not None:
                raise RuntimeError(f"lingcode serve exited with {proc.returncode}: {proc.stderr.read()[-2000:]}")
            time.sleep(0.01)
        record = json.loads(daemon_file.read_text())
        url, token = record["url"], Path(record["token_file"]).read_text().strip()
        while httpx.get(f"{url}/health", timeout=10).status_code != 200:
            time.sleep(0.01)
        ready = time.perf_counter()
        answer = httpx.post(
            f"{url}/v1/completions",
            headers={"Authorization": f"Bearer {token}"},
            timeout=120,
            json={"prompt": "def add(a, b):", "max_tokens": 1, "temperature": 0},
        )
        answer.raise_for_status()
        first = time.perf_counter()
        memory = {"rss_ready_mb": resident_mb(proc.pid)["VmRSS"]}
        if context:
            # One repeated line that tokenizes alike everywhere; one token of answer.
            long = httpx.post(
                f"{url}/v1/completions",
                headers={"Authorization": f"Bearer {token}"},
                timeout=1800,
                json={"prompt": [13] * (context - 1), "max_tokens": 1, "temperature": 0},
            )
            long.raise_for_status()
            after = resident_mb(proc.pid)
            memory.update(rss_context_mb=after["VmRSS"], rss_peak_mb=after["VmHWM"])
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return {"ready_s": round(ready - started, 2), "first_token_s": round(first - started, 2), **memory}


def resident_mb(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (the peak) of a process, in MB (Linux's /proc)."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = round(int(value.split()[0]) / 1024)
    return fields


def main(args) -> int:
    model = models.ensure(args.model)
    runs: dict[str, list[dict]] = {"cold": [], "warm": []}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="lingcode-bench-load-") as tmp:
        home = Path(tmp)
        share_kernels(home)
        for i in range(args.runs):
            for kind in ("cold", "warm"):
                if kind == "cold":
                    shutil.rmtree(home / "cache" / "prepared", ignore_errors=True)
                run = one_run(home, model, args.context)
                runs[kind].append(run)
                print(
                    f"{kind} {i + 1}/{args.runs}: ready {run['ready_s']:.2f} s, first token {run['first_token_s']:.2f} s, "
                    f"resident {run['rss_ready_mb']} MB, {run.get('rss_context_mb')} MB at {args.context} tokens",
                    flush=True,
                )
    rows = [
        {
            "cache": kind,
            "ready_s": statistics.median(r["ready_s"] for r in found),
            "first_token_s": statistics.median(r["first_token_s"] for r in found),
            **{
                key: statistics.median(r[key] for r in found)
                for key in ("rss_ready_mb", "rss_context_mb", "rss_peak_mb")
                if all(key in r for r in found)
            },
            "runs": found,
        }
        for kind, found in runs.items()
    ]
    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": source_commit(),
        "command": "lingcode bench load " + " ".join(sys.argv[3:]),
        "model": model.name,
        "runs": args.runs,
        "context": args.context,
        "cpus": usable_cpus(),
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "goal_s": GOAL_S,
        "rows": rows,
    }
    table = render(result)
    print(table)
    write_result(args.out, result, table)
    return 0


def render(result: dict) -> str:
    lines = [
        f"# lingcode bench load ({result['date']}, commit {result['commit']})",
        "",
        f"`{result['command']}`: {result['model']}, `lingcode serve --device cpu`, {result['runs']} runs per "
        f"cache state, alternating; {result['cpus']} CPUs; load average {result['loadavg_before'][0]:.2f} before, "
        f"{result['loadavg_after'][0]:.2f} after. Medians, seconds from the process start; goal: ready "
        f"within {result['goal_s']:.0f} s with a warm cache.",
        "",
        f"| prepared-model cache | ready (/health 200) | first token | resident once ready | at {result['context']} "
        "tokens (peak) | runs: ready / first token |",
        "|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        runs = ", ".join(f"{r['ready_s']:.1f} / {r['first_token_s']:.1f}" for r in row["runs"])
        at_context = f"{row['rss_context_mb']:.0f} MB ({row['rss_peak_mb']:.0f})" if "rss_context_mb" in row else "-"
        lines.append(
            f"| {row['cache']} | {row['ready_s']:.2f} | {row['first_token_s']:.2f} | {row['rss_ready_mb']:.0f} MB "
            f"| {at_context} | {runs} |"
        )
    return "\n".join(lines) + "\n"

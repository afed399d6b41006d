"""`lingcode bench startup`: how long a person waits for each command, in fresh processes.

Per command, the time from starting the process to its first byte of output and to its exit;
for `lingcode lsp`, from start to the answer to `initialize`. The commands run in turns (A, B,
C, A, B, C, ...) so that other work on the machine slows them alike; medians of --runs runs.
The load average and the CPU are recorded with the numbers: they depend on both.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime

from lingcode.bench import source_commit, usable_cpus, write_result

COMMANDS = (("--help",), ("models",), ("doctor",), ("sglang-args",), ("lsp", "--help"), ("pull",))
GOAL_MS = 300.0


def first_output(argv: list[str], env: dict) -> tuple[float, float]:
    """(ms to the first byte on stdout, ms to exit) of one fresh process."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    proc.stdout.read(1)
    first = time.perf_counter()
    proc.stdout.read()
    proc.wait()
    return (first - started) * 1e3, (time.perf_counter() - started) * 1e3


def lsp_initialize(env: dict) -> tuple[float, float]:
    """(ms from start to the answer to `initialize`, ms to exit after shutdown/exit) of `lingcode lsp`."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "lingcode", "lsp", "--no-start"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    send(
        proc,
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {"processId": None, "rootUri": None, "capabilities": {}},
        },
    )
    answer = receive(proc)
    initialized = time.perf_counter()
    if answer.get("id") != 1 or "result" not in answer:
        raise RuntimeError(f"lingcode lsp answered initialize with {answer}")
    send(proc, {"jsonrpc": "2.0", "id": 2, "method": "shutdown"})
    while receive(proc).get("id") != 2:
        pass
    send(proc, {"jsonrpc": "2.0", "method": "exit"})
    proc.stdin.close()
    proc.wait(timeout=30)
    return (initialized - started) * 1e3, (time.perf_counter() - started) * 1e3


def send(proc: subprocess.Popen, message: dict) -> None:
    body = json.dumps(message).encode()
    proc.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
    proc.stdin.flush()


def receive(proc: subprocess.Popen) -> dict:
    length = None
    while (line := proc.stdout.readline()) not in (b"\r\n", b""):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    if length is None:
        raise RuntimeError("lingcode lsp closed its output")
    return json.loads(proc.stdout.read(length))


def main(args) -> int:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    names = [" ".join(c) for c in COMMANDS] + ["lsp: initialize"]
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    load_before = os.getloadavg()
    for _ in range(args.runs):
        for command in COMMANDS:
            times[" ".join(command)].append(first_output([sys.executable, "-m", "lingcode", *command], env))
        times["lsp: initialize"].append(lsp_initialize(env))
    rows = [
        {
            "command": name,
            "first_output_ms": round(statistics.median(t[0] for t in runs), 1),
            "exit_ms": round(statistics.median(t[1] for t in runs), 1),
            "first_output_runs_ms": [round(t[0], 1) for t in runs],
        }
        for name, runs in times.items()
    ]
    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": source_commit(),
        "command": "lingcode bench startup " + " ".join(sys.argv[3:]),
        "runs": args.runs,
        "cpus": usable_cpus(),
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "python": sys.version.split()[0],
        "goal_ms": GOAL_MS,
        "rows": rows,
    }
    table = render(result)
    print(table)
    write_result(args.out, result, table)
    return 0


def render(result: dict) -> str:
    lines = [
        f"# lingcode bench startup ({result['date']}, commit {result['commit']})",
        "",
        f"`{result['command']}`: {result['runs']} runs per command, in turns; {result['cpus']} CPUs; "
        f"load average {result['loadavg_before'][0]:.2f} before, {result['loadavg_after'][0]:.2f} after; "
        f"Python {result['python']}. Medians; goal: first output within {result['goal_ms']:.0f} ms.",
        "",
        "| command | first output ms | exit ms | runs (first output ms) |",
        "|---|---|---|---|",
    ]
    for row in result["rows"]:
        runs = ", ".join(f"{t:.0f}" for t in row["first_output_runs_ms"])
        lines.append(f"| `lingcode {row['command']}` | {row['first_output_ms']:.0f} | {row['exit_ms']:.0f} | {runs} |")
    return "\n".join(lines) + "\n"

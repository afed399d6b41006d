"""`lingcode bench agent`: a scripted tool loop, time to first token per turn against context length.

The same script runs three ways against one daemon:
    session    POST /v1/sessions/{id}/turns with only the new messages (token-exact history)
    stateless  POST /v1/chat/completions with the whole conversation each turn, as agents do;
               prefix reuse still applies as far as the re-rendered prompt matches the cache
    cold       every `--cold-every` turns, the stateless prompt with a changing first line (the
               way a per-request attribution header breaks prefix caching): a full prefill
The script: a system prompt and one tool (read_file); each turn the model must call the tool
(tool_choice required, one call); the tool's result (a file excerpt of ~20 tokens) is the next
turn's new message. Greedy, --max-tokens per turn. Times are the daemon's own (`timings.ttft_ms`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path

from lingcode.bench import usable_cpus
from lingcode.client import Client, ensure_daemon

SYSTEM = "You are a coding agent working in a Python repository. Use the tools to inspect files before you answer."
TOOL = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a file of the project",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string", "maxLength": 24}},
            "required": ["path"],
        },
    },
}
TASK = "The tests in tests/test_parser.py fail. Find the bug and fix it."


def tool_result(turn: int) -> str:
    """A file excerpt: different every turn, about 20 tokens (100 turns stay inside an 8K context)."""
    return f"def handler_{turn}(request):\n    return request.get('key_{turn}')\n"


async def run_session(client: Client, turns: int, max_tokens: int) -> list[dict]:
    session = await client.post("/v1/sessions", {"messages": [{"role": "system", "content": SYSTEM}], "tools": [TOOL]})
    rows, new = [], [{"role": "user", "content": TASK}]
    for turn in range(1, turns + 1):
        reply = await client.post(
            f"/v1/sessions/{session['id']}/turns",
            {
                "messages": new,
                "max_tokens": max_tokens,
                "temperature": 0,
                "tool_choice": "required",
                "parallel_tool_calls": False,
            },
        )
        rows.append(_row(turn, reply))
        call_id = (reply["choices"][0]["message"].get("tool_calls") or [{"id": "call_0"}])[0]["id"]
        new = [{"role": "tool", "tool_call_id": call_id, "content": tool_result(turn)}]
    await client.delete(f"/v1/sessions/{session['id']}")
    return rows


async def run_stateless(client: Client, turns: int, max_tokens: int, cold_every: int) -> tuple[list[dict], list[dict]]:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    rows, cold = [], []
    for turn in range(1, turns + 1):
        body = {
            "messages": messages,
            "tools": [TOOL],
            "max_tokens": max_tokens,
            "temperature": 0,
            "tool_choice": "required",
            "parallel_tool_calls": False,
        }
        if cold_every and turn % cold_every == 0:
            nonce = [{"role": "system", "content": f"request {time.time_ns()}\n{SYSTEM}"}]
            cold.append(
                _row(
                    turn,
                    await client.post(
                        "/v1/chat/completions", {**body, "messages": nonce + messages[1:], "max_tokens": 1}
                    ),
                )
            )
        reply = await client.post("/v1/chat/completions", body)
        rows.append(_row(turn, reply))
        message = reply["choices"][0]["message"]
        calls = message.get("tool_calls") or []
        messages.append(
            {"role": "assistant", "content": message.get("content"), "tool_calls": calls}
            if calls
            else {"role": "assistant", "content": message.get("content") or ""}
        )
        call_id = calls[0]["id"] if calls else "call_0"
        messages.append(
            {"role": "tool", "tool_call_id": call_id, "content": tool_result(turn)}
            if calls
            else {"role": "user", "content": tool_result(turn)}
        )
    return rows, cold


def _row(turn: int, reply: dict) -> dict:
    usage, timings = reply["usage"], reply.get("timings", {})
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    return {
        "turn": turn,
        "context_tokens": usage["prompt_tokens"],
        "cached_tokens": cached,
        "prefilled_tokens": usage["prompt_tokens"] - cached,
        "completion_tokens": usage["completion_tokens"],
        "ttft_ms": timings.get("ttft_ms"),
        "total_ms": timings.get("total_ms"),
    }


def summarize(rows: list[dict]) -> dict:
    ttft = [r["ttft_ms"] for r in rows if r["ttft_ms"] is not None]
    return {
        "turns": len(rows),
        "ttft_ms_mean": round(statistics.mean(ttft), 1),
        "ttft_ms_median": round(statistics.median(ttft), 1),
        "ttft_ms_last10_mean": round(statistics.mean(ttft[-10:]), 1),
        "prefilled_tokens_total": sum(r["prefilled_tokens"] for r in rows),
        "context_tokens_last": rows[-1]["context_tokens"],
    }


def markdown(result: dict) -> str:
    session = {r["turn"]: r for r in result["session"]}
    stateless = {r["turn"]: r for r in result["stateless"]}
    cold = {r["turn"]: r for r in result["cold"]}
    lines = [
        f"# lingcode bench agent: {result['model']} ({result['engine']} engine)",
        "",
        f"{result['date']}, {result['machine']}; {result['turns']} turns, max_tokens {result['max_tokens']} per turn, greedy, "
        "tool_choice required. TTFT is the daemon's (request submitted -> first token). `prefilled` = prompt tokens "
        "not served from the KV cache.",
        "",
        "| turn | context (session) | session TTFT ms | session prefilled | context (stateless) | stateless TTFT ms | stateless prefilled | cold TTFT ms (full prefill) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    step = max(1, result["turns"] // 20)
    for turn in sorted(set(range(step, result["turns"] + 1, step)) | {1} | set(cold)):
        s, t, c = session.get(turn), stateless.get(turn), cold.get(turn)
        cell = lambda r, k: (
            "" if r is None or r.get(k) is None else f"{r[k]:.0f}" if isinstance(r[k], float) else str(r[k])
        )  # noqa: E731
        lines.append(
            f"| {turn} | {cell(s, 'context_tokens')} | {cell(s, 'ttft_ms')} | {cell(s, 'prefilled_tokens')} | "
            f"{cell(t, 'context_tokens')} | {cell(t, 'ttft_ms')} | {cell(t, 'prefilled_tokens')} | {cell(c, 'ttft_ms')} |"
        )
    lines += [
        "",
        "| mode | mean TTFT ms | median TTFT ms | last 10 turns mean TTFT ms | prefilled tokens, all turns |",
        "|---|---:|---:|---:|---:|",
    ]
    for mode in ("session", "stateless", "cold"):
        if result["summary"].get(mode):
            s = result["summary"][mode]
            lines.append(
                f"| {mode} | {s['ttft_ms_mean']} | {s['ttft_ms_median']} | {s['ttft_ms_last10_mean']} | {s['prefilled_tokens_total']} |"
            )
    return "\n".join(lines) + "\n"


async def bench(turns: int, max_tokens: int, cold_every: int, serve_args: list[str]) -> dict:
    daemon = ensure_daemon(serve_args, on_progress=lambda line: print(f"  {line}", flush=True))
    client = Client(daemon)
    try:
        models = await client.get("/v1/models")
        print(f"bench agent: {turns} turns against {daemon.url} ({models['data'][0]['id']})", flush=True)
        session = await run_session(client, turns, max_tokens)
        print(f"  session:   done, last context {session[-1]['context_tokens']} tokens", flush=True)
        stateless, cold = await run_stateless(client, turns, max_tokens, cold_every)
        print(f"  stateless: done, last context {stateless[-1]['context_tokens']} tokens", flush=True)
    finally:
        await client.aclose()
    result = {
        "benchmark": "agent",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "model": models["data"][0]["id"],
        "engine": daemon.engine,
        "machine": f"{platform.machine()}, {usable_cpus()} CPUs, {platform.system()}",
        "turns": turns,
        "max_tokens": max_tokens,
        "cold_every": cold_every,
        "session": session,
        "stateless": stateless,
        "cold": cold,
    }
    result["summary"] = {
        "session": summarize(session),
        "stateless": summarize(stateless),
        "cold": summarize(cold) if cold else None,
    }
    return result


def main(args: argparse.Namespace) -> int:
    result = asyncio.run(bench(args.turns, args.max_tokens, args.cold_every, args.serve_args or []))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"agent-{result['model']}-{result['date'][:10]}"
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / f"{stem}.md").write_text(markdown(result))
    print(markdown(result))
    print(f"wrote {out / stem}.json and .md")
    return 0

"""An editor completion between two turns of a long chat, through a real daemon (client-side, httpx).

Each round: a chat request whose prompt pastes several functions of Python's standard library (a
conversation of ~2,500-3,500 tokens), then an editor completion on another function
(`/v1/lingcode/complete`, 16 tokens), then the chat's next turn (streamed). The completion
displaces the conversation from the KV cache, so the engine saves it to the prefix store first;
the next turn restores it. Reported per round, and as medians: the completion's whole answer and
its first token, the next turn's first token (client-side), and the engine's own first chunk of
each. Run it at two commits to compare them:

    python bench/completion_between_turns.py --rounds 10 --out bench/results/NAME.json
"""

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from lingcode.bench import source_commit
from lingcode.bench.daemon import Daemon, stdlib_functions

MEASURES = ("completion_ms", "completion_ttft_ms", "completion_first_chunk_ms", "turn_ttft_ms", "turn_first_chunk_ms")


async def one_round(client: httpx.AsyncClient, r: int, functions: int) -> dict:
    fns = stdlib_functions()
    start = r * 7 % len(fns)
    text = "\n\n".join(source for _, source in fns[start : start + functions])
    messages = [{"role": "user", "content": f"Review these functions:\n```python\n{text}\n```"}]
    answer = (
        await client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 16, "temperature": 0})
    ).json()
    messages += [answer["choices"][0]["message"], {"role": "user", "content": "Which one is the longest?"}]
    code = fns[(r * 13 + 5) % len(fns)][1]
    started = time.perf_counter()
    completion = (
        await client.post(
            "/v1/lingcode/complete",
            json={"prefix": code[: len(code) // 2], "path": "x.py", "max_tokens": 16, "time_budget_ms": None},
        )
    ).json()
    completion_ms = (time.perf_counter() - started) * 1e3
    after_completion = (await client.get("/v1/lingcode/stats")).json()["engine"]
    started, first = time.perf_counter(), None
    body = {"messages": messages, "max_tokens": 8, "temperature": 0, "stream": True}
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        async for line in response.aiter_lines():
            if first is None and line.startswith("data: {") and '"content":"' in line:
                first = (time.perf_counter() - started) * 1e3
    after_turn = (await client.get("/v1/lingcode/stats")).json()["engine"]
    return {
        "round": r,
        "conversation_tokens": answer["usage"]["prompt_tokens"],
        "completion_ms": completion_ms,
        "completion_ttft_ms": completion["timings"]["ttft_ms"],
        "completion_first_chunk_ms": after_completion["last_request"]["first_chunk_ms"],
        "turn_ttft_ms": first,
        "turn_first_chunk_ms": after_turn["last_request"]["first_chunk_ms"],
        "turn_cached_tokens": after_turn["last_request"]["cached_tokens"],
        "kv_store": after_turn["kv_store"],
    }


async def run(args) -> list[dict]:
    home = Path(tempfile.mkdtemp(prefix="lingcode-between-turns-"))
    daemon = Daemon(["--device", args.device], home)
    rows = []
    try:
        headers = {"Authorization": f"Bearer {daemon.token}"}
        async with httpx.AsyncClient(base_url=daemon.url, headers=headers, timeout=600) as client:
            for r in range(args.rounds + 1):  # round 0 warms up
                row = await one_round(client, r, args.functions)
                print(json.dumps({k: v for k, v in row.items() if k != "kv_store"}), flush=True)
                if r:
                    rows.append(row)
    finally:
        daemon.stop()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--functions", type=int, default=12, help="standard-library functions in the conversation")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rows = asyncio.run(run(args))
    medians = {k: round(statistics.median(r[k] for r in rows), 2) for k in MEASURES}
    print(json.dumps(medians))
    if args.out is not None:
        args.out.write_text(
            json.dumps(
                {
                    "commit": source_commit(),
                    "args": vars(args) | {"out": str(args.out)},
                    "medians": medians,
                    "rounds": rows,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()

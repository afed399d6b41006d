"""What streaming a completion costs the engine: the same suggestions asked for whole (one POST, as
`lingcode lsp` asks) and streamed (one SSE event a token), alternating, on the running daemon.

Each pair asks for the same prompt (this repo's lingcode/pipeline/scheduler.py around a cursor, another file as
context) both ways, in turns, so the prompts, drafts and tokens are the same; only the delivery
differs. On a machine whose cores all run the engine's step, every streamed event wakes the
daemon's writer and the client between steps.

lingcode serve --device cpu &        (or with --compile)
python3 bench/lsp_stream_cost.py [pairs] [tokens]
"""

import json
import statistics
import sys
import time
from pathlib import Path

import httpx

from lingcode.client import read_daemon_file

ROOT = Path(__file__).resolve().parent.parent
pairs = int(sys.argv[1]) if len(sys.argv) > 1 else 14
tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 10
daemon = read_daemon_file()
if daemon is None:
    sys.exit("no lingcode daemon is running: start one with `lingcode serve --device cpu`")
source = (ROOT / "lingcode/pipeline/scheduler.py").read_text()
cursor = source.index("def ", 3000)
context = [{"path": "lingcode/pipeline/generation.py", "text": (ROOT / "lingcode/pipeline/generation.py").read_text()[:1500]}]
http = httpx.Client(base_url=daemon.url, headers={"Authorization": f"Bearer {daemon.token}"}, timeout=120)


def ask(typed: str, stream: bool) -> tuple[float, dict]:
    """Wall ms from the request to the whole answer, and the answer's timings."""
    body = {"prefix": source[:cursor] + typed, "suffix": source[cursor:], "path": "lingcode/pipeline/scheduler.py",
            "language": "python", "context": context, "max_tokens": tokens, "multiline": True,
            "time_budget_ms": None, "stream": stream}  # fmt: skip
    started = time.perf_counter()
    if stream:
        final = {}
        with http.stream("POST", "/v1/lingcode/complete", json=body) as response:
            for line in response.iter_lines():
                if line.startswith("data:") and '"finish_reason"' in line:
                    final = json.loads(line[5:])
    else:
        final = http.post("/v1/lingcode/complete", json=body).json()
    return (time.perf_counter() - started) * 1e3, final["timings"]


ask("", False)  # warm: the prompt's KV cache and the step
runs = {"whole": [], "streamed": []}
for i in range(pairs):
    for stream in (False, True) if i % 2 else (True, False):
        wall, timings = ask(f"def case_{i}", stream)
        runs["streamed" if stream else "whole"].append((wall, timings["tpot_ms"], timings.get("accept_length")))
print(f"daemon {daemon.url} ({daemon.model}); {pairs} pairs of {tokens}-token suggestions, alternating")
for name, rows in runs.items():
    wall, tpot = statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows)
    print(f"{name:9} wall p50 {wall:.1f} ms, ms per token after the first p50 {tpot:.1f}")
same = [a[2] == b[2] for a, b in zip(runs["whole"], runs["streamed"])]
ratio = statistics.median(r[0] for r in runs["streamed"]) / statistics.median(r[0] for r in runs["whole"])
print(f"streamed / whole wall (medians): {ratio:.3f}; same tokens per step in {sum(same)} of {len(same)} pairs")

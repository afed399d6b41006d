"""The first request of each kind to a freshly started daemon, against the second of its kind.

    python first_requests.py --tree new=/work/main --tree old=/tmp/old --starts 3 --out runs.json

Each start runs `python -m lingcode serve --port 0 --device D --speculation off` from one tree
(its own LINGCODE_HOME, kept across its starts, so the prepared model is built once), trees
alternating, with the engine in the daemon's process and then in one of its own
(LINGCODE_ENGINE_PROCESS; --placements). Once it answers /health, one request of each kind, in KINDS' order,
each followed by another of the same kind with a different prompt, every one traced
(x-lingcode-trace): the daemon's `until_engine` (its own time before the engine had the
request) and `grammar` stages, and the client's time to the whole answer (4 tokens).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]  # fmt: skip
SOURCE = inspect.getsource(inspect)
KINDS = {  # name: (path, body for the n-th request of the kind)
    "editor": ("/v1/lingcode/complete", lambda n: {"prefix": SOURCE[: 3000 + 300 * n], "suffix": "", "path": "inspect.py",
                                                   "language": "python", "max_tokens": 4}),
    "chat": ("/v1/chat/completions", lambda n: {"messages": [{"role": "user", "content": f"Name {n + 2} sorting algorithms."}],
                                                "max_tokens": 4}),
    "tools": ("/v1/chat/completions", lambda n: {"messages": [{"role": "user", "content": f"Read file{n}.py"}],
                                                 "tools": TOOLS, "max_tokens": 4}),
    "json": ("/v1/chat/completions", lambda n: {"messages": [{"role": "user", "content": f"{n + 2} colours as JSON."}],
                                                "response_format": {"type": "json_object"}, "max_tokens": 4}),
    "forced": ("/v1/chat/completions", lambda n: {"messages": [{"role": "user", "content": f"Open main{n}.py"}],
                                                  "tools": TOOLS, "tool_choice": "required", "max_tokens": 4}),
    "anthropic": ("/v1/messages", lambda n: {"model": "m", "max_tokens": 4,
                                             "messages": [{"role": "user", "content": f"Say {n + 2} words."}]}),
    "responses": ("/v1/responses", lambda n: {"model": "m", "input": f"Count to {n + 2}.", "max_output_tokens": 4}),
}


def start(tree: Path, home: Path, engine_process: str, device: str, model: str | None
          ) -> tuple[subprocess.Popen, str, str]:  # fmt: skip
    (home / "state" / "daemon.json").unlink(missing_ok=True)
    env = {**os.environ, "LINGCODE_HOME": str(home), "LINGCODE_ENGINE_PROCESS": engine_process}
    model_args = ["--model", model] if model else []
    proc = subprocess.Popen([sys.executable, "-m", "lingcode", "serve", "--port", "0", "--device", device,
                             "--speculation", "off", *model_args], cwd=tree, env=env,
                            stdout=(home / "serve.log").open("w"), stderr=subprocess.STDOUT)  # fmt: skip
    record = home / "state" / "daemon.json"
    while not record.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"lingcode serve from {tree} exited {proc.returncode}: "
                               f"{(home / 'serve.log').read_text()[-2000:]}")  # fmt: skip
        time.sleep(0.1)
    info = json.loads(record.read_text())
    return proc, info["url"], Path(info["token_file"]).read_text().strip()


def requests(url: str, token: str) -> dict:
    headers = {"Authorization": f"Bearer {token}", "x-lingcode-trace": "1", "anthropic-version": "2023-06-01"}
    out = {}
    with httpx.Client(base_url=url, headers=headers, timeout=120) as client:
        client.get("/health")
        for kind, (path, body) in KINDS.items():
            for n in (0, 1):
                started = time.perf_counter()
                response = client.post(path, json=body(n))
                elapsed = (time.perf_counter() - started) * 1e3
                response.raise_for_status()
                data = response.json()
                timings = data.get("timings") or data.get("usage", {}).get("timings") or {}
                trace = timings.get("trace", {})
                out[f"{kind} {n}"] = {"client_ms": elapsed, "until_engine": trace.get("until_engine"),
                                      "grammar": trace.get("grammar")}  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tree", action="append", required=True, help="LABEL=PATH of a source tree")
    parser.add_argument("--starts", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", help="a .gguf file (default: the daemon's own default)")
    parser.add_argument("--placements", default="0,1", help="LINGCODE_ENGINE_PROCESS values, in order")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    trees = dict(t.split("=", 1) for t in args.tree)
    homes = {label: Path(tempfile.mkdtemp(prefix=f"first-{label}-")) for label in trees}
    runs = []
    placements = args.placements.split(",")
    for engine_process in placements:
        for i in range(args.starts):
            for label, tree in trees.items():
                proc, url, token = start(Path(tree), homes[label], engine_process, args.device, args.model)
                try:
                    runs.append({"tree": label, "engine_process": engine_process, "start": i,
                                 "requests": requests(url, token)})  # fmt: skip
                finally:
                    proc.terminate()
                    proc.wait()
                print(label, engine_process, i, flush=True)
    Path(args.out).write_text(json.dumps(runs, indent=1))
    # medians over starts: until_engine (ms), first / second of each kind
    for engine_process in placements:
        print(f"\nengine in its own process: {engine_process == '1'}; until_engine ms, first / second "
              "(median of starts); client ms for the first")
        print("| kind | " + " | ".join(trees) + " |")
        print("|---|" + "---|" * len(trees))
        for kind in KINDS:
            cells = []
            for label in trees:
                rs = [r["requests"] for r in runs if r["tree"] == label and r["engine_process"] == engine_process]
                first = statistics.median(r[f"{kind} 0"]["until_engine"] for r in rs)
                second = statistics.median(r[f"{kind} 1"]["until_engine"] for r in rs)
                client = statistics.median(r[f"{kind} 0"]["client_ms"] for r in rs)
                cells.append(f"{first:.2f} / {second:.2f} ({client:.0f})")
            print(f"| {kind} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()

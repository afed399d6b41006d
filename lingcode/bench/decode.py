"""`lingcode bench`: batch-1 decode speed on named workloads, variants side by side in one run.

Every request of a workload runs once per variant, alternating (A, B, A, B, ...), so a noisy
machine slows all variants alike. Variants are the engine's speculation modes and, optionally,
the peers a user would otherwise pick on the same weights: transformers `generate` (eager, and
with its static cache) and llama.cpp through llama-cpp-python on the same GGUF. Each engine runs
in a process of its own (worker.py), fed the same prompts as token ids, with the same thread
count, and timed by the same code.

Per request: TTFT (request start -> first token), TPOT ((last - first token) / (tokens - 1)),
tokens, tokens per verify step when drafting, and whether the tokens are the first variant's.
Results are JSON, Markdown and a PNG plot (--out).
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from lingcode.bench import source_commit

# torch and jinja2 are imported where they are used: `lingcode --help` builds this command's options from here.

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Request:
    input_ids: list[int]
    max_tokens: int
    ignore_eos: bool


@dataclass
class Result:
    workload: str
    variant: str
    prompt_tokens: int
    tokens: int
    ttft_ms: float
    tpot_ms: float | None
    accept_length: float | None
    request: int  # index in the plan: the same prompt for every variant
    same_as_first: bool  # the same tokens as the first variant's on this request (greedy)
    served: int  # requests its worker had answered, this one included (warm-up too)
    token_ids: list[int]


# --- workloads ----------------------------------------------------------------------------------


def _code_sample(lines: int = 40) -> str:
    """Real code to edit or complete: the start of this repository's scheduler."""
    text = (REPO / "lingcode" / "pipeline" / "scheduler.py").read_text()
    return "\n".join(text.splitlines()[:lines]) + "\n"


# Code that is neither lingcode's nor a benchmark's own, for the context workloads: this Python's
# standard library, file after file (the same files on every machine with the same Python).
HELD_OUT_FILES = (
    "textwrap.py",
    "argparse.py",
    "dataclasses.py",
    "tarfile.py",
    "http/client.py",
    "typing.py",
    "inspect.py",
    "difflib.py",
    "shutil.py",
    "subprocess.py",
    "configparser.py",
    "ast.py",
)
CONTEXT_STRIDE = 1000  # request i of a context workload starts this many tokens later in the files


def held_out_code(tokenizer, tokens: int) -> list[int]:
    """At least `tokens` tokens of the standard library's code (fewer if it runs out)."""
    import sysconfig

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    ids: list[int] = []
    for name in HELD_OUT_FILES:
        ids += tokenizer.encode(f"# {name}\n{(stdlib / name).read_text(encoding='utf-8')}")
        if len(ids) >= tokens:
            break
    return ids


def context_length(name: str) -> int | None:
    """L for a workload named context:L (a prompt of L tokens of held-out code), else None."""
    kind, _, length = name.partition(":")
    return int(length) if kind == "context" and length.isdigit() and int(length) > 0 else None


def workload_requests(name: str, tokenizer, chat_template: str, n: int, max_tokens: int) -> list[Request]:
    def chat(text: str) -> list[int]:
        from lingcode.text.chat_template import render_chat

        return tokenizer.encode(render_chat(chat_template, [{"role": "user", "content": text}]))

    length = context_length(name)
    if length is not None:  # a long prompt of real code, continued: prefill and decode at that context
        code = held_out_code(tokenizer, length + CONTEXT_STRIDE * (n - 1))
        if len(code) < length + CONTEXT_STRIDE * (n - 1):
            raise ValueError(f"{name}: the held-out files give only {len(code)} tokens")
        return [Request(code[CONTEXT_STRIDE * i : CONTEXT_STRIDE * i + length], max_tokens, True) for i in range(n)]
    if name == "random":  # random prompt tokens, a fixed number of output tokens
        import torch

        gen = torch.Generator().manual_seed(0)
        return [Request(torch.randint(100, 40000, (512,), generator=gen).tolist(), max_tokens, True) for _ in range(n)]
    if name == "chat":
        questions = [
            "Explain what a hash map is.",
            "Write a haiku about autumn.",
            "How do I sort a list in Python?",
            "What causes the seasons on Earth?",
            "Give three tips for writing clean code.",
        ]
        return [Request(chat(questions[i % len(questions)]), max_tokens, True) for i in range(n)]
    code = _code_sample()
    if name == "completion":  # plain continuation of a file, repository-style header
        lines = code.splitlines(keepends=True)
        return [
            Request(
                tokenizer.encode(f"<filename>lingcode/pipeline/scheduler.py\n{''.join(lines[: 15 + 3 * i])}"),
                max_tokens,
                True,
            )
            for i in range(n)
        ]
    if name == "code-edit":  # the answer copies most of the prompt: where drafting from context shines
        edits = [
            "Rename the class Scheduler to SlotScheduler",
            "Rename max_queue to queue_limit",
            "Rename the exception QueueFull to QueueOverflow",
        ]
        return [
            Request(
                chat(f"{edits[i % len(edits)]} and output the whole edited code:\n```python\n{code}```"),
                max_tokens,
                False,
            )
            for i in range(n)
        ]
    raise ValueError(f"unknown workload {name!r}: random, chat, completion, code-edit, context:L")


WORKLOADS = ("random", "chat", "completion", "code-edit", "context:L")


# --- the workers ----------------------------------------------------------------------------------


class Worker:
    """An engine in a process of its own (worker.py), answering requests over a pipe."""

    def __init__(self, name: str, argv: list[str], threads: int, env: dict | None = None):
        self.name = name
        self.log = tempfile.TemporaryFile(mode="w+")  # its stderr, shown if it fails
        env = os.environ | {"OMP_NUM_THREADS": str(threads)} | (env or {})
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True, env=env
        )
        self.ready = self._read()["ready"]

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            self.log.seek(0)
            tail = "\n".join(self.log.read().splitlines()[-20:])
            raise WorkerFailed(f"the {self.name} worker exited ({self.proc.returncode}):\n{tail}")
        reply = json.loads(line)
        if "error" in reply:
            raise WorkerFailed(f"the {self.name} worker: {reply['error']}")
        return reply

    def ask(self, message: dict) -> dict:
        try:
            self.proc.stdin.write(json.dumps(message) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # it has exited: _read says how
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


class WorkerFailed(RuntimeError):
    pass


def llama_cpp_python(option: str | None) -> str:
    """The interpreter that runs the llama.cpp peer: --llama-cpp-python, $LINGCODE_LLAMA_CPP_PYTHON,
    the venv `make llama-cpp-peer` builds in this checkout, or this one."""
    built = REPO / ".venv-llama-cpp" / "bin" / "python"
    return option or os.environ.get("LINGCODE_LLAMA_CPP_PYTHON") or (str(built) if built.exists() else sys.executable)


def check_peer(peer: str, python: str, model_path: Path) -> str | None:
    """Why `peer` cannot run here, or None."""
    if peer in ("transformers-eager", "transformers-static"):
        if importlib.util.find_spec("transformers") is None:
            return f"{peer}: transformers is not installed in {sys.executable} (pip install transformers)"
        return None
    if peer.startswith("llama.cpp"):
        if model_path.is_dir() or model_path.suffix != ".gguf":
            return f"llama.cpp: needs a GGUF model, not {model_path}"
        try:
            done = subprocess.run([python, "-c", "import llama_cpp"], capture_output=True, text=True)
        except OSError as e:
            done = subprocess.CompletedProcess([], 1, "", str(e))
        if done.returncode != 0:
            return (
                f"llama.cpp: {python} cannot import llama_cpp. Build llama-cpp-python in a venv of its own "
                "(`make llama-cpp-peer`; bench/README.md), or pass --llama-cpp-python PATH/bin/python or set "
                "LINGCODE_LLAMA_CPP_PYTHON"
            )
        return None
    return f"unknown peer {peer!r} (choose from {', '.join(PEERS)})"


PEERS = ("transformers-eager", "transformers-static", "llama.cpp", "llama.cpp-passive", "llama.cpp-fa")
# llama.cpp's threads meet at an OpenMP barrier after every op, hundreds of times a token, and by
# default libgomp spins there before it sleeps: on a machine whose cores other work also wants, a
# thread spins away the time of the one it waits for. -passive sleeps at once (bench/README.md).
PEER_ENV = {"llama.cpp-passive": {"OMP_WAIT_POLICY": "passive"}}
# -fa: llama.cpp's flash attention (llama-cpp-python leaves it off; llama-server's default turns it on
# where the backend has it, the CPU's included), which changes its speed at long contexts.
PEER_OPTIONS = {"llama.cpp-fa": ["--flash-attn"]}


# --- the run ------------------------------------------------------------------------------------


@dataclass
class Report:
    command: str
    hardware: str
    date: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    commit: str = ""
    threads: int = 0
    load_avg: dict = field(default_factory=dict)  # /proc/loadavg's 1-minute figure before and after
    load_s: dict = field(default_factory=dict)
    workers: dict = field(default_factory=dict)  # per engine: pid, versions, build, load time
    summary: list[dict] = field(default_factory=list)
    requests: list[dict] = field(default_factory=list)


def hardware(device: str, threads: int) -> str:
    if device == "cuda":
        import torch

        return f"{torch.cuda.get_device_name()} (1 GPU)"
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, {threads} threads"


def summarize(results: list[Result]) -> list[dict]:
    rows = []
    for workload in dict.fromkeys(r.workload for r in results):
        base = None
        for variant in dict.fromkeys(r.variant for r in results):
            rs = [r for r in results if r.workload == workload and r.variant == variant]
            tpots = [r.tpot_ms for r in rs if r.tpot_ms]
            if not rs or not tpots:
                continue
            tokens, decode_ms = sum(r.tokens - 1 for r in rs), sum((r.tokens - 1) * r.tpot_ms for r in rs if r.tpot_ms)
            accepts = [r.accept_length for r in rs if r.accept_length]
            row = {
                "workload": workload,
                "variant": variant,
                "requests": len(rs),
                "tpot_ms_median": round(statistics.median(tpots), 3),
                "tpot_ms_mean": round(statistics.mean(tpots), 3),
                "output_tok_s": round(1000 * tokens / decode_ms, 1) if decode_ms else None,
                "ttft_ms_median": round(statistics.median(r.ttft_ms for r in rs), 2),
                # the prompt's tokens over the time to the first token: the prefill rate, for long prompts
                "prefill_tok_s": round(statistics.median(r.prompt_tokens / r.ttft_ms * 1e3 for r in rs), 1),
                "accept_length_mean": round(statistics.mean(accepts), 2) if accepts else None,
                "same_tokens_as_first": sum(r.same_as_first for r in rs),
            }
            base = base or row
            row["tpot_vs_first"] = round(row["tpot_ms_median"] / base["tpot_ms_median"], 2)
            rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    cols = [
        "workload",
        "variant",
        "requests",
        "tpot_ms_median",
        "tpot_ms_mean",
        "output_tok_s",
        "ttft_ms_median",
        "prefill_tok_s",
        "accept_length_mean",
        "same_tokens_as_first",
        "tpot_vs_first",
    ]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join("" if r[c] is None else str(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def plot(results: list[Result], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    variants = list(dict.fromkeys(r.variant for r in results))
    ax1.boxplot([[r.tpot_ms for r in results if r.variant == v and r.tpot_ms] for v in variants])
    ax1.set_xticks(range(1, len(variants) + 1), variants, rotation=20, fontsize=8)
    ax1.set_ylabel("ms per output token")
    ax1.set_title("TPOT per request (all workloads)")
    for v in variants:
        accepts = [r.accept_length for r in results if r.variant == v and r.accept_length]
        if accepts:
            ax2.hist(accepts, bins=20, alpha=0.6, label=v)
    ax2.set_xlabel("tokens per verify step (mean per request)")
    ax2.set_title("accepted tokens per step")
    if ax2.get_legend_handles_labels()[0]:
        ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def run(args) -> int:
    from lingcode import models

    workloads = [w for w in args.workload.split(",") if w]
    unknown = [w for w in workloads if w not in WORKLOADS and context_length(w) is None]
    if unknown:
        print(
            f"lingcode bench: unknown workload {', '.join(unknown)} (choose from {', '.join(WORKLOADS)})",
            file=sys.stderr,
        )
        return 2
    speculation = [s for s in args.speculation.split(",") if s]
    peers = [p for p in args.peers.split(",") if p]
    if args.threads is not None and args.threads < 1:
        print("lingcode bench: --threads must be at least 1", file=sys.stderr)
        return 2
    import torch

    threads = args.threads or torch.get_num_threads()
    worker = [sys.executable, "-m", "lingcode.bench.worker"]
    if args.engine == "sglang":  # the production engine: launch (or attach to) SGLang as serve does
        if peers:
            print("lingcode bench: --peers run with the local engine only", file=sys.stderr)
            return 2
        device, model_path = "cuda", None
        options = ["--engine", "sglang"] + [
            o
            for name in ("model", "profile", "engine_url")
            if getattr(args, name)
            for o in (f"--{name.replace('_', '-')}", str(getattr(args, name)))
        ]
        speculation = [None]
    else:
        from lingcode.engine.local.engine import pick_device

        model_path = (
            models.ensure(args.model) if args.model is None or not Path(args.model).exists() else Path(args.model)
        )
        device = pick_device(args.device).type
        options = ["--model", str(model_path), "--device", device, "--kernels", args.kernels]
        options += ["--compile"] if args.compile and speculation else []
    python = llama_cpp_python(args.llama_cpp_python)
    problems = [p for p in (check_peer(peer, python, model_path) for peer in peers) if p]
    if problems:
        print("lingcode bench: " + "\nlingcode bench: ".join(problems), file=sys.stderr)
        return 2
    report = Report(
        command="lingcode bench " + " ".join(args.argv),
        hardware=hardware(device, threads),
        commit=source_commit(),
        threads=threads,
    )
    workers: dict[str, Worker] = {}
    try:
        # One at a time, so that no load overlaps another; the lingcode worker first: it makes the
        # prompts (its tokenizer and chat template) and says the engine's dtype for transformers.
        workers["lingcode"] = Worker("lingcode", worker + ["lingcode", "--threads", str(threads)] + options, threads)
        dtype = workers["lingcode"].ready["engine"].get("dtype", "float32")
        # a peer's context: the longest prompt and its output (llama.cpp takes its KV cache whole at load)
        context = max([4096] + [context_length(w) + args.max_tokens + 16 for w in workloads if context_length(w)])
        for peer in peers:
            kind = peer.removesuffix("-passive").removesuffix("-fa")
            # -I: not this folder on its path (its modules are named like other packages), nor PYTHON* variables
            argv = [python, "-I", str(Path(__file__).with_name("worker.py"))] if kind == "llama.cpp" else worker
            argv = argv + [
                kind,
                "--threads",
                str(threads),
                "--model",
                str(model_path),
                "--device",
                device,
                "--dtype",
                dtype,
                "--context",
                str(context),
                *PEER_OPTIONS.get(peer, []),
            ]
            workers[peer] = Worker(peer, argv, threads, PEER_ENV.get(peer))
        for name, w in workers.items():
            report.workers[name] = w.ready
            report.load_s[name] = w.ready["load_s"]
        plan = workers["lingcode"].ask(
            {"plan": {"workloads": workloads, "requests": args.requests, "max_tokens": args.max_tokens}}
        )["requests"]
        variants = [
            (f"lingcode-{s}" if s else f"sglang-{args.profile or 'default'}", workers["lingcode"], s)
            for s in speculation
        ] + [(peer, workers[peer], None) for peer in peers]
        if args.engine == "sglang":
            report.hardware = "SGLang: " + workers["lingcode"].ready["name"]
        _measure(args, report, plan, variants)
    except WorkerFailed as e:
        print(f"lingcode bench: {e}", file=sys.stderr)
        return 1
    finally:
        for w in workers.values():
            w.close()
    return 0


def _measure(args, report: Report, plan: list[dict], variants: list[tuple]) -> None:
    from rich.progress import Progress

    results: list[Result] = []
    for name, worker, speculation in variants:  # warm-up: first calls pay for allocations, autotuning, lazy init
        worker.ask({"request": {**plan[0], "max_tokens": 8, "speculation": speculation}})
    report.load_avg["before"] = _load_avg()
    with Progress() as progress:
        task = progress.add_task("benchmark", total=len(plan) * len(variants))
        for index, request in enumerate(plan):
            first = None
            for name, worker, speculation in variants:  # alternate: every variant sees the same machine state
                r = worker.ask({"request": {**request, "speculation": speculation}})["result"]
                first = r["token_ids"] if first is None else first
                results.append(
                    Result(
                        request["workload"],
                        name,
                        len(request["input_ids"]),
                        r["tokens"],
                        r["ttft_ms"],
                        r["tpot_ms"],
                        r["accept_length"],
                        index,
                        r["token_ids"] == first,
                        r["served"],
                        r["token_ids"],
                    )
                )
                progress.advance(task)
    report.load_avg["after"] = _load_avg()
    report.summary = summarize(results)
    report.requests = [asdict(r) for r in results]
    print(table(report.summary))
    print(f"threads {report.threads}; load average {report.load_avg}")
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").write_text(json.dumps(asdict(report), indent=1) + "\n")
        builds = "".join(
            f"- {name}: pid {w['pid']}, {w['threads']} threads, {w['versions']}"
            f"{', ' + w['engine']['system_info'] if 'system_info' in w['engine'] else ''}\n"
            for name, w in report.workers.items()
        )
        out.with_suffix(".md").write_text(
            f"# lingcode bench, {report.date}\n\n- hardware: {report.hardware}\n- commit: {report.commit}\n"
            f"- command: `{report.command}`\n- load average (1 min): {report.load_avg}\n- load s: {report.load_s}\n"
            f"- each engine in a process of its own:\n{builds}\n{table(report.summary)}\n"
        )
        if plot(results, out.with_suffix(".png")):
            print(f"plot: {out.with_suffix('.png')}")
        print(f"results: {out.with_suffix('.json')}")


def _load_avg() -> float | None:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except OSError:
        return None


def add_arguments(parser) -> None:
    parser.add_argument(
        "--engine",
        choices=["local", "sglang"],
        default="local",
        help="engine to measure: the embedded one, or SGLang with --profile / --engine-url",
    )
    parser.add_argument("--profile", help="SGLang launch profile (--engine sglang)")
    parser.add_argument("--engine-url", help="attach to a running SGLang server (--engine sglang)")
    parser.add_argument("--model", help="model (catalog name, GGUF file or HF directory); default: the default model")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="device for the local engine")
    parser.add_argument(
        "--workload",
        default="chat,code-edit",
        help=f"comma-separated: {', '.join(WORKLOADS)} (context:L: L tokens of the standard library's "
        "code, continued: prefill and decode at that context)",
    )
    parser.add_argument(
        "--speculation",
        default="off,ngram",
        help="comma-separated speculation modes to compare: off, ngram, early-exit:L (empty: peers only)",
    )
    parser.add_argument(
        "--peers", default="", help=f"comma-separated, each in a process of its own: {', '.join(PEERS)}"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads for every engine (default: torch's default here, one per core)",
    )
    parser.add_argument(
        "--llama-cpp-python",
        metavar="PATH",
        help="the Python that has llama-cpp-python, for --peers llama.cpp (default: "
        "$LINGCODE_LLAMA_CPP_PYTHON, else .venv-llama-cpp of this checkout, else this one)",
    )
    parser.add_argument("--requests", type=int, default=3, help="requests per workload")
    parser.add_argument("--max-tokens", type=int, default=128, help="output tokens per request (random/chat: exactly)")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the torch step (GPU: the captured graph; CPU: the decode/verify forward)",
    )
    parser.add_argument(
        "--kernels",
        choices=["auto", "torch", "triton", "native"],
        default="auto",
        help="the engine's forward pass: torch ops, hand-written Triton (GPU) or native (CPU); "
        "auto: Triton on a GPU, native on the CPU, unless --compile",
    )
    parser.add_argument(
        "--out", help="write OUT.json, OUT.md and OUT.png (e.g. bench/results/cpu-llama-cpp-2026-12-01)"
    )

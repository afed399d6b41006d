"""`lingcode bench`: batch-1 decode speed on named workloads, variants side by side in one run.

Every request of a workload runs once per variant, alternating (A, B, A, B, ...), so a noisy
machine slows all variants alike. Variants are the engine's speculation modes and, optionally,
the peers a user would otherwise pick on the same weights: transformers `generate` (eager, and
with its static cache) and llama.cpp through llama-cpp-python on the same GGUF.

Per request: TTFT (request start -> first token), TPOT ((last - first token) / (tokens - 1)),
tokens, and tokens per verify step when drafting. Results are JSON (and a PNG plot) under
bench/results/.
"""

from __future__ import annotations

import asyncio
import json
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from lingcode.bench import source_commit
from lingcode.engine import SamplingParams

if TYPE_CHECKING:
    import torch

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
    accept_length: float | None = None


# --- workloads ----------------------------------------------------------------------------------


def _code_sample(lines: int = 40) -> str:
    """Real code to edit or complete: the start of this repository's scheduler."""
    text = (REPO / "lingcode" / "pipeline" / "scheduler.py").read_text()
    return "\n".join(text.splitlines()[:lines]) + "\n"


def workload_requests(name: str, tokenizer, chat_template: str, n: int, max_tokens: int) -> list[Request]:
    from lingcode.text.chat_template import render_chat

    def chat(text: str) -> list[int]:
        return tokenizer.encode(render_chat(chat_template, [{"role": "user", "content": text}]))

    if name == "random":  # random prompt tokens, a fixed number of output tokens
        import torch

        gen = torch.Generator().manual_seed(0)
        return [Request(torch.randint(100, 40000, (512,), generator=gen).tolist(), max_tokens, True) for _ in range(n)]
    if name == "chat":
        questions = ["Explain what a hash map is.", "Write a haiku about autumn.", "How do I sort a list in Python?",
                     "What causes the seasons on Earth?", "Give three tips for writing clean code."]  # fmt: skip
        return [Request(chat(questions[i % len(questions)]), max_tokens, True) for i in range(n)]
    code = _code_sample()
    if name == "completion":  # plain continuation of a file, repository-style header
        lines = code.splitlines(keepends=True)
        return [Request(tokenizer.encode(f"<filename>lingcode/pipeline/scheduler.py\n{''.join(lines[: 15 + 3 * i])}"), max_tokens, True)
                for i in range(n)]  # fmt: skip
    if name == "code-edit":  # the answer copies most of the prompt: where drafting from context shines
        edits = ["Rename the class Scheduler to SlotScheduler", "Rename max_queue to queue_limit",
                 "Rename the exception QueueFull to QueueOverflow"]  # fmt: skip
        return [Request(chat(f"{edits[i % len(edits)]} and output the whole edited code:\n```python\n{code}```"),
                        max_tokens, False) for i in range(n)]  # fmt: skip
    raise ValueError(f"unknown workload {name!r}: random, chat, completion, code-edit")


WORKLOADS = ("random", "chat", "completion", "code-edit")


# --- runners ------------------------------------------------------------------------------------


class EngineRunner:
    """A lingcode engine through its Engine interface. The embedded engine runs one speculation
    mode per runner from a cold KV cache; an SGLang engine runs as its profile configured it."""

    def __init__(self, engine, name: str, speculation: str | None = None):
        self.engine, self.name, self.speculation = engine, name, speculation

    def run(self, request: Request) -> tuple[float, float | None, int, float | None]:
        if self.speculation is not None:
            self.engine.set_speculation(self.speculation)
            self.engine.reset_cache()
        params = SamplingParams(max_tokens=request.max_tokens, temperature=0.0, ignore_eos=request.ignore_eos)

        async def go():
            start = time.perf_counter()
            first = last = None
            tokens = 0
            async for chunk in self.engine.generate(f"bench-{time.monotonic_ns()}", request.input_ids, params):
                now = time.perf_counter()
                if chunk.token_ids:
                    first = first or now
                    last = now
                    tokens += len(chunk.token_ids)
            return start, first, last, tokens

        start, first, last, tokens = asyncio.run(go())
        accept = self.engine.stats().get("last_request", {}).get("accept_length")
        if self.speculation == "off":
            accept = None
        tpot = (last - first) * 1e3 / (tokens - 1) if tokens > 1 else None
        return (first - start) * 1e3, tpot, tokens, accept


class TransformersRunner:
    """transformers' LlamaForCausalLM on the same weights, `generate` greedy (eager or static cache)."""

    def __init__(self, checkpoint, device, dtype, cache: str):
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = checkpoint.config
        config = LlamaConfig(
            vocab_size=cfg.vocab_size, hidden_size=cfg.dim, intermediate_size=cfg.ffn_dim,
            num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads,
            max_position_embeddings=cfg.context_length, rope_theta=cfg.rope_theta, rms_norm_eps=cfg.norm_eps,
            tie_word_embeddings=cfg.tied_embeddings,
            rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},  # transformers >= 5
        )  # fmt: skip
        names = {"attn_norm": "input_layernorm", "wq": "self_attn.q_proj", "wk": "self_attn.k_proj",
                 "wv": "self_attn.v_proj", "wo": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
                 "w_gate": "mlp.gate_proj", "w_up": "mlp.up_proj", "w_down": "mlp.down_proj"}  # fmt: skip
        state = {"model.embed_tokens.weight": checkpoint.weights["tok_embeddings"],
                 "model.norm.weight": checkpoint.weights["norm"]}  # fmt: skip
        for key, tensor in checkpoint.weights.items():
            if key.startswith("layers."):
                _, i, short = key.split(".")
                state[f"model.layers.{i}.{names[short]}.weight"] = tensor
        self.model = LlamaForCausalLM(config)
        self.model.load_state_dict(state, strict=False)
        self.model.tie_weights()
        self.model = self.model.to(device=device, dtype=dtype).eval()
        self.device, self.cache = device, cache
        self.name = f"transformers-{cache}"

    def _generate(self, ids: torch.Tensor, n: int) -> float:
        import torch

        kwargs = {"cache_implementation": "static"} if self.cache == "static" else {}
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        self.model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0, **kwargs)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - start) * 1e3

    def run(self, request: Request) -> tuple[float, float | None, int, float | None]:
        import torch

        ids = torch.tensor([request.input_ids], device=self.device)
        with torch.inference_mode():
            if self.cache == "static":  # untimed: a new prompt or cache length compiles (transformers
                self._generate(ids, 1)  # compiles static-cache decoding), ~180 ms in a timed call
                self._generate(ids, request.max_tokens)
            ttft = self._generate(ids, 1)
            total = self._generate(ids, request.max_tokens)
        return ttft, (total - ttft) / (request.max_tokens - 1), request.max_tokens, None


class LlamaCppRunner:
    """llama.cpp (llama-cpp-python) on the same GGUF, streaming, greedy."""

    def __init__(self, gguf_path: Path, threads: int):
        from llama_cpp import Llama

        self.llm = Llama(model_path=str(gguf_path), n_ctx=4096, n_threads=threads, n_batch=512, verbose=False)
        self.name = "llama.cpp"

    def run(self, request: Request) -> tuple[float, float | None, int, float | None]:
        self.llm.reset()
        start = time.perf_counter()
        first = last = None
        tokens = 0
        for _ in self.llm.generate(request.input_ids, temp=0.0, top_k=1, reset=True):
            now = time.perf_counter()
            first = first or now
            last = now
            tokens += 1
            if tokens >= request.max_tokens:
                break
        return (first - start) * 1e3, (last - first) * 1e3 / max(tokens - 1, 1), tokens, None


# --- the run ------------------------------------------------------------------------------------


@dataclass
class Report:
    command: str
    hardware: str
    date: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    commit: str = ""
    torch: str = field(default_factory=lambda: __import__("torch").__version__)
    load_s: dict = field(default_factory=dict)
    summary: list[dict] = field(default_factory=list)
    requests: list[dict] = field(default_factory=list)


def hardware(device: torch.device) -> str:
    import torch

    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (1 GPU)"
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {torch.get_num_threads()} threads"


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
                "workload": workload, "variant": variant, "requests": len(rs),
                "tpot_ms_mean": round(statistics.mean(tpots), 3), "tpot_ms_median": round(statistics.median(tpots), 3),
                "output_tok_s": round(1000 * tokens / decode_ms, 1) if decode_ms else None,
                "ttft_ms_mean": round(statistics.mean(r.ttft_ms for r in rs), 2),
                "accept_length_mean": round(statistics.mean(accepts), 2) if accepts else None,
            }  # fmt: skip
            base = base or row
            row["speedup_vs_first"] = round(base["tpot_ms_mean"] / row["tpot_ms_mean"], 2)
            rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    cols = ["workload", "variant", "requests", "tpot_ms_mean", "tpot_ms_median", "output_tok_s", "ttft_ms_mean",
            "accept_length_mean", "speedup_vs_first"]  # fmt: skip
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
    import torch

    from lingcode import models
    from lingcode.engine.local import load_engine
    from lingcode.engine.local.engine import pick_device
    from lingcode.engine.local.weights import load_checkpoint

    unknown = [w for w in args.workload.split(",") if w and w not in WORKLOADS]
    if unknown:
        print(f"lingcode bench: unknown workload {', '.join(unknown)} (choose from {', '.join(WORKLOADS)})", file=sys.stderr)
        return 2
    if args.engine == "sglang":  # the production engine: launch (or attach to) SGLang as serve does
        from lingcode.engine.sglang.engine import open_engine

        started = time.perf_counter()
        engine = open_engine(args.model, engine_url=args.engine_url, profile=args.profile)
        report = Report(command="lingcode bench " + " ".join(args.argv), hardware="SGLang: " + engine.info.name)
        report.load_s["sglang"] = round(time.perf_counter() - started, 2)
        return _measure(args, report, engine.info, [EngineRunner(engine, f"sglang-{args.profile or 'default'}")])
    model_path = models.ensure(args.model) if args.model is None or not Path(args.model).exists() else Path(args.model)
    device = pick_device(args.device)
    report = Report(command="lingcode bench " + " ".join(args.argv), hardware=hardware(device))
    started = time.perf_counter()
    engine = load_engine(model_path, device=args.device, compile=args.compile, kernels=args.kernels)
    report.load_s["lingcode"] = round(time.perf_counter() - started, 2)
    runner = getattr(engine.step, "runner", None)  # captured CUDA graphs (steps.GraphStep)
    if runner is not None:
        report.load_s["cuda_graph_capture"] = round(runner.capture_s, 2)
    info = engine.info
    runners = [EngineRunner(engine, f"lingcode-{s}", s) for s in args.speculation.split(",") if s]
    for peer in [p for p in args.peers.split(",") if p]:
        started = time.perf_counter()
        if peer in ("transformers-eager", "transformers-static"):
            runners.append(TransformersRunner(load_checkpoint(model_path), device, engine.dtype, peer.split("-")[1]))
        elif peer == "llama.cpp":
            runners.append(LlamaCppRunner(model_path, torch.get_num_threads()))
        else:
            raise SystemExit(f"lingcode bench: unknown peer {peer!r}")
        report.load_s[peer] = round(time.perf_counter() - started, 2)
    return _measure(args, report, info, runners)


def _measure(args, report: Report, info, runners: list) -> int:
    from rich.progress import Progress

    report.commit = source_commit()
    results: list[Result] = []
    workloads = [w for w in args.workload.split(",") if w]
    plan = [(w, r) for w in workloads
            for r in workload_requests(w, info.tokenizer, info.chat_template, args.requests, args.max_tokens)]  # fmt: skip
    for runner in runners:  # warm-up: first calls pay for allocations, autotuning, lazy init
        runner.run(Request(plan[0][1].input_ids, 8, True))
    with Progress() as progress:
        task = progress.add_task("benchmark", total=len(plan) * len(runners))
        for workload, request in plan:
            for runner in runners:  # alternate: every variant sees the same machine state
                ttft, tpot, tokens, accept = runner.run(request)
                results.append(Result(workload, runner.name, len(request.input_ids), tokens, round(ttft, 3),
                                      round(tpot, 4) if tpot else None, accept))  # fmt: skip
                progress.advance(task)
    report.summary = summarize(results)
    report.requests = [asdict(r) for r in results]
    print(table(report.summary))
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").write_text(json.dumps(asdict(report), indent=1) + "\n")
        out.with_suffix(".md").write_text(
            f"# lingcode bench, {report.date}\n\n- hardware: {report.hardware}\n- commit: {report.commit}\n"
            f"- torch: {report.torch}\n- command: `{report.command}`\n- load s: {report.load_s}\n\n{table(report.summary)}\n"
        )
        if plot(results, out.with_suffix(".png")):
            print(f"plot: {out.with_suffix('.png')}")
        print(f"results: {out.with_suffix('.json')}")
    return 0


def add_arguments(parser) -> None:
    parser.add_argument("--engine", choices=["local", "sglang"], default="local",
                        help="engine to measure: the embedded one, or SGLang with --profile / --engine-url")  # fmt: skip
    parser.add_argument("--profile", help="SGLang launch profile (--engine sglang)")
    parser.add_argument("--engine-url", help="attach to a running SGLang server (--engine sglang)")
    parser.add_argument("--model", help="model (catalog name, GGUF file or HF directory); default: the default model")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="device for the local engine")
    parser.add_argument("--workload", default="chat,code-edit", help=f"comma-separated: {', '.join(WORKLOADS)}")
    parser.add_argument("--speculation", default="off,ngram",
                        help="comma-separated speculation modes to compare: off, ngram, early-exit:L")  # fmt: skip
    parser.add_argument("--peers", default="", help="comma-separated: transformers-eager, transformers-static, llama.cpp")
    parser.add_argument("--requests", type=int, default=3, help="requests per workload")
    parser.add_argument("--max-tokens", type=int, default=128, help="output tokens per request (random/chat: exactly)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the torch step (GPU: the captured graph; CPU: the decode/verify forward)")
    parser.add_argument("--kernels", choices=["auto", "torch", "triton", "native"], default="auto",
                        help="the engine's forward pass: torch ops, hand-written Triton (GPU) or native (CPU); "
                             "auto: Triton on a GPU, native on the CPU, unless --compile")
    parser.add_argument("--out", help="write OUT.json, OUT.md and OUT.png (e.g. bench/results/cpu-2026-11-29)")

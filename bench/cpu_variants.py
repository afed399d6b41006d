"""The CPU path's figures (lingcode/engine/local/quantized.py), side by side in one process.

  .venv/bin/python bench/cpu_variants.py [--compile] [--model PATH]

Decode step ms (one token at context 800, median of 40, variants alternating step by step), a
512-token prefill chunk, and how often the CPU path picks the same next token as the file's
weights in f32 (200 teacher-forced positions of this repo's code). --compile adds the
torch.compile'd step (lingcode bench --compile), ~140 s to compile cold.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from lingcode import models
from lingcode.engine.local.engine import compile_narrow_step
from lingcode.engine.local.model import Transformer
from lingcode.engine.local.weights import load_checkpoint

CONTEXT = 800
REPO = Path(__file__).resolve().parent.parent


def build(checkpoint, cpu_path: bool) -> Transformer:
    model = Transformer.from_weights(checkpoint.config, checkpoint.weights, torch.float32, torch.device("cpu"))
    if cpu_path:
        model.use_cpu_matmuls(checkpoint.q4)
    model.setup_cache(checkpoint.config.context_length)
    return model


def decode_ms(steps: dict, models: list[Transformer], prompt: list[int], n: int = 40) -> dict[str, float]:
    """steps may share a model (and its cache): prefill each model once, eagerly."""
    for model in models:
        model(torch.tensor([prompt[:CONTEXT]]), 0)
    times = {name: [] for name in steps}
    for i in range(n + 5):
        for name, step in steps.items():
            started = time.perf_counter()
            step(torch.tensor([[prompt[CONTEXT + i]]]), CONTEXT + i)
            if i >= 5:
                times[name].append((time.perf_counter() - started) * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def prefill_ms(model: Transformer, ids: list[int]) -> float:
    model(torch.tensor([ids]), 0)  # warm-up
    runs = []
    for _ in range(3):
        started = time.perf_counter()
        model(torch.tensor([ids]), 0)
        runs.append((time.perf_counter() - started) * 1e3)
    return statistics.median(runs)


def agreement(reference: Transformer, cpu: Transformer, texts: list[list[int]]) -> int:
    agree = 0
    for ids in texts:
        a, b = reference(torch.tensor([ids[:300]]), 0), cpu(torch.tensor([ids[:300]]), 0)
        for i in range(300, 350):
            agree += int(a[0, -1].argmax() == b[0, -1].argmax())
            a, b = reference(torch.tensor([[ids[i]]]), i), cpu(torch.tensor([[ids[i]]]), i)
    return agree


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="GGUF file (default: the default model)")
    parser.add_argument("--compile", action="store_true", help="also time the torch.compile'd step")
    args = parser.parse_args()
    checkpoint = load_checkpoint(Path(args.model) if args.model else models.ensure(models.DEFAULT_MODEL))
    files = ["lingcode/pipeline/scheduler.py", "lingcode/engine/local/engine.py", "README.md", "server/app.py"]
    texts = [checkpoint.tokenizer.encode((REPO / f).read_text()[:3000])[:400] for f in files]
    code = checkpoint.tokenizer.encode((REPO / "lingcode/engine/local/engine.py").read_text())

    with torch.inference_mode():
        dense, cpu = build(checkpoint, False), build(checkpoint, True)
        steps = {"f32 dense": dense, "cpu path (int4 decode)": cpu}
        if args.compile:
            started = time.perf_counter()
            steps["cpu path, compiled"] = compile_narrow_step(cpu)
            print(f"compile: {time.perf_counter() - started:.0f} s")
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
        print("| variant | decode step ms (context 800) |\n|---|---|")
        for name, ms in decode_ms(steps, [dense, cpu], code[: CONTEXT + 45]).items():
            print(f"| {name} | {ms:.1f} |")
        print("| variant | 512-token prefill chunk ms |\n|---|---|")
        for name, model in (("f32 dense", dense), ("cpu path (bf16 GEMMs)", cpu)):
            print(f"| {name} | {prefill_ms(model, code[:512]):.0f} |")
        print(f"next token as the file's weights in f32: {agreement(dense, cpu, texts)} of {50 * len(texts)}")


if __name__ == "__main__":
    main()

"""The captured step with torch kernels vs the Triton step (lingcode/engine/local/triton_step.py),
with and without programmatic dependent launch, and with GEMV programs computing 1, 2 (the
default) or 4 rows of a step in turn.

For each kernel set: ms per CUDA graph replay of the decode step (width 1) and verify steps
(widths 4 and 8) at contexts 300 and 2000 (median of 5 runs of 200 replays), load + capture time, and how
far the Triton step's logits and KV cache entries are from the torch step's on the same inputs.

LINGCODE_MODEL=path/to/SmolLM2-135M-Instruct.Q4_1.gguf python bench/triton_vs_torch.py
(on a GPU machine without lingcode installed: PYTHONPATH=. python3 ...)
LINGCODE_MODEL=random: random weights in SmolLM2-135M's shapes (timing only; no file needed).
"""

import os
import time

import torch
from gpu_timing import ms_per_replay, random_weights

from lingcode.engine.local.cuda_graphs import GraphRunner
from lingcode.engine.local.model import Transformer
from lingcode.engine.local.weights import ModelConfig, load_checkpoint

CASES = ((1, 300), (1, 2000), (4, 300), (8, 300), (8, 2000))  # (width, context: the last position + 1)
TEXT = "def parse(tokens):\n    # Walk the token list and build the tree, one node per statement.\n"


source = os.environ["LINGCODE_MODEL"]
if source == "random":
    cfg = ModelConfig(
        n_layers=30,
        dim=576,
        ffn_dim=1536,
        n_heads=9,
        n_kv_heads=3,
        vocab_size=49152,
        context_length=8192,
        rope_theta=100000.0,
    )
    weights, ids = random_weights(cfg), torch.randint(0, cfg.vocab_size, (2000,)).tolist()
else:
    checkpoint = load_checkpoint(source)
    cfg, weights = checkpoint.config, checkpoint.weights
    text_ids = checkpoint.tokenizer.encode(TEXT)
    ids = (text_ids * (2000 // len(text_ids) + 1))[:2000]

started = time.perf_counter()
model = Transformer.from_weights(cfg, weights, torch.bfloat16, torch.device("cuda"))
model.setup_cache(cfg.context_length)
load_s = time.perf_counter() - started
runners, capture_s = {}, {}
VARIANTS = {"torch": dict(kernels="torch"), "triton": dict(kernels="triton")}
VARIANTS |= {f"triton, {rows} rows a program": dict(kernels="triton", triton_options={"rows": rows}) for rows in (1, 4)}
VARIANTS["triton, serial launches"] = dict(kernels="triton", triton_options={"pdl": False})  # no PDL (triton_step.py)
for kernels, options in VARIANTS.items():  # all capture the same model: one KV cache, the same inputs
    started = time.perf_counter()
    runners[kernels] = GraphRunner(model, **options)
    capture_s[kernels] = load_s + time.perf_counter() - started

rows = []
with torch.inference_mode():
    model(torch.tensor([ids], device="cuda"), 0)  # a real context for the attention to read
    for width, end in CASES:
        runs = {}
        for kernels, runner in runners.items():
            runner.tokens[0, :width].copy_(torch.tensor(ids[end - width : end]))
            torch.arange(end - width, end, out=runner.positions[:width])
            logits = runner.replay(width, end).float().clone()
            cache = torch.stack(
                [
                    torch.stack(
                        [layer.attn.kv_cache.k[0, :, end - width : end], layer.attn.kv_cache.v[0, :, end - width : end]]
                    )
                    for layer in model.layers
                ]
            ).float()
            runs[kernels] = logits, cache, ms_per_replay(runner, width, end)
        ref_logits, ref_cache, _ = runs["torch"]
        for kernels, (logits, cache, ms) in runs.items():
            same = kernels == "torch"
            rows.append(
                (
                    kernels,
                    width,
                    end,
                    round(capture_s[kernels], 1),
                    round(ms, 4),
                    "-" if same else f"{(logits - ref_logits).abs().max().item():.3g}",
                    "-" if same else f"{(logits.argmax(-1) == ref_logits.argmax(-1)).float().mean().item():.3g}",
                    "-" if same else f"{(cache - ref_cache).abs().max().item():.3g}",
                )
            )

print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, weights: {os.path.basename(source)}")
print(
    "| kernels | width | context | load+capture s | ms per replay (median of 5x200) "
    "| max logit diff vs torch | argmax agreement | max KV diff |"
)
print("|---|---|---|---|---|---|---|---|")
for r in rows:
    print("| " + " | ".join(map(str, r)) + " |")

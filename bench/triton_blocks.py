"""Sweep the Triton step's GEMV blocks (BLOCK_N, num_warps) per weight matrix, and time its attention.

Each kernel is captured 30 times in a row in a CUDA graph (like 30 layers) and timed per launch, on
one layer of random weights in SmolLM2-135M's shapes. The weights stay in L2 here, unlike in a real
step: use it to rank block sizes, and bench/triton_vs_torch.py for the step's time. Prints the
fastest configurations; copy the winners into BLOCKS in lingcode/engine/local/triton_step.py.

python bench/triton_blocks.py     (on a GPU machine without lingcode installed: PYTHONPATH=. python3 ...)
"""

import itertools

import torch
from gpu_timing import per_launch_us, random_weights

from lingcode.engine.local import triton_step
from lingcode.engine.local.model import Transformer
from lingcode.engine.local.weights import ModelConfig

CANDIDATES = (4, 8, 16)  # BLOCK_N to try (one table for every width: a verify step's rows must sum as decoding's)
LM_HEAD_CANDIDATES = (8, 16, 32)


cfg = ModelConfig(n_layers=1, dim=576, ffn_dim=1536, n_heads=9, n_kv_heads=3, vocab_size=49152, context_length=8192)
weights = random_weights(cfg)
model = Transformer.from_weights(cfg, weights, torch.bfloat16, torch.device("cuda"))
model.setup_cache(cfg.context_length)
layer = model.layers[0]
with torch.inference_mode():
    layer.attn.kv_cache.k.normal_(), layer.attn.kv_cache.v.normal_()
    for width in (1, 8):
        x = torch.randn(width, cfg.dim, device="cuda", dtype=torch.bfloat16)
        pos = torch.arange(1990, 1990 + width, device="cuda")
        for matrix in triton_step.BLOCKS:
            results = []
            candidates = LM_HEAD_CANDIDATES if matrix == "lm_head" else CANDIDATES
            for block_n, warps in itertools.product(candidates, (2, 4, 8)):
                step = triton_step.TritonStep(model, {**triton_step.BLOCKS, matrix: (block_n, warps)})
                q = triton_step.TritonStep(model).norm_qkv_rope(layer, x, pos)  # inputs, from the default blocks
                attn, h = step.attention(layer, q, pos, 2048), triton_step.TritonStep(model).norm_gate_up(layer, x)
                run = dict(
                    qkv=lambda: step.norm_qkv_rope(layer, x, pos),
                    wo=lambda: step.out_proj_residual(layer, attn, x),
                    gate_up=lambda: step.norm_gate_up(layer, x),
                    down=lambda: step.down_residual(layer, h, x),
                    lm_head=lambda: step.norm_lm_head(x),
                )[matrix]
                try:
                    results.append((per_launch_us(run, 5 if matrix == "lm_head" else 30), block_n, warps))
                except Exception as exc:  # e.g. out of shared memory
                    print(f"W={width} {matrix} BLOCK_N={block_n} num_warps={warps}: {type(exc).__name__}")
            results.sort()
            fastest = "  ".join(f"{us:.1f} us ({n}, {w})" for us, n, w in results[:4])
            print(f"W={width} {matrix}: {fastest}", flush=True)
        step = triton_step.TritonStep(model)
        for kv_len in (256, 2048, 8192):
            p = torch.arange(kv_len - 10 - width, kv_len - 10, device="cuda")
            q = step.norm_qkv_rope(layer, x, p)
            us = per_launch_us(lambda: step.attention(layer, q, p, kv_len))
            print(f"W={width} attention over {kv_len} entries: {us:.1f} us")

"""Random weights in a model config's shapes, for GPU timings that need no model file
(bench/triton_vs_torch.py with LINGCODE_MODEL=random, bench/triton_blocks.py, bench/flashinfer_kernels.py).

They run as python3 bench/NAME.py, which puts bench/ on the path: this module imports as random_weights.
"""

import torch

from lingcode.engine.local.weights import ModelConfig


def random_weights(cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Weights in our short names (weights.py): norms of ones, matrices N(0, 1/fan_in), seed 0."""
    shapes = {"tok_embeddings": (cfg.vocab_size, cfg.dim), "norm": (cfg.dim,)}
    q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    for i in range(cfg.n_layers):
        shapes |= {f"layers.{i}.{name}": shape for name, shape in dict(
            attn_norm=(cfg.dim,), ffn_norm=(cfg.dim,), wq=(q, cfg.dim), wk=(kv, cfg.dim), wv=(kv, cfg.dim),
            wo=(cfg.dim, q), w_gate=(cfg.ffn_dim, cfg.dim), w_up=(cfg.ffn_dim, cfg.dim), w_down=(cfg.dim, cfg.ffn_dim),
        ).items()}  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    return {k: torch.ones(s) if len(s) == 1 else torch.randn(s, generator=gen) / s[1] ** 0.5 for k, s in shapes.items()}

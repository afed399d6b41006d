"""The native CPU step (cpu_step.cpp): the whole model's forward pass in one call, on the GGUF's
own blocks (cpu_blocks.h), repacked once at load. Available for GGUF files whose matrices are in a
type it reads (NATIVE_TYPES) and whose heads are 64 or 128 wide, where lingcode's native code
builds (cpu_native.py)."""

from __future__ import annotations

import torch

from lingcode.engine.local import cpu_native
from lingcode.engine.local.model import Transformer
from lingcode.engine.local.weights import Checkpoint

# ggml type ids the step reads, and the weights per block of each (a row holds whole blocks)
NATIVE_TYPES = {2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K"}
BLOCK_WEIGHTS = {2: 32, 3: 32, 6: 32, 7: 32, 8: 32, 12: 256, 13: 256, 14: 256}
HEAD_DIMS = (64, 128)


class Unavailable(Exception):
    """Why the native step cannot run this model here (the engine logs it and uses torch)."""


def _unpermute_order(rows: int, n_heads: int) -> torch.Tensor:
    """Llama's GGUF stores Q and K rows for interleaved-pair RoPE; the step uses rotate-half, as model.py."""
    return torch.arange(rows).view(n_heads, rows // n_heads // 2, 2).transpose(1, 2).reshape(-1)


_MATRICES = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")


def unavailable(checkpoint: Checkpoint) -> str | None:
    """Why the native step cannot run this checkpoint here, or None if it can."""
    cfg, stored = checkpoint.config, checkpoint.gguf_tensors
    if checkpoint.gguf_path is None:
        return "the model is not a GGUF file"
    if cfg.head_dim not in HEAD_DIMS or cfg.dim % 32 or cfg.ffn_dim % 32:
        return f"heads of {cfg.head_dim}, width {cfg.dim}, {cfg.ffn_dim} (the native step has heads of 64 or 128, widths of 32s)"
    if cfg.n_heads // cfg.n_kv_heads > 64:
        return f"{cfg.n_heads // cfg.n_kv_heads} query heads per key head (the native step takes up to 64)"
    names = [f"layers.{i}.{n}" for i in range(cfg.n_layers) for n in _MATRICES]
    names += ["tok_embeddings"] + ([] if cfg.tied_embeddings else ["output"])
    for name in names:
        if name not in stored:
            return f"no {name} in the file"
        t = stored[name]
        if t.type not in NATIVE_TYPES or t.rows % 16 or t.cols % BLOCK_WEIGHTS[t.type]:
            return (
                f"{name} is stored as ggml type {t.type} with {t.rows} rows; the native "
                f"step reads {', '.join(NATIVE_TYPES.values())} in multiples of 16 rows"
            )
    if cpu_native.load() is None:
        return "lingcode's native CPU code is not built (see the log above)"
    return None


def build(checkpoint: Checkpoint, model: Transformer):
    """A cpu_step.cpp Step over the checkpoint's blocks, writing model's (f16) KV cache."""
    reason = unavailable(checkpoint)
    if reason is not None:
        raise Unavailable(reason)
    if model.layers[0].attn.kv_cache is None or model.layers[0].attn.kv_cache.k.dtype != torch.float16:
        raise Unavailable("the model's KV cache is not f16")
    lib = cpu_native.load()
    stored, cfg = checkpoint.gguf_tensors, checkpoint.config
    permuted = cfg.architecture.gguf_rope_interleaved
    path = str(checkpoint.gguf_path)

    def matrix(*names: str):  # (cols, parts) for load_matrices
        parts = []
        for name in names:
            t = stored[name]
            heads = {"wq": cfg.n_heads, "wk": cfg.n_kv_heads}.get(name.rsplit(".", 1)[-1]) if permuted else None
            parts.append((t.type, t.offset, t.rows, _unpermute_order(t.rows, heads) if heads else None))
        return stored[names[0]].cols, parts

    specs = [matrix("tok_embeddings" if cfg.tied_embeddings else "output")]
    specs += [
        matrix(*names)
        for i in range(cfg.n_layers)
        for names in (
            (f"layers.{i}.wq", f"layers.{i}.wk", f"layers.{i}.wv"),
            (f"layers.{i}.wo",),
            (f"layers.{i}.w_gate", f"layers.{i}.w_up"),
            (f"layers.{i}.w_down",),
        )
    ]
    matrices = lib.load_matrices(path, specs)  # one block of memory for all of them
    head = matrices.pop(0)
    t = stored["tok_embeddings"]  # untied: its rows are read from the file as tokens come
    embedding = None if cfg.tied_embeddings else (path, t.type, t.offset, t.rows, t.cols)
    step = lib.Step(
        cfg.dim,
        cfg.n_heads,
        cfg.n_kv_heads,
        cfg.head_dim,
        cfg.ffn_dim,
        cfg.norm_eps,
        model.max_len,
        model.inv_freq,
        model.norm.weight,
        head,
        embedding,
    )
    empty = torch.empty(0)
    for i, layer in enumerate(model.layers):
        attn, cache = layer.attn, layer.attn.kv_cache
        bias = attn.wqkv.bias if attn.wqkv.bias is not None else empty
        norms = (attn.q_norm.weight, attn.k_norm.weight) if attn.qk_norm else (empty, empty)
        step.add_layer(
            layer.attn_norm.weight, layer.ffn_norm.weight, bias, *norms, *matrices[4 * i : 4 * i + 4], cache.k, cache.v
        )
    return step

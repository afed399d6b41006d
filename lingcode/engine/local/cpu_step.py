"""The native CPU step (cpu_step.cpp): the whole model's forward pass in one call, on the GGUF's
own 4/8-bit blocks, repacked once at load. Available for GGUF files whose matrices are Q4_0, Q4_1
or Q8_0 and whose heads are 64 wide, where lingcode's native code builds (cpu_native.py)."""

from __future__ import annotations

import torch

from lingcode.engine.local import cpu_native
from lingcode.engine.local.model import Transformer
from lingcode.engine.local.weights import Checkpoint

NATIVE_TYPES = {2: "Q4_0", 3: "Q4_1", 8: "Q8_0"}  # ggml type ids the step reads


class Unavailable(Exception):
    """Why the native step cannot run this model here (the engine logs it and uses torch)."""


def _unpermute_order(rows: int, n_heads: int) -> torch.Tensor:
    """GGUF stores Q and K rows for interleaved-pair RoPE; the step uses rotate-half, as model.py."""
    return torch.arange(rows).view(n_heads, rows // n_heads // 2, 2).transpose(1, 2).reshape(-1)


def unavailable(checkpoint: Checkpoint) -> str | None:
    """Why the native step cannot run this checkpoint here, or None if it can."""
    cfg, stored = checkpoint.config, checkpoint.gguf_tensors
    if checkpoint.gguf_path is None:
        return "the model is not a GGUF file"
    if cfg.head_dim != 64 or cfg.dim % 32 or cfg.ffn_dim % 32:
        return f"heads of {cfg.head_dim}, width {cfg.dim}, {cfg.ffn_dim} (the native step has heads of 64, widths of 32s)"
    names = [f"layers.{i}.{n}" for i in range(cfg.n_layers) for n in _FUSED_NAMES]
    names += ["tok_embeddings"] + ([] if cfg.tied_embeddings else ["output"])
    for name in names:
        if name not in stored:
            return f"no {name} in the file"
        if stored[name].type not in NATIVE_TYPES or stored[name].rows % 16:
            return (f"{name} is stored as ggml type {stored[name].type} with {stored[name].rows} rows; the native "
                    f"step reads {', '.join(NATIVE_TYPES.values())} in multiples of 16 rows")  # fmt: skip
    for i in range(cfg.n_layers):
        for fused in (("wq", "wk", "wv"), ("w_gate", "w_up")):
            if len({stored[f"layers.{i}.{n}"].type for n in fused}) != 1:
                return f"layer {i}'s {'/'.join(fused)} are stored in different types"
    if cpu_native.load() is None:
        return "lingcode's native CPU code is not built (see the log above)"
    return None


_FUSED_NAMES = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")


def build(checkpoint: Checkpoint, model: Transformer):
    """A cpu_step.cpp Step over the checkpoint's blocks, writing model's (f16) KV cache."""
    reason = unavailable(checkpoint)
    if reason is not None:
        raise Unavailable(reason)
    if model.layers[0].attn.kv_cache is None or model.layers[0].attn.kv_cache.k.dtype != torch.float16:
        raise Unavailable("the model's KV cache is not f16")
    lib = cpu_native.load()
    stored, cfg = checkpoint.gguf_tensors, checkpoint.config
    path = str(checkpoint.gguf_path)

    def matrix(*names: str):
        types = {stored[n].type for n in names}
        parts = []
        for name in names:
            t = stored[name]
            heads = {"wq": cfg.n_heads, "wk": cfg.n_kv_heads}.get(name.rsplit(".", 1)[-1])
            parts.append((t.offset, t.rows, _unpermute_order(t.rows, heads) if heads else None))
        return lib.repack(path, next(iter(types)), stored[names[0]].cols, parts)

    embed = matrix("tok_embeddings")
    head = embed if cfg.tied_embeddings else matrix("output")
    step = lib.Step(cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.ffn_dim, cfg.norm_eps, model.rope_cos.float(),
                    model.rope_sin.float(), model.norm.weight.float(), head, embed)  # fmt: skip
    for i, layer in enumerate(model.layers):
        p = f"layers.{i}."
        cache = layer.attn.kv_cache
        step.add_layer(layer.attn_norm.weight.float(), layer.ffn_norm.weight.float(),
                       matrix(p + "wq", p + "wk", p + "wv"), matrix(p + "wo"),
                       matrix(p + "w_gate", p + "w_up"), matrix(p + "w_down"), cache.k, cache.v)  # fmt: skip
    step.gather_weights()
    return step

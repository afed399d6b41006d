"""Small GGUF files written on the spot, for the tests of code that reads a GGUF's own blocks
(gpu_blocks.py, the Triton step): any architecture the engine loads, random weights in the block
formats asked for, per matrix and layer, and a byte-level tokenizer, so load_checkpoint reads it
as it reads a real model. No download, and any shape (real models are too large for the
interpreter, and each has only its own mix of formats)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from lingcode.engine.local.gpu_blocks import BY_NAME, random_blocks
from lingcode.engine.local.weights import ModelConfig

_NAMES = {
    "wq": "attn_q",
    "wk": "attn_k",
    "wv": "attn_v",
    "wo": "attn_output",
    "w_gate": "ffn_gate",
    "w_up": "ffn_up",
    "w_down": "ffn_down",
}


def write_gguf(path: Path, cfg: ModelConfig, formats, seed: int = 0) -> Path:
    """A GGUF of cfg's shapes. formats(layer, name) -> a FORMATS name ("Q4_K", ...) or "F32", for
    the matrices of _NAMES, "output" and "tok_embeddings" (layer None)."""
    import gguf

    gen = torch.Generator().manual_seed(seed)
    writer = gguf.GGUFWriter(str(path), cfg.arch)
    writer.add_block_count(cfg.n_layers)
    writer.add_context_length(cfg.context_length)
    writer.add_embedding_length(cfg.dim)
    writer.add_feed_forward_length(cfg.ffn_dim)
    writer.add_head_count(cfg.n_heads)
    writer.add_head_count_kv(cfg.n_kv_heads)
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
    writer.add_rope_freq_base(cfg.rope_theta)
    writer.add_layer_norm_rms_eps(cfg.norm_eps)
    writer.add_tokenizer_model("gpt2")
    byte_chars = [chr(c) for c in range(0x21, 0x7F)] + [chr(0x100 + i) for i in range(256 - 94)]
    tokens = (byte_chars + ["ab"] + [f"<|t{i}|>" for i in range(cfg.vocab_size)])[: cfg.vocab_size]
    writer.add_token_list(tokens)
    writer.add_token_types([1] * (len(byte_chars) + 1) + [3] * (cfg.vocab_size - len(byte_chars) - 1))
    writer.add_token_merges(["a b"])  # "ab" is a token too (below)
    writer.add_eos_token_id(cfg.vocab_size - 1)

    def matrix(name: str, rows: int, cols: int, fmt: str) -> None:
        std = cols**-0.5
        if fmt == "F32":
            writer.add_tensor(name, (torch.randn(rows, cols, generator=gen) * std).numpy())
        else:
            raw = random_blocks(BY_NAME[fmt].ggml_type, rows, cols, std, gen).numpy()
            writer.add_tensor(name, raw, raw_dtype=gguf.GGMLQuantizationType[fmt])

    def vector(name: str, n: int, around: float, spread: float) -> None:
        writer.add_tensor(name, (around + spread * torch.randn(n, generator=gen)).numpy().astype(np.float32))

    q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    shapes = {
        "wq": (q, cfg.dim),
        "wk": (kv, cfg.dim),
        "wv": (kv, cfg.dim),
        "wo": (cfg.dim, q),
        "w_gate": (cfg.ffn_dim, cfg.dim),
        "w_up": (cfg.ffn_dim, cfg.dim),
        "w_down": (cfg.dim, cfg.ffn_dim),
    }
    matrix("token_embd.weight", cfg.vocab_size, cfg.dim, formats(None, "tok_embeddings"))
    vector("output_norm.weight", cfg.dim, 1.0, 0.1)
    if not cfg.tied_embeddings:
        matrix("output.weight", cfg.vocab_size, cfg.dim, formats(None, "output"))
    arch = cfg.architecture
    for i in range(cfg.n_layers):
        blk = f"blk.{i}."
        vector(blk + "attn_norm.weight", cfg.dim, 1.0, 0.1)
        vector(blk + "ffn_norm.weight", cfg.dim, 1.0, 0.1)
        for name, (rows, cols) in shapes.items():
            matrix(blk + _NAMES[name] + ".weight", rows, cols, formats(i, name))
        if arch.qkv_bias:  # Qwen2's K biases are large: what the kernels add matters
            for name, n in (("attn_q", q), ("attn_k", kv), ("attn_v", kv)):
                vector(blk + name + ".bias", n, 0.0, 0.5)
        if arch.qk_norm:
            vector(blk + "attn_q_norm.weight", cfg.head_dim, 1.0, 0.2)
            vector(blk + "attn_k_norm.weight", cfg.head_dim, 1.0, 0.2)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path

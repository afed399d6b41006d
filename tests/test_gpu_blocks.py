"""gpu_blocks.py's repacking of GGUF blocks, held to gguf's own dequantization, bit for bit: every
format, from gguf's quantizer and from random blocks (its quantizer has no K-quants), and the
matrices of files read through load_checkpoint (a synthetic Qwen2 file of the real models' mixed
formats; the default model's Q4_1 and Q8_0, Q/K rows permuted). The kernels that read the repacked
blocks: triton_blocks_interpreted.py (through test_triton_step.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from synthetic_gguf import write_gguf

from lingcode.engine.local import gpu_blocks
from lingcode.engine.local.weights import ModelConfig, load_checkpoint

gguf = pytest.importorskip("gguf")


def gguf_dequantized(raw: torch.Tensor, fmt: str, rows: int, cols: int) -> torch.Tensor:
    from gguf.quants import dequantize

    return torch.from_numpy(np.array(dequantize(raw.numpy(), gguf.GGMLQuantizationType[fmt]))).reshape(rows, cols)


@pytest.mark.parametrize("fmt", sorted(gpu_blocks.BY_NAME))
def test_repacked_blocks_are_gguf_s_weights(fmt):
    rows, cols = 6, 1024
    t = gpu_blocks.BY_NAME[fmt].ggml_type
    sources = [gpu_blocks.random_blocks(t, rows, cols, 0.05, torch.Generator().manual_seed(0))]
    if not fmt.endswith("_K"):
        weights = np.random.default_rng(1).standard_normal((rows, cols)).astype(np.float32)
        sources.append(torch.from_numpy(gguf.quants.quantize(weights, gguf.GGMLQuantizationType[fmt])))
    for raw in sources:
        packed = gpu_blocks.repack(raw, rows, cols, t)
        assert torch.equal(gpu_blocks.dequantize(packed), gguf_dequantized(raw, fmt, rows, cols))
        # about the file's own bytes: never a dense copy
        assert packed.nbytes * 8 / (rows * cols) == gpu_blocks.BY_NAME[fmt].bits_per_weight() < 9


def test_a_qwen2_file_s_matrices_are_repacked_as_load_checkpoint_reads_them(tmp_path):
    cfg = ModelConfig(
        n_layers=2,
        dim=256,
        ffn_dim=768,
        n_heads=6,
        n_kv_heads=1,
        vocab_size=300,
        context_length=256,
        tied_embeddings=False,
        arch="qwen2",
        head_dim=64,
    )
    layers = [
        dict(wq="Q4_K", wk="Q4_K", wv="Q6_K", wo="Q5_0", w_gate="Q4_K", w_up="F32", w_down="Q6_K"),
        dict(wq="Q5_0", wk="Q5_0", wv="Q8_0", wo="Q4_1", w_gate="Q4_0", w_up="Q5_1", w_down="Q5_K"),
    ]
    top = {"output": "Q6_K", "tok_embeddings": "Q4_K"}
    checkpoint = load_checkpoint(
        write_gguf(tmp_path / "m.gguf", cfg, lambda i, n: top[n] if i is None else layers[i][n])
    )
    packed = gpu_blocks.pack_checkpoint(checkpoint, "cpu")
    assert "layers.0.w_up" not in packed  # F32: read dense from the model
    assert len(packed) == 2 * 7 - 1 + 1
    for name, matrix in packed.items():
        assert torch.equal(gpu_blocks.dequantize(matrix), checkpoint.weights[name]), name
    tied = ModelConfig(**{**cfg.__dict__, "tied_embeddings": True})
    checkpoint = load_checkpoint(
        write_gguf(tmp_path / "t.gguf", tied, lambda i, n: top[n] if i is None else layers[i][n])
    )
    head = gpu_blocks.pack_checkpoint(checkpoint, "cpu")["output"]  # the embeddings' blocks
    assert head.format == "Q4_K" and torch.equal(gpu_blocks.dequantize(head), checkpoint.weights["tok_embeddings"])


def test_the_default_model_s_q_and_k_rows_are_put_in_rotate_half_order(model_path):
    """llama.cpp permutes Llama's Q/K rows for interleaved RoPE; the repacked rows are weights.py's."""
    checkpoint = load_checkpoint(model_path)
    names = ["layers.0.wq", "layers.0.wk", "layers.0.wv", "output"]
    packed = gpu_blocks.pack_gguf(checkpoint.config, model_path, checkpoint.gguf_tensors, "cpu", names)
    assert [packed[n].format for n in names] == ["Q4_1", "Q4_1", "Q4_1", "Q8_0"]
    for name in names:
        expected = checkpoint.weights["tok_embeddings" if name == "output" else name]
        assert torch.equal(gpu_blocks.dequantize(packed[name]), expected), name

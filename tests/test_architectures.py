"""Every architecture in weights.py's table (llama, qwen2, qwen3) through every CPU backend, on tiny
GGUF files written here with random blocks of every type the native step reads: no download.

The native step (the file's blocks, 8-bit activations) and the torch step (bf16 matmuls) must
stay as near model.py's f32 forward over the same weights as 8-bit activations allow, and every
row must get the same numbers whatever the step's width (lossless drafts)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter

from lingcode.engine.local import cpu_native, cpu_step
from lingcode.engine.local.engine import build_model
from lingcode.engine.local.model import Transformer
from lingcode.engine.local.steps import NativeCpuStep, TorchCpuStep
from lingcode.engine.local.weights import ARCHITECTURES, load_checkpoint

Q = GGMLQuantizationType
# (d's size for weights of std ~0.05; which f16 fields the block has)
SCALES = {Q.Q4_0: 0.012, Q.Q4_1: 0.012, Q.Q5_0: 0.006, Q.Q5_1: 0.006, Q.Q8_0: 8e-4, Q.Q4_K: 2.5e-4,
          Q.Q5_K: 1.2e-4, Q.Q6_K: 6e-5}  # fmt: skip
# head_dim and the block type of each matrix per architecture: Q4_K_M-like mixes in fused matrices
SHAPES = {
    "llama": dict(dim=256, heads=4, kv_heads=2, head_dim=64, ffn=512,
                  types={"attn_q": Q.Q4_1, "attn_k": Q.Q4_1, "attn_v": Q.Q8_0, "attn_output": Q.Q4_0,
                         "ffn_gate": Q.Q5_1, "ffn_up": Q.Q5_1, "ffn_down": Q.Q8_0}),
    "qwen2": dict(dim=256, heads=4, kv_heads=2, head_dim=64, ffn=768,
                  types={"attn_q": Q.Q4_K, "attn_k": Q.Q4_K, "attn_v": Q.Q6_K, "attn_output": Q.Q5_0,
                         "ffn_gate": Q.Q4_K, "ffn_up": Q.Q5_K, "ffn_down": Q.Q6_K}),
    "qwen3": dict(dim=256, heads=4, kv_heads=1, head_dim=128, ffn=512,  # heads * head_dim != dim
                  types={"attn_q": Q.Q8_0, "attn_k": Q.Q8_0, "attn_v": Q.Q8_0, "attn_output": Q.Q4_K,
                         "ffn_gate": Q.Q6_K, "ffn_up": Q.Q6_K, "ffn_down": Q.Q4_K}),
}  # fmt: skip
VOCAB, LAYERS, CONTEXT = 512, 2, 1024


def random_blocks(rng, kind, rows: int, cols: int) -> np.ndarray:
    block, size = GGML_QUANT_SIZES[kind]
    n = rows * cols // block
    raw = rng.integers(0, 256, size=(n, size), dtype=np.uint8)

    def f16(column: int, scale: float) -> None:
        raw[:, column : column + 2] = (rng.uniform(0.5, 1.5, n) * scale).astype(np.float16).view(np.uint8).reshape(n, 2)

    if kind == Q.Q6_K:
        f16(208, SCALES[kind])
    else:
        f16(0, SCALES[kind])
        if kind in (Q.Q4_1, Q.Q5_1):
            f16(2, -SCALES[kind] * 8)  # m: centres the codes
        elif kind in (Q.Q4_K, Q.Q5_K):
            f16(2, SCALES[kind] * 4)  # dmin
    return raw


def tiny_gguf(path: Path, arch: str, seed: int = 0) -> Path:
    shape, rng = SHAPES[arch], np.random.default_rng(seed)
    dim, heads, kv, hd, ffn = (shape[k] for k in ("dim", "heads", "kv_heads", "head_dim", "ffn"))
    w = GGUFWriter(str(path), arch)
    w.add_uint32(f"{arch}.block_count", LAYERS)
    w.add_uint32(f"{arch}.context_length", CONTEXT)
    w.add_uint32(f"{arch}.embedding_length", dim)
    w.add_uint32(f"{arch}.feed_forward_length", ffn)
    w.add_uint32(f"{arch}.attention.head_count", heads)
    w.add_uint32(f"{arch}.attention.head_count_kv", kv)
    w.add_uint32(f"{arch}.attention.key_length", hd)
    w.add_float32(f"{arch}.rope.freq_base", 10000.0)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", "default")
    w.add_array("tokenizer.ggml.tokens", ["a", "b", "ab"] + [f"t{i}" for i in range(3, VOCAB)])
    w.add_array("tokenizer.ggml.token_type", [1] * VOCAB)
    w.add_array("tokenizer.ggml.merges", ["a b"])
    w.add_uint32("tokenizer.ggml.eos_token_id", 1)

    def matrix(name: str, kind, rows: int, cols: int) -> None:
        w.add_tensor(name, random_blocks(rng, kind, rows, cols).reshape(rows, -1), raw_dtype=kind)  # bytes per row

    def vector(name: str, n: int, around: float, spread: float) -> None:
        w.add_tensor(name, (around + spread * rng.standard_normal(n)).astype(np.float32))

    matrix("token_embd.weight", Q.Q8_0, VOCAB, dim)
    matrix("output.weight", Q.Q6_K if dim % 256 == 0 else Q.Q8_0, VOCAB, dim)
    vector("output_norm.weight", dim, 1.0, 0.1)
    rows = {"attn_q": (heads * hd, dim), "attn_k": (kv * hd, dim), "attn_v": (kv * hd, dim),
            "attn_output": (dim, heads * hd), "ffn_gate": (ffn, dim), "ffn_up": (ffn, dim), "ffn_down": (dim, ffn)}  # fmt: skip
    for i in range(LAYERS):
        for name, (r, c) in rows.items():
            matrix(f"blk.{i}.{name}.weight", shape["types"][name], r, c)
        vector(f"blk.{i}.attn_norm.weight", dim, 1.0, 0.1)
        vector(f"blk.{i}.ffn_norm.weight", dim, 1.0, 0.1)
        if ARCHITECTURES[arch].qkv_bias:
            for name, n in (("attn_q", heads * hd), ("attn_k", kv * hd), ("attn_v", kv * hd)):
                vector(f"blk.{i}.{name}.bias", n, 0.0, 0.5)
        if ARCHITECTURES[arch].qk_norm:
            vector(f"blk.{i}.attn_q_norm.weight", hd, 1.0, 0.2)
            vector(f"blk.{i}.attn_k_norm.weight", hd, 1.0, 0.2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module", params=list(SHAPES))
def tiny(request, tmp_path_factory):
    path = tiny_gguf(tmp_path_factory.mktemp(request.param) / f"{request.param}.gguf", request.param)
    checkpoint = load_checkpoint(path)
    reference = Transformer.from_weights(checkpoint.config, checkpoint.weights, torch.float32, torch.device("cpu"))
    reference.setup_cache(CONTEXT, transposed_keys=False)
    ids = torch.randint(2, VOCAB, (300,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.inference_mode():
        expected = reference(torch.tensor([ids]), 0, all_logits=True)[0]
    return request.param, checkpoint, ids, expected


def backend(checkpoint, kernels: str):
    model = build_model(checkpoint, torch.float32, torch.device("cpu"), kernels)
    model.setup_cache(CONTEXT)
    if kernels == "native":
        return NativeCpuStep(cpu_step.build(checkpoint, model), model.max_len)
    return TorchCpuStep(model)


def test_the_table_holds_each_architectures_differences(tiny):
    arch, checkpoint, _, _ = tiny
    cfg = checkpoint.config
    assert cfg.arch == arch and cfg.architecture == ARCHITECTURES[arch]
    assert cfg.head_dim == SHAPES[arch]["head_dim"]
    assert ("layers.0.bq" in checkpoint.weights) == ARCHITECTURES[arch].qkv_bias
    assert ("layers.0.q_norm" in checkpoint.weights) == ARCHITECTURES[arch].qk_norm
    assert cpu_step.unavailable(checkpoint) is None  # every block type here is one the native step reads


@pytest.mark.parametrize("kernels", ["native", "torch"])
def test_each_cpu_backend_runs_it_near_the_f32_model(tiny, kernels):
    """300 positions through the backend against model.py in f32 on the same (dequantized) weights.
    Both backends round activations (8-bit blocks, or bf16): they agree on the next token where the
    f32 model is not torn between two, and their logits stay within a small part of the logits' range."""
    if kernels == "native" and cpu_native.load() is None:
        pytest.fail("lingcode's native CPU code did not build")
    arch, checkpoint, ids, expected = tiny
    step = backend(checkpoint, kernels)
    with torch.inference_mode():
        ours = torch.cat([step(ids[s : s + 100], s, all_logits=True) for s in range(0, len(ids), 100)])
    difference = (ours - expected).abs()
    top2 = expected.topk(2, -1).values
    clear = (top2[:, 0] - top2[:, 1]) > 0.1 * expected.std()  # positions with a clear winner
    agree = (ours.argmax(-1) == expected.argmax(-1))[clear].float().mean().item()
    assert difference.mean() < 0.05 * expected.std(), (arch, kernels, difference.mean(), expected.std())
    assert agree >= 0.97, (arch, kernels, agree)


def test_a_native_row_gets_the_same_numbers_at_every_width(tiny):
    """What keeps drafts lossless: positions 240..279 in one step or in steps of any width, bit for bit."""
    if cpu_native.load() is None:
        pytest.fail("lingcode's native CPU code did not build")
    _, checkpoint, ids, _ = tiny
    step = backend(checkpoint, "native")
    with torch.inference_mode():
        step(ids[:240], 0)
        rows = ids[240:280]
        together = step(rows, 240, all_logits=True)
        for width in (1, 3, 8):
            pieces = [step(rows[s : s + width], 240 + s, all_logits=True) for s in range(0, 40, width)]
            assert torch.equal(torch.cat(pieces), together), width

"""Every architecture in weights.py's table (llama, qwen2, qwen3) through every CPU backend, on tiny
GGUF files (synthetic_gguf.py) with random blocks of every type the native step reads: no download.

The native step (the file's blocks, 8-bit activations) and the torch step (bf16 matmuls) must
stay as near model.py's f32 forward over the same weights as 8-bit activations allow, and every
row must get the same numbers whatever the step's width (lossless drafts)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from synthetic_gguf import write_gguf

from lingcode.engine.local import cpu_native, cpu_step
from lingcode.engine.local.engine import build_model
from lingcode.engine.local.model import Transformer
from lingcode.engine.local.steps import NativeCpuStep, TorchCpuStep
from lingcode.engine.local.weights import ARCHITECTURES, ModelConfig, load_checkpoint

# Per architecture: its shapes, and the block type of each matrix (Q4_K_M-like mixes in fused matrices)
SHAPES = {
    "llama": dict(dim=256, n_heads=4, n_kv_heads=2, head_dim=64, ffn_dim=512, tied_embeddings=True,
                  types={"wq": "Q4_1", "wk": "Q4_1", "wv": "Q8_0", "wo": "Q4_0", "w_gate": "Q5_1", "w_up": "Q5_1",
                         "w_down": "Q8_0", "tok_embeddings": "Q8_0"}),
    "qwen2": dict(dim=256, n_heads=4, n_kv_heads=2, head_dim=64, ffn_dim=768, tied_embeddings=False,
                  types={"wq": "Q4_K", "wk": "Q4_K", "wv": "Q6_K", "wo": "Q5_0", "w_gate": "Q4_K", "w_up": "Q5_K",
                         "w_down": "Q6_K", "tok_embeddings": "Q5_0", "output": "Q6_K"}),
    "qwen3": dict(dim=256, n_heads=4, n_kv_heads=1, head_dim=128, ffn_dim=512, tied_embeddings=False,  # heads * head_dim != dim
                  types={"wq": "Q8_0", "wk": "Q8_0", "wv": "Q8_0", "wo": "Q4_K", "w_gate": "Q6_K", "w_up": "Q6_K",
                         "w_down": "Q4_K", "tok_embeddings": "Q8_0", "output": "Q8_0"}),
}  # fmt: skip
VOCAB, LAYERS, CONTEXT = 512, 2, 1024


def tiny_gguf(path: Path, arch: str) -> Path:
    shape = dict(SHAPES[arch])
    types = shape.pop("types")
    cfg = ModelConfig(n_layers=LAYERS, vocab_size=VOCAB, context_length=CONTEXT, arch=arch, norm_eps=1e-6, **shape)
    return write_gguf(path, cfg, lambda layer, name: types[name])


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

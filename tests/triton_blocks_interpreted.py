"""The Triton step on a GGUF's own blocks (gpu_blocks.py, triton_step.py), in Triton's CPU interpreter:
each block format's GEMV against the dequantized matrix, then whole steps of small Qwen2 and Qwen3
models written as GGUF files (tests/synthetic_gguf.py: the real models' mixes of formats, head dims
64 and 128, 6 and 7 q heads per KV head, dims that are not powers of two) against model.py's torch
path, verify steps row for row against one-token steps, and the default model's own blocks.

tests/test_triton_step.py runs this file in a child pytest with TRITON_INTERPRET=1 (see
triton_interpreted.py, whose tolerances these follow). By hand:
    TRITON_INTERPRET=1 pytest tests/triton_blocks_interpreted.py
"""

from __future__ import annotations

import os

import pytest

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("needs TRITON_INTERPRET=1 from the start: tests/test_triton_step.py runs it", allow_module_level=True)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from synthetic_gguf import write_gguf  # noqa: E402
from triton_interpreted import check_rows_as_one_token_steps  # noqa: E402

from lingcode.engine.local import gpu_blocks  # noqa: E402
from lingcode.engine.local.model import Transformer  # noqa: E402
from lingcode.engine.local.triton_step import (  # noqa: E402
    TritonStep,
    matmul_residual_kernel,
    norm_gate_up_kernel,
    norm_lm_head_kernel,
)
from lingcode.engine.local.weights import ModelConfig, load_checkpoint  # noqa: E402

# The interpreter's time goes into per-program overhead: few, large programs.
LARGE_BLOCKS = {name: (256, 4) for name in ("qkv", "wo", "gate_up", "down")} | {"lm_head": (512, 4)}


def assert_close(actual: torch.Tensor, expected: torch.Tensor, rel: float) -> None:
    actual, expected = actual.float(), expected.float()
    worst = (actual - expected).abs().max().item()
    largest = expected.abs().max().item()
    assert worst <= rel * largest, f"max |diff| {worst:.3g}, max |expected| {largest:.3g}"


def tolerance(dtype) -> float:
    return 1e-5 if dtype == torch.float32 else 5e-2


# --- one matrix in each format ---------------------------------------------------------------------


def packed_matrix(fmt: str, rows: int, cols: int, seed: int) -> gpu_blocks.PackedMatrix:
    gen = torch.Generator().manual_seed(seed)
    t = gpu_blocks.BY_NAME[fmt].ggml_type
    return gpu_blocks.repack(gpu_blocks.random_blocks(t, rows, cols, cols**-0.5, gen), rows, cols, t)


@pytest.mark.parametrize("fmt", sorted(gpu_blocks.BY_NAME))
def test_each_format_s_gemv_matches_its_dequantized_matrix(fmt):
    """40 rows (the last program's block partly past them) of 768 columns (K-quants: three super-
    blocks, padded to 1024) or 352 (eleven 32-weight blocks, padded to 512); three input rows, two a
    program. The plain GEMV (matmul_residual), the normed one (norm_lm_head) and the pair sharing
    its input (norm_gate_up) against f32 torch on the dequantized matrix."""
    rows, cols, width = 40, 768 if fmt.endswith("_K") else 352, 3
    w, w2 = packed_matrix(fmt, rows, cols, 0), packed_matrix(fmt, rows, cols, 1)
    dense, dense2 = gpu_blocks.dequantize(w), gpu_blocks.dequantize(w2)
    gen = torch.Generator().manual_seed(2)
    a, x = torch.randn(width, cols, generator=gen), torch.randn(width, rows, generator=gen)
    norm = 1 + 0.1 * torch.randn(cols, generator=gen)
    block_n, block_k = 16, 1024 if cols == 768 else 512
    grid = (-(-rows // block_n), 2)  # two input rows a program
    with torch.inference_mode():
        out = x.clone()
        matmul_residual_kernel[grid](a, *w.args, out, width, 2, rows, cols, block_n, block_k, w.spec)
        assert_close(out, x + a @ dense.T, 1e-5)

        normed = F.rms_norm(a, (cols,), norm, 1e-6)
        logits = torch.empty(1, width, rows)
        norm_lm_head_kernel[grid](a, norm, *w.args, logits, width, 2, rows, 1e-6, cols, block_n, block_k, w.spec)
        assert_close(logits[0], normed @ dense.T, 1e-5)

        h = torch.empty(width, rows)
        norm_gate_up_kernel[grid](
            a, norm, *w.args, *w2.args, h, width, 2, 1e-6, cols, rows, block_n, block_k, w.spec, w2.spec
        )
        assert_close(h, F.silu(normed @ dense.T) * (normed @ dense2.T), 1e-5)


# --- small Qwen models from GGUF files -----------------------------------------------------------------

# Like Qwen2.5-Coder-1.5B's layers (Q4_K, V and down in Q6_K every other layer) and 0.5B's (Q5_0
# where rows are not whole 256-weight blocks, V in Q8_0), plus the other formats; gate and up in
# different formats once (two passes over the input instead of one).
LAYER_FORMATS = [
    dict(wq="Q4_K", wk="Q4_K", wv="Q6_K", wo="Q5_0", w_gate="Q4_K", w_up="Q4_K", w_down="Q6_K"),
    dict(wq="Q5_0", wk="Q5_0", wv="Q8_0", wo="Q4_1", w_gate="Q4_0", w_up="Q5_0", w_down="Q4_K"),
]
MODELS = {
    # head dim 64, 6 q heads per KV head, wo 384 wide, ffn 768; its own Q6_K head
    "qwen2-64": (ModelConfig(n_layers=2, dim=256, ffn_dim=768, n_heads=6, n_kv_heads=1, vocab_size=300,
                             context_length=512, rope_theta=1e6, norm_eps=1e-6, tied_embeddings=False, arch="qwen2",
                             head_dim=64), {"output": "Q6_K", "tok_embeddings": "Q4_K"}),
    # head dim 128, 7 q heads per KV head (wo 896 wide: the 0.5B's dim); the head tied to Q8_0 embeddings
    "qwen2-128": (ModelConfig(n_layers=2, dim=256, ffn_dim=768, n_heads=7, n_kv_heads=1, vocab_size=300,
                              context_length=512, rope_theta=1e6, norm_eps=1e-6, tied_embeddings=True, arch="qwen2",
                              head_dim=128), {"tok_embeddings": "Q8_0"}),
    # Qwen3's per-head q and k norms, 2 q heads per KV head
    "qwen3": (ModelConfig(n_layers=2, dim=256, ffn_dim=768, n_heads=4, n_kv_heads=2, vocab_size=300,
                          context_length=512, rope_theta=1e6, norm_eps=1e-6, tied_embeddings=False, arch="qwen3",
                          head_dim=64), {"output": "Q8_0", "tok_embeddings": "Q8_0"}),
}  # fmt: skip


@pytest.fixture(scope="module")
def gguf_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    files = {}
    for name, (cfg, top) in MODELS.items():
        formats = lambda i, n, top=top: top[n] if i is None else LAYER_FORMATS[i % 2][n]  # noqa: E731
        files[name] = write_gguf(root / f"{name}.gguf", cfg, formats, seed=len(files))
    return files


def load(path, dtype):
    """The file's model (dense weights: model.py's path) and its packed matrices (the Triton step's)."""
    checkpoint = load_checkpoint(path)
    model = Transformer.from_weights(checkpoint.config, checkpoint.weights, dtype, torch.device("cpu"))
    model.setup_cache(checkpoint.config.context_length, transposed_keys=False)
    return model, gpu_blocks.pack_checkpoint(checkpoint, "cpu")


def compare_step(model: Transformer, step: TritonStep, start: int, width: int, rel: float, seed: int = 7) -> None:
    """forward_static and the Triton step for the same tokens after the same cache: close logits,
    the same argmax in f32, close cache entries."""
    tokens = torch.randint(0, model.cfg.vocab_size, (1, width), generator=torch.Generator().manual_seed(seed))
    pos, kv_len = torch.arange(start, start + width), 128
    caches = [layer.attn.kv_cache for layer in model.layers]
    saved = [(c.k.clone(), c.v.clone()) for c in caches]
    with torch.inference_mode():
        expected = model.forward_static(tokens, pos, kv_len)
        written = [(c.k.clone(), c.v.clone()) for c in caches]
        for c, (k, v) in zip(caches, saved):
            c.k.copy_(k), c.v.copy_(v)
        actual = step(tokens, pos, kv_len)
    assert_close(actual, expected, rel)
    if model.norm.weight.dtype == torch.float32:
        assert torch.equal(actual.argmax(-1), expected.argmax(-1))
    for c, (k, v) in zip(caches, written):
        assert_close(c.k, k, rel)
        assert_close(c.v, v, rel)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_qwen_step_on_the_file_s_blocks_matches_the_torch_path(gguf_files, name, dtype):
    """After a torch prefill, one-token and 4-token steps on the packed blocks against model.py on
    the dequantized weights. f32: the same weights, summed in another order. bf16: model.py's
    weights are rounded to bf16, the step's are the file's own."""
    model, packed = load(gguf_files[name], dtype)
    assert len(packed) == 7 * model.cfg.n_layers + 1  # every matrix read as blocks
    step = TritonStep(model, LARGE_BLOCKS, weights=packed)
    prompt = torch.randint(0, model.cfg.vocab_size, (1, 37), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        model(prompt, 0)
    compare_step(model, step, 37, 1, tolerance(dtype))
    compare_step(model, step, 37, 4, tolerance(dtype))


def test_a_verify_step_on_blocks_gives_each_row_what_a_one_token_step_gives(gguf_files, rows=2):
    """triton_interpreted.py's lossless-speculation check (which tries 1, 2 and 5 rows a program on
    dense rows), bf16, on the packed blocks of the head-dim 128, 7-heads-a-group model."""
    model, packed = load(gguf_files["qwen2-128"], torch.bfloat16)
    check_rows_as_one_token_steps(model, TritonStep(model, LARGE_BLOCKS, rows=rows, weights=packed))


def test_the_default_model_s_own_blocks_match_the_torch_path(model_path):
    """SmolLM2-135M's Q4_1 layers (Q/K rows put back in rotate-half order) and Q8_0 head (its tied
    embeddings), first two layers, f32: within 1e-5 of forward_static and the same argmax."""
    checkpoint = load_checkpoint(model_path)
    model = Transformer.from_weights(checkpoint.config, checkpoint.weights, torch.float32, torch.device("cpu"))
    model.layers = model.layers[:2]
    model.setup_cache(128, transposed_keys=False)
    names = [f"layers.{i}.{n}" for i in range(2) for n in gpu_blocks.MATRICES] + ["output"]
    packed = gpu_blocks.pack_gguf(checkpoint.config, model_path, checkpoint.gguf_tensors, "cpu", names)
    assert {m.format for m in packed.values()} == {"Q4_1", "Q8_0"} and len(packed) == len(names)
    prompt = checkpoint.tokenizer.encode("def fibonacci(n):\n    if n < 2:\n        return n\n    return")
    with torch.inference_mode():
        model(torch.tensor([prompt]), 0)
    step = TritonStep(model, LARGE_BLOCKS | {"lm_head": (2048, 4)}, weights=packed)  # 49152 rows: few programs
    compare_step(model, step, len(prompt), 1, 1e-5)
    compare_step(model, step, len(prompt), 3, 1e-5)

"""The CPU path's matmuls: the GGUF's own 4-bit weights for decoding, bf16 for prefill, and
attention whose rows do not depend on each other (what keeps speculation lossless on the CPU)."""

import pytest
import torch
from gguf import GGUFReader
from gguf.quants import dequantize

from lingcode.engine.local.model import Transformer, row_exact_attention
from lingcode.engine.local.quantized import MAX_QUANTIZED_ROWS, CpuLinear, q4_from_blocks, q8_from_blocks
from lingcode.engine.local.weights import load_checkpoint


@pytest.fixture(scope="module")
def checkpoint(model_path):
    return load_checkpoint(model_path)


def _tensor(path, name):
    return next(t for t in GGUFReader(str(path)).tensors if t.name == name)


@pytest.mark.parametrize(
    ("name", "parse"), [("blk.0.ffn_up.weight", q4_from_blocks), ("token_embd.weight", q8_from_blocks)]
)
def test_the_files_blocks_parse_to_the_weights_gguf_dequantizes(model_path, name, parse):
    t = _tensor(model_path, name)
    rows, cols = reversed([int(d) for d in t.shape])
    parts = parse(t.data, rows, cols)
    parts = parts if isinstance(parts, list) else [parts]
    ours = sum(part.dequantize() for part in parts)
    theirs = torch.from_numpy(dequantize(t.data, t.tensor_type).copy()).reshape(rows, cols)
    assert torch.equal(ours, theirs)


def test_checkpoint_keeps_every_layer_matrix_and_the_head_quantized_in_our_row_order(checkpoint):
    cfg = checkpoint.config
    for i in range(cfg.n_layers):
        for name in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"):
            (part,) = checkpoint.q4[f"layers.{i}.{name}"]
            if i == 0:  # Q and K rows are un-permuted like the dense weights (RoPE layout)
                assert torch.equal(part.dequantize(), checkpoint.weights[f"layers.{i}.{name}"])
    head = sum(part.dequantize() for part in checkpoint.q4["output"])
    assert torch.equal(head, checkpoint.weights["tok_embeddings"])


def test_narrow_inputs_use_the_4bit_weights_and_wide_ones_the_dense(checkpoint):
    dense = checkpoint.weights["layers.0.w_gate"]
    linear = CpuLinear(dense, checkpoint.q4["layers.0.w_gate"])
    x = torch.randn(MAX_QUANTIZED_ROWS + 1, dense.shape[1], generator=torch.Generator().manual_seed(0))
    narrow, wide = linear(x[:MAX_QUANTIZED_ROWS]), linear(x)
    assert narrow.dtype == torch.float32
    # wide inputs: exactly torch's bf16 matmul of the dense weights
    assert torch.equal(wide, torch.nn.functional.linear(x.bfloat16(), dense.bfloat16()).float())
    # narrow ones: the 4-bit codes with bf16 scales, near the f32 product. The bound is the rounding
    # of x to bf16 (~2^-9 of each product, over 576 of them) and of the scales, plus the output's
    # bf16 ulp; a wrong row or code order is off by whole units (|y| reaches 18)
    assert torch.allclose(narrow, (x @ dense.T)[:MAX_QUANTIZED_ROWS], atol=0.15, rtol=2**-7)
    # a row's result does not depend on how many rows come with it
    assert torch.equal(linear(x[:1]), narrow[:1])


def test_attention_gives_a_row_the_same_numbers_alone_or_with_others():
    torch.manual_seed(0)
    k, v = torch.randn(1, 3, 256, 64), torch.randn(1, 3, 256, 64)
    q = torch.randn(1, 9, 8, 64)
    start = 200
    mask = torch.arange(256)[None, :] <= torch.arange(start, start + 8)[:, None]
    together = row_exact_attention(q, k, v, mask)
    for i in range(8):
        alone = row_exact_attention(q[:, :, i : i + 1], k, v, mask[i : i + 1])
        assert torch.equal(alone, together[:, :, i : i + 1])


def test_the_cpu_model_matches_the_files_weights_in_f32_on_the_next_token(checkpoint):
    """Not equal (bf16 matmuls), but the same next token almost always, as the GPU's bf16 path."""
    cfg = checkpoint.config
    reference = Transformer.from_weights(cfg, checkpoint.weights, torch.float32, torch.device("cpu"))
    cpu = Transformer.from_weights(cfg, checkpoint.weights, torch.float32, torch.device("cpu"))
    cpu.use_cpu_matmuls(checkpoint.q4)
    for model in (reference, cpu):
        model.setup_cache(512)
    ids = checkpoint.tokenizer.encode(open(__file__).read())[:300]
    agree = 0
    with torch.inference_mode():
        a, b = reference(torch.tensor([ids[:200]]), 0), cpu(torch.tensor([ids[:200]]), 0)
        for i in range(200, 300):
            agree += int(a[0, -1].argmax() == b[0, -1].argmax())
            a, b = reference(torch.tensor([[ids[i]]]), i), cpu(torch.tensor([[ids[i]]]), i)
    assert agree >= 90, f"{agree}/100"

"""The Triton step (lingcode/engine/local/triton_step.py) in Triton's CPU interpreter, against the
torch path it stands in for (model.py): each kernel on a small random model, in fp32 and bf16, then
the whole step on the real default model.

tests/test_triton_step.py runs this file in a child pytest: the interpreter has to be on before
triton is first imported, and must stay out of every other test. By hand:
    TRITON_INTERPRET=1 pytest tests/triton_interpreted.py

Tolerances. fp32: only the order of the fp32 sums differs from torch's, so |diff| <= 1e-5 of the
largest value compared. bf16: both paths round at the same points, but a sum that falls on the other
side of a rounding boundary comes out an ulp apart (0.4-0.8% of it), and a product carries that
along (an ulp of the gate, times up): |diff| <= 5% of the largest value compared.
"""

from __future__ import annotations

import os

import pytest

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("needs TRITON_INTERPRET=1 from the start: tests/test_triton_step.py runs it", allow_module_level=True)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from lingcode.engine.local import triton_step  # noqa: E402
from lingcode.engine.local.model import Transformer, rotate_half  # noqa: E402
from lingcode.engine.local.triton_step import TritonStep  # noqa: E402
from lingcode.engine.local.weights import ModelConfig, load_checkpoint  # noqa: E402

# SmolLM2-135M's head layout (3 q heads per KV head) at a size the interpreter runs in seconds; dims
# that are not multiples of the blocks, so the masks are exercised.
TINY = ModelConfig(n_layers=2, dim=96, ffn_dim=160, n_heads=6, n_kv_heads=2, vocab_size=300, context_length=2400)
# The interpreter's time goes into per-program overhead: few, large programs (numel <= 2**20 per tensor).
LARGE_BLOCKS = {name: (128, 4) for name in ("qkv", "wo", "gate_up", "down")} | {"lm_head": (512, 4)}
DTYPES = [torch.float32, torch.bfloat16]
REAL_MODEL_LAYERS = 2  # the real model's first layers: every layer runs the same kernels


def tolerance(dtype) -> float:
    return 1e-5 if dtype == torch.float32 else 5e-2


def assert_close(actual: torch.Tensor, expected: torch.Tensor, rel: float) -> None:
    actual, expected = actual.float(), expected.float()
    worst = (actual - expected).abs().max().item()
    largest = expected.abs().max().item()
    assert worst <= rel * largest, f"max |diff| {worst:.3g}, max |expected| {largest:.3g}"


def tiny_model(dtype, seed: int = 0) -> Transformer:
    gen = torch.Generator().manual_seed(seed)
    cfg = TINY
    q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    shapes = {"tok_embeddings": (cfg.vocab_size, cfg.dim), "norm": (cfg.dim,)}
    for i in range(cfg.n_layers):
        shapes |= {
            f"layers.{i}.{name}": shape
            for name, shape in dict(
                attn_norm=(cfg.dim,),
                ffn_norm=(cfg.dim,),
                wq=(q, cfg.dim),
                wk=(kv, cfg.dim),
                wv=(kv, cfg.dim),
                wo=(cfg.dim, q),
                w_gate=(cfg.ffn_dim, cfg.dim),
                w_up=(cfg.ffn_dim, cfg.dim),
                w_down=(cfg.dim, cfg.ffn_dim),
            ).items()
        }
    weights = {
        name: 1 + 0.1 * torch.randn(shape, generator=gen)
        if len(shape) == 1
        else torch.randn(shape, generator=gen) / shape[1] ** 0.5
        for name, shape in shapes.items()
    }
    model = Transformer.from_weights(cfg, weights, dtype, torch.device("cpu"))
    model.setup_cache(cfg.context_length, transposed_keys=False)  # the Triton step's layout
    return model


def random_cache(model: Transformer, seed: int = 1) -> None:
    gen = torch.Generator().manual_seed(seed)
    for layer in model.layers:
        cache = layer.attn.kv_cache
        cache.k.copy_(torch.randn(cache.k.shape, generator=gen))
        cache.v.copy_(torch.randn(cache.v.shape, generator=gen))


def rows(model: Transformer, width: int, seed: int = 2) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(width, model.cfg.dim, generator=gen).to(model.norm.weight.dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("positions", [[17], [5, 9, 200], [30, 31, 32, 33, 34, 35, 36, 37]])
def test_norm_qkv_rope_matches_torch_and_writes_only_its_cache_entries(dtype, positions):
    model = tiny_model(dtype)
    random_cache(model)
    layer, attn = model.layers[0], model.layers[0].attn
    before = attn.kv_cache.k.clone(), attn.kv_cache.v.clone()
    x, pos = rows(model, len(positions)), torch.tensor(positions)
    cos, sin = model.rope_cos[pos][:, None], model.rope_sin[pos][:, None]

    def rope(t: torch.Tensor, heads: int) -> torch.Tensor:  # model.py's, per head
        t = t.view(len(positions), heads, -1)
        return t * cos + rotate_half(t) * sin

    with torch.inference_mode():
        q = TritonStep(model).norm_qkv_rope(layer, x, pos)
        ref_q, ref_k, ref_v = attn.wqkv(layer.attn_norm(x)).split(attn.split, dim=-1)
    rel = tolerance(dtype)
    assert_close(q, rope(ref_q, TINY.n_heads).flatten(1), rel)
    assert_close(attn.kv_cache.k[0][:, pos].transpose(0, 1), rope(ref_k, TINY.n_kv_heads), rel)
    assert_close(attn.kv_cache.v[0][:, pos].transpose(0, 1), ref_v.view(len(positions), TINY.n_kv_heads, -1), rel)
    others = torch.ones(TINY.context_length, dtype=torch.bool)
    others[pos] = False
    assert torch.equal(attn.kv_cache.k[:, :, others], before[0][:, :, others])
    assert torch.equal(attn.kv_cache.v[:, :, others], before[1][:, :, others])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "width, end, kv_len",
    [
        (1, 40, 64),  # one split
        (3, 150, 300),  # three splits, the last past every position (an empty split)
        (8, 1050, 1100),  # nine splits, one tile each
        (2, 2250, 2400),  # more tiles than splits: two tiles a split
    ],
)
def test_attention_matches_sdpa(dtype, width, end, kv_len):
    model = tiny_model(dtype)
    random_cache(model)
    layer, cache = model.layers[0], model.layers[0].attn.kv_cache
    step = TritonStep(model)
    pos = torch.arange(end - width, end)
    q = rows(model, width)[:, : TINY.n_heads * TINY.head_dim]
    with torch.inference_mode():
        out = step.attention(layer, q, pos, kv_len)
        mask = torch.arange(kv_len)[None, :] <= pos[:, None]
        heads = q.view(1, width, TINY.n_heads, TINY.head_dim).transpose(1, 2)
        ref = F.scaled_dot_product_attention(
            heads, cache.k[:, :, :kv_len], cache.v[:, :, :kv_len], attn_mask=mask, enable_gqa=True
        )
    assert_close(out, ref.transpose(1, 2).reshape(width, -1), tolerance(dtype))
    assert not step.splits_done.any()  # every counter reset for the next step


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [1, 5])
def test_projections_and_feed_forward_match_torch(dtype, width):
    model = tiny_model(dtype)
    layer, step = model.layers[0], TritonStep(model)
    x = rows(model, width)
    attn_out = rows(model, width, seed=3)
    rel = tolerance(dtype)
    with torch.inference_mode():
        after_attn = x.clone()
        step.out_proj_residual(layer, attn_out, after_attn)
        assert_close(after_attn, x + layer.attn.wo(attn_out), rel)

        h = step.norm_gate_up(layer, x)
        gate, up = layer.ffn.w_gate_up(layer.ffn_norm(x)).chunk(2, dim=-1)
        assert_close(h, F.silu(gate) * up, rel)

        after_ffn = x.clone()
        step.down_residual(layer, h, after_ffn)  # the kernel's own h: this checks the down projection alone
        assert_close(after_ffn, x + layer.ffn.w_down(h), rel)

        logits = step.norm_lm_head(x)
        assert_close(logits[0], model.output(model.norm(x)), rel)


@pytest.mark.parametrize("dtype", DTYPES)
def test_step_and_torch_take_turns_mid_request(dtype):
    """One model decodes with torch's prefill, then Triton and torch steps in turn (plain decode and
    verify widths); its twin runs torch throughout. Logits stay close every step, and the caches
    end up close everywhere: the Triton step writes the entries torch would, and no others."""
    mixed, reference = tiny_model(dtype), tiny_model(dtype)
    step = TritonStep(mixed, LARGE_BLOCKS)
    gen = torch.Generator().manual_seed(4)
    prompt = torch.randint(0, TINY.vocab_size, (1, 37), generator=gen)
    rel = tolerance(dtype)
    with torch.inference_mode():
        mixed(prompt, 0)
        reference(prompt, 0)
        start = prompt.shape[1]
        for i, width in enumerate([1, 4, 1, 8, 2, 1]):
            tokens = torch.randint(0, TINY.vocab_size, (1, width), generator=gen)
            pos, kv_len = torch.arange(start, start + width), 64
            expected = reference.forward_static(tokens, pos, kv_len)
            triton_turn = i % 2 == 0
            actual = step(tokens, pos, kv_len) if triton_turn else mixed.forward_static(tokens, pos, kv_len)
            assert_close(actual, expected, rel)
            if dtype == torch.float32:
                assert torch.equal(actual.argmax(-1), expected.argmax(-1))
            start += width
    for ours, theirs in zip(mixed.layers, reference.layers):
        assert_close(ours.attn.kv_cache.k, theirs.attn.kv_cache.k, rel)
        assert_close(ours.attn.kv_cache.v, theirs.attn.kv_cache.v, rel)


@pytest.fixture(scope="module")
def real_model(model_path) -> Transformer:
    """The default model (fp32, as the CPU engine runs it), cut to its first layers."""
    checkpoint = load_checkpoint(model_path)
    model = Transformer.from_weights(checkpoint.config, checkpoint.weights, torch.float32, torch.device("cpu"))
    model.layers = model.layers[:REAL_MODEL_LAYERS]
    model.setup_cache(128, transposed_keys=False)  # the Triton step's layout
    prompt = checkpoint.tokenizer.encode("def fibonacci(n):\n    if n < 2:\n        return n\n    return")
    with torch.inference_mode():
        model(torch.tensor([prompt]), 0)
    model.prompt_length = len(prompt)
    return model


@pytest.mark.parametrize("width", [1, 4])
def test_real_model_step_matches_forward_static(real_model, width):
    """The real weights and shapes (576 dims, 9 q / 3 KV heads, 49152 logits): logits within 1e-5 of
    their largest, the same argmax, and the same KV cache entries."""
    model, start = real_model, real_model.prompt_length
    tokens = torch.tensor([[1202, 284, 339, 30][:width]])
    pos = torch.arange(start, start + width)
    caches = [layer.attn.kv_cache for layer in model.layers]
    saved = [(c.k.clone(), c.v.clone()) for c in caches]
    with torch.inference_mode():
        expected = model.forward_static(tokens, pos, 64)
        written = [(c.k.clone(), c.v.clone()) for c in caches]
        for c, (k, v) in zip(caches, saved):
            c.k.copy_(k), c.v.copy_(v)
        actual = TritonStep(model, LARGE_BLOCKS)(tokens, pos, 64)
    assert_close(actual, expected, 1e-5)
    assert torch.equal(actual.argmax(-1), expected.argmax(-1))
    for c, (k, v) in zip(caches, written):
        assert_close(c.k, k, 1e-5)
        assert_close(c.v, v, 1e-5)


def test_the_block_table_covers_every_matrix():
    assert set(triton_step.BLOCKS) == set(LARGE_BLOCKS)


@pytest.mark.parametrize("rows", [1, 2, 5])
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_verify_step_gives_each_row_what_a_one_token_step_gives(dtype, rows):
    """Lossless speculation needs this bit for bit: a width-5 step's logits and cache entries, row by
    row, equal five one-token steps at the same positions (each after the same cache), whether a
    GEMV program computes one row, two in turn (and a last program one), or all five."""
    model = tiny_model(dtype)
    check_rows_as_one_token_steps(model, TritonStep(model, LARGE_BLOCKS, rows=rows))


def check_rows_as_one_token_steps(model: Transformer, step: TritonStep) -> None:
    """A width-5 step's logits and cache entries, row by row, equal five one-token steps' (after a
    150-token prompt). Also run on a GGUF's blocks (triton_blocks_interpreted.py)."""
    gen = torch.Generator().manual_seed(5)
    prompt = torch.randint(0, model.cfg.vocab_size, (1, 150), generator=gen)
    tokens = torch.randint(0, model.cfg.vocab_size, (1, 5), generator=gen)
    start, kv_len = prompt.shape[1], 256
    caches = [layer.attn.kv_cache for layer in model.layers]
    with torch.inference_mode():
        model(prompt, 0)
        wide = step(tokens, torch.arange(start, start + 5), kv_len)[0]
        wide_entries = [(c.k[:, :, start : start + 5].clone(), c.v[:, :, start : start + 5].clone()) for c in caches]
        for i in range(5):  # token i after tokens 0..i-1, one at a time (their entries are already there)
            one = step(tokens[:, i : i + 1], torch.tensor([start + i]), kv_len)[0, 0]
            assert torch.equal(one, wide[i]), i
    for c, (k, v) in zip(caches, wide_entries):
        assert torch.equal(c.k[:, :, start : start + 5], k) and torch.equal(c.v[:, :, start : start + 5], v)

"""lingcode::decode_attention (cpu_attention.cpp, built by cpu_native.py): the CPU's decode and
verify attention over a 16-bit KV cache. It must agree with plain f32 attention over the same cache, and give a query row
the same numbers bit for bit however many rows come with it and on any thread count (what keeps
speculation lossless on the CPU)."""

import logging

import pytest
import torch

from lingcode.engine.local import cpu_native
from lingcode.engine.local.model import KVCache

HEADS, KV_HEADS, DIM = 9, 3, 64  # SmolLM2's
SHAPES = [(9, 3, 64), (12, 2, 128)]  # and Qwen2.5-Coder-1.5B's (heads, kv heads, head width)
MAX_LEN = 1030  # not a multiple of 16: the keys' padding is in play


def test_the_kernel_builds_here():
    assert cpu_native.load() is not None, "lingcode's native CPU code did not build: see the warning in the log"


def filled_cache(dtype, kv_heads: int = KV_HEADS, dim: int = DIM) -> KVCache:
    cache = KVCache(MAX_LEN, kv_heads, dim, dtype, torch.device("cpu"), transposed_keys=True)
    g = torch.Generator().manual_seed(0)
    cache.k.copy_(torch.randn(cache.k.shape, generator=g) * 2)
    cache.v.copy_(torch.randn(cache.v.shape, generator=g))
    return cache


def reference(q, cache, start):
    """f32 softmax attention over the cache's entries, row t seeing positions 0..start + t."""
    t, group, dim = q.shape[2], q.shape[1] // cache.k.shape[1], q.shape[3]
    k = cache.k[:, :, : start + t].float().repeat_interleave(group, 1)
    v = cache.v[:, :, : start + t].float().repeat_interleave(group, 1)
    scores = q @ k.transpose(2, 3) / dim**0.5
    visible = torch.arange(start + t)[None, :] <= torch.arange(start, start + t)[:, None]
    return torch.softmax(scores.masked_fill(~visible, float("-inf")), -1) @ v


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[2]}")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("start", [0, 5, 255, 256, 1000, MAX_LEN - 8])
@pytest.mark.parametrize("width", [1, 3, 8])
def test_it_is_f32_attention_over_the_cache(shape, dtype, start, width):
    assert cpu_native.load() is not None
    heads, kv_heads, dim = shape
    cache = filled_cache(dtype, kv_heads, dim)
    q = torch.randn(1, heads, width, dim, generator=torch.Generator().manual_seed(start + width))
    ours = cpu_native.decode_attention(q, cache.k, cache.v, start)
    assert ours.shape == q.shape and ours.dtype == torch.float32
    torch.testing.assert_close(ours, reference(q, cache, start), atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[2]}")
def test_a_row_gets_the_same_numbers_alone_with_others_and_on_one_thread(shape):
    assert cpu_native.load() is not None
    heads, kv_heads, dim = shape
    cache = filled_cache(torch.float16, kv_heads, dim)
    q = torch.randn(1, heads, 8, dim, generator=torch.Generator().manual_seed(1))
    threads = torch.get_num_threads()
    for start in (100, 250, 515):  # within a 256-position chunk, and rows on both sides of a chunk's end
        together = cpu_native.decode_attention(q, cache.k, cache.v, start)
        for i in range(8):
            alone = cpu_native.decode_attention(q[:, :, i : i + 1], cache.k, cache.v, start + i)
            assert torch.equal(alone, together[:, :, i : i + 1]), (start, i)
        torch.set_num_threads(1)
        try:
            assert torch.equal(cpu_native.decode_attention(q, cache.k, cache.v, start), together)
        finally:
            torch.set_num_threads(threads)


def test_bad_calls_are_refused_with_a_reason():
    assert cpu_native.load() is not None
    cache = filled_cache(torch.float16)
    q = torch.randn(1, HEADS, 3, DIM)
    with pytest.raises(RuntimeError, match="positions past the cache"):
        cpu_native.decode_attention(q, cache.k, cache.v, MAX_LEN - 2)
    with pytest.raises(RuntimeError, match="must be bf16 or f16"):
        cpu_native.decode_attention(q, cache.k.float(), cache.v.float(), 0)
    position_first = KVCache(64, KV_HEADS, DIM, torch.float16, torch.device("cpu"))
    with pytest.raises(RuntimeError, match="position-last"):
        cpu_native.decode_attention(q, position_first.k, position_first.v, 0)


def test_torch_compile_calls_it_without_a_graph_break():
    assert cpu_native.load() is not None
    cache = filled_cache(torch.float16)

    @torch.compile(dynamic=True, fullgraph=True)
    def step(q, start):
        return cpu_native.decode_attention(q * 1.0, cache.k, cache.v, start)

    for start, width in ((300, 1), (301, 3), (700, 1)):  # one graph for every position and width
        q = torch.randn(1, HEADS, width, DIM)
        assert torch.equal(step(q, start), cpu_native.decode_attention(q, cache.k, cache.v, start))


def test_the_engine_keeps_an_f16_cache_on_the_cpu(engine):
    cache = engine.model.layers[0].attn.kv_cache
    assert cache.k.dtype == cache.v.dtype == torch.float16
    assert engine.model.kv_dtype == torch.float16
    assert engine.info.extra["kv_cache_dtype"] == "float16"


def test_the_torch_step_verifies_across_bucket_ends_with_the_f16_cache(torch_cpu_engine):
    """With the f16 cache, cpu_attention gives a row the same numbers over any key count: a step from
    position 126 may verify as many drafts as anywhere (the f32 cache's buckets do not apply)."""
    step, model = torch_cpu_engine.step, torch_cpu_engine.model
    assert model.kv_dtype == torch.float16
    assert step.draft_room(126, 1) == step.draft_room(300, 1) == model.row_exact_rows - 1


def test_it_can_be_switched_off(monkeypatch):
    monkeypatch.setenv("LINGCODE_CPU_NATIVE", "0")
    assert cpu_native._build() is None


def test_a_failed_build_leaves_the_f32_path_and_says_why(monkeypatch, tmp_path, caplog):
    broken = tmp_path / "cpu_attention.cpp"
    broken.write_text("this is not C++\n")
    monkeypatch.setattr(cpu_native, "SOURCES", [broken, *cpu_native.SOURCES[1:]])
    monkeypatch.setenv("LINGCODE_HOME", str(tmp_path / "home"))
    with caplog.at_level(logging.WARNING, logger=cpu_native.__name__):
        assert cpu_native._build() is None
    assert "could not be built" in caplog.text and "f32 KV cache" in caplog.text

"""The GPU path of the embedded engine: CUDA graphs, the pipelined decode loop, lossless speculation.

These need a CUDA device; CI has none, so they run on the H200 through bench/h200.sh, whose
output (committed under bench/results/) records the run.
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

from lingcode.text.chat_template import render_chat
from lingcode.engine import SamplingParams

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (bench/h200.sh runs these)")

PROMPTS = [
    "Write a Python function that reverses a string.",
    "What is the capital of France?",
    "Repeat this code exactly:\n```python\ndef add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n```",
    "List three colors.",
    "Explain recursion in one sentence.",
    "Write a bash one-liner that counts lines in all .py files.",
]


@pytest.fixture(scope="module")
def gpu_engine(model_path):
    from lingcode.engine.local import load_engine

    return load_engine(model_path, device="cuda", kernels="torch")


@pytest.fixture(scope="module")
def triton_engine(model_path):
    """The same model with its captured steps as hand-written Triton kernels (triton_step.py): what
    the engine picks by default on a GPU."""
    pytest.importorskip("triton")
    from lingcode.engine.local import load_engine

    engine = load_engine(model_path, device="cuda")
    assert engine.info.extra["kernels"] == "triton"  # the default on a GPU (--kernels auto)
    return engine


def chat_ids(engine, text: str) -> list[int]:
    return engine.info.tokenizer.encode(render_chat(engine.info.chat_template, [{"role": "user", "content": text}]))


async def generate(engine, ids, params, speculation="off") -> list[int]:
    engine.set_speculation(speculation)
    engine.reset_cache()
    out: list[int] = []
    async for chunk in engine.generate("gpu-test", ids, params):
        out += chunk.token_ids
    return out


def test_captured_step_matches_the_eager_forward(gpu_engine):
    model, runner = gpu_engine.model, gpu_engine.step.runner
    ids = list(range(200, 203))
    with torch.inference_mode():
        eager = model(torch.tensor([ids], device="cuda"), 40, all_logits=True)[0].float()
        runner.tokens[0, :4].copy_(torch.tensor(ids + ids[-1:]))
        torch.arange(40, 44, out=runner.positions[:4])
        graphed = runner.replay(4, 44)[:3].float()
    assert torch.allclose(eager.softmax(-1), graphed.softmax(-1), atol=2e-2)
    assert (eager.argmax(-1) == graphed.argmax(-1)).all()


async def test_the_torch_step_offers_no_drafts(gpu_engine):
    """Lossless or not offered: captured torch ops are not row-exact across widths (greedy tokens
    with n-gram drafts left plain decoding's at token 16 of a code edit on the H200), so the torch
    step verifies no drafts, and its greedy output with speculation on is plain decoding's."""
    params = SamplingParams(max_tokens=48, temperature=0.0)
    assert not gpu_engine.step.drafts and gpu_engine.step.draft_room(100, 1) == 0
    for prompt in PROMPTS:
        ids = chat_ids(gpu_engine, prompt)
        reference = await generate(gpu_engine, ids, params, "off")
        assert await generate(gpu_engine, ids, params, "ngram") == reference, prompt


@pytest.mark.parametrize("kernels", ["torch", "triton"])
async def test_pipelined_loop_waits_once_per_token_and_never_syncs_implicitly(kernels, request):
    """One explicit wait per generated token (the pinned read-back), zero implicit syncs (.item(),
    .tolist(), pageable copies) in the decode loop: the count must not grow with the length."""
    gpu_engine = request.getfixturevalue("gpu_engine" if kernels == "torch" else "triton_engine")
    ids = chat_ids(gpu_engine, "Tell me a long story about a lighthouse.")

    async def count(n: int, params: SamplingParams) -> tuple[int, int]:
        before = gpu_engine.stats()["host_waits"]
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                tokens = await generate(gpu_engine, ids, params)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert len(tokens) == n
        implicit = sum("synchroniz" in str(w.message) for w in caught)
        return implicit, gpu_engine.stats()["host_waits"] - before

    greedy, sampled = dict(temperature=0.0), dict(temperature=0.8, top_p=0.9, seed=1)
    # penalized: the ids seen grow on the device, and greedy's argmax leaves the captured graph
    for kwargs in (greedy, sampled, {**greedy, "repetition_penalty": 1.3}, {**sampled, "repetition_penalty": 1.3}):
        short = await count(16, SamplingParams(max_tokens=16, ignore_eos=True, **kwargs))
        long = await count(64, SamplingParams(max_tokens=64, ignore_eos=True, **kwargs))
        assert long[0] == short[0], f"implicit syncs grow with length: {short[0]} for 16 tokens, {long[0]} for 64"
        assert short[1] == 16 and long[1] == 64  # exactly one read-back wait per token


def test_triton_step_matches_the_torch_step(gpu_engine, triton_engine):
    """Both captured steps on one real context, short and long (2000 entries: the attention splits the
    cache and combines the splits), at decode and verify widths: close logits, the same argmax, and
    close KV cache entries (bf16, summed in another order: 5% of the largest entry)."""
    ids = (chat_ids(gpu_engine, PROMPTS[2]) * 100)[:2000]

    def run(engine, width: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        runner = engine.step.runner
        runner.tokens[0, :width].copy_(torch.tensor(ids[end - width : end]))
        torch.arange(end - width, end, out=runner.positions[:width])
        logits = runner.replay(width, end)[:width].float().clone()
        caches = [layer.attn.kv_cache for layer in engine.model.layers]
        written = slice(end - width, end)
        entries = torch.stack([torch.stack([c.k[0, :, written], c.v[0, :, written]]) for c in caches])
        return logits, entries.float()

    try:
        with torch.inference_mode():
            for engine in (gpu_engine, triton_engine):
                engine.model(torch.tensor([ids], device="cuda"), 0)
            for width, end in ((1, 300), (4, 300), (8, 2000), (1, 2000)):
                ref_logits, ref_entries = run(gpu_engine, width, end)
                logits, entries = run(triton_engine, width, end)
                assert torch.allclose(logits.softmax(-1), ref_logits.softmax(-1), atol=2e-2), (width, end)
                assert (logits.argmax(-1) == ref_logits.argmax(-1)).all(), (width, end)
                assert (entries - ref_entries).abs().max() <= 0.05 * ref_entries.abs().max(), (width, end)
    finally:  # the caches hold this test's context now, not the engines' cached prefixes
        gpu_engine.reset_cache()
        triton_engine.reset_cache()


@pytest.mark.parametrize("rows", [None, 1, 2, 4, 8])
async def test_speculation_is_lossless_with_the_triton_step(triton_engine, rows):
    """The Triton step decodes (pipelined loop, width 1) and verifies drafts (widths 2-8) after a
    torch prefill: drafting changes no greedy token, because a verify step computes each row with
    the very code a one-token step runs (triton_step.py), however many rows a program computes in
    turn (rows; None: the default). Before that design, with tensor-core dots in verify steps,
    "What is the capital of France?" parted at token 19 on the H200."""
    from lingcode.engine.local.cuda_graphs import GraphRunner

    default = triton_engine.step.runner
    if rows is not None:
        options = {"rows": rows, "weights": default.step.weights}  # the engine's: the GGUF's blocks
        triton_engine.step.runner = GraphRunner(triton_engine.model, kernels="triton", triton_options=options)
    try:
        params = SamplingParams(max_tokens=48, temperature=0.0)
        for prompt in PROMPTS:
            ids = chat_ids(triton_engine, prompt)
            plain = await generate(triton_engine, ids, params, "off")
            assert await generate(triton_engine, ids, params, "ngram") == plain, prompt
    finally:
        triton_engine.step.runner = default


async def test_a_repetition_penalty_decodes_alike_pipelined_and_drafted(triton_engine):
    """Penalized greedy decoding: the pipelined loop (the penalty's ids kept on the device) and
    verified n-gram drafts (each row penalized for the sequence up to it) give the same tokens."""
    params = SamplingParams(max_tokens=48, temperature=0.0, repetition_penalty=1.3)
    changed = 0
    for prompt in PROMPTS:
        ids = chat_ids(triton_engine, prompt)
        plain = await generate(triton_engine, ids, params, "off")
        assert await generate(triton_engine, ids, params, "ngram") == plain, prompt
        changed += plain != await generate(triton_engine, ids, dataclasses.replace(params, repetition_penalty=1.0))
    assert changed


async def test_constrained_decoding_on_the_gpu_gives_schema_valid_json(gpu_engine):
    """llguidance's bitmask (filled on the CPU) applied to logits on the GPU, unpacked there:
    the default model writes JSON that validates against the schema, greedy and sampled."""
    import json

    from test_constrained import SCHEMA  # the CPU test's schema

    from lingcode.agent.grammar import constraint

    info = gpu_engine.info
    ids = chat_ids(gpu_engine, "Which language is this project in?")
    for seed in (None, 1, 2, 3):
        grammar = constraint(info.tokenizer, info.eos_token_ids, "json_schema", SCHEMA)
        sampling = dict(temperature=0.0) if seed is None else dict(temperature=0.8, seed=seed)
        params = SamplingParams(max_tokens=40, constraint=grammar, **sampling)
        out = await generate(gpu_engine, ids, params, "ngram")  # a grammar turns drafting off
        assert grammar.is_terminated(), seed
        value = json.loads(info.tokenizer.decode([t for t in out if t not in info.eos_token_ids]))
        assert set(value) == {"language", "lines"} and value["language"] in SCHEMA["properties"]["language"]["enum"]
        assert isinstance(value["lines"], int) and value["lines"] >= 1


async def test_prefill_of_new_lengths_does_not_grow_host_memory(gpu_engine):
    """cuDNN's attention keeps a graph per input shape for good (~1.9 MB of host memory each on the
    H200); eager forwards, whose shapes follow every prompt length, must not use it."""
    import psutil

    text = " ".join(f"line {i}: value = compute({i}, {i * 7 % 13})" for i in range(400))
    base = gpu_engine.info.tokenizer.encode(text)
    params = SamplingParams(max_tokens=1, temperature=0.0)
    rss = lambda: psutil.Process().memory_info().rss / 2**20  # noqa: E731
    for n in range(300, 340):  # warm-up: allocators and the kernels of these shapes
        await generate(gpu_engine, base[:n], params)
    before = rss()
    for n in range(1000, 1060):  # 60 prompt lengths not seen before
        await generate(gpu_engine, base[:n], params)
    assert rss() - before < 32, f"host memory grew {rss() - before:.0f} MB over 60 new prompt lengths"


def test_overlapped_launches_change_no_bit(triton_engine):
    """Programmatic dependent launch (each Triton kernel starting while the one before finishes)
    computes exactly what serial launches do: the same logits and KV cache entries, bit for bit,
    at decode and verify widths, short and long contexts. Skipped where the GPU has no PDL."""
    from lingcode.engine.local.cuda_graphs import GraphRunner
    from lingcode.engine.local.triton_step import pdl_supported

    model = triton_engine.model
    if not pdl_supported(model.norm.weight.device):
        pytest.skip("no programmatic dependent launch on this GPU or Triton")
    assert triton_engine.step.runner.step.pdl  # the engine's default where it is supported
    ids = (chat_ids(triton_engine, PROMPTS[0]) * 100)[:2000]
    options = {"pdl": False, "weights": triton_engine.step.runner.step.weights}  # the engine's: the GGUF's blocks
    serial = GraphRunner(
        model, widths=(1, 4), kernels="triton", triton_options=options
    )  # the same cache buckets: the same splits
    runners = {"pdl": triton_engine.step.runner, "serial": serial}
    try:
        with torch.inference_mode():
            model(torch.tensor([ids], device="cuda"), 0)
            for width, end in ((1, 300), (4, 300), (1, 2000), (4, 2000)):
                results = {}
                for name, runner in runners.items():
                    runner.tokens[0, :width].copy_(torch.tensor(ids[end - width : end]))
                    torch.arange(end - width, end, out=runner.positions[:width])
                    logits = runner.replay(width, end)[:width].clone()
                    cache = torch.stack([layer.attn.kv_cache.k[0, :, end - width : end] for layer in model.layers])
                    results[name] = logits, cache.clone()
                assert torch.equal(results["pdl"][0], results["serial"][0]), (width, end)
                assert torch.equal(results["pdl"][1], results["serial"][1]), (width, end)
    finally:
        triton_engine.reset_cache()

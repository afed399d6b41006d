"""The embedded engine, the scheduler and the text layer on the real default model (in process)."""

from __future__ import annotations

import asyncio
import dataclasses
from contextlib import aclosing

import pytest

from lingcode.text.chat_template import TemplateError, render_chat
from lingcode.engine import ContextOverflow, SamplingParams
from lingcode.pipeline.generation import generate_text
from lingcode.pipeline.scheduler import QueueFull, Scheduler

GREEDY = dict(temperature=0.0)


def chat_ids(engine, text: str) -> list[int]:
    info = engine.info
    prompt = render_chat(info.chat_template, [{"role": "user", "content": text}])
    return info.tokenizer.encode(prompt)


async def collect(scheduler, engine, rid, ids, params, stop=()):
    chunks = [c async for c in generate_text(scheduler, engine.info.tokenizer, rid, ids, params, stop)]
    return "".join(c.text for c in chunks), chunks[-1]


def test_model_facts(engine):
    info = engine.info
    assert info.context_length == 8192
    assert 2 in info.eos_token_ids  # <|im_end|>
    assert info.tokenizer.vocab_size == 49152
    cfg = engine.model.cfg
    assert (cfg.n_layers, cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim) == (30, 576, 9, 3, 64)
    assert cfg.rope_theta == 100000.0 and cfg.tied_embeddings


def test_tokenizer_round_trip_and_specials(engine):
    tok = engine.info.tokenizer
    text = "def reverse_string(s):\n    return s[::-1]  # 12345 héllo 🙂\n"
    assert tok.decode(tok.encode(text)) == text
    assert tok.encode("<|im_start|>user\nHi<|im_end|>")[0] == 1
    assert tok.encode("<|im_start|>user\nHi<|im_end|>")[-1] == 2
    assert tok.encode("12345") == [tok.token_to_id(d) for d in "12345"]  # digits split one by one


def test_chat_template_renders_chatml(engine):
    prompt = render_chat(engine.info.chat_template, [{"role": "user", "content": "Hi"}])
    assert prompt.startswith("<|im_start|>system\n")
    assert prompt.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    with pytest.raises(TemplateError):
        render_chat(None, [{"role": "user", "content": "Hi"}])


async def test_greedy_answer_is_a_python_function(engine):
    # A prompt whose greedy answer ends within the budget with both CPU kernel sets: with
    # "...reverses a string." the native step's answer goes on to a usage example the 135M model
    # cannot finish, as with "...adds two numbers." the torch kernels' answer does.
    scheduler = Scheduler(engine)
    ids = chat_ids(engine, "Write a Python function that returns the square of a number.")
    text, last = await collect(scheduler, engine, "square", ids, SamplingParams(max_tokens=120, **GREEDY))
    assert "```python" in text and "def square_number" in text
    assert last.finish_reason == "stop"
    assert last.usage.prompt_tokens == len(ids)


async def test_max_tokens_and_greedy_is_deterministic(engine):
    scheduler = Scheduler(engine)
    ids = chat_ids(engine, "Count from one to twenty in words.")
    first, last = await collect(scheduler, engine, "a", ids, SamplingParams(max_tokens=12, **GREEDY))
    assert last.finish_reason == "length" and last.usage.completion_tokens == 12
    again, _ = await collect(scheduler, engine, "b", ids, SamplingParams(max_tokens=12, **GREEDY))
    assert first == again


async def test_seeded_sampling_is_reproducible(engine):
    scheduler = Scheduler(engine)
    ids = chat_ids(engine, "Tell me a short story about a robot.")
    params = SamplingParams(max_tokens=16, temperature=1.0, top_p=0.95, top_k=50, seed=1234)
    a, _ = await collect(scheduler, engine, "s1", ids, params)
    b, _ = await collect(scheduler, engine, "s2", ids, params)
    c, _ = await collect(scheduler, engine, "s3", ids, SamplingParams(max_tokens=16, temperature=1.0, seed=99))
    assert a == b
    assert a != c


async def test_stop_string_cuts_and_aborts(engine):
    scheduler = Scheduler(engine)
    ids = chat_ids(engine, "Write a Python function that reverses a string.")
    text, last = await collect(scheduler, engine, "stop", ids, SamplingParams(max_tokens=120, **GREEDY), stop=["def"])
    assert last.finish_reason == "stop"
    assert "def" not in text and text.startswith("```python")
    assert engine.stats()["last_request"]["generated_tokens"] < 10  # the engine stopped there too


async def test_prefix_reuse_prefills_only_new_tokens(engine):
    scheduler = Scheduler(engine)
    tok = engine.info.tokenizer
    first = chat_ids(engine, "What is the capital of France?")
    answer, last = await collect(scheduler, engine, "turn1", first, SamplingParams(max_tokens=8, **GREEDY))
    generated = engine.stats()["last_request"]["generated_tokens"]
    follow = (
        first
        + tok.encode(answer)
        + tok.encode("<|im_end|>\n<|im_start|>user\nAnd of Italy?<|im_end|>\n<|im_start|>assistant\n")
    )
    before = engine.stats()
    _, last = await collect(scheduler, engine, "turn2", follow, SamplingParams(max_tokens=4, **GREEDY))
    after = engine.stats()
    # Every token fed last time is reused: the prompt and the answer but its last token (never fed).
    assert last.usage.cached_tokens == len(first) + generated - 1
    assert after["prefilled_tokens"] - before["prefilled_tokens"] == len(follow) - last.usage.cached_tokens


async def test_the_engine_times_its_own_first_chunk(engine):
    """last_request.first_chunk_ms: from when the engine took the request to its first chunk, after
    the prefill and before the caller has the chunk (lingcode bench daemon splits the first token so);
    hand_over_ms: how long handing that chunk over held the engine, part of its decode time;
    admitted_at_ms: when it took the request."""
    import time

    ids = chat_ids(engine, "Name a prime number.")
    started = time.perf_counter()
    first = None
    async for chunk in engine.generate("first-chunk", ids, SamplingParams(max_tokens=6, **GREEDY)):
        first = first or (time.perf_counter() - started) * 1e3
    last = engine.stats()["last_request"]
    assert last["prefill_ms"] <= last["first_chunk_ms"] <= first
    assert 0 <= last["hand_over_ms"] <= last["decode_ms"]
    # and when it took it, on perf_counter's clock (which the daemon's trace and a bench's client share)
    assert started * 1e3 <= last["admitted_at_ms"] <= started * 1e3 + first - last["first_chunk_ms"] + 0.01


async def test_the_engine_counts_its_cpu_steps_barrier_sleeps(engine):
    """last_request.barrier_sleeps: how often the native CPU step's threads slept waiting for each
    other during the request. With every core taken by other work they must (a partner preempted
    mid-step); lingcode bench daemon reports it a token, direct against through the daemon."""
    import os
    import subprocess
    import sys

    import torch

    if getattr(engine.step, "sleeps", None) is None or torch.get_num_threads() < 2:
        pytest.skip("the native CPU step on two threads or more")
    ids = chat_ids(engine, "Name a prime number.")
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in os.sched_getaffinity(0)]
    try:
        async for _ in engine.generate("busy", ids, SamplingParams(max_tokens=16, ignore_eos=True, **GREEDY)):
            pass
    finally:
        for process in busy:
            process.kill()
            process.wait()
    assert engine.stats()["last_request"]["barrier_sleeps"] > 0


async def test_abort_frees_the_engine_within_a_step(engine):
    scheduler = Scheduler(engine)
    ids = chat_ids(engine, "Write a long essay about the history of computing.")
    before = engine.stats()
    async with aclosing(
        generate_text(
            scheduler, engine.info.tokenizer, "long", ids, SamplingParams(max_tokens=2000, ignore_eos=True, **GREEDY)
        )
    ) as stream:
        n = 0
        async for _ in stream:
            n += 1
            if n == 3:
                break
    after = engine.stats()
    assert after["running"] is None and scheduler.stats()["running"] is None
    assert after["aborted"] == before["aborted"] + 1
    assert after["last_request"]["finish_reason"] == "abort"
    assert after["last_request"]["steps_after_abort"] <= 1
    # three chunks: on the CPU the loop is woken at most every 100 ms (ChunkChannel), 2 x 100 ms of steps
    assert after["last_request"]["generated_tokens"] < 400
    _, last = await collect(scheduler, engine, "next", ids, SamplingParams(max_tokens=2, **GREEDY))
    assert last.finish_reason == "length"


async def test_scheduler_runs_in_order_and_drops_cancelled_waiters(engine):
    scheduler = Scheduler(engine, max_queue=2)
    ids = chat_ids(engine, "Say hello.")
    params = SamplingParams(max_tokens=3, ignore_eos=True, **GREEDY)
    order: list[str] = []

    async def run(rid, tokens=3):
        async for chunk in generate_text(
            scheduler, engine.info.tokenizer, rid, ids, dataclasses.replace(params, max_tokens=tokens)
        ):
            if chunk.finish_reason:
                order.append(f"{rid}:{chunk.finish_reason}")

    first = asyncio.create_task(run("r1", 256))  # still running below: 3 tokens take under 10 ms on the CPU
    await asyncio.sleep(0)
    second = asyncio.create_task(run("r2"))
    third = asyncio.create_task(run("r3"))
    fourth = asyncio.create_task(run("r4"))
    await asyncio.sleep(0.01)
    assert scheduler.stats()["queued"] == ["r2", "r3"]
    with pytest.raises(QueueFull):
        await fourth
    second.cancel()  # a client that went away while waiting: dropped at once, never run
    assert await scheduler.cancel("r3")  # an explicit cancel of a waiting request
    await asyncio.gather(first, third)
    with pytest.raises(asyncio.CancelledError):
        await second
    assert order == ["r3:abort", "r1:length"]  # r3 ended at once, while r1 was still running
    stats = scheduler.stats()
    assert stats["dropped_while_queued"] == 2 and stats["completed"] == 1 and stats["running"] is None


async def test_context_overflow_is_an_error_not_a_truncation(engine):
    scheduler = Scheduler(engine)
    with pytest.raises(ContextOverflow):
        await collect(scheduler, engine, "big", [1] * 8192, SamplingParams(max_tokens=1))
    assert scheduler.stats()["running"] is None


class DigitsThenStop:
    """A tiny real constraint: exactly three digit tokens, then the generation ends."""

    def __init__(self, tokenizer, eos_id: int):
        self.allowed = [tokenizer.token_to_id(d) for d in "0123456789"]
        self.eos_id, self.count = eos_id, 0

    def mask_logits(self, logits):
        keep = logits.new_full(logits.shape, float("-inf"))
        allowed = self.allowed if self.count < 3 else [self.eos_id]
        keep[allowed] = 0.0
        logits += keep

    def accept(self, token_id):
        self.count += 1

    def is_terminated(self):
        return self.count > 3


async def test_token_constraint_is_applied_every_step(engine):
    scheduler = Scheduler(engine)
    ids = chat_ids(engine, "Write a haiku about the sea.")
    constraint = DigitsThenStop(engine.info.tokenizer, eos_id=2)
    text, last = await collect(
        scheduler, engine, "digits", ids, SamplingParams(max_tokens=20, constraint=constraint, **GREEDY)
    )
    assert len(text) == 3 and text.isdigit()
    assert last.finish_reason == "stop" and last.usage.completion_tokens == 4


def test_auto_kernels_are_triton_on_a_gpu_and_native_on_the_cpu(engine):
    """--kernels auto (the default): the Triton step where captured graphs run it, the native step on
    the CPU where it builds, torch otherwise (and always with --compile, which is for torch's kernels)."""
    import torch

    from lingcode.engine.local.engine import pick_kernels

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert engine.info.extra["kernels"] == engine.info.extra["step"] == "native"  # this session's CPU engine
    assert pick_kernels("auto", cpu, cuda_graphs=True, compile=True) == "torch"
    assert pick_kernels("torch", cpu, cuda_graphs=True, compile=False) == "torch"
    pytest.importorskip("triton")
    assert pick_kernels("auto", cuda, cuda_graphs=True, compile=False) == "triton"
    assert pick_kernels("auto", cuda, cuda_graphs=True, compile=True) == "torch"  # --compile is for torch kernels
    assert pick_kernels("auto", cuda, cuda_graphs=False, compile=False) == "torch"  # Triton runs only as graphs
    assert pick_kernels("torch", cuda, cuda_graphs=True, compile=False) == "torch"


async def test_chunk_channel_hands_over_what_piled_up_as_one_chunk():
    """The engine thread's chunks reach the event loop merged: the loop is woken for the first
    chunk, the last one and an error at once, and otherwise at most once per interval."""
    import threading

    from lingcode.engine import ChunkChannel, EngineError, TokenChunk

    loop = asyncio.get_running_loop()
    channel = ChunkChannel(loop, interval_s=3600)  # no wake-up by time in this test
    wakes = []
    real_wake = channel._wake
    channel._wake = lambda: (wakes.append(1), real_wake())[1]

    def engine_thread():
        for i in range(5):
            channel.put(TokenChunk([i], None, 3, 1))
        channel.put(TokenChunk([5], "stop", 3, 1, 2.5))

    thread = threading.Thread(target=engine_thread)
    thread.start()
    thread.join()
    merged = await channel.get()
    assert merged.token_ids == [0, 1, 2, 3, 4, 5] and merged.finish_reason == "stop"
    assert (merged.prompt_tokens, merged.cached_tokens, merged.spec_accept_length) == (3, 1, 2.5)
    assert len(wakes) <= 2  # the first chunk and the last: not one per step

    failing = ChunkChannel(loop)
    threading.Thread(target=lambda: (failing.put(TokenChunk([7])), failing.put(EngineError("boom")))).start()
    assert (await failing.get()).token_ids == [7]  # what came before the error first
    with pytest.raises(EngineError, match="boom"):
        await failing.get()


async def test_chunk_channel_hands_the_first_chunk_over_before_the_worker_goes_on(monkeypatch):
    """Where the engine's threads take every core, the worker waits after the first chunk until the
    loop has passed it on and reads again (or the reader left): the loop then has a core for the
    first token. A first chunk that ends the stream, or a reader that left, is not waited on."""
    import threading

    import lingcode.engine
    from lingcode.engine import ChunkChannel, TokenChunk

    monkeypatch.setattr(lingcode.engine, "FIRST_HAND_OVER_S", 60.0)  # only the reader ends the wait here
    loop = asyncio.get_running_loop()
    order: list[str] = []
    channel = ChunkChannel(loop, interval_s=3600, hand_over_first=True)

    def worker():
        channel.put(TokenChunk([1]))
        order.append("worker goes on")
        channel.put(TokenChunk([2], "stop"))

    thread = threading.Thread(target=worker)
    thread.start()
    assert (await channel.get()).token_ids == [1]
    await asyncio.sleep(0.05)  # the loop passing the first chunk on
    order.append("loop passed it on")
    assert (await channel.get()).token_ids == [2]
    await asyncio.to_thread(thread.join)
    assert order == ["loop passed it on", "worker goes on"]

    # a first chunk that is also the last, and a reader that left: put() returns without waiting
    for ending, released in ((True, False), (False, True)):
        done = threading.Event()
        channel = ChunkChannel(loop, interval_s=3600, hand_over_first=True)
        if released:
            channel.release()
        threading.Thread(target=lambda: (channel.put(TokenChunk([1], "stop" if ending else None)), done.set())).start()
        assert await asyncio.to_thread(done.wait, 30)

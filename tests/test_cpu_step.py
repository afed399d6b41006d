"""The native CPU step (cpu_step.cpp): the whole forward pass in one call on the GGUF's own blocks.

It must stay as near the f32 model as llama.cpp does on the same file (both quantize activations
to 8 bits per block of 32), give every row the same numbers whatever the step's width and the
thread count, so that greedy drafts equal plain decoding token for token, and the engine must
fall back to torch's kernels, and say why, where it cannot run. Drafts are lossless on every
kernel set the CPU engine runs: native, torch with the f16 cache, torch with the f32 cache.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time

import pytest
import torch

from lingcode.engine import SamplingParams
from lingcode.engine.local import cpu_native, load_engine
from lingcode.engine.local.engine import pick_kernels
from lingcode.engine.local.model import Transformer
from lingcode.engine.local.weights import load_checkpoint
from lingcode.text.chat_template import render_chat

# Another project's file to edit (not lingcode's, not the bench's workload).
GO_FILE = """package config

import (
\t"encoding/json"
\t"errors"
\t"os"
)

// Config holds the settings of the mirror daemon.
type Config struct {
\tListen   string   `json:"listen"`
\tUpstream string   `json:"upstream"`
\tMirrors  []string `json:"mirrors"`
\tRetries  int      `json:"retries"`
}

var ErrNoUpstream = errors.New("config: no upstream")

// parseConfig reads a JSON file and checks it.
func parseConfig(path string) (*Config, error) {
\tdata, err := os.ReadFile(path)
\tif err != nil {
\t\treturn nil, err
\t}
\tvar c Config
\tif err := json.Unmarshal(data, &c); err != nil {
\t\treturn nil, err
\t}
\tif c.Upstream == "" {
\t\treturn nil, ErrNoUpstream
\t}
\tif c.Retries == 0 {
\t\tc.Retries = 3
\t}
\treturn &c, nil
}
"""
PROMPTS = {
    "code edit": f"Rename parseConfig to loadConfig and output the whole file:\n```go\n{GO_FILE}```",
    "chat": "What is the difference between a process and a thread?",
}


@pytest.fixture(scope="module")
def checkpoint(model_path):
    return load_checkpoint(model_path)


@pytest.fixture(scope="module")
def f32_engine(model_path):
    """The CPU engine where lingcode's native code is not available (no compiler, or switched
    off): torch's kernels and an f32 KV cache."""
    loaded = list(cpu_native._loaded)
    cpu_native._loaded[:] = [None]
    try:
        yield load_engine(model_path, device="cpu")
    finally:
        cpu_native._loaded[:] = loaded


def chat_ids(engine, text: str) -> list[int]:
    return engine.info.tokenizer.encode(render_chat(engine.info.chat_template, [{"role": "user", "content": text}]))


async def generate(engine, ids: list[int], speculation: str, max_tokens: int = 96) -> list[int]:
    engine.set_speculation(speculation)
    engine.reset_cache()
    out: list[int] = []
    async for chunk in engine.generate(
        f"cpu-step-{speculation}", ids, SamplingParams(max_tokens=max_tokens, temperature=0.0)
    ):
        out += chunk.token_ids
    return out


def test_the_native_step_is_the_cpu_default(engine):
    assert engine.info.extra["step"] == engine.info.extra["kernels"] == "native"
    assert engine.info.extra["kv_cache_dtype"] == "float16"


def test_it_stays_as_near_the_f32_model_as_llama_cpp(engine, checkpoint):
    """300 positions of a Go file through the f32 model (the file's weights dequantized, f32
    activations and cache) and through the native step. Measured on this text's kind (the first 300
    tokens of speculative.py): native mean |logit difference| 0.150, the same argmax at 94.3 % of
    positions; llama.cpp on the same GGUF 0.157-0.167 and 93.7-95.0 % (docs/engine-notes.md)."""
    ids = checkpoint.tokenizer.encode(GO_FILE * 3)[:300]
    reference = Transformer.from_weights(checkpoint.config, checkpoint.weights, torch.float32, torch.device("cpu"))
    reference.setup_cache(512, transposed_keys=False)
    try:
        with torch.inference_mode():
            expected = reference(torch.tensor([ids]), 0, all_logits=True)[0]
            ours = engine.step(ids, 0, all_logits=True)
    finally:
        engine.reset_cache()
    difference = (ours - expected).abs()
    agree = (ours.argmax(-1) == expected.argmax(-1)).float().mean().item()
    assert difference.mean() < 0.25 and difference.max() < 5, (difference.mean(), difference.max())
    assert agree >= 0.9, agree


def test_a_row_gets_the_same_numbers_at_every_width_and_thread_count(engine):
    """Logits of 40 tokens fed at positions 240..279 (across a 256-position attention chunk), in one
    step, in steps of every width, and on 1 and 3 threads: equal bit for bit."""
    step = engine.step
    gen = torch.Generator().manual_seed(0)
    context = torch.randint(100, 40000, (240,), generator=gen).tolist()
    ids = torch.randint(100, 40000, (40,), generator=gen).tolist()
    threads = torch.get_num_threads()
    try:
        with torch.inference_mode():
            step(context, 0)
            together = step(ids, 240, all_logits=True)
            for width in (1, 2, 3, 5, 8, 13):
                pieces = [step(ids[s : s + width], 240 + s, all_logits=True) for s in range(0, len(ids), width)]
                assert torch.equal(torch.cat(pieces), together), width
            assert torch.equal(step(ids, 240)[0], together[-1])  # the last row alone, as prefill gives it
            for n in (1, 3):
                torch.set_num_threads(n)
                assert torch.equal(step(ids, 240, all_logits=True), together), n
    finally:
        torch.set_num_threads(threads)
        engine.reset_cache()


def test_the_weights_live_in_one_block_on_huge_pages(engine):
    """The step repacks every matrix straight into one block of memory that the kernel may back with
    2 MB pages (a step streams all the weights): one block, holding the weights and no more than
    their 64-byte padding, advised for huge pages where the kernel has them."""
    native = engine.step.native
    ((address, total),) = native.weight_storages()
    matrices = 1 + 4 * len(engine.model.layers)  # the head (tied to the embedding) and 4 a layer
    assert native.weight_bytes() <= total < native.weight_bytes() + 2 * 64 * 3 * matrices
    assert address % (2 << 20) == 0
    if os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled"):
        with open("/proc/self/smaps") as smaps:  # the mapping that holds the block says it may use them
            text = smaps.read()
        ranges = [(line.split()[0], i) for i, line in enumerate(text.splitlines()) if "-" in line.split()[0]]
        lines = text.splitlines()
        for (span, i), (_, j) in zip(ranges, ranges[1:] + [("", len(lines))]):
            start, end = (int(x, 16) for x in span.split("-"))
            if start <= address < end:
                flags = next(line for line in lines[i:j] if line.startswith("VmFlags:"))
                assert " hg" in flags, flags  # madvise(MADV_HUGEPAGE) was taken
                break
        else:
            raise AssertionError("the weights' block is not in /proc/self/smaps")


def test_the_step_threads_always_wake_each_other(engine):
    """A step's threads wait for each other at every barrier, and the helper waits for the next step:
    a wait that outlasts its spin sleeps in the kernel, and a wake-up lost there would stall the
    engine (for 100 ms now, and counted; for good before). Another process takes a core (the two threads then share one, so barrier waits
    sleep) and steps come with pauses (the helper sleeps between them): every step must return."""
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    native, done = engine.step.native, []

    def steps():
        with torch.inference_mode():
            engine.step(list(range(100, 164)), 0)
            for i in range(400):
                engine.step([100 + i], 64 + i % 64)
                if i % 8 == 0:
                    time.sleep(0.002)  # longer than the helper spins between steps
                done.append(i)

    try:
        slept = native.sleeps()
        worker = threading.Thread(target=steps, daemon=True)
        worker.start()
        worker.join(300)
        assert not worker.is_alive(), f"a step never returned, after {len(done)} steps"
        assert len(done) == 400 and native.sleeps() > slept  # the sleeping path ran
        assert native.lost_wakes() == 0  # and every sleeper was woken, none by its timeout alone
    finally:
        hog.kill()
        hog.wait()
        engine.reset_cache()


@pytest.mark.parametrize("kernels", ["native", "torch", "torch-f32"])
@pytest.mark.parametrize("prompt", PROMPTS)
async def test_greedy_drafts_equal_plain_decoding_on_every_cpu_kernel_set(
    kernels, prompt, engine, torch_cpu_engine, f32_engine
):
    engine = {"native": engine, "torch": torch_cpu_engine, "torch-f32": f32_engine}[kernels]
    before = engine.stats()["accepted_draft_tokens"]
    try:
        ids = chat_ids(engine, PROMPTS[prompt])
        plain = await generate(engine, ids, "off")
        assert await generate(engine, ids, "ngram") == plain
    finally:
        engine.set_speculation("ngram")
    if prompt == "code edit":  # the answer copies parts of the file: drafts were verified and kept
        assert engine.stats()["accepted_draft_tokens"] - before >= 5


def test_without_native_code_the_engine_uses_torch_and_says_why(f32_engine, checkpoint, caplog):
    assert f32_engine.info.extra["step"] == "torch-cpu" and f32_engine.info.extra["kv_cache_dtype"] == "float32"
    loaded = list(cpu_native._loaded)
    cpu_native._loaded[:] = [None]
    try:
        with caplog.at_level(logging.WARNING):
            assert pick_kernels("auto", torch.device("cpu"), True, False, checkpoint) == "torch"
        assert "native CPU code is not built" in caplog.text
        with pytest.raises(ValueError, match="--kernels native cannot run"):
            load_engine(checkpoint.gguf_path, device="cpu", kernels="native")
    finally:
        cpu_native._loaded[:] = loaded

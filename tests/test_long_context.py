"""The whole 32K context of a model that has one (Qwen2.5-Coder-0.5B): a 20K-token prompt prefills
in chunks through a real daemon, which answers meanwhile, and a client that leaves stops it within
one chunk; the KV cache takes memory as positions are used, not whole at load."""

from __future__ import annotations

import asyncio
import signal
import time

import httpx
import torch
from conftest import serve, share_built_caches

from lingcode.bench.decode import held_out_code
from lingcode.engine.local.weights import load_checkpoint

PROMPT_TOKENS = 20_000


def resident(addresses: list[int]) -> int:
    """Bytes of this process's memory resident in the mappings that hold these addresses."""
    total, lines = 0, open("/proc/self/smaps").read().splitlines()
    starts = [i for i, line in enumerate(lines) if "-" in line.split()[0] and ":" not in line.split()[0]]
    for i, j in zip(starts, starts[1:] + [len(lines)]):
        low, high = (int(x, 16) for x in lines[i].split()[0].split("-"))
        if any(low <= a < high for a in addresses):
            total += int(next(line for line in lines[i:j] if line.startswith("Rss:")).split()[1]) * 1024
    return total


def test_the_kv_cache_takes_memory_as_positions_are_used(qwen_path):
    """32,768 positions of keys and values would take 402 MB at load; the cache is mapped memory the
    system gives as it is written, so it holds what the positions fed so far need. An engine of its
    own: the session's shared one keeps the pages its earlier prompts wrote."""
    from lingcode.engine.local import load_engine

    qwen_engine = load_engine(qwen_path, device="cpu")
    caches = [layer.attn.kv_cache for layer in qwen_engine.model.layers]
    tensors = [t for cache in caches for t in (cache.k, cache.v)]
    whole = sum(t.numel() * t.element_size() for t in tensors)
    addresses = [t.data_ptr() for t in tensors]
    qwen_engine.reset_cache()
    with torch.inference_mode():
        qwen_engine.step(list(range(1000, 1128)), 0)  # 128 positions
        used = resident(addresses)
        for start in range(128, 4096, 128):  # 4K positions, an eighth of the context
            qwen_engine.step(list(range(1000, 1128)), start)
        more = resident(addresses)
    qwen_engine.reset_cache()
    assert whole > 400e6
    assert used < whole // 16, (used, whole)
    assert used < more < whole // 4, (more, whole)


async def test_a_20k_token_prompt_prefills_in_chunks_and_stops_when_its_client_leaves(qwen_path, tmp_path):
    checkpoint = load_checkpoint(qwen_path)
    assert checkpoint.config.context_length >= 32768
    ids = held_out_code(checkpoint.tokenizer, PROMPT_TOKENS)[:PROMPT_TOKENS]
    daemon = serve(qwen_path, share_built_caches(tmp_path / "home"))
    headers = {"Authorization": f"Bearer {daemon.token}"}
    try:
        async with httpx.AsyncClient(base_url=daemon.url, headers=headers, timeout=120) as http:

            async def stats() -> dict:
                return (await http.get("/v1/lingcode/stats")).json()["engine"]

            before = await stats()
            body = {"prompt": ids, "max_tokens": 4, "stream": True}  # token ids: exactly 20K of them
            request = asyncio.create_task(http.post("/v1/completions", json=body))
            deadline = time.monotonic() + 120
            while (now := await stats())["forward_passes"] < before["forward_passes"] + 2:
                assert time.monotonic() < deadline and not request.done(), now
                await asyncio.sleep(0.05)
            # mid-prefill: the daemon answers, and the engine goes on chunk by chunk
            health = await http.get("/health")
            assert health.status_code == 200
            later = await stats()
            assert later["running"] is not None and later["forward_passes"] >= now["forward_passes"]
            request.cancel()  # the client goes away mid-prefill
            try:
                await request
            except asyncio.CancelledError:
                pass
            while (after := await stats())["running"] is not None:
                assert time.monotonic() < deadline, after
                await asyncio.sleep(0.05)
    finally:
        daemon.process.send_signal(signal.SIGTERM)
        daemon.process.wait(timeout=30)
    last = after["last_request"]
    assert last["finish_reason"] == "abort" and last["generated_tokens"] == 0
    ran = after["forward_passes"] - before["forward_passes"]
    # the chunk running when the client left, at most one more; not the 157 chunks of the prompt
    assert ran <= later["forward_passes"] - before["forward_passes"] + 2, ran
    assert ran < 157 // 4

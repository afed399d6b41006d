"""The engine alone: a cached chat prompt's first chunk and ms a token (128 tokens), 10 requests back
to back; run with and without SCHED_IDLE spinners on every CPU (scratch/spin.sh)."""
import asyncio, statistics, time
from lingcode import models
from lingcode.engine import SamplingParams
from lingcode.engine.local import load_engine
from lingcode.text.chat_template import render_chat

async def main():
    engine = load_engine(models.ensure(), device="cpu", speculation="off")
    info = engine.info
    ids = info.tokenizer.encode(render_chat(info.chat_template, [{"role": "user", "content": "Write a Python function that merges two sorted lists."}],
                                            bos_token=info.bos_token, eos_token=info.eos_token))
    params = SamplingParams(max_tokens=128, temperature=0, ignore_eos=True)
    firsts, tpots = [], []
    for i in range(12):
        t = time.perf_counter(); first = None; n = 0
        async for chunk in engine.generate(f"r{i}", ids, params):
            if chunk.token_ids and first is None: first = time.perf_counter()
            n += len(chunk.token_ids)
        end = time.perf_counter()
        if i >= 2: firsts.append((first - t) * 1e3); tpots.append((end - first) * 1e3 / (n - 1))
    s = engine.stats()
    print(f"first chunk {statistics.median(firsts):.2f} ms, {statistics.median(tpots):.3f} ms a token, barrier sleeps {engine.step.sleeps()}")
    await engine.close()
asyncio.run(main())

"""The engine alone (no daemon): its first chunk on a cached prompt after idle gaps, in this process."""
import asyncio, statistics, time
from lingcode import models
from lingcode.engine import SamplingParams
from lingcode.engine.local import load_engine
from lingcode.text.chat_template import render_chat

async def main():
    engine = load_engine(models.ensure(), device="cpu", speculation="off")
    info = engine.info
    text = render_chat(info.chat_template, [{"role": "user", "content": "Write a Python function that merges two sorted lists."}],
                       bos_token=info.bos_token, eos_token=info.eos_token)
    ids = info.tokenizer.encode(text)
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    async def once():
        t = time.perf_counter(); first = None
        async for chunk in engine.generate(f"r{time.time_ns()}", ids, params):
            if chunk.token_ids and first is None: first = time.perf_counter()
        return (first - t) * 1e3
    for _ in range(5): await once()
    for gap in (0, 0.0005, 0.001, 0.002, 0.005, 0.05, 0, 0.002):
        ts = []
        for _ in range(25):
            if gap: time.sleep(gap)  # the loop itself idle, as between two requests
            ts.append(await once())
        print(f"gap {gap*1e3:5.1f} ms: first chunk median {statistics.median(ts):6.2f} ms (p25 {sorted(ts)[6]:.2f}, p75 {sorted(ts)[18]:.2f})", flush=True)
    await engine.close()
asyncio.run(main())

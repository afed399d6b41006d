"""The engine alone: first chunk on a cached prompt after an idle gap, with and without waking the
pool's helpers when the 'request arrives' (0.4 ms of busy Python before the engine gets it)."""
import asyncio, statistics, time, sys
from lingcode import models
from lingcode.engine import SamplingParams
from lingcode.engine.local import load_engine
from lingcode.text.chat_template import render_chat

BUSY = float(sys.argv[1]) if len(sys.argv) > 1 else 0.0004

async def main():
    engine = load_engine(models.ensure(), device="cpu", speculation="off")
    info = engine.info
    native = engine.step.native
    text = render_chat(info.chat_template, [{"role": "user", "content": "Write a Python function that merges two sorted lists."}],
                       bos_token=info.bos_token, eos_token=info.eos_token)
    ids = info.tokenizer.encode(text)
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    async def once(wake):
        t0 = time.perf_counter()
        if wake: native.wake()
        while time.perf_counter() - t0 < BUSY: pass   # the daemon parsing the request
        t = time.perf_counter(); first = None
        async for chunk in engine.generate(f"r{time.time_ns()}", ids, params):
            if chunk.token_ids and first is None: first = time.perf_counter()
        return (first - t) * 1e3, (first - t0) * 1e3
    for _ in range(5): await once(False)
    res = {}
    for rep in range(4):
        for gap in (0.001, 0.002, 0.005, 0.05):
            for wake in (False, True):
                ts = []
                for _ in range(15):
                    time.sleep(gap)
                    ts.append(await once(wake))
                res.setdefault((gap, wake), []).extend(ts)
    for (gap, wake), ts in sorted(res.items()):
        a = statistics.median(x for x, _ in ts); b = statistics.median(y for _, y in ts)
        print(f"gap {gap*1e3:6.1f} ms wake {wake!s:5}: first chunk from submit {a:6.2f} ms, from arrival {b:6.2f} ms (n={len(ts)})", flush=True)
    print("sleeps", native.sleeps(), "lost", native.lost_wakes())
    await engine.close()
asyncio.run(main())

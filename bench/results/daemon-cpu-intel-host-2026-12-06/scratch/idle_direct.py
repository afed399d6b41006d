"""The engine alone (no daemon) after idle gaps: its first chunk, on a cached prompt."""
import asyncio, os, statistics, sys, tempfile, time, pathlib
sys.path.insert(0, "/work/main")
from lingcode.bench import share_kernels
home = pathlib.Path(tempfile.mkdtemp(prefix="idle-")); share_kernels(home); os.environ["LINGCODE_HOME"] = str(home)
from lingcode import models
from lingcode.engine import SamplingParams
from lingcode.engine.local import load_engine
from lingcode.text.chat_template import render_chat

async def main():
    engine = load_engine(models.ensure("smollm2-135m-instruct"), device="cpu", speculation="off")
    text = render_chat(engine.info.chat_template, [{"role": "user", "content": "Write a Python function that merges two sorted lists."}], bos_token=engine.info.bos_token, eos_token=engine.info.eos_token)
    ids = engine.info.tokenizer.encode(text)
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    async def once():
        t = time.perf_counter(); first = None
        async for chunk in engine.generate(f"r{time.time_ns()}", ids, params):
            if chunk.token_ids and first is None: first = time.perf_counter()
        return (first - t) * 1e3
    for _ in range(3): await once()
    for gap in (0, 0.05, 0.5, 0, 0.5):
        ts = []
        for _ in range(15):
            await asyncio.sleep(gap); ts.append(await once())
        print(f"gap {gap:4} s: first chunk median {statistics.median(ts):6.2f} ms")
    await engine.close()
asyncio.run(main())

"""Scratch: the engine fed directly, plain, 128 tokens of one chat prompt, N requests after one warm-up; median ms a token."""
import asyncio, statistics, sys, time
from lingcode.engine.local import load_engine
from lingcode.models import resolve
from lingcode.bench.daemon import direct_local
from lingcode.text.chat_template import render_chat
async def main():
    eng = load_engine(resolve(None), device="cpu", speculation="off")
    info = eng.info
    msgs = [{"role": "user", "content": "Write a Python function that parses an ISO 8601 duration like P3DT4H into seconds, with tests."}]
    ids = info.tokenizer.encode(render_chat(info.chat_template, msgs, bos_token=info.bos_token, eos_token=info.eos_token))
    t = []; f = []
    for i in range(int(sys.argv[1]) + 1):
        ttft, tpot, out = await direct_local(eng, ids, 128)
        if i: t.append(tpot); f.append(ttft)
    print(f"tpot {statistics.median(t):.3f} ms  ttft(cached) {statistics.median(f):.3f} ms  ({min(t):.3f}-{max(t):.3f})")
    await eng.close()
asyncio.run(main())

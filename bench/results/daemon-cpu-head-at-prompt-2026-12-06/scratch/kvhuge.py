"""Scratch: two engines in one process, one with its KV cache on 2 MB pages; requests alternate."""
import asyncio, ctypes, mmap, math, statistics, sys, time, json
import torch
from lingcode.engine.local import model as M
from lingcode.engine.local.engine import load_engine
from lingcode.engine import SamplingParams
from lingcode.text.chat_template import render_chat

HUGE = 2 << 20
def huge_zeros(shape, dtype):
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    size = -(-nbytes // HUGE) * HUGE
    m = mmap.mmap(-1, size + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
    off = (-addr) % HUGE
    m.madvise(mmap.MADV_HUGEPAGE, off, size)
    t = torch.frombuffer(m, dtype=torch.uint8, count=size, offset=off)
    t.zero_()
    return t.view(dtype)[: math.prod(shape)].view(shape)

orig_zeros = torch.zeros
def patched_zeros(*args, **kw):
    if len(args) == 1 and isinstance(args[0], tuple) and kw.get("device") is not None and torch.device(kw["device"]).type == "cpu" \
            and math.prod(args[0]) * 2 >= HUGE and set(kw) <= {"dtype", "device"}:
        return huge_zeros(args[0], kw["dtype"])
    return orig_zeros(*args, **kw)

GGUF = "/root/.cache/lingcode/models/SmolLM2-135M-Instruct.Q4_1.gguf"
import os
real = M.host_zeros
M.host_zeros = lambda n, dtype: torch.zeros(n, dtype=dtype)
if os.environ.get("KV_HUGE") == "2":
    M.host_zeros = real
a = load_engine(GGUF, device="cpu", speculation="off")
M.host_zeros = real if os.environ.get("KV_HUGE", "1") == "1" else (lambda n, dtype: torch.zeros(n, dtype=dtype))
b = load_engine(GGUF, device="cpu", speculation="off")
def smaps():
    return [l.strip() for l in open("/proc/self/smaps_rollup") if l.startswith("AnonHuge")]
print(smaps(), file=sys.stderr)
info = a.info
prompts = [json.loads(l) for l in open("/work/main/bench/results/daemon-h200-2026-12-02-inputs/prompts.jsonl")]
from lingcode.bench.daemon import read_prompts
from pathlib import Path
PR = read_prompts(Path("/work/main/bench/results/daemon-h200-2026-12-02-inputs/prompts.jsonl"))
WL = sys.argv[4] if len(sys.argv) > 4 else "stdlib"
N = int(sys.argv[1]); T = int(sys.argv[2]); GAP = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
async def run(e, ids):
    p = SamplingParams(max_tokens=T, temperature=0.0, ignore_eos=True)
    t0 = time.perf_counter(); first = None; n = 0
    async for ch in e.generate(f"r{time.monotonic_ns()}", ids, p):
        if ch.token_ids and first is None: first = time.perf_counter()
        n += len(ch.token_ids)
    last = time.perf_counter()
    return (first - t0) * 1e3, (last - first) * 1e3 / (n - 1)
async def main():
    res = {"a": [], "b": []}
    for i in range(N):
        from lingcode.bench.daemon import workload_request, read_prompts
        if WL == "long":
            src = open("/work/main/lingcode/bench/daemon.py").read()
            msgs = [{"role": "user", "content": "Review this code:\n" + src[(i % 5) * 1000 : (i % 5) * 1000 + 7000]}]
        else:
            label, msgs = workload_request(WL, i, PR)
        ids = info.tokenizer.encode(render_chat(info.chat_template, msgs, bos_token=info.bos_token, eos_token=info.eos_token))
        order = [("a", a), ("b", b)] if i % 2 == 0 else [("b", b), ("a", a)]
        for k, e in order:
            await run(e, ids)  # cold: fills the prefix
            if GAP: await asyncio.sleep(GAP)
            res[k].append((len(ids),) + await run(e, ids))  # cached
    for k in res:
        print(k, "prompt p50", statistics.median(x[0] for x in res[k]), "ttft p50 %.3f" % statistics.median(x[1] for x in res[k]),
              "tpot p50 %.3f" % statistics.median(x[2] for x in res[k]))
    r = [bb[2] / aa[2] for aa, bb in zip(res["a"], res["b"])]
    f = [bb[1] - aa[1] for aa, bb in zip(res["a"], res["b"])]
    print("paired tpot b/a p50 %.3f  b faster in %d/%d; ttft b-a p50 %.3f" % (statistics.median(r), sum(x < 1 for x in r), len(r), statistics.median(f)))
asyncio.run(main())

"""Quiet steps: elastic on (take-over at X us) vs off, alternating blocks of 16 steps; paired ratios."""
import sys, time, statistics, random, torch
from lingcode import models
from lingcode.engine.local import load_engine, cpu_native
ctxlen = int(sys.argv[1]); blocks = int(sys.argv[2]); xs = [int(x) for x in sys.argv[3].split(",")]
eng = load_engine(models.ensure(models.DEFAULT_MODEL), device="cpu", kernels="native", speculation="off")
mod = cpu_native.load(); native = eng.step.native
c = torch.randint(100, 40000, (ctxlen,), generator=torch.Generator().manual_seed(0)).tolist()
modes = [("off", 0)] + [("on", x) for x in xs]
res = {m: [] for m in modes}
with torch.inference_mode():
    for s in range(0, ctxlen, 256): eng.step(c[s:s+256], s)
    for k in range(blocks):
        order = modes[:] if k % 2 == 0 else modes[::-1]
        for m in order:
            mod._set_elastic(m[0] == "on"); mod._set_take_over_ns(m[1] * 1000)
            t0 = time.perf_counter()
            for i in range(16): eng.step([5], ctxlen + i)
            res[m].append((time.perf_counter() - t0) / 16 * 1e3)
def boot(v):
    rs = sorted(statistics.median(random.choices(v, k=len(v))) for _ in range(1000))
    return rs[25], rs[975]
print(f"context {ctxlen}: off {statistics.median(res[('off', 0)]):.3f} ms/step")
for m in modes[1:]:
    r = [a / b for a, b in zip(res[m], res[("off", 0)])]
    lo, hi = boot(r)
    print(f"  on, take over at {m[1]} us: {statistics.median(res[m]):.3f} ms/step, paired {statistics.median(r):.4f} ({lo:.4f}-{hi:.4f})")
print("take_overs", native.take_overs())

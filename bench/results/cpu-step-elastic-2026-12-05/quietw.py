import sys, time, statistics, random, torch
from lingcode import models
from lingcode.engine.local import load_engine, cpu_native
width = int(sys.argv[1]); blocks = int(sys.argv[2])
eng = load_engine(models.ensure(models.DEFAULT_MODEL), device="cpu", kernels="native", speculation="off")
mod = cpu_native.load(); native = eng.step.native
c = torch.randint(100, 40000, (200,), generator=torch.Generator().manual_seed(0)).tolist()
res = {True: [], False: []}; tk = {True: 0, False: 0}
with torch.inference_mode():
    eng.step(c, 0)
    for k in range(blocks):
        for on in ((True, False) if k % 2 == 0 else (False, True)):
            mod._set_elastic(on); t = native.take_overs()
            t0 = time.perf_counter()
            for i in range(16): eng.step([5] * width, 200, all_logits=True)
            res[on].append((time.perf_counter() - t0) / 16 * 1e3); tk[on] += native.take_overs() - t
r = [a / b for a, b in zip(res[True], res[False])]
rs = sorted(statistics.median(random.choices(r, k=len(r))) for _ in range(1000))
print(f"width {width}: off {statistics.median(res[False]):.3f} on {statistics.median(res[True]):.3f} ms/step, on/off {statistics.median(r):.4f} ({rs[25]:.4f}-{rs[975]:.4f}), take-overs a step {tk[True] / (16 * blocks):.3f}")

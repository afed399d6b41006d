"""Wake-ups during steps (scratch, elastic.patch applied): a thread of this process (holding the GIL)
or another process burns B us once per 16 steps, at step 8; elastic on/off alternating blocks of 16
steps. Prints the paired ratio of the blocks, and each mode's mean time of steps 6-13 around the wake.

    python wake5.py thread|process BURN_US BLOCKS
"""
import os, sys, time, threading, statistics, random, subprocess, torch
from lingcode import models
from lingcode.engine.local import load_engine, cpu_native
kind = sys.argv[1]; burn = int(sys.argv[2]); blocks = int(sys.argv[3])
eng = load_engine(models.ensure(models.DEFAULT_MODEL), device="cpu", kernels="native", speculation="off")
mod = cpu_native.load(); native = eng.step.native
if kind == "thread":
    r, w = os.pipe()
    def waker():
        while True:
            os.read(r, 1)
            end = time.perf_counter() + burn / 1e6
            while time.perf_counter() < end: pass
    threading.Thread(target=waker, daemon=True).start()
    poke = lambda: os.write(w, b"x")
else:
    child = subprocess.Popen([sys.executable, "-c", f"""
import sys, time, os
while True:
    b = os.read(0, 1)
    if not b: break
    end = time.perf_counter() + {burn} / 1e6
    while time.perf_counter() < end: pass
"""], stdin=subprocess.PIPE)
    fd = child.stdin.fileno()
    poke = lambda: os.write(fd, b"x")
c = torch.randint(100, 40000, (200,), generator=torch.Generator().manual_seed(0)).tolist()
K = 16
steps = {True: [[] for _ in range(K)], False: [[] for _ in range(K)]}
res = {True: [], False: []}
with torch.inference_mode():
    eng.step(c, 0)
    for k in range(blocks):
        for on in ((True, False) if k % 2 == 0 else (False, True)):
            mod._set_elastic(on)
            t0 = time.perf_counter()
            for i in range(K):
                if i == 8: poke()
                s0 = time.perf_counter()
                eng.step([5], 200 + i)
                steps[on][i].append((time.perf_counter() - s0) * 1e3)
            res[on].append((time.perf_counter() - t0) / K * 1e3)
def boot(v):
    rs = sorted(statistics.median(random.choices(v, k=len(v))) for _ in range(1000))
    return rs[25], rs[975]
r = [a / b for a, b in zip(res[True], res[False])]
d = [(a - b) * K for a, b in zip(res[True], res[False])]
lo, hi = boot(r)
print(f"{kind} burning {burn} us per {K} steps: off {statistics.median(res[False]):.3f}, on {statistics.median(res[True]):.3f} ms/step; "
      f"on/off paired {statistics.median(r):.4f} ({lo:.4f}-{hi:.4f}); per wake on-off {statistics.median(d):.3f} ms; take_overs {native.take_overs()}")
for on in (True, False):
    mean = [statistics.mean(v) for v in steps[on]]
    print(f"elastic={on}: mean ms of steps 6..13: " + " ".join(f"{m:.2f}" for m in mean[6:14]) + f"; sum of all {sum(mean):.2f}")

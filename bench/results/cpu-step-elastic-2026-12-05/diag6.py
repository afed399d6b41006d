import os, sys, time, threading, statistics, torch
from lingcode import models
from lingcode.engine.local import load_engine, cpu_native
burn = int(sys.argv[1]); rounds = int(sys.argv[2])
eng = load_engine(models.ensure(models.DEFAULT_MODEL), device="cpu", kernels="native", speculation="off")
mod = cpu_native.load(); native = eng.step.native
r, w = os.pipe()
def waker():
    while True:
        os.read(r, 1)
        end = time.perf_counter() + burn / 1e6
        while time.perf_counter() < end: pass
threading.Thread(target=waker, daemon=True).start()
c = torch.randint(100, 40000, (200,), generator=torch.Generator().manual_seed(0)).tolist()
K = 16
res = {on: [[] for _ in range(K)] for on in (True, False)}
fwd = {on: [[] for _ in range(K)] for on in (True, False)}
step_native = eng.step.native
with torch.inference_mode():
    eng.step(c, 0)
    for rd in range(rounds):
        for on in ((True, False) if rd % 2 == 0 else (False, True)):
            mod._set_elastic(on)
            for i in range(K):
                if i == 8: os.write(w, b"x")
                t0 = time.perf_counter()
                eng.step([5], 200 + i)
                res[on][i].append((time.perf_counter() - t0) * 1e3)
for on in (True, False):
    mean = [statistics.mean(v) for v in res[on]]
    print(f"elastic={on}: mean ms of steps 6..13: " + " ".join(f"{m:.2f}" for m in mean[6:14]) + f"; sum of all {sum(mean):.2f}")

import os, time, sys
def spin(sec):
    end = time.perf_counter() + sec; last = time.perf_counter(); gaps = []
    while True:
        t = time.perf_counter()
        if t - last > 100e-6: gaps.append(t - last)
        last = t
        if t > end: break
    return gaps
pids = []
for k in range(2):
    pid = os.fork()
    if pid == 0:
        g = spin(5); print(k, "gaps>100us:", len(g), "total ms %.1f" % (sum(g)*1e3), "max ms %.2f" % (max(g)*1e3 if g else 0)); sys.stdout.flush(); os._exit(0)
    pids.append(pid)
for p in pids: os.waitpid(p, 0)

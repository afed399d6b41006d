"""Re-reading 100 MB of this process's memory after an idle gap: one byte per 4 KB page, and all of it."""
import time, statistics, numpy as np
a = np.ones(100 * 2**20, dtype=np.uint8)
pages = a[::4096]
for gap in (0, 0.05, 0.2, 0.5, 2.0, 0):
    per_page, whole = [], []
    for _ in range(7):
        time.sleep(gap); t = time.perf_counter(); int(pages.sum()); per_page.append((time.perf_counter() - t) * 1e3)
        time.sleep(gap); t = time.perf_counter(); int(a.sum(dtype=np.uint64)); whole.append((time.perf_counter() - t) * 1e3)
    print(f"gap {gap:4} s: a byte a page {statistics.median(per_page):6.2f} ms, all 100 MB {statistics.median(whole):6.2f} ms")

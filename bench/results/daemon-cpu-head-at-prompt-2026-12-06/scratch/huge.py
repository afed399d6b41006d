"""Scratch: the process's anonymous memory (Python's heap and arenas) on 2 MB pages."""
import ctypes, os, re, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
MADV_HUGEPAGE, MADV_COLLAPSE = 14, 25
HUGE = 2 << 20

def regions(text=False):
    for line in open("/proc/self/maps"):
        parts = line.split()
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        perms, path = parts[1], parts[5] if len(parts) > 5 else ""
        anon = path in ("", "[heap]")
        if (anon and perms.startswith("rw")) or (text and perms.startswith("r-x") and path):
            yield lo, hi, perms, path

def collapse(text=False):
    done = failed = 0
    t = time.perf_counter()
    for lo, hi, perms, path in regions(text):
        lo2 = (lo + HUGE - 1) & ~(HUGE - 1); hi2 = hi & ~(HUGE - 1)
        if hi2 - lo2 < HUGE:
            continue
        libc.madvise(lo2, hi2 - lo2, MADV_HUGEPAGE)
        if libc.madvise(lo2, hi2 - lo2, MADV_COLLAPSE) == 0:
            done += hi2 - lo2
        else:
            failed += hi2 - lo2
    ah = [l for l in open("/proc/self/smaps_rollup") if l.startswith(("AnonHugePages", "FilePmdMapped", "Rss"))]
    print(f"huge: collapsed {done>>20} MB, failed {failed>>20} MB in {time.perf_counter()-t:.2f}s; {' '.join(x.strip() for x in ah)}", file=sys.stderr)

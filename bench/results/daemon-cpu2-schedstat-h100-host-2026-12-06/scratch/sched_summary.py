"""Per engine process: its first steps' windows (request taken -> first chunk), and which threads ran or waited for a CPU in them."""
import collections, glob, json, statistics as st, sys
for path in sorted(glob.glob(sys.argv[1])):
    rows = [json.loads(l) for l in open(path)][1:]
    rows = [r for r in rows if r["window_ms"] < 15]  # cached prompts: a few tokens to prefill
    if not rows:
        continue
    w = [r["window_ms"] for r in rows]
    wait = [r["wait_ms"] for r in rows]
    print(path, len(rows), "window p50 %.2f mean %.2f" % (st.median(w), st.mean(w)),
          "own threads' wait p50 %.3f mean %.3f" % (st.median(wait), st.mean(wait)))
    cpu, waits = collections.defaultdict(list), collections.defaultdict(list)
    for r in rows:
        for k, (c, x) in r["threads"].items():
            cpu[k].append(c); waits[k].append(x)
    for k in sorted(cpu, key=lambda k: -len(cpu[k])):
        print("  %-18s in %3d windows: cpu sum %7.2f mean %.3f  waited sum %6.2f" % (k, len(cpu[k]), sum(cpu[k]), st.mean(cpu[k]), sum(waits[k])))

"""Scratch: medians of the daemon's own trace marks (ms) over the cached requests of runs, per side."""
import json, statistics as st, sys

for side in ("old", "new"):
    rows = []
    for i in range(1, 4):
        d = json.load(open(f"{side}{i}.json"))
        rows += [s for s in d["samples"] if s["side"] != "direct" and s.get("cached") and s.get("trace")]
    tr = [r["trace"] for r in rows]
    m = lambda xs: round(st.median(xs), 3)
    print(side, len(rows), "until_handler", m([t["until_handler"] for t in tr]), "until_engine", m([t["until_engine"] for t in tr]),
          "until_engine less until_handler", m([t["until_engine"] - t["until_handler"] for t in tr]),
          "first chunk to first events", m([t["until_first_events"] - t["until_engine"] - t["engine_first_chunk"] for t in tr]),
          "loop_cpu", m([t["loop_cpu"] for t in tr]))

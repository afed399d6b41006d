"""Scratch: per side, medians over the daemon's requests of the first chunk's hand-over (how long the
engine's worker waited for the loop to take its next chunk), run by run; the loop's CPU and the first
chunk to the first events' write (cached requests' traces). Run in this folder."""
import json, statistics as st

m = lambda xs: round(st.median(xs), 3)
for side in ("old", "new"):
    rows, direct, per = [], [], []
    for i in range(1, 5):
        d = json.load(open(f"{side}{i}.json"))
        mine = [s for s in d["samples"] if s["side"] != "direct" and s.get("engine_hand_over_ms") is not None]
        rows += mine
        direct += [s for s in d["samples"] if s["side"] == "direct" and s.get("engine_hand_over_ms") is not None]
        per.append(m([s["engine_hand_over_ms"] for s in mine]))
    tr = [r["trace"] for r in rows if r.get("cached") and r.get("trace")]
    print(side, "hand-over, daemon", m([s["engine_hand_over_ms"] for s in rows]), "run by run", per,
          "direct", m([s["engine_hand_over_ms"] for s in direct]), "loop_cpu", m([t["loop_cpu"] for t in tr]),
          "first chunk to first events", m([t["until_first_events"] - t["until_engine"] - t["engine_first_chunk"] for t in tr]))

"""Where a daemon request's decode time goes, step by step, against its direct pair.

Reads `lingcode bench daemon` reports made with step-times.patch applied (each sample's engine
step times: before and after each chunk's emit) and pools their pairs (a daemon request and the
direct request of the same input, cached-ness and client; those with the same step count).
For each pair, daemon minus direct (ms, medians over the pairs):
  hand-over      the first chunk's emit (on the CPU the engine waits there until its reader took it)
  step 1         the step after it (the client reads the first token meanwhile)
  wake step      the step after the loop's next wake-up (~100 ms in: one a drafted answer)
  other steps    all the other steps, summed
  decode         first emit to last emit
and the median ratio of each request's other steps' times, daemon over direct.

    python steps.py steps-*.json
"""

import json
import statistics as st
import sys
from collections import defaultdict

rows = defaultdict(lambda: defaultdict(list))
for path in sys.argv[1:]:
    samples = json.load(open(path))["samples"]
    direct = [s for s in samples if s["side"] == "direct"]
    daemon = [s for s in samples if s["side"] == "daemon"]
    for a, b in zip(direct, daemon):  # the report keeps each pair in order
        assert (a["workload"], a["input"], a["cached"]) == (b["workload"], b["input"], b["cached"])
        ta, tb = a["times"], b["times"]  # [(before emit, tokens, after emit)] a step
        if len(ta) != len(tb):
            continue
        steps = lambda t: [t[i][0] - t[i - 1][2] for i in range(1, len(t))]  # noqa: E731
        sa, sb = steps(ta), steps(tb)
        # the emit that woke the loop again (ChunkChannel: 100 ms after the first), and the step after it
        woken = next((i for i in range(1, len(tb) - 1) if tb[i][0] - tb[0][0] >= 0.1), None)
        wake = (sb[woken] - sa[woken]) if woken else 0.0
        r = rows[(b["speculation"], a["workload"], b["client"])]
        r["hand-over, direct"].append((ta[0][2] - ta[0][0]) * 1e3)
        r["hand-over, daemon"].append((tb[0][2] - tb[0][0]) * 1e3)
        r["hand-over"].append(((tb[0][2] - tb[0][0]) - (ta[0][2] - ta[0][0])) * 1e3)
        r["step 1"].append((sb[0] - sa[0]) * 1e3)
        r["wake step"].append(wake * 1e3)
        r["other steps"].append((sum(sb[1:]) - sum(sa[1:]) - wake) * 1e3)
        r["decode"].append(((tb[-1][0] - tb[0][0]) - (ta[-1][0] - ta[0][0])) * 1e3)
        others = [y / x for i, (x, y) in enumerate(zip(sa[1:], sb[1:]), 1) if i != woken]
        r["other steps' ratio"].append(st.median(others))
        r["direct decode"].append((ta[-1][0] - ta[0][0]) * 1e3)

keys = ["hand-over, direct", "hand-over, daemon", "hand-over", "step 1", "wake step", "other steps", "decode",
        "direct decode", "other steps' ratio"]
print("| drafts | workload | client | pairs | " + " | ".join(keys) + " |")
print("|---|---|---|---|" + "---|" * len(keys))
for (spec, workload, client), r in sorted(rows.items()):
    cells = [f"{st.median(r[k]):.3f}" for k in keys]
    print(f"| {spec} | {workload} | {client} | {len(r['decode'])} | " + " | ".join(cells) + " |")

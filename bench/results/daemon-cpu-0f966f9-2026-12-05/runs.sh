#!/usr/bin/env bash
# The runs of this folder, as they were made (from the repo's root, at 0f966f9), and their pools.
set -euo pipefail
D=bench/results/daemon-cpu-0f966f9-2026-12-05 O=bench/results/daemon-cpu-first-hand-over-2026-12-05
R=bench/results/daemon-cpu-stream-interval-2026-12-05 F=bench/results/daemon-cpu-5129584-2026-12-05
for r in 1 2 3; do
  .venv/bin/lingcode bench daemon --device cpu --requests 12 --max-tokens 128 --workload chat,stdlib \
    --speculation off,ngram --clients httpx,aiohttp --out $D/run-$r
done
.venv/bin/lingcode bench daemon --report $D/run-{1,2,3}.json --out /tmp/pool3 && cp /tmp/pool3.md $D/
.venv/bin/lingcode bench daemon --report $R/pool6-i100.json $R/default-{1,2}.json $O/own-task-old-{1,2,3}.json \
  $F/run-{1,2,3}.json $D/run-{1,2,3}.json --out /tmp/pool17 && cp /tmp/pool17.md $D/
# A long conversation (long.jsonl: 30 turns of five stdlib modules' source, then a question; 5,951
# tokens with SmolLM2's template), answered from the cache every round
.venv/bin/python - <<'PY'
import inspect, json, difflib, argparse, ftplib, calendar, tarfile
text = "\n".join(inspect.getsource(m) for m in (difflib, argparse, ftplib, calendar, tarfile))
msgs = [{"role": "system", "content": "You are a coding assistant."}]
for i in range(30):
    msgs.append({"role": "user" if i % 2 == 0 else "assistant", "content": text[i*700:(i+1)*700]})
msgs.append({"role": "user", "content": "Summarize what the code above does, briefly."})
open("bench/results/daemon-cpu-0f966f9-2026-12-05/long.jsonl", "w").write(json.dumps({"messages": msgs}) + "\n")
PY
for r in 1:8 2:16; do
  .venv/bin/lingcode bench daemon --device cpu --workload "" --prompts $D/long.jsonl --requests ${r#*:} \
    --max-tokens 64 --speculation off --clients httpx,aiohttp --out $D/long-${r%:*}
done

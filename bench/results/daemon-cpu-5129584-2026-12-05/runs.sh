#!/usr/bin/env bash
# The runs of this folder, as they were made (from the repo's root, at 5129584), and their pools.
set -euo pipefail
D=bench/results/daemon-cpu-5129584-2026-12-05 O=bench/results/daemon-cpu-first-hand-over-2026-12-05
R=bench/results/daemon-cpu-stream-interval-2026-12-05
for r in 1 2 3; do
  .venv/bin/lingcode bench daemon --device cpu --requests 12 --max-tokens 128 --workload chat,stdlib \
    --speculation off,ngram --clients httpx,aiohttp --out $D/run-$r
done
.venv/bin/lingcode bench daemon --report $D/run-{1,2,3}.json --out /tmp/pool3 && cp /tmp/pool3.md $D/
.venv/bin/lingcode bench daemon --report $R/pool6-i100.json $R/default-{1,2}.json $O/own-task-old-{1,2,3}.json \
  $D/run-{1,2,3}.json --out /tmp/pool14 && cp /tmp/pool14.md $D/

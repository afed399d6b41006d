#!/usr/bin/env bash
# The pooled reports of this folder, from its runs; pool11 also pools the eight runs of
# daemon-cpu-stream-interval-2026-12-05. The own-task-ngram-* runs carry step times: pool them with
# step-times.patch applied (its Sample reads them), STEP_TIMES=1.
set -euo pipefail
D=bench/results/daemon-cpu-first-hand-over-2026-12-05 R=bench/results/daemon-cpu-stream-interval-2026-12-05
for v in new old; do
  lingcode bench daemon --report $D/own-task-$v-{1,2,3}.json --out /tmp/pool-own-task-$v
  cp /tmp/pool-own-task-$v.md $D/
  if [ -n "${STEP_TIMES:-}" ]; then
    lingcode bench daemon --report $D/own-task-ngram-$v-{1,2,3}.json --out /tmp/pool-own-task-ngram-$v
    cp /tmp/pool-own-task-ngram-$v.md $D/
  fi
done
lingcode bench daemon --report $R/pool6-i100.json $R/default-{1,2}.json $D/own-task-old-{1,2,3}.json --out /tmp/pool11
cp /tmp/pool11.md $D/

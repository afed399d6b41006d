#!/usr/bin/env bash
# The runs of this folder, as they were made (from the repo's root, at aac3339).
#   steps-*:          step-times.patch applied; n-gram drafts, httpx, both workload orders
#   own-task-ngram-*: the same, alternating own-task.patch (new) and aac3339's server/serving.py (old)
#   own-task-*:       the committed configuration, alternating new and old, with the engine's
#                     hand_over_ms (the commit that added this folder) and no step times
set -euo pipefail
D=bench/results/daemon-cpu-first-hand-over-2026-12-05
bench() { .venv/bin/lingcode bench daemon --device cpu --requests 12 --max-tokens 128 "$@"; }
if [ "${1:-}" = steps ]; then  # with step-times.patch applied
  for r in 1 2; do for order in chat,stdlib stdlib,chat; do
    bench --workload $order --speculation ngram --clients httpx --out /tmp/steps-${order/,/-}-$r
  done; done
  for r in 1 2 3; do for v in new old; do
    git show aac3339:server/serving.py > server/serving.py; [ $v = new ] && git apply $D/own-task.patch
    bench --workload chat,stdlib --speculation ngram --clients httpx --out /tmp/own-task-ngram-$v-$r
  done; done
else
  for r in 1 2 3; do for v in new old; do
    git checkout server/serving.py; [ $v = new ] && git apply $D/own-task.patch
    bench --workload chat,stdlib --speculation off,ngram --clients httpx,aiohttp --out /tmp/own-task-$v-$r
  done; done
fi
git checkout server/serving.py

#!/usr/bin/env bash
# A/B in a worktree at 2cf5efe (new) with 469a594's lingcode/text files (old), alternating, new first.
set -euo pipefail
cd /tmp/s24/wt
export PYTHONPATH=/tmp/s24/wt
use() { git checkout -q $([ $1 = old ] && echo 469a594 || echo 2cf5efe) -- lingcode/text/chat_template.py lingcode/text/tokenizer.py; }
for r in 3 4; do for side in new old; do
  use $side
  /work/main/.venv/bin/python -m lingcode bench daemon --device cpu --workload "" --prompts /tmp/s24/long.jsonl --requests 12 --max-tokens 32 --speculation off --clients httpx,aiohttp --out /tmp/s24/ab-long-$side$r > /tmp/s24/ab-long-$side$r.log 2>&1
done; done
use new

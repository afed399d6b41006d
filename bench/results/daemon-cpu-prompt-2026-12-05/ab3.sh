#!/usr/bin/env bash
# Per-token A/B on the bench's own short inputs: worktree at 2cf5efe (new) against 469a594's text files (old), alternating.
set -euo pipefail
cd /tmp/s24/wt
export PYTHONPATH=/tmp/s24/wt
use() { git checkout -q $([ $1 = old ] && echo 469a594 || echo 2cf5efe) -- lingcode/text/chat_template.py lingcode/text/tokenizer.py; }
for r in 1 2; do for side in old new; do
  use $side
  /work/main/.venv/bin/python -m lingcode bench daemon --device cpu --requests 8 --max-tokens 128 --workload chat,stdlib --speculation off --clients httpx,aiohttp --out /tmp/s24/ab-short-$side$r > /tmp/s24/ab-short-$side$r.log 2>&1
  /work/main/.venv/bin/python -m lingcode bench daemon --device cpu --workload "" --prompts /tmp/s24/long.jsonl --requests 8 --max-tokens 96 --speculation off --clients httpx,aiohttp --out /tmp/s24/ab-long96-$side$r > /tmp/s24/ab-long96-$side$r.log 2>&1
done; done
use new

#!/usr/bin/env bash
# A/B: HEAD (old) against the working tree's two text files (new), alternating, long conversation then short.
set -euo pipefail
cd /work/main
L=bench/results/daemon-cpu-0f966f9-2026-12-05/long.jsonl
use() { if [ $1 = old ]; then git show HEAD:lingcode/text/chat_template.py > lingcode/text/chat_template.py; git show HEAD:lingcode/text/tokenizer.py > lingcode/text/tokenizer.py; else cp /tmp/s24/new/*.py lingcode/text/; fi; }
for r in 1 2; do for side in old new; do
  use $side
  .venv/bin/lingcode bench daemon --device cpu --workload "" --prompts $L --requests 12 --max-tokens 32 --speculation off --clients httpx,aiohttp --out /tmp/s24/ab-long-$side$r > /tmp/s24/ab-long-$side$r.log 2>&1
done; done
use new

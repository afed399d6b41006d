#!/bin/bash
# old (885af52) and new (working tree) in turns, this VM's 2 cores
ARGS="--device cpu --requests 8 --max-tokens 128 --workload chat,stdlib --prompts bench/results/daemon-h200-2026-12-02-inputs/prompts.jsonl --speculation off --clients httpx,aiohttp"
for i in 1 2; do
  (cd /tmp/s31/old && /tmp/s31/venv-old/bin/python -m lingcode bench daemon $ARGS --out /tmp/s31/bench/old$i > /tmp/s31/bench/old$i.log 2>&1)
  (cd /work/main && .venv/bin/python -m lingcode bench daemon $ARGS --out /tmp/s31/bench/new$i > /tmp/s31/bench/new$i.log 2>&1)
done
echo done > /tmp/s31/bench/finished

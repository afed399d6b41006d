#!/usr/bin/env bash
# scratch: bench daemon at HEAD on this VM, daemons one after another
cd /work/main
C=$(git rev-parse --short HEAD)
for i in "$@"; do
  echo "== run$i $C $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  timeout 500 .venv/bin/python -m lingcode bench daemon --device cpu --requests 8 --max-tokens 128 --workload chat,stdlib --prompts bench/results/daemon-h200-2026-12-02-inputs/prompts.jsonl --speculation off --clients httpx,aiohttp --out /tmp/s28/head/run$i > /tmp/s28/head/run$i.log 2>&1
  echo rc=$?; sed -n '/pooled/,$p' /tmp/s28/head/run$i.md | grep '^| off' | head -2
done

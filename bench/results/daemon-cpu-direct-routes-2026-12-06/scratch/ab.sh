#!/usr/bin/env bash
# scratch: bench daemon A/B on this VM, old (6923b1a server/serving.py, server/app.py) against new (HEAD), in turns
cd /work/main
N=$(git rev-parse --short HEAD)
for i in 1 2 3; do
  for side in old new; do
    if [ $side = old ]; then git checkout 6923b1a -- server/serving.py server/app.py; C=6923b1a; else git checkout HEAD -- server/serving.py server/app.py; C=$N; fi
    echo "== $side$i $(date -u +%T)"
    LINGCODE_COMMIT=$C timeout 400 .venv/bin/python -m lingcode bench daemon --device cpu --requests 8 --max-tokens 128 --workload chat --prompts bench/results/daemon-h200-2026-12-02-inputs/prompts.jsonl --speculation off --clients httpx,aiohttp --out /tmp/s27/runs/$side$i > /tmp/s27/runs/$side$i.log 2>&1
    echo rc=$?; sed -n '/pooled/,$p' /tmp/s27/runs/$side$i.md | grep '^| off' | head -2
  done
done
git checkout HEAD -- server/serving.py server/app.py
git status --short

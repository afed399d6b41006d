#!/usr/bin/env bash
# scratch: bench daemon A/B on this VM, old (bf1f039's server files) against new (HEAD), in turns
cd /work/main
for i in 1 2 3 4; do
  for side in old new; do
    if [ $side = old ]; then git checkout bf1f039 -- server/serving.py server/http11.py; C=bf1f039; else git checkout HEAD -- server/serving.py server/http11.py; C=00e0291; fi
    echo "== $side$i $(date -u +%T)"
    LINGCODE_COMMIT=$C timeout 400 .venv/bin/python -m lingcode bench daemon --device cpu --requests 8 --max-tokens 128 --workload chat,stdlib --speculation off --clients httpx,aiohttp --out /tmp/s26/runs/$side$i > /tmp/s26/runs/$side$i.log 2>&1
    echo rc=$?; sed -n '/pooled/,$p' /tmp/s26/runs/$side$i.md | grep '^| off' | head -2
  done
done
git checkout HEAD -- server/serving.py server/http11.py
git status --short

#!/usr/bin/env bash
# scratch: bench daemon A/B on this VM, old (b1ecc24 serving.py) against new (HEAD), in turns
cd /work/main
for i in 1 2 3 4; do
  for side in old new; do
    if [ $side = old ]; then git checkout b1ecc24 -- server/serving.py; C=b1ecc24; else git checkout HEAD -- server/serving.py; C=9100a33; fi
    echo "== $side$i $(date -u +%T)"
    LINGCODE_COMMIT=$C timeout 400 .venv/bin/python -m lingcode bench daemon --device cpu --requests 8 --max-tokens 128 --workload chat,stdlib --speculation off --clients httpx,aiohttp --out /tmp/s26/runs2/$side$i > /tmp/s26/runs2/$side$i.log 2>&1
    echo rc=$?; sed -n '/pooled/,$p' /tmp/s26/runs2/$side$i.md | grep '^| off' | head -2
  done
done
git checkout HEAD -- server/serving.py
git status --short

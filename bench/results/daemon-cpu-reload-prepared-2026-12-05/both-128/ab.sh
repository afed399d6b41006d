#!/bin/bash
cd /work/main
for v in "$@"; do
  r=0; [ "${v%%[0-9]*}" = reload ] && r=1
  echo "== $v $(date -u +%T)"
  SCRATCH_RELOAD=$r timeout 900 .venv/bin/lingcode bench daemon --device cpu --workload chat,stdlib --requests 12 --max-tokens 128 --speculation off,ngram --clients httpx,aiohttp --out /tmp/rl2/$v > /tmp/rl2/$v.log 2>&1; echo rc=$?
  sed -n '/pooled/,$p' /tmp/rl2/$v.md | grep '^|' | head -5
done

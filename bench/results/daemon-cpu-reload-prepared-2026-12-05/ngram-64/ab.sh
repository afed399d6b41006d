#!/bin/bash
cd /work/main
for v in "$@"; do
  r=0; [ "${v%%[0-9]*}" = reload ] && r=1
  echo "== $v $(date -u +%T)"
  SCRATCH_RELOAD=$r timeout 900 .venv/bin/lingcode bench daemon --device cpu --workload chat,stdlib --requests 12 --max-tokens 64 --speculation ngram --clients httpx,aiohttp --out /tmp/rlg/$v > /tmp/rlg/$v.log 2>&1; echo rc=$?
  sed -n '/pooled/,$p' /tmp/rlg/$v.md | grep '^|' | head -5
done

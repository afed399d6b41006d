#!/bin/bash
# the committed default (no LINGCODE_STREAM_INTERVAL_MS), at HEAD
cd /work/main
for v in "$@"; do
  echo "== $v $(date -u +%T)"
  timeout 1200 .venv/bin/lingcode bench daemon --device cpu --workload chat,stdlib --requests 12 \
    --max-tokens 128 --speculation off,ngram --clients httpx,aiohttp --out /tmp/iv/$v > /tmp/iv/$v.log 2>&1; echo rc=$?
  sed -n '/All workloads pooled/,$p' /tmp/iv/$v.md | grep '^| [on]' | head -4
done

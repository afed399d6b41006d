#!/usr/bin/env bash
# CPU A/B: new (working tree) vs old (.ab/held) ; args: variants in order
cd /work/main
for v in "$@"; do
  dir=/work/main; c=${NEWC:-217faf7}; [ "${v%%[0-9]*}" = old ] && dir=/work/main/.ab/held && c=d00cec7
  echo "== $v $(date -u +%T)"
  (cd $dir && LINGCODE_COMMIT=$c timeout 900 /work/main/.venv/bin/python -m lingcode bench daemon --device cpu --workload chat,stdlib \
     --prompts /work/main/.ab/prompts.jsonl --requests 16 --max-tokens 128 --speculation off,ngram --clients httpx,aiohttp \
     --out /tmp/cpuab/$v > /tmp/cpuab/$v.log 2>&1; echo rc=$?)
  sed -n '/pooled/,$p' /tmp/cpuab/$v.md | grep '^|' | head -8
done

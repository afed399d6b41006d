#!/bin/bash
# Alternating runs with the scratch switch off (base*) and on (reload*), reload.patch applied.
# The three sets: SPEC=off TOKENS=64 (this folder), SPEC=ngram TOKENS=64 (ngram-64/),
# SPEC=off,ngram TOKENS=128 (both-128/).  e.g. OUT=/tmp/rl bash ab.sh base1 reload1 base2 reload2
cd /work/main
out=${OUT:-/tmp/rl}; mkdir -p $out
for v in "$@"; do
  r=0; [ "${v%%[0-9]*}" = reload ] && r=1
  echo "== $v $(date -u +%T)"
  SCRATCH_RELOAD=$r timeout 900 .venv/bin/lingcode bench daemon --device cpu --workload chat,stdlib --requests 12 \
    --max-tokens ${TOKENS:-64} --speculation ${SPEC:-off} --clients httpx,aiohttp --out $out/$v > $out/$v.log 2>&1; echo rc=$?
  sed -n '/pooled/,$p' $out/$v.md | grep '^|' | head -5
done

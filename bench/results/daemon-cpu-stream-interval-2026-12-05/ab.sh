#!/bin/bash
# Alternating `lingcode bench daemon` runs: the CPU stream interval at 50 ms (i50*) and 100 ms (i100*),
# set by LINGCODE_STREAM_INTERVAL_MS for both the daemon and the direct engine.
cd /work/main
out=${OUT:-/tmp/iv}; mkdir -p $out
for v in "$@"; do
  ms=${v%%-*}; ms=${ms#i}
  echo "== $v $(date -u +%T)"
  LINGCODE_STREAM_INTERVAL_MS=$ms timeout 1200 .venv/bin/lingcode bench daemon --device cpu --workload chat,stdlib --requests 12 \
    --max-tokens ${TOKENS:-128} --speculation ${SPEC:-off,ngram} --clients httpx,aiohttp --out $out/$v > $out/$v.log 2>&1; echo rc=$?
  sed -n '/pooled/,$p' $out/$v.md | grep '^|' | head -6
done

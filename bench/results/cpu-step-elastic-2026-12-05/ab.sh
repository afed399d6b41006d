#!/bin/bash
# Alternating `lingcode bench daemon` runs, elastic.patch applied, its scratch switch on (on*) and
# off (off*: LC_ELASTIC=0, the barrier step as at dc05644) for both the daemon and the direct engine.
# e.g. OUT=/tmp/el bash ab.sh on1 off1 off2 on2
cd /work/main
out=${OUT:-/tmp/el}; mkdir -p $out
for v in "$@"; do
  e=1; [ "${v%%[0-9]*}" = off ] && e=0
  echo "== $v $(date -u +%T)"
  LC_ELASTIC=$e timeout 1200 .venv/bin/lingcode bench daemon --device cpu --workload chat,stdlib --requests 12 \
    --max-tokens ${TOKENS:-128} --speculation ${SPEC:-off,ngram} --clients httpx,aiohttp --out $out/$v > $out/$v.log 2>&1; echo rc=$?
  sed -n '/pooled/,$p' $out/$v.md | grep '^|' | head -6
done

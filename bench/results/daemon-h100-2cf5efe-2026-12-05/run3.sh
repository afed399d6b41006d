#!/usr/bin/env bash
# scratch: A/B on the lent card, old (.ab/old: the text files at $CO) against new (the tree at $CN), alternating
set -uo pipefail
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 LINGCODE_HOME=/tmp/lingcode-home LINGCODE_MODEL=/tmp/m/model.gguf
[ -s /tmp/m/model.gguf ] || cat /tmp/m/gguf.aa .h200/gguf.ab > /tmp/m/model.gguf
sha256sum /tmp/m/model.gguf | cut -c1-16
mkdir -p $LINGCODE_HOME/cache/models && ln -sf $LINGCODE_MODEL $LINGCODE_HOME/cache/models/SmolLM2-135M-Instruct.Q4_1.gguf
for d in server lsp tui; do ln -sfn ../$d lingcode/$d; done
mkdir -p /tmp/new && cp -n lingcode/text/chat_template.py lingcode/text/tokenizer.py /tmp/new/
use() { if [ $1 = old ]; then cp .ab/old/*.py lingcode/text/; C=$CO; else cp /tmp/new/*.py lingcode/text/; C=$CN; fi; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; uname -r
for step in "$@"; do
  side=${step%%-*}; what=${step#*-}; use $side
  echo "== $step $C $(date -u +%T)"
  case $what in
    lp*) LINGCODE_COMMIT=$C timeout 240 python3 -m lingcode bench daemon --device cuda --workload "" --prompts .ab/long.jsonl --requests 12 --max-tokens 64 --speculation off --clients httpx,aiohttp --out $OUT/$step > $OUT/$step.log 2>&1; echo rc=$?; sed -n "/pooled/,\$p" $OUT/$step.md | grep "^|" | head -4;;
    hp*) LINGCODE_COMMIT=$C timeout 200 python3 -m lingcode bench daemon --device cuda --workload chat,stdlib --prompts .ab/prompts.jsonl --requests 8 --max-tokens 256 --speculation off --clients httpx,aiohttp --out $OUT/$step > $OUT/$step.log 2>&1; echo rc=$?; sed -n '/pooled/,$p' $OUT/$step.md | grep '^|' | head -4;;
    h*) LINGCODE_COMMIT=$C timeout 320 python3 -m lingcode bench daemon --device cuda --workload chat,stdlib --prompts .ab/prompts.jsonl --requests 8 --max-tokens 512 --speculation off,ngram --clients httpx,aiohttp --out $OUT/$step > $OUT/$step.log 2>&1; echo rc=$?; sed -n '/pooled/,$p' $OUT/$step.md | grep '^|' | head -8;;
    tests) timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py 2>&1 | tail -8 | tee $OUT/gpu-tests.txt;;
  esac
done
use new

#!/usr/bin/env bash
# scratch: the H200 at HEAD: first requests (new vs b32f190 in .ab/held), then bench daemon runs
set -uo pipefail
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 LINGCODE_HOME=/tmp/lingcode-home LINGCODE_MODEL=/tmp/m/model.gguf
[ -s /tmp/m/model.gguf ] || cat /tmp/m/gguf.aa .h200/gguf.ab > /tmp/m/model.gguf
sha256sum /tmp/m/model.gguf | cut -c1-16
mkdir -p $LINGCODE_HOME/cache/models && ln -sf $LINGCODE_MODEL $LINGCODE_HOME/cache/models/SmolLM2-135M-Instruct.Q4_1.gguf
for d in server lsp tui; do ln -sfn ../$d lingcode/$d; ln -sfn ../$d .ab/held/lingcode/$d; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; uname -r
for step in "$@"; do
  echo "== $step $(date -u +%T)"
  case $step in
    first) timeout 230 python3 .ab/first_requests.py --tree new=$PWD --tree old=$PWD/.ab/held --starts 3 --device cuda \
             --placements 1 --model /tmp/m/model.gguf --out $OUT/first.json > $OUT/first.txt 2>&1; echo rc=$?; tail -12 $OUT/first.txt;;
    h*) LINGCODE_COMMIT=${C:-dc05644} timeout 320 python3 -m lingcode bench daemon --device cuda --workload chat,stdlib \
             --prompts .ab/prompts.jsonl --requests 8 --max-tokens 512 --speculation off,ngram --clients httpx,aiohttp \
             --out $OUT/$step > $OUT/$step.log 2>&1; echo rc=$?; tail -3 $OUT/$step.log; sed -n '/pooled/,$p' $OUT/$step.md | grep '^|' | head -8;;
    tests) timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py 2>&1 | tail -8 | tee $OUT/gpu-tests.txt;;
  esac
done

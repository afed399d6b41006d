#!/usr/bin/env bash
# scratch: bench daemon runs (and GPU tests) on the lent card, from the repo root with bench/results moved aside;
# .ab/ held prompts.jsonl (the 2026-12-02 inputs) and long.jsonl (../daemon-cpu-0f966f9-2026-12-05/long.jsonl)
set -uo pipefail
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 LINGCODE_HOME=/tmp/lingcode-home LINGCODE_MODEL=/tmp/m/model.gguf
[ -s /tmp/m/model.gguf ] || cat /tmp/m/gguf.aa .h200/gguf.ab > /tmp/m/model.gguf
sha256sum /tmp/m/model.gguf | cut -c1-16
mkdir -p $LINGCODE_HOME/cache/models && ln -sf $LINGCODE_MODEL $LINGCODE_HOME/cache/models/SmolLM2-135M-Instruct.Q4_1.gguf
for d in server lsp tui; do ln -sfn ../$d lingcode/$d; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; uname -r
for step in "$@"; do
  echo "== $step $(date -u +%T)"
  case $step in
    h*) LINGCODE_COMMIT=${C:-HEAD} timeout 320 python3 -m lingcode bench daemon --device cuda --workload chat,stdlib \
             --prompts .ab/prompts.jsonl --requests 8 --max-tokens 512 --speculation off,ngram --clients httpx,aiohttp \
             --out $OUT/$step > $OUT/$step.log 2>&1; echo rc=$?; tail -3 $OUT/$step.log; sed -n '/pooled/,$p' $OUT/$step.md | grep '^|' | head -8;;
    sg) LINGCODE_COMMIT=${C:-HEAD} timeout 150 python3 -m lingcode bench daemon --engine sglang --workload chat,stdlib \
             --prompts .ab/prompts.jsonl --requests 5 --max-tokens 512 --clients httpx,aiohttp \
             --out $OUT/$step > $OUT/$step.log 2>&1; echo rc=$?; tail -3 $OUT/$step.log; sed -n '/pooled/,$p' $OUT/$step.md | grep '^|' | head -8;;
    long) LINGCODE_COMMIT=${C:-HEAD} timeout 300 python3 -m lingcode bench daemon --device cuda --workload "" --prompts .ab/long.jsonl --requests 16 --max-tokens 256 --speculation off,ngram --clients httpx,aiohttp --out $OUT/$step > $OUT/$step.log 2>&1; echo rc=$?; tail -3 $OUT/$step.log; sed -n "/pooled/,\$p" $OUT/$step.md | grep "^|" | head -8;;
    tests) timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py 2>&1 | tail -8 | tee $OUT/gpu-tests.txt;;
  esac
done

#!/usr/bin/env bash
# scratch: the surrogate scan, one alternation (old: 671d2a0's server/validation.py) or two literal-led patterns (new: 7c7bdba)
set -uo pipefail
cd /work/main
run() { LINGCODE_COMMIT=$2 .venv/bin/lingcode bench daemon --device cpu --workload "" --prompts bench/results/daemon-cpu-0f966f9-2026-12-05/long.jsonl \
  --requests 12 --max-tokens 32 --speculation off --clients httpx,aiohttp --out bench/results/daemon-cpu-surrogate-scan-2026-12-05/$1 ; }
old() { git show 671d2a0:server/validation.py > server/validation.py; }
new() { git checkout -q server/validation.py; }
new; run new1 7c7bdba
old; run old1 671d2a0; new
run new2 7c7bdba
old; run old2 671d2a0; new
git status --short
echo done > bench/results/daemon-cpu-surrogate-scan-2026-12-05/done

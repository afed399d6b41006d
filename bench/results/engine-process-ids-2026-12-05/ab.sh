#!/usr/bin/env bash
# scratch: the ids to the engine's process, whole (old: HEAD) or past the shared prefix (new: the working tree)
set -uo pipefail
cd /work/main
run() { LINGCODE_COMMIT=$2 .venv/bin/lingcode bench daemon --device cpu --workload "" --prompts bench/results/daemon-cpu-0f966f9-2026-12-05/long.jsonl \
  --requests 10 --max-tokens 32 --speculation off --clients httpx,aiohttp --serve-env LINGCODE_ENGINE_PROCESS=1 --out bench/results/engine-process-ids-2026-12-05/ab-$1 > bench/results/engine-process-ids-2026-12-05/ab-$1.log 2>&1; }
run new1 7b8648c+delta
git stash -q; run old1 7b8648c; git stash pop -q
run new2 7b8648c+delta
git stash -q; run old2 7b8648c; git stash pop -q
echo done > bench/results/engine-process-ids-2026-12-05/ab-done

#!/usr/bin/env bash
# The engine's process on 2 CPU cores: 4f12b57's process.py (old) against the one-send version (new), in turns.
set -euo pipefail
cd /work/main
use() { if [ $1 = old ]; then git show 4f12b57:lingcode/engine/local/process.py > lingcode/engine/local/process.py; else cp the one-send process.py (b8383ad, saved aside) lingcode/engine/local/process.py; fi; }
for r in 1 2; do for side in old new; do
  use $side
  .venv/bin/lingcode bench daemon --device cpu --requests 10 --max-tokens 16 --workload chat,stdlib --speculation off --clients httpx,aiohttp --serve-env LINGCODE_ENGINE_PROCESS=1 --out /tmp/s24/send-$side$r > /tmp/s24/send-$side$r.log 2>&1
done; done
use new

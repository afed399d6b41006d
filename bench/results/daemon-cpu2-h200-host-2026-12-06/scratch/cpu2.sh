# bench daemon runs on the device host, pinned to two CPUs: `bash cpu2.sh 1 2`, `bash cpu2.sh 3 4`,
# `EXTRA="--serve-env LINGCODE_SWITCH_INTERVAL_MS=5" bash cpu2.sh 5; bash cpu2.sh 6`.
# Before them: the wheels (lingcode's built at 555fbbb and the daemon's packages) installed into
# /tmp/site, the native step built under LINGCODE_HOME=/tmp/lh, and, from the repo root,
# `taskset -c 2,3 python3 .dev/touch.py` (the Intel VM folder's scratch/touch.py).
export PYTHONPATH=/tmp/site LINGCODE_HOME=/tmp/lh
mkdir -p /tmp/lh/cache/models
[ -f /tmp/lh/cache/models/SmolLM2-135M-Instruct.Q4_1.gguf ] || cat /tmp/m/gguf.aa $PWD/.dev/gguf.ab > /tmp/lh/cache/models/SmolLM2-135M-Instruct.Q4_1.gguf
R=$PWD; mkdir -p /tmp/w && cd /tmp/w  # not the repo root: there `lingcode` would be the tree's, without lingcode.server
mkdir -p bench/results/daemon-h200-2026-12-02-inputs && cp /tmp/m/prompts.jsonl bench/results/daemon-h200-2026-12-02-inputs/
for i in "$@"; do
  echo "== d$i $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  LINGCODE_COMMIT=555fbbb timeout 280 taskset -c 2,3 python3 -m lingcode bench daemon --device cpu --requests 8 --max-tokens 128 --workload chat,stdlib --prompts bench/results/daemon-h200-2026-12-02-inputs/prompts.jsonl --speculation off --clients httpx,aiohttp $EXTRA --out $OUT/d$i > $OUT/d$i.log 2>&1
  echo rc=$?; grep -A3 '^| speculation | client | pairs' $OUT/d$i.md | grep '^| off'; grep "^| off" $OUT/d$i.md | head -6 | cut -d'|' -f3,4,6,7,13,14,15,17,20
done

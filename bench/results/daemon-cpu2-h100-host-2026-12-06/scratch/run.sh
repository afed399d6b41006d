# call 2: the model whole; the engine alone after idle gaps, then three bench daemon runs, all pinned to CPUs 2 and 3
export PYTHONPATH=/tmp/site LINGCODE_HOME=/tmp/lh
mkdir -p /tmp/lh/cache/models
[ -f /tmp/lh/cache/models/SmolLM2-135M-Instruct.Q4_1.gguf ] || cat /tmp/m/gguf.aa $PWD/.dev/gguf.ab $PWD/.dev/gguf.ac > /tmp/lh/cache/models/SmolLM2-135M-Instruct.Q4_1.gguf
R=$PWD; mkdir -p /tmp/w && cd /tmp/w
mkdir -p bench/results/daemon-h200-2026-12-02-inputs && cp /tmp/m/prompts.jsonl bench/results/daemon-h200-2026-12-02-inputs/
echo "== idle $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
timeout 120 taskset -c 2,3 python3 /tmp/m/idle.py 2>&1 | grep -v Warning | tail -9 | tee $OUT/idle.txt
for i in 1 2 3; do
  echo "== d$i $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  LINGCODE_COMMIT=$(cat $R/.dev/commit) timeout 170 taskset -c 2,3 python3 -m lingcode bench daemon --device cpu --requests 8 --max-tokens 128 --workload chat,stdlib --prompts bench/results/daemon-h200-2026-12-02-inputs/prompts.jsonl --speculation off --clients httpx,aiohttp --out $OUT/d$i > $OUT/d$i.log 2>&1
  echo rc=$?; grep -A3 '^| speculation | client | pairs' $OUT/d$i.md | grep '^| off'; grep "^| off" $OUT/d$i.md | head -6 | cut -d'|' -f3,4,6,7,13,14,15,17,20
done

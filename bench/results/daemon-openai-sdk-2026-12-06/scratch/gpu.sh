# call 2: the model whole; bench daemon on the GPU with httpx, aiohttp and the openai SDK
export PYTHONPATH=/tmp/site LINGCODE_HOME=/tmp/lh
mkdir -p /tmp/lh/cache/models
[ -f /tmp/lh/cache/models/SmolLM2-135M-Instruct.Q4_1.gguf ] || cat /tmp/m/gguf.aa $PWD/.dev/gguf.ab $PWD/.dev/gguf.ac $PWD/.dev/gguf.ad > /tmp/lh/cache/models/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p /tmp/w && cd /tmp/w
mkdir -p bench/results/daemon-h200-2026-12-02-inputs && cp /tmp/m/prompts.jsonl bench/results/daemon-h200-2026-12-02-inputs/
for run in $1; do
  echo "== $run $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  LINGCODE_COMMIT=fab694d timeout $2 python3 -m lingcode bench daemon --device cuda --workload chat,stdlib --prompts bench/results/daemon-h200-2026-12-02-inputs/prompts.jsonl --requests 8 --max-tokens 512 --speculation off --clients httpx,aiohttp,openai --out $OUT/$run > $OUT/$run.log 2>&1
  echo rc=$? $(date -u +%T); grep -A5 '^| speculation | client | pairs' $OUT/$run.md | grep '^| off'
done

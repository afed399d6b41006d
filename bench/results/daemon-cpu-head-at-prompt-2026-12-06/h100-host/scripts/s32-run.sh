# call 2: the model whole, then bench daemon new and old in turns; usage: s32-run.sh "cpu-new1 cpu-old1 ..."
export LINGCODE_HOME=/tmp/lh
mkdir -p /tmp/lh/cache/models
[ -f /tmp/lh/cache/models/SmolLM2-135M-Instruct.Q4_1.gguf ] || cat /tmp/m/m.aa $PWD/.dev/m.ab $PWD/.dev/m.ac > /tmp/lh/cache/models/SmolLM2-135M-Instruct.Q4_1.gguf
ls -la /tmp/lh/cache/models/; md5sum /tmp/lh/cache/models/*.gguf
mkdir -p /tmp/w && cd /tmp/w
mkdir -p bench/results/daemon-h200-2026-12-02-inputs && cp /tmp/m/prompts.jsonl bench/results/daemon-h200-2026-12-02-inputs/
P=bench/results/daemon-h200-2026-12-02-inputs/prompts.jsonl
S=$(date +%s)
for run in $1; do
  [ $(( $(date +%s) - S )) -gt ${BUDGET:-380} ] && { echo "out of time before $run"; break; }
  case $run in *new*) export PYTHONPATH=/tmp/lc-new:/tmp/site C=d161432;; *) export PYTHONPATH=/tmp/lc-old:/tmp/site C=885af52;; esac
  echo "== $run $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  case $run in
    gpu*) LINGCODE_COMMIT=$C timeout 200 python3 -m lingcode bench daemon --device cuda --workload chat,stdlib --prompts $P --requests 8 --max-tokens 512 --speculation off --clients httpx,aiohttp --out $OUT/$run > $OUT/$run.log 2>&1 ;;
    cpu*) LINGCODE_COMMIT=$C timeout 190 taskset -c 2,3 python3 -m lingcode bench daemon --device cpu --requests 8 --max-tokens 128 --workload chat,stdlib --prompts $P --speculation off --clients httpx,aiohttp --out $OUT/$run > $OUT/$run.log 2>&1 ;;
  esac
  echo rc=$? $(date -u +%T); grep -A3 '^| speculation | client | pairs' $OUT/$run.md | grep '^| off'
done

# calls 2 and 3: bench daemon pinned to CPUs 2 and 3, the helper woken when a request reaches its handler (nudge) and not (off), in turns
# usage: ab.sh "nudge1 off1"
export LINGCODE_HOME=/tmp/lh
mkdir -p /tmp/lh/cache/models
[ -f /tmp/lh/cache/models/SmolLM2-135M-Instruct.Q4_1.gguf ] || cat /tmp/m/gguf.aa $PWD/.dev/gguf.ab $PWD/.dev/gguf.ac > /tmp/lh/cache/models/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -d /tmp/site2 ]; then
  cp -r /tmp/site /tmp/site2
  sed -i '/        self.expect()  # the engine/d' /tmp/site2/lingcode/server/serving.py
fi
grep -c "self.expect()" /tmp/site/lingcode/server/serving.py /tmp/site2/lingcode/server/serving.py
mkdir -p /tmp/w && cd /tmp/w
mkdir -p bench/results/daemon-h200-2026-12-02-inputs && cp /tmp/m/prompts.jsonl bench/results/daemon-h200-2026-12-02-inputs/
for run in $1; do
  case $run in nudge*) S=/tmp/site;; *) S=/tmp/site2;; esac
  echo "== $run $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  PYTHONPATH=$S LINGCODE_COMMIT="60c4858+${run%[0-9]}" timeout 285 taskset -c 2,3 python3 -m lingcode bench daemon --device cpu --requests 8 --max-tokens 128 --workload chat,stdlib --prompts bench/results/daemon-h200-2026-12-02-inputs/prompts.jsonl --speculation off --clients httpx,aiohttp --out $OUT/$run > $OUT/$run.log 2>&1
  echo rc=$? $(date -u +%T); grep -A3 '^| speculation | client | pairs' $OUT/$run.md | grep '^| off'; grep "^| off" $OUT/$run.md | head -6 | cut -d'|' -f3,4,6,7,13,14,15,17,20
done

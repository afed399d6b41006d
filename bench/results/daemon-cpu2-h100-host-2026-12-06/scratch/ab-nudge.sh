# call 2: bench daemon pinned to CPUs 2 and 3, the helper woken when a request reaches its handler (nudge) and not (off), in turns
export LINGCODE_HOME=/tmp/lh
mkdir -p /tmp/lh/cache/models
[ -f /tmp/lh/cache/models/SmolLM2-135M-Instruct.Q4_1.gguf ] || cat /tmp/m/gguf.aa $PWD/.dev/gguf.ab $PWD/.dev/gguf.ac > /tmp/lh/cache/models/SmolLM2-135M-Instruct.Q4_1.gguf
rm -rf /tmp/site2 && cp -r /tmp/site /tmp/site2
sed -i '/        self.expect()  # the engine/d' /tmp/site2/lingcode/server/serving.py
grep -c "self.expect()" /tmp/site/lingcode/server/serving.py /tmp/site2/lingcode/server/serving.py
mkdir -p /tmp/w && cd /tmp/w
mkdir -p bench/results/daemon-h200-2026-12-02-inputs && cp /tmp/m/prompts.jsonl bench/results/daemon-h200-2026-12-02-inputs/
for r in 1 2; do
  for v in nudge off; do
    if [ $v = nudge ]; then S=/tmp/site; else S=/tmp/site2; fi
    echo "== $v$r $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
    PYTHONPATH=$S LINGCODE_COMMIT="f7f72ec+$v" timeout 140 taskset -c 2,3 python3 -m lingcode bench daemon --device cpu --requests 6 --max-tokens 128 --workload chat,stdlib --prompts bench/results/daemon-h200-2026-12-02-inputs/prompts.jsonl --speculation off --clients httpx,aiohttp --out $OUT/$v$r > $OUT/$v$r.log 2>&1
    echo rc=$?; grep -A3 '^| speculation | client | pairs' $OUT/$v$r.md | grep '^| off'; grep "^| off" $OUT/$v$r.md | head -6 | cut -d'|' -f3,4,13,14,15,17
  done
done
rm -f $OUT/*.log

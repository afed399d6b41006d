# call 3: the model whole; one bench daemon run pinned to CPUs 2 and 3 with the scratch schedstat marks, then their summary
export PYTHONPATH=/tmp/site LINGCODE_HOME=/tmp/lh
mkdir -p /tmp/lh/cache/models
[ -f /tmp/lh/cache/models/SmolLM2-135M-Instruct.Q4_1.gguf ] || cat /tmp/m/gguf.aa /tmp/m/gguf.ab /tmp/m/gguf.ac $PWD/.dev/gguf.ad > /tmp/lh/cache/models/SmolLM2-135M-Instruct.Q4_1.gguf
R=$PWD; mkdir -p /tmp/w && cd /tmp/w
mkdir -p bench/results/daemon-h200-2026-12-02-inputs && cp /tmp/m/prompts.jsonl bench/results/daemon-h200-2026-12-02-inputs/
rm -f /tmp/sched-*.jsonl
echo "== s1 $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
LINGCODE_COMMIT="e957f42+schedstat" timeout 300 taskset -c 2,3 python3 -m lingcode bench daemon --device cpu --requests 8 --max-tokens 128 --workload chat,stdlib --prompts bench/results/daemon-h200-2026-12-02-inputs/prompts.jsonl --speculation off --clients httpx,aiohttp --out $OUT/s1 > $OUT/s1.log 2>&1
echo rc=$? $(date -u +%T); grep -A3 '^| speculation | client | pairs' $OUT/s1.md | grep '^| off'; grep "^| off" $OUT/s1.md | head -6 | cut -d'|' -f3,4,6,7,13,14,15,17,19
python3 $R/.dev/sched_summary.py "/tmp/sched-*.jsonl"
tar czf $OUT/sched.tgz -C /tmp $(cd /tmp && ls sched-*.jsonl)

# call 2: the engine alone after idle gaps, pinned to CPUs 2 and 3: the helper's idle spin as it is (660 us) and 5 ms, in turns
export LINGCODE_HOME=/tmp/lh
mkdir -p /tmp/lh/cache/models
[ -f /tmp/lh/cache/models/SmolLM2-135M-Instruct.Q4_1.gguf ] || cat /tmp/m/gguf.aa $PWD/.dev/gguf.ab $PWD/.dev/gguf.ac > /tmp/lh/cache/models/SmolLM2-135M-Instruct.Q4_1.gguf
rm -rf /tmp/site2 && cp -r /tmp/site /tmp/site2
sed -i "s/thread_local Spin idle_spin{660'000, 660'000};/thread_local Spin idle_spin{5'000'000, 5'000'000};/" /tmp/site2/lingcode/engine/local/cpu_step.cpp
grep -c "idle_spin{5'000'000" /tmp/site2/lingcode/engine/local/cpu_step.cpp
mkdir -p /tmp/lh2/cache && ln -sfn /tmp/lh/cache/models /tmp/lh2/cache/models
mkdir -p /tmp/w && cd /tmp/w
PYTHONPATH=/tmp/site2 LINGCODE_HOME=/tmp/lh2 timeout 300 python3 -c 'from lingcode.engine.local import cpu_native; cpu_native.main()' 2>&1 | tail -1
for r in 1 2; do
  for v in 660us 5ms; do
    if [ $v = 660us ]; then S=/tmp/site H=/tmp/lh; else S=/tmp/site2 H=/tmp/lh2; fi
    echo "== $r idle spin $v $(date -u +%T)"
    PYTHONPATH=$S LINGCODE_HOME=$H timeout 100 taskset -c 2,3 python3 /tmp/m/idle.py 2>&1 | grep "^gap" | tee -a $OUT/spin-$v.txt
  done
done

#!/bin/bash
# A/B: old kernels (git HEAD's cpu_step.cpp) vs NTA prefetch, each a fresh daemon, in turns
cd /work/main
for round in 1 2; do
for v in old nta; do
  if [ $v = old ]; then git show HEAD:lingcode/engine/local/cpu_step.cpp > lingcode/engine/local/cpu_step.cpp; else cp /tmp/s29/cpu_step_nta.cpp lingcode/engine/local/cpu_step.cpp; fi
  pkill -f "lingcode serve --port 0 --device cpu"; sleep 2; rm -f /tmp/s29/home/state/daemon.json
  (LINGCODE_HOME=/tmp/s29/home nohup .venv/bin/python -m lingcode serve --port 0 --device cpu > /tmp/s29/serve.log 2>&1 &)
  while [ ! -f /tmp/s29/home/state/daemon.json ]; do sleep 1; done; sleep 2
  .venv/bin/python /tmp/s29/marks.py /tmp/s29/home 20 0.01 4 > /dev/null
  echo "$round $v short: $(.venv/bin/python /tmp/s29/marks.py /tmp/s29/home 150 0.01 4)"
  echo "$round $v long : $(.venv/bin/python /tmp/s29/marks.py /tmp/s29/home 30 0.01 64)"
done; done
pkill -f "lingcode serve --port 0 --device cpu"
cp /tmp/s29/cpu_step_nta.cpp lingcode/engine/local/cpu_step.cpp

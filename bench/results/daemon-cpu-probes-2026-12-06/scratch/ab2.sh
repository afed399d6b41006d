#!/bin/bash
# /tmp/s29/marks.py was marks.py here (ab.sh: with marks.patch applied; ab2.sh: the same less its engine.py part, plus x8/x9 marks around the hand-off to the worker)
cd /work/main
for round in 1 2 3; do
for v in old new; do
  cp /tmp/s29/engine_${v}_marked.py lingcode/engine/local/engine.py
  pkill -f "lingcode serve --port 0 --device cpu"; sleep 2; rm -f /tmp/s29/home/state/daemon.json
  (LINGCODE_HOME=/tmp/s29/home nohup .venv/bin/python -m lingcode serve --port 0 --device cpu > /tmp/s29/serve.log 2>&1 &)
  while [ ! -f /tmp/s29/home/state/daemon.json ]; do sleep 1; done; sleep 2
  .venv/bin/python /tmp/s29/marks.py /tmp/s29/home 20 0.01 4 > /dev/null
  echo "$round $v: $(.venv/bin/python /tmp/s29/marks.py /tmp/s29/home 200 0.01 4)"
done; done
pkill -f "lingcode serve --port 0 --device cpu"

#!/bin/bash
# A/B through the daemon: the pool's helper woken when a request reaches its handler (nudge) or not (off), in turns
cd /work/main
for round in 4 5 6; do
for v in nudge off; do
  cp /tmp/s29/serving_$v.py server/serving.py
  pkill -f "lingcode serve --port 0 --device cpu"; sleep 2; rm -f /tmp/s29/home/state/daemon.json
  (LINGCODE_HOME=/tmp/s29/home nohup .venv/bin/python -m lingcode serve --port 0 --device cpu > /tmp/s29/serve.log 2>&1 &)
  while [ ! -f /tmp/s29/home/state/daemon.json ]; do sleep 1; done; sleep 2
  .venv/bin/python /tmp/s29/marks_std.py /tmp/s29/home 20 0.01 4 > /dev/null
  echo "$round $v: $(.venv/bin/python /tmp/s29/marks_std.py /tmp/s29/home 200 0.01 4)"
done; done
pkill -f "lingcode serve --port 0 --device cpu"
cp /tmp/s29/serving_nudge.py server/serving.py

#!/bin/bash
# in turns: the engine alone without and with a SCHED_IDLE spinner on each CPU
cd /work/main
for round in 1 2 3; do
  echo "round $round plain: $(.venv/bin/python /tmp/s29/spinprobe.py 2>/dev/null | tail -1)"
  for c in $(seq 0 $(($(nproc) - 1))); do chrt -i 0 taskset -c $c python3 -c 'while True: pass' & done
  sleep 0.5
  echo "round $round spin : $(.venv/bin/python /tmp/s29/spinprobe.py 2>/dev/null | tail -1)"
  pkill -f "while True: pass"; wait 2>/dev/null
done

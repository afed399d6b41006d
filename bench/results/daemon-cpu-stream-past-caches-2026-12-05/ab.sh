#!/bin/bash
# Scratch: alternate serve_cpu.py between checkouts (each a directory whose lingcode/ has server,
# lsp and tui linked in, as bench/h200.sh does), ROUNDS rounds; prints deltas.py's line per daemon.
# usage: ab.sh ROUNDS DIR_A DIR_B ...   (run from the repo root, with .venv)
here=$(dirname "$0"); R=$1; shift
for r in $(seq 1 "$R"); do for dir in "$@"; do
  PYTHONPATH=$dir .venv/bin/python "$here/serve_cpu.py" > /tmp/serve_cpu.log 2>&1 &
  pid=$!; for i in $(seq 1 60); do sleep 1; grep -q "Ctrl+C" /tmp/serve_cpu.log && break; done
  PYTHONPATH=$dir .venv/bin/python "$here/cpu_client.py" 150 > /tmp/cpu_points.txt
  echo "$dir $(.venv/bin/python "$here/deltas.py" /tmp/cpu_points.txt)"
  kill -INT $pid; wait $pid
done; done

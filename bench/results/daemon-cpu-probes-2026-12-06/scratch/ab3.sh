#!/bin/bash
# A/B: HEAD vs the framework layers bypassed (+ EventStream's head built once, no server header), trace marks in both
# /tmp/s29/marks.py was marks_own.py here; /tmp/s29/A and B held the files of HEAD (1c953db) + marks_all.patch, and of that + layers.patch
cd /work/main
files=$(cd /tmp/s29/B && find . -type f | sed 's|^\./||')
for round in 1 2 3; do
for v in A B; do
  for f in $files; do git show HEAD:$f > $f; done
  (cd /tmp/s29/$v && find . -type f | sed 's|^\./||') | while read f; do cp /tmp/s29/$v/$f $f; done
  pkill -f "lingcode serve --port 0 --device cpu"; sleep 2; rm -f /tmp/s29/home/state/daemon.json
  (LINGCODE_HOME=/tmp/s29/home nohup .venv/bin/python -m lingcode serve --port 0 --device cpu > /tmp/s29/serve.log 2>&1 &)
  while [ ! -f /tmp/s29/home/state/daemon.json ]; do sleep 1; done; sleep 2
  .venv/bin/python /tmp/s29/marks.py /tmp/s29/home 20 0.01 4 > /dev/null
  echo "$round $v: $(.venv/bin/python /tmp/s29/marks.py /tmp/s29/home 200 0.01 4)"
done; done
pkill -f "lingcode serve --port 0 --device cpu"

# Copied to lingcode/_probe.py for split_marks.patch (scratch, never committed in the package).
import json
import os
import time

clock = time.perf_counter
marks = []


def start():
    marks.clear()
    marks.append(("arrive", clock()))


def mark(label):
    marks.append((label, clock()))


def dump():
    if marks and os.environ.get("PROBE_OUT"):
        with open(os.environ["PROBE_OUT"], "a") as f:
            f.write(json.dumps(marks) + "\n")
    marks.clear()

"""The native CPU step after pauses: how long steps take when requests come with gaps between them.

Per pause length: the mean step of a burst of --burst steps that follows each pause (medians over
--rounds bursts), the first step alone, and how often the pool's threads slept; optionally with
another process busy on one core (--busy). This is what a keystroke or a person's next turn meets.
Run from a checkout with lingcode installed:

    python bench/step_pauses.py
    python bench/step_pauses.py --busy --pauses 0,50
"""

import argparse
import statistics
import subprocess
import sys
import time

import torch

from lingcode import models
from lingcode.engine.local import load_engine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pauses", default="0,1,3,10,30,50,100", help="ms, comma-separated")
    parser.add_argument("--burst", type=int, default=6, help="steps after each pause")
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--busy", action="store_true", help="another process busy on one core meanwhile")
    args = parser.parse_args()
    engine = load_engine(models.ensure(None), device="cpu", speculation="off")
    sleeps = getattr(engine.step.native, "sleeps", lambda: 0)  # (builds before 77ae6c6 do not count)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.busy else None
    print(f"threads {torch.get_num_threads()}, burst {args.burst}, rounds {args.rounds}, busy core: {args.busy}")
    print("| pause (ms) | step, mean of the burst (ms, median / p90) | first step (ms, median) | sleeps per step |")
    print("|---|---|---|---|")
    try:
        with torch.inference_mode():
            engine.step(list(range(100, 164)), 0)
            for pause in (float(p) / 1e3 for p in args.pauses.split(",")):
                bursts, firsts, slept = [], [], sleeps()
                for _ in range(args.rounds):
                    time.sleep(pause)
                    started = time.perf_counter()
                    for k in range(args.burst):
                        engine.step([5 + k], 64 + k)
                        if k == 0:
                            firsts.append((time.perf_counter() - started) * 1e3)
                    bursts.append((time.perf_counter() - started) * 1e3 / args.burst)
                p90 = sorted(bursts)[int(0.9 * (len(bursts) - 1))]
                per_step = (sleeps() - slept) / (args.rounds * args.burst)
                print(
                    f"| {pause * 1e3:g} | {statistics.median(bursts):.2f} / {p90:.2f} | {statistics.median(firsts):.2f} | {per_step:.0f} |"
                )
    finally:
        if busy is not None:
            busy.kill()


if __name__ == "__main__":
    main()

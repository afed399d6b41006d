"""Where a CPU decode step's time goes, torch step against native step (docs/engine-notes.md).

python3 bench/cpu_steps.py [--context 1000] [--rounds 5]      (the default model, torch's threads)

Both engines are filled to the same context; their width-1 steps then run in turns (so a busy
machine slows both alike) and each keeps its median. Then: torch's profiler over the torch step
(how many ops a step dispatches, and their self time by op), the native step on one thread, its
verify widths 1-8, and prefill chunks.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter

import torch
from torch.profiler import ProfilerActivity, profile

from lingcode import models
from lingcode.engine.local import load_engine


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--context", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    path = models.ensure(models.DEFAULT_MODEL)
    engines = {k: load_engine(path, device="cpu", kernels=k, speculation="off") for k in ("torch", "native")}
    threads = torch.get_num_threads()
    print(f"torch {torch.__version__}, {threads} threads, context {args.context}")
    with open("/proc/loadavg") as f:
        print("load average:", f.read().strip())
    context = torch.randint(100, 40000, (args.context,), generator=torch.Generator().manual_seed(0)).tolist()
    with torch.inference_mode():
        for engine in engines.values():
            for start in range(0, args.context, 256):
                engine.step(context[start : start + 256], start)
        ms: dict[str, list[float]] = {k: [] for k in engines}
        for _ in range(args.rounds):
            for name, engine in engines.items():
                for i in range(10):
                    ms[name].append(timed(lambda: engine.step([5], args.context + i)))
        for name, values in ms.items():
            print(f"{name} step, width 1: median {statistics.median(values):.2f} ms, best {min(values):.2f} ms")

        step = engines["torch"].step
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for i in range(5):
                step([5], args.context + i)
        events = prof.key_averages()
        calls = sum(e.count for e in events if e.key.startswith(("aten::", "lingcode::"))) / 5
        self_ms = Counter({e.key: e.self_cpu_time_total / 5e3 for e in events})
        print(f"torch step: {calls:.0f} op calls a step; self time a step, top ops:")
        for key, value in self_ms.most_common(10):
            print(f"  {key:45s} {value:7.2f} ms")
        print(f"  (all ops {sum(self_ms.values()):.2f} ms)")

        native = engines["native"].step
        torch.set_num_threads(1)
        one = statistics.median(timed(lambda: native([5], args.context + i)) for i in range(30))
        torch.set_num_threads(threads)
        print(f"native step, width 1 on 1 thread: median {one:.2f} ms")
        widths = {w: [] for w in range(1, 9)}
        for _ in range(args.rounds):
            for w in widths:
                widths[w].append(timed(lambda: native([5] * w, args.context, all_logits=True)))
        print("native verify steps (median ms):", {w: round(statistics.median(v), 2) for w, v in widths.items()})
        for chunk in (128, 512):
            ids = context[:chunk]
            best = min(timed(lambda: native(ids, 0)) for _ in range(3))
            print(f"native prefill chunk of {chunk} from position 0: best {best:.1f} ms, {best / chunk:.3f} ms a token")


if __name__ == "__main__":
    main()

"""The compiled CPU step's time by width (1 = plain decoding, 2-8 = verify steps) at context 1000:
what a draft of each length costs, against the tokens it may save (bench/results/lsp-notes.md).

python3 bench/cpu_step_widths.py     (torch.compile first: ~2 minutes on 2 cores)
"""

import statistics
import time

import torch

from lingcode import models
from lingcode.engine.local import load_engine

started = time.perf_counter()
engine = load_engine(models.ensure(models.DEFAULT_MODEL), device="cpu", compile=True)
print(f"load + compile: {time.perf_counter() - started:.1f} s")
with torch.inference_mode():
    engine.model(torch.randint(0, 1000, (1, 1000)), 0)  # a 1000-token context
    for width in (1, 2, 3, 4, 6, 8):
        times = []
        for _ in range(15):
            tokens = torch.randint(0, 1000, (1, width))
            t0 = time.perf_counter()
            engine.narrow_step(tokens, 1000, all_logits=width > 1)
            times.append(time.perf_counter() - t0)
        print(f"width {width}: {statistics.median(times[3:]) * 1e3:.2f} ms a step (median of 12)")

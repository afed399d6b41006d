"""The CPU's KV cache key layout, side by side: keys stored position-first [KV, L, D] (the score
matmul reads them transposed, and MKL packs them on every call) against position-last [KV, D, L]
(model.KVCache's transposed_keys, the CPU default). Two compiled engines in one process, timed in
turns (ABAB) at context 1000, width 1 (decoding) and 3 (a verify step); and whether they give the
same logits.

python3 bench/cpu_key_layout.py     (compiles twice: ~4 minutes on 2 cores)
"""

import statistics
import time

import torch

from lingcode import models
from lingcode.engine.local import load_engine

CONTEXT = 1000
torch._dynamo.config.recompile_limit = 64  # two engines share model.forward's code: room for both
path = models.ensure(models.DEFAULT_MODEL)
engines = {}
for name, transposed in (("position-first keys", False), ("position-last keys", True)):
    engine = load_engine(path, device="cpu", compile=True)
    engine.model.kv_dtype = None  # both f32, read by torch's matmuls (the f16 cache is bench/cpu_attention.py's)
    engine.model.setup_cache(engine.model.max_len, transposed_keys=transposed)
    engines[name] = engine
print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
with torch.inference_mode():
    prompt = torch.randint(0, 1000, (1, CONTEXT), generator=torch.Generator().manual_seed(0))
    tokens = {1: prompt[:, :1], 3: prompt[:, 1:4]}
    for engine in engines.values():
        engine.model(prompt[:, :500], 0)
        engine.model(prompt[:, 500:], 500)
        for width, ids in tokens.items():  # recompiles for the new cache's strides, once
            engine.narrow_step(ids, CONTEXT, all_logits=width > 1)
    first, second = engines.values()
    for width, ids in tokens.items():
        same = torch.equal(first.narrow_step(ids, CONTEXT, all_logits=True), second.narrow_step(ids, CONTEXT, all_logits=True))
        print(f"width {width}: the same logits bit for bit: {same}")
    medians: dict[tuple[str, int], list[float]] = {}
    for _ in range(6):
        for name, engine in engines.items():
            for width, ids in tokens.items():
                times = []
                for i in range(12):
                    started = time.perf_counter()
                    engine.narrow_step(ids, CONTEXT + i % 5, all_logits=width > 1)
                    times.append(time.perf_counter() - started)
                medians.setdefault((name, width), []).append(statistics.median(times[2:]) * 1e3)
for (name, width), runs in medians.items():
    print(f"{name}, width {width}: {statistics.median(runs):.2f} ms a step (median of 6 rounds: "
          + " ".join(f"{ms:.2f}" for ms in runs) + ")")
for width in tokens:
    before, after = (statistics.median(medians[(name, width)]) for name in engines)
    print(f"width {width}: position-last / position-first = {after / before:.3f}")

"""The CPU's decode attention, side by side: an f32 KV cache read by torch's batched matmuls
(model.row_exact_attention, the CPU path before cpu_attention) against bf16 and f16 caches read
by lingcode::decode_attention (cpu_attention.cpp; f16 is the CPU default). Three compiled engines
in one process, timed in turns at context 1000, width 1 (decoding) and 3 (a verify step), and
how close their logits are to the f32 cache's (16-bit caches round keys and values).

python3 bench/cpu_attention.py     (compiles three times: ~7 minutes on 2 cores)
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
CACHES = (("f32 cache, torch bmm", None), ("bf16 cache, cpu_attention", torch.bfloat16),
          ("f16 cache, cpu_attention", torch.float16))
for name, kv_dtype in CACHES:
    engine = load_engine(path, device="cpu", compile=True)
    assert engine.model.kv_dtype == torch.float16, "cpu_attention did not build here"
    engine.model.kv_dtype = kv_dtype
    engine.model.setup_cache(engine.model.max_len)
    engines[name] = engine
print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
with torch.inference_mode():
    prompt = torch.randint(0, 1000, (1, CONTEXT), generator=torch.Generator().manual_seed(0))
    tokens = {1: prompt[:, :1], 3: prompt[:, 1:4]}
    for engine in engines.values():
        engine.model(prompt[:, :500], 0)
        engine.model(prompt[:, 500:], 500)
        for width, ids in tokens.items():  # recompiles for the new cache, once
            engine.narrow_step(ids, CONTEXT, all_logits=width > 1)
    first, *others = engines.values()
    for width, ids in tokens.items():
        a = first.narrow_step(ids, CONTEXT, all_logits=True)
        for name, other in list(engines.items())[1:]:
            b = other.narrow_step(ids, CONTEXT, all_logits=True)
            print(f"{name}, width {width}: the f32 cache's next token at {int((a.argmax(-1) == b.argmax(-1)).sum())} "
                  f"of {width} positions, largest logit difference {float((a - b).abs().max()):.4f} "
                  f"(logits span {float(a.max() - a.min()):.1f})")
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
    before = statistics.median(medians[(CACHES[0][0], width)])
    for name, _ in CACHES[1:]:
        print(f"width {width}: {name} / f32 cache = {statistics.median(medians[(name, width)]) / before:.3f}")

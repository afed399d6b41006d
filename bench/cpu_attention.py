"""The CPU's decode attention, side by side: an f32 KV cache read by torch's batched matmuls
(model.row_exact_attention, the CPU path before cpu_attention) against bf16 and f16 caches read
by lingcode::decode_attention (cpu_attention.cpp; f16 is the CPU default). Three compiled engines
in one process, timed in turns at context 1000, width 1 (decoding) and 3 (a verify step), and
how close their logits are to the f32 cache's (16-bit caches round keys and values).

python3 bench/cpu_attention.py     (compiles three times: ~7 minutes on 2 cores)
"""

import torch
from compiled_steps import CONTEXT, fill, time_in_turns

from lingcode import models
from lingcode.engine.local import load_engine

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
    tokens = fill(engines)
    first = engines[CACHES[0][0]]
    for width, ids in tokens.items():
        a = first.narrow_step(ids, CONTEXT, all_logits=True)
        for name, _ in CACHES[1:]:
            b = engines[name].narrow_step(ids, CONTEXT, all_logits=True)
            print(f"{name}, width {width}: the f32 cache's next token at {int((a.argmax(-1) == b.argmax(-1)).sum())} "
                  f"of {width} positions, largest logit difference {float((a - b).abs().max()):.4f} "
                  f"(logits span {float(a.max() - a.min()):.1f})")
    medians = time_in_turns(engines, tokens)
for width in tokens:
    before = medians[(CACHES[0][0], width)]
    for name, _ in CACHES[1:]:
        print(f"width {width}: {name} / f32 cache = {medians[(name, width)] / before:.3f}")

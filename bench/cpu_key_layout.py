"""The CPU's KV cache key layout, side by side: keys stored position-first [KV, L, D] (the score
matmul reads them transposed, and MKL packs them on every call) against position-last [KV, D, L]
(model.KVCache's transposed_keys, the CPU default). Two compiled engines in one process, timed in
turns (ABAB) at context 1000, width 1 (decoding) and 3 (a verify step); and whether they give the
same logits.

python3 bench/cpu_key_layout.py     (compiles twice: ~4 minutes on 2 cores)
"""

import torch
from compiled_steps import CONTEXT, fill, time_in_turns

from lingcode import models
from lingcode.engine.local import load_engine

path = models.ensure(models.DEFAULT_MODEL)
engines = {}
for name, transposed in (("position-first keys", False), ("position-last keys", True)):
    engine = load_engine(path, device="cpu", compile=True)
    engine.model.kv_dtype = None  # both f32, read by torch's matmuls (the f16 cache is bench/cpu_attention.py's)
    engine.model.setup_cache(engine.model.max_len, transposed_keys=transposed)
    engines[name] = engine
print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
with torch.inference_mode():
    tokens = fill(engines)
    first, second = engines.values()
    for width, ids in tokens.items():
        same = torch.equal(first.narrow_step(ids, CONTEXT, all_logits=True), second.narrow_step(ids, CONTEXT, all_logits=True))
        print(f"width {width}: the same logits bit for bit: {same}")
    medians = time_in_turns(engines, tokens)
for width in tokens:
    before, after = (medians[(name, width)] for name in engines)
    print(f"width {width}: position-last / position-first = {after / before:.3f}")

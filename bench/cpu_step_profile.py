"""Where the CPU decode step's time goes: torch's profiler over the eager width-1 step at context
1000, and each matmul of a layer (and the output head) alone, int4 (the file's codes) vs bf16.

python3 bench/cpu_step_profile.py     (2 threads; the model is the default GGUF)
"""

import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from lingcode import models
from lingcode.engine.local import load_engine


def median_ms(fn, runs: int = 50) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


engine = load_engine(models.ensure(models.DEFAULT_MODEL), device="cpu")
model = engine.model
print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
with torch.inference_mode():
    model(torch.randint(0, 1000, (1, 1000)), 0)  # a 1000-token context
    token = torch.randint(0, 1000, (1, 1))
    print(f"eager width-1 step at context 1000: {median_ms(lambda: model(token, 1000), 15):.1f} ms (median of 15)")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            model(token, 1000)
    print("torch profiler, 5 steps (self CPU time):")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8))
    layer = model.layers[0]
    for name, linear in [("output head", model.output), ("wqkv", layer.attn.wqkv), ("wo", layer.attn.wo),
                         ("w_gate_up", layer.ffn.w_gate_up), ("w_down", layer.ffn.w_down)]:  # fmt: skip
        x = torch.randn(1, linear.weight.shape[1])
        int4 = median_ms(lambda: linear(x))
        bf16 = median_ms(lambda: torch.nn.functional.linear(x.bfloat16(), linear.weight))
        print(f"{name} {tuple(linear.weight.shape)}: int4 {int4:.3f} ms, bf16 dense {bf16:.3f} ms")

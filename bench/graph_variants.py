"""Time one decode step (width 1) and one verify step (width 8) of the captured graph, with and
without torch.compile, on the same weights: what compile buys on this GPU, and what it costs at load.

python3 bench/graph_variants.py MODEL.gguf
"""

import sys
import time

import torch
from replay_timing import ms_per_replay

from lingcode.engine.local.cuda_graphs import GraphRunner
from lingcode.engine.local.model import Transformer
from lingcode.engine.local.weights import load_checkpoint

ck = load_checkpoint(sys.argv[1])
rows = []
for compile in (False, True):
    torch._dynamo.reset()
    model = Transformer.from_weights(ck.config, ck.weights, torch.bfloat16, torch.device("cuda"))
    model.setup_cache(ck.config.context_length)
    started = time.perf_counter()
    runner = GraphRunner(model, compile=compile)
    capture_s = time.perf_counter() - started
    for width, end in ((1, 300), (1, 2000), (8, 300)):
        runner.tokens[0, :width].fill_(100)
        torch.arange(end - width, end, out=runner.positions[:width])
        rows.append((compile, width, end, round(capture_s, 1), round(ms_per_replay(runner, width, end), 4)))
    del runner, model
    torch.cuda.empty_cache()
print("| torch.compile | width | context | load+capture s | ms per replay (median of 5x200) |")
print("|---|---|---|---|---|")
for r in rows:
    print("| " + " | ".join(map(str, r)) + " |")

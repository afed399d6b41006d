"""What the GPU kernel tools (triton_blocks.py, triton_vs_torch.py) share: random weights in a
model config's shapes, and timing a captured step or one kernel launched many times in a graph.

They run as `python bench/NAME.py`, so Python puts bench/ on the path and this imports as gpu_timing.
"""

import torch

from lingcode.engine.local.weights import ModelConfig


def random_weights(cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Weights in our short names (weights.py): norms of ones, matrices N(0, 1/fan_in), seed 0."""
    shapes = {"tok_embeddings": (cfg.vocab_size, cfg.dim), "norm": (cfg.dim,)}
    q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    for i in range(cfg.n_layers):
        shapes |= {
            f"layers.{i}.{name}": shape
            for name, shape in dict(
                attn_norm=(cfg.dim,),
                ffn_norm=(cfg.dim,),
                wq=(q, cfg.dim),
                wk=(kv, cfg.dim),
                wv=(kv, cfg.dim),
                wo=(cfg.dim, q),
                w_gate=(cfg.ffn_dim, cfg.dim),
                w_up=(cfg.ffn_dim, cfg.dim),
                w_down=(cfg.dim, cfg.ffn_dim),
            ).items()
        }
    gen = torch.Generator().manual_seed(0)
    return {k: torch.ones(s) if len(s) == 1 else torch.randn(s, generator=gen) / s[1] ** 0.5 for k, s in shapes.items()}


def ms_per_replay(runner, width: int, end: int, replays: int = 200, runs: int = 5) -> float:
    """Median over `runs` of the mean time of `replays` back-to-back replays of the (width, end)
    graph, in ms, after 20 replays of warm-up. The inputs already in the runner's buffers are used."""
    for _ in range(20):
        runner.replay(width, end)
    torch.cuda.synchronize()
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(runs):
        t0.record()
        for _ in range(replays):
            runner.replay(width, end)
        t1.record()
        torch.cuda.synchronize()
        times.append(t0.elapsed_time(t1) / replays)
    return sorted(times)[runs // 2]


def per_launch_us(fn, launches: int = 30) -> float:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: compilation
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(launches):
            fn()
    start, end, times = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True), []
    for _ in range(5):
        start.record()
        for _ in range(20):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / 20 / launches)
    return sorted(times)[2]

"""Time a captured step (bench/graph_variants.py, bench/triton_vs_torch.py) or one kernel launched
many times in a graph (bench/triton_blocks.py, bench/flashinfer_kernels.py).

They run as python3 bench/NAME.py, which puts bench/ on the path: this module imports as replay_timing.
"""

import torch


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

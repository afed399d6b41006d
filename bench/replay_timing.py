"""Time a captured step: what bench/graph_variants.py and bench/triton_vs_torch.py both measure.

Both scripts run from bench/ (python3 bench/NAME.py), so this module is importable as replay_timing.
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

"""What bench/cpu_key_layout.py and bench/cpu_attention.py share: compiled CPU engines filled to the
same context, then their narrow steps timed in turns (each round times every engine at every
width, so the machine's drift falls on all of them alike)."""

import statistics
import time

import torch

CONTEXT = 1000
torch._dynamo.config.recompile_limit = 64  # engines share model.forward's code: room for each one's graphs


def fill(engines: dict) -> dict[int, torch.Tensor]:
    """Prefill the same CONTEXT tokens into every engine and run each width once (Dynamo recompiles
    for a cache set up after load, once); the tokens each width feeds."""
    prompt = torch.randint(0, 1000, (1, CONTEXT), generator=torch.Generator().manual_seed(0))
    tokens = {1: prompt[:, :1], 3: prompt[:, 1:4]}  # decoding, and a verify step of two drafts
    for engine in engines.values():
        engine.model(prompt[:, :500], 0)
        engine.model(prompt[:, 500:], 500)
        for width, ids in tokens.items():
            engine.narrow_step(ids, CONTEXT, all_logits=width > 1)
    return tokens


def time_in_turns(engines: dict, tokens: dict[int, torch.Tensor], rounds: int = 6) -> dict[tuple[str, int], float]:
    """ms a step per (engine name, width): the median over rounds of each round's median of 10 steps
    (after 2 warm ones); prints every round's figure."""
    runs: dict[tuple[str, int], list[float]] = {}
    for _ in range(rounds):
        for name, engine in engines.items():
            for width, ids in tokens.items():
                times = []
                for i in range(12):
                    started = time.perf_counter()
                    engine.narrow_step(ids, CONTEXT + i % 5, all_logits=width > 1)
                    times.append(time.perf_counter() - started)
                runs.setdefault((name, width), []).append(statistics.median(times[2:]) * 1e3)
    for (name, width), ms in runs.items():
        print(f"{name}, width {width}: {statistics.median(ms):.2f} ms a step (median of {rounds} rounds: "
              + " ".join(f"{m:.2f}" for m in ms) + ")")
    return {key: statistics.median(ms) for key, ms in runs.items()}

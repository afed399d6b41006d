"""CUDA graphs for the decode and verify steps: one replay instead of hundreds of kernel launches.

At batch 1 a 30-layer step is launch-bound: the GPU finishes each small kernel before the host
has issued the next. A graph replays the whole step from one launch. Shapes must be fixed, so we
capture one graph per (width, cache bucket): width 1 for plain decode, a few verify widths for
speculation (drafts are padded up to the next captured width), and cache buckets so that a short
context does not attend over all 8192 positions.
"""

from __future__ import annotations

import bisect
import time

import torch

from lingcode.engine.local.model import Transformer

WIDTHS = (1, 2, 4, 8)  # verify widths: pending token + up to 7 drafts
BUCKETS = (256, 512, 1024, 2048, 4096, 8192)


class GraphRunner:
    """Static input buffers, captured graphs, and their static logits outputs."""

    def __init__(
        self,
        model: Transformer,
        widths=WIDTHS,
        buckets=BUCKETS,
        compile: bool = False,
        kernels: str = "torch",
        triton_options: dict | None = None,
    ):  # triton_options: TritonStep's keyword arguments (pdl, rows), for benchmarks and tests
        if kernels not in ("torch", "triton"):
            raise ValueError(f"kernels {kernels!r}: use torch or triton")
        if compile and kernels == "triton":
            raise ValueError("torch.compile applies to the torch kernels, not to the Triton step")
        self.model = model
        device = model.norm.weight.device
        self.widths = tuple(widths)
        self.buckets = tuple(b for b in buckets if b < model.max_len) + (model.max_len,)
        self.tokens = torch.zeros(1, max(self.widths), dtype=torch.long, device=device)
        self.positions = torch.zeros(max(self.widths), dtype=torch.long, device=device)
        self.staging = torch.zeros(max(self.widths), dtype=torch.long).pin_memory()  # host side of tokens
        self.readback = torch.zeros(2, dtype=torch.long).pin_memory()  # the pipelined loop's token slots
        self.ready = (torch.cuda.Event(), torch.cuda.Event())
        step = model.forward_static
        if kernels == "triton":  # about five hand-written kernels per layer instead of ~20 (triton_step.py)
            from lingcode.engine.local.triton_step import TritonStep

            step = TritonStep(model, **(triton_options or {}))
        if compile:  # fuses the small elementwise kernels (norms, RoPE, SiLU) between the matmuls
            # dynamic: one compiled kernel set serves every width and cache bucket (no recompiles)
            step = torch.compile(step, fullgraph=True, dynamic=True)
        self.step = step  # kept alive: the graphs use its state (the Triton step's attention counters)
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.greedy_graphs: dict[int, torch.cuda.CUDAGraph] = {}  # per bucket (replay_greedy)
        started = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.inference_mode(), torch.cuda.stream(side):
            for w in self.widths:
                for bucket in self.buckets:
                    self.positions[:w].copy_(torch.arange(w))  # valid positions for the warm-up
                    for _ in range(2):  # warm-up: allocator, cuBLAS handles, compilation (torch.compile, Triton)
                        step(self.tokens[:, :w], self.positions[:w], bucket)
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool, stream=side):
                        logits = step(self.tokens[:, :w], self.positions[:w], bucket)
                    self.graphs[(w, bucket)] = (graph, logits)
            for bucket in self.buckets:  # greedy decoding: the step, its argmax and the next step's inputs
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=side):
                    logits = step(self.tokens[:, :1], self.positions[:1], bucket)
                    self.tokens[0, :1].copy_(logits[0, 0].argmax(dim=-1))
                    self.positions[:1].add_(1)
                self.greedy_graphs[bucket] = graph
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        self.capture_s = time.perf_counter() - started

    def width_for(self, n: int) -> int | None:
        i = bisect.bisect_left(self.widths, n)
        return self.widths[i] if i < len(self.widths) else None

    def bucket_for(self, end: int) -> int:
        return self.buckets[bisect.bisect_left(self.buckets, end)]

    def replay(self, width: int, end: int) -> torch.Tensor:
        """Run the captured step for the inputs already in tokens[:, :width] / positions[:width];
        end = last position + 1. The returned logits [width, V] are overwritten by the next replay."""
        graph, logits = self.graphs[(width, self.bucket_for(end))]
        graph.replay()
        return logits[0]

    def replay_greedy(self, end: int) -> None:
        """One greedy decode step in one replay: the token in tokens[0, 0] at positions[0] (= end - 1)
        is fed, and the argmax of its logits replaces it, positions[0] moving on by one. So the
        next step's inputs never leave the GPU, and the host launches one graph a token instead of a
        graph and three small kernels (measured: docs/engine-notes.md)."""
        self.greedy_graphs[self.bucket_for(end)].replay()

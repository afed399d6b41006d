"""The embedded engine's forward-pass backends, one chosen at load (pick_step).

Every backend is a Step with one interface, which is all the engine's loops call:
  step(ids, start, all_logits=False, n_layers=None) -> logits [T, V] (all_logits) or [1, V]
  step.draft_room(pos, fed): how many drafts a step feeding `fed` tokens from pos may verify, so
    that a verified token sees exactly the numbers plain decoding would (lossless greedy drafts)
  step.prefill_chunks(start, end): the forwards that feed a prompt's positions start..end-1
  step.widths, step.padded_width(n): the step widths worth timing at load, what n tokens run as
  step.pipelined: whether plain decoding can run ahead of the host (captured CUDA graphs)
  step.drafts: whether it verifies drafts at all (only where verifying is bit-exact: lossless)

Backends: NativeCpuStep (cpu_step.cpp: the whole model in one call; the CPU default where it
builds), TorchCpuStep (model.py on torch's CPU kernels, optionally torch.compile'd), TorchStep
(model.py eager on a GPU without graphs), GraphStep (captured CUDA graphs of model.py's step or
of the Triton step).
"""

from __future__ import annotations

import logging
import warnings

import torch

from lingcode.engine.local.cuda_graphs import GraphRunner
from lingcode.engine.local.model import Transformer, row_exact_kv_len

log = logging.getLogger(__name__)

PREFILL_CHUNK = 512  # prompt tokens per forward while prefilling (torch backends)
NATIVE_PREFILL_CHUNK = 128  # the native step's: ~50 ms of compute on 2 cores, so an abort lands soon
NATIVE_WIDTHS = 8  # the widest native verify step: the pending token and 7 drafts


class TorchStep:
    """model.py's forward, eager: a GPU without captured graphs. Its kernels give no row-exact
    guarantee: a token verified among drafts could differ from plain decoding's (it did, at token
    16 of a code edit on the H200), so this step offers no drafts: lossless or not at all."""

    name = "torch"
    pipelined = False
    drafts = False

    def __init__(self, model: Transformer, device: torch.device):
        self.model, self.device = model, device
        self.widths = range(1, 9)

    def __call__(self, ids: list[int], start: int, all_logits: bool = False, n_layers: int | None = None):
        tokens = torch.tensor([ids], dtype=torch.long, device=self.device)
        return self.model(tokens, start, all_logits=all_logits, n_layers=n_layers)[0]

    def padded_width(self, n: int) -> int:
        return n

    def draft_room(self, pos: int, fed: int) -> int:
        return 0

    def prefill_chunks(self, start: int, end: int) -> list[tuple[int, int]]:
        return [(s, min(s + PREFILL_CHUNK, end)) for s in range(start, end, PREFILL_CHUNK)]


class TorchCpuStep(TorchStep):
    """model.py on the CPU: the file's 4-bit codes through torch's int4 kernel for steps of up to
    model.row_exact_rows tokens, bf16 GEMMs for wider prefill chunks (quantized.py), and with
    --compile the narrow steps through torch.compile (compile_narrow_step).

    Row-exact rules (model.py): a step of up to row_exact_rows tokens gives each row the numbers it
    would get alone, within a 128-position attention bucket with the f32 cache (row_exact_attention)
    or anywhere with the f16 cache (cpu_attention). So a verify step stays within those rows (and
    that bucket), and a prompt's last token comes from such a step, never from a wide prefill
    chunk: else the first token would depend on how much of the prompt was cached."""

    name = "torch-cpu"
    drafts = True

    def __init__(self, model: Transformer, compile: bool = False):
        super().__init__(model, torch.device("cpu"))
        self.name = "torch-cpu-compiled" if compile else "torch-cpu"
        # Narrow steps are row-exact only on the int4 kernel, which takes Q4_1 / Q8_0 files' blocks;
        # other files' matrices run as bf16 GEMMs, whose result for a row may change with the rows
        # beside it: there drafting is off, lossless or not at all.
        self.drafts = model.int4_matmuls
        if not self.drafts:
            log.warning(
                "the torch CPU step on this file's block types: no drafts (its verify steps would not be "
                "bit-exact with plain decoding); the native step drafts on every type"
            )
        self.widths = range(1, model.row_exact_rows + 1)
        self.narrow = compile_narrow_step(model) if compile else None

    def __call__(self, ids: list[int], start: int, all_logits: bool = False, n_layers: int | None = None):
        tokens = torch.tensor([ids], dtype=torch.long)
        if self.narrow is not None and n_layers is None and len(ids) <= self.model.row_exact_rows:
            return self.narrow(tokens, start, all_logits=all_logits)[0]
        return self.model(tokens, start, all_logits=all_logits, n_layers=n_layers)[0]

    def draft_room(self, pos: int, fed: int) -> int:
        model = self.model
        if not self.drafts:
            return 0
        end = model.max_len if model.kv_dtype else row_exact_kv_len(pos + fed, model.max_len)
        return max(0, min(model.row_exact_rows, end - pos) - fed)

    def prefill_chunks(self, start: int, end: int) -> list[tuple[int, int]]:
        rows = self.model.row_exact_rows
        if end - start > rows or row_exact_kv_len(start + 1, self.model.max_len) < end:
            steps = [(s, min(s + PREFILL_CHUNK, end - 1)) for s in range(start, end - 1, PREFILL_CHUNK)]
            return steps + [(end - 1, end)]
        return super().prefill_chunks(start, end)


class NativeCpuStep:
    """cpu_step.cpp's Step: the whole model in one call on the GGUF's own blocks, writing the
    model's f16 KV cache. Row-exact at every width and thread count, so drafts may go up to the
    widest verify step anywhere, and prefill chunks need no row-exact tail."""

    name = "native"
    pipelined = False
    drafts = True

    def __init__(self, native, max_len: int):
        self.native, self.max_len = native, max_len
        self.widths = range(1, NATIVE_WIDTHS + 1)

    def __call__(self, ids: list[int], start: int, all_logits: bool = False, n_layers: int | None = None):
        return self.native.forward(
            torch.tensor(ids, dtype=torch.long), start, all_logits, -1 if n_layers is None else n_layers
        )

    def padded_width(self, n: int) -> int:
        return n

    def sleeps(self) -> int:
        """How many times a thread of the step's pool went to sleep waiting (engine stats)."""
        return self.native.sleeps()

    def draft_room(self, pos: int, fed: int) -> int:
        return max(0, min(NATIVE_WIDTHS, self.max_len - pos) - fed)

    def prefill_chunks(self, start: int, end: int) -> list[tuple[int, int]]:
        return [(s, min(s + NATIVE_PREFILL_CHUNK, end)) for s in range(start, end, NATIVE_PREFILL_CHUNK)]


class GraphStep:
    """Captured CUDA graphs (cuda_graphs.py) of model.py's step or of the Triton step, at widths
    1, 2, 4, 8 and per cache bucket; inputs are padded up to a captured width. Early-exit drafts
    and what no graph covers run model.py eagerly. The Triton step reads a GGUF checkpoint's
    matrices as the file's blocks (gpu_blocks.py), repacked here once; prefill stays on model.py's
    dense weights."""

    pipelined = True

    def __init__(self, model: Transformer, device: torch.device, compile: bool, kernels: str, checkpoint=None):
        self.model, self.device = model, device
        options = None
        if kernels == "triton" and checkpoint is not None:
            from lingcode.engine.local import gpu_blocks

            weights = gpu_blocks.pack_checkpoint(checkpoint, device)
            log.info(
                "Triton step: %d matrices read as GGUF blocks (%.0f MB)",
                len(weights),
                sum(w.nbytes for w in weights.values()) / 1e6,
            )
            options = {"weights": weights}
        self.runner = GraphRunner(model, compile=compile, kernels=kernels, triton_options=options)
        self.name = f"cuda-graphs-{kernels}"
        self.drafts = kernels == "triton"
        if not self.drafts:
            log.warning(
                "--kernels %s on a GPU: no drafts (its verify steps are not bit-exact with plain decoding)", kernels
            )
        self.widths = self.runner.widths
        self.eager = TorchStep(model, device)

    def __call__(self, ids: list[int], start: int, all_logits: bool = False, n_layers: int | None = None):
        runner = self.runner
        width = runner.width_for(len(ids))
        if n_layers is not None or width is None or start + width > self.model.max_len:
            return self.eager(ids, start, all_logits, n_layers)
        # Pad to a captured width; padded positions write cache entries no one reads as valid.
        padded = ids + ids[-1:] * (width - len(ids))
        staging = runner.staging  # pinned; free to reuse: every host-loop step ends in a read
        staging[:width] = torch.tensor(padded)
        runner.tokens[0, :width].copy_(staging[:width], non_blocking=True)
        torch.arange(start, start + width, out=runner.positions[:width])
        return runner.replay(width, start + width)[: len(ids)]

    def padded_width(self, n: int) -> int:
        return self.runner.width_for(n)

    def draft_room(self, pos: int, fed: int) -> int:
        # Captured torch ops are not row-exact across widths (TorchStep): drafts only on the Triton
        # step, whose verify widths run the same per-row code as the plain step.
        if not self.drafts:
            return 0
        runner = self.runner
        return max(0, min(runner.widths[-1], runner.bucket_for(pos + fed) - pos) - fed)

    def prefill_chunks(self, start: int, end: int) -> list[tuple[int, int]]:
        return [(s, min(s + PREFILL_CHUNK, end)) for s in range(start, end, PREFILL_CHUNK)]


def pick_step(checkpoint, model: Transformer, device: torch.device, kernels: str, cuda_graphs: bool, compile: bool):
    """The backend for these options (kernels already resolved by pick_kernels)."""
    if device.type == "cuda":
        if cuda_graphs:
            return GraphStep(model, device, compile, kernels, checkpoint)
        if kernels != "torch":  # the Triton step runs only as captured graphs
            raise ValueError(f"--kernels {kernels} needs CUDA graphs on a GPU (this engine: {device}, no graphs)")
        log.warning("the GPU without CUDA graphs: no drafts (eager verify steps are not bit-exact with plain decoding)")
        return TorchStep(model, device)
    if kernels == "native":
        from lingcode.engine.local import cpu_step

        try:
            return NativeCpuStep(cpu_step.build(checkpoint, model), model.max_len)
        except cpu_step.Unavailable as e:
            raise ValueError(f"--kernels native cannot run this model here: {e}") from None
    if kernels != "torch":
        raise ValueError(f"--kernels {kernels} runs on a GPU; on the CPU use native or torch")
    return TorchCpuStep(model, compile=compile)


def compile_narrow_step(model: Transformer):
    """torch.compile the CPU's decode/verify forward (up to row_exact_rows tokens): Inductor fuses
    the small elementwise ops between the matmuls, which at batch 1 cost as much as the matmuls.
    dynamic=True: one graph for every width and position. Warmed up here, at load, on positions
    the first request overwrites (not 0 or 1: Dynamo specializes those values, and a real step
    would compile again). Takes minutes (docs/engine-notes.md)."""
    # Inductor warns when a fused kernel mixes the f16 cache's writes with the bf16 inputs of the
    # int4 matmuls; it then computes that kernel in f32, which is what the step means anyway.
    warnings.filterwarnings("ignore", message="bf16 and fp16 are mixed in the scheduler node")
    step = torch.compile(model.forward, dynamic=True)
    with torch.inference_mode():
        for width in (1, 2, 3):
            for all_logits in (False, True):
                step(torch.zeros(1, width, dtype=torch.long), 300 + width, all_logits=all_logits)
    return step

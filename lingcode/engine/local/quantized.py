"""Weight-only int4 matmuls: how the CPU's torch step decodes at the speed of a quantized file.

A batch-1 decode step reads every weight once to produce one row, so on the CPU its time is the
weights' bytes over memory bandwidth (and whether they fit in the last-level cache). GGUF's Q4_1
blocks (32 four-bit codes, a scale and a min) map exactly onto torch's int4pack layout, whose
kernel computes w = (q - 8) * scale + zero: with zero = min + 8 * scale it is the same weight, so
decoding runs the file's own 4-bit codes, as llama.cpp does (its f16 scales and mins rounded to
bf16, the kernel's type). Q8_0 (the output head) is split into two 4-bit parts (q8_from_blocks).
Wide inputs (prefill chunks) go to the dense bf16 weight instead: there oneDNN's bf16 GEMM (AMX)
beats the int4 kernel, which unpacks the weights again for every call. (The CPU's default is the
native step, cpu_step.cpp; measurements of both: docs/engine-notes.md.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

Q4_GROUP = 32  # GGUF Q4_1 block size: one scale and min per 32 weights of a row
MAX_QUANTIZED_ROWS = 8  # inputs up to this many rows (decode, verify, a typed character) use int4


@dataclass
class Q4Weight:
    """A Q4_1 weight as the file stores it: codes [N, K] in 0..15, scale and min [N, K / 32]."""

    codes: Tensor
    scale: Tensor
    min: Tensor

    @staticmethod
    def cat(parts: list["Q4Weight"]) -> "Q4Weight":  # stack row blocks (fused QKV, gate/up)
        return Q4Weight(*(torch.cat([getattr(p, f) for p in parts]) for f in ("codes", "scale", "min")))

    def permute_rows(self, order: Tensor) -> "Q4Weight":
        return Q4Weight(self.codes[order], self.scale[order], self.min[order])

    def dequantize(self) -> Tensor:
        n, k = self.codes.shape
        groups = self.codes.view(n, k // Q4_GROUP, Q4_GROUP).float()
        return (groups * self.scale[..., None] + self.min[..., None]).view(n, k)


def q4_from_blocks(blocks, rows: int, cols: int) -> Q4Weight:
    """Parse GGUF block_q4_1 bytes (f16 d, f16 m, 16 bytes of nibbles: low = 0..15, high = 16..31)."""
    import numpy as np

    raw = np.asarray(blocks, dtype=np.uint8).reshape(-1, 20)
    scale = raw[:, 0:2].copy().view(np.float16).astype(np.float32).reshape(rows, cols // Q4_GROUP)
    mins = raw[:, 2:4].copy().view(np.float16).astype(np.float32).reshape(rows, cols // Q4_GROUP)
    nibbles = raw[:, 4:]
    codes = np.concatenate([nibbles & 0xF, nibbles >> 4], axis=1).reshape(rows, cols)
    return Q4Weight(torch.from_numpy(codes.copy()), torch.from_numpy(scale), torch.from_numpy(mins))


def q8_from_blocks(blocks, rows: int, cols: int) -> list[Q4Weight]:
    """GGUF block_q8_0 (f16 d, 32 int8 codes c) as two 4-bit parts whose sum is d * c exactly:
    c = 16 * hi + lo with hi in -8..7 and lo in 0..15, so torch's int4 kernel runs it too."""
    import numpy as np

    raw = np.asarray(blocks, dtype=np.uint8).reshape(-1, 34)
    d = torch.from_numpy(raw[:, 0:2].copy().view(np.float16).astype(np.float32).reshape(rows, cols // Q4_GROUP))
    codes = torch.from_numpy(raw[:, 2:].copy().view(np.int8).reshape(rows, cols)).to(torch.int16)
    hi, lo = codes >> 4, codes & 15
    return [Q4Weight((hi + 8).to(torch.uint8), 16 * d, -128 * d), Q4Weight(lo.to(torch.uint8), d, torch.zeros_like(d))]


class CpuLinear(nn.Module):
    """y = x @ W.T on the CPU: bf16 weights, with the file's Q4_1 codes for narrow inputs.

    Only the matmul runs in bf16 (or int4); x and y keep their dtype (f32). Both kernels give a row
    the same result however many rows come with it, which keeps speculation lossless: a verified
    token sees exactly the numbers plain decoding would (the bf16 attention kernel does not, so
    activations, norms and attention stay f32).
    """

    def __init__(self, dense: Tensor, parts: list[Q4Weight] = (), bias: Tensor | None = None):
        super().__init__()
        self.weight = dense.to(torch.bfloat16)  # [N, K]
        self.packed = [_pack(part) for part in parts]  # W = the sum of these 4-bit parts
        self.bias = bias  # f32, added to y in f32 (Qwen2's QKV)

    def forward(self, x: Tensor) -> Tensor:
        rows = x.numel() // x.shape[-1]
        flat = x.reshape(rows, x.shape[-1]).to(torch.bfloat16)
        if self.packed and rows <= MAX_QUANTIZED_ROWS:
            parts = [
                torch.ops.aten._weight_int4pack_mm_for_cpu(flat, codes, Q4_GROUP, scale_zero)
                for codes, scale_zero in self.packed
            ]
            y = parts[0] if len(parts) == 1 else sum(part.float() for part in parts)
        else:
            y = nn.functional.linear(flat, self.weight)
        y = y.view(*x.shape[:-1], y.shape[-1]).to(x.dtype)
        return y if self.bias is None else y + self.bias


def _pack(q4: Q4Weight) -> tuple[Tensor, Tensor]:
    codes = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q4.codes.to(torch.int32).contiguous(), 1)
    zero = q4.min + 8 * q4.scale
    # [K / 32, N, 2] in bf16: the layout and type _weight_int4pack_mm_for_cpu reads
    return codes, torch.stack([q4.scale, zero], -1).transpose(0, 1).contiguous().to(torch.bfloat16)

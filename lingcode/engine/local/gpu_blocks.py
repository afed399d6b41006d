"""The weight formats the GPU's decode and verify step (triton_step.py) reads: GGUF blocks, repacked.

A batch-1 decode step reads every weight once, so its floor is the weights' bytes over memory
bandwidth: reading a Q4_K_M file's own 4.5-6.5 bits per weight instead of a dense bf16 copy's 16
is the whole point. The file's block layouts are made for llama.cpp's kernels, not for a Triton
GEMV, so each matrix is repacked once at load (on the device, from the file's raw bytes) into
one layout every format shares, and this module holds both sides of it: the repacking (torch) and
the Triton helpers that load a block of rows and dot it with an input row. Nothing is rounded:
a weight is exactly the value gguf's dequantization gives.

Every format is a code q of 4 + hi_bits bits per weight, and per group of `group` weights
    w = d * sc * (q - zero) + dmin * m
with d (and dmin) per super-block of `super_` weights, sc and m small integers per group (K-quants;
1 where the format has none), and dmin * m absent in symmetric formats. The layout, per matrix
of [N, K] weights, row-major, G = K / group groups a row:
  q   int32 [N, K / 8]: the low 4 bits of 8 codes a word. Word w of a group holds its weights
      w, w + WPG, ..., w + 7 * WPG (WPG = group / 8 words a group) at bits 0, 4, ..., 28, so
      nibble i of a group's WPG words are WPG consecutive weights: the input for one nibble of
      every word is one contiguous load.
  qh  int32: the code bits past the low 4. hi_bits 4 (Q8_0): a word per q word, laid out alike;
      hi_bits 1 or 2 (Q5_0, Q5_1, Q5_K, Q6_K): one word a group, weight e's bits at e * hi_bits.
  d   f16 [N, K / super_, 1 + mins]: the file's d (and dmin, negated for K-quants, whose weight
      subtracts it; the file's m for Q4_1 / Q5_1), as stored.
  s   int8 [N, G, group_scales * (1 + mins)]: the K-quants' 6-bit (Q6_K: 8-bit) sc (and m).
So each format reads its file's bytes give or take a few percent (Q4_K: 4.625 bits a weight
against 4.5; Q6_K, Q5_0, Q8_0, Q4_1 exactly theirs). Matrices in other formats (F16, BF16, F32, a
Hugging Face checkpoint) stay the model's dense rows ("dense", spec 0).

The GEMV (gemv_row) sums each word's codes times their inputs, then scales those sums by their
group's d * sc, exact in f32 (an f16 times an integer of at most 8 bits), as is q - zero (a code
turned float by or-ing it into 2^23's mantissa: no int-to-float conversion, which runs at a
quarter rate); an asymmetric format adds dmin * m times the inputs' sum. The order of every sum is
fixed by the layout alone, never by how many rows a step has, so a verify step's rows get the bits
a one-token step gets (triton_step.py's module doc).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import triton
import triton.language as tl


@dataclass(frozen=True)
class BlockFormat:
    """A GGUF block format as this module repacks it (see the module doc for the layout)."""

    name: str
    ggml_type: int  # ggml's type id (GgufTensor.type)
    block: int  # weights per file block
    type_size: int  # bytes per file block
    group: int  # weights per sc (and m): 32, 16 for Q6_K
    super_: int  # weights per d (and dmin): the file's block
    hi_bits: int  # code bits past the low 4
    zero: int  # subtracted from the unsigned code (symmetric formats)
    group_scales: bool = False  # an integer sc per group multiplies d (K-quants)
    mins: bool = False  # w gets dmin (times the group's m, K-quants) added

    @property
    def spec(self) -> int:
        """The format as one integer, the kernels' compile-time SPEC (load_weight and gemv_row
        decode its fields; 0 is a dense matrix)."""
        return (
            1
            + 2 * self.group
            + 256 * self.hi_bits
            + 2048 * self.zero
            + (1 << 20) * self.group_scales
            + (1 << 21) * self.mins
            + (1 << 22) * (self.super_ // self.group)
        )

    def bits_per_weight(self) -> float:
        scales = 16 * (1 + self.mins) / self.super_ + 8 * self.group_scales * (1 + self.mins) / self.group
        return 4 + self.hi_bits + scales


FORMATS = {
    f.ggml_type: f
    for f in (
        BlockFormat("Q4_0", 2, 32, 18, 32, 32, 0, 8),
        BlockFormat("Q4_1", 3, 32, 20, 32, 32, 0, 0, mins=True),
        BlockFormat("Q5_0", 6, 32, 22, 32, 32, 1, 16),
        BlockFormat("Q5_1", 7, 32, 24, 32, 32, 1, 0, mins=True),
        BlockFormat("Q8_0", 8, 32, 34, 32, 32, 4, 128),
        BlockFormat("Q4_K", 12, 256, 144, 32, 256, 0, 0, group_scales=True, mins=True),
        BlockFormat("Q5_K", 13, 256, 176, 32, 256, 1, 0, group_scales=True, mins=True),
        BlockFormat("Q6_K", 14, 256, 210, 16, 256, 2, 32, group_scales=True),
    )
}
BY_NAME = {f.name: f for f in FORMATS.values()}
DENSE = 0  # the spec of a dense matrix: the model's own rows


@dataclass
class PackedMatrix:
    """One [rows, cols] weight as the Triton step reads it: the four tensors of the module doc
    (a dense matrix: its rows four times) and the format's spec."""

    q: torch.Tensor
    qh: torch.Tensor
    d: torch.Tensor
    s: torch.Tensor
    spec: int
    rows: int
    cols: int
    format: str

    @property
    def args(self) -> tuple[torch.Tensor, ...]:
        return self.q, self.qh, self.d, self.s

    @property
    def nbytes(self) -> int:
        if self.spec == DENSE:
            return self.q.numel() * self.q.element_size()
        return sum(t.numel() * t.element_size() for t in {id(t): t for t in self.args}.values())


def dense(weight: torch.Tensor) -> PackedMatrix:
    """A dense [rows, cols] weight (a contiguous view of the model's own) in the step's terms."""
    assert weight.is_contiguous()
    return PackedMatrix(weight, weight, weight, weight, DENSE, weight.shape[0], weight.shape[1], "dense")


# --- repacking (torch, on any device) ------------------------------------------------------------


def _f16(raw: torch.Tensor) -> torch.Tensor:
    """Little-endian f16 bytes [..., 2] as f16 [...]."""
    return raw.contiguous().view(torch.float16)[..., 0]


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """ggml's 32-weight nibble order: bytes [..., 16] -> codes [..., 32], low nibbles first."""
    return torch.cat([qs & 15, qs >> 4], dim=-1)


def _bits(raw: torch.Tensor) -> torch.Tensor:
    """Little-endian bit fields: bytes [..., n] -> bits [..., 8n], bit j of the bytes at j."""
    shifts = torch.arange(8, device=raw.device, dtype=torch.uint8)
    return ((raw[..., None] >> shifts) & 1).flatten(-2)


def _k_scales(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K / Q5_K's 12 bytes of 6-bit scales and mins -> sc, m [..., 8] (gguf's get_scale_min)."""
    d, m, md = scales[..., 0:4], scales[..., 4:8], scales[..., 8:12]
    sc = torch.cat([d & 63, (md & 15) | ((d >> 2) & 48)], dim=-1)
    mn = torch.cat([m & 63, (md >> 4) | ((m >> 2) & 48)], dim=-1)
    return sc, mn


def _decode(fmt: BlockFormat, b: torch.Tensor):
    """Blocks [rows, blocks, type_size] uint8 -> codes [rows, blocks, block] (unsigned), d, dmin
    [rows, blocks] f16 (dmin: what w adds, times m), sc, m [rows, blocks, groups] (or None)."""
    sc = mn = dmin = None
    name = fmt.name
    if name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1"):
        d = _f16(b[..., 0:2])
        at = 2
        if fmt.mins:
            dmin, at = _f16(b[..., 2:4]), 4
        hi = None
        if fmt.hi_bits:
            hi, at = _bits(b[..., at : at + 4]), at + 4
        codes = _nibbles(b[..., at : at + 16])
        if hi is not None:
            codes = codes | (hi << 4)
    elif name == "Q8_0":
        d, codes = _f16(b[..., 0:2]), b[..., 2:34] ^ 0x80  # int8 c -> c + 128
    elif name in ("Q4_K", "Q5_K"):
        d, dmin = _f16(b[..., 0:2]), -_f16(b[..., 2:4])  # w = d * sc * q - dmin * m
        sc, mn = _k_scales(b[..., 4:16])
        at = 16
        hi = None
        if fmt.hi_bits:  # Q5_K: bit g of byte e is group g's weight e
            hi, at = _bits(b[..., 16:48]).unflatten(-1, (32, 8)).transpose(-1, -2), 48
        qs = b[..., at : at + 128].unflatten(-1, (4, 32))  # groups 2c (low nibbles) and 2c + 1 (high)
        codes = torch.stack([qs & 15, qs >> 4], dim=-2).flatten(-3, -2)  # [.., 8, 32]
        if hi is not None:
            codes = codes | (hi << 4)
        codes = codes.flatten(-2)
    elif name == "Q6_K":
        ql, qh = b[..., 0:128], b[..., 128:192]
        sc, d = b[..., 192:208].view(torch.int8), _f16(b[..., 208:210])
        shifts = torch.tensor([0, 4], device=b.device, dtype=torch.uint8)
        low = ((ql.unflatten(-1, (2, 1, 64)) >> shifts[:, None]) & 15).flatten(-3)  # gguf's order
        shifts = torch.tensor([0, 2, 4, 6], device=b.device, dtype=torch.uint8)
        high = ((qh.unflatten(-1, (2, 1, 32)) >> shifts[:, None]) & 3).flatten(-3)
        codes = low | (high << 4)
    else:  # pragma: no cover - FORMATS lists what is here
        raise ValueError(f"no decoder for {name}")
    return codes, d, dmin, sc, mn


def _int32(words: torch.Tensor) -> torch.Tensor:
    """Unsigned 32-bit values held in int64 -> the same bits as int32."""
    return (((words + 2**31) % 2**32) - 2**31).to(torch.int32)


def repack(raw, rows: int, cols: int, ggml_type: int, device=None) -> PackedMatrix:
    """A matrix's GGUF blocks (bytes, row-major: each row's blocks in turn) in the module doc's
    layout, on `device` (the blocks' own by default). Repacked where they are: on the GPU in
    moments, however large the matrix."""
    fmt = FORMATS[ggml_type]
    if cols % fmt.block:
        raise ValueError(f"{fmt.name}: {cols} columns are not whole {fmt.block}-weight blocks")
    raw = torch.as_tensor(np.asarray(raw, dtype=np.uint8) if not isinstance(raw, torch.Tensor) else raw)
    b = raw.to(device).view(rows, cols // fmt.block, fmt.type_size)
    codes, d, dmin, sc, mn = _decode(fmt, b)
    groups, wpg = cols // fmt.group, fmt.group // 8
    c = codes.reshape(rows, groups, 8, wpg).to(torch.int64)  # nibble i of word w: weight i * WPG + w
    nibble = torch.arange(8, device=c.device)[:, None] * 4
    q = _int32(((c & 15) << nibble).sum(2)).view(rows, cols // 8)
    if fmt.hi_bits == 4:
        qh = _int32(((c >> 4) << nibble).sum(2)).view(rows, cols // 8)
    elif fmt.hi_bits:
        e = torch.arange(fmt.group, device=c.device) * fmt.hi_bits
        qh = _int32(((codes.reshape(rows, groups, fmt.group).to(torch.int64) >> 4) << e).sum(-1))
    else:
        qh = q
    d_parts = [d] if dmin is None else [d, dmin]
    d = torch.stack([p.reshape(rows, cols // fmt.super_) for p in d_parts], dim=-1).contiguous()
    s = d
    if fmt.group_scales:
        s_parts = [sc] if mn is None else [sc, mn]
        s = torch.stack([p.reshape(rows, groups).to(torch.int8) for p in s_parts], dim=-1).contiguous()
    return PackedMatrix(q.contiguous(), qh.contiguous(), d, s, fmt.spec, rows, cols, fmt.name)


def dequantize(m: PackedMatrix) -> torch.Tensor:
    """The f32 weights [rows, cols] of a packed matrix: what gemv_row multiplies by, and what
    gguf.quants.dequantize gives for the file's blocks (the tests hold the two to each other)."""
    if m.spec == DENSE:
        return m.q.float()
    fmt = BY_NAME[m.format]
    rows, groups, wpg = m.rows, m.cols // fmt.group, fmt.group // 8
    nibble = torch.arange(8, device=m.q.device)[:, None] * 4
    words = m.q.view(rows, groups, 1, wpg).to(torch.int64)
    codes = (words >> nibble) & 15  # [rows, groups, 8, wpg]: weight i * wpg + w
    if fmt.hi_bits == 4:
        codes |= ((m.qh.view(rows, groups, 1, wpg).to(torch.int64) >> nibble) & 15) << 4
    elif fmt.hi_bits:
        e = (torch.arange(8, device=m.q.device)[:, None] * wpg + torch.arange(wpg, device=m.q.device)) * fmt.hi_bits
        codes |= ((m.qh.view(rows, groups, 1, 1).to(torch.int64) >> e) & (2**fmt.hi_bits - 1)) << 4
    codes = codes.reshape(rows, groups, fmt.group).float() - fmt.zero
    per = fmt.super_ // fmt.group
    d = m.d.float().repeat_interleave(per, dim=1)  # [rows, groups, 1 + mins]
    scale = d[..., 0] * (m.s[..., 0].float() if fmt.group_scales else 1.0)
    w = codes * scale[..., None]
    if fmt.mins:
        w = w + (d[..., 1] * (m.s[..., 1].float() if fmt.group_scales else 1.0))[..., None]
    return w.reshape(rows, m.cols)


# Where a block's f16 fields are, and what its code's spread is, for random_blocks: (d's byte, the
# second field's byte or None, the std of a weight over d, the mean code).
_RANDOM = {"Q4_0": (0, None, 4.6, 0), "Q4_1": (0, 2, 4.6, 7.5), "Q5_0": (0, None, 9.2, 0),
           "Q5_1": (0, 2, 9.2, 15.5), "Q8_0": (0, None, 74.0, 0), "Q4_K": (0, 2, 270.0, 7.5),
           "Q5_K": (0, 2, 550.0, 15.5), "Q6_K": (208, None, 18.5 * 74, 0)}  # fmt: skip


def random_blocks(ggml_type: int, rows: int, cols: int, std: float, generator: torch.Generator) -> torch.Tensor:
    """Random GGUF blocks [rows, bytes a row] whose weights have about mean 0 and the given std:
    random codes (and K-quant scales), d drawn around std / the code's spread, and an
    asymmetric format's min set against the mean code. For tests and benchmarks (gguf's quantize
    has no K-quants, and GPU machines may lack gguf)."""
    fmt = FORMATS[ggml_type]
    blocks, device = cols // fmt.block, generator.device  # made where the generator is (a GPU's: fast)
    raw = torch.randint(0, 256, (rows, blocks, fmt.type_size), generator=generator, dtype=torch.uint8, device=device)
    at_d, at_min, spread, mean_code = _RANDOM[fmt.name]
    d = std / spread * (0.5 + torch.rand(rows, blocks, generator=generator, device=device))
    fields = [(at_d, d)]
    if at_min is not None:  # Q4_1 / Q5_1 store the min itself, K-quants a dmin that m multiplies
        fields.append((at_min, -mean_code * d if not fmt.group_scales else mean_code * d))
    for at, value in fields:
        raw[..., at : at + 2] = value.to(torch.float16).view(torch.uint8).view(rows, blocks, 2)
    return raw.view(rows, blocks * fmt.type_size)


MATRICES = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")


def pack_gguf(config, path: Path, tensors: dict, device, names=None) -> dict[str, PackedMatrix]:
    """The GGUF's matrices in a format FORMATS has, repacked on `device`, by our names
    ("layers.N.wq", ..., "output": the head, the embeddings' when tied). `tensors`:
    Checkpoint.gguf_tensors. Matrices in other formats are left out (the step reads those dense).
    Q/K rows that llama.cpp permuted for interleaved RoPE are put back (weights.py does the same)."""
    from lingcode.engine.local.weights import _rope_rows, _unpermute_order

    if names is None:
        names = [f"layers.{i}.{n}" for i in range(config.n_layers) for n in MATRICES] + ["output"]
    packed = {}
    for name in names:
        source = "tok_embeddings" if name == "output" and config.tied_embeddings else name
        t = tensors.get(source)
        if t is None or t.type not in FORMATS:
            continue
        fmt = FORMATS[t.type]
        row_bytes = t.cols // fmt.block * fmt.type_size
        raw = torch.from_numpy(np.fromfile(path, dtype=np.uint8, count=t.rows * row_bytes, offset=t.offset))
        raw = raw.view(t.rows, row_bytes)
        heads = _rope_rows(name, config)
        if heads is not None:
            raw = raw[_unpermute_order(t.rows, heads)]
        packed[name] = repack(raw.to(device), t.rows, t.cols, t.type)
    return packed


def pack_checkpoint(checkpoint, device) -> dict[str, PackedMatrix]:
    """pack_gguf for a loaded checkpoint; nothing for one without a GGUF (a Hugging Face directory)."""
    if checkpoint.gguf_path is None:
        return {}
    return pack_gguf(checkpoint.config, checkpoint.gguf_path, checkpoint.gguf_tensors, device)


# --- the GEMV (Triton) -----------------------------------------------------------------------------


@triton.jit
def _round(x, dtype):
    """x rounded to the activation dtype, kept in fp32: where the torch path stores a tensor."""
    return x.to(dtype).to(tl.float32)


@triton.jit
def _load_rows(ptr, rows, rows_ok, K: tl.constexpr, BLOCK_K: tl.constexpr):
    """Whole rows of a row-major [*, K] matrix: [len(rows), BLOCK_K >= K], zero past K and in
    rows that are not ok. One load per matrix, so that a program waits for memory once."""
    k = tl.arange(0, BLOCK_K)
    return tl.load(ptr + rows[:, None] * K + k[None, :], mask=rows_ok[:, None] & (k < K)[None, :], other=0.0)


@triton.jit
def _rms_norm(x, norm_ptr, eps, K: tl.constexpr, BLOCK_K: tl.constexpr):
    """F.rms_norm of the row of x [1, BLOCK_K] (zero past K), rounded to x's dtype like torch's."""
    k = tl.arange(0, BLOCK_K)
    weight = tl.load(norm_ptr + k, mask=k < K, other=0.0).to(tl.float32)
    xf = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xf * xf, axis=1) / K + eps)
    return (xf * rstd[:, None] * weight[None, :]).to(x.dtype)


@triton.jit
def _matmul(a, w):
    """a [1, K] @ w [BLOCK_N, K]^T, in fp32: a broadcast multiply and row sums."""
    return tl.sum(a.to(tl.float32) * w.to(tl.float32), axis=1)[None, :]


@triton.jit
def load_weight(q_ptr, qh_ptr, d_ptr, s_ptr, rows, rows_ok, K: tl.constexpr, BLOCK_K: tl.constexpr, SPEC: tl.constexpr):
    """Rows `rows` of a matrix (zero where not rows_ok), as gemv_row takes them: dense, its rows
    [BLOCK_N, BLOCK_K] (four times); packed, (low code words [BLOCK_N, G, WPG], high ones, d * sc
    and the offset dmin * m [BLOCK_N, G, 1] in f32), G = BLOCK_K / group (a power of two >= the
    row's groups). All of it in one go: the program then waits for memory once."""
    if SPEC == 0:
        w = _load_rows(q_ptr, rows, rows_ok, K, BLOCK_K)
        lo, hi, scale, offset = w, w, w, w
    else:
        GROUP: tl.constexpr = SPEC // 2 % 128
        HI_BITS: tl.constexpr = SPEC // 256 % 8
        GROUP_SCALES: tl.constexpr = SPEC // (1 << 20) % 2
        MINS: tl.constexpr = SPEC // (1 << 21) % 2
        PER_SUPER: tl.constexpr = SPEC // (1 << 22)
        WPG: tl.constexpr = GROUP // 8
        GROUPS: tl.constexpr = K // GROUP
        ND: tl.constexpr = 1 + MINS
        NS: tl.constexpr = GROUP_SCALES * (1 + MINS)
        g = tl.arange(0, BLOCK_K // GROUP)[None, :, None]
        w = tl.arange(0, WPG)[None, None, :]
        r = rows[:, None, None]
        ok = rows_ok[:, None, None] & (g < GROUPS)
        lo = tl.load(q_ptr + r * (K // 8) + g * WPG + w, mask=ok, other=0)
        hi = lo
        if HI_BITS == 4:
            hi = tl.load(qh_ptr + r * (K // 8) + g * WPG + w, mask=ok, other=0)
        elif HI_BITS > 0:
            hi = tl.load(qh_ptr + r * GROUPS + g, mask=ok, other=0)
        at_d = (r * (GROUPS // PER_SUPER) + g // PER_SUPER) * ND
        scale = tl.load(d_ptr + at_d, mask=ok, other=0.0).to(tl.float32)
        offset = scale
        at_s = (r * GROUPS + g) * NS
        if GROUP_SCALES:
            scale = scale * tl.load(s_ptr + at_s, mask=ok, other=0).to(tl.float32)
        if MINS:
            offset = tl.load(d_ptr + at_d + 1, mask=ok, other=0.0).to(tl.float32)
            if GROUP_SCALES:
                offset = offset * tl.load(s_ptr + at_s + 1, mask=ok, other=0).to(tl.float32)
    return lo, hi, scale, offset


@triton.jit
def _codes(lo, hi, w, i: tl.constexpr, WPG: tl.constexpr, HI_BITS: tl.constexpr, ZERO: tl.constexpr):
    """q - zero of nibble i of every word, in f32: the code or-ed into the mantissa of 2^23 (an
    exact float, no conversion instruction), less 2^23 + zero."""
    q = (lo >> (4 * i)) & 15
    if HI_BITS == 4:
        q = q | (((hi >> (4 * i)) & 15) << 4)
    elif HI_BITS > 0:
        q = q | (((hi >> ((i * WPG + w) * HI_BITS)) & (2**HI_BITS - 1)) << 4)
    return (q | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 + ZERO)


@triton.jit
def gemv_row(
    x_ptr,
    m,
    m_ok,
    norm_ptr,
    eps,
    a_lo,
    a_hi,
    a_scale,
    a_offset,
    b_lo,
    b_hi,
    b_scale,
    b_offset,
    K: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPEC: tl.constexpr,
    NORM: tl.constexpr,
    TWO: tl.constexpr,
):
    """Row m of x [*, K] (rms-normed by norm_ptr's weights first if NORM, rounded to x's dtype like
    torch) times the rows of matrix a, and of matrix b if TWO (the same format: the input is loaded
    once for both), as load_weight holds them: [1, BLOCK_N] fp32 each (b's is a's if not TWO)."""
    if SPEC == 0:
        x = _load_rows(x_ptr, m, m_ok, K, BLOCK_K)
        if NORM:
            x = _rms_norm(x, norm_ptr, eps, K, BLOCK_K)
        out_a = _matmul(x, a_lo)
        out_b = out_a
        if TWO:
            out_b = _matmul(x, b_lo)
    else:
        GROUP: tl.constexpr = SPEC // 2 % 128
        HI_BITS: tl.constexpr = SPEC // 256 % 8
        ZERO: tl.constexpr = SPEC // 2048 % 512
        MINS: tl.constexpr = SPEC // (1 << 21) % 2
        WPG: tl.constexpr = GROUP // 8
        dtype = x_ptr.dtype.element_ty
        g = tl.arange(0, BLOCK_K // GROUP)[None, :, None]
        w = tl.arange(0, WPG)[None, None, :]
        row = m[:, None, None] * K
        if NORM:
            xf = _load_rows(x_ptr, m, m_ok, K, BLOCK_K).to(tl.float32)
            rstd = tl.rsqrt(tl.sum(xf * xf, axis=1) / K + eps)[:, None, None]
        acc_a = tl.zeros(a_lo.shape, dtype=tl.float32)
        acc_b = tl.zeros(b_lo.shape, dtype=tl.float32)
        input_sum = tl.zeros([1, BLOCK_K // GROUP, WPG], dtype=tl.float32)
        for i in tl.static_range(8):  # nibble i of every word: the inputs g * GROUP + i * WPG + w
            k = g * GROUP + i * WPG + w
            ok = m_ok[:, None, None] & (k < K)
            a = tl.load(x_ptr + row + k, mask=ok, other=0.0)
            if NORM:  # _rms_norm's arithmetic, element by element
                a = (a.to(tl.float32) * rstd * tl.load(norm_ptr + k, mask=k < K, other=0.0).to(tl.float32)).to(dtype)
            a = a.to(tl.float32)
            acc_a += _codes(a_lo, a_hi, w, i, WPG, HI_BITS, ZERO) * a
            if TWO:
                acc_b += _codes(b_lo, b_hi, w, i, WPG, HI_BITS, ZERO) * a
            if MINS:
                input_sum += a
        out_a = _scaled_sum(acc_a, a_scale, a_offset, input_sum, MINS)
        out_b = out_a
        if TWO:
            out_b = _scaled_sum(acc_b, b_scale, b_offset, input_sum, MINS)
    return out_a, out_b


@triton.jit
def _scaled_sum(acc, scale, offset, input_sum, MINS: tl.constexpr):
    """A row's dot from its per-word sums of (q - zero) * input: times d * sc, plus dmin * m times
    the input's sums, summed over words and groups: [1, BLOCK_N]."""
    acc = acc * scale
    if MINS:
        acc += input_sum * offset
    return tl.sum(tl.sum(acc, axis=2), axis=1)[None, :]

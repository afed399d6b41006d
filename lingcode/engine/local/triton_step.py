"""The captured decode/verify step as hand-written Triton kernels: five per layer instead of ~20.

At batch 1 a step of a small model is bound by latency, not by bandwidth: even replayed from a
CUDA graph, each kernel costs a few microseconds however little it reads, and a kernel that waits
for memory several times in a row costs several memory latencies. So each kernel here does a
whole stage of the layer, and each program loads everything it needs at once:

  norm_qkv_rope      x -> rmsnorm -> @ Wq, Wk, Wv^T (+ bias) (-> per-head rmsnorm) -> RoPE on q and
                     k; k, v into the KV cache, q to a buffer
  attention          the W queries against cache entries [0, kv_len), causal by position, GQA, split
                     over the cache (flash-decoding); the last split to finish combines the splits
  out_proj_residual  x += attn @ Wo^T
  norm_gate_up       rmsnorm(x) @ [Wgate; Wup]^T, then silu(gate) * up
  down_residual      x += h @ Wdown^T   (the same kernel as out_proj_residual: matmul_residual)

plus the token embedding (torch) and norm_lm_head (final norm + logits). Each program owns
BLOCK_N rows of a weight and loads them whole, K included, in one go, and computes input rows with
them in turn (ROWS of them; a one-token step computes one).

Weights: a GGUF's matrices are read as the file's quantized blocks, repacked once at load
(gpu_blocks.py, which holds every block format this step reads and its GEMV), so a step reads
about the file's bytes, not a dense bf16 copy's; matrices in other formats (and a Hugging Face
checkpoint's) are the model's dense rows. Each matrix has its own format (a Q4_K_M file mixes
Q4_K and Q6_K within a layer's Q/K/V), so the Q, K and V rows are three matrices, and so are
gate and up. What an architecture adds to Llama's layer (weights.Architecture: Q/K/V biases,
Qwen3's per-head RMSNorm of q and k) comes from cfg.architecture as compile-time flags of
norm_qkv_rope; head dims and q heads per KV head are the config's.

Row by row, so that speculation stays lossless: a verify step over W tokens runs each row through
the very code plain decoding runs for that token (one binary for every W: W is not specialized),
with the same blocks and the same order of sums, so each row's numbers are bit for bit what a
one-token step gives (with tensor-core dots over 16 padded rows, verify steps rounded differently
and a verified draft changed a greedy token on the H200). Tensor-core dots for every step, a
one-token step too, would be exact as well, but were slower than row sums for decode steps
(docs/engine-notes.md), so decoding stays with row sums.
Attention runs one program per query token and split; its splits depend on the cache bucket, so
the engine keeps a verify step within one bucket.

Numerics follow the bf16 torch path (model.py): fp32 accumulation, and a rounding to the
activation dtype wherever torch materializes a tensor (matmul outputs, each RoPE product and sum,
SiLU, residual adds, attention output), so that the two paths write the same KV cache entries
up to accumulation order and can replace each other mid-request. With a GGUF's blocks the weights
are the file's exact values, where the torch path's dense copy rounds them to bf16: the two then
differ by that rounding too.

Programmatic dependent launch (PDL, Hopper and later): each kernel is launched to start while the
one before it is still running. A kernel issues its weight loads first (they depend on nothing),
then waits in `_after_previous_kernel` until the previous kernel has finished and its writes are
visible, and only then reads activations and writes anything. So one kernel's weights stream in
while its predecessor computes, instead of every kernel paying launch plus a cold memory wait. Every
kernel waits (a kernel that did not could finish before the one it depends on), and nothing is
written before the wait, which is what keeps it as exact as a serial launch.

Every shape is fixed by (W, kv_len) and nothing is read back to the host: CUDA graphs capture it.
"""

from __future__ import annotations

import math
import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from lingcode.engine.local.gpu_blocks import DENSE, PackedMatrix, _round, dense, gemv_row, load_weight
from lingcode.engine.local.model import Transformer

try:  # Triton >= 3.4
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - older Triton: serial launches only
    gdc_launch_dependents = gdc_wait = None
_HAS_GDC = tl.constexpr(gdc_wait is not None)

# Triton 3.9's interpreter (TRITON_INTERPRET=1, the CPU tests) multiplies bf16 dot operands as their
# integer bits: there, and for fp32 (which tl.dot would round to tf32), dots run in full fp32.
_INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET") == "1")

MAX_ROWS = 16  # the most tokens a step takes (the attention's split counters are per token)
# GEMV blocks per weight matrix, (BLOCK_N, num_warps), for every step width. BLOCK_N counts output
# rows, row pairs for qkv and gate/up. Decoding wants many small programs, each waiting on little
# memory (the H200 has 132 SMs). The fastest of a sweep on an H200 (bench/triton_blocks.py; notes),
# for SmolLM2-135M's dense rows; wider rows get fewer of them a program (block_for).
BLOCKS = {
    "qkv": (4, 2),  # 480 RoPE row pairs (960 rows) of 576
    "wo": (4, 4),  # 576 rows of 576
    "gate_up": (4, 2),  # 1536 gate/up row pairs (3072 rows) of 576
    "down": (4, 8),  # 576 rows of 1536
    "lm_head": (8, 4),  # 49152 rows of 576
}
# The most weights (K padded to a power of two) a program holds: the table's blocks for 576-wide
# rows are at this bound. Packed rows too: the 1.5B's gate/up in programs of half as many (2 row
# pairs) were the faster on an H100, though packed weights take fewer registers (bench/gpu_blocks.py).
WEIGHTS_PER_PROGRAM = 8192
# Packed weights: code words a thread holds. Each costs ~15 registers with its share of the
# unpacking, scales and inputs (ptxas for sm_90): 8 keeps a program near 120 and clear of spills.
WORDS_PER_THREAD = 8
# Rows of x a GEMV program computes in turn, its weight block loaded once, per weight matrix: the
# fastest verify steps of 1, 2, 4 and 8 on an H200 (bench/triton_vs_torch.py; docs/engine-notes.md)
ROWS = {"qkv": 2, "wo": 2, "gate_up": 2, "down": 2, "lm_head": 2}
ATTN_BLOCK_KV = 128  # cache entries per attention tile
ATTN_MAX_SPLITS = 16  # cache splits per KV head (48 programs at most), so few partial results to combine


@triton.jit
def _dot(a, b):
    if _INTERPRETED or a.dtype == tl.float32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def _row(i, W):
    """Input row i as a [1] vector, and its mask (always true: the masks want a vector)."""
    m = i + tl.arange(0, 1)
    return m, m < W


@triton.jit
def _fence():
    """CUDA's __threadfence(): this thread's global writes are visible to every SM before its next
    memory operation. (The interpreter runs programs one at a time and needs none.)"""
    if not _INTERPRETED:
        tl.inline_asm_elementwise("fence.sc.gpu; mov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _after_previous_kernel():
    """Wait until the kernel before this one in the stream has finished and its writes are visible,
    then let the next kernel start (PDL; see the module doc). Without PDL the wait returns at once:
    the launch itself waited. The interpreter runs kernels one after another and has no such op."""
    if _HAS_GDC and not _INTERPRETED:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def _add_residual(x_ptr, m, m_ok, n, n_ok, acc, D: tl.constexpr):
    """x[m, n] += acc, rounding like torch: the matmul's output, then the sum."""
    ptrs = x_ptr + m[:, None] * D + n[None, :]
    ok = m_ok[:, None] & n_ok[None, :]
    x = tl.load(ptrs, mask=ok, other=0.0)
    tl.store(ptrs, (x.to(tl.float32) + _round(acc, x.dtype)).to(x.dtype), mask=ok)


@triton.jit(do_not_specialize=["W", "ROWS"])  # one binary for every width
def norm_qkv_rope_kernel(
    x_ptr,
    norm_ptr,
    wq,
    wq_hi,
    wq_d,
    wq_s,
    wk,
    wk_hi,
    wk_d,
    wk_s,
    wv,
    wv_hi,
    wv_d,
    wv_s,
    bias_ptr,
    q_norm_ptr,
    k_norm_ptr,
    cos_ptr,
    sin_ptr,
    pos_ptr,
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    W,
    ROWS,
    max_len,
    eps,
    D: tl.constexpr,
    N_HEADS: tl.constexpr,
    N_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPEC_Q: tl.constexpr,
    SPEC_K: tl.constexpr,
    SPEC_V: tl.constexpr,
    BIAS: tl.constexpr,
    QK_NORM: tl.constexpr,
):
    """q, k, v of row m of x: the first programs compute q's rows, then k's, then v's (each matrix
    in its own format). bias_ptr: the fused [q; k; v] bias (if BIAS)."""
    HALF: tl.constexpr = HEAD_DIM // 2
    PROGRAMS_Q: tl.constexpr = (N_HEADS * HALF + BLOCK_N - 1) // BLOCK_N
    PROGRAMS_KV: tl.constexpr = (N_KV_HEADS * HALF + BLOCK_N - 1) // BLOCK_N
    program = tl.program_id(0)
    if program < PROGRAMS_Q:
        _qkv_part(
            program,
            x_ptr,
            norm_ptr,
            wq,
            wq_hi,
            wq_d,
            wq_s,
            bias_ptr,
            q_norm_ptr,
            cos_ptr,
            sin_ptr,
            pos_ptr,
            q_ptr,
            W,
            ROWS,
            max_len,
            eps,
            0,
            D,
            N_HEADS,
            HEAD_DIM,
            BLOCK_N,
            BLOCK_K,
            SPEC_Q,
            BIAS,
            QK_NORM,
        )
    elif program < PROGRAMS_Q + PROGRAMS_KV:
        _qkv_part(
            program - PROGRAMS_Q,
            x_ptr,
            norm_ptr,
            wk,
            wk_hi,
            wk_d,
            wk_s,
            bias_ptr + N_HEADS * HEAD_DIM,
            k_norm_ptr,
            cos_ptr,
            sin_ptr,
            pos_ptr,
            k_cache_ptr,
            W,
            ROWS,
            max_len,
            eps,
            1,
            D,
            N_KV_HEADS,
            HEAD_DIM,
            BLOCK_N,
            BLOCK_K,
            SPEC_K,
            BIAS,
            QK_NORM,
        )
    else:
        _qkv_part(
            program - PROGRAMS_Q - PROGRAMS_KV,
            x_ptr,
            norm_ptr,
            wv,
            wv_hi,
            wv_d,
            wv_s,
            bias_ptr + (N_HEADS + N_KV_HEADS) * HEAD_DIM,
            k_norm_ptr,
            cos_ptr,
            sin_ptr,
            pos_ptr,
            v_cache_ptr,
            W,
            ROWS,
            max_len,
            eps,
            2,
            D,
            N_KV_HEADS,
            HEAD_DIM,
            BLOCK_N,
            BLOCK_K,
            SPEC_V,
            BIAS,
            QK_NORM,
        )


@triton.jit
def _qkv_part(
    program,
    x_ptr,
    norm_ptr,
    w,
    w_hi,
    w_d,
    w_s,
    bias_ptr,
    head_norm_ptr,
    cos_ptr,
    sin_ptr,
    pos_ptr,
    out_ptr,
    W,
    ROWS,
    max_len,
    eps,
    PART: tl.constexpr,
    D: tl.constexpr,
    HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPEC: tl.constexpr,
    BIAS: tl.constexpr,
    QK_NORM: tl.constexpr,
):
    """PART 0 (q: to out [W, HEADS * HEAD_DIM]), 1 (k) or 2 (v: into the cache out [HEADS, max_len,
    HEAD_DIM] at the row's position). A program owns BLOCK_N row pairs (j, j + HEAD_DIM/2) of some
    heads: the two halves that rotate-half RoPE mixes, so RoPE fits in the epilogue; with QK_NORM
    one whole head (BLOCK_N = HEAD_DIM/2), whose RMSNorm it then computes."""
    HALF: tl.constexpr = HEAD_DIM // 2
    pair = program * BLOCK_N + tl.arange(0, BLOCK_N)
    pair_ok = pair < HEADS * HALF
    head, j = pair // HALF, pair % HALF
    row_lo = head * HEAD_DIM + j
    # the weights first: the longest wait
    lo_q, lo_qh, lo_scale, lo_offset = load_weight(w, w_hi, w_d, w_s, row_lo, pair_ok, D, BLOCK_K, SPEC)
    hi_q, hi_qh, hi_scale, hi_offset = load_weight(w, w_hi, w_d, w_s, row_lo + HALF, pair_ok, D, BLOCK_K, SPEC)
    if BIAS:
        bias_lo = tl.load(bias_ptr + row_lo, mask=pair_ok, other=0.0).to(tl.float32)[None, :]
        bias_hi = tl.load(bias_ptr + row_lo + HALF, mask=pair_ok, other=0.0).to(tl.float32)[None, :]
    if QK_NORM:
        if PART < 2:
            norm_lo = tl.load(head_norm_ptr + j).to(tl.float32)[None, :]
            norm_hi = tl.load(head_norm_ptr + j + HALF).to(tl.float32)[None, :]
    _after_previous_kernel()
    dtype = x_ptr.dtype.element_ty
    first = tl.program_id(1) * ROWS
    for row in range(first, tl.minimum(first + ROWS, W)):  # rows first.. of x, with the weights loaded once
        m, m_ok = _row(row, W)
        pos = tl.load(pos_ptr + m, mask=m_ok, other=0)
        lo, hi = gemv_row(
            x_ptr,
            m,
            m_ok,
            norm_ptr,
            eps,
            lo_q,
            lo_qh,
            lo_scale,
            lo_offset,
            hi_q,
            hi_qh,
            hi_scale,
            hi_offset,
            D,
            BLOCK_K,
            SPEC,
            True,
            True,
        )  # [1, BLOCK_N] each
        if BIAS:
            lo += bias_lo
            hi += bias_hi
        lo = _round(lo, dtype)  # the projection's output rounding
        hi = _round(hi, dtype)
        if QK_NORM:
            if PART < 2:  # RMSNorm over the head, as model.py's q_norm / k_norm (torch's rounding)
                rstd = tl.rsqrt((tl.sum(lo * lo, axis=1) + tl.sum(hi * hi, axis=1)) / HEAD_DIM + eps)[:, None]
                lo = _round(lo * rstd * norm_lo, dtype)
                hi = _round(hi * rstd * norm_hi, dtype)
        if PART < 2:  # RoPE, as model.py computes it: x * cos + rotate_half(x) * sin, each product and the sum rounded
            angle = pos[:, None] * HEAD_DIM + j[None, :]
            cos_lo = tl.load(cos_ptr + angle).to(tl.float32)
            sin_lo = tl.load(sin_ptr + angle).to(tl.float32)
            cos_hi = tl.load(cos_ptr + angle + HALF).to(tl.float32)
            sin_hi = tl.load(sin_ptr + angle + HALF).to(tl.float32)
            lo, hi = (
                _round(lo * cos_lo, dtype) - _round(hi * sin_lo, dtype),
                _round(hi * cos_hi, dtype) + _round(lo * sin_hi, dtype),
            )
        if PART == 0:
            at = out_ptr + m[:, None] * (HEADS * HEAD_DIM) + row_lo[None, :]
        else:
            at = out_ptr + (head[None, :] * max_len + pos[:, None]) * HEAD_DIM + j[None, :]
        ok = m_ok[:, None] & pair_ok[None, :]
        tl.store(at, lo.to(dtype), mask=ok)
        tl.store(at + HALF, hi.to(dtype), mask=ok)


@triton.jit
def attention_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    pos_ptr,
    part_o_ptr,
    part_m_ptr,
    part_l_ptr,
    out_ptr,
    done_ptr,
    W,
    max_len,
    kv_len,
    split_len,
    splits,
    scale,
    N_HEADS: tl.constexpr,
    N_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_KV: tl.constexpr,
    MAX_SPLITS: tl.constexpr,
    MAX_TOKENS: tl.constexpr,
):
    """Query token w's rows (the q heads sharing one KV head) against one split of the cache,
    entries [split * split_len, +split_len): an unnormalized output, row max and row sum per split.
    The last split of the (head, token) to finish combines them into out [W, N_HEADS * HEAD_DIM]
    (flash-decoding's reduction without a kernel launch of its own) and resets its counter in
    done_ptr for the next step. A token's program is the same whatever W is (see the module doc)."""
    GROUP: tl.constexpr = N_HEADS // N_KV_HEADS
    kv_head, split, w = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    _after_previous_kernel()  # q and this token's cache entries come from the kernel before
    r = tl.arange(0, BLOCK_Q)
    r_ok = r < GROUP
    head = kv_head * GROUP + r
    d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + (w * N_HEADS + head)[:, None] * HEAD_DIM + d[None, :], mask=r_ok[:, None], other=0.0)
    pos = tl.load(pos_ptr + w + 0 * r)  # the token's position, in every row

    # Entries past the token's position are masked: skip their tiles.
    start = split * split_len
    end = tl.minimum(tl.minimum(start + split_len, kv_len), tl.max(pos, axis=0) + 1)
    row_max = tl.full([BLOCK_Q], float("-inf"), tl.float32)
    row_sum = tl.zeros([BLOCK_Q], tl.float32)
    acc = tl.zeros([BLOCK_Q, HEAD_DIM], tl.float32)
    for s0 in range(start, end, BLOCK_KV):
        s = s0 + tl.arange(0, BLOCK_KV)
        at = (kv_head * max_len + s[:, None]) * HEAD_DIM + d[None, :]
        k = tl.load(k_cache_ptr + at, mask=(s < end)[:, None], other=0.0)
        v = tl.load(v_cache_ptr + at, mask=(s < end)[:, None], other=0.0)
        scores = _dot(q, tl.trans(k)) * scale
        scores = tl.where(s[None, :] <= pos[:, None], scores, float("-inf"))  # causal by position
        new_max = tl.maximum(row_max, tl.max(scores, axis=1))
        safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)  # a row with nothing visible yet
        p = tl.exp(scores - safe_max[:, None])
        rescale = tl.exp(row_max - safe_max)
        row_sum = row_sum * rescale + tl.sum(p, axis=1)
        acc = acc * rescale[:, None] + _dot(p.to(v.dtype), v)
        row_max = new_max
    stat = (split * W + w) * N_HEADS + head  # partials are [splits, W, N_HEADS(, HEAD_DIM)]
    tl.store(part_m_ptr + stat, row_max, mask=r_ok)
    tl.store(part_l_ptr + stat, row_sum, mask=r_ok)
    tl.store(part_o_ptr + stat[:, None] * HEAD_DIM + d[None, :], acc, mask=r_ok[:, None])

    # Count this split done once every thread's stores are visible to the SM that combines; the
    # counter's acquire and the barrier after it order that SM's reads (the threadFenceReduction pattern).
    _fence()
    tl.debug_barrier()
    done = done_ptr + kv_head * MAX_TOKENS + w
    if tl.atomic_add(done, 1, sem="acq_rel") == splits - 1:
        tl.atomic_xchg(done, 0)
        top = tl.full([BLOCK_Q], float("-inf"), tl.float32)
        total = tl.zeros([BLOCK_Q], tl.float32)
        acc = tl.zeros([BLOCK_Q, HEAD_DIM], tl.float32)
        n_splits = tl.full([BLOCK_Q], splits, tl.int32)  # a vector: the interpreter rejects scalar masks
        for i in tl.static_range(MAX_SPLITS):  # unrolled, so the loads go out together; .cg: from L2,
            ok = r_ok & (i < n_splits)  # where the other SMs' partials are (L1 is not coherent)
            stat = (i * W + w) * N_HEADS + head
            split_max = tl.load(part_m_ptr + stat, mask=ok, other=float("-inf"), cache_modifier=".cg")
            split_sum = tl.load(part_l_ptr + stat, mask=ok, other=0.0, cache_modifier=".cg")
            split_out = tl.load(
                part_o_ptr + stat[:, None] * HEAD_DIM + d[None, :], mask=ok[:, None], other=0.0, cache_modifier=".cg"
            )
            new_top = tl.maximum(top, split_max)
            safe_top = tl.where(new_top == float("-inf"), 0.0, new_top)
            old_scale, split_scale = tl.exp(top - safe_top), tl.exp(split_max - safe_top)
            total = total * old_scale + split_sum * split_scale
            acc = acc * old_scale[:, None] + split_out * split_scale[:, None]
            top = new_top
        out = acc / tl.where(total == 0.0, 1.0, total)[:, None]  # padding rows have nothing
        tl.store(out_ptr + (w * N_HEADS + head)[:, None] * HEAD_DIM + d[None, :], out.to(q.dtype), mask=r_ok[:, None])


@triton.jit(do_not_specialize=["W", "ROWS"])  # one binary for every width
def matmul_residual_kernel(
    in_ptr,
    w,
    w_hi,
    w_d,
    w_s,
    x_ptr,
    W,
    ROWS,
    D: tl.constexpr,
    K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPEC: tl.constexpr,
):
    """x[:, block] += input @ Weight[block]^T: the attention's out projection (input: attn, K the
    heads' width) and the feed-forward's down projection (input: h, K the FFN width)."""
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < D
    w_q, w_qh, w_scale, w_offset = load_weight(w, w_hi, w_d, w_s, n, n_ok, K, BLOCK_K, SPEC)
    _after_previous_kernel()
    first = tl.program_id(1) * ROWS
    for row in range(first, tl.minimum(first + ROWS, W)):  # rows first.. of x, with the weights loaded once
        m, m_ok = _row(row, W)
        acc, _ = gemv_row(
            in_ptr,
            m,
            m_ok,
            in_ptr,
            0.0,
            w_q,
            w_qh,
            w_scale,
            w_offset,
            w_q,
            w_qh,
            w_scale,
            w_offset,
            K,
            BLOCK_K,
            SPEC,
            False,
            False,
        )
        _add_residual(x_ptr, m, m_ok, n, n_ok, acc, D)


@triton.jit(do_not_specialize=["W", "ROWS"])  # one binary for every width
def norm_gate_up_kernel(
    x_ptr,
    norm_ptr,
    wg,
    wg_hi,
    wg_d,
    wg_s,
    wu,
    wu_hi,
    wu_d,
    wu_s,
    h_ptr,
    W,
    ROWS,
    eps,
    D: tl.constexpr,
    FFN: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPEC_GATE: tl.constexpr,
    SPEC_UP: tl.constexpr,
):
    """h = silu(gate) * up of rmsnorm(x): a program owns gate rows n and the same up rows."""
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < FFN
    g_q, g_qh, g_scale, g_offset = load_weight(wg, wg_hi, wg_d, wg_s, n, n_ok, D, BLOCK_K, SPEC_GATE)
    u_q, u_qh, u_scale, u_offset = load_weight(wu, wu_hi, wu_d, wu_s, n, n_ok, D, BLOCK_K, SPEC_UP)
    _after_previous_kernel()
    dtype = x_ptr.dtype.element_ty
    first = tl.program_id(1) * ROWS
    for row in range(first, tl.minimum(first + ROWS, W)):  # rows first.. of x, with the weights loaded once
        m, m_ok = _row(row, W)
        if SPEC_GATE == SPEC_UP:  # one pass over the input for both
            gate, up = gemv_row(
                x_ptr,
                m,
                m_ok,
                norm_ptr,
                eps,
                g_q,
                g_qh,
                g_scale,
                g_offset,
                u_q,
                u_qh,
                u_scale,
                u_offset,
                D,
                BLOCK_K,
                SPEC_GATE,
                True,
                True,
            )
        else:
            gate, _ = gemv_row(
                x_ptr,
                m,
                m_ok,
                norm_ptr,
                eps,
                g_q,
                g_qh,
                g_scale,
                g_offset,
                g_q,
                g_qh,
                g_scale,
                g_offset,
                D,
                BLOCK_K,
                SPEC_GATE,
                True,
                False,
            )
            up, _ = gemv_row(
                x_ptr,
                m,
                m_ok,
                norm_ptr,
                eps,
                u_q,
                u_qh,
                u_scale,
                u_offset,
                u_q,
                u_qh,
                u_scale,
                u_offset,
                D,
                BLOCK_K,
                SPEC_UP,
                True,
                False,
            )
        gate = _round(gate, dtype)
        up = _round(up, dtype)
        h = _round(gate / (1.0 + tl.exp(-gate)), dtype) * up
        tl.store(h_ptr + m[:, None] * FFN + n[None, :], h.to(dtype), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit(do_not_specialize=["W", "ROWS"])  # one binary for every width
def norm_lm_head_kernel(
    x_ptr,
    norm_ptr,
    w,
    w_hi,
    w_d,
    w_s,
    out_ptr,
    W,
    ROWS,
    N,
    eps,
    D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPEC: tl.constexpr,
):
    """logits = rmsnorm(x) @ Wout^T for the rows n of the (vocabulary-sized) output matrix."""
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    w_q, w_qh, w_scale, w_offset = load_weight(w, w_hi, w_d, w_s, n, n_ok, D, BLOCK_K, SPEC)
    _after_previous_kernel()
    first = tl.program_id(1) * ROWS
    for row in range(first, tl.minimum(first + ROWS, W)):  # rows first.. of x, with the weights loaded once
        m, m_ok = _row(row, W)
        logits, _ = gemv_row(
            x_ptr,
            m,
            m_ok,
            norm_ptr,
            eps,
            w_q,
            w_qh,
            w_scale,
            w_offset,
            w_q,
            w_qh,
            w_scale,
            w_offset,
            D,
            BLOCK_K,
            SPEC,
            True,
            False,
        )
        tl.store(
            out_ptr + m[:, None] * N + n[None, :],
            logits.to(out_ptr.dtype.element_ty),
            mask=m_ok[:, None] & n_ok[None, :],
        )


def attention_splits(kv_len: int) -> tuple[int, int]:
    """(splits, entries per split) of a kv_len-entry cache: whole tiles, at most ATTN_MAX_SPLITS."""
    tiles = triton.cdiv(kv_len, ATTN_BLOCK_KV)
    split_len = triton.cdiv(tiles, min(tiles, ATTN_MAX_SPLITS)) * ATTN_BLOCK_KV
    return triton.cdiv(kv_len, split_len), split_len


class TritonStep:
    """Transformer.forward_static as Triton kernels: the same contract, weights and KV cache.

    One method per kernel. Dense weights and cache buffers are read from the model at each call (a
    graph captures their addresses), so the step stays in step with setup_cache. Outputs and
    scratch tensors are allocated per call, as torch ops do: inside a capture they come from the
    graph's pool. The state kept is the packed weights and the attention's split counters (zero
    between kernels), which graphs captured from this step use: keep the step alive as long as its graphs.

    blocks: the GEMV block table (BLOCKS, every entry used as given); the CPU tests give the
    interpreter larger blocks. Default: BLOCKS, fewer rows a program for wide rows (block_for).
    pdl: launch each kernel to overlap the one before (module doc); default: where the GPU has it.
    rows: rows of a step a GEMV program computes in turn, for every matrix or some (ROWS).
    weights: packed matrices by name (gpu_blocks.pack_gguf: "layers.N.wq", ..., "output"), on the
    model's device; a matrix not in it is read dense from the model.
    """

    def __init__(
        self,
        model: Transformer,
        blocks: dict | None = None,
        pdl: bool | None = None,
        rows: int | dict | None = None,
        weights: dict[str, PackedMatrix] | None = None,
    ):
        cfg = model.cfg
        if cfg.head_dim & (cfg.head_dim - 1) or cfg.n_heads % cfg.n_kv_heads:
            raise ValueError("the Triton step needs a power-of-two head dim and n_heads a multiple of n_kv_heads")
        cache = model.layers[0].attn.kv_cache
        if cache is not None and not (cache.k.is_contiguous() and cache.v.is_contiguous()):
            # the kernels address the cache as [KV, L, D] row-major (the CPU stores keys position-last)
            raise ValueError("the Triton step needs a position-first KV cache: setup_cache(transposed_keys=False)")
        self.model, self.cfg = model, cfg
        self.arch = cfg.architecture
        self.blocks = blocks
        self.weights = dict(weights or {})
        device = model.norm.weight.device
        self.splits_done = torch.zeros(cfg.n_kv_heads * MAX_ROWS, dtype=torch.int32, device=device)
        self.pdl = pdl_supported(device) if pdl is None else pdl
        self.rows = {m: rows for m in ROWS} if isinstance(rows, int) else {**ROWS, **(rows or {})}
        self.launch = {"launch_pdl": True} if self.pdl else {}  # extra launch options of every kernel

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, kv_len: int) -> torch.Tensor:
        """tokens [1, W] at positions [W] (device tensors), attending over the first kv_len cache
        entries; the logits of all W positions [1, W, V]."""
        if tokens.shape[1] > MAX_ROWS:
            raise ValueError(f"the Triton step takes at most {MAX_ROWS} tokens, not {tokens.shape[1]}")
        x = F.embedding(tokens[0], self.model.tok_embeddings.weight)  # [W, D], updated in place
        for layer in self.model.layers:
            q = self.norm_qkv_rope(layer, x, positions)
            attn = self.attention(layer, q, positions, kv_len)
            self.out_proj_residual(layer, attn, x)
            h = self.norm_gate_up(layer, x)
            self.down_residual(layer, h, x)
        return self.norm_lm_head(x)

    def matrix(self, layer, name: str) -> PackedMatrix:
        """A weight as the kernels read it: packed if the step has it, else the model's dense rows
        (a view: wq, wk, wv of the fused wqkv, gate and up of w_gate_up). layer None: the head."""
        if layer is None:
            return self.weights.get("output") or dense(self.model.output.weight)
        index = next(i for i, other in enumerate(self.model.layers) if other is layer)
        packed = self.weights.get(f"layers.{index}.{name}")
        if packed is not None:
            return packed
        cfg = self.cfg
        q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        wqkv, gate_up = layer.attn.wqkv.weight, layer.ffn.w_gate_up.weight
        views = {
            "wq": lambda: wqkv[:q],
            "wk": lambda: wqkv[q : q + kv],
            "wv": lambda: wqkv[q + kv :],
            "wo": lambda: layer.attn.wo.weight,
            "w_gate": lambda: gate_up[: cfg.ffn_dim],
            "w_up": lambda: gate_up[cfg.ffn_dim :],
            "w_down": lambda: layer.ffn.w_down.weight,
        }
        return dense(views[name]())

    def norm_qkv_rope(self, layer, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """q [W, n_heads * head_dim]; k and v go into the layer's cache at positions."""
        cfg, cache, attn = self.cfg, layer.attn.kv_cache, layer.attn
        q = torch.empty(x.shape[0], cfg.n_heads * cfg.head_dim, device=x.device, dtype=x.dtype)
        wq, wk, wv = (self.matrix(layer, name) for name in ("wq", "wk", "wv"))
        half = cfg.head_dim // 2
        # with a per-head norm, a program computes whole heads: one head a program
        block_n, warps = self._block("qkv", [wq, wk, wv], cfg.dim, half if self.arch.qk_norm else None)
        programs = sum(triton.cdiv(heads * half, block_n) for heads in (cfg.n_heads, cfg.n_kv_heads, cfg.n_kv_heads))
        bias = attn.wqkv.bias if self.arch.qkv_bias else x  # x: a placeholder the kernel never reads
        q_norm, k_norm = (attn.q_norm.weight, attn.k_norm.weight) if self.arch.qk_norm else (x, x)
        norm_qkv_rope_kernel[(programs, self._row_groups(x, "qkv"))](
            x,
            layer.attn_norm.weight,
            *wq.args,
            *wk.args,
            *wv.args,
            bias,
            q_norm,
            k_norm,
            self.model.rope_cos,
            self.model.rope_sin,
            positions,
            q,
            cache.k,
            cache.v,
            x.shape[0],
            self.rows["qkv"],
            cache.k.shape[2],
            layer.attn_norm.eps,
            cfg.dim,
            cfg.n_heads,
            cfg.n_kv_heads,
            cfg.head_dim,
            block_n,
            _whole(cfg.dim),
            wq.spec,
            wk.spec,
            wv.spec,
            self.arch.qkv_bias,
            self.arch.qk_norm,
            num_warps=warps,
            **self.launch,
        )
        return q

    def attention(self, layer, q: torch.Tensor, positions: torch.Tensor, kv_len: int) -> torch.Tensor:
        """The attention output [W, n_heads * head_dim] of q over the first kv_len cache entries."""
        cfg, cache = self.cfg, layer.attn.kv_cache
        width = q.shape[0]
        splits, split_len = attention_splits(kv_len)
        f32 = dict(device=q.device, dtype=torch.float32)
        part_out = torch.empty(splits, width, cfg.n_heads, cfg.head_dim, **f32)
        part_max = torch.empty(splits, width, cfg.n_heads, **f32)
        part_sum = torch.empty(splits, width, cfg.n_heads, **f32)
        out = torch.empty_like(q)
        block_q = max(16, triton.next_power_of_2(cfg.n_heads // cfg.n_kv_heads))  # tl.dot: >= 16 rows
        attention_kernel[(cfg.n_kv_heads, splits, width)](
            q,
            cache.k,
            cache.v,
            positions,
            part_out,
            part_max,
            part_sum,
            out,
            self.splits_done,
            width,
            cache.k.shape[2],
            kv_len,
            split_len,
            splits,
            1.0 / math.sqrt(cfg.head_dim),
            cfg.n_heads,
            cfg.n_kv_heads,
            cfg.head_dim,
            block_q,
            ATTN_BLOCK_KV,
            ATTN_MAX_SPLITS,
            MAX_ROWS,
            num_warps=4,
            **self.launch,
        )
        return out

    def out_proj_residual(self, layer, attn: torch.Tensor, x: torch.Tensor) -> None:
        self._matmul_residual("wo", attn, self.matrix(layer, "wo"), x)

    def norm_gate_up(self, layer, x: torch.Tensor) -> torch.Tensor:
        """h = silu(gate) * up [W, ffn_dim]."""
        cfg = self.cfg
        h = torch.empty(x.shape[0], cfg.ffn_dim, device=x.device, dtype=x.dtype)
        gate, up = self.matrix(layer, "w_gate"), self.matrix(layer, "w_up")
        block_n, warps = self._block("gate_up", [gate, up], cfg.dim)
        norm_gate_up_kernel[(triton.cdiv(cfg.ffn_dim, block_n), self._row_groups(x, "gate_up"))](
            x,
            layer.ffn_norm.weight,
            *gate.args,
            *up.args,
            h,
            x.shape[0],
            self.rows["gate_up"],
            layer.ffn_norm.eps,
            cfg.dim,
            cfg.ffn_dim,
            block_n,
            _whole(cfg.dim),
            gate.spec,
            up.spec,
            num_warps=warps,
            **self.launch,
        )
        return h

    def down_residual(self, layer, h: torch.Tensor, x: torch.Tensor) -> None:
        self._matmul_residual("down", h, self.matrix(layer, "w_down"), x)

    def _matmul_residual(self, matrix: str, a: torch.Tensor, weight: PackedMatrix, x: torch.Tensor) -> None:
        """x += a @ weight^T, with the blocks of `matrix` (BLOCKS)."""
        k = a.shape[1]
        block_n, warps = self._block(matrix, [weight], k)
        matmul_residual_kernel[(triton.cdiv(self.cfg.dim, block_n), self._row_groups(x, matrix))](
            a,
            *weight.args,
            x,
            x.shape[0],
            self.rows[matrix],
            self.cfg.dim,
            k,
            block_n,
            _whole(k),
            weight.spec,
            num_warps=warps,
            **self.launch,
        )

    def norm_lm_head(self, x: torch.Tensor) -> torch.Tensor:
        """logits [1, W, V] of the final norm of x."""
        model = self.model
        weight = self.matrix(None, "output")
        vocab = weight.rows
        logits = torch.empty(1, x.shape[0], vocab, device=x.device, dtype=x.dtype)
        block_n, warps = self._block("lm_head", [weight], self.cfg.dim)
        norm_lm_head_kernel[(triton.cdiv(vocab, block_n), self._row_groups(x, "lm_head"))](
            x,
            model.norm.weight,
            *weight.args,
            logits,
            x.shape[0],
            self.rows["lm_head"],
            vocab,
            model.norm.eps,
            self.cfg.dim,
            block_n,
            _whole(self.cfg.dim),
            weight.spec,
            num_warps=warps,
            **self.launch,
        )
        return logits

    def _row_groups(self, x: torch.Tensor, matrix: str) -> int:
        """The grid's second axis: programs per weight block, each computing rows[matrix] rows of x."""
        return triton.cdiv(x.shape[0], self.rows[matrix])

    def _block(self, matrix: str, weights: list[PackedMatrix], k: int, rows: int | None = None) -> tuple[int, int]:
        """(BLOCK_N, num_warps) for the matrix: the same at every width, for the same sums. rows:
        BLOCK_N, whatever the table says (qkv with a per-head norm)."""
        if self.blocks is not None:
            block_n, warps = self.blocks[matrix]
            return (block_n if rows is None else rows), warps
        return block_for(matrix, k, all(w.spec != DENSE for w in weights), rows)


def block_for(matrix: str, k: int, packed: bool, rows: int | None = None) -> tuple[int, int]:
    """BLOCKS' entry, with BLOCK_N halved until a program holds at most WEIGHTS_PER_PROGRAM weights
    (rows of k, padded to a power of two; two rows a pair for qkv and gate/up). Packed weights get
    the warps that spread their code words WORDS_PER_THREAD a thread. rows: BLOCK_N as given."""
    block_n, warps = BLOCKS[matrix]
    per_row = _whole(k) * (2 if matrix in ("qkv", "gate_up") else 1)
    if rows is None:
        while block_n > 1 and block_n * per_row > WEIGHTS_PER_PROGRAM:
            block_n //= 2
    else:
        block_n = rows
    if packed:
        words = block_n * per_row // 8
        warps = min(16, max(2, triton.next_power_of_2(triton.cdiv(words, 32 * WORDS_PER_THREAD))))
    return block_n, warps


def pdl_supported(device: torch.device) -> bool:
    """Programmatic dependent launch: a Hopper or later GPU, and a Triton that can launch with it."""
    if device.type != "cuda" or gdc_wait is None or torch.cuda.get_device_capability(device) < (9, 0):
        return False
    from triton.backends.nvidia.compiler import CUDAOptions

    return "launch_pdl" in CUDAOptions.__dataclass_fields__


def _whole(k: int) -> int:
    """BLOCK_K: a whole row of K, as a power of two (masked past K)."""
    return triton.next_power_of_2(k)

"""Host memory per call of ops whose shapes change every call, on the GPU: which kernels keep a
per-shape cache that never shrinks. On the H200 (2026-11-29) it found cuDNN's attention: ~1.9 MB
per call with a new shape, against ~20 KB for the math kernel and for cuBLAS matmuls. That is why
eager forwards leave cuDNN out (model.EAGER_ATTENTION).

python3 bench/cuda_shape_caches.py
"""

import random

import psutil
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BF16 = dict(device="cuda", dtype=torch.bfloat16)
rng = random.Random(0)
weight = torch.randn(1536, 576, **BF16)


def rss_mb() -> float:
    return psutil.Process().memory_info().rss / 2**20


def matmul() -> None:
    """A prefill-like matmul: any number of rows."""
    F.linear(torch.randn(rng.randint(2, 3000), 576, **BF16), weight)


def attention(backends=None) -> None:
    """A prefill-like attention: t new queries (9 heads, GQA over 3) over a cache of L entries."""
    t = rng.randint(2, 512)
    kv_len = t + rng.randint(0, 2500)
    q, k = torch.randn(1, 9, t, 64, **BF16), torch.randn(1, 3, kv_len, 64, **BF16)
    mask = torch.ones(t, kv_len, dtype=torch.bool, device="cuda").tril(kv_len - t)
    if backends is None:  # torch's own choice
        F.scaled_dot_product_attention(q, k, k, attn_mask=mask, enable_gqa=True)
        return
    with sdpa_kernel(backends):
        F.scaled_dot_product_attention(q, k, k, attn_mask=mask, enable_gqa=True)


def kb_per_call(fn, calls: int = 300) -> float:
    for _ in range(30):  # warm-up: allocators, libraries loaded
        fn()
    torch.cuda.synchronize()
    before = rss_mb()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (rss_mb() - before) * 1024 / calls


print(f"matmul, new row counts: {kb_per_call(matmul):.1f} KB per call")
print(f"attention, torch's choice: {kb_per_call(attention):.1f} KB per call")
for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH):
    try:
        print(f"attention, {backend.name}: {kb_per_call(lambda: attention([backend])):.1f} KB per call")
    except RuntimeError as exc:  # e.g. the memory-efficient kernel takes no GQA with a mask
        print(f"attention, {backend.name}: not available here ({str(exc)[:80]})")

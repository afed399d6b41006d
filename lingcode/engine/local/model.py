"""A Llama-family decoder for batch 1 with a preallocated KV cache (after gpt-fast's model.py).

Weights come from weights.py in our own short names. Q, K, V are fused into one matmul and so are
gate and up: at batch 1 every matmul reads its whole weight for one row of output, so fewer,
larger matmuls mean fewer passes and fewer kernel launches.
"""

from __future__ import annotations

import math
import mmap
from collections.abc import Mapping
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from lingcode.engine.local import cpu_native
from lingcode.engine.local.quantized import MAX_QUANTIZED_ROWS, CpuLinear, Q4Weight
from lingcode.engine.local.weights import ModelConfig

# Eager GPU forwards (prefill, the early-exit draft) leave out cuDNN's attention: it builds a graph
# per input shape and keeps it for good (a thread-local cache with no limit), and eager shapes
# change with every prompt length and position: the daemon's host memory grew with every new
# shape (docs/engine-notes.md). Captured steps (forward_static) keep cuDNN: their shapes are fixed
# at load, so its cache stays as it was.
EAGER_ATTENTION = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class KVCache(nn.Module):
    """Keys and values for every position of the context, written in place as tokens are fed.

    Both are [1, KV, max_len, D] to every reader. With transposed_keys (the CPU) the keys are
    stored position-last, [1, KV, D, max_len], and `k` is a transposed view of that: the score
    matmul q @ k^T then reads k^T as a plain row-major matrix, where the position-first layout made
    MKL copy (pack) the keys on every step. Position-last keys are stored for a multiple of 16
    positions: cpu_attention reads them 16 at a time.

    The CPU's cache is f16 (model.kv_dtype) where lingcode's native code builds: half the bytes a
    step reads. f16, not bf16: its 11-bit significand keeps the logits nearer the f32 cache's, and
    AVX-512 converts it in one instruction. (Measurements: docs/engine-notes.md.)
    """

    def __init__(self, max_len: int, n_kv_heads: int, head_dim: int, dtype, device, transposed_keys: bool = False):
        super().__init__()
        shape = (1, n_kv_heads, max_len, head_dim)
        alloc = zeros_as_written if torch.device(device).type == "cpu" else torch.zeros
        if transposed_keys:
            padded = -(-max_len // 16) * 16
            k = alloc((1, n_kv_heads, head_dim, padded), dtype=dtype, device=device).transpose(2, 3)
            k = k[:, :, :max_len]
        else:
            k = alloc(shape, dtype=dtype, device=device)
        self.register_buffer("k", k, persistent=False)
        self.register_buffer("v", alloc(shape, dtype=dtype, device=device), persistent=False)

    def update(self, where: int | Tensor, k: Tensor, v: Tensor, kv_len: int) -> tuple[Tensor, Tensor]:
        """Write k, v at positions `where` (a start, or a tensor of positions: no host value, so a
        CUDA graph can replay it); return the first kv_len entries to attend over."""
        if isinstance(where, int):
            self.k[:, :, where : where + k.shape[2]] = k
            self.v[:, :, where : where + k.shape[2]] = v
        else:
            self.k.index_copy_(2, where, k)
            self.v.index_copy_(2, where, v)
        return self.k[:, :, :kv_len], self.v[:, :, :kv_len]


def zeros_as_written(shape, dtype, device=None) -> Tensor:
    """CPU zeros whose memory the system provides page by page as they are first written (an anonymous
    mapping; untouched pages read as zeros and cost nothing): a 32K-position KV cache costs the memory
    of the positions used. Never in 2 MB pages, which the system may use for large allocations: a
    token's keys (position-last) touch every 64 KB row of a layer's keys, so those would all be
    taken at the first token."""
    size = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
    mapping = mmap.mmap(-1, max(size, 1))
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        mapping.madvise(mmap.MADV_NOHUGEPAGE)
    return torch.frombuffer(mapping, dtype=dtype, count=math.prod(shape)).view(shape)


ROW_EXACT_BUCKET = 128  # row-exact attention (below) attends over a multiple of this many entries


def row_exact_kv_len(end: int, max_len: int) -> int:
    """The cache length a row-exact step ending at `end` attends over: the bucket end falls in."""
    return min(max_len, -(-end // ROW_EXACT_BUCKET) * ROW_EXACT_BUCKET)


def row_exact_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """Attention whose result for a query row does not depend on the other rows fed with it.

    torch's CPU kernels (SDPA, and a batched matmul over several tokens' rows) give a query slightly
    different numbers when it comes with other queries or over a different number of keys, and over
    many layers that difference grows into a different token: a verified draft would not be exactly
    what plain decoding picks. Here each token's rows are one batched matmul of the same shape
    (its group of heads per KV head) over the same key count (a bucket, the rest masked), whatever
    the step's width, so the same kernel computes them; speculation stays lossless as long as a
    verify step does not cross a bucket boundary (the CPU's torch step cuts drafts to fit).
    q [1, H, T, D]; k, v [1, KV, L, D]; mask [T, L] (True = visible).
    """
    _, n_heads, t, d = q.shape
    n_kv = k.shape[1]
    keys = k[0].transpose(1, 2)
    rows = []
    for i in range(t):
        qi = q[0, :, i].reshape(n_kv, n_heads // n_kv, d)  # head h uses kv head h // (H / KV)
        scores = torch.bmm(qi, keys) * d**-0.5
        scores = scores.masked_fill(~mask[i][None, None], float("-inf"))
        rows.append(torch.bmm(torch.softmax(scores, -1), v[0]).view(n_heads, d))
    return torch.stack(rows, 1)[None]


def rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        self.wqkv = nn.Linear(cfg.dim, q + 2 * kv, bias=cfg.architecture.qkv_bias)
        self.wo = nn.Linear(q, cfg.dim, bias=False)
        self.split = (q, kv, kv)
        self.qk_norm = cfg.architecture.qk_norm
        if self.qk_norm:
            self.q_norm, self.k_norm = RMSNorm(cfg.head_dim, cfg.norm_eps), RMSNorm(cfg.head_dim, cfg.norm_eps)
        self.kv_cache: KVCache | None = None
        self.row_exact = False  # row_exact_attention for masked steps (the CPU's decode and verify, f32 cache)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, where, kv_len: int, mask: Tensor | None) -> Tensor:
        _, t, _ = x.shape
        q, k, v = self.wqkv(x).split(self.split, dim=-1)
        q = q.view(1, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = k.view(1, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(1, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k, v = self.kv_cache.update(where, k, v, kv_len)
        if k.dtype != q.dtype and t <= MAX_QUANTIZED_ROWS:  # the CPU's f16 cache: decode and verify steps
            y = cpu_native.decode_attention(q, self.kv_cache.k, self.kv_cache.v, where)
        else:
            k, v = k.to(q.dtype), v.to(q.dtype)  # a CPU prefill over the f16 cache computes in f32
            if self.row_exact and mask is not None and mask.shape[-1] == kv_len:
                y = row_exact_attention(q, k, v, mask)
            else:
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return self.wo(y.transpose(1, 2).reshape(1, t, -1))


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.w_gate_up = nn.Linear(cfg.dim, 2 * cfg.ffn_dim, bias=False)
        self.w_down = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.w_gate_up(x).chunk(2, dim=-1)
        return self.w_down(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.ffn = FeedForward(cfg)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, where, kv_len: int, mask: Tensor | None) -> Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin, where, kv_len, mask)
        return x + self.ffn(self.ffn_norm(x))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.max_len = 0
        self.row_exact_rows = 0  # steps of up to this many tokens use row_exact_attention (CPU)
        self.kv_dtype: torch.dtype | None = None  # the KV cache's dtype when not the weights' (CPU: f16)
        self.rope_tables = True  # cos and sin of every position (forward() reads them)
        self.int4_matmuls = False  # every CPU matmul has the file's 4-bit codes for narrow steps (use_cpu_matmuls)

    @classmethod
    def from_weights(
        cls, cfg: ModelConfig, weights: Mapping[str, Tensor], dtype, device, matrices: bool = True
    ) -> "Transformer":
        """matrices=False: the matrices and embeddings left empty, never read from `weights` (the
        native step reads the file's blocks itself; forward() cannot run)."""
        with torch.device("meta"):
            model = cls(cfg)
        arch = cfg.architecture
        state = {"norm.weight": weights["norm"]}
        matrix = {
            "tok_embeddings.weight": ("tok_embeddings",),
            "output.weight": ("tok_embeddings" if cfg.tied_embeddings else "output",),
        }
        for i in range(cfg.n_layers):
            p = f"layers.{i}."
            w = lambda name: weights[p + name]  # noqa: E731
            state[p + "attn_norm.weight"] = w("attn_norm")
            state[p + "ffn_norm.weight"] = w("ffn_norm")
            if arch.qkv_bias:
                state[p + "attn.wqkv.bias"] = torch.cat([w("bq"), w("bk"), w("bv")])
            if arch.qk_norm:
                state[p + "attn.q_norm.weight"], state[p + "attn.k_norm.weight"] = w("q_norm"), w("k_norm")
            matrix[p + "attn.wqkv.weight"] = (p + "wq", p + "wk", p + "wv")
            matrix[p + "attn.wo.weight"] = (p + "wo",)
            matrix[p + "ffn.w_gate_up.weight"] = (p + "w_gate", p + "w_up")
            matrix[p + "ffn.w_down.weight"] = (p + "w_down",)
        if matrices:
            state.update({key: torch.cat([weights[n] for n in names]) for key, names in matrix.items()})
        state = {k: v.to(device=device, dtype=dtype) for k, v in state.items()}
        model.load_state_dict(state, assign=True, strict=matrices)
        if matrices and cfg.tied_embeddings:  # one tensor, not two copies
            model.output.weight = model.tok_embeddings.weight
        if not matrices:  # left on the meta device: never read
            empty = nn.Parameter(torch.empty(0, device=device, dtype=dtype), requires_grad=False)
            for key in matrix:
                owner, _, name = key.rpartition(".")
                setattr(model.get_submodule(owner), name, empty)
        return model.eval().requires_grad_(False)

    def use_cpu_matmuls(self, q4: dict[str, list[Q4Weight]]) -> None:
        """CPU: every matmul in bf16 (oneDNN/AMX), narrow ones (decode, verify) on the file's Q4_1
        codes where it has them; see quantized.py for why and the measurements."""
        fused = {
            "attn.wqkv": ("wq", "wk", "wv"),
            "attn.wo": ("wo",),
            "ffn.w_gate_up": ("w_gate", "w_up"),
            "ffn.w_down": ("w_down",),
        }
        self.int4_matmuls = "output" in q4
        for i, layer in enumerate(self.layers):
            for path, names in fused.items():
                owner_name, attr = path.split(".")
                owner = layer.get_submodule(owner_name)
                parts = [q4.get(f"layers.{i}.{name}", []) for name in names]
                packed = [Q4Weight.cat([p[0] for p in parts])] if all(len(p) == 1 for p in parts) else []
                self.int4_matmuls &= bool(packed)
                linear = getattr(owner, attr)
                setattr(owner, attr, CpuLinear(linear.weight, packed, linear.bias))
            layer.attn.row_exact = True
        self.output = CpuLinear(self.output.weight, q4.get("output", []))
        self.row_exact_rows = MAX_QUANTIZED_ROWS
        if cpu_native.load() is not None:  # half the cache's bytes per step; else f32 and row_exact_attention
            self.kv_dtype = torch.float16

    def use_native_step(self) -> None:
        """For the native step (cpu_step.cpp), built with from_weights(matrices=False): an f16 cache,
        and no RoPE tables (the step computes each position's angles itself)."""
        self.kv_dtype = torch.float16
        self.rope_tables = False

    def setup_cache(self, max_len: int, transposed_keys: bool | None = None) -> None:
        """A KV cache for max_len positions; keys stored position-last on the CPU unless told (KVCache)."""
        cfg = self.cfg
        weight = self.norm.weight
        if transposed_keys is None:
            transposed_keys = weight.device.type == "cpu"
        dtype = (self.kv_dtype if transposed_keys else None) or weight.dtype  # cpu_attention reads keys position-last
        for layer in self.layers:
            layer.attn.kv_cache = KVCache(max_len, cfg.n_kv_heads, cfg.head_dim, dtype, weight.device, transposed_keys)
        self.inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float32) / cfg.head_dim))
        if self.rope_tables:
            angles = torch.outer(torch.arange(max_len, dtype=torch.float32), self.inv_freq)
            angles = torch.cat([angles, angles], dim=-1)
            self.rope_cos = angles.cos().to(device=weight.device, dtype=weight.dtype)
            self.rope_sin = angles.sin().to(device=weight.device, dtype=weight.dtype)
        self.max_len = max_len

    def forward(self, tokens: Tensor, start: int, all_logits: bool = False, n_layers: int | None = None) -> Tensor:
        """Feed tokens [1, T] at positions start..start+T-1; logits of the last (or every) position.

        n_layers: run only the first n layers (an early-exit draft; it writes those layers' cache
        entries, which the full forward that verifies the draft then overwrites with the same values).
        """
        t = tokens.shape[1]
        end = start + t
        cos, sin = self.rope_cos[start:end], self.rope_sin[start:end]
        mask, kv_len = None, end
        if t <= self.row_exact_rows:  # over a whole bucket, later entries masked
            kv_len = row_exact_kv_len(end, self.max_len)
            mask = torch.arange(kv_len, device=tokens.device)[None, :] < torch.arange(start + 1, end + 1)[:, None]
        elif t > 1:  # new tokens see the whole cache before them and each other causally
            positions = torch.arange(end, device=tokens.device)
            mask = positions[None, :] <= positions[start:end, None]
        x = self.tok_embeddings(tokens)
        with sdpa_kernel(EAGER_ATTENTION) if x.is_cuda else nullcontext():
            for layer in self.layers[:n_layers]:
                x = layer(x, cos, sin, start, kv_len, mask)
        x = self.norm(x if all_logits else x[:, -1:])
        return self.output(x)

    def forward_static(self, tokens: Tensor, positions: Tensor, kv_len: int) -> Tensor:
        """The same forward with every shape fixed and no host values: what a CUDA graph captures.

        tokens [1, W] at positions [W] (device tensors), attending over the first kv_len cache
        entries (a bucket >= the last position + 1; entries past a query's position are masked).
        Returns the logits of all W positions [1, W, V].
        """
        cos, sin = self.rope_cos[positions], self.rope_sin[positions]
        mask = torch.arange(kv_len, device=tokens.device)[None, :] <= positions[:, None]
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x, cos, sin, positions, kv_len, mask)
        return self.output(self.norm(x))

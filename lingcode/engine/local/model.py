"""A Llama-family decoder for batch 1 with a preallocated KV cache (after gpt-fast's model.py).

Weights come from weights.py in our own short names. Q, K, V are fused into one matmul and so are
gate and up: at batch 1 every matmul reads its whole weight for one row of output, so fewer,
larger matmuls mean fewer passes and fewer kernel launches.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lingcode.engine.local.weights import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class KVCache(nn.Module):
    """Keys and values for every position of the context, written in place as tokens are fed."""

    def __init__(self, max_len: int, n_kv_heads: int, head_dim: int, dtype, device):
        super().__init__()
        shape = (1, n_kv_heads, max_len, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

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


def rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        self.wqkv = nn.Linear(cfg.dim, q + 2 * kv, bias=False)
        self.wo = nn.Linear(q, cfg.dim, bias=False)
        self.split = (q, kv, kv)
        self.kv_cache: KVCache | None = None

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, where, kv_len: int, mask: Tensor | None) -> Tensor:
        _, t, _ = x.shape
        q, k, v = self.wqkv(x).split(self.split, dim=-1)
        q = q.view(1, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = k.view(1, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(1, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k, v = self.kv_cache.update(where, k, v, kv_len)
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

    @classmethod
    def from_weights(cls, cfg: ModelConfig, weights: dict[str, Tensor], dtype, device) -> "Transformer":
        with torch.device("meta"):
            model = cls(cfg)
        state = {"tok_embeddings.weight": weights["tok_embeddings"], "norm.weight": weights["norm"]}
        state["output.weight"] = weights["tok_embeddings" if cfg.tied_embeddings else "output"]
        for i in range(cfg.n_layers):
            w = lambda name: weights[f"layers.{i}.{name}"]  # noqa: E731
            p = f"layers.{i}."
            state[p + "attn_norm.weight"] = w("attn_norm")
            state[p + "ffn_norm.weight"] = w("ffn_norm")
            state[p + "attn.wqkv.weight"] = torch.cat([w("wq"), w("wk"), w("wv")])
            state[p + "attn.wo.weight"] = w("wo")
            state[p + "ffn.w_gate_up.weight"] = torch.cat([w("w_gate"), w("w_up")])
            state[p + "ffn.w_down.weight"] = w("w_down")
        state = {k: v.to(device=device, dtype=dtype) for k, v in state.items()}
        model.load_state_dict(state, assign=True, strict=True)
        if cfg.tied_embeddings:  # one tensor, not two copies
            model.output.weight = model.tok_embeddings.weight
        return model.eval().requires_grad_(False)

    def setup_cache(self, max_len: int) -> None:
        cfg = self.cfg
        weight = self.norm.weight
        for layer in self.layers:
            layer.attn.kv_cache = KVCache(max_len, cfg.n_kv_heads, cfg.head_dim, weight.dtype, weight.device)
        inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float32) / cfg.head_dim))
        angles = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)
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
        mask = None
        if t > 1:  # new tokens see the whole cache before them and each other causally
            positions = torch.arange(end, device=tokens.device)
            mask = positions[None, :] <= positions[start:end, None]
        x = self.tok_embeddings(tokens)
        for layer in self.layers[:n_layers]:
            x = layer(x, cos, sin, start, end, mask)
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

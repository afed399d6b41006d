"""Choosing the next token from logits: greedy, or temperature + top-k + top-p with a seeded generator."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from lingcode.engine import SamplingParams


# The smallest temperature float32 divides by: a smaller one (5e-324 is a valid request) would round to 0.
MIN_TEMPERATURE = torch.finfo(torch.float32).tiny


def scale(logits: Tensor, temperature: float) -> Tensor:
    """logits / temperature in float32, shifted so each row's max is 0: never inf - inf = nan, however
    small the temperature (the T -> 0 limit: all mass on the max)."""
    logits = logits.float()
    return (logits - logits.amax(dim=-1, keepdim=True)) / max(temperature, MIN_TEMPERATURE)


def argmax(logits: Tensor) -> Tensor:
    """logits.argmax(dim=-1): the same ids (the first of equal maxima, a NaN's if any), on the same
    device. Float32 logits on the CPU go through numpy, whose argmax is vectorized and torch's is not:
    it runs between two steps, while the step's other thread waits (docs/engine-notes.md)."""
    if logits.is_cpu and logits.dtype == torch.float32:
        return torch.from_numpy(np.asarray(logits.numpy().argmax(axis=-1)))
    return logits.argmax(dim=-1)


def sample(logits: Tensor, params: SamplingParams, generator: torch.Generator | None) -> Tensor:
    """logits [V] -> a 0-d token id tensor on the same device (no host sync here)."""
    if params.greedy:
        return argmax(logits)
    logits = scale(logits, params.temperature)
    if params.top_k > 0 and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        # keep the smallest prefix whose mass reaches top_p (the first token is always kept)
        drop = sorted_probs.cumsum(-1) - sorted_probs > params.top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    return torch.multinomial(probs, 1, generator=generator)[0]


class RepetitionPenalty:
    """The repetition penalty over a request's sequence so far, on the logits' device.

    It keeps the ids seen (the prompt's, once each, then every token added: a repeat is harmless,
    gather then scatter writes the same value twice) and touches only their logits, not the whole
    vocabulary's. Tokens are added as tensors too, so the GPU's pipelined loop reads nothing back."""

    def __init__(self, prompt: list[int], penalty: float, device: torch.device):
        self.penalty = penalty
        self.ids = torch.unique(torch.tensor(prompt, dtype=torch.long)).to(device)

    def add(self, tokens: list[int] | Tensor) -> None:
        if not isinstance(tokens, Tensor):
            tokens = torch.tensor(tokens, dtype=torch.long)
        self.ids = torch.cat((self.ids, tokens.view(-1).to(self.ids.device, torch.long)))

    def apply(self, logits: Tensor, draft: list[int] = ()) -> None:
        """Penalize logits [V] in place; or rows [k+1, V], row i (a verify step's) also for draft[:i]."""
        if logits.dim() == 1:
            self._penalize(logits, self.ids)
            return
        drafted = torch.tensor(draft, dtype=torch.long).to(self.ids.device) if draft else self.ids[:0]
        for i, row in enumerate(logits):
            self._penalize(row, torch.cat((self.ids, drafted[:i])) if i else self.ids)

    def _penalize(self, row: Tensor, ids: Tensor) -> None:
        seen = row.gather(0, ids)
        row.scatter_(0, ids, torch.where(seen > 0, seen / self.penalty, seen * self.penalty))

"""Lossless speculative decoding: drafters propose, the target verifies k+1 positions in one forward.

On a bandwidth-bound device a forward over k+1 tokens reads the weights once, like a forward over
one, so every accepted draft token is a decode step saved. Acceptance follows the standard rules:

- greedy: a draft token is kept while it equals the target's argmax; the first mismatch is
  replaced by the target's own token. The output is token-for-token what plain decoding gives.
- sampling (Leviathan et al. / Chen et al.): draft token x is kept with probability
  min(1, p(x) / q(x)); on rejection the replacement is drawn from norm(max(0, p - q)); after k
  acceptances a bonus token is drawn from p. The output distribution is exactly p's. For a
  model-free drafter, q is a point mass on x, so acceptance is p(x) and the residual is p with x
  removed.

Drafters share one small interface: start(prompt), propose(k) -> (tokens, q or None),
and extend(accepted tokens). The n-gram drafter, the one kept across requests, also has finish(),
which the engine calls once a request's last chunk is out (LocalEngine.tidy).
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

import torch
from torch import Tensor

from lingcode.engine import SamplingParams, common_prefix
from lingcode.engine.local.sampling import argmax, scale


class Drafter(Protocol):
    def start(self, tokens: list[int]) -> None:
        """A new request: the whole token sequence so far (prompt, and its pending last token)."""

    def propose(self, k: int) -> tuple[list[int], Tensor | None]:
        """Up to k draft tokens following the sequence, and their draft distributions [n, V] or None."""

    def extend(self, tokens: list[int]) -> None:
        """Tokens appended to the sequence (accepted drafts and the target's own token)."""


RECENT_OUTPUTS = 4  # earlier requests' outputs the n-gram drafter also copies from
# From this many output tokens, finish() also keeps the index wound back to the prompt: winding
# back costs time per token, which a next request that leaves the output pays before its first.
WIND_BACK_AHEAD = 32


class NGramDrafter:
    """Prompt lookup: find the latest earlier occurrence of the sequence's last n tokens, copy what
    followed it. Model-free; strong where the output repeats the input (code edits, agent loops).

    For greedy requests it looks first in the outputs of the last few requests, then in the
    sequence itself. An editor asks again after each keystroke that leaves the suggestion shown,
    and the model's new text often repeats parts of what it suggested just before (the rest of a
    line after a different character, the same call's arguments), text that is in no prompt
    (docs/engine-notes.md has the measurement).

    One drafter serves request after request: start() keeps the index of the tokens the new
    sequence shares with the last one and indexes only the rest, so a keystroke's completion (the
    same ~1000-token prompt plus a character) does not index the whole prompt again. Every key set
    records the value it replaced, so the index can be wound back to any shorter sequence exactly.
    After a long output, finish() also winds a copy back to the prompt, between requests: a next
    request that leaves the output (a keystroke, a retry) starts from that copy, one that extends
    it (a conversation's next turn) from the index as it is.
    """

    def __init__(self, max_n: int = 4, min_n: int = 2):
        self.max_n, self.min_n = max_n, min_n
        self.tokens: list[int] = []
        self.index: dict[tuple[int, ...], int] = {}  # n-gram -> end position of its latest occurrence
        self._replaced: list[list[tuple[tuple[int, ...], int | None]]] = []  # per token: (key, old value)
        # (output, its n-grams -> end of their latest occurrence) for the last few requests
        self.recent: deque[tuple[list[int], dict[tuple[int, ...], int]]] = deque(maxlen=RECENT_OUTPUTS)
        self._prompt_len: int | None = None  # tokens[_prompt_len:] is the running request's output
        self._at_prompt: tuple[list, dict, list] | None = None  # (tokens, index, _replaced) at the last prompt's end
        # Whether propose() copies from recent outputs. Only where drafts cannot change the output
        # (greedy decoding): with sampling, the drafts verified decide which random numbers are
        # drawn, and a seeded request must give the same text whatever came before it.
        self.copy_recent = True

    def start(self, tokens: list[int]) -> None:
        self.finish()  # where the last request did not (it failed)
        self._prompt_len = len(tokens)
        keep = common_prefix(self.tokens, tokens)
        at_prompt, self._at_prompt = self._at_prompt, None
        if at_prompt is not None and keep <= len(at_prompt[0]):  # it leaves the last output behind
            self.tokens, self.index, self._replaced = at_prompt
        if keep < len(self.tokens) - keep:  # less to keep than to wind back: index anew
            self.tokens, self.index, self._replaced = [], {}, []
        else:
            self._truncate(keep)
        self.extend(tokens[len(self.tokens) :])

    def extend(self, tokens: list[int]) -> None:
        seq, index = self.tokens, self.index
        for token in tokens:
            seq.append(token)
            end = len(seq)
            # Index the n-grams ending just before this token, so a lookup never finds the suffix itself.
            replaced = []
            for key in self._ngrams_ending_at(seq, end - 1):
                replaced.append((key, index.get(key)))
                index[key] = end - 1
            self._replaced.append(replaced)

    def finish(self) -> None:
        """Work for between requests, not for the next one's start(), before its first token: index
        the output for later requests, and (after a long one) wind a copy of the index back to the prompt."""
        prompt_len, self._prompt_len = self._prompt_len, None
        if prompt_len is None:
            return
        if len(self.tokens) > prompt_len + 1:
            self._remember(self.tokens[prompt_len:])
        if len(self.tokens) - prompt_len >= WIND_BACK_AHEAD:
            self._at_prompt = (self.tokens[:], dict(self.index), self._replaced[:])
            _wind_back(*self._at_prompt, prompt_len)

    def _truncate(self, length: int) -> None:
        """Forget the tokens after the first `length`: the index is as if they were never added."""
        _wind_back(self.tokens, self.index, self._replaced, length)

    def _remember(self, output: list[int]) -> None:
        if self.recent and self.recent[-1][0] == output:
            return
        index = {}
        for end in range(self.min_n, len(output)):  # n-grams with at least one token after them
            for key in self._ngrams_ending_at(output, end):
                index[key] = end
        self.recent.append((output, index))

    def _ngrams_ending_at(self, seq: list[int], end: int) -> list[tuple[int, ...]]:
        """The min_n..max_n-grams of seq that end just before position `end`."""
        return [tuple(seq[end - n : end]) for n in range(self.min_n, min(self.max_n, end) + 1)]

    def propose(self, k: int) -> tuple[list[int], Tensor | None]:
        seq = self.tokens
        for n in range(self.max_n, self.min_n - 1, -1):
            if len(seq) < n:
                continue
            key = tuple(seq[-n:])
            for output, index in reversed(self.recent) if self.copy_recent else ():
                end = index.get(key)
                if end is not None:
                    return output[end : end + k], None
            end = self.index.get(key)
            if end is not None:
                return seq[end : end + k], None
        return [], None


def _wind_back(tokens: list[int], index: dict, replaced: list, length: int) -> None:
    """Undo the index's entries of tokens[length:], last first, and drop those tokens."""
    while len(tokens) > length:
        tokens.pop()
        for key, old in reversed(replaced.pop()):
            if old is None:
                del index[key]
            else:
                index[key] = old


def target_probs(logits: Tensor, params: SamplingParams) -> Tensor:
    """The distribution plain sampling draws from (temperature, top-k, top-p), rows of logits [n, V]."""
    logits = scale(logits, params.temperature)
    if 0 < params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True, dim=-1)
        drop = sorted_probs.cumsum(-1) - sorted_probs > params.top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def verify_greedy(logits: Tensor, draft: list[int]) -> list[int]:
    """logits [k+1, V] of the target at the pending token and each draft token -> tokens to emit."""
    targets = argmax(logits).tolist()  # one host read per verify step
    n = 0
    while n < len(draft) and draft[n] == targets[n]:
        n += 1
    return draft[:n] + [targets[n]]


def verify_sampled(
    logits: Tensor,
    draft: list[int],
    draft_probs: Tensor | None,
    params: SamplingParams,
    generator: torch.Generator | None,
) -> list[int]:
    """Rejection sampling: emitted tokens are distributed exactly as plain sampling's."""
    p = target_probs(logits, params)  # [k+1, V]
    out: list[int] = []
    for i, x in enumerate(draft):
        p_x = float(p[i, x])
        q_x = 1.0 if draft_probs is None else float(draft_probs[i, x])
        u = float(torch.rand((), generator=generator, device=p.device))
        if q_x > 0 and u * q_x < p_x:  # accept with probability min(1, p/q)
            out.append(x)
            continue
        if draft_probs is None:
            residual = p[i].clone()
            residual[x] = 0.0
        else:
            residual = (p[i] - draft_probs[i]).clamp_min(0.0)
        total = residual.sum()
        if float(total) <= 0.0:  # p == q: any draw from p is right; p itself is the residual's limit
            residual, total = p[i], p[i].sum()
        out.append(int(torch.multinomial(residual / total, 1, generator=generator)))
        return out
    out.append(int(torch.multinomial(p[len(draft)], 1, generator=generator)))
    return out


class DraftLength:
    """The draft length k that yields the most tokens per unit of step time, from the running
    acceptance rate and what a step of each width costs at the context it runs at.

    If each draft token is accepted with probability a (given the ones before it were), a draft of
    k tokens yields 1 + a + ... + a^k tokens per verify step. A wider step costs more (how much
    depends on the step: docs/engine-notes.md), so with low acceptance a short draft, or none, is fastest, and with high acceptance a long one.
    step_cost[k]: the cost of a step verifying k drafts (k + 1 tokens), k = 0..k_max, at position 0;
    per_position[k]: what each position of context before it adds (attention reads every cached
    key for every token fed: at 8K positions a small model's 8-token step costs several times a
    1-token one, where at 0 it cost about the same). The engine measures both at load. a is
    estimated from recent steps (geometric: accepted tokens over accepted tokens plus rejections,
    decayed); steps without a draft let it drift back to its prior, so a k of 0 is tried again.
    """

    DECAY = 0.85  # weight of the past per step: about the last 7 steps count
    PRIOR = (3.0, 1.0)  # (accepted, rejected): a = 0.75 until drafts say otherwise

    def __init__(self, step_cost: list[float], per_position: list[float] | None = None):
        self.step_cost = list(step_cost)
        self.per_position = list(per_position) if per_position is not None else [0.0] * len(self.step_cost)
        self.k_max = len(self.step_cost) - 1
        self.accepted, self.rejected = self.PRIOR
        self._tokens()
        self.k = self.at(0)

    @property
    def rate(self) -> float:
        """The estimated chance that a draft token is accepted, given the ones before it were."""
        return self.accepted / (self.accepted + self.rejected)

    def update(self, proposed: int, accepted: int) -> None:
        """After a verify step of `proposed` drafts of which `accepted` were kept; (0, 0): a step
        without a draft, which moves the estimate back toward the prior."""
        d = self.DECAY
        if proposed == 0:
            self.accepted = d * self.accepted + (1 - d) * self.PRIOR[0]
            self.rejected = d * self.rejected + (1 - d) * self.PRIOR[1]
        else:
            self.accepted = d * self.accepted + accepted
            self.rejected = d * self.rejected + (accepted < proposed)
        self._tokens()
        self.k = self.at(0)

    def at(self, position: int) -> int:
        """The best draft length for a step fed at `position` (its context length)."""
        return max(
            range(self.k_max + 1), key=lambda k: self._yield[k] / (self.step_cost[k] + self.per_position[k] * position)
        )

    def _tokens(self) -> None:
        a = self.rate
        self._yield = [sum(a**i for i in range(k + 1)) for k in range(self.k_max + 1)]


class EarlyExitDrafter:
    """A draft model sharing the tokenizer: the target's own first L layers and LM head.

    It needs no weights or cache of its own: its layers are the target's, and the cache entries
    it writes ahead of the target are exactly what the target's verify forward writes there.
    Drafts are greedy, so q is a point mass (verify_sampled's q=None case).
    """

    def __init__(self, step, n_layers: int):
        self.step, self.n_layers = step, n_layers  # step: the engine's forward pass (steps.py)
        self.length = 0  # tokens in the sequence; the last one is pending (not fed to the target)
        self.last = 0

    def start(self, tokens: list[int]) -> None:
        self.length, self.last = len(tokens), tokens[-1]

    def extend(self, tokens: list[int]) -> None:
        self.length += len(tokens)
        self.last = tokens[-1]

    def propose(self, k: int) -> tuple[list[int], Tensor | None]:
        token, pos, draft = self.last, self.length - 1, []
        for _ in range(k):
            token = int(argmax(self.step([token], pos, n_layers=self.n_layers)[-1]))
            draft.append(token)
            pos += 1
        return draft, None

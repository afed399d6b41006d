"""Saved KV prefixes, so that a conversation's cache survives other requests in between.

The engine has one KV cache and reuses the longest common prefix with the request before. An
agent session, an LSP completion in between, then the session's next turn: without this store
the completion would overwrite the session's cache and the turn would prefill its whole history
again. So, just before a request overwrites most of what the cache holds (what it would lose is
at least as long as what it keeps, and not tiny), the cache's content is copied here; a later
request that shares a longer prefix with a saved entry than with the live cache gets that shared
part copied back (a saved entry may end with generated tokens the next request does not repeat).

Bounded: entries are kept in LRU order and the oldest are dropped to stay under max_bytes. A
saved prefix that a newer one extends is dropped as redundant.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

MIN_SAVE_TOKENS = 32  # a shorter prefix is cheaper to prefill again than to keep


def common_prefix(a, b) -> int:
    """How many leading items two token sequences (lists or tuples) share.

    On every request's way to its first token (the live cache, each saved prefix, the drafter), so
    slices are compared in C, halving the span that differs, not item by item in Python."""
    if type(a) is not type(b):
        a = type(b)(a)
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo]; a[:hi] != b[:hi]
    while hi - lo > 32:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    while a[lo] == b[lo]:
        lo += 1
    return lo


class PrefixStore:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]]] = OrderedDict()
        self._bytes: dict[tuple[int, ...], int] = {}
        self.counters = dict.fromkeys(("saves", "restores", "restored_tokens", "evictions"), 0)

    def best_match(self, ids: list[int]) -> tuple[tuple[int, ...] | None, int]:
        """The saved entry sharing the longest prefix with ids, and how many tokens it shares."""
        best, best_n = None, 0
        for key in self._entries:
            n = common_prefix(key, ids)
            if n > best_n:
                best, best_n = key, n
        return best, best_n

    def should_save(self, cached: int, reused: int, prompt: int) -> bool:
        """Whether the cache, holding `cached` tokens of which a request of `prompt` tokens reuses
        `reused`, is worth saving. Not when it holds the whole prompt (a retry, a regenerated answer):
        what is lost is an answer to this same prompt, which the request replaces, and the copy would
        delay its first token (docs/engine-notes.md)."""
        lost = cached - reused
        return reused < prompt and lost >= MIN_SAVE_TOKENS and lost >= reused

    def save(self, ids: list[int], caches: list, keep: tuple[int, ...] | None = None) -> None:
        """Copy the keys/values of ids (the first len(ids) positions of each layer's cache).

        `keep` (the entry about to be restored) is never dropped to make room: if the new entry
        does not fit without it, the new entry is not saved.
        """
        key, n = tuple(ids), len(ids)
        if key in self._entries:  # checked first: a prompt asked again after a long answer lands here each time
            return
        size = n * sum((c.k.nbytes + c.v.nbytes) // c.k.shape[2] for c in caches)  # [1, KV, positions, D]
        if size > self.max_bytes - self._bytes.get(keep, 0):
            return
        for old in [k for k in self._entries if len(k) < n and key[: len(k)] == k and k != keep]:
            self._drop(old)  # this one extends it
        for old in [k for k in self._entries if k != keep]:  # least recently used first
            if sum(self._bytes.values()) + size <= self.max_bytes:
                break
            self._drop(old)
            self.counters["evictions"] += 1
        self._entries[key] = [(c.k[:, :, :n].clone(), c.v[:, :, :n].clone()) for c in caches]
        self._bytes[key] = size
        self.counters["saves"] += 1

    def restore(self, key: tuple[int, ...], n: int, caches: list) -> None:
        """Copy the first n positions of a saved entry back into the caches."""
        for cache, (k, v) in zip(caches, self._entries[key]):
            cache.k[:, :, :n].copy_(k[:, :, :n])
            cache.v[:, :, :n].copy_(v[:, :, :n])
        self._entries.move_to_end(key)
        self.counters["restores"] += 1
        self.counters["restored_tokens"] += n

    def clear(self) -> None:
        self._entries.clear()
        self._bytes.clear()

    def stats(self) -> dict:
        return {**self.counters, "entries": len(self._entries), "tokens": sum(map(len, self._entries)),
                "bytes": sum(self._bytes.values()), "max_bytes": self.max_bytes}  # fmt: skip

    def _drop(self, key: tuple[int, ...]) -> None:
        del self._entries[key]
        del self._bytes[key]

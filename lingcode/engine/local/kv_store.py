"""Saved KV prefixes, so that a conversation's cache survives other requests in between.

The engine has one KV cache and reuses the longest common prefix with the request before. An
agent session, an LSP completion in between, then the session's next turn: without this store
the completion would overwrite the session's cache and the turn would prefill its whole history
again. So, just before a request overwrites most of what the cache holds (what it would lose is
at least as long as what it keeps, and not tiny), the cache's content is saved here; a later
request that shares a longer prefix with a saved entry than with the live cache gets that shared
part copied back (a saved entry may end with generated tokens the next request does not repeat).

Saving copies only the positions the coming request can write (its `reach`: prompt, answer and
drafts). The rest of the entry stays where it is in the cache buffers, "resident", until a later
request's reach comes to it: protect() copies that part then, before the request writes. A short
completion between two turns of a long conversation so copies what it overwrites, not the whole
conversation, before its first token; and restoring copies back only that part.

Bounded: entries are kept in LRU order and the oldest are dropped to stay under max_bytes (what
they copied). A saved prefix that a newer one extends is dropped as redundant.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from lingcode.engine import common_prefix

MIN_SAVE_TOKENS = 32  # a shorter prefix is cheaper to prefill again than to keep


@dataclass
class _Entry:
    """A saved prefix: copies of positions [0, copied), in spans; [copied, len(key)) still in the cache."""

    key: tuple[int, ...]
    spans: list[tuple[int, list[tuple[torch.Tensor, torch.Tensor]]]] = field(default_factory=list)  # (start, per layer)
    copied: int = 0
    bytes: int = 0

    @property
    def resident(self) -> bool:
        return self.copied < len(self.key)


def _per_token_bytes(caches: list) -> int:
    return sum((c.k.nbytes + c.v.nbytes) // c.k.shape[2] for c in caches)  # [1, KV, positions, D]


class PrefixStore:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[int, ...], _Entry] = OrderedDict()
        self.counters = dict.fromkeys(("saves", "restores", "restored_tokens", "evictions", "copied_tokens"), 0)

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

    def save(self, ids: list[int], caches: list, reach: int | None = None, keep: tuple[int, ...] | None = None) -> None:
        """Save the keys/values of ids (the first len(ids) positions of each layer's cache), copying
        the positions below `reach` (past the last one the coming request may write; None: all of
        them) and leaving the rest resident.

        `keep` (the entry about to be restored) is never dropped to make room: if the new entry
        does not fit without it, the new entry is not saved.
        """
        key = tuple(ids)
        if key in self._entries:  # checked first: a prompt asked again after a long answer lands here each time
            return
        if len(key) * _per_token_bytes(caches) > self.max_bytes - (
            self._entries[keep].bytes if keep in self._entries else 0
        ):
            return  # it could not be kept whole
        for old in [k for k in self._entries if len(k) < len(key) and key[: len(k)] == k and k != keep]:
            self._drop(old)  # this one extends it
        self._entries[key] = _Entry(key)
        self.counters["saves"] += 1
        self._copy_up_to(self._entries[key], len(key) if reach is None else reach, caches, keep)

    def protect(self, reach: int, caches: list, keep: tuple[int, ...] | None = None) -> None:
        """Before positions below `reach` are written: copy what resident entries hold there."""
        for entry in [e for e in self._entries.values() if e.resident and e.copied < reach]:
            if entry.key in self._entries:  # (an earlier one's copy may have evicted it)
                self._copy_up_to(entry, reach, caches, keep)

    def restore(self, key: tuple[int, ...], n: int, caches: list) -> tuple[int, ...]:
        """Make the first n positions of a saved entry the cache's again; returns the tokens the cache
        now holds. An entry whose resident part the request reaches leaves the store: the cache then
        holds all of it, and the engine saves it again if the request would lose most of it."""
        entry = self._entries[key]
        self.protect(min(n, entry.copied), caches, keep=key)  # other entries' resident parts written over
        self.counters["restores"] += 1
        self.counters["restored_tokens"] += n
        if entry.resident and n >= entry.copied:
            del self._entries[key]
            self._write_back(entry, entry.copied, caches)
            return key
        self._write_back(entry, n, caches)
        self._entries.move_to_end(key)
        return key[:n]

    def clear(self) -> None:
        self._entries.clear()

    def stats(self) -> dict:
        # Read on the daemon's event loop while the engine's thread saves and evicts: the entries
        # taken at once (one C call, which no other thread interrupts), then counted.
        entries = list(self._entries.values())
        return {
            **self.counters,
            "entries": len(entries),
            "tokens": sum(len(e.key) for e in entries),
            "resident_tokens": sum(len(e.key) - e.copied for e in entries),
            "bytes": sum(e.bytes for e in entries),
            "max_bytes": self.max_bytes,
        }

    # --- internals ----------------------------------------------------------------------------

    def _size(self) -> int:
        return sum(e.bytes for e in self._entries.values())

    def _copy_up_to(self, entry: _Entry, reach: int, caches: list, keep: tuple[int, ...] | None = None) -> None:
        """Copy entry's positions [copied, min(len, reach)) from the caches, evicting the least
        recently used others (never `keep`) to make room; an entry that cannot grow is dropped."""
        start, end = entry.copied, min(len(entry.key), max(reach, entry.copied))
        if end <= start:
            return
        size = (end - start) * _per_token_bytes(caches)
        for old in [k for k in self._entries if k not in (entry.key, keep)]:  # least recently used first
            if self._size() + size <= self.max_bytes:
                break
            self._drop(old)
            self.counters["evictions"] += 1
        if self._size() + size > self.max_bytes:
            self._drop(entry.key)
            return
        entry.spans.append((start, [(c.k[:, :, start:end].clone(), c.v[:, :, start:end].clone()) for c in caches]))
        entry.copied, entry.bytes = end, entry.bytes + size
        self.counters["copied_tokens"] += end - start

    def _write_back(self, entry: _Entry, n: int, caches: list) -> None:
        """Copy the entry's copied positions below n back into the caches."""
        for start, layers in entry.spans:
            if start >= n:
                break
            end = min(n, start + layers[0][0].shape[2])
            for cache, (k, v) in zip(caches, layers):
                cache.k[:, :, start:end].copy_(k[:, :, : end - start])
                cache.v[:, :, start:end].copy_(v[:, :, : end - start])

    def _drop(self, key: tuple[int, ...]) -> None:
        del self._entries[key]

"""Extra context for completions: a ring of chunks from other files the user opened or edited.

After llama.vim's ring: a chunk is up to CHUNK_LINES lines of a file (its start when it is
opened, the lines around the last edit when it is saved or left). A new chunk evicts chunks that
are nearly the same (> EVICT_SIMILARITY, e.g. the same region saved twice); the ring keeps the
newest CAPACITY. At request time, chunks from the current file and chunks much like the code
around the cursor (> DROP_SIMILARITY) are left out: the prompt already has that text.

Chunks keep their order in the ring, and the ring changes only on open, save or a switch between
files, so the prompt's context part stays the same while someone types: the engine reuses it.
"""

from __future__ import annotations

from dataclasses import dataclass

CAPACITY = 16
CHUNK_LINES = 64
EVICT_SIMILARITY = 0.9
DROP_SIMILARITY = 0.5


@dataclass(frozen=True)
class RingChunk:
    uri: str
    path: str
    text: str
    lines: frozenset[str]  # its non-blank lines, stripped: what similarity compares


def similarity(a: frozenset[str], b: frozenset[str]) -> float:
    """Share of lines the two have in common (Dice coefficient over non-blank lines)."""
    if not a or not b:
        return 0.0
    return 2 * len(a & b) / (len(a) + len(b))


def line_set(text: str) -> frozenset[str]:
    return frozenset(line.strip() for line in text.splitlines() if line.strip())


class ContextRing:
    def __init__(self, capacity: int = CAPACITY):
        self.capacity = capacity
        self.chunks: list[RingChunk] = []

    def add(self, uri: str, path: str, text: str, around_line: int = 0) -> None:
        """Take the CHUNK_LINES lines of `text` around `around_line` into the ring."""
        lines = text.splitlines(keepends=True)
        start = max(0, min(around_line - CHUNK_LINES // 2, len(lines) - CHUNK_LINES))
        body = "".join(lines[start : start + CHUNK_LINES])
        new = RingChunk(uri, path, body, line_set(body))
        if not new.lines:
            return
        self.chunks = [c for c in self.chunks if similarity(c.lines, new.lines) <= EVICT_SIMILARITY]
        self.chunks.append(new)
        del self.chunks[: -self.capacity]

    def pick(self, uri: str, local_text: str) -> list[dict]:
        """The chunks to send with a completion in `uri` whose text near the cursor is `local_text`."""
        local = line_set(local_text)
        return [
            {"path": c.path, "text": c.text}
            for c in self.chunks
            if c.uri != uri and similarity(c.lines, local) <= DROP_SIMILARITY
        ]

"""Stop strings on a text stream: cut at the first stop, and hold back only what could start one."""

from __future__ import annotations


class StopMatcher:
    def __init__(self, stops: list[str] | tuple[str, ...]):
        self.stops = [s for s in stops if s]
        self.pending = ""  # text held back because it could be the start of a stop string
        self.hit: str | None = None  # the stop string that ended the text, once one has

    def feed(self, text: str) -> tuple[str, bool]:
        """New text -> (text safe to emit now, whether a stop string was hit)."""
        if not self.stops:
            return text, False
        buffer = self.pending + text
        hits = [(i, s) for s in self.stops if (i := buffer.find(s)) >= 0]
        if hits:
            self.pending = ""
            at, self.hit = min(hits)
            return buffer[:at], True
        keep = self._partial_tail(buffer)
        self.pending = buffer[len(buffer) - keep :] if keep else ""
        return buffer[: len(buffer) - keep], False

    def flush(self) -> str:
        text, self.pending = self.pending, ""
        return text

    def _partial_tail(self, buffer: str) -> int:
        """Length of the longest suffix of buffer that is a proper prefix of some stop string."""
        longest = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(buffer)), longest, -1):
                if buffer.endswith(stop[:n]):
                    longest = n
                    break
        return longest

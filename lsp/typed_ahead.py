"""The typed-ahead cache: typing the first characters of a shown suggestion reuses it, no engine call.

Suggestions are kept by the text before and after the cursor when they were made (an LRU). For a
new cursor, we walk back over what was typed since (up to WALK_BACK characters): if a suggestion
made there starts with exactly what was typed, its rest is the answer. Typing along a suggestion
then costs a dictionary lookup per keystroke, not a model call.
"""

from __future__ import annotations

from collections import OrderedDict

WALK_BACK = 128  # characters typed along one suggestion that can still reuse it
PREFIX_KEY_CHARS = 2048  # the key holds this much text before the cursor ...
SUFFIX_KEY_CHARS = 512  # ... and this much after it: enough to tell places apart


class TypedAheadCache:
    def __init__(self, capacity: int = 256):
        self.capacity = capacity
        self._entries: OrderedDict[tuple[str, str], str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, prefix: str, suffix: str, suggestion: str) -> None:
        key = _key(prefix, suffix)
        self._entries[key] = suggestion
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def get(self, prefix: str, suffix: str) -> str | None:
        """The rest of a suggestion that what was typed since agrees with; None if there is none.

        "" means: at this very place the model suggested nothing (no need to ask again).
        """
        for typed in range(min(WALK_BACK, len(prefix)) + 1):
            key = _key(prefix[: len(prefix) - typed], suffix)
            suggestion = self._entries.get(key)
            if suggestion is None:
                continue
            if typed == 0 or (len(suggestion) > typed and suggestion.startswith(prefix[len(prefix) - typed :])):
                self._entries.move_to_end(key)
                return suggestion[typed:]
        return None


def _key(prefix: str, suffix: str) -> tuple[str, str]:
    return prefix[-PREFIX_KEY_CHARS:], suffix[:SUFFIX_KEY_CHARS]

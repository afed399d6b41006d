"""Incremental detokenization: token ids in, text out as soon as it is whole UTF-8.

Byte-level BPE tokens can split a character (an emoji, a CJK character) across tokens. Decoding
token by token would emit U+FFFD replacement characters; instead we decode a short window and
emit only text that no later token can change.
"""

from __future__ import annotations

from lingcode.text.tokenizer import Tokenizer


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, skip_ids: frozenset[int] = frozenset()):
        self.tokenizer = tokenizer
        self.skip_ids = skip_ids  # e.g. the eos token: ends the text, is not part of it
        self.ids: list[int] = []
        self.prefix_offset = 0  # ids[prefix_offset:read_offset] are context already emitted
        self.read_offset = 0

    def add(self, token_ids: list[int]) -> str:
        """Feed new ids, get the text they completed ("" while a character is still partial)."""
        self.ids.extend(t for t in token_ids if t not in self.skip_ids)
        prefix = self.tokenizer.decode(self.ids[self.prefix_offset : self.read_offset])
        text = self.tokenizer.decode(self.ids[self.prefix_offset :])
        if len(text) > len(prefix) and not text.endswith("\ufffd"):
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            return text[len(prefix) :]
        return ""

    def flush(self) -> str:
        """At the end of a generation: whatever is left, replacement characters and all."""
        prefix = self.tokenizer.decode(self.ids[self.prefix_offset : self.read_offset])
        text = self.tokenizer.decode(self.ids[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(self.ids)
        return text[len(prefix) :]

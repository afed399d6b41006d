"""The tokenizer, built with the `tokenizers` library from what the model ships.

A GGUF carries its own vocabulary and merges (byte-level BPE for Llama-family "gpt2" models); a
Hugging Face directory carries tokenizer.json. Either way nothing is fetched from a model hub.
"""

from __future__ import annotations

import functools
import json
import re
from collections import OrderedDict
from pathlib import Path

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

# GGUF token types (llama.cpp): 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
_CONTROL, _USER_DEFINED = 3, 4

# Pre-tokenizer regexes per GGUF `tokenizer.ggml.pre` (llama.cpp's table, the families we load).
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# llama.cpp's for "qwen2" (src/llama-vocab.cpp, LLAMA_VOCAB_PRE_TYPE_QWEN2; run by its hand-written
# unicode_regex_split_custom_qwen2): Qwen2's own, digits one by one, with the (?i:...) contractions
# spelled out ASCII-only, as llama.cpp matches them (onig's case folding would also take 'ſ' for 's').
_QWEN2_SPLIT = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# llama.cpp tells letters and digits by its own tables (src/unicode-data.cpp), made before Unicode
# 16.0; onig (tokenizers' regexes) knows 16.0, whose new letters and digits (Garay, Kirat Rai,
# Egyptian Hieroglyphs Extended-A, ...) are neither to llama.cpp. Taken out of \p{L} and \p{N}, so
# that text holding them splits, and so encodes, as llama.cpp does.
_UNICODE16_LETTERS = (
    (0x1C89, 0x1C8A), (0xA7CB, 0xA7CD), (0xA7DA, 0xA7DC), (0x105C0, 0x105F3), (0x10D4A, 0x10D65),
    (0x10D6F, 0x10D85), (0x10EC2, 0x10EC4), (0x11380, 0x11389), (0x1138B, 0x1138B), (0x1138E, 0x1138E),
    (0x11390, 0x113B5), (0x113B7, 0x113B7), (0x113D1, 0x113D1), (0x113D3, 0x113D3), (0x11BC0, 0x11BE0),
    (0x13460, 0x143FA), (0x16100, 0x1611D), (0x16D40, 0x16D6C), (0x18CFF, 0x18CFF), (0x1E5D0, 0x1E5ED),
    (0x1E5F0, 0x1E5F0),
)  # fmt: skip
_UNICODE16_DIGITS = (
    (0x10D40, 0x10D49), (0x116D0, 0x116E3), (0x11BF0, 0x11BF9), (0x16130, 0x16139), (0x16D70, 0x16D79),
    (0x1CCF0, 0x1CCF9), (0x1E5F1, 0x1E5FA),
)  # fmt: skip


def _without(category: str, ranges) -> str:
    """An onig class: the Unicode category less the ranges (it nests inside another class too)."""
    return rf"[\p{{{category}}}&&[^" + "".join(rf"\x{{{a:X}}}-\x{{{b:X}}}" for a, b in ranges) + "]]"


_LETTER, _NUMBER = _without("L", _UNICODE16_LETTERS), _without("N", _UNICODE16_DIGITS)


def _as_llama_cpp(regex: str) -> str:
    r"""regex with llama.cpp's letters and digits for \p{L} and \p{N}."""
    return regex.replace(r"\p{L}", _LETTER).replace(r"\p{N}", _NUMBER)


def _byte_level_chars() -> dict[int, str]:
    """GPT-2's byte-level alphabet backwards, as a str.translate table: each of its 256 characters
    to the byte it stands for (as a latin-1 character), and every other character below 256 to one
    that latin-1 cannot encode, so that a token holding one fails (see token_bytes)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), 256)]
    table = {b: chr(b) for b in printable}
    shifted = (b for b in range(256) if b not in table)
    table.update({256 + n: chr(b) for n, b in enumerate(shifted)})
    table.update({c: "\U0010ffff" for c in range(256) if c not in printable})
    return table


def _pre_tokenizer(pre: str):
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if pre in ("smollm", "starcoder", "refact", "codeshell"):
        # Digits split one by one, then GPT-2's split (StarCoder-style tokenizers).
        digits = pre_tokenizers.Split(Regex(_NUMBER), behavior="isolated")
        split = pre_tokenizers.Split(Regex(_as_llama_cpp(_GPT2_SPLIT)), behavior="isolated")
        return pre_tokenizers.Sequence([digits, split, byte_level])
    if pre in ("llama3", "llama-bpe", "smaug-bpe"):
        split = pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated")
        return pre_tokenizers.Sequence([split, byte_level])
    if pre in ("qwen2", "stablelm2", "deepseek-r1-qwen", "megrez"):  # those llama.cpp maps to QWEN2's regex
        split = pre_tokenizers.Split(Regex(_as_llama_cpp(_QWEN2_SPLIT)), behavior="isolated")
        return pre_tokenizers.Sequence([split, byte_level])
    if pre in ("default", "gpt2", "gpt-2"):
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    raise ValueError(f"unsupported GGUF pre-tokenizer {pre!r}")


RELEASE_GIL_CHARS = 16_384  # longer texts are encoded with the GIL released
PIECE_CACHE_CHARS = 4_000_000  # text kept by encode()'s cache of pieces between added tokens
REUSE_CHARS = 4_096  # encode() keeps the last text this long or longer, to reuse its ids
# A special token's text inside a client's text, as mark_specials() writes it: MARK, a private-use
# character naming which one, MARK. encode() reads it back as that text, tokenized as plain text.
MARK = "\U0010fffd"
_MARKED = 0xF0000  # the private-use character of special text n is chr(_MARKED + n)


class Tokenizer:
    """Text <-> token ids. Special-token text in the input (e.g. <|im_start|>) becomes its id,
    unless mark_specials() marked it (a client's text in a chat prompt)."""

    def __init__(self, hf: HFTokenizer):
        self.hf = hf
        self.vocab_size = hf.get_vocab_size(with_added_tokens=True)
        added = hf.get_added_tokens_decoder()
        self.special_ids = frozenset(i for i, tok in added.items() if tok.special)
        self._plain: HFTokenizer | None = None  # built on first encode_text()
        # The tokenizer splits its input at added tokens (<|im_start|>, ...) before anything else, so
        # the pieces between them encode independently: encode() remembers pieces it has seen (a
        # chat's earlier messages, resent every turn). Only where that split is plain: added tokens
        # that match their exact text, with no whitespace stripping around them.
        plain = all(not (t.lstrip or t.rstrip or t.single_word or t.normalized) for t in added.values())
        self._added_ids = {t.content: i for i, t in added.items()}
        names = sorted(self._added_ids, key=len, reverse=True)  # leftmost, then longest, as the tokenizer matches
        self._split = re.compile("(" + "|".join(map(re.escape, names)) + ")") if plain and names else None
        self._pieces: OrderedDict[str, list[int]] = OrderedDict()
        self._piece_chars = 0
        # A text that begins with an earlier one up to the end of one of its added tokens splits the
        # same way up to there, unless an added token can hold another (a longer match could then
        # start there or before): the ids up to it are the earlier text's (a chat's next turn).
        self._reuses = self._split is not None and not any(a != b and a in b for a in names for b in names)
        if self._split is not None:
            # encode() finds added tokens itself and hands the tokenizer only the text between them,
            # so this one instance can keep special-token text as text for encode_text(): no second
            # copy of the vocabulary (~80 MB of a daemon's memory for Qwen's 151,936 tokens).
            hf.encode_special_tokens = True
            self._plain = hf
        self._last: tuple[str, list[int], list[tuple[int, int]]] | None = (
            None  # text, ids, (char end, ids) per added token
        )
        # The texts mark_specials() marks: every special token's (leftmost, then longest), and MARK itself.
        specials = sorted((t.content for t in added.values() if t.special), key=len, reverse=True)
        self._special_texts = [*specials, MARK]
        self._special_index = {text: n for n, text in enumerate(self._special_texts)}
        self._find_special = re.compile("|".join(map(re.escape, self._special_texts)))
        self._split_special = re.compile("(" + "|".join(map(re.escape, specials)) + ")") if specials else None
        self._find_marked = re.compile(f"{MARK}([{chr(_MARKED)}-{chr(_MARKED + len(self._special_texts) - 1)}]){MARK}")

    # Pickled (in a prepared model's checkpoint, the engine process's ModelInfo) as the tokenizer alone,
    # and built again when loaded: one that an earlier lingcode pickled gets this version's attributes.
    def __getstate__(self) -> dict:
        return {"hf": self.hf}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["hf"])

    @classmethod
    def from_gguf_fields(cls, fields: dict) -> "Tokenizer":
        """Build from GGUF metadata (`tokenizer.ggml.*`), as read by lingcode.engine.local.weights."""
        kind = fields["tokenizer.ggml.model"]
        if kind != "gpt2":
            raise ValueError(f"unsupported GGUF tokenizer model {kind!r} (byte-level BPE 'gpt2' only)")
        tokens: list[str] = fields["tokenizer.ggml.tokens"]
        merges = [tuple(m.split(" ", 1)) for m in fields["tokenizer.ggml.merges"]]
        types = fields.get("tokenizer.ggml.token_type") or [1] * len(tokens)
        vocab = {tok: i for i, tok in enumerate(tokens)}
        hf = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
        hf.pre_tokenizer = _pre_tokenizer(fields.get("tokenizer.ggml.pre", "default"))
        # A byte the vocabulary lacks (SmolLM2's has no 0x04, no 0xF1, ...): llama.cpp's BPE keeps it in
        # the word as a symbol nothing merges with, then drops it; tokenizers' drops it first, and would
        # merge the bytes either side. Cutting the word there, the byte dropped, gives llama.cpp's ids.
        alphabet = (chr(c) for c, byte in _byte_level_chars().items() if byte != "\U0010ffff")
        missing = "".join(sorted(c for c in alphabet if c not in vocab))
        if missing:
            cut = pre_tokenizers.Split(Regex(f"[{re.escape(missing)}]"), behavior="removed")
            hf.pre_tokenizer = pre_tokenizers.Sequence([hf.pre_tokenizer, cut])
        hf.decoder = decoders.ByteLevel()
        added = [
            AddedToken(tok, special=(t == _CONTROL), normalized=False)
            for tok, t in zip(tokens, types)
            if t in (_CONTROL, _USER_DEFINED)
        ]
        hf.add_tokens(added)  # ids already exist in the vocab, so they keep their ids
        return cls(hf)

    @classmethod
    def from_file(cls, path: str | Path) -> "Tokenizer":
        return cls(HFTokenizer.from_file(str(path)))

    def mark_specials(self, value):
        """value (a string, or lists and dicts of them: messages, tools) with every special token's
        text marked, so that encode() takes it as plain text: a client's text rendered into a chat
        template cannot fake the template's turns. Only what the template writes itself is special."""
        if isinstance(value, str):
            return self._find_special.sub(self._mark, value)
        if isinstance(value, dict):
            return {k: self.mark_specials(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.mark_specials(v) for v in value]
        return value

    def _mark(self, found: re.Match) -> str:
        return f"{MARK}{chr(_MARKED + self._special_index[found.group()])}{MARK}"

    def unmark(self, text: str) -> str:
        """text with what mark_specials() marked written back as it was."""
        if MARK not in text:
            return text
        return self._find_marked.sub(lambda found: self._special_texts[ord(found.group(1)) - _MARKED], text)

    def encode(self, text: str) -> list[int]:
        """The text's ids: special-token text is its id, unless mark_specials() marked it."""
        if self._split is None:
            return self._encode_marked(text) if MARK in text else self._encode(text)
        # 1. what the last long text gives of this one: the ids up to an added token both share
        long = self._reuses and len(text) >= REUSE_CHARS
        start, ids, ends = 0, [], []
        if long and self._last is not None:
            start, ids, ends = self._shared(text, *self._last)
        # 2. the rest, a piece between added tokens at a time
        at = start
        for i, piece in enumerate(self._split.split(text[start:] if start else text)):
            at += len(piece)
            if i % 2:  # an added token
                ids.append(self._added_ids[piece])
                ends.append((at, len(ids)))
            elif piece:
                ids += self._piece(piece)
        if long:
            self._last = (text, ids[:], ends)  # a copy: the caller owns what it is given
        return ids

    @staticmethod
    def _shared(text: str, last: str, last_ids: list[int], ends: list[tuple[int, int]]):
        """(chars, ids, ends) of `last` up to the end of its latest added token that `text` begins with too."""
        if text.startswith(last) and ends:
            found = len(ends) - 1
        else:  # the latest end both share: the test is monotone in the end, so halve the range
            low, high, found = 0, len(ends) - 1, -1
            while low <= high:
                mid = (low + high) // 2
                if text.startswith(last[: ends[mid][0]]):
                    found, low = mid, mid + 1
                else:
                    high = mid - 1
        if found < 0:
            return 0, [], []
        chars, count = ends[found]
        return chars, last_ids[:count], ends[: found + 1]

    def _encode(self, text: str) -> list[int]:
        # tokenizers' encode() holds the GIL for the whole text, encode_batch() lets it go: a long text
        # (a pasted file) encoded on a thread must not stall the daemon's event loop meanwhile.
        if len(text) < RELEASE_GIL_CHARS:
            return self.hf.encode(text, add_special_tokens=False).ids
        return self.hf.encode_batch([text], add_special_tokens=False)[0].ids

    def _piece(self, text: str) -> list[int]:
        cached = self._pieces.get(text)
        if cached is not None:
            self._pieces.move_to_end(text)
            return cached
        # Short pieces too: a template's own ("\n", "assistant\n") recur in every prompt, and
        # after an engine step has gone through the caches one encode call costs ~40 us, a lookup ~1.
        # The tokenizer takes special-token text as text here (encode_special_tokens), marked or not.
        ids = self._encode(self.unmark(text))
        self._pieces[text] = ids
        self._piece_chars += len(text)
        while self._piece_chars > PIECE_CACHE_CHARS:
            old, _ = self._pieces.popitem(last=False)
            self._piece_chars -= len(old)
        return ids

    def _encode_marked(self, text: str) -> list[int]:
        # A tokenizer whose added tokens do not split plainly: the special tokens the template wrote
        # are their ids, the text between them (marked text written back) is encoded as encode_text().
        ids: list[int] = []
        pieces = self._split_special.split(text) if self._split_special is not None else [text]
        for i, piece in enumerate(pieces):
            if i % 2:
                ids.append(self.hf.token_to_id(piece))
            elif piece:
                ids += self.encode_text(self.unmark(piece))
        return ids

    def encode_text(self, text: str) -> list[int]:
        """Like encode(), but special-token text stays text: for user content (a file that
        mentions `<file_sep>` must not inject that token into a completion prompt)."""
        if self._plain is None:
            plain = HFTokenizer.from_str(self.hf.to_str())
            plain.encode_special_tokens = True
            self._plain = plain
        return self._plain.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.hf.decode(ids, skip_special_tokens=skip_special_tokens)

    @functools.cached_property
    def token_bytes(self) -> list[bytes] | None:
        """Each id's bytes, where the tokenizer's decoder is byte-level (GPT-2's): decoding ids is
        then their bytes joined, read as UTF-8, which a stream can do a chunk at a time without
        decoding a window again (lingcode.pipeline.generation). None for any other decoder."""
        if not isinstance(self.hf.decoder, decoders.ByteLevel):
            return None
        chars = _byte_level_chars()
        table = [b""] * self.vocab_size
        for token, i in self.hf.get_vocab(with_added_tokens=True).items():
            try:
                table[i] = token.translate(chars).encode("latin-1")
            except UnicodeEncodeError:  # not all in the alphabet: the decoder takes the token's own text
                table[i] = token.encode()
        return table

    def token_to_id(self, token: str) -> int | None:
        return self.hf.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self.hf.id_to_token(token_id)


def load_hf_tokenizer_config(model_dir: Path) -> dict:
    """tokenizer_config.json (chat template, bos/eos text), or {} when the directory has none."""
    path = model_dir / "tokenizer_config.json"
    if not path.exists():
        return {}
    config = json.loads(path.read_text())
    template_file = model_dir / "chat_template.jinja"
    if "chat_template" not in config and template_file.exists():
        config["chat_template"] = template_file.read_text()
    return config

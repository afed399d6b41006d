"""Constrained decoding with xgrammar: a TokenConstraint that masks every token the grammar forbids.

Used for `tool_choice` required / a named function (the model must write a well-formed call of
one of the tools, arguments valid against its schema) and for `response_format` JSON. The engine
calls mask_logits() before each sampled token and accept() after it (lingcode.engine.TokenConstraint).

xgrammar is an optional dependency (`pip install 'lingcode[grammar]'`; it pulls transformers):
it is imported on the first constrained request, and its absence is a GrammarUnavailable that the
server turns into a 400 saying how to install it. Compiled grammars are cached per tokenizer.
"""

from __future__ import annotations

import json
import threading
from functools import lru_cache

import torch

from lingcode.text.tokenizer import Tokenizer


class GrammarUnavailable(RuntimeError):
    """xgrammar is not installed, so constrained decoding cannot run here."""


class GrammarError(ValueError):
    """The schema or grammar is not one xgrammar can compile (the client's fault: a 400)."""


def _xgr():
    try:
        import xgrammar
    except ImportError as exc:
        raise GrammarUnavailable(
            "constrained decoding (tool_choice required or named, response_format json) needs xgrammar, "
            "which is not installed: pip install 'lingcode[grammar]'"
        ) from exc
    return xgrammar


class _Compiler:
    """One xgrammar compiler per tokenizer, with compiled grammars cached by their JSON spec."""

    def __init__(self, tokenizer: Tokenizer, stop_ids: tuple[int, ...]):
        xgr = _xgr()
        self.vocab_size = tokenizer.vocab_size
        # Byte-level BPE strings as stored; special tokens become "" so that xgrammar treats them
        # as special (never text), except the stop ids, which end a finished grammar.
        vocab = [tokenizer.id_to_token(i) or "" for i in range(self.vocab_size)]
        for i in tokenizer.special_ids:
            vocab[i] = ""
        info = xgr.TokenizerInfo(vocab, vocab_type=xgr.VocabType.BYTE_LEVEL, vocab_size=self.vocab_size,
                                 stop_token_ids=list(stop_ids), add_prefix_space=False)  # fmt: skip
        self.compiler = xgr.GrammarCompiler(info, max_threads=1)
        self.lock = threading.Lock()
        self.compile = lru_cache(maxsize=64)(self._compile)

    def _compile(self, kind: str, spec: str):
        try:
            with self.lock:
                if kind == "structural_tag":
                    return self.compiler.compile_structural_tag(spec)
                if kind == "json_schema":
                    return self.compiler.compile_json_schema(spec, any_whitespace=False)
                if kind == "json":
                    return self.compiler.compile_builtin_json_grammar()
        except (RuntimeError, ValueError, TypeError) as exc:  # xgrammar raises RuntimeError subclasses
            raise GrammarError(f"cannot compile the {kind.replace('_', ' ')}: {exc}") from None
        raise ValueError(f"unknown grammar kind {kind!r}")


_compilers: dict[int, _Compiler] = {}


def _compiler(tokenizer: Tokenizer, stop_ids: tuple[int, ...]) -> _Compiler:
    key = id(tokenizer)
    if key not in _compilers:
        _compilers[key] = _Compiler(tokenizer, stop_ids)
    return _compilers[key]


class GrammarConstraint:
    """Per request: a grammar matcher and its token bitmask (filled on the CPU, applied where the logits are)."""

    def __init__(self, compiled, vocab_size: int):
        xgr = _xgr()
        self._xgr = xgr
        self.matcher = xgr.GrammarMatcher(compiled)
        self.vocab_size = vocab_size
        self.bitmask = xgr.allocate_token_bitmask(1, vocab_size)
        self.tokens_accepted = 0

    def mask_logits(self, logits: torch.Tensor) -> None:
        self.matcher.fill_next_token_bitmask(self.bitmask)
        if logits.shape[-1] > self.vocab_size:  # padded output rows are never valid tokens
            logits[..., self.vocab_size :] = float("-inf")
        self._xgr.apply_token_bitmask_inplace(logits, self.bitmask.to(logits.device, non_blocking=True),
                                              vocab_size=self.vocab_size)  # fmt: skip

    def accept(self, token_id: int) -> None:
        if not self.matcher.accept_token(token_id):
            raise RuntimeError(f"the grammar rejected token {token_id}")
        self.tokens_accepted += 1

    def is_terminated(self) -> bool:
        return self.matcher.is_terminated()


def constraint(tokenizer: Tokenizer, stop_ids: tuple[int, ...], kind: str, spec: dict | None = None) -> GrammarConstraint:
    """A fresh constraint for one request. kind: "structural_tag", "json_schema" (spec: the schema), "json"."""
    compiler = _compiler(tokenizer, stop_ids)
    text = json.dumps(spec) if spec is not None else ""  # key order matters: properties come in schema order
    return GrammarConstraint(compiler.compile(kind, text), compiler.vocab_size)

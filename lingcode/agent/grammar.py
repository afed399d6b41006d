"""Constrained decoding with llguidance: a TokenConstraint that masks every token the grammar forbids.

Used for `tool_choice` required / a named function (the model must write a well-formed call of
one of the tools, arguments valid against its schema: a Lark grammar from
lingcode.agent.tool_parsers.tool_call_grammar) and for `response_format` JSON. The engine calls
mask_logits() before each sampled token and accept() after it (lingcode.engine.TokenConstraint).

Bounds: a grammar's text is at most MAX_GRAMMAR_BYTES, llguidance's fuel limits (_limits) cap the
work of a compile and of each token's mask, and a probe at compile (_probe) refuses a grammar over
the parser's row limit, so no schema holds a thread for long (an enum of 10,000 long strings
compiles in ~20 ms; `lingcode bench grammar`) and a bad one is a 400. Compiles hold no lock: one
request's grammar never waits for another's. `cancel` is checked before and after the compile,
so a caller whose client has gone drops the result instead of decoding with it.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

import numpy as np

from lingcode.agent.tool_parsers import JSON_STYLE, closed
from lingcode.text.tokenizer import Tokenizer

if TYPE_CHECKING:
    import torch

MAX_GRAMMAR_BYTES = 1 << 20  # a grammar or schema's text: far over real agents' tool sets (~60 KB)
CACHED_GRAMMARS = 64


class GrammarUnavailable(RuntimeError):
    """llguidance cannot be imported here (no wheel for this platform), so constrained decoding cannot run."""


class GrammarError(ValueError):
    """The schema or grammar is not one lingcode can compile, or is over the bounds (the client's fault: a 400)."""


class GrammarCancelled(RuntimeError):
    """The caller cancelled the compile (its client went away)."""


def _llg():
    try:
        import llguidance
    except ImportError as exc:
        raise GrammarUnavailable(
            f"constrained decoding needs llguidance, which cannot be imported here: {exc}"
        ) from exc
    return llguidance


def _limits():
    # llguidance's own defaults, named here so that the bounds are visible and tested: compile fuel
    # ~20 ms of lexer work, a step's mask at most ~15 ms, 500k grammar symbols.
    return _llg().LLParserLimits(
        initial_lexer_fuel=1_000_000,
        step_lexer_fuel=200_000,
        step_max_items=50_000,
        max_grammar_size=500_000,
        verbose_errors=False,
    )


class _Compiler:
    """One llguidance tokenizer per model tokenizer, and compiled grammars (matchers to copy) by their text."""

    def __init__(self, tokenizer: Tokenizer, stop_ids: tuple[int, ...]):
        llg = _llg()
        self.vocab_size = tokenizer.vocab_size
        self.tokenizer = llg.LLTokenizer(tokenizer.hf.to_str(), n_vocab=self.vocab_size, eos_token=list(stop_ids))
        self.compiled: OrderedDict[str, object] = OrderedDict()
        self.lock = threading.Lock()  # guards the dict only, never held while compiling

    def matcher(self, grammar: str, cancel: threading.Event | None):
        with self.lock:
            template = self.compiled.get(grammar)
            if template is not None:
                self.compiled.move_to_end(grammar)
        if template is None:
            if cancel is not None and cancel.is_set():
                raise GrammarCancelled("the grammar was not compiled: the request was cancelled")
            llg = _llg()
            template = llg.LLMatcher(self.tokenizer, grammar, log_level=0, limits=_limits())  # drops the GIL
            if template.is_error():
                raise GrammarError(f"cannot compile the grammar: {_first_line(template.get_error())}")
            _probe(template)
            with self.lock:
                self.compiled[grammar] = template
                while len(self.compiled) > CACHED_GRAMMARS:
                    self.compiled.popitem(last=False)
        if cancel is not None and cancel.is_set():
            raise GrammarCancelled("the grammar was compiled for a request that was cancelled")
        return template.deep_copy()


_compilers: dict[int, _Compiler] = {}
_compilers_lock = threading.Lock()  # building the first one reads the vocabulary (~0.5 s), once


def _compiler(tokenizer: Tokenizer, stop_ids: tuple[int, ...]) -> _Compiler:
    key = id(tokenizer)
    with _compilers_lock:
        if key not in _compilers:
            _compilers[key] = _Compiler(tokenizer, stop_ids)
        return _compilers[key]


def prepare(tokenizer: Tokenizer, stop_ids: tuple[int, ...]) -> None:
    """Build the model's compiler now (~0.25 s on 2 cores, holding the GIL) rather than in the first
    constrained request. One that cannot be built (no llguidance here, a tokenizer it cannot read)
    is left for that request, which tries again and reports why: the daemon starts either way."""
    try:
        _compiler(tokenizer, stop_ids)
    except Exception:  # noqa: BLE001
        pass


class GrammarConstraint:
    """Per request: a grammar matcher and its token bitmask (filled on the CPU, applied where the logits are)."""

    def __init__(self, matcher, vocab_size: int):
        self.matcher = matcher
        self.vocab_size = vocab_size
        # Made at the first mask: a daemon whose engine runs in its own process compiles a request's
        # grammar only to check it, and would otherwise import torch for it (~1.2 s, once).
        self.bitmask: torch.Tensor | None = None
        self._bits: dict[torch.device, torch.Tensor] = {}
        self.tokens_accepted = 0
        self.source: tuple | None = None  # (stop_ids, kind, spec), as constraint() was called

    def mask_logits(self, logits: torch.Tensor) -> None:
        import torch

        if self.bitmask is None:
            words = (self.vocab_size + 31) // 32
            self.bitmask = torch.empty(words, dtype=torch.int32, pin_memory=torch.cuda.is_available())
        self.matcher.unsafe_compute_mask_ptr(self.bitmask.data_ptr(), self.bitmask.numel() * 4)  # drops the GIL
        if self.matcher.is_error():
            raise GrammarError(f"the grammar failed at this token: {_first_line(self.matcher.get_error())}")
        logits[..., self.vocab_size :] = float("-inf")  # padded rows are never tokens
        if logits.device.type == "cpu" and logits.dtype != torch.bfloat16:  # numpy has no bf16
            # numpy, one thread: torch splits a 49k-wide fill across its OpenMP threads, and on busy
            # cores a step then waits for a descheduled thread (up to ~100 ms seen on 2 cores)
            allowed = np.unpackbits(self.bitmask.numpy().view(np.uint8), bitorder="little", count=self.vocab_size)
            np.copyto(logits.numpy()[..., : self.vocab_size], -np.inf, where=~allowed.view(bool))
            return
        bits = self._bits.get(logits.device)
        if bits is None:
            bits = self._bits[logits.device] = torch.arange(32, dtype=torch.int32, device=logits.device)
        # bit j of word i allows token 32 i + j
        allowed = ((self.bitmask.to(logits.device, non_blocking=True)[:, None] >> bits) & 1).view(-1)
        logits[..., : self.vocab_size].masked_fill_(allowed[: self.vocab_size] == 0, float("-inf"))

    def accept(self, token_id: int) -> None:
        if not self.matcher.consume_token(token_id):
            raise RuntimeError(f"the grammar rejected token {token_id}: {_first_line(self.matcher.get_error())}")
        self.tokens_accepted += 1

    def is_terminated(self) -> bool:
        return self.matcher.is_stopped()


def grammar_text(kind: str, spec: dict | str | None = None) -> str:
    """The llguidance grammar for kind "lark" (spec: a Lark grammar), "json_schema" (spec: the schema) or "json"."""
    llg = _llg()
    if kind == "lark":
        text = spec
    elif kind in ("json_schema", "json"):
        text = json.dumps({"type": "object"} if spec is None or kind == "json" else closed(spec))  # key order kept
    else:
        raise ValueError(f"unknown grammar kind {kind!r}")
    if len(text.encode()) > MAX_GRAMMAR_BYTES:
        raise GrammarError(
            f"the {kind.replace('_', ' ')} is {len(text.encode())} bytes; at most {MAX_GRAMMAR_BYTES} are compiled"
        )
    if kind == "lark":
        return llg.LLMatcher.grammar_from_lark(text)
    try:
        return llg.LLMatcher.grammar_from_json_schema(text, defaults=JSON_STYLE)
    except ValueError as exc:
        raise GrammarError(f"cannot compile the JSON schema: {_first_line(str(exc))}") from None


def constraint(
    tokenizer: Tokenizer,
    stop_ids: tuple[int, ...],
    kind: str,
    spec: dict | str | None = None,
    cancel: threading.Event | None = None,
) -> GrammarConstraint:
    """A fresh constraint for one request. kind: "lark" (spec: a Lark grammar, e.g. tool_call_grammar's),
    "json_schema" (spec: the schema) or "json" (any JSON object). Raises GrammarError (bad or over the
    bounds), GrammarCancelled (cancel was set), GrammarUnavailable."""
    compiler = _compiler(tokenizer, stop_ids)
    made = GrammarConstraint(compiler.matcher(grammar_text(kind, spec), cancel), compiler.vocab_size)
    made.source = (stop_ids, kind, spec)  # to compile it again elsewhere (lingcode.engine.local.process)
    return made


def _probe(template) -> None:
    """Feed a copy the first token it allows: a grammar over the parser's limits (e.g. an anyOf of
    thousands of objects) fails there, and is then a 400 now rather than an engine error later."""
    probe = template.deep_copy()
    allowed = np.flatnonzero(np.unpackbits(np.frombuffer(probe.compute_bitmask(), dtype=np.uint8), bitorder="little"))
    if probe.is_error() or not allowed.size or not probe.consume_token(int(allowed[0])):
        raise GrammarError(
            f"the grammar is over lingcode's limits: {_first_line(probe.get_error() or 'no token allowed')}"
        )


def _first_line(message: str) -> str:
    return message.strip().split("\n", 1)[0][:300]

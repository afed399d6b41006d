"""Editor completion prompts: the code around the cursor, written the way the model's family knows.

Per family (lingcode/data/families.toml): fill-in-the-middle tokens where the model has them
(`<prefix> before <suffix> after <middle>`, and the model writes the middle), otherwise the prefix
alone after the repository-style header the model was trained on (SmolLM2: `<repo_name>` and
`<file_sep>path`). Extra context chunks from other files come first, each under its own header.

Each part has a token budget. The prefix is cut at the start of a line whose number is a multiple
of LINE_STRIDE, the earliest that fits: while someone types, the prompt's start stays where it
is (it moves by a whole stride only when the prefix outgrows its budget), so the engine's prefix
KV reuse prefills just the changed tail. Clients should send a prefix that starts at a line
number that is a multiple of LINE_STRIDE (the LSP sends multiples of 64) for the same reason.

User text (code, paths) is tokenized with special tokens as plain text: a file that mentions
`<file_sep>` cannot inject that token.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from functools import lru_cache

from lingcode.engine import ModelInfo
from lingcode.text.families import Family, families, family_for

LINE_STRIDE = 16
MAX_CHARS_PER_TOKEN = 8  # a generous bound: the first window encoded holds at least the budget

# File extensions for a path-less buffer, so the header still says what language it is.
EXTENSIONS = {
    "python": ".py", "javascript": ".js", "typescript": ".ts", "typescriptreact": ".tsx", "javascriptreact": ".jsx",
    "rust": ".rs", "go": ".go", "c": ".c", "cpp": ".cpp", "java": ".java", "lua": ".lua", "ruby": ".rb",
    "shellscript": ".sh", "sh": ".sh", "bash": ".sh", "html": ".html", "css": ".css", "json": ".json",
    "yaml": ".yaml", "toml": ".toml", "markdown": ".md", "sql": ".sql", "php": ".php", "kotlin": ".kt",
    "swift": ".swift", "csharp": ".cs", "haskell": ".hs", "elixir": ".ex", "zig": ".zig", "nix": ".nix",
}  # fmt: skip


@dataclass(frozen=True)
class Chunk:
    """Extra context: a piece of another file."""

    path: str
    text: str


@dataclass(frozen=True)
class CompletionInput:
    prefix: str  # the file's text before the cursor
    suffix: str = ""  # ... and after it
    path: str | None = None  # relative to the workspace, as the header shows it
    language: str | None = None  # the editor's language id, for a path-less buffer
    repo: str | None = None  # the workspace's name
    context: tuple[Chunk, ...] = ()


@dataclass(frozen=True)
class Budgets:
    prefix_tokens: int = 1024
    suffix_tokens: int = 256
    context_tokens: int = 512


@dataclass
class CompletionPrompt:
    input_ids: list[int]
    family: str
    fim: bool
    prefix_tokens: int
    suffix_tokens: int
    context_tokens: int
    context_chunks: int  # how many of the chunks sent fit in the budget
    prefix_start_line: int  # the line of the sent prefix where the prompt's prefix starts

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "input_ids"}


# --- families ---------------------------------------------------------------------------------


def completion_family(info: ModelInfo) -> Family:
    """The model's family by name; else the first whose FIM tokens its vocabulary has; else plain."""
    family = family_for(info)
    if family.name != "default":
        return family
    vocab = info.tokenizer
    for known in families():
        if known.fim and all(vocab.token_to_id(token) is not None for token in known.fim.values()):
            return Family(known.name, (), fim=known.fim)
    if info.fim_tokens:
        return Family("engine", (), fim=dict(info.fim_tokens))
    return Family("plain", ())


# --- the prompt -------------------------------------------------------------------------------


def build_prompt(
    info: ModelInfo, request: CompletionInput, budgets: Budgets = Budgets(), family: Family | None = None
) -> CompletionPrompt:
    """The prompt at the cursor; `family`: completion_family(info), if the caller keeps it."""
    family = family or completion_family(info)
    tok = info.tokenizer
    path = request.path or f"untitled{EXTENSIONS.get((request.language or '').lower(), '')}"

    def header(template: str | None, **values: str) -> list[int]:
        # Template text may hold special tokens; the values are user text and stay text.
        ids: list[int] = []
        for literal, field, _, _ in string.Formatter().parse(template or ""):
            ids += tok.encode(literal) if literal else []
            ids += tok.encode_text(values[field]) if field else []
        return ids

    head = header(family.repo_header, repo=request.repo) if request.repo else []
    context: list[int] = []
    used = 0
    for chunk in request.context:
        text = chunk.text if chunk.text.endswith("\n") else chunk.text + "\n"
        ids = header(family.file_header, path=chunk.path) + tok.encode_text(text)
        if len(context) + len(ids) <= budgets.context_tokens:
            context += ids
            used += 1
    typed = split_trailing_whitespace(request.prefix, request.suffix)[0]
    prefix_ids, start_line = _prefix_tail(tok, typed, budgets.prefix_tokens)
    ids = head + context + header(family.file_header, path=path)
    suffix_ids: list[int] = []
    if family.fim:
        suffix_ids = _suffix_head(tok, request.suffix, budgets.suffix_tokens)
        fim = family.fim
        ids += tok.encode(fim["prefix"]) + prefix_ids + tok.encode(fim["suffix"]) + suffix_ids
        ids += tok.encode(fim["middle"])
    else:
        ids += prefix_ids
    return CompletionPrompt(
        input_ids=ids,
        family=family.name,
        fim=bool(family.fim),
        prefix_tokens=len(prefix_ids),
        suffix_tokens=len(suffix_ids),
        context_tokens=len(context),
        context_chunks=used,
        prefix_start_line=start_line,
    )


def split_trailing_whitespace(prefix: str, suffix: str) -> tuple[str, str]:
    """(the prefix up to its last non-blank character, the whitespace after it): the prompt ends
    before that whitespace, and the model writes it with its first tokens (cuts.CutRules takes it off).

    BPE tokenizers join a run of spaces to the word after it (`   ` + ` return`), so a prompt that
    ends in the whole run makes the model start with one more space; one that ends in a newline
    is as unlike what the model saw (`\\n   ` is one token). With code right of the cursor (a
    single-line completion, which ends at its first newline) only the cursor line's are taken."""
    mid_line = bool(suffix.partition("\n")[0].strip())
    head = prefix.rstrip(" \t") if mid_line else prefix.rstrip()
    return head, prefix[len(head) :]


def _prefix_tail(tok, prefix: str, budget: int) -> tuple[list[int], int]:
    """The prefix's token ids from the earliest stride-aligned line that fits, and that line."""
    if budget <= 0 or not prefix:
        return [], 0
    lines = prefix.splitlines(keepends=True)
    chars_after = [0] * (len(lines) + 1)
    for i in range(len(lines) - 1, -1, -1):
        chars_after[i] = chars_after[i + 1] + len(lines[i])
    limit = budget * MAX_CHARS_PER_TOKEN
    # Starts whose text could not fit even at MAX_CHARS_PER_TOKEN are skipped without tokenizing.
    starts = [s for s in range(0, len(lines), LINE_STRIDE) if chars_after[s] <= limit]
    encoded: dict[int, list[int]] = {}

    def ids_from(i: int) -> list[int]:
        if i not in encoded:
            encoded[i] = _encode_window(tok, "".join(lines[starts[i] :]))
        return encoded[i]

    if starts:
        # Guess from the first window's characters per token, then step to the earliest start
        # that fits: the answer does not depend on the guess, so it is stable while typing.
        first = ids_from(0)
        i = 0
        if len(first) > budget:
            target = budget * chars_after[starts[0]] / len(first)
            i = next((j for j, s in enumerate(starts) if chars_after[s] <= target), len(starts) - 1)
        while len(ids_from(i)) > budget and i + 1 < len(starts):
            i += 1
        while i > 0 and len(ids_from(i - 1)) <= budget:
            i -= 1
        if len(ids_from(i)) <= budget:
            return ids_from(i), starts[i]
    # Even the last stride is over budget (very long lines): keep the tokens nearest the cursor.
    return tok.encode_text(prefix[-limit:])[-budget:], len(lines) - 1


def _encode_window(tok, window: str) -> list[int]:
    """The window's ids: everything before the cursor line's newline, then that line.

    While someone types, only the cursor line changes, so the part before it is looked up, not
    tokenized again. Splitting before a newline keeps the tokens the same as one encode of the
    whole window would give (pre-tokenization splits there), unless a line ends in spaces.
    """
    split = window.rfind("\n", 0, len(window) - 1)
    if split <= 0:
        return tok.encode_text(window)
    return _encode_cached(tok, window[:split]) + tok.encode_text(window[split:])


@lru_cache(maxsize=64)
def _encode_cached(tok, text: str) -> list[int]:
    return tok.encode_text(text)


def _suffix_head(tok, suffix: str, budget: int) -> list[int]:
    """The suffix's first whole lines that fit the budget (only FIM prompts have a suffix)."""
    if budget <= 0 or not suffix:
        return []
    lines = suffix[: budget * MAX_CHARS_PER_TOKEN].splitlines(keepends=True)
    kept: list[str] = []
    count = 0
    for line in lines:
        n = len(tok.encode_text(line))
        if count + n > budget:
            break
        kept.append(line)
        count += n
    return tok.encode_text("".join(kept))[:budget]

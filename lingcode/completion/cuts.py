"""Where an editor completion ends: the cut rules, applied to the text as the model writes it.

A suggestion is worth showing only if it fits where the cursor is, and every token past its end
costs the next keystroke a wait. So generation stops as soon as one of these says so:

- single line: with code right of the cursor (mid-line), the suggestion is the rest of this line
  only, and a tail that repeats what is already right of the cursor (a closing `)`) is dropped;
- indentation: a line indented less than the cursor line ends the suggestion (the block is over).
  When the cursor line opens a block (ends in `:`, `{`, `(` or `[`; on a blank cursor line, the
  line above it), a line back at the opener's indentation ends it too; a closing bracket there
  (`}`) is kept as the block's last line;
- the suffix: a line equal to the next non-blank line below the cursor is not written again;
- time budget: once the budget is spent, the line being written is the last one.

Trailing blank lines and spaces are never part of a suggestion. CutRules has StopMatcher's shape
(feed/flush), so lingcode.pipeline.generation applies it like a stop string: text is released only once no
later rule can take it back, and a cut aborts the request in the engine.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from lingcode.completion.prompt import split_trailing_whitespace

OPENERS = (":", "{", "(", "[")
CLOSERS = ("}", ")", "]")


def _last_nonblank_line(text: str) -> str:
    return next((line for line in reversed(text.split("\n")) if line.strip()), "")


def indentation(line: str) -> int:
    expanded = line.expandtabs(4)
    return len(expanded) - len(expanded.lstrip(" "))


class WhitespaceHeal:
    """The model's text with the whitespace the cursor already has after it taken off the front.

    The prompt ends before that whitespace (prompt.split_trailing_whitespace), so the model writes
    it again. Where it writes other whitespace, its lines are matched to the cursor's: more line
    breaks are kept, and on the cursor's line only indentation beyond the cursor's is kept."""

    def __init__(self, healed: str):
        self.healed = healed
        self.pending: str | None = "" if healed else None  # None: done, text passes as it comes

    def feed(self, text: str) -> str:
        if self.pending is None:
            return text
        self.pending += text
        if not self.pending.strip():
            return ""  # whitespace so far: what comes next decides
        return self.flush()

    def flush(self) -> str:
        if self.pending is None:
            return ""
        text, self.pending = self.pending, None
        rest = text.lstrip()
        written = text[: len(text) - len(rest)]
        if written.startswith(self.healed):
            return written[len(self.healed) :] + rest
        cursor_lines, lines = self.healed.split("\n"), written.split("\n")
        if len(lines) > len(cursor_lines):  # line breaks beyond the cursor's: a new line, as written
            return "\n" * (len(lines) - len(cursor_lines)) + lines[-1] + rest
        indent, cursor_indent = lines[-1], cursor_lines[-1]
        return (indent[len(cursor_indent) :] if indent.startswith(cursor_indent) else "") + rest


class CutRules:
    def __init__(
        self,
        prefix: str,
        suffix: str,
        *,
        multiline: bool | None = None,
        time_budget_ms: float | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        cursor_line = prefix[prefix.rfind("\n") + 1 :]
        rest_of_line, _, below = suffix.partition("\n")
        mid_line = bool(rest_of_line.strip())
        self.single_line = mid_line if multiline is None else not multiline
        self.rest_of_line = rest_of_line.strip()
        # A blank cursor line's indentation is the cursor's column: the code typed there starts there.
        self.indent = indentation(cursor_line) if cursor_line.strip() else len(cursor_line.expandtabs(4))
        # The block the suggestion is in: opened by the cursor line, or (on a blank cursor line) by
        # the line above it. Lines back at the opener's indentation are past the block.
        opener = cursor_line if cursor_line.strip() else _last_nonblank_line(prefix[: -len(cursor_line) or None])
        self.block_indent = indentation(opener) if opener.rstrip().endswith(OPENERS) else None
        self.next_line = next((line.strip() for line in below.split("\n") if line.strip()), "")
        self.deadline = None if time_budget_ms is None else clock() + time_budget_ms / 1000
        self.clock = clock
        self.heal = WhitespaceHeal(split_trailing_whitespace(prefix, suffix)[1])
        self.text = ""  # everything fed so far (the cursor's whitespace taken off)
        self.pos = 0  # text[pos:] is not decided yet
        self.suggestion = ""  # what was decided to be kept
        self.released = 0  # suggestion[:released] has been returned by feed()
        self.reason: str | None = None  # why it was cut: "newline", "indent", "block_end", "suffix", "time_budget"

    # --- the StopMatcher protocol ---------------------------------------------------------------

    def feed(self, text: str) -> tuple[str, bool]:
        self.text += self.heal.feed(text)
        while self.reason is None and (end := self.text.find("\n", self.pos)) >= 0:
            self._decide_line(self.text[self.pos : end], complete=True)
        return self._release(final=self.reason is not None), self.reason is not None

    def flush(self) -> str:
        """The generation ended (end of sequence, max tokens): the last, unfinished line is kept."""
        self.text += self.heal.flush()
        if self.reason is None:
            self._decide_line(self.text[self.pos :], complete=False)
        return self._release(final=True)

    # --- the rules ------------------------------------------------------------------------------

    def _decide_line(self, line: str, complete: bool) -> None:
        """Keep `line` (and its newline), or cut before or after it, setting self.reason."""
        first = self.pos == 0
        self.pos += len(line) + complete
        if self.single_line:
            self.suggestion += self._without_rest_of_line(line)
            if complete:
                self.reason = "newline"
            return
        if not first and line.strip():
            if line.strip() == self.next_line:
                self.reason = "suffix"
                return
            indent = indentation(line)
            past_block = self.block_indent is not None and indent <= self.block_indent
            if past_block and indent >= self.indent and line.strip().startswith(CLOSERS):
                self.suggestion += line  # the `}` that closes the block is its last line
                self.reason = "block_end"
                return
            if past_block or indent < self.indent:
                self.reason = "indent"
                return
        self.suggestion += line + ("\n" if complete else "")
        if complete and self.deadline is not None and self.clock() >= self.deadline:
            self.reason = "time_budget"

    def _without_rest_of_line(self, line: str) -> str:
        """The line minus a tail that repeats the text right of the cursor (the model cannot see it)."""
        if self.rest_of_line and line.rstrip().endswith(self.rest_of_line):
            return line.rstrip()[: -len(self.rest_of_line)]
        return line

    def _release(self, final: bool) -> str:
        """Decided text up to its last non-blank character; when final, the trailing blanks are dropped."""
        end = len(self.suggestion.rstrip())
        if final:
            self.suggestion = self.suggestion[:end]
        out = self.suggestion[self.released : end]
        self.released = max(self.released, end)
        return out

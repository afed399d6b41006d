"""Reasoning apart from the answer: <think>...</think> text in a stream, split off incrementally.

Some models (Ling-3.0, Qwen3) think before they answer. Their chat template may open the
thinking block in the generation prompt itself, so the output starts inside it with no opening
tag: `starts_inside` says so (the prompt ends with the start tag). Ling-3.0 may also go straight
from thinking to a tool call without closing the block: a `<tool_call>` ends reasoning too, and
is kept for the answer (the tool parser's input).
"""

from __future__ import annotations

from lingcode.text.families import Reasoning
from lingcode.agent.tool_parsers import split_at_tag


class ReasoningSplitter:
    def __init__(self, tags: Reasoning, starts_inside: bool):
        self.tags = tags
        self.inside = starts_inside
        self.seen_start = starts_inside  # reasoning happens once, at the start of the answer
        self.buffer = ""
        self.after_reasoning = False  # the answer's leading whitespace after </think> is dropped

    def feed(self, text: str) -> tuple[str, str]:
        """New text -> (reasoning, answer) that are safe to emit now."""
        self.buffer += text
        reasoning = answer = ""
        while self.buffer:
            if self.inside:
                text, tag, rest = split_at_tag(self.buffer, (self.tags.end, *self.tags.also_ends_at))
                reasoning += text
                if tag is None:
                    self.buffer = rest
                    break
                # the end tag is dropped; a tag that also ends reasoning belongs to the answer
                self.buffer = rest if tag == self.tags.end else tag + rest
                self.inside = False
                self.after_reasoning = True
            elif not self.seen_start:
                stripped = self.buffer.lstrip()
                if self.tags.start.startswith(stripped):  # could still become the start tag
                    break
                if stripped.startswith(self.tags.start):
                    self.buffer = stripped[len(self.tags.start) :]
                    self.inside = self.seen_start = True
                else:
                    self.seen_start = True  # no reasoning in this answer
            else:
                if self.after_reasoning:
                    self.buffer = self.buffer.lstrip()
                    self.after_reasoning = not self.buffer
                answer += self.buffer
                self.buffer = ""
        return reasoning, answer

    def finish(self) -> tuple[str, str]:
        text, self.buffer = self.buffer, ""
        return (text, "") if self.inside else ("", text)

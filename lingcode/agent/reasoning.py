"""Reasoning apart from the answer: <think>...</think> text in a stream, split off incrementally.

Some models (Ling-3.0, Qwen3) think before they answer. Their chat template may open the
thinking block in the generation prompt itself, so the output starts inside it with no opening
tag: `starts_inside` says so (the prompt ends with the start tag). Ling-3.0 may also go straight
from thinking to a tool call without closing the block: a `<tool_call>` ends reasoning too, and
is kept for the answer (the tool parser's input).

The rules are SGLang 0.5.23's (`ReasoningParser`, streamed and whole, as its OpenAI server runs
it), so that an answer reads the same through lingcode as through SGLang's own server:
- Output that starts inside the block may still open it again: start tags at its very start
  are dropped (`<think></think>Answer` is the answer alone).
- With the family's `nonempty_content` (Ling-3.0): output that never leaves its reasoning (cut
  by max_tokens, or ended without `</think>` and without a tool call) is also the answer. A
  stream gets its reasoning as it comes and then all of it again as answer text, at the end;
  a whole reply gets it as the answer only, as it does when the reasoning closed on an empty
  answer (`answer_is_reasoning`).
Where lingcode differs, on purpose: reasoning happens once, at the start of the output (a
`<think>` later on is text, where SGLang's stream drops the first one anywhere), and the
answer's leading whitespace after the reasoning is dropped.
"""

from __future__ import annotations

from lingcode.text.families import Reasoning
from lingcode.agent.tool_parsers import split_at_tag


class ReasoningSplitter:
    def __init__(self, tags: Reasoning, starts_inside: bool):
        self.tags = tags
        self.inside = starts_inside
        self.at_start = True  # nothing handled yet: start tags here open the block (again)
        self.buffer = ""
        self.after_reasoning = False  # the answer's leading whitespace after </think> is dropped
        self.reasoning = ""  # all of it so far, held-back rest included once finished
        self.answered = False  # answer text came (whitespace counts), or a tag that belongs to it
        self.complete = False  # finish() saw the whole output (not an abort)

    def feed(self, text: str) -> tuple[str, str]:
        """New text -> (reasoning, answer) that are safe to emit now."""
        self.buffer += text
        reasoning = answer = ""
        while self.buffer:
            if self.at_start:
                # Before the block the start tag may follow whitespace; inside it, only at once.
                head = self.buffer if self.inside else self.buffer.lstrip()
                if self.tags.start.startswith(head):  # could still become the start tag
                    break
                if head.startswith(self.tags.start):
                    self.buffer = head[len(self.tags.start) :]
                    self.inside = True
                    continue
                self.at_start = False
            elif self.inside:
                text, tag, rest = split_at_tag(self.buffer, (self.tags.end, *self.tags.also_ends_at))
                reasoning += text
                if tag is None:
                    self.buffer = rest
                    break
                # the end tag is dropped; a tag that also ends reasoning belongs to the answer
                self.buffer = rest if tag == self.tags.end else tag + rest
                self.inside = False
                self.after_reasoning = True
            else:
                self.answered = True
                if self.after_reasoning:
                    self.buffer = self.buffer.lstrip()
                    self.after_reasoning = not self.buffer
                answer += self.buffer
                self.buffer = ""
        self.reasoning += reasoning
        return reasoning, answer

    def finish(self, complete: bool = True) -> tuple[str, str]:
        """The held-back rest, at the end of the output; `complete` is False for an aborted one."""
        text, self.buffer = self.buffer, ""
        self.complete = complete
        if not self.inside:
            self.answered = self.answered or bool(text)
            return "", text
        self.reasoning += text
        if complete and self.tags.nonempty_content:  # it never left its reasoning: the answer too
            return "", self.reasoning
        return text, ""

    @property
    def answer_is_reasoning(self) -> bool:
        """For the whole reply, after finish(): no answer came, so `reasoning` is the answer."""
        return self.complete and self.tags.nonempty_content and not self.answered

"""A message in the chat: who speaks, the text as Markdown (streamed while it comes), and its stats.

Code blocks are highlighted by Textual's Markdown; a click on one copies its code. While an answer
streams, fragments go through Markdown.get_stream(), which batches them when they come faster
than the widget renders; at the end the whole text is set once more, since a stream that ends
inside a code fence can otherwise leave the block blank.
"""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.events import Click
from textual.message import Message
from textual.widgets import Markdown, Static
from textual.widgets.markdown import MarkdownFence, MarkdownStream

from lingcode.tui.widgets.stats import answer_line

WHO = {"user": "You", "assistant": "lingcode"}
STATE_NOTES = {
    "stopped": "stopped",
    "streaming": "interrupted: the chat closed mid-answer",
    "error": "failed",
}


class MessageView(Vertical):
    def __init__(
        self,
        role: str,
        text: str = "",
        *,
        attachments: list[dict] = (),
        stats: dict | None = None,
        state: str = "done",
        error: str | None = None,
        message_id: int | None = None,
    ):
        super().__init__(classes=role)
        self.role, self.text, self.message_id = role, text, message_id
        self.attachments, self.stats, self.state, self.error = list(attachments), stats or {}, state, error
        self._stream: MarkdownStream | None = None

    def compose(self) -> ComposeResult:
        yield Static(WHO.get(self.role, self.role), classes="who")
        if self.attachments:
            yield Static(
                "  ".join(f"📎 {a['path']} ({len(a['text'].splitlines())} lines)" for a in self.attachments),
                classes="attachments",
                markup=False,
            )
        yield Markdown(self.text)
        yield Static(self._footer(), classes="footer", markup=False)

    @property
    def body(self) -> Markdown:
        return self.query_one(Markdown)

    def start_stream(self) -> None:
        self._stream = Markdown.get_stream(self.body)

    async def write(self, fragment: str) -> None:
        self.text += fragment
        await self._stream.write(fragment)

    async def finish(
        self, text: str, *, stats: dict | None = None, state: str = "done", error: str | None = None
    ) -> None:
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None
        self.text, self.stats, self.state, self.error = text, stats or {}, state, error
        await self.body.update(text)
        self.query_one(".footer", Static).update(self._footer())

    def _footer(self) -> str:
        parts = [answer_line(self.stats)] if self.stats else []
        if self.state in STATE_NOTES:
            parts.append(STATE_NOTES[self.state] + (f": {self.error}" if self.error else ""))
        self.set_class(self.state == "error", "-error")
        return "  ·  ".join(p for p in parts if p)

    class CodeCopied(Message):
        """A click copied a code block; the app gives the focus back to the input."""

        def __init__(self, code: str):
            super().__init__()
            self.code = code

    @on(Click)
    def copy_code_block(self, event: Click) -> None:
        node = event.widget
        while node is not None and node is not self and not isinstance(node, MarkdownFence):
            node = node.parent
        if isinstance(node, MarkdownFence):
            self.app.copy_to_clipboard(node.code)
            self.post_message(self.CodeCopied(node.code))


class NoteView(Markdown):
    """Something the chat itself says (help, stats, errors, daemon progress); never sent to the model."""

    def __init__(self, text: str, *, error: bool = False):
        super().__init__(text, classes="error" if error else "")

"""The question before a tool call runs: what it would do (a diff, a command), and yes / no / always."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from rich.text import Text
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Markdown, Static

from lingcode.tui.store.export import fence

ANSWERS = ("yes", "no", "always")


class PermissionScreen(ModalScreen[str]):
    """Dismissed with "yes", "no" or "always" (for this tool, for the rest of the session)."""

    BINDINGS = [
        Binding("y", "answer('yes')", "Yes"),
        Binding("n", "answer('no')", "No"),
        Binding("a", "answer('always')", "Always this session"),
        Binding("escape", "answer('no')", "No", show=False),
    ]

    def __init__(self, tool: str, subject: str, preview: tuple[str, str], reason: str):
        super().__init__()
        self.tool, self.subject, self.preview, self.reason = tool, subject, preview, reason

    def compose(self) -> ComposeResult:
        language, text = self.preview
        with Vertical(id="dialog"):
            question = Text.assemble("Allow ", (self.tool, "bold"), " on ", (self.subject, "bold"), "?")
            yield Static(question, id="question")
            yield Static(f"asking because: {self.reason}", id="reason", markup=False)
            with VerticalScroll(id="preview"):
                yield Static(diff_text(text)) if language == "diff" else Markdown(fence(text, language))
            with Horizontal(id="buttons"):
                yield Button("Yes (y)", id="yes", variant="success")
                yield Button("No (n)", id="no", variant="error")
                yield Button(f"Always {self.tool} this session (a)", id="always", variant="primary")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id)

    def action_answer(self, answer: str) -> None:
        self.dismiss(answer)


def diff_text(diff: str) -> Text:
    """A unified diff with added lines green and removed lines red."""
    text = Text()
    for line in diff.splitlines(keepends=True):
        style = ""
        if line.startswith(("+++", "---")):
            style = "bold"
        elif line.startswith("+"):
            style = "green"
        elif line.startswith("-"):
            style = "red"
        elif line.startswith("@@"):
            style = "cyan"
        text.append(line, style)
    return text

"""The message input: multi-line, Enter sends, Ctrl+J (or Shift/Alt+Enter where the terminal tells them
apart) inserts a newline; typing "/" or "@path" opens completions (Tab or Enter takes one, Esc closes).
"""

from __future__ import annotations

from pathlib import Path

from textual import events, on
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import OptionList, TextArea
from textual.widgets.option_list import Option

from lingcode.tui import commands
from lingcode.tui.attachments import complete_path

NEWLINE_KEYS = ("ctrl+j", "shift+enter", "alt+enter")


class PromptInput(TextArea):
    class Submitted(Message):
        def __init__(self, text: str):
            super().__init__()
            self.text = text

    def __init__(self, **kwargs):
        super().__init__(soft_wrap=True, show_line_numbers=False, **kwargs)
        self.completions: OptionList | None = None

    async def _on_key(self, event: events.Key) -> None:
        menu = self.completions
        if menu is not None and menu.display and event.key in ("tab", "enter", "up", "down", "escape"):
            event.stop()
            event.prevent_default()
            if event.key == "escape":
                menu.display = False
            elif event.key in ("up", "down"):
                menu.action_cursor_up() if event.key == "up" else menu.action_cursor_down()
            elif not self.parent.accept_completion() and event.key == "enter":
                self.post_message(self.Submitted(self.text))
            return
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            self.post_message(self.Submitted(self.text))
        elif event.key in NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            self.insert("\n")
        else:
            await super()._on_key(event)


class PromptBox(Vertical):
    """The input with its completion menu above it."""

    def __init__(self, workdir: Path, **kwargs):
        super().__init__(**kwargs)
        self.workdir = workdir

    def compose(self) -> ComposeResult:
        menu = OptionList(id="completions")
        menu.display = False
        yield menu
        prompt = PromptInput(id="prompt")
        prompt.completions = menu
        yield prompt

    @property
    def input(self) -> PromptInput:
        return self.query_one(PromptInput)

    @on(TextArea.Changed, "#prompt")
    def update_completions(self) -> None:
        menu = self.query_one("#completions", OptionList)
        options = self._candidates()
        menu.clear_options()
        if options:
            menu.add_options(options)
            menu.highlighted = 0
        menu.display = bool(options)

    def _candidates(self) -> list[Option]:
        text = self.input.text
        if text.startswith("/") and " " not in text and "\n" not in text:
            found = commands.complete(text[1:])
            if [c.name for c in found] == [text[1:]]:
                return []  # typed in full: Enter runs it
            return [Option(f"{c.usage:<18} {c.help}", id=f"/{c.name}") for c in found]
        word = self._word_at_cursor()
        if word.startswith("@"):
            paths = complete_path(word[1:], self.workdir)
            if paths == [word[1:]]:
                return []  # typed in full: Enter sends
            return [Option(f"@{path}", id=f"@{path}") for path in paths]
        return []

    def _word_at_cursor(self) -> str:
        row, column = self.input.cursor_location
        line = self.input.document.get_line(row)[:column]
        return line.rsplit(None, 1)[-1] if line and not line[-1].isspace() else ""

    def accept_completion(self) -> bool:
        """Put the highlighted completion into the text; False if nothing was highlighted."""
        menu = self.query_one("#completions", OptionList)
        if menu.highlighted is None:
            return False
        choice = menu.get_option_at_index(menu.highlighted).id
        prompt = self.input
        if choice.startswith("/"):
            command = commands.BY_NAME[choice[1:]]
            prompt.text = choice + (" " if command.args else "")
            prompt.move_cursor(prompt.document.end)
        else:
            row, column = prompt.cursor_location
            word = self._word_at_cursor()
            suffix = "" if choice.endswith("/") else " "
            prompt.replace(choice + suffix, (row, column - len(word)), (row, column))
        menu.display = False
        return True

    def clear(self) -> None:
        self.input.clear()
        self.query_one("#completions", OptionList).display = False

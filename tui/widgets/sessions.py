"""The sessions screen: every stored session, to open, rename, delete or export."""

from __future__ import annotations

import time
from pathlib import Path

from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from lingcode.tui.store import ChatStore
from lingcode.tui.store.export import export_session
from lingcode.tui.widgets.dialogs import ConfirmDialog, TextDialog


class SessionsScreen(Screen[int | None]):
    """Dismissed with the id of the session to open, or None to go back."""

    BINDINGS = [
        Binding("enter", "open", "Open", priority=True),
        Binding("r", "rename", "Rename"),
        Binding("d", "delete", "Delete"),
        Binding("e", "export", "Export"),
        Binding("escape", "dismiss(None)", "Back"),
    ]

    def __init__(self, store: ChatStore, current: int | None, export_dir: Path):
        super().__init__()
        self.store, self.current, self.export_dir = store, current, export_dir

    def compose(self) -> ComposeResult:
        yield Static("Sessions", id="heading")
        yield DataTable(cursor_type="row", zebra_stripes=True)
        yield Static("", id="empty")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("id", "title", "messages", "mode", "updated", "directory")
        self.refresh_rows()

    def refresh_rows(self) -> None:
        table = self.query_one(DataTable)
        table.clear()
        sessions = self.store.sessions()
        for session in sessions:
            title = session.title or "(untitled)"
            if session.id == self.current:
                title = f"● {title}"
            table.add_row(
                str(session.id),
                _clip(title, 40),
                str(session.message_count),
                "agent" if session.agent else "chat",
                time.strftime("%Y-%m-%d %H:%M", time.localtime(session.updated)),
                _clip(_short(session.workdir), 30),
                key=str(session.id),
            )
        empty = self.query_one("#empty", Static)
        empty.update("No sessions yet: Esc, then type a message.")
        empty.display = not sessions

    def _selected(self) -> int | None:
        table = self.query_one(DataTable)
        if not table.row_count:
            return None
        return int(table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value)

    def action_open(self) -> None:
        session_id = self._selected()
        if session_id is not None:
            self.dismiss(session_id)

    def action_rename(self) -> None:
        session_id = self._selected()
        if session_id is None:
            return

        def rename(title: str | None) -> None:
            if title is not None:
                self.store.update(session_id, title=title.strip())
                self.refresh_rows()

        self.app.push_screen(TextDialog("New title:", self.store.get(session_id).title), rename)

    def action_delete(self) -> None:
        session_id = self._selected()
        if session_id is None:
            return
        session = self.store.get(session_id)

        def delete(yes: bool | None) -> None:
            if yes:
                self.store.delete(session_id)
                self.refresh_rows()
                self.notify(f"deleted session {session_id}")

        question = f"Delete session {session_id} ({session.title or 'untitled'}, {session.message_count} messages)?"
        self.app.push_screen(ConfirmDialog(question), delete)

    def action_export(self) -> None:
        session_id = self._selected()
        if session_id is not None:
            path = export_session(self.store, session_id, self.export_dir / f"lingcode-session-{session_id}.md")
            self.notify(f"exported to {path}")


def _short(workdir: str) -> str:
    home = str(Path.home())
    return "~" + workdir[len(home) :] if workdir.startswith(home) else workdir


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"

"""SVG snapshots of the chat, sessions and agent screens (pytest-textual-snapshot), kept under docs/screenshots/.

The README shows these files, so they live under docs/ rather than in syrupy's __snapshots__. The
app runs against the session's real daemon; the conversations are stored ones (answers the default
model gave, with the timings it had), so that the pictures do not change from run to run.
After a deliberate change to the UI: `pytest tests/test_tui_snapshots.py --snapshot-update`, then
look at the SVGs before committing them.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import pytest_textual_snapshot
from tui_support import SIZE, chat_app, wait_until

from lingcode.tui.store import ChatStore
from lingcode.tui.tools.calls import Call
from lingcode.tui.widgets.permission import PermissionScreen
from lingcode.tui.widgets.sessions import SessionsScreen

SCREENSHOTS = Path(__file__).resolve().parent.parent / "docs" / "screenshots"
SOME_DAY = time.mktime((2026, 11, 28, 14, 5, 0, 0, 0, -1))


class DocsSVG(pytest_textual_snapshot.SVGImageExtension):
    """Snapshots as docs/screenshots/test_tui_snapshots/<test name>.svg (syrupy's names, so it can tell unused ones)."""

    @classmethod
    def dirname(cls, *, test_location) -> str:
        return str(SCREENSHOTS / test_location.basename)


@pytest.fixture(autouse=True)
def snapshots_in_docs(monkeypatch):
    monkeypatch.setattr(pytest_textual_snapshot, "SVGImageExtension", DocsSVG)


@pytest.fixture
def home(monkeypatch, daemon):
    monkeypatch.setenv("LINGCODE_HOME", str(daemon.home))
    monkeypatch.setenv("TZ", "UTC")  # the sessions screen shows times
    time.tzset()
    yield daemon.home
    monkeypatch.undo()
    time.tzset()


# What SmolLM2-135M-Instruct answered (temperature 0), with the timings the daemon reported.
REVERSE = (
    "```python\ndef reverse_string(input_str):\n    return input_str[::-1]\n```\n\nThis function uses "
    "slicing to reverse the input string. The `[::-1]` syntax in Python is a slice that returns a reversed "
    "copy of the string."
)
REVERSE_STATS = {
    "timings": {"ttft_ms": 201.1, "tpot_ms": 92.3, "total_ms": 5276.2, "tokens_per_s": 10.84},
    "usage": {
        "prompt_tokens": 40,
        "completion_tokens": 56,
        "total_tokens": 96,
        "prompt_tokens_details": {"cached_tokens": 26},
    },
    "finish_reason": "stop",
}
AGAIN = (
    "Here's a simple implementation of the reverse_string function without slicing:\n\n```python\n"
    "def reverse_string(input_str):\n    return input_str[::-1]\n```\n\nThis function uses Python's slice syntax "
    "to create a reversed copy of the input string."
)
AGAIN_STATS = {"timings": {"ttft_ms": 211.2, "tpot_ms": 150.2, "total_ms": 8770.1, "tokens_per_s": 6.66},
               "usage": {"prompt_tokens": 112, "completion_tokens": 58, "total_tokens": 170,
                         "prompt_tokens_details": {"cached_tokens": 95}}, "finish_reason": "stop"}  # fmt: skip


def seeded(store: ChatStore) -> int:
    """Three stored sessions on fixed dates; returns the id of the chat about reversing strings."""
    store.create(title="What is a monad?", workdir="/home/me/notes")
    store.create(title="Rename x to count in app.py", agent=True, workdir="/home/me/src/demo")
    chat = store.create(title="Write a Python function that reverses a string.", workdir="/home/me/src/demo")
    store.add(chat.id, "user", "Write a Python function that reverses a string.")
    store.add(chat.id, "assistant", REVERSE, stats=REVERSE_STATS)
    store.add(chat.id, "user", "Now without slicing, please.")
    store.add(chat.id, "assistant", AGAIN, stats=AGAIN_STATS)
    for number, session in enumerate(store.sessions()[::-1]):
        store.db.execute(
            "UPDATE sessions SET created = ?, updated = ? WHERE id = ?",
            (SOME_DAY + 3600 * number, SOME_DAY + 3600 * number + 600, session.id),
        )
    return chat.id


async def ready(pilot) -> None:
    app = pilot.app
    app.prompt.input.cursor_blink = False
    await wait_until(pilot, lambda: app.link.connected, "the chat to connect")
    await pilot.pause()


def test_chat(snap_compare, home, tmp_path):
    store = ChatStore(tmp_path / "chat.sqlite3")
    app = chat_app(store, tmp_path, resume=seeded(store))
    assert snap_compare(app, terminal_size=SIZE, run_before=ready)


def test_sessions(snap_compare, home, tmp_path):
    store = ChatStore(tmp_path / "chat.sqlite3")
    app = chat_app(store, tmp_path, resume=seeded(store))

    async def open_sessions(pilot) -> None:
        await ready(pilot)
        await pilot.press("ctrl+o")
        await wait_until(pilot, lambda: isinstance(app.screen, SessionsScreen), "the sessions screen")

    assert snap_compare(app, terminal_size=SIZE, run_before=open_sessions)


def test_agent(snap_compare, home, tmp_path):
    workdir = tmp_path / "demo"
    workdir.mkdir()
    (workdir / "app.py").write_text("x = 0\nfor line in open('log.txt'):\n    x += 1\nprint(x)\n")
    store = ChatStore(tmp_path / "chat.sqlite3")
    session = store.create(title="Rename x to count in app.py", agent=True, workdir=str(workdir))
    store.add(session.id, "user", "Rename the variable x to count in app.py.")
    read = Call("call_1", "read_file", json.dumps({"path": "app.py"}))
    store.add(session.id, "assistant", "", tool_calls=[read.as_openai()])
    store.add(
        session.id,
        "tool",
        "app.py: lines 1-4 of 4\n    1  x = 0\n    2  for line in open('log.txt'):\n    3      x += 1\n    4  print(x)",
        tool_call_id="call_1",
    )
    app = chat_app(store, workdir, resume=session.id)
    edit = Call(
        "call_2",
        "apply_edit",
        json.dumps(
            {
                "path": "app.py",
                "old_text": "x = 0\nfor line in open('log.txt'):\n    x += 1\nprint(x)",
                "new_text": "count = 0\nfor line in open('log.txt'):\n    count += 1\nprint(count)",
            }
        ),
    )

    async def edit_asks_first(pilot) -> None:
        await ready(pilot)
        await app.receive_tool_calls([edit], text="I'll rename it with one edit.")
        await wait_until(pilot, lambda: isinstance(app.screen, PermissionScreen), "the permission prompt")

    assert snap_compare(app, terminal_size=SIZE, run_before=edit_asks_first)

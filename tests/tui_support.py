"""What the chat UI tests share: building a ChatApp on the session's real daemon, and waiting in a Pilot."""

from __future__ import annotations

import time
from pathlib import Path

from lingcode.client import DaemonLink
from lingcode.tui.app import ChatApp
from lingcode.tui.store import ChatStore
from lingcode.tui.tools.permissions import Permissions

SIZE = (100, 32)


def chat_app(
    store: ChatStore, workdir: Path, *, permissions: Permissions | None = None, max_tokens: int = 12, **options
) -> ChatApp:
    """A chat on the daemon that LINGCODE_HOME names; it never starts one of its own (autostart off)."""
    return ChatApp(
        link=DaemonLink(auto_start=False),
        store=store,
        workdir=workdir,
        permissions=permissions or Permissions([]),
        max_tokens=max_tokens,
        temperature=0,
        **options,
    )


async def wait_until(pilot, predicate, what: str, timeout: float = 60.0) -> None:
    """Poll the app (letting it run) until predicate() holds; fail with `what` after timeout seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        await pilot.pause(0.05)


async def connected(pilot) -> None:
    await wait_until(pilot, lambda: pilot.app.link.connected, "the chat to connect to the daemon")


def finished_answers(app: ChatApp) -> list:
    if app.session is None:
        return []
    return [m for m in app.store.messages(app.session.id) if m.role == "assistant" and m.state != "streaming"]


def idle(app: ChatApp) -> bool:
    return not app.answering and all(w.is_finished for w in app.workers if w.group == "answer")


async def answered(pilot, count: int = 1) -> None:
    """Wait until `count` answers of the session are finished and the answer loop is idle."""
    app = pilot.app
    await wait_until(pilot, lambda: len(finished_answers(app)) >= count and idle(app), f"answer {count}")
    await pilot.pause()


def send(pilot, text: str):
    """Type text into the input as one paste, then press Enter."""
    pilot.app.prompt.input.insert(text)
    return pilot.press("enter")

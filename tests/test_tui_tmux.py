"""The installed `lingcode chat`, driven inside tmux as a person would: type, Ctrl+J, Enter, read the screen.

It talks to the session's real daemon. tmux comes from the system (`make test` installs it where it
can); without it this test is skipped, and says so.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from lingcode.tui.store import ChatStore

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install tmux)")

LINGCODE = Path(sys.executable).parent / "lingcode"  # the console script pip installed


class Tmux:
    """One tmux server of our own (its own socket in the test's tmp dir), holding one window that runs a command."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.socket = str(folder / f"tmux-{uuid.uuid4().hex[:8]}")

    def run(self, *args: str) -> str:
        return subprocess.run(["tmux", "-S", self.socket, *args], check=True, capture_output=True, text=True).stdout

    def start(self, command: str) -> None:
        self.run("new-session", "-d", "-s", "chat", "-x", "100", "-y", "30", command)

    def keys(self, *keys: str, literal: bool = False) -> None:
        self.run("send-keys", "-t", "chat", *(["-l"] if literal else []), *keys)

    def screen(self) -> str:
        """What the window shows; "" once the command has exited (and tmux closed the window)."""
        result = subprocess.run(
            ["tmux", "-S", self.socket, "capture-pane", "-p", "-t", "chat"], capture_output=True, text=True
        )
        return result.stdout if result.returncode == 0 else ""

    def pid(self) -> int:
        return int(self.run("display-message", "-p", "-t", "chat", "#{pane_pid}").strip())

    def wait_for(self, predicate, what: str, timeout: float = 90.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            screen = self.screen()
            if predicate(screen):
                return screen
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}; the screen was:\n{screen}")

    def close(self) -> None:
        subprocess.run(["tmux", "-S", self.socket, "kill-server"], capture_output=True)
        self.socket = str(self.folder / f"tmux-{uuid.uuid4().hex[:8]}")  # a server shutting down takes no new window


@pytest.fixture
def tmux(tmp_path_factory):
    session = Tmux(tmp_path_factory.mktemp("tmux", numbered=True))
    yield session
    session.close()


def chat_command(home: Path, *args: str) -> str:
    env = f"LINGCODE_HOME={shlex.quote(str(home))} TERM=xterm-256color"
    # exec: the pane's pid is the chat's own
    return f"exec env {env} {shlex.quote(str(LINGCODE))} chat --temperature 0 {' '.join(args)}"


def test_lingcode_chat_in_a_terminal(tmux, daemon, tmp_path):
    store_path = daemon.home / "data" / "chat.sqlite3"
    tmux.start(f"cd {shlex.quote(str(tmp_path))} && " + chat_command(daemon.home, "--max-tokens", "24"))
    tmux.wait_for(lambda s: "● smollm2-135m-instruct" in s, "the chat to connect")

    # Two lines (Ctrl+J), then Enter sends; the answer streams in with its stats line.
    tmux.keys("Write a Python function", literal=True)
    tmux.keys("C-j")
    tmux.keys("that reverses a string.", literal=True)
    tmux.keys("Enter")
    screen = tmux.wait_for(lambda s: "tok/s" in s and "ms/tok" in s, "the answer's stats line")
    assert "You" in screen and "lingcode" in screen and "ctx " in screen
    tmux.keys("C-q")
    tmux.wait_for(lambda s: s == "", "the chat to quit")

    store = ChatStore(store_path)
    session = store.last()
    question, answer = store.messages(session.id)
    assert question.content == "Write a Python function\nthat reverses a string."
    assert answer.state == "done" and answer.content and answer.stats["timings"]["tokens_per_s"] > 0
    store.close()

    # `-c` resumes it; killed mid-answer, the chat loses nothing it showed.
    tmux.start(f"cd {shlex.quote(str(tmp_path))} && " + chat_command(daemon.home, "-c", "--max-tokens", "300"))
    tmux.wait_for(lambda s: "that reverses a string." in s and "● smollm2-135m-instruct" in s, "the resumed session")
    tmux.keys("Now write a long story about a dragon who learns Python.", literal=True)
    tmux.keys("Enter")
    store = ChatStore(store_path)

    def answer_so_far() -> str:
        messages = store.messages(session.id)
        return messages[3].content if len(messages) == 4 else ""

    tmux.wait_for(lambda s: len(answer_so_far()) > 40, "part of the answer")
    os.kill(tmux.pid(), signal.SIGKILL)
    kept = store.messages(session.id)[-1]
    assert kept.role == "assistant" and kept.state == "streaming" and len(kept.content) > 40
    store.close()

    tmux.close()
    tmux.start(f"cd {shlex.quote(str(tmp_path))} && " + chat_command(daemon.home, "-c"))
    screen = tmux.wait_for(lambda s: "interrupted: the chat closed mid-answer" in s, "the interrupted answer")
    assert " ".join(kept.content.split()[:3]) in " ".join(screen.split())
    tmux.keys("C-q")

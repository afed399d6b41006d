"""The chat's session store (SQLite, WAL) and its Markdown export."""

from __future__ import annotations

import os
import signal
import sqlite3
import stat
import subprocess
import sys

import pytest

from lingcode.tui.conversation import INTERRUPTED_RESULT, context_used, model_messages
from lingcode.tui.store import ChatStore
from lingcode.tui.store.export import export_session, session_markdown


def test_sessions_are_listed_renamed_and_deleted_with_their_messages(tmp_path):
    store = ChatStore(tmp_path / "chat.sqlite3")
    first = store.create(workdir="/src")
    second = store.create(agent=True, system="Be brief.")
    store.add(first.id, "user", "hello")
    assert [s.id for s in store.sessions()] == [first.id, second.id]  # the most recently used first
    assert store.last().id == first.id and store.get(first.id).message_count == 1
    assert store.update(second.id, title="renamed").title == "renamed"
    assert store.get(second.id).agent and store.get(second.id).system == "Be brief."
    store.delete(first.id)
    assert store.get(first.id) is None and store.messages(first.id) == []
    assert [s.id for s in store.sessions()] == [second.id]
    store.delete(second.id)
    assert store.create().id > second.id  # ids are never reused: `--resume ID` never opens another session


def test_the_database_is_wal_and_what_was_stored_is_seen_by_another_process_at_once(tmp_path):
    path = tmp_path / "chat.sqlite3"
    store = ChatStore(path)
    session = store.create()
    answer = store.add(session.id, "assistant", state="streaming")
    store.set_content(answer.id, "The answer so f")
    # A separate connection (as a new `lingcode chat -c` after a kill would open) sees it committed.
    other = sqlite3.connect(path)
    assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert other.execute("SELECT content, state FROM messages WHERE id = ?", (answer.id,)).fetchone() == (
        "The answer so f",
        "streaming",
    )
    assert other.execute("PRAGMA user_version").fetchone()[0] == 1


def test_reopening_keeps_everything_and_migrates_nothing_twice(tmp_path):
    path = tmp_path / "chat.sqlite3"
    store = ChatStore(path)
    session = store.create(title="kept")
    store.add(session.id, "user", "hi", attachments=[{"path": "a.py", "text": "x = 1"}])
    store.close()
    again = ChatStore(path)
    assert again.get(session.id).title == "kept"
    assert again.messages(session.id)[0].attachments == [{"path": "a.py", "text": "x = 1"}]


def test_model_messages_follow_clear_system_attachments_and_answer_every_tool_call(tmp_path):
    store = ChatStore(tmp_path / "chat.sqlite3")
    session = store.create(system="You are terse.")
    old = store.add(session.id, "user", "before /clear")
    session = store.update(session.id, context_start=old.id)
    store.add(session.id, "user", "look at @a.py", attachments=[{"path": "a.py", "text": "x = 1"}])
    calls = [
        {"id": "c1", "type": "function", "function": {"name": "list_dir", "arguments": "{}"}},
        {"id": "c2", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}},
    ]
    store.add(session.id, "assistant", "", tool_calls=calls)
    store.add(session.id, "tool", "a.py", tool_call_id="c1")  # c2 never ran (the app was killed)
    store.add(session.id, "assistant", "partial", state="error", error="lost the daemon")
    messages = model_messages(session, store.messages(session.id))
    assert messages[0] == {"role": "system", "content": "You are terse."}
    assert messages[1]["role"] == "user" and "before /clear" not in str(messages)
    assert messages[1]["content"].startswith("look at @a.py") and "x = 1" in messages[1]["content"]
    assert messages[2] == {"role": "assistant", "content": None, "tool_calls": calls}
    assert messages[3] == {"role": "tool", "tool_call_id": "c2", "content": INTERRUPTED_RESULT}
    assert messages[4] == {"role": "tool", "tool_call_id": "c1", "content": "a.py"}
    assert len(messages) == 5  # the failed partial answer is shown and kept, not sent


def test_context_used_is_the_last_answers_total(tmp_path):
    store = ChatStore(tmp_path / "chat.sqlite3")
    session = store.create()
    store.add(session.id, "assistant", "a", stats={"usage": {"total_tokens": 120}})
    store.add(session.id, "assistant", "b", state="stopped")
    assert context_used(store.messages(session.id)) == 120


def test_export_writes_markdown_that_fences_cannot_break(tmp_path):
    store = ChatStore(tmp_path / "chat.sqlite3")
    session = store.create(title="Reverse a string", system="Be brief.", workdir="/src")
    store.add(session.id, "user", "Reverse it", attachments=[{"path": "x.md", "text": "```\ncode\n```"}])
    store.add(
        session.id,
        "assistant",
        "```python\ns[::-1]\n```",
        stats={"timings": {"tokens_per_s": 30.0, "completion_tokens": 9}},
    )
    store.add(session.id, "assistant", "half", state="stopped")
    path = export_session(store, session.id, tmp_path / "out.md")
    text = path.read_text()
    assert text == session_markdown(store.get(session.id), store.messages(session.id))
    assert text.startswith("# Reverse a string\n") and "> Be brief." in text and "`/src`" in text
    assert "## You\n\nReverse it" in text and "````\n```\ncode\n```\n````" in text  # a longer fence around it
    assert "```python\ns[::-1]\n```" in text and "_9 tokens, 30.0 tokens/s_" in text
    assert "_(stopped by the user)_" in text


def _store_with_history(path) -> bytes:
    store = ChatStore(path)
    session = store.create(title="history")
    for i in range(200):  # a few dozen pages, so that a cut lands inside the tables
        store.add(session.id, "user", f"message {i} " + "x" * 400)
    store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # everything in the main file, as after a clean exit
    store.close()
    return path.read_bytes()


def _garbage(path) -> None:
    path.write_bytes(b"\x00lingcode? no, not a database\xff" * 200)


def _truncated(path) -> None:
    whole = _store_with_history(path)
    path.write_bytes(whole[: len(whole) // 2])


def _header_only(path) -> None:
    whole = _store_with_history(path)
    path.write_bytes(whole[:4096])


@pytest.mark.parametrize("damage", [_garbage, _truncated, _header_only])
def test_a_damaged_store_is_moved_aside_and_a_new_one_started(tmp_path, damage):
    path = tmp_path / "chat.sqlite3"
    damage(path)
    damaged = path.read_bytes()
    store = ChatStore(path)
    [aside] = tmp_path.glob("chat.sqlite3.damaged-*")
    assert aside.read_bytes() == damaged  # kept as it was, for recovery by hand
    assert store.recovered and str(path) in store.recovered and str(aside) in store.recovered
    assert "damaged" in store.recovered and "new, empty history" in store.recovered
    session = store.create()  # the new store works
    store.add(session.id, "user", "hello again")
    store.close()
    again = ChatStore(path)  # and is sound: nothing is moved aside a second time
    assert again.recovered is None and [m.content for m in again.messages(session.id)] == ["hello again"]
    assert len(list(tmp_path.glob("chat.sqlite3.damaged-*"))) == 1


def test_a_store_damaged_twice_keeps_both_copies(tmp_path):
    path = tmp_path / "chat.sqlite3"
    for _ in range(2):
        _garbage(path)
        store = ChatStore(path)
        assert store.recovered
        store.close()
    assert len(list(tmp_path.glob("chat.sqlite3.damaged-*"))) == 2


def test_trouble_that_is_no_damage_is_raised_and_moves_nothing(tmp_path):
    path = tmp_path / "chat.sqlite3"
    path.mkdir()  # cannot be opened, but it is no damaged database: moving it aside would be wrong
    with pytest.raises(sqlite3.OperationalError):
        ChatStore(path)
    assert path.is_dir() and not list(tmp_path.glob("*.damaged-*"))


def _edit_bytes(path, old: bytes, new: bytes) -> None:
    """A hand edit of the file itself, byte for byte: SQLite keeps no checksum of a row's text."""
    data = path.read_bytes()
    assert data.count(old) == 1, old
    path.write_bytes(data.replace(old, new))


def test_rows_damaged_by_hand_are_read_as_empty_or_left_out_and_reported(tmp_path):
    """Issue 18, item 9: `[]` -> `[}` in always_allow passed integrity_check and stopped `lingcode chat -c`."""
    path = tmp_path / "chat.sqlite3"
    store = ChatStore(path)
    session = store.create(title="kept")
    store.update(session.id, always_allow=["grep"])
    store.add(session.id, "user", "look", attachments=[{"path": "a.py", "text": "ATTACHED"}])
    calls = [{"id": "c1", "type": "function", "function": {"name": "list_dir", "arguments": "{}"}}]
    store.add(session.id, "assistant", "", tool_calls=calls, stats={"usage": {"total_tokens": 77}})
    store.add(session.id, "tool", "a.py", tool_call_id="c1")
    store.add(session.id, "assistant", "the answer")
    store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()
    _edit_bytes(path, b'["grep"]', b'["grep"}')  # one byte, as the issue found it
    _edit_bytes(path, b'"text": "ATTACHED"', b'"text": ["ATTACHE"')  # not JSON either
    _edit_bytes(path, b'"total_tokens": 77}', b'"total_tokens": 77]')
    with sqlite3.connect(path) as db:  # damage SQLite itself lets through: a role that means nothing
        db.execute("UPDATE messages SET role = 'wizard' WHERE content = 'a.py'")
        db.execute("UPDATE messages SET state = 'exploded', content = x'C3A9' WHERE content = 'the answer'")
        db.execute("UPDATE sessions SET title = 42")
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    damaged = path.read_bytes()

    store = ChatStore(path)
    assert store.recovered is None  # a sound database: nothing moved aside
    [session] = store.sessions()  # read, not a JSONDecodeError
    assert store.last().id == session.id and session.always_allow == [] and session.title == "42"
    messages = store.messages(session.id)
    assert [m.role for m in messages] == ["user", "assistant", "assistant"]  # the wizard's row is left out
    assert messages[0].attachments == [] and messages[1].tool_calls == calls and messages[1].stats == {}
    assert messages[2].state == "done" and messages[2].content == "é"
    problems = store.take_problems()
    assert len(problems) == 5, problems
    assert any("session 1: its always_allow cannot be read" in p and "taken as []" in p for p in problems)
    assert any("has the role 'wizard'; it is left out" in p for p in problems)
    store.messages(session.id)
    store.sessions()
    assert store.take_problems() == []  # each is reported once
    assert model_messages(session, messages)[-1] == {"role": "assistant", "content": "é"}
    store.close()
    assert path.read_bytes() == damaged  # nothing was rewritten: the person may still repair it by hand


def _store_then(path, *statements: str) -> None:
    ChatStore(path).close()
    with sqlite3.connect(path) as db:
        for statement in statements:
            db.execute(statement)


@pytest.mark.parametrize(
    "statements, why",
    [
        (["DROP TABLE messages", "DROP TABLE sessions", "PRAGMA user_version = 2"], "no table"),  # the file
        (["PRAGMA user_version = 0"], "migration 1 fails"),  # it has the tables, but says it has none
        (["ALTER TABLE sessions DROP COLUMN always_allow"], "lacks the columns always_allow"),
    ],
)
def test_a_store_lingcode_cannot_read_is_moved_aside(tmp_path, statements, why):
    path = tmp_path / "chat.sqlite3"
    _store_then(path, *statements)
    store = ChatStore(path)
    [aside] = [p for p in tmp_path.glob("chat.sqlite3.damaged-*") if not p.name.endswith(("-wal", "-shm"))]
    assert why in store.recovered and str(aside) in store.recovered
    assert store.sessions() == [] and store.create().id == 1  # a new store, which works


def test_a_newer_lingcodes_store_with_every_table_is_used_as_it_is(tmp_path):
    path = tmp_path / "chat.sqlite3"
    store = ChatStore(path)
    store.create(title="from later")
    store.close()
    with sqlite3.connect(path) as db:  # a later version added a table and a column: migrations only add
        db.execute("CREATE TABLE tags (name TEXT)")
        db.execute("ALTER TABLE messages ADD COLUMN pinned INTEGER")
        db.execute("PRAGMA user_version = 7")
    store = ChatStore(path)
    assert store.recovered is None and store.last().title == "from later"
    assert not list(tmp_path.glob("*.damaged-*"))


def test_the_store_is_private_under_any_umask(tmp_path):
    """Issue 18, item 2: chat.sqlite3, its -wal and -shm were 0644 (the data dir's mode aside)."""
    previous = os.umask(0)
    try:
        store = ChatStore(tmp_path / "chat.sqlite3")
        store.add(store.create().id, "user", "private")
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
        store.close()
    finally:
        os.umask(previous)
    assert modes == {"chat.sqlite3": 0o600, "chat.sqlite3-wal": 0o600, "chat.sqlite3-shm": 0o600}, modes
    path = tmp_path / "chat.sqlite3"
    path.chmod(0o644)  # as an older lingcode left it
    ChatStore(path).close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


# A writer that reports each message once it is committed (add() returns after the commit).
WRITER = """
import sys
from lingcode.tui.store import ChatStore
store = ChatStore(sys.argv[1])
session = store.create(title="killed mid-write")
answer = store.add(session.id, "assistant", state="streaming")
for i in range(10**9):
    store.add(session.id, "user", f"message {i}")
    store.set_content(answer.id, "x" * i)  # an answer streaming in, as the chat writes it
    print(i, flush=True)
"""


def test_kill_9_mid_write_loses_nothing_committed(tmp_path):
    path = tmp_path / "chat.sqlite3"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True)
    reported = -1
    for line in writer.stdout:  # let it write for a while, then kill it wherever it is
        reported = int(line)
        if reported >= 300:
            break
    writer.send_signal(signal.SIGKILL)
    for line in writer.stdout:  # reported before it died: committed too
        reported = int(line)
    assert writer.wait() == -signal.SIGKILL
    assert path.with_name("chat.sqlite3-wal").exists()  # no checkpoint on the way out: the WAL is replayed

    store = ChatStore(path)
    assert store.recovered is None
    assert [tuple(row) for row in store.db.execute("PRAGMA integrity_check")] == [("ok",)]
    [session] = store.sessions()
    answer, *questions = store.messages(session.id)
    expected = [f"message {i}" for i in range(reported + 1)]
    assert [m.content for m in questions][: len(expected)] == expected  # every committed message, in order
    assert len(questions) <= len(expected) + 1  # at most the one it had committed but not reported yet
    assert answer.state == "streaming" and len(answer.content) >= reported
    store.add(session.id, "user", "after the kill")  # and the store takes writes again

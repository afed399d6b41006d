"""Chat sessions and their messages in SQLite.

WAL mode with autocommit: every change is committed at once, so an answer that is written here
before it is shown survives the app being killed mid-answer. Schema changes are numbered
migrations that only ever add (PRAGMA user_version), so an upgrade never loses history.

A damaged database (not SQLite at all, truncated, pages that do not check out) must not stop the
chat from starting: it is moved aside, kept for recovery, and a new, empty store takes its place;
`recovered` then says so, for the app to show.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

from lingcode import paths

log = logging.getLogger("lingcode.tui")

# SQLite's answers for "this file is not a (sound) database"; anything else (locked, unreadable,
# disk full) is no damage of the file, and moving it aside would lose a sound history.
DAMAGE_CODES = (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)

MIGRATIONS = [
    """
    CREATE TABLE sessions (
        id            INTEGER PRIMARY KEY AUTOINCREMENT, -- ids are never reused
        title         TEXT    NOT NULL DEFAULT '',
        system        TEXT    NOT NULL DEFAULT '',
        agent         INTEGER NOT NULL DEFAULT 0,
        workdir       TEXT    NOT NULL DEFAULT '',
        context_start INTEGER NOT NULL DEFAULT 0,   -- /clear: messages up to this id are not sent
        always_allow  TEXT    NOT NULL DEFAULT '[]', -- tools the person allowed for the whole session
        created       REAL    NOT NULL,
        updated       REAL    NOT NULL
    );
    CREATE TABLE messages (
        id           INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id   INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
        role         TEXT    NOT NULL,               -- user | assistant | tool
        content      TEXT    NOT NULL DEFAULT '',
        attachments  TEXT,                           -- user: [{"path", "text"}] as read when sent
        tool_calls   TEXT,                           -- assistant: OpenAI tool_calls
        tool_call_id TEXT,                           -- tool: the call it answers
        state        TEXT    NOT NULL DEFAULT 'done', -- done | streaming | stopped | error
        error        TEXT,
        stats        TEXT,                           -- assistant: {"timings", "usage", "finish_reason"}
        created      REAL    NOT NULL
    );
    CREATE INDEX messages_by_session ON messages(session_id, id);
    """,
]


def default_path() -> Path:
    return paths.data_dir() / "chat.sqlite3"


@dataclass
class Session:
    id: int
    title: str
    system: str
    agent: bool
    workdir: str
    context_start: int
    always_allow: list[str]
    created: float
    updated: float
    message_count: int = 0


@dataclass
class Message:
    id: int
    session_id: int
    role: str
    content: str
    attachments: list[dict] = field(default_factory=list)
    tool_calls: list[dict] = field(default_factory=list)
    tool_call_id: str | None = None
    state: str = "done"
    error: str | None = None
    stats: dict = field(default_factory=dict)
    created: float = 0.0


class SessionStore:
    def __init__(self, path: Path | str | None = None):
        self.path = Path(path) if path is not None else default_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.recovered: str | None = None  # set when a damaged store was moved aside: what to tell the person
        try:
            self.db = _open(_private(self.path))
        except StoreDamaged as damage:
            aside = move_aside(self.path)
            self.recovered = (f"The chat history {self.path} was damaged ({damage}). It was moved to {aside} "
                              "and a new, empty history was started.")  # fmt: skip
            log.error("%s", self.recovered)
            self.db = _open(_private(self.path))

    def close(self) -> None:
        self.db.close()

    # sessions

    def create(self, *, system: str = "", agent: bool = False, workdir: str = "", title: str = "") -> Session:
        now = time.time()
        cursor = self.db.execute(
            "INSERT INTO sessions (title, system, agent, workdir, created, updated) VALUES (?, ?, ?, ?, ?, ?)",
            (title, system, int(agent), workdir, now, now),
        )
        return self.get(cursor.lastrowid)

    def get(self, session_id: int) -> Session | None:
        row = self.db.execute(f"{_SESSION_SELECT} WHERE s.id = ? GROUP BY s.id", (session_id,)).fetchone()
        return _session(row) if row else None

    def sessions(self) -> list[Session]:
        """All sessions, the most recently used first."""
        rows = self.db.execute(f"{_SESSION_SELECT} GROUP BY s.id ORDER BY s.updated DESC, s.id DESC")
        return [_session(row) for row in rows]

    def last(self) -> Session | None:
        sessions = self.sessions()
        return sessions[0] if sessions else None

    def update(self, session_id: int, **fields) -> Session:
        """Change title, system, agent, workdir, context_start or always_allow."""
        allowed = {"title", "system", "agent", "workdir", "context_start", "always_allow"}
        if not fields or not set(fields) <= allowed:
            raise ValueError(f"can only update {sorted(allowed)}, not {sorted(set(fields) - allowed)}")
        values = {k: json.dumps(v) if k == "always_allow" else int(v) if k == "agent" else v for k, v in fields.items()}
        assignments = ", ".join(f"{key} = ?" for key in values)
        self.db.execute(
            f"UPDATE sessions SET {assignments}, updated = ? WHERE id = ?", (*values.values(), time.time(), session_id)
        )
        return self.get(session_id)

    def delete(self, session_id: int) -> None:
        self.db.execute("DELETE FROM sessions WHERE id = ?", (session_id,))

    # messages

    def add(self, session_id: int, role: str, content: str = "", **fields) -> Message:
        """Append a message; attachments, tool_calls, tool_call_id, state, error, stats are optional."""
        now = time.time()
        cursor = self.db.execute(
            "INSERT INTO messages (session_id, role, content, attachments, tool_calls, tool_call_id, state, error,"
            " stats, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                session_id, role, content, _json(fields.get("attachments")), _json(fields.get("tool_calls")),
                fields.get("tool_call_id"), fields.get("state", "done"), fields.get("error"),
                _json(fields.get("stats")), now,
            ),
        )  # fmt: skip
        self.db.execute("UPDATE sessions SET updated = ? WHERE id = ?", (now, session_id))
        return self.message(cursor.lastrowid)

    def message(self, message_id: int) -> Message | None:
        row = self.db.execute("SELECT * FROM messages WHERE id = ?", (message_id,)).fetchone()
        return _message(row) if row else None

    def messages(self, session_id: int) -> list[Message]:
        rows = self.db.execute("SELECT * FROM messages WHERE session_id = ? ORDER BY id", (session_id,))
        return [_message(row) for row in rows]

    def set_content(self, message_id: int, content: str) -> None:
        """The answer so far; called before each fragment is shown."""
        self.db.execute("UPDATE messages SET content = ? WHERE id = ?", (content, message_id))

    def finish(self, message_id: int, *, state: str, content: str | None = None, error: str | None = None,
               stats: dict | None = None, tool_calls: list[dict] | None = None) -> Message:  # fmt: skip
        self.db.execute(
            "UPDATE messages SET state = ?, content = COALESCE(?, content), error = ?, stats = COALESCE(?, stats),"
            " tool_calls = COALESCE(?, tool_calls) WHERE id = ?",
            (state, content, error, _json(stats), _json(tool_calls), message_id),
        )
        return self.message(message_id)

    def delete_messages_after(self, session_id: int, message_id: int) -> None:
        self.db.execute("DELETE FROM messages WHERE session_id = ? AND id > ?", (session_id, message_id))


class StoreDamaged(Exception):
    """The store's file is not a sound SQLite database."""


def _open(path: Path) -> sqlite3.Connection:
    """The store's connection, checked and migrated; StoreDamaged if the file is not a sound database."""
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.row_factory = sqlite3.Row
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: a killed process loses nothing committed
        db.execute("PRAGMA foreign_keys=ON")
        # quick_check reads every page (not the indexes' agreement with their tables): a truncated
        # file fails here at start, not halfway through showing a session. A chat history is a few MB.
        problems = [row[0] for row in db.execute("PRAGMA quick_check")]
        if problems != ["ok"]:
            raise StoreDamaged("; ".join(problems[:3]))
        _migrate(db)
    except BaseException as exc:
        db.close()
        code = getattr(exc, "sqlite_errorcode", None) or 0
        if isinstance(exc, sqlite3.DatabaseError) and code & 0xFF in DAMAGE_CODES:
            raise StoreDamaged(str(exc)) from exc
        raise
    return db


def _private(path: Path) -> Path:
    """The store's files made 0600 whatever the umask: every chat is in them. SQLite gives the -wal
    and -shm files it creates the database's mode; ones left from before are tightened here."""
    for part in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        if (part == path or part.exists()) and not part.is_dir():  # a directory in the way: SQLite says so
            paths.private_file(part)
    return path


def _migrate(db: sqlite3.Connection) -> None:
    version = db.execute("PRAGMA user_version").fetchone()[0]
    for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
        db.executescript(f"BEGIN; {script}; PRAGMA user_version = {number}; COMMIT;")


def move_aside(path: Path) -> Path:
    """Rename the database, and its -wal and -shm files with it, to NAME.damaged-TIMESTAMP (kept for recovery)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = path.with_name(f"{path.name}.damaged-{stamp}")
    count = 1
    while aside.exists():  # damaged twice within a second: never overwrite an earlier copy
        count += 1
        aside = path.with_name(f"{path.name}.damaged-{stamp}-{count}")
    for suffix in ("-wal", "-shm", ""):  # the database last: a crash in between leaves no stray -wal for the new one
        part = Path(f"{path}{suffix}")
        if part.exists():
            part.rename(f"{aside}{suffix}")
    return aside


_SESSION_SELECT = "SELECT s.*, COUNT(m.id) AS message_count FROM sessions s LEFT JOIN messages m ON m.session_id = s.id"


def _json(value) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False)


def _session(row: sqlite3.Row) -> Session:
    return Session(
        id=row["id"], title=row["title"], system=row["system"], agent=bool(row["agent"]), workdir=row["workdir"],
        context_start=row["context_start"], always_allow=json.loads(row["always_allow"]),
        created=row["created"], updated=row["updated"], message_count=row["message_count"],
    )  # fmt: skip


def _message(row: sqlite3.Row) -> Message:
    return Message(
        id=row["id"], session_id=row["session_id"], role=row["role"], content=row["content"],
        attachments=json.loads(row["attachments"] or "[]"), tool_calls=json.loads(row["tool_calls"] or "[]"),
        tool_call_id=row["tool_call_id"], state=row["state"], error=row["error"],
        stats=json.loads(row["stats"] or "{}"), created=row["created"],
    )  # fmt: skip

"""Chat sessions and their messages in SQLite.

WAL mode with autocommit: every change is committed at once, so an answer that is written here
before it is shown survives the app being killed mid-answer. Schema changes are numbered
migrations that only ever add (PRAGMA user_version), so an upgrade never loses history.

A damaged database (not SQLite at all, truncated, pages that do not check out, or tables and
columns this version cannot find or create) must not stop the chat from starting: it is moved
aside, kept for recovery, and a new, empty store takes its place; `recovered` then says so, for
the app to show. A sound database can still hold rows edited by hand (`[}` for a JSON list):
such a value is read as empty, a row that cannot be read at all (an unknown role) is skipped,
and each is reported once in `problems` (and the log), for the app to show. Nothing is rewritten.
"""

from __future__ import annotations

import json
import logging
import reprlib
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

from lingcode import paths

log = logging.getLogger("lingcode.tui")

# SQLite's answers for "this file is not a (sound) database"; anything else (locked, unreadable,
# disk full) is no damage of the file, and moving it aside would lose a sound history.
DAMAGE_CODES = (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)

ROLES = ("user", "assistant", "tool")
STATES = ("done", "streaming", "stopped", "error")

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
class ChatSession:
    """A conversation in the chat UI, kept as text (the daemon's token-exact sessions are another thing)."""

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
class ChatMessage:
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


class ChatStore:
    """The chat UI's sessions and messages, in one SQLite file (chat.sqlite3)."""

    def __init__(self, path: Path | str | None = None):
        self.path = Path(path) if path is not None else default_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.recovered: str | None = None  # set when a damaged store was moved aside: what to tell the person
        self.problems: list[str] = []  # damaged rows met, not yet shown (take_problems)
        self._reported: set[tuple] = set()
        try:
            self.db = _open(_private(self.path))
        except StoreDamaged as damage:
            aside = move_aside(self.path)
            self.recovered = (
                f"The chat history {self.path} was damaged ({damage}). It was moved to {aside} "
                "and a new, empty history was started."
            )
            log.error("%s", self.recovered)
            self.db = _open(_private(self.path))

    def close(self) -> None:
        self.db.close()

    def take_problems(self) -> list[str]:
        """The damaged rows met since the last call: what to tell the person."""
        problems, self.problems = self.problems, []
        return problems

    def _report(self, key: tuple, problem: str) -> None:
        if key not in self._reported:
            self._reported.add(key)
            self.problems.append(problem)
            log.error("%s: %s", self.path, problem)

    # sessions

    def create(self, *, system: str = "", agent: bool = False, workdir: str = "", title: str = "") -> ChatSession:
        now = time.time()
        cursor = self.db.execute(
            "INSERT INTO sessions (title, system, agent, workdir, created, updated) VALUES (?, ?, ?, ?, ?, ?)",
            (title, system, int(agent), workdir, now, now),
        )
        return self.get(cursor.lastrowid)

    def get(self, session_id: int) -> ChatSession | None:
        row = self.db.execute(f"{_SESSION_SELECT} WHERE s.id = ? GROUP BY s.id", (session_id,)).fetchone()
        return self._session(row) if row else None

    def sessions(self) -> list[ChatSession]:
        """All sessions, the most recently used first."""
        rows = self.db.execute(f"{_SESSION_SELECT} GROUP BY s.id ORDER BY s.updated DESC, s.id DESC")
        return [self._session(row) for row in rows]

    def last(self) -> ChatSession | None:
        sessions = self.sessions()
        return sessions[0] if sessions else None

    def update(self, session_id: int, **fields) -> ChatSession:
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

    def add(self, session_id: int, role: str, content: str = "", **fields) -> ChatMessage:
        """Append a message; attachments, tool_calls, tool_call_id, state, error, stats are optional."""
        now = time.time()
        cursor = self.db.execute(
            "INSERT INTO messages (session_id, role, content, attachments, tool_calls, tool_call_id, state, error,"
            " stats, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                session_id,
                role,
                content,
                _json(fields.get("attachments")),
                _json(fields.get("tool_calls")),
                fields.get("tool_call_id"),
                fields.get("state", "done"),
                fields.get("error"),
                _json(fields.get("stats")),
                now,
            ),
        )
        self.db.execute("UPDATE sessions SET updated = ? WHERE id = ?", (now, session_id))
        return self.message(cursor.lastrowid)

    def message(self, message_id: int) -> ChatMessage | None:
        row = self.db.execute("SELECT * FROM messages WHERE id = ?", (message_id,)).fetchone()
        return self._message(row) if row else None

    def messages(self, session_id: int) -> list[ChatMessage]:
        rows = self.db.execute("SELECT * FROM messages WHERE session_id = ? ORDER BY id", (session_id,))
        return [message for row in rows if (message := self._message(row)) is not None]

    # rows, as read: what a hand-edited row holds is checked, never trusted

    def _session(self, row: sqlite3.Row) -> ChatSession:
        where = f"session {row['id']}"
        return ChatSession(
            id=row["id"],
            title=_text(row["title"]),
            system=_text(row["system"]),
            agent=bool(row["agent"]),
            workdir=_text(row["workdir"]),
            context_start=_number(row["context_start"], int),
            always_allow=self._column(row, where, "always_allow", [], _strings),
            created=_number(row["created"], float),
            updated=_number(row["updated"], float),
            message_count=row["message_count"],
        )

    def _message(self, row: sqlite3.Row) -> ChatMessage | None:
        where = f"message {row['id']} of session {row['session_id']}"
        role = row["role"]
        if role not in ROLES:
            self._report(("message", row["id"]), f"{where} has the role {reprlib.repr(role)}; it is left out")
            return None
        state = row["state"] if row["state"] in STATES else "done"
        if state != row["state"]:
            self._report(
                ("message", row["id"], "state"),
                f"{where} has the state {reprlib.repr(row['state'])}; it is taken as done",
            )
        return ChatMessage(
            id=row["id"],
            session_id=row["session_id"],
            role=role,
            content=_text(row["content"]),
            attachments=self._column(row, where, "attachments", [], _attachments),
            tool_calls=self._column(row, where, "tool_calls", [], _tool_calls),
            tool_call_id=None if row["tool_call_id"] is None else _text(row["tool_call_id"]),
            state=state,
            error=None if row["error"] is None else _text(row["error"]),
            stats=self._column(row, where, "stats", {}, lambda value: isinstance(value, dict)),
            created=_number(row["created"], float),
        )

    def _column(self, row: sqlite3.Row, where: str, column: str, empty, valid):
        """A JSON column's value; `empty` (reported) if it is not JSON or not of its shape."""
        raw = row[column]
        if raw is None:
            return empty
        try:
            value = json.loads(raw)
        except (ValueError, TypeError, RecursionError):
            pass
        else:
            if valid(value):
                return value
        self._report(
            (where, column),
            f"{where}: its {column} cannot be read ({reprlib.repr(raw)}); it is taken as {json.dumps(empty)}",
        )
        return empty

    def set_content(self, message_id: int, content: str) -> None:
        """The answer so far; called before each fragment is shown."""
        self.db.execute("UPDATE messages SET content = ? WHERE id = ?", (content, message_id))

    def finish(
        self,
        message_id: int,
        *,
        state: str,
        content: str | None = None,
        error: str | None = None,
        stats: dict | None = None,
        tool_calls: list[dict] | None = None,
    ) -> ChatMessage:
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
    """Run the migrations the store lacks, then check that every table and column is there.

    StoreDamaged if a migration fails (user_version says less than the tables hold) or the
    tables are not there (user_version says more: a newer lingcode's store keeps them all).
    """
    version = db.execute("PRAGMA user_version").fetchone()[0]
    for number, script in enumerate(MIGRATIONS[max(version, 0) :], start=max(version, 0) + 1):
        try:
            db.executescript(f"BEGIN; {script}; PRAGMA user_version = {number}; COMMIT;")
        except sqlite3.OperationalError as exc:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise StoreDamaged(
                f"it says it is at version {version}, but migration {number} fails on it: {exc}"
            ) from None
    for table, columns in _expected_columns().items():
        found = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        if not found:
            raise StoreDamaged(f"it has no table {table} (user_version {version})")
        if missing := columns - found:
            raise StoreDamaged(f"its table {table} lacks the columns {', '.join(sorted(missing))}")


def _expected_columns() -> dict[str, set[str]]:
    """The tables and columns the migrations make, read from a fresh in-memory database."""
    memory = sqlite3.connect(":memory:")
    try:
        memory.executescript("".join(MIGRATIONS))
        tables = [row[0] for row in memory.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        tables = [t for t in tables if t != "sqlite_sequence"]  # SQLite's own, for AUTOINCREMENT
        return {t: {row[1] for row in memory.execute(f"PRAGMA table_info({t})")} for t in tables}
    finally:
        memory.close()


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


def _text(value) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "" if value is None else str(value)


def _number(value, kind: type):
    try:
        return kind(value)
    except (TypeError, ValueError, OverflowError):
        return kind(0)


def _strings(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _attachments(value) -> bool:
    return isinstance(value, list) and all(
        isinstance(a, dict) and isinstance(a.get("path"), str) and isinstance(a.get("text"), str) for a in value
    )


def _tool_calls(value) -> bool:
    return isinstance(value, list) and all(
        isinstance(call, dict) and isinstance(call.get("function", {}), dict) for call in value
    )

"""Where chat sessions live: one SQLite database (WAL) in the data dir."""

from lingcode.tui.store.sessions import Message, Session, SessionStore, default_path

__all__ = ["Message", "Session", "SessionStore", "default_path"]

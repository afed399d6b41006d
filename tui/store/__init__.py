"""Where chat sessions live: one SQLite database (WAL) in the data dir."""

from lingcode.tui.store.sessions import ChatMessage, ChatSession, ChatStore, default_path

__all__ = ["ChatMessage", "ChatSession", "ChatStore", "default_path"]

"""Token-exact agent sessions: the conversation is kept as the exact token ids the model saw and wrote.

A stateless API re-renders the whole conversation every turn: the model's earlier answers are
detokenized, re-templated and re-tokenized, and may come back as different tokens (a tool call
re-serialized, whitespace normalized), which breaks prefix reuse from that point on. A session
instead appends: the first turn renders its messages with the chat template; every later turn
renders only the new messages (tool results, user text) as the template would continue after an
assistant turn, and appends their tokens to the history, which already ends with the tokens the
model generated, as generated. So each turn's prompt extends the previous one token for token,
and the engine (which keeps the session's KV) prefills only the new tokens.

Sessions live in memory, and are forgotten after `idle_timeout_s` without a turn. A session's
history is bounded by the model's context (a longer one is refused, never kept), and the store by
count and bytes: past either bound the sessions idle longest are forgotten first (evicted).
"""

from __future__ import annotations

import json
import time
import uuid
from array import array
from dataclasses import dataclass, field

from lingcode.text.chat_template import TemplateError
from lingcode.engine import ModelInfo
from lingcode.text.families import Family
from lingcode.agent.tool_parsers import Tool
from lingcode.agent.tool_prompt import render_prompt

DEFAULT_IDLE_TIMEOUT_S = 1800.0
DEFAULT_MAX_SESSIONS = 64
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
TOKEN_BYTES = 4  # a history token, as the session keeps it (array "i")

# Stands in for an assistant answer, so that what the template writes after an answer can be found.
_SENTINEL = "\x1elingcode-assistant-turn\x1e"


class SessionError(ValueError):
    """The session cannot take these messages (the template cannot continue it)."""


class StoreFull(RuntimeError):
    """Every session the store would have to forget to make room has a turn running."""


@dataclass
class Session:
    id: str
    family: Family
    tools: tuple[Tool, ...]
    idle_timeout_s: float
    pending: list[dict] = field(default_factory=list)  # messages given at creation, rendered by the first turn
    pending_tokens: int = 0  # their prompt's tokens, counted at creation
    token_ids: array = field(default_factory=lambda: array("i"))  # the exact history: prompts and generated tokens
    turns: int = 0
    created_at: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.monotonic)
    busy: str | None = None  # the request id of the turn running (one at a time)

    def __post_init__(self):
        self.pending_bytes = len(json.dumps(self.pending, ensure_ascii=False, default=str).encode())

    def expired(self, now: float) -> bool:
        return not self.busy and now - self.last_used > self.idle_timeout_s

    @property
    def size(self) -> int:
        """What the store counts against its bytes: the pending messages' JSON, 4 bytes per token."""
        return self.pending_bytes + TOKEN_BYTES * len(self.token_ids)

    def describe(self) -> dict:
        return {
            "id": self.id,
            "object": "session",
            "created": int(self.created_at),
            "turns": self.turns,
            "history_tokens": len(self.token_ids) or self.pending_tokens,
            "tools": [t.name for t in self.tools],
            "idle_timeout_s": self.idle_timeout_s,
            "expires_in_s": round(max(0.0, self.idle_timeout_s - (time.monotonic() - self.last_used)), 3),
        }


class SessionStore:
    def __init__(
        self,
        default_idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ):
        self.default_idle_timeout_s = default_idle_timeout_s
        self.max_sessions, self.max_bytes = max_sessions, max_bytes
        self._sessions: dict[str, Session] = {}
        self.counters = dict.fromkeys(("created", "deleted", "expired", "evicted"), 0)

    def bounds(self) -> str:
        """The store's bounds, in words (for errors and logs)."""
        return f"the daemon keeps at most {self.max_sessions} sessions and {self.max_bytes // 2**20} MiB of them"

    def create(
        self,
        family: Family,
        tools: list[Tool],
        messages: list[dict],
        idle_timeout_s: float | None,
        pending_tokens: int = 0,
    ) -> Session:
        """A new session, after forgetting the sessions idle longest if it needs their room (StoreFull
        if that would take one with a turn running; SessionError if it alone is past the bytes)."""
        self.expire()
        session = Session(
            f"sess_{uuid.uuid4().hex}",
            family,
            tuple(tools),
            idle_timeout_s or self.default_idle_timeout_s,
            pending=list(messages),
            pending_tokens=pending_tokens,
        )
        if session.size > self.max_bytes:
            raise SessionError(f"the session's messages take {session.size} bytes; {self.bounds()}")
        self._make_room(session)
        self._sessions[session.id] = session
        self.counters["created"] += 1
        return session

    def commit(self, session: Session, input_ids: list[int], output_ids: list[int]) -> None:
        """A finished turn: the history is now its prompt and what the model generated, as generated;
        a store it has grown past its bytes forgets the other sessions idle longest."""
        session.token_ids = array("i", input_ids)
        session.token_ids.extend(output_ids)
        session.pending, session.pending_bytes = [], 0
        session.turns += 1
        session.last_used = time.monotonic()
        if session.id in self._sessions:
            try:
                self._make_room(session)
            except StoreFull:
                pass  # only sessions with turns running are left to forget: a later create or commit makes room

    def _make_room(self, session: Session) -> None:
        others = [s for s in self._sessions.values() if s is not session]
        count = len(others) + 1
        size = sum(s.size for s in others) + session.size
        idle = sorted((s for s in others if not s.busy), key=lambda s: s.last_used)  # oldest idle first
        evict = []
        while count > self.max_sessions or size > self.max_bytes:
            if not idle:
                raise StoreFull(f"no session can be forgotten to make room (each has a turn running); {self.bounds()}")
            oldest = idle.pop(0)
            evict.append(oldest)
            count, size = count - 1, size - oldest.size
        for oldest in evict:
            del self._sessions[oldest.id]
            self.counters["evicted"] += 1

    def get(self, session_id: str) -> Session | None:
        self.expire()
        return self._sessions.get(session_id)

    def delete(self, session_id: str) -> bool:
        if self._sessions.pop(session_id, None) is None:
            return False
        self.counters["deleted"] += 1
        return True

    def list(self) -> list[Session]:
        self.expire()
        return list(self._sessions.values())

    def expire(self) -> None:
        now = time.monotonic()
        for session_id in [s.id for s in self._sessions.values() if s.expired(now)]:
            del self._sessions[session_id]
            self.counters["expired"] += 1

    def stats(self) -> dict:
        return {
            **self.counters,
            "open": len(self._sessions),
            "bytes": sum(s.size for s in self._sessions.values()),
            "max_sessions": self.max_sessions,
            "max_bytes": self.max_bytes,
        }


def turn_prompt(info: ModelInfo, session: Session, messages: list[dict]) -> tuple[list[int], str]:
    """The next turn's input ids (the history plus the new messages' tokens), and the appended text."""
    tools = list(session.tools)
    try:
        if not session.token_ids:  # the first turn: everything so far, rendered once
            text = render_prompt(info, session.family, session.pending + messages, tools)
            return info.tokenizer.encode(text), text
        text = _continuation(info, session, messages)
    except TemplateError as exc:
        raise SessionError(str(exc)) from None
    last = info.tokenizer.decode([session.token_ids[-1]])
    if session.token_ids[-1] in info.eos_token_ids and text.startswith(last):
        text = text[len(last) :]  # the model already wrote the end of its turn
    return [*session.token_ids, *info.tokenizer.encode(text)], text


def _continuation(info: ModelInfo, session: Session, messages: list[dict]) -> str:
    """What the template writes after an assistant answer: its end, the new messages, the next prompt."""
    base = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": _SENTINEL},
    ]
    text = render_prompt(info, session.family, base + messages, list(session.tools))
    at = text.rfind(_SENTINEL)
    if at < 0:
        raise SessionError(
            "this model's chat template does not render assistant answers verbatim, so a "
            "session cannot append to one; use /v1/chat/completions instead"
        )
    return text[at + len(_SENTINEL) :]

"""Token-exact agent sessions: the conversation is kept as the exact token ids the model saw and wrote.

A stateless API re-renders the whole conversation every turn: the model's earlier answers are
detokenized, re-templated and re-tokenized, and may come back as different tokens (a tool call
re-serialized, whitespace normalized), which breaks prefix reuse from that point on. A session
instead appends: the first turn renders its messages with the chat template; every later turn
renders only the new messages (tool results, user text) as the template would continue after an
assistant turn, and appends their tokens to the history, which already ends with the tokens the
model generated, as generated. So each turn's prompt extends the previous one token for token,
and the engine (which keeps the session's KV) prefills only the new tokens.

Sessions live in memory, and are forgotten after `idle_timeout_s` without a turn.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from lingcode.text.chat_template import TemplateError
from lingcode.engine import ModelInfo
from lingcode.text.families import Family
from lingcode.agent.tool_parsers import Tool
from lingcode.agent.tool_prompt import render_prompt

DEFAULT_IDLE_TIMEOUT_S = 1800.0

# Stands in for an assistant answer, so that what the template writes after an answer can be found.
_SENTINEL = "\x1elingcode-assistant-turn\x1e"


class SessionError(ValueError):
    """The session cannot take these messages (the template cannot continue it)."""


@dataclass
class Session:
    id: str
    family: Family
    tools: tuple[Tool, ...]
    idle_timeout_s: float
    pending: list[dict] = field(default_factory=list)  # messages given at creation, rendered by the first turn
    token_ids: list[int] = field(default_factory=list)  # the exact history: prompts and generated tokens
    turns: int = 0
    created_at: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.monotonic)
    busy: str | None = None  # the request id of the turn running (one at a time)

    def expired(self, now: float) -> bool:
        return not self.busy and now - self.last_used > self.idle_timeout_s

    def describe(self) -> dict:
        return {
            "id": self.id, "object": "session", "created": int(self.created_at), "turns": self.turns,
            "history_tokens": len(self.token_ids), "tools": [t.name for t in self.tools],
            "idle_timeout_s": self.idle_timeout_s,
            "expires_in_s": round(max(0.0, self.idle_timeout_s - (time.monotonic() - self.last_used)), 3),
        }  # fmt: skip


class SessionStore:
    def __init__(self, default_idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S):
        self.default_idle_timeout_s = default_idle_timeout_s
        self._sessions: dict[str, Session] = {}
        self.counters = dict.fromkeys(("created", "deleted", "expired"), 0)

    def create(self, family: Family, tools: list[Tool], messages: list[dict], idle_timeout_s: float | None) -> Session:
        self.expire()
        session = Session(f"sess_{uuid.uuid4().hex}", family, tuple(tools),
                          idle_timeout_s or self.default_idle_timeout_s, pending=list(messages))  # fmt: skip
        self._sessions[session.id] = session
        self.counters["created"] += 1
        return session

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
        return {**self.counters, "open": len(self._sessions)}


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
    return session.token_ids + info.tokenizer.encode(text), text


def _continuation(info: ModelInfo, session: Session, messages: list[dict]) -> str:
    """What the template writes after an assistant answer: its end, the new messages, the next prompt."""
    base = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
            {"role": "assistant", "content": _SENTINEL}]  # fmt: skip
    text = render_prompt(info, session.family, base + messages, list(session.tools))
    at = text.rfind(_SENTINEL)
    if at < 0:
        raise SessionError("this model's chat template does not render assistant answers verbatim, so a "
                           "session cannot append to one; use /v1/chat/completions instead")  # fmt: skip
    return text[at + len(_SENTINEL) :]


def commit(session: Session, input_ids: list[int], output_ids: list[int]) -> None:
    """A finished turn: the history is now its prompt and what the model generated, as generated."""
    session.token_ids = list(input_ids) + list(output_ids)
    session.pending = []
    session.turns += 1
    session.last_used = time.monotonic()

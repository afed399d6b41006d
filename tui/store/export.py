"""A session as a Markdown document: what /export and the sessions screen write."""

from __future__ import annotations

import json
import time

from pathlib import Path

from lingcode.tui.store.sessions import ChatMessage, ChatSession, ChatStore


def export_session(store: ChatStore, session_id: int, path: Path) -> Path:
    """Write the session as Markdown to path."""
    text = session_markdown(store.get(session_id), store.messages(session_id))
    path.write_text(text, encoding="utf-8")
    return path


def session_markdown(session: ChatSession, messages: list[ChatMessage]) -> str:
    created = time.strftime("%Y-%m-%d %H:%M", time.localtime(session.created))
    lines = [f"# {session.title or f'Session {session.id}'}", "", f"_lingcode chat session {session.id}, {created}_"]
    if session.workdir:
        lines.append(f"_working directory: `{session.workdir}`_")
    if session.system:
        lines += ["", "**System prompt:**", "", _quote(session.system)]
    for message in messages:
        lines += ["", *_message_markdown(message)]
    return "\n".join(lines).rstrip() + "\n"


def _message_markdown(message: ChatMessage) -> list[str]:
    if message.role == "user":
        lines = ["## You", "", message.content]
        for attachment in message.attachments:
            lines += ["", f"Attached `{attachment['path']}`:", "", fence(attachment["text"])]
        return lines
    if message.role == "tool":
        return [f"**Result** (`{message.tool_call_id}`):", "", fence(message.content)]
    lines = ["## Assistant", ""]
    if message.content:
        lines.append(message.content)
    for call in message.tool_calls:
        function = call.get("function", {})
        lines += [
            "",
            f"**Tool call** `{function.get('name')}` (`{call.get('id')}`):",
            "",
            fence(_pretty_json(function.get("arguments", "")), "json"),
        ]
    if message.state in ("stopped", "error", "streaming"):
        lines += ["", f"_({_STATE_NOTE[message.state]}{': ' + message.error if message.error else ''})_"]
    timings = message.stats.get("timings") or {}
    if timings.get("tokens_per_s"):
        lines += ["", f"_{timings.get('completion_tokens', '?')} tokens, {timings['tokens_per_s']} tokens/s_"]
    return lines


_STATE_NOTE = {"stopped": "stopped by the user", "error": "failed", "streaming": "interrupted"}


def _pretty_json(text: str) -> str:
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except ValueError:
        return text


def fence(text: str, language: str = "") -> str:
    """A code fence longer than any backtick run inside the text, so the text cannot close it."""
    ticks = "`" * max(3, _longest_backtick_run(text) + 1)
    return f"{ticks}{language}\n{text}\n{ticks}"


def _longest_backtick_run(text: str) -> int:
    longest = run = 0
    for char in text:
        run = run + 1 if char == "`" else 0
        longest = max(longest, run)
    return longest


def _quote(text: str) -> str:
    return "\n".join(f"> {line}" for line in text.splitlines())

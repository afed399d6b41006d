"""`@path` in a message: attach that file's text (as read when sent), and complete paths while typing."""

from __future__ import annotations

import re
from pathlib import Path

MAX_ATTACH_BYTES = 256_000
MAX_COMPLETIONS = 30
MENTION = re.compile(r"(?<!\S)@(\S+)")


class AttachError(ValueError):
    """A mentioned file cannot be attached whole; the message is not sent."""


def attach(text: str, workdir: Path) -> tuple[list[dict], list[str]]:
    """The files that `@path` mentions name, and notes on mentions that are not files (sent as text)."""
    attachments: list[dict] = []
    notes: list[str] = []
    for mention in dict.fromkeys(MENTION.findall(text)):
        path = _existing(workdir, mention)
        if path is None:
            notes.append(f"@{mention} is not a file here; sent as plain text")
            continue
        if path.is_dir():
            notes.append(f"@{mention} is a directory; only files are attached")
            continue
        size = path.stat().st_size
        if size > MAX_ATTACH_BYTES:
            raise AttachError(
                f"@{mention} is {size} bytes, over the {MAX_ATTACH_BYTES}-byte limit for attachments; "
                "ask the agent to read it in parts instead"
            )
        try:
            attachments.append({"path": mention.rstrip(".,;:!?)"), "text": path.read_text(encoding="utf-8")})
        except UnicodeDecodeError:
            raise AttachError(f"@{mention} is not UTF-8 text") from None
    return attachments, notes


def _existing(workdir: Path, mention: str) -> Path | None:
    # "see @app.py," mentions app.py: trailing punctuation is tried without.
    for candidate in (mention, mention.rstrip(".,;:!?)")):
        path = (workdir / Path(candidate).expanduser()).resolve()
        if candidate and path.exists():
            return path
    return None


def complete_path(prefix: str, workdir: Path) -> list[str]:
    """Paths that start with prefix (relative to workdir), directories with a trailing slash."""
    folder, _, start = prefix.rpartition("/")
    base = (workdir / folder) if folder else workdir
    try:
        entries = sorted(base.iterdir(), key=lambda p: (not p.is_dir(), p.name))
    except OSError:
        return []
    hidden_ok = start.startswith(".")
    found = []
    for entry in entries:
        if entry.name.startswith(start) and (hidden_ok or not entry.name.startswith(".")):
            name = f"{folder}/{entry.name}" if folder else entry.name
            found.append(name + "/" if entry.is_dir() else name)
            if len(found) == MAX_COMPLETIONS:
                break
    return found

"""The file tools: read_file, list_dir, grep (reads) and apply_edit, write_file (writes, shown as diffs).

Results are text for the model. Anything cut to keep a result small says so in the result, with
how to get the rest: the model is never shown a silently shortened file.

Only regular files of bounded size are read (lingcode/regular_file.py): a FIFO or a device in
the tree never blocks a tool. grep decides every file it reaches, after symlinks, with a check
from the permission rules (permissions.py, Permissions.file_check): files a rule denies, and
links leading out of the searched path, are not searched, and the result says so.

Whatever the filesystem raises (a loop of symbolic links, a permission, a name too long, a file
gone meanwhile) is a ToolError, which the model reads as the call's result: grep and list_dir
name the entries they could not read and go on with the rest.
"""

from __future__ import annotations

import difflib
import errno
import fnmatch
import functools
import os
import re
from collections.abc import Callable
from pathlib import Path

from lingcode.regular_file import UnreadableFile, read_regular_file

READ_LINES = 400  # lines per read_file call
MAX_LINE_CHARS = 2000
LIST_ENTRIES = 500
GREP_MATCHES = 100
GREP_FILE_BYTES = 2_000_000  # bigger files are not searched (and the result says how many were skipped)
READ_FILE_BYTES = 20_000_000  # read_file reads the whole file to number its lines; past this, grep or a command
NAMED_FILES = 10  # files grep held back, named in its result
SKIP_DIRS = {".git", ".hg", ".svn", "__pycache__", "node_modules", ".venv", "venv", ".mypy_cache", ".pytest_cache"}


class ToolError(Exception):
    """A tool could not do what was asked; the message goes back to the model."""


def failure(error: OSError | RuntimeError) -> str:
    """What went wrong in the filesystem, in words; pathlib before Python 3.13 raises RuntimeError for a loop."""
    if isinstance(error, RuntimeError) or getattr(error, "errno", None) == errno.ELOOP:
        return "a loop of symbolic links"
    return error.strerror or str(error)


def file_tool(function: Callable) -> Callable:
    """A tool over the filesystem: whatever the filesystem raises becomes a ToolError, naming the file."""

    @functools.wraps(function)
    def run(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except (OSError, RuntimeError) as e:
            name = getattr(e, "filename", None) or kwargs.get("path")
            raise ToolError(f"{name}: {failure(e)}" if name else failure(e)) from None

    return run


def resolve(workdir: Path, path: str) -> Path:
    if not isinstance(path, str) or not path:
        raise ToolError("path must be a non-empty string")
    try:
        name = Path(path).expanduser()
    except RuntimeError as e:  # ~nobody
        raise ToolError(f"{path}: {e}") from None
    try:
        return (workdir / name).resolve()
    except (OSError, RuntimeError) as e:
        raise ToolError(f"{path}: {failure(e)}") from None


def display(workdir: Path, path: Path) -> str:
    """The path as the person would type it: relative inside the working directory."""
    try:
        return str(path.relative_to(workdir)) or "."
    except ValueError:
        return str(path)


def read_text(path: Path, max_bytes: int = READ_FILE_BYTES) -> str:
    if not path.exists():
        raise ToolError(f"{path} does not exist")
    if path.is_dir():
        raise ToolError(f"{path} is a directory; use list_dir")
    try:
        data = read_regular_file(path, max_bytes)
    except UnreadableFile as e:
        raise ToolError(str(e)) from None
    if b"\0" in data[:8192]:
        raise ToolError(f"{path} is a binary file ({len(data)} bytes)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ToolError(f"{path} is not UTF-8 text") from None


@file_tool
def read_file(workdir: Path, path: str, offset: int = 1, limit: int = READ_LINES) -> str:
    target = resolve(workdir, path)
    lines = read_text(target).splitlines()
    if not isinstance(offset, int) or offset < 1:
        raise ToolError("offset must be a line number >= 1")
    limit = min(max(int(limit), 1), READ_LINES)
    if lines and offset > len(lines):
        raise ToolError(f"{display(workdir, target)} has {len(lines)} lines; offset {offset} is past the end")
    end = min(offset - 1 + limit, len(lines))
    body = "\n".join(f"{n:>5}  {_clip(line)}" for n, line in enumerate(lines[offset - 1 : end], start=offset))
    header = f"{display(workdir, target)}: lines {offset}-{end} of {len(lines)}"
    if end < len(lines):
        header += f" (more follows: call read_file with offset={end + 1})"
    return f"{header}\n{body}"


def _clip(line: str) -> str:
    if len(line) <= MAX_LINE_CHARS:
        return line
    return f"{line[:MAX_LINE_CHARS]}... [line cut: {len(line) - MAX_LINE_CHARS} more characters]"


@file_tool
def list_dir(workdir: Path, path: str = ".") -> str:
    target = resolve(workdir, path)
    if not target.is_dir():
        raise ToolError(f"{target} is not a directory")
    entries = sorted(target.iterdir(), key=lambda p: (not p.is_dir(), p.name))
    lines = [_entry(workdir, target, p) for p in entries[:LIST_ENTRIES]]
    if len(entries) > LIST_ENTRIES:
        lines.append(f"[{len(entries) - LIST_ENTRIES} more entries not listed]")
    return f"{display(workdir, target)}/: {len(entries)} entries\n" + "\n".join(lines)


def _entry(workdir: Path, listed: Path, path: Path) -> str:
    try:
        if path.is_symlink() and not _within(path.resolve(), workdir.resolve(), listed):
            return f"{path.name}  (a link out of the working directory)"  # its size is no business of this listing
    except (OSError, RuntimeError) as e:
        return f"{path.name}  ({failure(e)})"
    return f"{path.name}/" if path.is_dir() else f"{path.name}  ({_size(path)})"


def _within(target: Path, *roots: Path) -> bool:
    return any(target.is_relative_to(root) for root in roots)


def _size(path: Path) -> str:
    try:
        return f"{path.stat().st_size} bytes"
    except OSError as e:
        return failure(e)


@file_tool
def grep(
    workdir: Path, pattern: str, path: str = ".", glob: str = "*", check: Callable[[Path], str] | None = None
) -> str:
    """check(resolved file) -> "allow" | "ask" | "deny" decides each file; without one, a file is
    searched if it lies in the working directory or the searched path, wherever its links lead."""
    try:
        regex = re.compile(pattern)
    except (re.error, TypeError) as e:
        raise ToolError(f"bad regular expression {pattern!r}: {e}") from None
    root = resolve(workdir, path)
    if not root.exists():
        raise ToolError(f"{root} does not exist")
    check = check or (lambda target: "allow" if _within(target, workdir.resolve(), root) else "ask")
    matches: list[str] = []
    total = skipped = denied = 0
    held_back: list[str] = []
    unreadable: list[str] = []  # what the filesystem refused, and why

    def refused(error: OSError | RuntimeError, where: str | Path) -> None:
        unreadable.append(f"{display(workdir, Path(where))} ({failure(error)})")

    for file in _walk(root, lambda e: refused(e, e.filename)):
        if not fnmatch.fnmatch(file.name, glob):
            continue
        try:
            target = file.resolve()
        except RuntimeError as e:
            refused(e, file)
            continue
        action = check(target)
        if action != "allow":
            denied += action == "deny"
            if action == "ask":
                held_back.append(display(workdir, file))
            continue
        try:
            if target.stat().st_size > GREP_FILE_BYTES:
                skipped += 1
                continue
            text = read_text(target, GREP_FILE_BYTES)
        except OSError as e:  # a loop, a permission, a file gone meanwhile
            refused(e, file)
            continue
        except ToolError:  # not text: binary, not UTF-8, a FIFO or device
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            if regex.search(line):
                total += 1
                if len(matches) < GREP_MATCHES:
                    matches.append(f"{display(workdir, file)}:{number}: {_clip(line.strip())}")
    summary = f"{total} matches for {pattern!r}"
    if total > len(matches):
        summary += f" (first {len(matches)} shown; narrow the path or glob for the rest)"
    if skipped:
        summary += f"; {skipped} files over {GREP_FILE_BYTES} bytes not searched"
    if denied:
        summary += f"; {denied} files not searched: the permission rules deny them"
    if held_back:
        named = ", ".join(held_back[:NAMED_FILES]) + (", ..." if len(held_back) > NAMED_FILES else "")
        summary += (
            f"; {len(held_back)} files not searched without the person's consent (links out of the searched "
            f"path, or rules that ask): {named}; read_file asks for them"
        )
    if unreadable:
        named = ", ".join(unreadable[:NAMED_FILES]) + (", ..." if len(unreadable) > NAMED_FILES else "")
        summary += f"; {len(unreadable)} files or folders could not be read: {named}"
    return "\n".join([summary, *matches])


def _walk(root: Path, refused: Callable[[OSError], None]):
    if root.is_file():
        yield root
        return
    for directory, dirs, files in os.walk(root, onerror=refused):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        for name in sorted(files):
            yield Path(directory) / name


@file_tool
def edited_text(workdir: Path, path: str, old_text: str, new_text: str) -> tuple[Path, str, str]:
    """The file and its text before and after replacing the one occurrence of old_text."""
    target = resolve(workdir, path)
    before = read_text(target)
    if not old_text:
        raise ToolError("old_text must not be empty (use write_file to create a file)")
    count = before.count(old_text)
    if count == 0:
        raise ToolError(f"old_text was not found in {display(workdir, target)}; read the file and copy it exactly")
    if count > 1:
        raise ToolError(f"old_text occurs {count} times in {display(workdir, target)}; include more context")
    return target, before, before.replace(old_text, new_text, 1)


@file_tool
def apply_edit(workdir: Path, path: str, old_text: str, new_text: str) -> str:
    target, before, after = edited_text(workdir, path, old_text, new_text)
    target.write_text(after, encoding="utf-8")
    return f"edited {display(workdir, target)}\n{unified_diff(workdir, target, before, after)}"


@file_tool
def write_file(workdir: Path, path: str, content: str) -> str:
    target = resolve(workdir, path)
    if target.is_dir():
        raise ToolError(f"{target} is a directory")
    if not isinstance(content, str):
        raise ToolError("content must be a string")
    existed = target.exists()
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(content, encoding="utf-8")
    verb = "overwrote" if existed else "created"
    return f"{verb} {display(workdir, target)} ({len(content.splitlines())} lines)"


@file_tool
def write_preview(workdir: Path, path: str, content: str) -> str:
    """The diff a write_file call would make, for the permission prompt."""
    target = resolve(workdir, path)
    try:
        before = read_text(target) if target.exists() else ""
    except ToolError as e:
        return f"(cannot diff: {e})"
    return unified_diff(workdir, target, before, content)


def unified_diff(workdir: Path, path: Path, before: str, after: str) -> str:
    name = display(workdir, path)
    lines = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), f"a/{name}", f"b/{name}"
    )
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines).rstrip("\n") or "(no change)"

"""The engine's prepared model, kept on disk so that the next start maps it instead of preparing it again.

Preparing the default model on 2 cores (the GGUF read and dequantized, matmul weights converted,
4-bit codes repacked, a step of each width timed) takes tens of seconds on busy cores; mapping
the result takes a fraction of one. An entry is the torch.save of what `build()` returns, loaded
with mmap: its pages come from the page cache as the first forwards touch them. Next to it, a
small JSON holds what was measured for it (the step costs) per thread count.

An entry's key: the source's sha256 (memoized by path, size, mtime and inode), what is prepared
(e.g. "cpu-float32"), torch's version, the sources of lingcode/engine/local (a change to how a model
is prepared makes a new entry; there is no version to bump by hand) and `extra` (what else the
prepared model depends on in this process, e.g. whether a native kernel is loaded). Entries live
in paths.prepared_dir(); writing one deletes the source's older entries.

Entries are pickles (the model is whatever modules the engine builds), read only from lingcode's
own cache directory, and only when this user alone can write the file and its directory.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from lingcode import paths

log = logging.getLogger(__name__)
ENGINE_SOURCES = Path(__file__).parent


def directory() -> Path:
    return paths.prepared_dir()


def file_sha256(path: Path) -> str:
    """The file's sha256, hashed once per (path, size, mtime, inode): later starts read it back."""
    stat = path.stat()
    memo = directory() / "checksums.json"
    key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{stat.st_ino}"
    try:
        known = json.loads(memo.read_text())
    except (OSError, ValueError):
        known = {}
    if isinstance(known, dict) and isinstance(known.get(key), str):
        return known[key]
    with open(path, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    known = (
        {k: v for k, v in known.items() if not k.startswith(f"{path.resolve()}|")} if isinstance(known, dict) else {}
    )
    _write_atomic(memo, json.dumps({**known, key: digest}, indent=1).encode())
    return digest


def entry_key(source: Path, what: str, extra: str = "") -> tuple[str, str]:
    """(the source's sha256, the entry's name)."""
    sha = file_sha256(source) if source.is_file() else _directory_sha256(source)
    code = hashlib.sha256()
    for file in sorted(ENGINE_SOURCES.glob("*.py")) + sorted(ENGINE_SOURCES.glob("*.cpp")):
        code.update(file.name.encode() + b"\0" + file.read_bytes() + b"\0")
    code.update(f"{torch.__version__}|{what}|{extra}".encode())
    return sha, f"{sha[:16]}-{what}-{code.hexdigest()[:16]}"


def load_or_build(source: Path, what: str, build: Callable[[], object], extra: str = "") -> tuple[object, str]:
    """(what build() returns, loaded from the cache if there, else built and saved; the entry's name)."""
    sha, name = entry_key(source, what, extra)
    path = directory() / f"{name}.pt"
    if path.exists() and not _ours(path):
        log.warning("the prepared model %s is not this user's alone; preparing it again", path)
    elif path.exists():
        try:
            return torch.load(path, mmap=True, weights_only=False), name
        except Exception as exc:  # a damaged or foreign file: prepare again, and replace it
            log.warning("the prepared model %s could not be read (%s); preparing it again", path.name, exc)
    prepared = build()
    try:
        for old in directory().glob(f"{sha[:16]}-{what}-*"):
            old.unlink(missing_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory(), prefix=f".{name}.", suffix=".part", delete=False) as f:
            tmp = Path(f.name)
        try:
            torch.save(prepared, tmp)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    except OSError as exc:  # a full or read-only disk: serve anyway, prepare again next time
        log.warning("could not keep the prepared model in %s: %s", directory(), exc)
    return prepared, name


def recall(name: str, what: str):
    """A measurement kept beside entry `name` (e.g. step costs per thread count), or None."""
    return _measurements(name).get(what)


def remember(name: str, what: str, value) -> None:
    try:
        _write_atomic(directory() / f"{name}.json", json.dumps({**_measurements(name), what: value}, indent=1).encode())
    except OSError as exc:
        log.warning("could not keep %s for %s: %s", what, name, exc)


def _measurements(name: str) -> dict:
    try:
        known = json.loads((directory() / f"{name}.json").read_text())
    except (OSError, ValueError):
        return {}
    return known if isinstance(known, dict) else {}


def _ours(path: Path) -> bool:
    """Written by this user and writable by no one else, the file and its directory: an entry is
    unpickled, so one that another user could have written is prepared again instead."""
    return all(st.st_uid == os.getuid() and not st.st_mode & 0o022 for st in (path.stat(), path.parent.stat()))


def _directory_sha256(directory_: Path) -> str:
    """A Hugging Face directory: the hashes of its files (names and contents), in order."""
    digest = hashlib.sha256()
    for file in sorted(p for p in directory_.iterdir() if p.is_file()):
        digest.update(file.name.encode() + b"\0" + file_sha256(file).encode())
    return digest.hexdigest()


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)

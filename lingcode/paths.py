"""The one place for lingcode's directories: platformdirs, or everything under $LINGCODE_HOME.

They hold the token, the permission rules and every chat, so each is this user's only: created
0700 whatever the umask, tightened back to 0700 if found looser, and refused if another user
owns it (they could plant a token or an allow-all rule there). Files in them that hold secrets
or conversations are made with private_file(), 0600. A LINGCODE_HOME the person made themselves
keeps its mode: lingcode only says, once, when other users may look into it.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import platformdirs

APP = "lingcode"
PRIVATE_DIR, PRIVATE_FILE = 0o700, 0o600
_warned: set[Path] = set()  # the homes whose mode this process has warned about


class NotPrivate(PermissionError):
    """A lingcode directory or file belongs to another user: lingcode will not trust or use it."""


def _home() -> Path | None:
    home = os.environ.get("LINGCODE_HOME")
    if not home:
        return None
    path = Path(home).expanduser().resolve()
    _warn_if_open(path)
    return path


def _warn_if_open(home: Path) -> None:
    """The person may share their own folder on purpose, so it is not chmod-ed; but they should know."""
    if home in _warned or os.name != "posix":
        return
    try:
        mode = stat.S_IMODE(home.stat().st_mode)
    except OSError:  # not made yet: private_dir makes it 0700
        return
    if mode & 0o077:
        _warned.add(home)
        others = "list and rename what it holds" if mode & 0o022 else "list what it holds"
        print(
            f"lingcode: WARNING: LINGCODE_HOME {home} is mode {mode:o}: other users may {others} (lingcode's "
            f"folders in it are 0700). Run `chmod 700 {home}` unless you share it on purpose",
            file=sys.stderr,
            flush=True,
        )


def private_dir(path: Path) -> Path:
    """`path` as a directory only this user can enter: missing parents too are made 0700."""
    missing = []
    for parent in (path, *path.parents):
        if parent.exists():
            break
        missing.append(parent)
    for directory in reversed(missing):
        try:
            directory.mkdir(PRIVATE_DIR)
        except FileExistsError:  # made at the same moment by another process: checked below
            continue
        os.chmod(directory, PRIVATE_DIR)  # mkdir's mode went through the umask
    _check_owner(path, path.stat())
    if os.name == "posix" and stat.S_IMODE(path.stat().st_mode) != PRIVATE_DIR:
        os.chmod(path, PRIVATE_DIR)  # e.g. made 0777 by an older lingcode under umask 000
    return path


def private_file(path: Path) -> Path:
    """`path` as an existing regular file that only this user can read (0600): created empty if absent.

    Never through a symlink, and never someone else's file: either is NotPrivate.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags, PRIVATE_FILE)
    except OSError as exc:
        if path.is_symlink():
            raise NotPrivate(f"{path} is a symbolic link; lingcode keeps only plain files there") from None
        raise exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotPrivate(f"{path} is not a regular file")
        _check_owner(path, info)
        if os.name == "posix" and stat.S_IMODE(info.st_mode) != PRIVATE_FILE:
            os.fchmod(fd, PRIVATE_FILE)
    finally:
        os.close(fd)
    return path


def _check_owner(path: Path, info: os.stat_result) -> None:
    if hasattr(os, "geteuid") and info.st_uid != os.geteuid():
        raise NotPrivate(
            f"{path} belongs to another user (uid {info.st_uid}); lingcode keeps its files only in "
            "its own user's directories. Remove it, or set LINGCODE_HOME to a directory of yours"
        )


def _dir(kind: str) -> Path:
    home = _home()
    if home is not None:
        path = home / kind
    else:
        path = Path(getattr(platformdirs, f"user_{kind}_dir")(APP, appauthor=False))
    return private_dir(path)


def config_dir() -> Path:
    return _dir("config")


def state_dir() -> Path:
    return _dir("state")


def cache_dir() -> Path:
    return _dir("cache")


def data_dir() -> Path:
    return _dir("data")


def models_dir() -> Path:
    return private_dir(cache_dir() / "models")


def partial_dir() -> Path:
    """Catalog models being pulled: the parts fetched and checked so far, so that a pull resumes."""
    return private_dir(models_dir() / "partial")


def token_file() -> Path:
    return config_dir() / "token"


def daemon_file() -> Path:
    return state_dir() / "daemon.json"


def native_dir() -> Path:
    """Native code lingcode builds on this machine (the CPU kernels), one subfolder per library."""
    return private_dir(cache_dir() / "native")


def prepared_dir() -> Path:
    """Models as the engine prepared them for this machine (lingcode.engine.local.prepared)."""
    return private_dir(cache_dir() / "prepared")


def daemon_lock_file() -> Path:
    """Held (flock) by the daemon for its whole life: one daemon per LINGCODE_HOME."""
    return state_dir() / "daemon.lock"

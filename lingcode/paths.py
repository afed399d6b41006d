"""The one place for lingcode's directories: platformdirs, or everything under $LINGCODE_HOME."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP = "lingcode"


def _home() -> Path | None:
    home = os.environ.get("LINGCODE_HOME")
    return Path(home).expanduser().resolve() if home else None


def _dir(kind: str) -> Path:
    home = _home()
    if home is not None:
        path = home / kind
    else:
        path = Path(getattr(platformdirs, f"user_{kind}_dir")(APP, appauthor=False))
    path.mkdir(parents=True, exist_ok=True)
    return path


def config_dir() -> Path:
    return _dir("config")


def state_dir() -> Path:
    return _dir("state")


def cache_dir() -> Path:
    return _dir("cache")


def data_dir() -> Path:
    return _dir("data")


def models_dir() -> Path:
    path = cache_dir() / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path


def token_file() -> Path:
    return config_dir() / "token"


def daemon_file() -> Path:
    return state_dir() / "daemon.json"


def native_dir() -> Path:
    """Native code lingcode builds on this machine (the CPU kernels), one subfolder per library."""
    path = cache_dir() / "native"
    path.mkdir(parents=True, exist_ok=True)
    return path


def prepared_dir() -> Path:
    """Models as the engine prepared them for this machine (lingcode.engine.local.prepared)."""
    path = cache_dir() / "prepared"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path

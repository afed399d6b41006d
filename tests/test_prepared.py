"""The prepared-model cache: a second start maps what the first prepared; a damaged entry, or one another
user could have written, is prepared again."""

from __future__ import annotations

import asyncio
import logging

import pytest

from lingcode import paths
from lingcode.engine import SamplingParams
from lingcode.engine.local import engine as local_engine, prepared, weights


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A LINGCODE_HOME of its own, sharing the kernels built already (the CPU attention kernel)."""
    native = paths.native_dir()
    monkeypatch.setenv("LINGCODE_HOME", str(tmp_path))
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "native").symlink_to(native)
    return tmp_path


async def greedy(engine, text: str) -> list[int]:
    ids = engine.info.tokenizer.encode(text)
    out = []
    async for chunk in engine.generate("prepared", ids, SamplingParams(max_tokens=8, temperature=0)):
        out += chunk.token_ids
    return out


def test_a_second_start_maps_the_prepared_model(home, model_path, monkeypatch, caplog):
    first = local_engine.load_engine(model_path, device="cpu")
    (entry,) = (home / "cache" / "prepared").glob("*.pt")
    step_cost = first.step_cost
    expected = asyncio.run(greedy(first, "def fibonacci(n):"))
    del first

    def no_gguf_read(path):
        raise AssertionError("the GGUF was read again")

    monkeypatch.setattr(weights, "load_checkpoint", no_gguf_read)
    second = local_engine.load_engine(model_path, device="cpu")
    assert second.step_cost == step_cost  # measured once, kept beside the entry
    assert asyncio.run(greedy(second, "def fibonacci(n):")) == expected
    del second

    monkeypatch.undo()
    monkeypatch.setenv("LINGCODE_HOME", str(home))
    entry.chmod(0o666)  # an entry is unpickled: one that another user could have written is not
    with caplog.at_level(logging.WARNING, logger=prepared.__name__):
        local_engine.load_engine(model_path, device="cpu")
    assert "not this user's alone" in caplog.text
    assert entry.stat().st_mode & 0o077 == 0  # prepared again, private

    entry.write_bytes(b"not a prepared model")
    with caplog.at_level(logging.WARNING, logger=prepared.__name__):
        third = local_engine.load_engine(model_path, device="cpu")
    assert "could not be read" in caplog.text
    assert asyncio.run(greedy(third, "def fibonacci(n):")) == expected
    assert entry.stat().st_size > 1_000_000  # replaced by a good one

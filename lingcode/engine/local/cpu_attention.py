"""lingcode::decode_attention, the CPU's decode/verify attention over a bf16 KV cache (cpu_attention.cpp).

Built from source with the machine's C++ compiler the first time an engine asks for it (about 15 s on
2 cores; torch keeps the build under its extensions cache and reuses it while the source and flags are
the same), then registered as a torch op, so eager forwards and torch.compile'd steps both call it.
Where it cannot be built (no compiler, no ninja), `load()` says why once and returns False: the engine
then keeps its f32 cache and torch's matmuls, as before this kernel.
"""

from __future__ import annotations

import logging
import os
import platform
import sys
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("cpu_attention.cpp")
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


def _build() -> bool:
    if os.environ.get("LINGCODE_CPU_ATTENTION", "1") == "0":
        log.info("bf16 CPU attention off (LINGCODE_CPU_ATTENTION=0): f32 KV cache")
        return False
    from torch.utils import cpp_extension

    # the `ninja` the build runs comes with the ninja package, next to this interpreter
    bin_dir = os.path.dirname(sys.executable)
    if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    try:
        cpp_extension.load(name="lingcode_cpu_attention", sources=[str(SOURCE)], extra_cflags=compiler_flags(),
                           extra_ldflags=["-fopenmp"], is_python_module=False, verbose=False)
    except Exception as e:  # no compiler, no ninja, a build error: the f32 path still works
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        log.warning("bf16 CPU attention could not be built (%s); using the f32 KV cache", first_line)
        return False

    @torch.library.register_fake("lingcode::decode_attention")
    def _(q, k, v, start):
        return q.new_empty(q.shape)

    return True


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start) -> torch.Tensor:
    """q [1, H, T, D] f32 at positions start..start+T-1; k, v a layer's whole bf16 cache (KVCache)."""
    return torch.ops.lingcode.decode_attention(q, k, v, start)

"""The Triton decode step (lingcode/engine/local/triton_step.py) on the CPU, in Triton's interpreter.

The interpreter has to be switched on (TRITON_INTERPRET=1) before triton is first imported, and
must not leak into any other test (on a GPU machine, test_gpu.py runs the compiled kernels). So
the checks live in triton_interpreted.py (dense rows) and triton_blocks_interpreted.py (a GGUF's
blocks) and run here in a child pytest each with the variable set.
They take a minute or two each: the interpreter runs every program of every kernel in numpy.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")


@pytest.mark.parametrize("checks", ["triton_interpreted.py", "triton_blocks_interpreted.py"])  # dense rows; GGUF blocks
def test_triton_kernels_match_the_torch_path_in_the_interpreter(checks):
    checks = Path(__file__).with_name(checks)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(checks)],
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, f"{checks.name} failed:\n{done.stdout[-12000:]}\n{done.stderr[-4000:]}"
    assert " passed" in done.stdout and "skipped" not in done.stdout, done.stdout[-2000:]

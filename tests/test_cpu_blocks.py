"""GGUF's quantized blocks in the native CPU step (cpu_blocks.h), on random blocks of every type it
reads, with no model download: repacked, they weigh exactly what gguf's own dequantization says;
their matmuls compute those weights' products (exactly, where the activations quantize exactly);
a row's result does not depend on the rows computed with it; and every kernel path the machine can
run (AVX-512, AVX2, portable) gives the same bits."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

from lingcode.engine.local import cpu_native
from lingcode.engine.local.cpu_step import NATIVE_TYPES

TYPES = [GGMLQuantizationType[name] for name in NATIVE_TYPES.values()]
ROWS, COLS = 48, 512  # 3 groups of 16 rows; 2 K super-blocks, 16 blocks of 32


def random_blocks(kind: GGMLQuantizationType, rows: int, cols: int, seed: int) -> np.ndarray:
    """Random bytes in the type's block layout, with small positive f16 scales where the type has them
    (random bytes there could be infinities)."""
    rng = np.random.default_rng(seed)
    block, size = GGML_QUANT_SIZES[kind]
    n = rows * cols // block
    raw = rng.integers(0, 256, size=(n, size), dtype=np.uint8)

    def f16(column: int) -> None:
        raw[:, column : column + 2] = (rng.uniform(0.5, 2, n) * 1e-2).astype(np.float16).view(np.uint8).reshape(n, 2)

    if kind == GGMLQuantizationType.Q6_K:
        f16(208)  # d comes last
    else:
        f16(0)  # d
        if kind in (
            GGMLQuantizationType.Q4_1,
            GGMLQuantizationType.Q5_1,
            GGMLQuantizationType.Q4_K,
            GGMLQuantizationType.Q5_K,
        ):
            f16(2)  # m, or dmin
    return raw


@pytest.fixture(scope="module")
def lib():
    built = cpu_native.load()
    assert built is not None, "lingcode's native CPU code did not build: see the warning in the log"
    return built


def write(tmp_path: Path, *arrays: np.ndarray, head: int = 96) -> tuple[Path, list[int]]:
    """The arrays in one file after `head` bytes (a tensor's data does not start a GGUF); their offsets."""
    path, offsets, at = tmp_path / "blocks.bin", [], head
    with open(path, "wb") as f:
        f.write(b"\0" * head)
        for a in arrays:
            offsets.append(at)
            f.write(a.tobytes())
            at += a.nbytes
    return path, offsets


def weights(raw: np.ndarray, kind, rows: int, cols: int) -> np.ndarray:
    return dequantize(raw.reshape(-1), kind).reshape(rows, cols).astype(np.float32)


@pytest.mark.parametrize("kind", TYPES, ids=lambda k: k.name)
def test_a_repacked_matrix_weighs_what_gguf_dequantizes(lib, tmp_path, kind):
    raw = random_blocks(kind, ROWS, COLS, seed=int(kind))
    path, (offset,) = write(tmp_path, raw)
    matrix = lib.repack(str(path), COLS, [(int(kind), offset, ROWS, None)])
    assert (matrix.rows, matrix.cols, matrix.types()) == (ROWS, COLS, [int(kind)])
    np.testing.assert_array_equal(matrix.dequantize().numpy(), weights(raw, kind, ROWS, COLS))


@pytest.mark.parametrize("kind", TYPES, ids=lambda k: k.name)
def test_its_matmuls_compute_those_weights_products(lib, tmp_path, kind):
    raw = random_blocks(kind, ROWS, COLS, seed=100 + int(kind))
    path, (offset,) = write(tmp_path, raw)
    matrix = lib.repack(str(path), COLS, [(int(kind), offset, ROWS, None)])
    w = weights(raw, kind, ROWS, COLS).astype(np.float64)
    rng = np.random.default_rng(int(kind))
    # Integers of at most 127 with 127 in every block of 32: quantized to 8 bits with a scale of
    # exactly 1, so only the f32 sums round; a wrong code, scale, min or order is off by far more.
    exact = rng.integers(-127, 128, size=(3, COLS)).astype(np.float32)
    exact[:, ::32] = 127
    y = matrix.matmul(torch.from_numpy(exact)).numpy()
    np.testing.assert_allclose(y, exact @ w.T, rtol=0, atol=2e-6 * np.abs(exact @ w.T).max())
    # Any activations: within what rounding them to 8 bits costs (about 1 % of the largest output)
    x = rng.standard_normal((9, COLS)).astype(np.float32)
    y = matrix.matmul(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(y, x @ w.T, rtol=0, atol=0.02 * np.abs(x @ w.T).max())
    # and a row's numbers do not depend on the rows computed with it (lossless drafts)
    alone = np.concatenate([matrix.matmul(torch.from_numpy(x[i : i + 1])).numpy() for i in range(9)])
    np.testing.assert_array_equal(alone, y)


def test_a_fused_matrix_keeps_each_parts_type_and_row_order(lib, tmp_path):
    """QKV and gate/up are one matrix of parts; Q4_K_M files mix types in them (Q4_K Q/K, Q6_K V)."""
    kinds = [GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q6_K]
    rows = [64, 32, 32]
    raws = [random_blocks(k, r, COLS, seed=7 + i) for i, (k, r) in enumerate(zip(kinds, rows))]
    path, offsets = write(tmp_path, *raws)
    order = torch.randperm(64, generator=torch.Generator().manual_seed(0))
    parts = [(int(kinds[0]), offsets[0], 64, order)] + [
        (int(k), o, r, None) for k, o, r in zip(kinds[1:], offsets[1:], rows[1:])
    ]
    matrix = lib.repack(str(path), COLS, parts)
    expected = np.concatenate(
        [weights(raws[0], kinds[0], 64, COLS)[order.numpy()]]
        + [weights(a, k, r, COLS) for a, k, r in zip(raws[1:], kinds[1:], rows[1:])]
    )
    assert matrix.types() == [int(k) for k in kinds]
    np.testing.assert_array_equal(matrix.dequantize().numpy(), expected)
    x = np.random.default_rng(0).standard_normal((4, COLS)).astype(np.float32)
    np.testing.assert_allclose(
        matrix.matmul(torch.from_numpy(x)).numpy(),
        x @ expected.T.astype(np.float64),
        rtol=0,
        atol=0.02 * np.abs(x @ expected.T).max(),
    )


def test_bad_tensors_are_refused_with_a_reason(lib, tmp_path):
    raw = random_blocks(GGMLQuantizationType.Q4_K, 16, 256, seed=1)
    path, (offset,) = write(tmp_path, raw)
    with pytest.raises(RuntimeError, match="not whole blocks of 256"):
        lib.repack(str(path), 128, [(12, offset, 16, None)])
    with pytest.raises(RuntimeError, match="past the file's end"):
        lib.repack(str(path), 256, [(12, offset, 32, None)])
    with pytest.raises(RuntimeError, match="unsupported GGUF type"):
        lib.repack(str(path), 256, [(1, offset, 16, None)])  # F16


VARIANT_SCRIPT = """
import sys, numpy as np, torch
from lingcode.engine.local import cpu_native
lib = cpu_native.load()
assert lib is not None, "no build"
out = {"isa": lib.isa()}
x = torch.from_numpy(np.random.default_rng(0).standard_normal((5, int(sys.argv[2]))).astype(np.float32))
for spec in sys.argv[3:-1]:
    kind, offset, rows = map(int, spec.split(":"))
    out[kind] = lib.repack(sys.argv[1], int(sys.argv[2]), [(kind, offset, rows, None)]).matmul(x)
torch.save(out, sys.argv[-1] + ".pt")
"""

# -march targets for the other kernel paths: the CPU flag each needs to run here, and the path it builds
VARIANTS = {
    "skylake-avx512": ("avx512bw", "avx512bw"),
    "haswell": ("avx2", "avx2"),
    "x86-64-v2": ("sse4_2", "portable"),
}


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the kernel variants are x86's")
def test_every_kernel_path_this_cpu_can_run_computes_the_same_bits(lib, tmp_path):
    """The AVX-512 (BW), AVX2 and portable builds (-march=...) that this CPU can run give the same
    matmul outputs as this machine's build, for every block type, bit for bit: their integer dot
    products are exact and their float chains the same. (Each build takes a minute of CPU the first
    time; they are kept in lingcode's cache, each under its own name, like the host's build.)"""
    raws = [random_blocks(k, ROWS, COLS, seed=50 + int(k)) for k in TYPES]
    path, offsets = write(tmp_path, *raws)
    specs = [f"{int(k)}:{o}:{ROWS}" for k, o in zip(TYPES, offsets)]
    flags = cpu_native._cpu_flags().split()

    def run(march: str | None) -> dict:
        env = {**os.environ, **({"LINGCODE_CPU_MARCH": march} if march else {})}
        out = tmp_path / f"{march}"
        subprocess.run(
            [sys.executable, "-c", VARIANT_SCRIPT, str(path), str(COLS), *specs, str(out)], env=env, check=True
        )
        return torch.load(f"{out}.pt")

    host = run(None)
    runnable = {march: isa for march, (flag, isa) in VARIANTS.items() if flag in flags}
    assert runnable, f"no kernel variant runs on this CPU ({flags[:8]}...)"
    for march, isa in runnable.items():
        variant = run(march)
        assert variant["isa"] == isa, (march, variant["isa"])  # the build took the path asked for
        for kind in TYPES:
            assert torch.equal(variant[int(kind)], host[int(kind)]), (march, isa, kind.name)

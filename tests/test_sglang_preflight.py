"""Preflight and doctor: the checks on what `nvidia-smi` reports, and on this machine (no GPU)."""

from __future__ import annotations

import io
import sys

import pytest
from rich.console import Console

from lingcode.engine.sglang import doctor, preflight
from lingcode.engine.sglang.engine import open_engine
from lingcode.engine.sglang.preflight import PreflightError, gpu_problems, parse_nvidia_smi, visible
from lingcode.engine.sglang.profiles import resolve

# `nvidia-smi --query-gpu=index,uuid,name,compute_cap,memory.total,memory.free,driver_version
# --format=csv,noheader,nounits` on a 4x B200 workstation (one GPU partly taken) and on an H100 box.
B200 = """0, GPU-1f2e3d4c-0000-0000-0000-000000000000, NVIDIA B200, 10.0, 183359, 182893, 580.82.07
1, GPU-1f2e3d4c-0000-0000-0000-000000000001, NVIDIA B200, 10.0, 183359, 182893, 580.82.07
2, GPU-1f2e3d4c-0000-0000-0000-000000000002, NVIDIA B200, 10.0, 183359, 40210, 580.82.07
3, GPU-1f2e3d4c-0000-0000-0000-000000000003, NVIDIA B200, 10.0, 183359, 182893, 580.82.07
"""
H100 = "\n".join(f"{i}, GPU-aa{i}, NVIDIA H100 80GB HBM3, 9.0, 81559, 80995, 575.57.08" for i in range(4))


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("LINGCODE_HOME", str(tmp_path))
    return tmp_path


def test_parse_nvidia_smi_and_cuda_visible_devices():
    gpus = parse_nvidia_smi(B200)
    assert [g.index for g in gpus] == [0, 1, 2, 3] and gpus[0].compute_capability == (10, 0)
    assert gpus[0].arch == "blackwell" and gpus[2].memory_free_mib == 40210 and gpus[0].driver == "580.82.07"
    assert [g.index for g in visible(gpus, "3,1")] == [3, 1]
    assert [g.index for g in visible(gpus, "GPU-1f2e3d4c-0000-0000-0000-000000000002")] == [2]
    assert visible(gpus, "") == [] and [g.index for g in visible(gpus, "0,7,1")] == [0]  # CUDA stops at a bad entry


def test_gpu_problems_each_one_line_with_the_fix(home):
    dspark, hopper = resolve("ling-3.0-flash-dspark"), resolve("ling-3.0-flash-dspark-hopper")
    b200, h100 = parse_nvidia_smi(B200), parse_nvidia_smi(H100)
    assert gpu_problems(dspark, visible(b200, "0,1,3"), None) == [
        "3 GPU(s) visible, profile ling-3.0-flash-dspark needs 4 (tp-size 4); free or expose more GPUs (CUDA_VISIBLE_DEVICES)"
    ]
    (memory,) = gpu_problems(dspark, b200, None)
    assert memory.startswith("GPU 2 (NVIDIA B200) has 39 GiB free (140 GiB held by other processes")
    problems = gpu_problems(dspark, h100, None)
    assert "driver 575.57.08 is too old" in problems[0] and "driver 580 or newer" in problems[0]
    assert (
        "profile ling-3.0-flash-dspark is for Blackwell (trtllm_mla): use --profile ling-3.0-flash-dspark-hopper"
        in problems[1]
    )
    assert gpu_problems(hopper, h100, None) == [problems[0]]  # the Hopper profile fits, but the driver is too old
    (none,) = gpu_problems(dspark, [], "nvidia-smi is not on PATH")
    assert none.startswith("no NVIDIA GPU found (nvidia-smi is not on PATH)") and "--engine local" in none
    assert all("\n" not in p for p in problems + [none, memory])


def test_this_machine_fails_preflight_at_once_with_one_line(home):
    """No GPU here: open_engine stops before launching anything."""
    lines = []
    with pytest.raises(PreflightError) as failure:
        open_engine(say=lines.append)
    assert "no NVIDIA GPU found" in str(failure.value) and "\n" not in str(failure.value)
    assert lines == [] and not (home / "state" / "sglang.log").exists()


def test_interpreter_and_model_problems(home, tmp_path):
    profile = resolve(config={"python": str(tmp_path / "no-such-python")})
    found = preflight.inspect(profile)
    assert any("cannot ask the SGLang interpreter" in p and "[sglang] python" in p for p in found.problems)
    assert any(
        p.startswith("model inclusionAI/Ling-3.0-flash is not a local directory (download: huggingface-cli download")
        for p in found.problems
    )
    model = tmp_path / "Ling-3.0-flash"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "tokenizer.json").write_text("{}")
    ok = resolve(overrides={"model-path": str(model)}, config={"python": sys.executable})
    # this interpreter has sglang (the contract test's install), but no GPU
    problems = preflight.inspect(ok).problems
    assert not any(p.startswith(("cannot ask the SGLang interpreter", "sglang is not installed")) for p in problems)
    assert preflight.model_problems(ok) == [preflight.model_problems(ok)[0]]  # only the draft is missing
    assert "draft model inclusionAI/Ling-3.0-flash-dspark" in preflight.model_problems(ok)[0]


def test_attaching_needs_a_key_off_this_machine(home, tmp_path):
    with pytest.raises(PreflightError, match="must run with --api-key.*LINGCODE_SGLANG_API_KEY"):
        preflight.check_attach("http://10.0.0.5:30000", None, tmp_path)
    with pytest.raises(PreflightError, match="not an http"):
        preflight.check_attach("10.0.0.5:30000", "k", tmp_path)
    with pytest.raises(PreflightError, match="has no config.json, tokenizer.json"):
        preflight.check_attach("http://127.0.0.1:30000", None, tmp_path)
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(PreflightError, match="SGLang at http://127.0.0.1:9 does not answer"):
        open_engine(tmp_path, engine_url="http://127.0.0.1:9", say=lambda line: None)


def test_doctor_explains_each_switch_and_what_is_missing(home):
    out = io.StringIO()
    ok = doctor.print_report(Console(file=out, width=250), "ling-3.0-flash-dspark")
    text = out.getvalue()
    assert ok is False  # no GPU here
    assert "fused KDA verify kernel" in text and "SGLANG_OPT_FUSED_KDA_VERIFY=1" in text
    assert "warning: prefix (radix) cache is off: every agent turn re-prefills its whole context" in text
    assert "missing: no NVIDIA GPU found" in text and "GPUs" in text and "sglang" in text
    rows = {r.name: r for r in doctor.switch_rows(resolve("ling-3.0-flash-dspark-agent"))}
    assert rows["prefix (radix) cache"].on and rows["hybrid radix cache keeps overlap (extra_buffer)"].on
    assert rows["overlap scheduling with speculation"].where == "SGLang default"
    hopper = {r.name: r for r in doctor.switch_rows(resolve("ling-3.0-flash-dspark-hopper"))}
    assert "MLA attention on trtllm_mla" not in hopper and hopper["MLA attention left to SGLang (fa3)"].on
    nextn = {r.name: r for r in doctor.switch_rows(resolve("ling-3.0-flash-nextn"))}
    assert nextn["DSpark speculative decoding"].warning.startswith(
        "DSpark speculative decoding is off: NEXTN tuned: 606 tok/s"
    )

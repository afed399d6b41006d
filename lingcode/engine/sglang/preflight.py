"""What must hold before lingcode launches SGLang (or attaches to one), checked in seconds.

SGLang itself would find most of these problems too, but only after minutes of loading and with
a traceback. Here each is one line that says what to do, and `lingcode serve --engine sglang`
exits non-zero on the first. `lingcode doctor` shows all of them at once.

GPUs are listed with `nvidia-smi` (it needs no torch and sees what the driver sees); SGLang's
interpreter is asked about its packages by lingcode.engine.sglang.probe.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from lingcode.engine import EngineStartError
from lingcode.engine.sglang import probe
from lingcode.engine.sglang.model_dir import missing_files
from lingcode.engine.sglang.profiles import SGLANG_VERSION, Profile, config_file

# SGLang 0.5.23 runs on CUDA 13 (torch 2.14.1, flashinfer cu13), which needs an R580+ driver.
MIN_DRIVER = 580
_QUERY = "index,uuid,name,compute_cap,memory.total,memory.free,driver_version"
API_KEY_ENV = "LINGCODE_SGLANG_API_KEY"


class PreflightError(EngineStartError):
    """One line: what is wrong and what to do about it."""


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str
    compute_capability: tuple[int, int]
    memory_total_mib: int
    memory_free_mib: int
    driver: str

    @property
    def arch(self) -> str:
        major = self.compute_capability[0]
        return "blackwell" if major >= 10 else "hopper" if major == 9 else "older"

    @property
    def cc(self) -> str:
        return "{}.{}".format(*self.compute_capability)


def parse_nvidia_smi(text: str) -> list[Gpu]:
    """`nvidia-smi --query-gpu=<_QUERY> --format=csv,noheader,nounits` output -> Gpus."""
    gpus = []
    for line in text.strip().splitlines():
        index, uuid, name, cc, total, free, driver = (f.strip() for f in line.split(","))
        major, _, minor = cc.partition(".")
        cc = (int(major), int(minor or 0))
        gpus.append(Gpu(int(index), uuid, name, cc, int(float(total)), int(float(free)), driver))
    return gpus


def visible(gpus: list[Gpu], cuda_visible_devices: str | None) -> list[Gpu]:
    """The GPUs CUDA_VISIBLE_DEVICES leaves to SGLang (indices or UUIDs), in its order."""
    if cuda_visible_devices is None:
        return gpus
    chosen = []
    for item in filter(None, (s.strip() for s in cuda_visible_devices.split(","))):
        match = [g for g in gpus if str(g.index) == item or g.uuid.startswith(item)]
        if not match:
            break  # CUDA stops at the first invalid entry
        chosen += match
    return chosen


def gpu_inventory() -> tuple[list[Gpu], str | None]:
    """(the GPUs SGLang would see, why none could be listed)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return [], "nvidia-smi is not on PATH"
    try:
        done = subprocess.run(
            [smi, f"--query-gpu={_QUERY}", "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [], f"nvidia-smi failed: {exc}"
    if done.returncode != 0:
        return [], f"nvidia-smi failed: {(done.stdout + done.stderr).strip().splitlines()[-1:] or done.returncode}"
    try:
        gpus = parse_nvidia_smi(done.stdout)
    except ValueError:
        return [], f"cannot read nvidia-smi's answer: {done.stdout.strip()[:200]}"
    return visible(gpus, os.environ.get("CUDA_VISIBLE_DEVICES")), None if gpus else "nvidia-smi lists no GPU"


# --- the checks: each returns problems, one line each, worst first ----------------------------


def gpu_problems(profile: Profile, gpus: list[Gpu], why: str | None) -> list[str]:
    tp = profile.tp_size
    if not gpus:
        return [
            f"no NVIDIA GPU found ({why or 'CUDA_VISIBLE_DEVICES hides them all'}); profile {profile.name} "
            f"needs {tp}. Use --engine local here, or --engine-url to attach to an SGLang server elsewhere"
        ]
    problems = []
    if len(gpus) < tp:
        problems.append(
            f"{len(gpus)} GPU(s) visible, profile {profile.name} needs {tp} (tp-size {tp}); "
            "free or expose more GPUs (CUDA_VISIBLE_DEVICES)"
        )
    driver = gpus[0].driver
    if int(driver.split(".")[0]) < MIN_DRIVER:
        problems.append(
            f"NVIDIA driver {driver} is too old for SGLang {SGLANG_VERSION} (CUDA 13): "
            f"install driver {MIN_DRIVER} or newer"
        )
    used = gpus[:tp]
    if profile.arch == "blackwell" and (g := next((g for g in used if g.arch != "blackwell"), None)):
        fix = "use --profile ling-3.0-flash-dspark-hopper" if g.arch == "hopper" else "use Blackwell or Hopper GPUs"
        problems.append(
            f"GPU {g.index} is {g.name} (compute capability {g.cc}); profile {profile.name} "
            f"is for Blackwell (trtllm_mla): {fix}"
        )
    if profile.arch == "hopper" and (g := next((g for g in used if g.compute_capability[0] < 9), None)):
        problems.append(
            f"GPU {g.index} is {g.name}: profile {profile.name} needs Hopper (compute capability 9.0) or newer"
        )
    need = profile.min_gpu_memory_gib
    if g := next((g for g in used if g.memory_free_mib / 1024 < need), None):
        free, held = g.memory_free_mib / 1024, (g.memory_total_mib - g.memory_free_mib) / 1024
        problems.append(
            f"GPU {g.index} ({g.name}) has {free:.0f} GiB free ({held:.0f} GiB held by other processes: "
            f"see nvidia-smi); profile {profile.name} needs {need:.0f} GiB per GPU"
        )
    return problems


def interpreter_problems(profile: Profile, versions: dict | None, error: str | None) -> list[str]:
    where = f"set [sglang] python in {config_file()} to the python of your SGLang environment"
    if versions is None:
        return [f"cannot ask the SGLang interpreter: {error}; {where}"]
    if not versions.get("sglang") or not versions.get("launch_server"):
        return [
            f"sglang is not installed for {profile.python}: pip install 'sglang=={SGLANG_VERSION}' there, or {where}"
        ]
    return []


def version_warnings(versions: dict | None) -> list[str]:
    if versions and versions.get("sglang") and versions["sglang"] != SGLANG_VERSION:
        return [
            f"SGLang {versions['sglang']} is installed; lingcode's profiles are written for {SGLANG_VERSION} "
            "(flags move between releases: `lingcode doctor` checks them)"
        ]
    return []


def _local_dir_problem(path: str, what: str, where: str, required: tuple[str, ...] = ()) -> str | None:
    directory = Path(path).expanduser()
    if not directory.is_dir():
        hub_id = not directory.is_absolute() and path.count("/") == 1
        hint = f" (download: huggingface-cli download {path} --local-dir DIR)" if hub_id else ""
        return f"{what} {path} is not a local directory{hint}; {where}"
    missing = [name for name in required if not (directory / name).is_file()]
    if missing:
        return f"{what} {directory} has no {', '.join(missing)}: lingcode reads the tokenizer and chat template from it"
    return None


def model_problems(profile: Profile) -> list[str]:
    problems = [
        _local_dir_problem(
            profile.model_path, "model", "pass --model DIR (the model directory)", ("config.json", "tokenizer.json")
        )
    ]
    draft = profile.args.get("speculative-draft-model-path")
    if draft and draft != profile.model_path:
        where = f"set args.speculative-draft-model-path in [sglang] of {config_file()}"
        problems.append(_local_dir_problem(str(draft), "draft model", where, ("config.json",)))
    return [p for p in problems if p]


@dataclass(frozen=True)
class Findings:
    problems: list[str]  # each would stop the launch
    warnings: list[str]
    versions: dict | None  # the SGLang interpreter's packages (None: it could not be asked)
    gpus: list[Gpu]
    no_gpu_reason: str | None


def inspect(profile: Profile) -> Findings:
    """Everything that decides whether `profile` can launch on this machine."""
    gpus, why = gpu_inventory()
    try:
        versions, error = probe.versions(profile.python), None
    except probe.ProbeError as exc:
        versions, error = None, str(exc)
    problems = (
        gpu_problems(profile, gpus, why) + interpreter_problems(profile, versions, error) + model_problems(profile)
    )
    return Findings(problems, version_warnings(versions), versions, gpus, why)


def check_launch(profile: Profile) -> list[str]:
    """Raise PreflightError with the first problem; return the warnings."""
    findings = inspect(profile)
    if findings.problems:
        raise PreflightError(findings.problems[0])
    return findings.warnings


def is_loopback_url(url: str) -> bool:
    host = urlparse(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_attach(url: str, api_key: str | None, model_dir: Path | None) -> None:
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise PreflightError(f"--engine-url {url!r} is not an http(s) URL (e.g. http://127.0.0.1:30000)")
    if not is_loopback_url(url) and not api_key:
        raise PreflightError(
            f"SGLang at {url} is not on this machine, so it must run with --api-key and lingcode "
            f"needs that key: set {API_KEY_ENV} or [sglang] api_key in {config_file()}"
        )
    if model_dir is None:
        raise PreflightError(
            "attaching needs the model directory for its tokenizer and chat template: pass --model DIR"
        )
    if missing := missing_files(model_dir):
        raise PreflightError(
            f"model directory {model_dir} has no {', '.join(missing)}: lingcode reads the tokenizer "
            "and chat template from it (a copy of the served model's directory will do)"
        )

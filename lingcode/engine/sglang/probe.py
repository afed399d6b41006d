"""Ask the interpreter that has SGLang about itself, in a child process.

SGLang usually lives in its own environment (its own torch and CUDA pins), so lingcode never
imports it: it runs the configured interpreter with a short script and reads JSON back. Two
questions: which versions are installed (fast: package metadata only, no torch import), and
what SGLang's own parser makes of a launch argv (`prepare_server_args`, no GPU needed).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

MARK = "LINGCODE-PROBE "

# Versions from package metadata: importing sglang would import torch (seconds, and CUDA).
_VERSIONS = r"""
import importlib.metadata as md, importlib.util, json, os, sys
def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None
spec = importlib.util.find_spec("sglang")
launcher = bool(spec and spec.origin and os.path.exists(os.path.join(os.path.dirname(spec.origin), "launch_server.py")))
print("LINGCODE-PROBE " + json.dumps({
    "python": sys.version.split()[0], "executable": sys.executable, "launch_server": launcher,
    "sglang": version("sglang"), "torch": version("torch"), "flashinfer": version("flashinfer-python"),
    "sglang_kernel": version("sglang-kernel"), "transformers": version("transformers"),
}))
"""

# Each argv through SGLang's own parser; the raw (unresolved) fields come back. Resolution is
# not run: it loads the model's config and needs the GPUs. argparse accepts any unambiguous
# prefix of a flag, so flags that are not spelled out in full are reported too.
_PARSE = r"""
import argparse, contextlib, io, json, os, sys
import msgspec
from sglang.srt.server_args import ServerArgs, prepare_server_args
from sglang.srt.environ import envs
parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
flags = set(parser._option_string_actions)
results = []
for item in json.load(sys.stdin):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = prepare_server_args(item["argv"])
    except SystemExit:
        results.append({"error": err.getvalue().strip().splitlines()[-1:] or ["argparse error"]})
        continue
    env = {}
    for key, value in item.get("env", {}).items():
        known = hasattr(envs, key)
        parsed = None
        if known:
            os.environ[key] = value
            parsed = getattr(envs, key).get()
            del os.environ[key]
        env[key] = {"known": known, "value": parsed}
    inexact = [a.split("=")[0] for a in item["argv"] if a.startswith("--") and a.split("=")[0] not in flags]
    results.append({"args": msgspec.structs.asdict(args), "env": env, "launch_command": args.launch_command,
                    "inexact_flags": inexact})
print("LINGCODE-PROBE " + json.dumps(results, default=repr))
"""


class ProbeError(RuntimeError):
    """The interpreter could not answer; the message is one line."""


def _run(python: str, script: str, stdin: str = "", timeout: float = 60.0, env: dict | None = None) -> object:
    if not (Path(python).exists() or "/" not in python):
        raise ProbeError(f"the SGLang interpreter {python} does not exist")
    try:
        done = subprocess.run(
            [python, "-c", script],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **(env or {})},
        )
    except FileNotFoundError:
        raise ProbeError(f"the SGLang interpreter {python} cannot be run") from None
    except subprocess.TimeoutExpired:
        raise ProbeError(f"{python} did not answer within {timeout:.0f} s") from None
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(MARK):
            return json.loads(line[len(MARK) :])
    tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
    raise ProbeError(f"{python} failed (exit {done.returncode}): {tail}")


def versions(python: str) -> dict:
    """{"sglang": "0.5.23" | None, "torch": ..., "flashinfer": ..., "launch_server": bool, ...}."""
    return _run(python, _VERSIONS, timeout=30.0)


def parse_launch_args(python: str, launches: list[dict], *, prelude: str = "", timeout: float = 300.0) -> list[dict]:
    """SGLang's parse of each {"argv": [...], "env": {...}}: {"args": {field: value}, "env": {...},
    "inexact_flags": [flags that are only prefixes of SGLang's]}, or {"error": [argparse's message]}.
    `prelude` runs first (tests use it to fence off GPU and network)."""
    return _run(python, prelude + _PARSE, json.dumps(launches), timeout=timeout)

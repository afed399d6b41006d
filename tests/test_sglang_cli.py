"""`lingcode serve --engine sglang`, `lingcode sglang-args` and `lingcode doctor`, run as a person runs them.

This machine has no GPU: serving through SGLang must stop at once with one line, and doctor must
say what is missing. (Launching real SGLang needs 4 GPUs and the model: not testable here.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from lingcode.engine.sglang import probe


def lingcode(*args: str, home, env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "LINGCODE_HOME": str(home), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "lingcode", *args], env=env, capture_output=True, text=True, timeout=120
    )


def one_line_failure(result: subprocess.CompletedProcess, code: int = 2) -> str:
    assert result.returncode == code, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout
    (line,) = result.stderr.strip().splitlines()
    return line


def test_serve_sglang_without_gpus_exits_at_once_with_one_line(tmp_path):
    started = time.monotonic()
    result = lingcode("serve", "--engine", "sglang", "--port", "0", home=tmp_path)
    line = one_line_failure(result)
    assert time.monotonic() - started < 30
    assert line.startswith("lingcode serve: no NVIDIA GPU found") and "--engine local" in line
    assert result.stdout == ""  # nothing was started
    assert not (tmp_path / "state" / "daemon.json").exists() and not (tmp_path / "state" / "sglang.log").exists()


def test_serve_sglang_one_line_errors(tmp_path):
    line = one_line_failure(lingcode("serve", "--engine", "sglang", "--profile", "nope", "--port", "0", home=tmp_path))
    assert "unknown SGLang profile 'nope'" in line
    off_machine = lingcode(
        "serve",
        "--engine",
        "sglang",
        "--engine-url",
        "http://10.9.8.7:30000",
        "--port",
        "0",
        home=tmp_path,
        env={"LINGCODE_SGLANG_API_KEY": ""},
    )
    assert "must run with --api-key" in one_line_failure(off_machine)
    local_only = lingcode("serve", "--profile", "ling-3.0-flash-dspark", home=tmp_path)
    assert "go with --engine sglang" in one_line_failure(local_only)


def test_sglang_args_prints_what_sglangs_parser_accepts(tmp_path):
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.toml").write_text('[sglang]\nargs = { model-path = "/models/Ling-3.0-flash" }\n')
    result = lingcode("sglang-args", "--json", home=tmp_path)
    assert result.returncode == 0, result.stderr
    launch = json.loads(result.stdout)
    assert set(launch) == {"argv", "env"} and launch["argv"][:2] == ["--model-path", "/models/Ling-3.0-flash"]
    assert launch["env"]["SGLANG_OPT_FUSED_KDA_VERIFY"] == "1"
    (parsed,) = probe.parse_launch_args(sys.executable, [launch])
    assert "error" not in parsed and parsed["inexact_flags"] == []
    assert (
        parsed["args"]["speculative_algorithm"] == "DSPARK" and parsed["args"]["model_path"] == "/models/Ling-3.0-flash"
    )
    text = lingcode("sglang-args", "--profile", "ling-3.0-flash-dspark-hopper", home=tmp_path).stdout
    assert "-m sglang.launch_server" in text and "SGLANG_RAGGED_VERIFY_MODE=static" in text and "trtllm_mla" not in text


def test_doctor_says_what_is_missing_for_sglang(tmp_path):
    result = lingcode("doctor", home=tmp_path)
    assert "Traceback" not in result.stderr
    out = result.stdout
    assert "SGLang engine: profile ling-3.0-flash-dspark" in out
    assert "DSpark speculative decoding" in out and "one request at a time" in out
    assert "warning: prefix (radix) cache is off" in out
    assert (
        "missing: no NVIDIA GPU found" in out
        and "missing: model inclusionAI/Ling-3.0-flash is not a local directory" in out
    )

"""The `lingcode` command, run the way a person runs it: `python -m lingcode ...` in a subprocess."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import types

import pytest

from lingcode import cli, models

SERVE_OPTIONS = (
    "--engine",
    "--model",
    "--host",
    "--port",
    "--device",
    "--max-queue",
    "--log-level",
    "--max-sessions",
    "--session-memory",
)


def lingcode(*args: str, home=None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if home is not None:
        env["LINGCODE_HOME"] = str(home)
    return subprocess.run(
        [sys.executable, "-m", "lingcode", *args], env=env, capture_output=True, text=True, timeout=120
    )


def test_models_json_in_an_empty_home(tmp_path):
    result = lingcode("models", "--json", home=tmp_path)
    assert result.returncode == 0, result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert list(rows) == list(models.catalog())
    assert not any(row["pulled"] for row in rows.values())
    assert [name for name, row in rows.items() if row["default"]] == [models.DEFAULT_MODEL]
    assert rows[models.DEFAULT_MODEL]["path"] == str(
        tmp_path / "cache" / "models" / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
    )
    assert rows["qwen2.5-coder-0.5b-instruct"]["use"] == "coding on slow machines"


def test_models_json_sees_the_pulled_model(model_path):
    result = lingcode("models", "--json")
    assert result.returncode == 0, result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert rows["smollm2-135m-instruct"]["pulled"] is True
    assert rows["smollm2-135m-instruct"]["path"] == str(model_path)


def test_models_table(tmp_path):
    result = lingcode("models", home=tmp_path)
    assert result.returncode == 0, result.stderr
    header, *lines = result.stdout.splitlines()
    assert header.split() == ["name", "default", "pulled", "size", "context", "use", "path"]
    rows = {line.split()[0]: line.split() for line in lines}
    assert rows[models.DEFAULT_MODEL][1:6] == ["yes", "no", "1.12", "GB", "32768"]
    assert rows["smollm2-135m-instruct"][1:5] == ["no", "98.4", "MB", "8192"]
    assert "coding on slow machines" in result.stdout.split("qwen2.5-coder-0.5b-instruct", 1)[1]


def test_serve_help_documents_every_option():
    result = lingcode("serve", "--help")
    assert result.returncode == 0, result.stderr
    for option in SERVE_OPTIONS:
        assert option in result.stdout
    assert "8377" in result.stdout and "127.0.0.1" in result.stdout
    (subcommands,) = [a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    for action in subcommands.choices["serve"]._actions:
        assert action.help, f"{action.option_strings} has no help"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["serve", "--model", "/no/such/model.gguf"], "no such file"),
        (["serve", "--model", "no-such-model"], "unknown model 'no-such-model'"),
        (["serve", "--model", "pyproject.toml"], "not a GGUF file"),
        (["pull", "no-such-model"], "unknown model 'no-such-model'"),
    ],
)
def test_errors_are_one_line_and_exit_2(tmp_path, args, message):
    result = lingcode(*args, home=tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("lingcode: ") and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_serve_hands_the_resolved_model_to_the_daemon(model_path, monkeypatch):
    """cli only resolves the model; lingcode.server.daemon.serve does the serving."""
    calls = []
    daemon = types.ModuleType("lingcode.server.daemon")
    daemon.serve = lambda **kwargs: calls.append(kwargs) or 0
    monkeypatch.setitem(sys.modules, "lingcode.server.daemon", daemon)

    assert cli.main(["serve", "--model", "smollm2", "--port", "0", "--max-queue", "4"]) == 0
    assert calls == [
        {
            "engine": "local",
            "model_path": model_path,
            "model_name": "smollm2-135m-instruct",
            "host": "127.0.0.1",
            "port": 0,
            "device": "auto",
            "max_queue": 4,
            "log_level": "info",
            "session_idle_s": 1800.0,
            "max_sessions": 64,
            "session_memory_mb": 64,
            "keep_alive_s": 10.0,
            "allow_remote": False,
            "allowed_hosts": (),
            "allowed_origins": (),
            "unix_socket": None,
            "log_format": "json",
            "kernels": "auto",
            "compile": False,
            "speculation": "ngram",
        }
    ]


def test_bad_port_is_a_usage_error():
    result = lingcode("serve", "--port", "70000")
    assert result.returncode == 2
    assert "0-65535" in result.stderr


def test_doctor_in_an_empty_home(tmp_path):
    result = lingcode("doctor", home=tmp_path)
    assert result.returncode == 1  # the default model is not pulled there
    assert "NOT PULLED" in result.stdout
    assert str(tmp_path / "config") in result.stdout
    assert "not running" in result.stdout


def test_doctor_reports_a_stale_daemon_file(tmp_path):
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "daemon.json").write_text(json.dumps({"url": "http://127.0.0.1:9", "pid": 1}))
    result = lingcode("doctor", home=tmp_path)
    assert "does not answer" in result.stdout


def test_doctor_fits_100_columns(tmp_path):
    result = lingcode("doctor", home=tmp_path)
    assert "SGLang engine" in result.stdout and "kernels dir" in result.stdout
    wide = [line for line in result.stdout.splitlines() if len(line) > 100]
    assert not wide, wide


@pytest.mark.parametrize(
    "args", [["--help"], ["models"], ["sglang-args"], ["lsp", "--help"], ["pull", "smollm2"], ["bench", "--help"]]
)
def test_commands_that_run_no_model_import_no_torch(model_path, args):
    """What makes them print at once (`lingcode bench startup` times it): torch alone takes seconds."""
    script = (
        "import sys\nfrom lingcode import cli\ntry:\n    cli.main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('torch', 'numpy', 'fastapi', 'textual', 'pygls', 'jinja2') if m in sys.modules),"
        " file=sys.stderr)"
    )
    result = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=120)
    assert result.stdout, result.stderr
    assert result.stderr.strip().splitlines()[-1] == "[]", result.stderr


def test_env_points_clients_at_the_running_daemon(daemon):
    """`eval "$(lingcode env)"` and an OpenAI-style client finds the daemon: no port or token path typed."""
    check = (
        "import os, httpx; print(httpx.get(os.environ['OPENAI_BASE_URL'] + '/models', "
        "headers={'Authorization': 'Bearer ' + os.environ['OPENAI_API_KEY']}).status_code)"
    )
    script = f'eval "$({sys.executable} -m lingcode env)" && test "$LINGCODE_URL" = {daemon.url} && {sys.executable} -c "{check}"'
    result = subprocess.run(
        ["bash", "-c", script],
        env={**os.environ, "LINGCODE_HOME": str(daemon.home)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.stdout.strip() == "200", result.stderr
    assert daemon.token not in lingcode("env", home=daemon.home).stdout  # read from its file by the shell


def test_env_without_a_daemon_says_so(tmp_path):
    result = lingcode("env", home=tmp_path)
    assert result.returncode == 1 and "no daemon is running" in result.stderr and not result.stdout

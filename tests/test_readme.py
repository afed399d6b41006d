"""The README's first requests, run exactly as written (the shell block and the Python block of
"Talking to the daemon"), against a real daemon on the default model (Qwen2.5-Coder-1.5B).

They send no temperature and no max_tokens: the model family's defaults must make it answer right,
and stop, on its own.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

README = (Path(__file__).parents[1] / "README.md").read_text()
SECTION = README[README.index("## Talking to the daemon") : README.index("### Routes")]


def block(language: str, containing: str) -> str:
    blocks = re.findall(rf"```{language}\n(.*?)```", SECTION, flags=re.S)
    return next(b for b in blocks if containing in b)


@pytest.fixture(scope="module")
def env(default_daemon) -> dict:
    """The environment a user has in their shell: the venv's commands, the daemon's home."""
    bin_dir = str(Path(sys.executable).parent)
    return {
        **os.environ,
        "LINGCODE_HOME": str(default_daemon.home),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
    }


def test_the_curl_example_answers_with_json_load(env):
    script = block("sh", "curl")
    assert 'eval "$(lingcode env)"' in script and "temperature" not in script and "max_tokens" not in script
    done = subprocess.run(["bash", "-e", "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    choice = answer["choices"][0]
    assert "json.load(" in choice["message"]["content"] and "```python" in choice["message"]["content"], choice
    assert choice["finish_reason"] == "stop" and answer["usage"]["completion_tokens"] < 1024


def test_the_openai_sdk_example_writes_a_string_reversal(env):
    code = block("python", "OpenAI()")
    shell = f'eval "$(lingcode env)"\nexec python - <<"PYTHON"\n{code}PYTHON\n'
    done = subprocess.run(["bash", "-e", "-c", shell], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "def " in done.stdout and ("[::-1]" in done.stdout or "reversed(" in done.stdout), done.stdout
    assert "completion_tokens=" in done.stdout


def test_the_editor_example_is_the_default_model_s_suggestion(default_daemon):
    """Set-up's editor example: the body the default model fills in, as the LSP asks for it."""
    shown = re.search(r"suggests the body.*?```python\n(.*?)```", README, flags=re.S).group(1)
    shown = "\n".join(line.removeprefix("  ") for line in shown.splitlines())
    head, body = shown.split("\n", 1)
    request = {
        "prefix": f"{head}\n    ",
        "suffix": "\n\n\nprint([p for p in range(30) if is_prime(p)])\n",
        "path": "primes.py",
        "repo": "demo",
        "multiline": True,
        "max_tokens": 128,
        "time_budget_ms": None,
    }
    headers = {"Authorization": f"Bearer {default_daemon.token}"}
    answer = httpx.post(f"{default_daemon.url}/v1/lingcode/complete", json=request, headers=headers, timeout=300)
    assert answer.status_code == 200, answer.text
    assert "    " + answer.json()["text"].rstrip() == body.rstrip(), answer.json()

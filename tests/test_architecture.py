"""The code map (docs/architecture.md) stays true: no import cycles, and an editor keystroke runs
code only in the files the map names.

The keystroke is traced for real: a completer (lsp/completer.py) asks a real daemon for a
suggestion, and the daemon side runs in this process (the app over a freshly loaded engine, so
its worker thread starts under the profiler), with sys.setprofile and threading.setprofile
recording every function of lingcode's own that runs.
"""

from __future__ import annotations

import ast
import re
import sys
import threading
from pathlib import Path

from fastapi.testclient import TestClient

ROOT = Path(__file__).parents[1]
PACKAGES = {"lingcode": ROOT / "lingcode", "lingcode.server": ROOT / "server", "lingcode.lsp": ROOT / "lsp",
            "lingcode.tui": ROOT / "tui"}  # fmt: skip
MAP = (ROOT / "docs" / "architecture.md").read_text()


def modules() -> dict[str, Path]:
    found = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = [p for p in path.relative_to(folder).with_suffix("").parts if p != "__init__"]
            if package == "lingcode" and parts and parts[0] in ("server", "lsp", "tui"):
                continue
            found[".".join([package, *parts])] = path
    return found


def test_no_import_cycles():
    """Module-level imports only (an import inside a function runs when called, not at import)."""
    found = modules()
    graph: dict[str, set[str]] = {}
    for name, path in found.items():
        deps: set[str] = set()
        for node in ast.parse(path.read_text()).body:  # top level; `if TYPE_CHECKING:` blocks are skipped
            if isinstance(node, ast.Import):
                deps.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                deps.add(node.module)
                deps.update(f"{node.module}.{alias.name}" for alias in node.names)
        for dep in list(deps):  # importing a.b.c runs a/__init__ and a/b/__init__ first
            parts = dep.split(".")
            deps.update(".".join(parts[:i]) for i in range(2, len(parts)))
        graph[name] = {d for d in deps if d in found and d != name}

    cycles, index, low, stack, on_stack = [], {}, {}, [], set()

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for dep in graph[node]:
            if dep not in index:
                visit(dep)
                low[node] = min(low[node], low[dep])
            elif dep in on_stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for node in graph:
        if node not in index:
            visit(node)
    assert cycles == [], cycles


def keystroke_files() -> set[str]:
    """The files the map names for a keystroke: its numbered chain and the paragraphs after it."""
    section = MAP[MAP.index("## An editor keystroke") : MAP.index("## An agent turn")]
    return set(re.findall(r"`((?:lingcode|server|lsp|tui)/[\w/]+\.py)`", section))


class Tracer:
    def __init__(self):
        self.files: set[str] = set()
        roots = {str(folder.resolve()): folder for folder in PACKAGES.values()}
        self._roots = tuple(roots)

    def __call__(self, frame, event, arg):
        if event == "call":
            name = frame.f_code.co_filename
            if name.startswith(self._roots):
                self.files.add(str(Path(name).resolve().relative_to(ROOT)))

    def __enter__(self):
        sys.setprofile(self)
        threading.setprofile(self)
        return self

    def __exit__(self, *exc):
        sys.setprofile(None)
        threading.setprofile(None)


async def test_a_keystroke_runs_code_only_in_the_files_the_map_names(model_path, daemon, monkeypatch):
    from lingcode.client import DaemonLink
    from lingcode.engine.local import load_engine
    from lingcode.lsp.completer import Completer, Cursor, Settings
    from lingcode.pipeline.scheduler import Scheduler
    from lingcode.server.app import create_app

    text = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    "
    # The editor side, against the session's daemon.
    monkeypatch.setenv("LINGCODE_HOME", str(daemon.home))
    link = DaemonLink(auto_start=False)
    completer = Completer(link, Settings(), lambda message: None)
    cursor = Cursor(uri="file:///w/calc.py", text=text, offset=len(text), line=5, path="calc.py", language="python")
    await link.ready()  # connected, as an editor is after its first keystroke
    await completer.complete(cursor)  # a second keystroke is the one traced
    with Tracer() as editor:
        other = "class Stack:\n    def push(self, item):\n        "  # no typed-ahead hit: a fresh request
        await completer.complete(Cursor(**{**cursor.__dict__, "uri": "file:///w/stack.py", "path": "stack.py",
                                           "text": other, "offset": len(other), "line": 2}))  # fmt: skip
    await completer.close()
    # The daemon side, in this process, on a fresh engine: its worker thread starts with the first
    # request, under the tracer.
    engine = load_engine(model_path, device="cpu")
    app = create_app(Scheduler(engine), engine.info, "t", model_id="m")
    client = TestClient(app, base_url="http://localhost", headers={"Authorization": "Bearer t"})
    body = {"prefix": text, "suffix": "\n", "path": "calc.py", "max_tokens": 8}
    with Tracer() as daemon_side:
        assert client.post("/v1/lingcode/complete", json=body).status_code == 200
    await engine.close()
    ran = editor.files | daemon_side.files
    named = keystroke_files()
    assert {"lsp/completer.py", "lingcode/client.py", "server/editor/serving.py"} <= ran  # both sides, a real request
    assert len(ran | {"lsp/server.py"}) == int(re.search(r"runs code in (\d+) files", MAP)[1])
    assert ran <= named, f"code ran in files docs/architecture.md does not name: {sorted(ran - named)}"

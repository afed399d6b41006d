"""The code map (docs/architecture.md) stays true: no import cycles, an editor keystroke runs code
only in the files the map names, every product file has its row in the map, and the map names
nothing that is not in the repository.

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
PACKAGES = {
    "lingcode": ROOT / "lingcode",
    "lingcode.server": ROOT / "server",
    "lingcode.lsp": ROOT / "lsp",
    "lingcode.tui": ROOT / "tui",
}
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


PRODUCT_SUFFIXES = (".py", ".cpp", ".h")
DATA = ROOT / "lingcode" / "data"
# A row of the map's file tables: | `path from the repository's root` | its job |
ROW = re.compile(r"^\| `([^`]+)` \| (.*\S) \|$", re.MULTILINE)


def holds_code(init: Path) -> bool:
    """Whether an __init__.py holds more than its docstring, imports, `__all__` and `__version__`
    (the map's rule for which __init__.py files get a row)."""
    for i, node in enumerate(ast.parse(init.read_text()).body):
        if i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the docstring
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if all(isinstance(t, ast.Name) and t.id in ("__all__", "__version__") for t in targets):
            continue
        return True
    return False


def product_files() -> set[str]:
    """Every product file, by its path from the repository's root: each .py, .cpp and .h of the
    installed packages (an __init__.py only where it holds code), and each file under lingcode/data/."""
    found = set()
    for folder in PACKAGES.values():
        for path in folder.rglob("*"):
            parts = path.relative_to(folder).parts
            if path.suffix not in PRODUCT_SUFFIXES or "__pycache__" in parts or not path.is_file():
                continue
            if folder.name == "lingcode" and parts[0] in ("server", "lsp", "tui"):
                continue
            if path.name == "__init__.py" and not holds_code(path):
                continue
            found.add(path.relative_to(ROOT).as_posix())
    found.update(
        path.relative_to(ROOT).as_posix()
        for path in DATA.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    )
    return found


def map_rows() -> list[str]:
    """The paths of the map's rows, in order (a path named in two rows comes twice)."""
    return [path for path, _job in ROW.findall(MAP)]


def test_the_map_names_every_product_file_once():
    rows = map_rows()
    named = set(rows)
    missing = sorted(product_files() - named)
    rows_to_add = "\n".join(f"| `{path}` | its job |" for path in missing)
    assert not missing, (
        f"docs/architecture.md has no row for: {', '.join(missing)}; add to its folder's table:\n{rows_to_add}"
    )
    twice = sorted({path for path in rows if rows.count(path) > 1})
    assert not twice, f"docs/architecture.md has more than one row for: {', '.join(twice)}"
    not_product = sorted(named - product_files())
    assert not not_product, (
        "docs/architecture.md has a row for what is not a product file (gone, renamed, "
        f"or an __init__.py that holds no code): {', '.join(not_product)}"
    )


def named_paths(text: str) -> set[str]:
    """The paths a text names in backticks: a name that starts with one of the repository's top-level
    entries (`lingcode/...`, `tests/...`, `bench/`), or a file name with a source or data suffix."""
    top = {entry.name for entry in ROOT.iterdir() if not entry.name.startswith(".")}
    paths = set()
    for name in re.findall(r"`([^`\s]+)`", text):
        if not re.fullmatch(r"[\w.-]+(?:/[\w.-]+)*/?", name):
            continue  # code, a route (/v1/...), an identifier with other characters
        if name.split("/")[0] in top or re.search(r"\w\.(?:py|cpp|h|toml|md|tcss)$", name):
            paths.add(name)
    return paths


def test_the_map_refers_to_nothing_outside_the_repository():
    gone = sorted(path for path in named_paths(MAP) if not (ROOT / path).exists())
    assert not gone, f"docs/architecture.md names paths the repository does not have: {gone}"
    for target in re.findall(r"\]\(([^)\s]+)\)", MAP):
        assert not re.match(r"[a-z][\w+.-]*:", target), f"docs/architecture.md links outside the repository: {target}"
        local = target.split("#")[0]
        assert not local or (ROOT / "docs" / local).exists(), f"docs/architecture.md links to nothing: {target}"
    outside = {
        "a URL": r"\b(?:https?|ftp)://\S+",
        "an issue or pull request": r"(?i)\b(?:issue|pull request|PR)s?\s*#?\s*\d+|(?<![\w&])#\d+\b",
        "a brief": r"(?i)\bbriefs?\b",
        "a date": r"\b\d{4}-\d{2}-\d{2}\b",
        "a commit hash": r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b",
        "a measurement": r"\b\d[\d.,]*\s?(?:ms|µs|us|MB|GB|KiB|MiB|GiB|tok/s|%)(?!\w)",
    }
    for what, pattern in outside.items():
        found = [m.group(0) for m in re.finditer(pattern, MAP)]
        assert not found, f"docs/architecture.md refers to {what}, which a reader of the repository lacks: {found}"


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
        await completer.complete(
            Cursor(
                **{
                    **cursor.__dict__,
                    "uri": "file:///w/stack.py",
                    "path": "stack.py",
                    "text": other,
                    "offset": len(other),
                    "line": 2,
                }
            )
        )
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

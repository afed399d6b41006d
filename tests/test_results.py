"""bench/results/ holds short summaries, and every link to one leads somewhere.

Raw samples, logs and drivers stay out of the tree (git history keeps what was there), so a file
over 200 KB or a folder over 5 MB means they came back. The links are checked on disk: a summary
that moves or leaves must take its citations with it. No model, no daemon.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[1]
RESULTS = ROOT / "bench" / "results"
MAX_FILE = 200 * 1024
MAX_TREE = 5 * 1024 * 1024
DOCS = ["README.md", "SECURITY.md", "bench/README.md", "docs/*.md", "bench/results/**/*.md"]
CODE = ["lingcode", "server", "lsp", "tui", "tests"]
LINK = re.compile(r"\[[^\]]*\]\(<?([^)>\s]+)")
CODE_PATH = re.compile(r"bench/results/[\w.*/-]*")


def result_files() -> list[Path]:
    return sorted(p for p in RESULTS.rglob("*") if p.is_file())


def dangling_links() -> list[str]:
    """Relative Markdown links, resolved from the page that holds them; URLs and #anchors pass."""
    bad = []
    for pattern in DOCS:
        for page in sorted(ROOT.glob(pattern)):
            for target in LINK.findall(page.read_text(errors="replace")):
                path = target.split("#")[0]
                if not path or re.match(r"[a-z][a-z0-9+.-]*:", path):
                    continue
                if not (page.parent / path).exists():
                    bad.append(f"{page.relative_to(ROOT)} -> {target}")
    return bad


def missing_code_paths() -> list[str]:
    """A path may be an --out prefix (soak-cpu-2026-11-29 for its .md); NAME, DATE, $(...) are placeholders."""
    bad = []
    for folder in CODE:
        for source in sorted((ROOT / folder).rglob("*")):
            if not source.is_file() or source.suffix not in (".py", ".sh", ".toml", ".md", ".h", ".cpp"):
                continue
            for path in CODE_PATH.findall(source.read_text(errors="replace")):
                path = path.rstrip(".")
                if re.search(r"[A-Z$]", path):
                    continue
                if not any(ROOT.glob(path if "*" in path else path + "*")):
                    bad.append(f"{source.relative_to(ROOT)}: {path}")
    return bad


def test_no_result_file_is_over_200_kb():
    big = [
        f"{p.relative_to(ROOT)}: {p.stat().st_size // 1024} KB" for p in result_files() if p.stat().st_size > MAX_FILE
    ]
    assert not big, f"bench/results keeps summaries; raw samples stay out of the tree: {big}"


def test_results_stay_under_5_mb():
    total = sum(p.stat().st_size for p in result_files())
    assert total <= MAX_TREE, f"bench/results holds {total / 2**20:.1f} MB (at most 5 MB)"


def test_links_to_docs_and_results_lead_somewhere():
    bad = dangling_links()
    assert not bad, "links that point nowhere:\n" + "\n".join(bad)


def test_results_named_in_the_code_exist():
    bad = missing_code_paths()
    assert not bad, "bench/results paths in the code that point nowhere:\n" + "\n".join(bad)


def test_the_files_and_tests_security_md_names_exist():
    """Each guarantee names where it is enforced and which tests prove it: both must be there."""
    text = (ROOT / "SECURITY.md").read_text()
    bad = []
    for path, name in re.findall(r"`((?:server|lingcode|lsp|tui|tests)/[\w/.]+\.py)(?:::(\w+))?`", text):
        if not (ROOT / path).exists():
            bad.append(path)
        elif name and not re.search(rf"^\s*(?:async )?(?:def|class) {name}\b", (ROOT / path).read_text(), re.M):
            bad.append(f"{path}::{name}")
    assert not bad, f"SECURITY.md names what is not there: {sorted(set(bad))}"

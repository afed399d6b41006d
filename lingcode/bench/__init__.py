"""Benchmarks, not tests: `lingcode bench` (decode speed, decode.py) and `lingcode bench NAME` (NAME.py with main(args)), on real parts."""

import json
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PRODUCT_CODE = ("lingcode", "server", "lsp", "tui", "pyproject.toml")


def source_commit() -> str:
    """The commit a result was measured at: $LINGCODE_COMMIT on a copy of the tree without its own
    history (the GPU machine), else git's HEAD, with "+changes" when the product's code differs from
    it (an A/B run against files of another commit); "" where neither is known."""
    if os.environ.get("LINGCODE_COMMIT"):
        return os.environ["LINGCODE_COMMIT"]
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        changed = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no", "--", *PRODUCT_CODE],
            capture_output=True,
            text=True,
        )
    except OSError:
        return ""
    commit = head.stdout.strip()
    return f"{commit}+changes" if commit and changed.stdout.strip() else commit


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity, as taskset sets it), where the OS says."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0


def share_kernels(home: Path) -> None:
    """Give a daemon's private LINGCODE_HOME this user's built CPU kernels (paths.native_dir()), so
    that each run does not build them again (a minute or two on 2 cores) before it can measure."""
    from lingcode import paths

    (home / "cache").mkdir(exist_ok=True)
    (home / "cache" / "native").symlink_to(paths.native_dir())


def write_result(out: str | Path | None, result: dict, table: str, indent: int = 2) -> None:
    """OUT.json (the result) and OUT.md (its table), where --out asked for them."""
    if out is None:
        return
    out = Path(out)
    if out.suffix in (".json", ".md"):
        out = out.with_suffix("")
    out.parent.mkdir(parents=True, exist_ok=True)
    # Appended, not with_suffix(): a prefix may hold a dot of its own ("switch-0.05-run1").
    out.parent.joinpath(out.name + ".json").write_text(json.dumps(result, indent=indent) + "\n")
    out.parent.joinpath(out.name + ".md").write_text(table)

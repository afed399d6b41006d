"""`lingcode bench` runs end to end on the CPU and writes what it claims (numbers are not asserted)."""

from __future__ import annotations

import json
import subprocess
import sys


def test_bench_writes_json_markdown_and_plot(tmp_path, model_path):
    out = tmp_path / "cpu"
    done = subprocess.run(
        [sys.executable, "-m", "lingcode", "bench", "--model", str(model_path), "--device", "cpu",
         "--workload", "completion,code-edit", "--speculation", "off,ngram", "--requests", "1",
         "--max-tokens", "6", "--out", str(out)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(out.with_suffix(".json").read_text())
    variants = {(row["workload"], row["variant"]) for row in report["summary"]}
    assert variants == {(w, v) for w in ("completion", "code-edit") for v in ("lingcode-off", "lingcode-ngram")}
    assert all(r["tokens"] >= 1 and r["ttft_ms"] > 0 for r in report["requests"])
    assert "| workload | variant |" in out.with_suffix(".md").read_text()
    assert report["command"].startswith("lingcode bench --model")

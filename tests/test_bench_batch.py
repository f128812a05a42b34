"""The batch benchmark script runs end to end at a tiny size (a smoke test)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_batch.py"


@pytest.mark.slow
def test_three_repositories_every_kind_prints_the_table_and_writes_json(tmp_path: Path) -> None:
    """Three repositories: ours with and without a branch and the floor succeed, the table
    and memory samples are printed, the JSON holds the figures, and the cache's repositories
    are left as they were (no branch, working tree untouched)."""
    output = tmp_path / "batch.json"
    cache = tmp_path / "cache"
    args = ["--repos", "3", "--kinds", "ours", "ours-nobranch", "floor"]
    args += ["--cache", str(cache), "--output", str(output)]
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "Batch: 3 repositories, --max-repos 4" in out
    for kind in ("ours", "ours-nobranch", "floor"):
        assert any(line.startswith(kind + " ") for line in out.splitlines()), kind
    assert "x wall" in out and "KiB per 100 repositories" in out
    document = json.loads(output.read_text())
    assert document["repos"] == 3
    rows = {row["kind"]: row for row in document["rows"]}
    assert set(rows) == {"ours", "ours-nobranch", "floor"}
    for kind in ("ours", "ours-nobranch"):
        samples = rows[kind]["rss_samples"]
        assert [s["share"] for s in samples] == [0.1, 0.25, 0.5, 0.75, 1.0]
        assert samples[-1]["finished"] == 3
        assert rows[kind]["peak_rss_kib"] >= max(s["rss_kib"] for s in samples)
        assert set(document["ratios_to_floor"][kind]) == {"wall", "cpu", "own_cpu"}
    assert rows["floor"]["seconds"] > 0
    # the benchmark's branches are gone and the working trees are as generated
    for repo in sorted((cache / "repos-3").glob("r0*")):
        branches = subprocess.run(
            ["git", "branch", "--list"], cwd=repo, capture_output=True, text=True, check=True
        ).stdout.split()
        assert branches == ["*", "main"]
        status = subprocess.run(
            ["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True, check=True
        ).stdout
        assert status == ""


def test_json_flag_prints_only_the_figures(tmp_path: Path) -> None:
    """--json prints one JSON document (the floor alone: no agent needed)."""
    output = tmp_path / "batch.json"
    args = ["--repos", "2", "--kinds", "floor", "--json"]
    args += ["--cache", str(tmp_path / "cache"), "--output", str(output)]
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    document = json.loads(proc.stdout)
    assert document == json.loads(output.read_text())
    assert [row["kind"] for row in document["rows"]] == ["floor"]
    assert document["ratios_to_floor"] == {}

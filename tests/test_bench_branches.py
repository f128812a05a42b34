"""The branch directory benchmark runs end to end in its --quick mode (a smoke test)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_branches.py"


@pytest.mark.slow
def test_quick_run_prints_the_table_the_counters_and_writes_json(tmp_path: Path) -> None:
    """--quick generates its repository, runs ours and the peers, prints the figures with
    verdicts and the run's branch counters, and saves JSON."""
    output = tmp_path / "branches.json"
    args = ["--quick", "--cache", str(tmp_path / "cache"), "--output", str(output)]
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "Branch directories: 200 files" in out
    for kind in ("orchestrator run", "git worktree add", "cp -a"):
        assert kind in out
    assert "made 4, reused 0" in out
    assert "PASS" in out or "FAIL" in out
    document = json.loads(output.read_text())
    rows = {row["kind"]: row for row in document["rows"]}
    assert set(rows) == {
        "ours N=1",
        "worktree N=1",
        "cp N=1",
        "ours N=4",
        "ours N=4 sessions=1",
        "worktree N=4",
        "cp N=4",
    }
    ours = rows["ours N=4"]["branches"]
    assert ours["made"] == 4 and ours["reused"] == 0
    assert ours["bytesCopied"] == 4 * document["tree_bytes"]
    assert rows["ours N=4"]["all_branches"] == [ours]  # one repeat: one run's counters
    # one session at a time: one directory on disk at a time (and the agent's line)
    single = rows["ours N=4 sessions=1"]
    assert single["peak_bytes"] <= document["tree_bytes"] + 100
    assert {t["name"] for t in document["targets"]} >= {"N=4: default sessions no slower than 1"}

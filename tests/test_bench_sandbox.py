"""The sandbox benchmark script runs end to end with one run per command (a smoke test)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from run_helpers import landlock_missing

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_sandbox.py"


@pytest.mark.slow
@pytest.mark.skipif(landlock_missing() is not None, reason=str(landlock_missing()))
def test_one_run_each_exits_zero_and_writes_json(tmp_path: Path) -> None:
    """With --repeat 1 the script times every start directly and confined, and saves JSON."""
    output = tmp_path / "sandbox.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--repeat", "1", "--prompts", "1", "--output", str(output)],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        env={**os.environ, "ORCHESTRATOR_STATE_DIR": str(tmp_path / "state")},
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(output.read_text())
    assert {"/bin/true", "python -c pass"} <= set(data["starts"])
    assert all(row["ok"] for row in data["starts"].values())
    assert data["prompt"]["ok"]
    assert "added cpu" in proc.stdout

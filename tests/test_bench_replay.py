"""The replay benchmark script runs end to end at a tiny size (a smoke test)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_replay.py"


def test_a_short_turn_is_recorded_and_replayed_as_it_was(tmp_path: Path) -> None:
    """Three rounds, one command, no model time: the script records, replays twice, checks each
    replay (no divergence, the same diff), prints the table and writes the figures as JSON."""
    output = tmp_path / "replay.json"
    args = ["--rounds", "3", "--think", "0", "--terminal-every", "2", "--repeat", "2"]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--output", str(output)],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "ORCHESTRATOR_STATE_DIR": str(tmp_path / "unused-state")},
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "agent turn (prompt sent to answered)" in done.stdout
    assert "WRONG" not in done.stdout
    figures = json.loads(output.read_text())
    assert figures["wrong"] == []
    assert figures["rounds"] == 3
    assert set(figures["ratios"]) == {"turn", "step", "run"}
    assert all(figures["replayed"][name] > 0 for name in ("turn", "step", "run"))
    assert not (tmp_path / "unused-state").exists()  # the script keeps its own state

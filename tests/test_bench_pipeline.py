"""The pipeline/supervisor benchmark script runs end to end at a tiny size (a smoke test)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_pipeline.py"


def run_bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.slow
def test_tiny_run_exits_zero_prints_the_table_and_writes_json(tmp_path: Path) -> None:
    """Both scenarios at a tiny size succeed, print the figures with verdicts, and save JSON."""
    output = tmp_path / "pipeline.json"
    proc = run_bench(
        *("--agents", "3", "--updates", "10", "--steps", "20", "--output", str(output))
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Pipeline/supervisor benchmark" in proc.stdout
    assert "3 agents x 10 updates" in proc.stdout
    assert "received / lost" in proc.stdout
    assert "30 / 0" in proc.stdout
    assert "20 steps (chain" in proc.stdout
    for figure in ("mb_per_agent", "scheduler_ms_per_step"):
        line = next(x for x in proc.stdout.splitlines() if figure in x)
        assert "PASS" in line or "FAIL" in line
    # the target row is the scheduler's own part, the total and the directory I/O beside it
    target = next(x for x in proc.stdout.splitlines() if "scheduler_ms_per_step" in x)
    assert "scheduler's own part" in target and "total" in target
    assert any("branch directory I/O" in x for x in proc.stdout.splitlines())
    document = json.loads(output.read_text())
    assert document["best"]["load"]["received"] == 30
    assert document["best"]["load"]["lost"] == 0
    assert document["best"]["steps"]["status"] == "succeeded"
    assert document["best"]["steps"]["turns"] == 20
    assert document["best"]["steps"]["store_calls"] > 0
    steps = document["best"]["steps"]
    assert steps["scheduler_ms_per_step"] == pytest.approx(
        steps["overhead_ms_per_step"] - steps["branch_io_ms_per_step"]
    )
    assert steps["scheduler_cpu_ms_per_step"] == pytest.approx(
        steps["overhead_cpu_ms_per_step"] - steps["branch_io_cpu_ms_per_step"]
    )
    # every step's directory was made, harvested and removed, inside the run
    assert steps["branch_io"]["materialize_count"] == 20
    assert steps["branch_io"]["harvest_count"] == 20
    assert steps["branch_io"]["remove_count"] == 20
    assert steps["branch_io_ms_per_step"] > 0


@pytest.mark.slow
def test_wide_steps_with_the_scripted_agent_kind(tmp_path: Path) -> None:
    """The wide shape and the scripted load agent work too; one scenario can run alone."""
    output = tmp_path / "pipeline.json"
    proc = run_bench(
        *("--scenario", "load", "--agent-kind", "scripted", "--agents", "2", "--updates", "5"),
        *("--output", str(output)),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 agents x 5 updates (scripted)" in proc.stdout
    assert "steps (" not in proc.stdout
    proc = run_bench(
        *("--scenario", "steps", "--shape", "wide", "--steps", "12", "--output", str(output))
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "12 steps (wide" in proc.stdout

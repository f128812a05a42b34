"""The start-up benchmark script runs end to end with two runs per command (a smoke test)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
SCRIPT = BENCHMARKS / "bench_startup.py"

sys.path.insert(0, str(BENCHMARKS))

from bench_startup import parse_importtime  # noqa: E402


def test_parse_importtime_reads_depth_and_times() -> None:
    """A -X importtime report gives each module's nesting depth, self and cumulative time."""
    report = (
        "import time: self [us] | cumulative | imported package\n"
        "import time:       120 |        120 |   _abc\n"
        "import time:       300 |        420 | abc\n"
        "import time:      1500 |       2000 |     orchestrator.cli\n"
        "something else on stderr\n"
    )
    assert parse_importtime(report) == [
        {"module": "_abc", "depth": 1, "self_us": 120, "cumulative_us": 120},
        {"module": "abc", "depth": 0, "self_us": 300, "cumulative_us": 420},
        {"module": "orchestrator.cli", "depth": 2, "self_us": 1500, "cumulative_us": 2000},
    ]


@pytest.mark.slow
def test_two_runs_exit_zero_print_the_table_and_write_json(tmp_path: Path) -> None:
    """With --repeat 2 the script exits 0, prints the timing and import tables and saves JSON."""
    output = tmp_path / "startup.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--repeat", "2", "--top", "5", "--output", str(output)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Start-up benchmark" in proc.stdout
    help_line = next(x for x in proc.stdout.splitlines() if x.startswith("orchestrator --help"))
    assert "< 0.3 s" in help_line
    assert "PASS" in help_line or "FAIL" in help_line
    assert "on cpu" in help_line
    assert any(x.startswith("orchestrator run --help") for x in proc.stdout.splitlines())
    assert 'python -X importtime -c "import orchestrator.cli"' in proc.stdout
    assert "orchestrator.cli" in proc.stdout.split("Top 5 imports", 1)[1]
    document = json.loads(output.read_text())
    assert document["repeat"] == 2
    assert document["target"]["max_seconds"] == 0.3
    for label in ("orchestrator --help", "orchestrator run --help"):
        timing = document["commands"][label]
        assert timing["ok"] is True
        assert len(timing["seconds"]) == len(timing["cpu_seconds"]) == 2
        assert timing["min"] <= timing["median"] <= timing["max"]
    assert "orchestrator.cli" in {m["module"] for m in document["imports"]["modules"]}

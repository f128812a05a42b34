"""The cluster benchmark script runs end to end at a tiny size (a smoke test)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_cluster.py"


def test_two_repositories_and_two_items_on_a_loopback_cluster(tmp_path: Path) -> None:
    """Two repositories and two fan-out items on both paths: the script starts and stops its
    own loopback cluster, prints the table, the overhead and the micro section, writes the
    figures as JSON, and leaves no Ray process nor its temporary directory behind."""
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed (pip install -e '.[ray]')")
    output = tmp_path / "cluster.json"
    cache = tmp_path / "cache"
    args = ["--repos", "2", "--items", "2", "--repeat", "1", "--calls", "5", "--trees", "10", "300"]
    args += ["--cache", str(cache), "--output", str(output)]
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    assert "a loopback cluster of 2 nodes x 2 slots" in out
    for kind in ("batch", "fanout"):
        for where in ("local", "cluster"):
            assert any(line.split()[:2] == [kind, where] for line in out.splitlines())
        assert f"{kind}: cluster overhead" in out
    assert "micro: tree of 300 files" in out and "coordinator calls per turn" in out
    document = json.loads(output.read_text())
    assert (document["repos"], document["items"], document["max_sessions"]) == (2, 2, 4)
    assert document["cluster_up_seconds"] > 0 and document["cluster_down_seconds"] > 0
    rows = {(r["kind"], r["path"]): r for r in document["rows"]}
    assert set(rows) == {(k, w) for k in ("batch", "fanout") for w in ("local", "cluster")}
    for (_, where), row in rows.items():
        assert row["ms_per_instance"] > 0 and row["driver_cpu_ms_per_instance"] > 0
        assert (row["connect_seconds"] is None) == (where == "local")
    assert set(document["overhead"]) == {"batch", "fanout"}
    micro = document["micro"]
    assert [t["files"] for t in micro["trees"]] == [10, 300]
    assert all(t["put_blobs_first_ms"] > 0 and t["bytes"] > 0 for t in micro["trees"])
    assert micro["coordinator_calls_per_second"] > 0
    # its cluster's directory is gone, and with it every process that lived in it
    assert not Path(f"/tmp/raybench-{proc.pid}").exists()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            assert f"raybench-{proc.pid}".encode() not in cmdline, entry.name
    assert os.path.isdir(cache / "repos-2")  # the repositories made once, kept for next time


def test_an_unreachable_cluster_fails_in_one_line(tmp_path: Path) -> None:
    """--cluster at a closed port: exit 1 and one line naming the address (no traceback)."""
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed (pip install -e '.[ray]')")
    args = ["--cluster", "127.0.0.1:1", "--repos", "1", "--items", "1", "--repeat", "1"]
    args += ["--kinds", "fanout", "--cache", str(tmp_path / "cache")]
    args += ["--output", str(tmp_path / "cluster.json")]
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1
    [line] = [x for x in proc.stderr.splitlines() if x.startswith("bench_cluster:")]
    assert "cannot reach the Ray cluster at 127.0.0.1:1" in line, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "cluster.json").exists()

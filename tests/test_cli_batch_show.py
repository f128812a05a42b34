"""Batch runs through the console script: ``runs`` lists a batch with its children, ``show``
gives its table, object and report, ``diff``/``apply`` send the user to its runs, and ``prune``
takes a batch with its runs, never one of them alone, never a batch that runs."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import trio
from batch_records import make_batch
from run_helpers import CLI, as_json, one_line_error, run_cli, snapshot

from orchestrator.cli.output import output_schema
from orchestrator.runs import run_pipeline

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CLI.is_file(), reason=f"console script {CLI} not installed"),
]

DAY = 86400.0


async def cli(tmp_path: Path, state: Path, *args: str) -> Any:
    """Run a command with ``--json``; its object, checked against the schema (exit 0)."""
    done = await run_cli(*args, "--json", cwd=tmp_path, state=state)
    assert done.returncode == 0, done.stderr.decode()
    document = as_json(done)
    jsonschema.Draft202012Validator(output_schema()).validate(document)
    return document


async def text(tmp_path: Path, state: Path, *args: str) -> str:
    """A command's stdout (exit 0), as a 100-column terminal would get it."""
    with trio.fail_after(90):
        done = await trio.run_process(
            [str(CLI), *args],
            cwd=tmp_path,
            env={**os.environ, "ORCHESTRATOR_STATE_DIR": str(state), "COLUMNS": "100"},
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode()


async def plain_run(tmp_path: Path, state: Path) -> str:
    """A pipeline run of its own (no batch), made now; its id."""
    repo = tmp_path / f"solo-{time.monotonic_ns()}"
    repo.mkdir()
    (repo / "README.md").write_text("The colour.\n")
    pipeline = repo.parent / "solo.py"
    pipeline.write_text(
        "from orchestrator import step\n\n\n@step(agent='demo')\n"
        "def edit(task: str) -> str:\n    return task\n"
    )
    done = await run_pipeline(
        pipeline, {"task": 'replace "colour" with "color" in README.md'}, cwd=repo,
        policy="edit", state_dir=state,
    )  # fmt: skip
    return done.run_id


async def test_runs_lists_a_batch_with_its_runs_under_it(tmp_path: Path, state_dir: Path) -> None:
    """A batch's line is followed by one indented line per child run, naming its repository;
    --limit counts runs of their own; --json gives every run with its parent, kind batch."""
    batch_id, kids = await make_batch(tmp_path, state_dir, {"svc-a": False, "svc-b": True})
    solo = await plain_run(tmp_path, state_dir)
    listed = (await text(tmp_path, state_dir, "runs")).splitlines()
    assert [line.split()[0] for line in listed] == [solo, batch_id, "\u21b3", "\u21b3"]
    assert listed[1].split()[3:5] == ["batch", "failed"]
    assert listed[2].split()[1:] == [kids["svc-a"], listed[2].split()[2], "pipeline",
                                     "succeeded", "svc-a"]  # fmt: skip
    assert listed[3].split()[-3:] == ["pipeline", "failed", "svc-b"]
    # the child's kind and status stand in the columns of the lines above
    assert listed[2].index("pipeline") == listed[0].index("pipeline")
    assert listed[3].index("failed") == listed[1].index("failed")
    assert (await text(tmp_path, state_dir, "runs", "--limit", "1")).splitlines() == [listed[0]]
    two = await cli(tmp_path, state_dir, "runs", "--limit", "2")
    assert [(r["runId"], r["kind"], r["parent"]) for r in two["runs"]] == [
        (solo, "pipeline", None),
        (batch_id, "batch", None),
        (kids["svc-a"], "pipeline", batch_id),
        (kids["svc-b"], "pipeline", batch_id),
    ]


async def test_show_a_batch_its_table_object_and_report(tmp_path: Path, state_dir: Path) -> None:
    """show BATCH: the table, the summary, the children's ids and how to look at one; --json
    the batch object; --report one HTML and one Markdown report with each repository's diff."""
    batch_id, kids = await make_batch(tmp_path, state_dir, {"svc-a": False, "svc-b": True})
    shown = (await text(tmp_path, state_dir, "show", batch_id[:6])).splitlines()
    assert shown[0].startswith(f"batch {batch_id} (") and shown[0].endswith(": failed")
    table = shown[shown.index("") + 1 : shown.index("", 2)]
    assert table[0].split()[:2] == ["REPOSITORY", "OUTCOME"]
    assert [row.split()[0] for row in table[1:]] == ["svc-a", "svc-b", "clone-x", "skip-x"]
    assert "skipped: budget" in table[4]
    assert (
        "1 of 4 repositories succeeded; failed: svc-b (exit 1), clone-x (clone failed); "
        "skipped: skip-x (budget)"
    ) in shown
    assert f"  {kids['svc-a']}  svc-a" in shown and f"  {kids['svc-b']}  svc-b" in shown
    assert any(f"orchestrator show {kids['svc-a']}" in line for line in shown)

    document = await cli(tmp_path, state_dir, "show", batch_id)
    assert (document["kind"], document["runId"], document["exitCode"]) == ("batch", batch_id, 1)
    assert [r["runId"] for r in document["repos"]] == [kids["svc-a"], kids["svc-b"], None, None]
    assert document["counts"] == {"succeeded": 1, "failed": 2, "skipped": 1, "interrupted": 0}

    report = tmp_path / "report"
    reported = await cli(tmp_path, state_dir, "show", batch_id, "--report", str(report))
    assert reported["report"]["html"] == str(report / "report.html")
    md = (report / "report.md").read_text()
    assert "### svc-a" in md and "### svc-b" in md and md.count("+The color of money.") == 2
    assert "svc-b" in (report / "report.html").read_text()


async def test_show_a_child_names_its_batch(tmp_path: Path, state_dir: Path) -> None:
    """show CHILD says in one line which batch and repository it is; --json has parent."""
    batch_id, kids = await make_batch(tmp_path, state_dir, {"svc-a": False})
    shown = (await text(tmp_path, state_dir, "show", kids["svc-a"])).splitlines()
    assert shown[1] == f"part of batch {batch_id} (repository svc-a): orchestrator show {batch_id}"
    assert (await cli(tmp_path, state_dir, "show", kids["svc-a"]))["parent"] == batch_id
    solo = await plain_run(tmp_path, state_dir)
    assert (await cli(tmp_path, state_dir, "show", solo))["parent"] is None
    assert "part of batch" not in await text(tmp_path, state_dir, "show", solo)


async def test_diff_and_apply_of_a_batch(tmp_path: Path, state_dir: Path) -> None:
    """diff BATCH: each repository's diff under a line naming it and its run; diff --step and
    apply of a batch: one-line usage errors naming its runs, nothing written anywhere."""
    batch_id, kids = await make_batch(tmp_path, state_dir, {"svc-a": False, "svc-b": True})
    before = snapshot(tmp_path)
    diff = await text(tmp_path, state_dir, "diff", batch_id)
    first = f"# svc-a (run {kids['svc-a']}): succeeded, 1 file changed, +1 -1"
    assert diff.startswith(first + "\n--- a/README.md\n")
    assert f"\n# svc-b (run {kids['svc-b']}): failed, 1 file changed, +1 -1\n" in diff
    child = (await run_cli("diff", kids["svc-a"], cwd=tmp_path, state=state_dir)).stdout.decode()
    assert child in diff
    assert diff in await text(tmp_path, state_dir, "show", batch_id, "--diff")
    assert (await cli(tmp_path, state_dir, "diff", batch_id))["diff"] == diff
    stepped = await run_cli("diff", batch_id, "--step", "edit", cwd=tmp_path, state=state_dir)
    assert "is a batch run: it has no steps" in one_line_error(stepped)
    for args in (("apply", batch_id), ("apply", batch_id, "--git-branch", "x")):
        refused = await run_cli(*args, cwd=tmp_path, state=state_dir)
        line = one_line_error(refused)
        assert f"run {batch_id} is a batch run: cannot apply it" in line
        assert f"orchestrator show {batch_id} lists them" in line
    assert snapshot(tmp_path) == before


async def test_prune_takes_a_batch_with_its_runs(tmp_path: Path, state_dir: Path) -> None:
    """--keep counts runs of their own (a batch is one); the dry run lists the batch's runs
    under it; a child alone is refused naming its batch; the batch goes with every run of it."""
    batch_id, kids = await make_batch(tmp_path, state_dir, {"svc-a": False, "svc-b": True})
    solo = await plain_run(tmp_path, state_dir)
    refused = await run_cli("prune", kids["svc-a"], cwd=tmp_path, state=state_dir)
    assert one_line_error(refused).endswith(
        f"run {kids['svc-a']} belongs to batch run {batch_id}: it is pruned with its batch, "
        f"never alone (pruning {batch_id} deletes the batch with all its runs)"
    )
    kept = await cli(tmp_path, state_dir, "prune", "--keep", "2", "--dry-run")
    assert kept["deleted"] == []
    files = snapshot(state_dir)
    dry = (await text(tmp_path, state_dir, "prune", "--keep", "1", "--dry-run")).splitlines()
    assert dry[0].startswith(f"would delete {batch_id}  ")
    assert dry[1].split()[:2] == ["\u21b3", kids["svc-a"]]
    assert dry[2].split()[:2] == ["\u21b3", kids["svc-b"]]
    assert dry[1].index(kids["svc-a"]) == dry[0].index(batch_id)
    assert dry[3].startswith("would delete 3 runs (2 of them with their batch), freeing")
    assert snapshot(state_dir) == files
    done = await cli(tmp_path, state_dir, "prune", "--keep", "1")
    assert [(r["runId"], r["parent"]) for r in done["deleted"]] == [
        (batch_id, None),
        (kids["svc-a"], batch_id),
        (kids["svc-b"], batch_id),
    ]
    assert [r["runId"] for r in (await cli(tmp_path, state_dir, "runs"))["runs"]] == [solo]
    assert sorted(os.listdir(state_dir / "runs")) == [solo]


HOLD = """
import sys
from pathlib import Path
from orchestrator.runs._lock import hold_run_lock
with hold_run_lock(Path(sys.argv[1]), "b", doing="batch"):
    print("held", flush=True)
    sys.stdin.read()
"""


async def test_a_running_batch_and_its_runs_are_never_pruned(
    tmp_path: Path, state_dir: Path
) -> None:
    """While the batch's process holds its lock: --keep 0, --older-than and its id keep it and
    every run of it, saying why; show says it is running. Once it let go, they all go."""
    batch_id, kids = await make_batch(
        tmp_path, state_dir, {"svc-a": False}, status="running", age=3 * DAY
    )
    solo = await plain_run(tmp_path, state_dir)
    holder = await trio.lowlevel.open_process(
        [sys.executable, "-c", HOLD, str(state_dir / "runs" / batch_id)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert holder.stdin is not None and holder.stdout is not None
    try:
        said = b""
        while not said.endswith(b"\n"):
            said += await holder.stdout.receive_some()
        assert said == b"held\n"
        for args in (("--keep", "0"), ("--older-than", "1d"), (batch_id,)):
            done = await cli(tmp_path, state_dir, "prune", *args)
            assert batch_id not in [r["runId"] for r in done["deleted"]]
            assert kids["svc-a"] not in [r["runId"] for r in done["deleted"]]
            assert done["skipped"] == [
                {"runId": batch_id, "reason": "it is running, resumed or applied"}
            ]
        shown = (await text(tmp_path, state_dir, "show", batch_id)).splitlines()
        assert shown[0].endswith(": running")
        assert any("1 of 3 repositories succeeded so far" in line for line in shown)
        listed = await cli(tmp_path, state_dir, "runs")
        assert [r["runId"] for r in listed["runs"]] == [batch_id, kids["svc-a"]]
        assert solo not in [r["runId"] for r in listed["runs"]]  # pruned by --keep 0
    finally:
        await holder.stdin.aclose()  # the holder exits at the end of its stdin
        await holder.wait()
        await holder.stdout.aclose()
    # its process gone (the lock free, its owner gone): read interrupted, and prunable
    shown = (await text(tmp_path, state_dir, "show", batch_id)).splitlines()
    assert shown[0].endswith(": interrupted (its process is gone)")
    done = await cli(tmp_path, state_dir, "prune", "--keep", "0")
    assert [r["runId"] for r in done["deleted"]] == [batch_id, kids["svc-a"]]
    assert os.listdir(state_dir / "runs") == []

"""What a run's branch directories cost, as run, show and the library report it; and what a
killed run leaves behind, deleted by the next one."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import jsonschema
import trio
from run_helpers import CLI, as_json, config, run_cli

from orchestrator.cli.output import output_schema
from orchestrator.pipeline import Pipeline, step
from orchestrator.runs import BranchUsage, run_pipeline

LIMIT = 60.0
#: files of the workspace and bytes of each: a tree too large to be made on the event loop
FILES, SIZE = 24, 100
LINE = "edited"

FANOUT = f'''
from orchestrator import StepContext, step


@step()
def files(ctx: StepContext) -> list[str]:
    return ["f00.txt", "f01.txt", "f02.txt"]


@step(agent="demo", over="files")
def edit(item: str) -> str:
    return f'append "{LINE}" to {{item}}'
'''

HOLD = """
import time
from pathlib import Path

from orchestrator import step


@step()
def hold(workdir: Path) -> str:
    (workdir / "ready").write_text("")
    time.sleep(600)
    return "never"
"""

QUICK = """
from orchestrator import step


@step()
def quick() -> str:
    return "done"
"""


def _workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    for i in range(FILES):
        (root / f"f{i:02d}.txt").write_text("x" * (SIZE - 1) + "\n")
    return root


async def test_run_json_show_and_text_report_the_branch_directories(tmp_path: Path) -> None:
    """run --json gives branches {made, reused, bytesCopied, peakBytes} (valid against the
    schema); show --json gives it back and show's text says it in a line of its own."""
    ws, state = _workspace(tmp_path), tmp_path / "state"
    pipeline = tmp_path / "fanout.py"
    pipeline.write_text(FANOUT)
    done = await run_cli(
        "run", str(pipeline), "--cwd", str(ws), "--policy", "edit", "--json", cwd=ws, state=state
    )
    assert done.returncode == 0, done.stderr.decode()
    result = as_json(done)
    jsonschema.validate(result, output_schema())
    tree = FILES * SIZE
    branches = result["branches"]
    assert (branches["made"], branches["reused"], branches["bytesCopied"]) == (3, 0, 3 * tree)
    # at most the three directories at once, each with the line the agent appended
    assert tree <= branches["peakBytes"] <= 3 * (tree + len(LINE) + 1)
    shown = await run_cli("show", result["runId"], "--json", cwd=ws, state=state)
    assert shown.returncode == 0, shown.stderr.decode()
    assert as_json(shown)["branches"] == branches
    text = await run_cli("show", result["runId"], cwd=ws, state=state)
    assert (
        f"branches: 3 directories made, 0 reused, {3 * tree / 1024:.1f} KiB copied, peak "
        in text.stdout.decode()
    )


async def test_run_outcome_reads_the_branch_directories(tmp_path: Path) -> None:
    """RunOutcome.branches gives the run's figures typed, to_json() giving them back."""

    @step()
    def build(workdir: Path) -> str:
        return "built"

    ws = _workspace(tmp_path)
    with trio.fail_after(LIMIT):
        outcome = await run_pipeline(
            Pipeline.from_steps([build], name="b"),
            {},
            cwd=ws,
            config=config(),
            state_dir=tmp_path / "state",
        )
    assert outcome.branches == BranchUsage(
        made=1,
        reused=0,
        bytes_copied=FILES * SIZE,
        bytes_reflinked=0,
        peak_bytes=FILES * SIZE,
        json_keys=("made", "reused", "bytesCopied", "bytesReflinked", "peakBytes"),
    )
    assert outcome.branches.to_json() == outcome.result["branches"]


def _wait_for(path_glob: str, root: Path) -> Path:
    """The first path under ``root`` matching ``path_glob``, once one exists."""
    deadline = time.monotonic() + LIMIT
    while time.monotonic() < deadline:
        found = sorted(root.glob(path_glob))
        if found:
            return found[0]
        time.sleep(0.05)
    raise AssertionError(f"nothing matched {path_glob} under {root}")


def test_a_killed_runs_directories_are_deleted_by_the_next_run(tmp_path: Path) -> None:
    """A run killed with SIGKILL leaves its branch directories and trash; the next run
    (another one) deletes them."""
    ws, state = _workspace(tmp_path), tmp_path / "state"
    hold, quick = tmp_path / "hold.py", tmp_path / "quick.py"
    hold.write_text(HOLD)
    quick.write_text(QUICK)
    env = {**os.environ, "ORCHESTRATOR_STATE_DIR": str(state)}
    proc = subprocess.Popen(
        [str(CLI), "run", str(hold), "--cwd", str(ws), "--no-progress"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        ready = _wait_for("runs/*/branches/*/ready", state)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    killed = ready.parent.parent.parent
    # what a deletion cut short by the kill would have left in the trash
    (killed / "trash" / "hold-0.cafe0000" / "deep").mkdir(parents=True)
    assert (killed / "branches" / "hold-1" / "f00.txt").exists()
    done = subprocess.run(
        [str(CLI), "run", str(quick), "--cwd", str(ws), "--no-progress"],
        env=env,
        capture_output=True,
        timeout=LIMIT,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    assert not (killed / "branches").exists() and not (killed / "trash").exists()
    # nothing is left in the state directory but the runs' own records
    for run_dir in (state / "runs").iterdir():
        assert not (run_dir / "branches").exists() and not (run_dir / "trash").exists()

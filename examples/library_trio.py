"""The library from trio code: a pipeline built in Python, with live events, and the supervisor.

    python examples/library_trio.py

Works on a temporary copy of ``examples/sample-project`` with the built-in demo agent.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import trio

from orchestrator import Pipeline, RunEvent, StepResult, run_pipeline, step

HERE = Path(__file__).resolve().parent


@step(agent="demo")
def rename() -> str:
    """Rename a function everywhere."""
    return "rename calc_total to compute_total in shop/*.py\n"


@step(agent="demo")
def notes(rename: StepResult) -> str:
    """Record the change."""
    files = ", ".join(path for path, _ in rename.changes)
    return f'append "- Renamed calc_total in {files}.\\n" to CHANGES.md\n'


def show(event: RunEvent) -> None:
    """Print the events that matter."""
    if event.type in ("step_started", "step_finished", "step_failed"):
        print(f"{event.type:<14} {event.instance}")


async def main() -> None:
    """Run the two-step pipeline and print its diff."""
    project = Path(tempfile.mkdtemp()) / "sample-project"
    shutil.copytree(HERE / "sample-project", project)
    pipeline = Pipeline.from_steps([rename, notes], name="rename-and-note")
    run = await run_pipeline(pipeline, cwd=project, policy="edit", on_event=show)
    print(run.status)
    print(run.diff)


if __name__ == "__main__":
    trio.run(main)

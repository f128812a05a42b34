"""For the live view: two demo agents fanned out (``work[a]``, ``work[b]``), then a step that
waits until someone writes to a named pipe, so the table stays up while no event arrives."""

from __future__ import annotations

from pathlib import Path

from orchestrator.pipeline import step


@step(agent=["a=demo", "b=demo"])
def work(task: str) -> str:
    """Each agent follows the task's demo instructions in its own branch."""
    return task


@step
def hold(work: object, release: str) -> str:
    """Wait for a line on the named pipe ``release`` (opening it waits for a writer)."""
    return Path(release).read_text().strip()

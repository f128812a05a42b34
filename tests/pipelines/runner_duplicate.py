"""For tests/test_runs.py: two steps named `plan` (refused before any agent starts)."""

from __future__ import annotations

from orchestrator.pipeline import step


@step(agent="a")
def plan(task: str) -> str:
    return f"Plan {task}"


@step(agent="a")  # type: ignore[no-redef]
def plan(task: str) -> str:  # noqa: F811
    return f"Plan {task} again"

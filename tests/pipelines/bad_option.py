"""A step with an option that does not exist: refused where it is written, on line 8."""

from __future__ import annotations

from orchestrator.pipeline import step


@step(agent="claude", merge="sometimes")
def plan(task: str) -> str:
    return f"Plan {task}"

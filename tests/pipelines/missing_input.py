"""A step that misspells its dependency: `plann` becomes a run input nobody gives."""

from __future__ import annotations

from orchestrator.pipeline import step


@step(agent="claude")
def plan(task: str, style: str = "terse") -> str:
    return f"Plan {task}, {style}"


@step(agent="claude")
def implement(plann: object) -> str:
    return f"Implement {plann}"

"""A diamond: one plan, two agent steps from it (defined out of alphabetical order), one join."""

from __future__ import annotations

from orchestrator.pipeline import step


@step(agent="claude")
def plan(task: str) -> str:
    """Write a short plan."""
    return f"Write a short plan for: {task}"


@step(agent="codex")
def frontend(plan: object) -> str:
    """Build the frontend."""
    return f"Build the frontend of this plan:\n{plan}"


@step(agent="claude")
def backend(plan: object) -> str:
    """Build the backend."""
    return f"Build the backend of this plan:\n{plan}"


@step
def report(frontend: object, backend: object, workdir: str) -> str:
    """Join both halves."""
    return f"{workdir}: {frontend} + {backend}"

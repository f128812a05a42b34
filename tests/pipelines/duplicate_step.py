"""Two steps named `plan`: the second `def` rebinds the name, the loader still sees both."""

from __future__ import annotations

from orchestrator.pipeline import step


@step(agent="claude")
def plan(task: str) -> str:
    return f"Plan {task}"


@step(agent="codex")  # type: ignore[no-redef]
def plan(task: str) -> str:  # noqa: F811
    return f"Plan {task} differently"


@step
def done(plan: object) -> object:
    return plan

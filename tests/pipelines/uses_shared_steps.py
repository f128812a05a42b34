"""A pipeline that imports a step from a module beside it."""

from __future__ import annotations

from shared_steps import lint  # noqa: F401 (a step of this pipeline)

from orchestrator.pipeline import step

HERE = __file__


@step(agent="claude")
def fix(lint: int) -> str:  # noqa: F811 (depends on the imported step)
    return f"Fix the {lint} lint findings"


@step
def summary(fix: object) -> str:
    return str(fix)

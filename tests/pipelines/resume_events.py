"""For tests/test_run_events.py: two demo agents create a file each (``edit[a]``, ``edit[b]``),
then ``check`` fails until the file named by the run input ``ready`` exists, then ``final``."""

from __future__ import annotations

from pathlib import Path

from orchestrator.pipeline import step
from orchestrator.pipeline.results import Results, StepContext


@step(agent=["a=demo", "b=demo"])
def edit(ctx: StepContext) -> str:
    """Each agent creates its own file."""
    return f'create {ctx.agent}.txt with "{ctx.agent}"'


@step
def check(edit: Results, ready: str) -> int:
    """Fails until ``ready`` exists (a resume then runs it again)."""
    if not Path(ready).exists():
        raise RuntimeError("not ready")
    return len(edit)


@step
def final(check: int) -> int:
    """Depends on the step that failed."""
    return check

"""For tests/test_run_events.py: three demo agents edit the same line of README.md
(``edit[a]``, ``edit[b]``, ``edit[c]``), then ``polite`` merges their branches
(``merge="fail"``), then ``final``."""

from __future__ import annotations

from orchestrator.pipeline import step
from orchestrator.pipeline.results import Results, StepContext, StepResult


@step(agent=["a=demo", "b=demo", "c=demo"])
def edit(ctx: StepContext) -> str:
    """Each agent puts its own greeting on the first line."""
    return f'replace "hello" with "hello from {ctx.agent}" in README.md'


@step(agent="demo", merge="fail")
def polite(edit: Results) -> str:
    """Runs only if the three branches merge."""
    return 'append "thanks" to README.md'


@step
def final(polite: StepResult) -> str:
    """Depends on the fan-in."""
    return polite.text

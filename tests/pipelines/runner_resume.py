"""For tests/test_runs.py: plan -> build -> check, and plan -> side; `build` is the flaky one.

The Python step `check` appends a line to the file named by the run input `tally`, so a test
can count how often it ran.
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.pipeline import step
from orchestrator.pipeline.results import StepResult


@step(agent="a")
def plan(task: str) -> str:
    return f"plan: {task}"


@step(agent="flaky")
def build(plan: StepResult) -> str:
    return f"build: {plan.text}"


@step
def check(build: StepResult, tally: str) -> str:
    with Path(tally).open("a") as f:
        f.write("check\n")
    return build.text


@step(agent="a")
def side(plan: StepResult) -> str:
    return f"side: {plan.text}"

"""Plan, implement several ways, review: a diamond of agent steps.

    orchestrator run pipelines/plan_implement_review.py --cwd ~/project --policy edit \\
        --set task='Add a --verbose flag to the CLI' --report report/

``plan`` writes a plan (read-only); the implementers work on it at once, each in its own
branch; ``review`` starts from the merge of their branches (``merge="union"`` keeps both sides
of overlapping edits, so the reviewer sees and settles them) and fixes what it finds.

Inputs: ``task`` (required), ``planner`` and ``reviewer`` (one agent each, default
``claude``) and ``implementers`` (a list, default claude, codex and gemini):
``--set implementers='["codex", "qwen"]' --set reviewer=codex``.
"""

from __future__ import annotations

from orchestrator import Results, StepResult, agent_input, agents_input, step

PIPELINE_NAME = "plan-implement-review"


@step(agent=agent_input("planner", default="claude"), policy="read-only", timeout=900)
def plan(task: str) -> str:
    """A short plan; no edits."""
    return (
        f"Write a short, numbered implementation plan for this task. Do not edit files.\n\n{task}"
    )


@step(
    agent=agents_input("implementers", default=["claude", "codex", "gemini"]),
    timeout=1800,
    idle_timeout=300,
)
def implement(plan: StepResult, task: str) -> str:
    """The implementers implement the plan independently."""
    return f"Task:\n{task}\n\nFollow this plan and implement it:\n{plan.text}"


@step(agent=agent_input("reviewer", default="claude"), merge="union", timeout=1800)
def review(implement: Results, task: str) -> str:
    """Review the merged implementations and leave one coherent version."""
    notes = "\n\n".join(f"## {name}\n{result.text}" for name, result in implement.items())
    return (
        f"Task:\n{task}\n\n{len(implement)} implementations were merged into this tree; where "
        "they overlap the file holds both versions one after the other. Keep one coherent "
        f"implementation, remove duplicates, and make the tests pass.\n\n"
        f"The implementers said:\n{notes}"
    )

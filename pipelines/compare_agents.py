"""The same task to several agents, each in its own branch, then a summary of their work.

    orchestrator run pipelines/compare_agents.py --cwd ~/project --policy edit \\
        --set task='Fix the failing test in tests/test_parser.py' --report report/

Inputs: ``task`` (required) and ``agents`` (the agents to compare, default claude, codex and
gemini: ``--set agents='["claude", "qwen"]'``; labels tell one agent apart on two models or
commands, ``--set agents='["a=demo", "b=demo"]'``).

The report shows the agents side by side; apply the winner's branch with
``orchestrator apply RUN --step implement[NAME]``. (``orchestrator compare`` does the same
from the command line without a file.)
"""

from __future__ import annotations

from orchestrator import Results, agents_input, step

PIPELINE_NAME = "compare-agents"


@step(
    agent=agents_input("agents", default=["claude", "codex", "gemini"]),
    timeout=1800,
    idle_timeout=300,
)
def implement(task: str) -> str:
    """Each agent does the task in its own branch."""
    return task


# the agents' branches are merged before this step forks its own; they usually overlap, and
# "ours" keeps the pipeline going (each branch stays in the run store, to apply on its own)
@step(merge="ours")
def scores(implement: Results) -> dict[str, object]:
    """Per agent: files changed and how its turn ended."""
    return {
        name: {"files": len(result.changes), "stopReason": result.stop_reason}
        for name, result in implement.items()
    }


@step()
def summary(scores: dict[str, object]) -> str:
    """A one-line summary per agent."""
    return "\n".join(f"{name}: {info}" for name, info in scores.items())

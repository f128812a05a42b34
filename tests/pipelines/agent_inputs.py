"""A fan-out over the agents a run input lists, then a gate that fails until a file exists."""

from __future__ import annotations

from pathlib import Path

from orchestrator import Results, agents_input, step


@step(agent=agents_input("agents", default=["demo"]))
def implement(task: str) -> str:
    return task


@step()
def gate(implement: Results, flag: str) -> list[str]:
    """The agents that implemented, once ``flag`` exists."""
    if not Path(flag).exists():
        raise RuntimeError(f"{flag} does not exist yet")
    return list(implement)

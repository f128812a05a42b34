"""For tests/test_runs.py: a cycle between two agent steps (refused before any agent starts)."""

from __future__ import annotations

from orchestrator.pipeline import step


@step(agent="a")
def draft(review: object) -> str:
    return f"Draft again after {review}"


@step(agent="a")
def review(draft: object) -> str:
    return f"Review {draft}"

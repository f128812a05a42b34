"""A cycle: plan needs review, review needs plan (and `start` is fine)."""

from __future__ import annotations

from orchestrator.pipeline import step


@step
def start() -> str:
    return "go"


@step(agent="claude")
def plan(start: str, review: object) -> str:
    return f"{start}: plan again after {review}"


@step(agent="claude")
def review(plan: object) -> str:
    return f"Review {plan}"

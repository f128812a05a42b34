"""Steps kept in a module of their own, for pipelines beside it to import."""

from __future__ import annotations

from orchestrator.pipeline import step


@step
def lint(paths: list[str]) -> int:
    """Count the paths to lint."""
    return len(paths)


@step
def fmt(paths: list[str]) -> int:
    """Not imported by uses_shared_steps, so not part of it."""
    return len(paths)

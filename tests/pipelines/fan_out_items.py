"""Fan-out over items, then over agents, and a conditional step."""

from __future__ import annotations

from typing import Any

from orchestrator.pipeline import step

PIPELINE_NAME = "rewrite-each-file"


@step
def files(pattern: str = "*.py") -> list[str]:
    """The files to rewrite."""
    return [f"a{pattern[1:]}", f"b{pattern[1:]}"]


@step(agent="claude", over="files", merge="union", retries=1, timeout=600)
def transform(item: str, instructions: str) -> str:
    """Rewrite one file."""
    return f"In {item}: {instructions}"


@step(agent=["claude", "codex"], budget=5000)
def review(transform: Any) -> list[dict[str, str]]:
    """Review every rewrite."""
    return [{"type": "text", "text": f"Review {len(transform)} rewrites"}]


@step(when=lambda transform: len(transform) > 1)
async def verify(transform: Any, workdir: str, pattern: str = "*.py") -> int:
    """Run the checks in the merged tree."""
    return len(transform)

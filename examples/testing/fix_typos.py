"""A pipeline to test offline: the demo agent fixes a spelling in the docs, a reviewer reviews.

``reviewer`` is no agent the orchestrator knows: a test serves it from a script
(``examples/testing/test_fix_typos.py``); a real run would name a real agent.
"""

from __future__ import annotations

from orchestrator import StepResult, step


@step(agent="demo")
def fix() -> str:
    """Fix the spelling in the Markdown files."""
    return 'replace "colour" with "color" in **/*.md\n'


@step(agent="reviewer")
def review(fix: StepResult) -> str:
    """Review what the fix changed."""
    changed = ", ".join(path for path, _ in fix.changes)
    return f"Review the change to {changed}:\n{fix.diff}"

"""A pipeline whose import fails on line 5."""

from __future__ import annotations

import no_such_module_for_pipeline_tests  # type: ignore[import-not-found]  # noqa: F401

from orchestrator.pipeline import step


@step
def never() -> str:
    return "unreachable"

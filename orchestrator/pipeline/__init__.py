"""Pipelines: steps declared with :func:`step` in a Python file, loaded into a validated graph.

See ``spec`` (declaring steps, the :class:`Pipeline` graph) and ``loader`` (pipeline files).
"""

from __future__ import annotations

from ..errors import PipelineError
from ._rounds import default_feedback
from .loader import load_pipeline, load_pipeline_from_module
from .results import CheckResult
from .spec import (
    MERGE_STRATEGIES,
    RESERVED_PARAMS,
    AgentInput,
    Budget,
    InputKind,
    InputSpec,
    MergeStrategy,
    Pipeline,
    Step,
    agent_input,
    agents_input,
    step,
)

__all__ = [
    "MERGE_STRATEGIES",
    "RESERVED_PARAMS",
    "AgentInput",
    "Budget",
    "CheckResult",
    "InputKind",
    "InputSpec",
    "MergeStrategy",
    "Pipeline",
    "PipelineError",
    "Step",
    "agent_input",
    "agents_input",
    "default_feedback",
    "load_pipeline",
    "load_pipeline_from_module",
    "step",
]

"""Pipelines: steps declared with :func:`step` in a Python file, loaded into a validated graph.

See ``spec`` (declaring steps, the :class:`Pipeline` graph) and ``loader`` (pipeline files).
"""

from __future__ import annotations

from ..errors import PipelineError
from .loader import load_pipeline, load_pipeline_from_module
from .spec import (
    MERGE_STRATEGIES,
    RESERVED_PARAMS,
    Budget,
    InputSpec,
    MergeStrategy,
    Pipeline,
    Step,
    step,
)

__all__ = [
    "MERGE_STRATEGIES",
    "RESERVED_PARAMS",
    "Budget",
    "InputSpec",
    "MergeStrategy",
    "Pipeline",
    "PipelineError",
    "Step",
    "load_pipeline",
    "load_pipeline_from_module",
    "step",
]

"""Declaring pipeline steps, and the validated graph they form.

A pipeline is a set of functions decorated with :func:`step`. A step's name is its function's
name; its parameter names are what it depends on: other steps, or *run inputs* (names no step
defines, given when the pipeline runs). A step's agents may be a run input too
(``agent=agent_input(...)``, ``agents_input(...)``), bound by :meth:`Pipeline.with_agents`.
:meth:`Pipeline.from_steps` checks the whole graph at once and reports every problem in one
:class:`~orchestrator.errors.PipelineError`.

Nothing here runs a step: this layer only describes (see ``pipeline/runner.py`` for that).
The code lives in ``_values`` (option values and their checks), ``_step`` (:class:`Step`,
:func:`step`) and ``_graph`` (:class:`Pipeline`, :class:`InputSpec`); this module is where
they are imported from.
"""

from __future__ import annotations

from ._graph import InputKind, InputSpec, Pipeline
from ._step import Step, collect_steps, step
from ._values import (
    MERGE_STRATEGIES,
    RESERVED_PARAMS,
    AgentInput,
    Budget,
    MergeStrategy,
    agent_input,
    agents_input,
)

__all__ = [
    "MERGE_STRATEGIES",
    "RESERVED_PARAMS",
    "AgentInput",
    "Budget",
    "InputKind",
    "InputSpec",
    "MergeStrategy",
    "Pipeline",
    "Step",
    "agent_input",
    "agents_input",
    "collect_steps",
    "step",
]

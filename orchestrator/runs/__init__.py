"""The library API for runs: prompts, pipelines, comparisons, resume, apply, and the run store.

Every run goes one way: resolved through :class:`~orchestrator.config.Config`, started through
the supervisor, recorded in the run store before anything is applied, and applied by one apply
path. Each function has an ``async`` form for trio code and a ``*_sync`` twin for scripts.
"""

from __future__ import annotations

from .apply import ApplyOutcome, apply_run, apply_run_sync, recover
from .compare import compare, compare_sync
from .default_policy import DefaultRejections
from .outcomes import (
    AgentIdentity,
    AgentOutcome,
    FileChange,
    InstanceOutcome,
    PermissionEntry,
    StepOutcome,
    ToolCallEntry,
    VerifyEntry,
)
from .prompt import PromptRun, prompt, prompt_sync
from .recorded import diff_run, get_run_json, list_runs
from .resume import resume_run, resume_run_sync
from .run import RunOutcome, run_pipeline, run_pipeline_sync
from .verdict import Verdict

__all__ = [
    "AgentIdentity",
    "AgentOutcome",
    "ApplyOutcome",
    "DefaultRejections",
    "FileChange",
    "InstanceOutcome",
    "PermissionEntry",
    "PromptRun",
    "RunOutcome",
    "StepOutcome",
    "ToolCallEntry",
    "Verdict",
    "VerifyEntry",
    "apply_run",
    "apply_run_sync",
    "compare",
    "compare_sync",
    "diff_run",
    "get_run_json",
    "list_runs",
    "prompt",
    "prompt_sync",
    "recover",
    "resume_run",
    "resume_run_sync",
    "run_pipeline",
    "run_pipeline_sync",
]

"""The library API for runs: prompts, pipelines, comparisons, resume, replay, apply, pruning,
and the run store.

Every run goes one way: resolved through :class:`~orchestrator.config.Config`, started through
the supervisor, recorded in the run store before anything is applied, and applied by one apply
path. The functions here are trio's; :mod:`orchestrator.sync` and :mod:`orchestrator.aio` have
their twins for scripts and threads, and for asyncio.
"""

from __future__ import annotations

from .apply import ApplyOutcome, apply_run, recover
from .batch import BatchOutcome, RepoOutcome, batch, resume_batch
from .compare import compare
from .default_policy import DefaultRejections
from .outcomes import (
    AgentIdentity,
    AgentOutcome,
    BranchUsage,
    CheckEntry,
    FileChange,
    InstanceOutcome,
    PermissionEntry,
    RoundEntry,
    StepOutcome,
    ToolCallEntry,
    VerifyEntry,
)
from .prompt import PromptRun, prompt
from .prune import PrunedRun, PruneOutcome, SkippedRun, prune
from .recorded import diff_run, get_run_json, list_runs
from .replay import replay_run
from .resume import resume_run
from .run import RunOutcome, run_pipeline
from .verdict import Verdict

__all__ = [
    "AgentIdentity",
    "AgentOutcome",
    "ApplyOutcome",
    "BatchOutcome",
    "BranchUsage",
    "CheckEntry",
    "DefaultRejections",
    "FileChange",
    "InstanceOutcome",
    "PermissionEntry",
    "PromptRun",
    "PruneOutcome",
    "PrunedRun",
    "RepoOutcome",
    "RoundEntry",
    "RunOutcome",
    "SkippedRun",
    "StepOutcome",
    "ToolCallEntry",
    "Verdict",
    "VerifyEntry",
    "apply_run",
    "batch",
    "compare",
    "diff_run",
    "get_run_json",
    "list_runs",
    "prompt",
    "prune",
    "recover",
    "replay_run",
    "resume_batch",
    "resume_run",
    "run_pipeline",
]

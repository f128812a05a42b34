"""Resume: a recorded run again, finished instances reused with their branches."""

from __future__ import annotations

import os
from typing import Any

import structlog
import trio

from ..errors import UsageError
from ..pipeline import load_pipeline
from ..state import state_directory
from ..store import open_run_store
from .compare import _compare_config, _compare_pipeline
from .run import RunOutcome, run_pipeline

log = structlog.get_logger(__name__)

__all__ = ["resume_run", "resume_run_sync"]


async def resume_run(
    run_id: str,
    *,
    state_dir: str | os.PathLike[str] | None = None,
    **kwargs: Any,
) -> RunOutcome:
    """Run ``run_id`` again: finished instances are reused with their branches, the rest re-run.

    Refused (:class:`~orchestrator.pipeline.branches.ResumeConflict`, exit 3 on the command line)
    if the workspace changed since in files the finished steps changed. ``apply=True`` applies
    the run's final changes at its end (not for a comparison: apply one agent's afterwards).
    """
    state = state_directory(state_dir)
    async with open_run_store(state) as store:
        record = await store.get_run(run_id)
    if record.status == "running":
        log.warning("resuming a run still marked running", run=record.run_id)
    if record.kind == "compare":
        info = dict(record.options).get("compare") or {}
        names = list(info.get("agents") or [])
        if kwargs.get("apply"):
            # the agents' branches are alternatives: which one to apply is a choice
            choices = ", ".join(f"compare[{name}]" for name in names)
            raise UsageError(
                f"run {record.run_id} is a comparison: resume it without applying, then "
                f"apply one agent's changes ({choices})"
            )
        pipe = _compare_pipeline(
            str(info.get("task", "")), names, info.get("timeout"), info.get("idle_timeout")
        )
        kwargs.setdefault("verify", dict(record.options).get("verify") or {})
        if "config" not in kwargs:
            kwargs["config"] = _compare_config(record.cwd, names, info.get("commands") or {})
    else:
        if not record.pipeline:
            raise UsageError(f"run {record.run_id} has no pipeline to resume")
        pipe = load_pipeline(record.pipeline)
        if pipe.digest != record.pipeline_digest:
            log.warning("the pipeline file changed since the run", pipeline=record.pipeline)
    return await run_pipeline(
        pipe,
        dict(record.inputs),
        cwd=record.cwd,
        state_dir=state,
        _kind="compare" if record.kind == "compare" else "pipeline",
        _resume=record.run_id,
        **kwargs,
    )


def resume_run_sync(run_id: str, **kwargs: Any) -> RunOutcome:
    """:func:`resume_run` for scripts: runs its own trio loop."""
    return trio.run(lambda: resume_run(run_id, **kwargs))

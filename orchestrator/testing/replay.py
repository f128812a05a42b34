"""Replay in tests: a pipeline run against a recorded run, offline, deterministic, in seconds.

Keep a run beside your tests as a replay record (``orchestrator replay RUN --save
tests/records/NAME.json``) with the workspace it ran on, then:

:func:`assert_replays`
    Replay the record (with your pipeline file as it is now, or the recorded one) on that
    workspace, every agent served in the test's process by its replay agent, and fail the test
    with every divergence from the record, per step. Returns the run
    (:class:`~orchestrator.runs.RunOutcome`) for further checks.
:func:`replay_connector`
    The connector serving a record's agents (:class:`~orchestrator.runs.replay.ReplayAgents`)
    to pass as ``connector=`` to :func:`~orchestrator.runs.run_pipeline` yourself: the
    divergences are in its ``divergences`` once the run returned.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from orchestrator.replay.record import ReplayRecord, load_record
from orchestrator.runs.replay import ReplayAgents, Timing

if TYPE_CHECKING:
    from orchestrator.pipeline import Pipeline
    from orchestrator.policy import PolicySet
    from orchestrator.runs import RunOutcome

__all__ = ["ReplayAgents", "assert_replays", "replay_connector"]


def replay_connector(
    record: ReplayRecord | str | os.PathLike[str],
    *,
    strict: bool = True,
    timing: Timing = "fast",
    in_process: bool = True,
) -> ReplayAgents:
    """A connector that serves every agent of a run from ``record`` (a record, or its file):
    in the test's process, or with ``in_process=False`` as ``python -m orchestrator.replay``
    subprocesses (then call its ``close()`` once the run returned: it deletes the record
    file they read). ``strict`` (the default here) fails a step at its first divergence."""
    loaded = record if isinstance(record, ReplayRecord) else load_record(record)
    return ReplayAgents(loaded, strict=strict, timing=timing, in_process=in_process)


def assert_replays(
    record: ReplayRecord | str | os.PathLike[str],
    pipeline: Pipeline | str | os.PathLike[str] | None = None,
    *,
    cwd: str | os.PathLike[str],
    policy: str | os.PathLike[str] | PolicySet | None = None,
    strict: bool = True,
    state_dir: str | os.PathLike[str] | None = None,
) -> RunOutcome:
    """Replay ``record`` on ``cwd`` (the workspace as the run found it) and fail with an
    ``AssertionError`` naming every divergence, every turn that could not be replayed, and
    a run that did not succeed.

    ``pipeline`` is the pipeline to run (default: the text the run recorded); ``policy``
    replaces the recorded one. The agents are served in this process (no agent process, no
    model, no network). Call it from plain (sync) test code; the state directory is
    ``state_dir``, else the environment's (the pytest plugin's ``orchestrator_state_dir``
    sets it).
    """
    from orchestrator.sync import replay_run_sync

    loaded = record if isinstance(record, ReplayRecord) else load_record(record)
    run = replay_run_sync(
        loaded,
        pipeline,
        cwd=cwd,
        policy=policy,
        strict=strict,
        state_dir=state_dir,
        in_process=True,
    )
    replay = dict(run.result.get("replay") or {})
    problems = [
        f"{item.get('step')} (attempt {item.get('attempt')}, turn {item.get('turn')}) "
        f"{item.get('kind')}: {item.get('detail')}"
        for item in [*(replay.get("divergences") or ()), *(replay.get("notReplayable") or ())]
        if isinstance(item, dict)
    ]
    if run.status != "succeeded":
        problems.append(f"the replay run {run.run_id} {run.status}")
    if problems:
        raise AssertionError(
            f"the replay of run {loaded.run_id} differs from the record:\n  "
            + "\n  ".join(problems)
        )
    return run

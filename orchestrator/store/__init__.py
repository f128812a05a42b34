"""The run store: every run recorded in SQLite, to list, show, resume and apply it later.

``orchestrator prompt``, ``compare`` and ``run`` record a :class:`RunRecord` per run, a
:class:`StepRecord` per step, the agent session of each attempt (:class:`SessionRecord`), each
step's change set (:class:`StoredChange`, contents stored once per SHA-256), its own changes and
diffs, the pipeline file's text, wire transcripts, permission decisions, merge conflicts, a
timeline and what was applied (:class:`ApplyRecord`), in ``<state_dir>/runs.sqlite3``. Typical
use::

    async with open_run_store(state_directory()) as store:
        await store.create_run(RunRecord(run_id, "pipeline", "running", time.time(), cwd))
        await store.put_step(StepRecord(run_id, "plan", "plan", agent="claude", status="running"))
        ...
        await store.update_run(run_id, status="succeeded", finished=time.time())

    async with open_run_store(state_directory()) as store:   # later, maybe another process
        run = await store.get_run("3f2a")                     # a unique prefix is enough
        for step in await store.steps(run.run_id): ...

Several writes can go in one thread hop and one transaction (all or nothing)::

    await store.write_many([PutStep(step), AddEvent(run_id, event), UpdateRun(run_id, {...})])

The database is in WAL mode (readers and one writer at a time, across processes) and carries
its schema version; older files are migrated when opened, newer ones are refused
(:class:`~orchestrator.errors.StoreVersionError`).
"""

from __future__ import annotations

from ._schema import SCHEMA_VERSION
from .ops import (
    AddConflicts,
    AddEvent,
    AddPermissions,
    PutChanges,
    PutSession,
    PutStep,
    StoreOp,
    UpdateRun,
)
from .records import (
    BASE_UNKNOWN,
    CHANGE_KINDS,
    RUN_KINDS,
    RUN_STATUSES,
    STEP_STATUSES,
    ApplyRecord,
    ChangeEntry,
    ChangeKind,
    RunKind,
    RunRecord,
    SessionRecord,
    StepRecord,
    StoredChange,
)
from .runstore import STORE_FILENAME, RunStore, open_run_store

__all__ = [
    "BASE_UNKNOWN",
    "CHANGE_KINDS",
    "RUN_KINDS",
    "RUN_STATUSES",
    "SCHEMA_VERSION",
    "STEP_STATUSES",
    "STORE_FILENAME",
    "AddConflicts",
    "AddEvent",
    "AddPermissions",
    "ApplyRecord",
    "ChangeEntry",
    "ChangeKind",
    "PutChanges",
    "PutSession",
    "PutStep",
    "RunKind",
    "RunRecord",
    "RunStore",
    "SessionRecord",
    "StepRecord",
    "StoreOp",
    "StoredChange",
    "UpdateRun",
    "open_run_store",
]

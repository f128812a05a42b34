"""Recording a run as it happens: events for the listener, step records and changes for the store.

Everything goes through the run store's write-behind queue (:class:`StoreWriter`), so recording
never waits; a failing listener is logged and ignored.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from attrs import define

from .._log import get_logger
from ..agent.turn import DEFAULT_MAX_TURN_RECORD_BYTES
from ..errors import ErrorKind
from ..store import (
    AddConflicts,
    AddEvent,
    AddPermissions,
    PutChanges,
    PutSession,
    PutStep,
    SessionRecord,
    StepRecord,
    StoredChange,
)
from ..vfs import Branch, ChangeSet, Delete, ModeChange, Snapshot, Write
from ._branchstate import branch_diffs
from ._calls import stored_value
from ._writer import StoreWriter
from .branches import stored_changes
from .results import EventType, RunEvent, StepResult, StepStatus
from .spec import Step

__all__ = ["EventSink", "Recorder", "notify", "own_changes"]

log = get_logger(__name__)

EventSink = Callable[[RunEvent], None]


def call_listener(listener: Callable[[Any], object], value: Any, **fields: Any) -> None:
    """``listener(value)``: a caller's callback (``on_event``, ``on_update``), in every face.
    One that fails (a progress view that cannot draw) is logged as ``event listener failed``
    with ``fields`` and ignored: it does not fail the run, whose work and record go on."""
    try:
        listener(value)
    except Exception:
        log.exception("event listener failed", **fields)


def notify(on_event: EventSink | None, event: RunEvent) -> None:
    """Give ``event`` to the run's listener, if any (see :func:`call_listener`)."""
    if on_event is not None:
        call_listener(on_event, event, event_type=event.type)


def own_changes(branch: Branch) -> list[StoredChange]:
    """The branch's own changes (against what it forked from) as the store keeps them: each a
    ``write`` with the content and mode the path has now (a mode change too), or a ``delete``.

    A change back to the content it forked from is kept (the agent wrote it). Each says what
    it forked from there (``base_digest``: the SHA-256 of that file, None if there was none).
    """
    out: list[StoredChange] = []
    for path, change in sorted(branch.changes.items()):
        base = branch.base.digest(path)
        if isinstance(change, Write):
            out.append(StoredChange(path, "write", change.data, change.mode, base))
        elif isinstance(change, ModeChange):
            state = branch.state(path)
            if state is not None:  # a mode change of a path that is gone changes nothing
                out.append(StoredChange(path, "write", state.data, change.mode, base))
        elif isinstance(change, Delete):
            out.append(StoredChange(path, "delete", base_digest=base))
    return out


@define(eq=False)
class Recorder:
    """Writes one run's events, step records and changes (see the module docstring)."""

    run_id: str
    writer: StoreWriter
    #: the run's base, what stored changes are relative to
    snapshot: Snapshot
    on_event: EventSink | None = None
    #: what the store keeps of a turn's text and tool calls, in bytes each (None: all)
    max_turn_bytes: int | None = DEFAULT_MAX_TURN_RECORD_BYTES

    # ------------------------------------------------------------------ events

    def emit(self, event: RunEvent) -> None:
        """Report ``event`` to the listener and keep it in the store."""
        self.notify(event)
        self.writer.put(AddEvent(self.run_id, event.to_json()))

    def notify(self, event: RunEvent) -> None:
        """Report ``event`` to the listener only (session updates are not stored)."""
        notify(self.on_event, event)

    # ------------------------------------------------------------------ whole steps

    def put_step(self, record: StepRecord) -> None:
        """Store ``record`` (it replaces any earlier record with its key)."""
        self.writer.put(PutStep(record))

    def session(self, name: str, attempt: int, agent: str, source: str, session_id: str) -> None:
        """Attempt ``attempt`` of instance ``name`` runs in session ``session_id`` of ``agent``,
        on the process whose transcript is ``source`` (``claude#2``)."""
        self.writer.put(
            PutSession(SessionRecord(self.run_id, name, attempt, agent, source, session_id))
        )

    def skipped(self, step: str, cause: str, finished: float) -> None:
        """``step`` was skipped, because of ``cause``."""
        self._end_step(step, "skipped", cause=cause, finished=finished)

    def conflicts(self, step: str, conflicts: list[dict[str, Any]]) -> None:
        """The conflicts (as JSON) found merging ``step``'s parents, resolved or not."""
        self.writer.put(AddConflicts(self.run_id, step, list(conflicts)))
        for c in conflicts:
            self.emit(
                RunEvent(
                    "conflict",
                    self.run_id,
                    step,
                    data={
                        k: c[k]
                        for k in ("path", "pathBytes", "kind", "branches", "resolution")
                        if k in c
                    },
                )
            )

    def step_failed(
        self,
        step: str,
        error: str,
        kind: ErrorKind,
        started: float | None,
        finished: float,
        *,
        traceback: str | None = None,
    ) -> None:
        """``step`` failed as a whole (before any instance ran), with ``error``."""
        self._end_step(
            step,
            "failed",
            error=error,
            error_kind=kind,
            started=started,
            finished=finished,
            traceback=traceback,
        )

    def no_instances(self, step: str, started: float | None, finished: float) -> None:
        """``step`` fanned out over nothing: it succeeded without any instance.

        Its own record is all the store has of it (there is no instance to derive it from).
        """
        self._end_step(step, "succeeded", started=started, finished=finished)

    def _end_step(self, step: str, status: StepStatus, **fields: Any) -> None:
        """``step`` itself (not an instance of it) ended in ``status``: its record, and its one
        ending event, the one that matches ``status`` (a step that failed or was skipped is
        never also reported finished)."""
        self.put_step(
            StepRecord(
                run_id=self.run_id,
                key=step,
                step=step,
                instance=None,
                agent=None,
                status=status,
                **fields,
            )
        )
        data: dict[str, Any]
        kind: EventType
        if status == "failed":
            kind, data = (
                "step_failed",
                {"error": fields["error"], "errorKind": fields["error_kind"]},
            )
        elif status == "skipped":
            kind, data = "step_skipped", {"cause": fields["cause"]}
        else:
            kind, data = "step_finished", {"status": status, "changes": 0}
        self.emit(RunEvent(kind, self.run_id, step, data=data))

    # ------------------------------------------------------------------ instances

    def record(
        self,
        name: str,
        step: Step,
        key: str | None,
        agent: str | None,
        status: StepStatus,
        attempt: int,
        *,
        started: float | None = None,
        error: str | None = None,
        error_kind: ErrorKind | None = None,
        traceback: str | None = None,
    ) -> None:
        """The instance ``name`` of ``step`` is in ``status`` (finished now unless running)."""
        self.put_step(
            StepRecord(
                run_id=self.run_id,
                key=name,
                step=step.name,
                instance=key,
                agent=agent,
                status=status,
                attempt=attempt,
                started=started,
                finished=time.time() if status not in ("running", "pending") else None,
                error=error,
                error_kind=error_kind,
                traceback=traceback,
            )
        )

    def finish(
        self,
        name: str,
        step: Step,
        key: str | None,
        agent: str | None,
        output: Any,
        branch: Branch,
        attempt: int,
        started: float,
        diffs: tuple[ChangeSet, str, str] | None,
        *,
        traceback: str | None = None,
    ) -> None:
        """The instance ended (or was interrupted): close its branch, store its changes and outcome.

        ``diffs`` are the branch's diffs if already computed (at its last harvest);
        ``traceback`` that of the exception that failed it, if one did.
        """
        branch.close()
        result = output if isinstance(output, StepResult) else None
        value, stored = (None, False) if result is not None else stored_value(output)
        status: StepStatus = result.status if result is not None else "succeeded"
        net, run_diff, own_diff = diffs if diffs is not None else branch_diffs(branch)
        if result is not None:
            own_diff = result.diff
        self.writer.put(
            PutChanges(
                self.run_id,
                name,
                stored_changes(self.snapshot, net),
                run_diff,
                own_diff,
                own_changes(branch),
            )
        )
        if result is not None and result.permissions:
            self.writer.put(
                AddPermissions(self.run_id, name, [dict(p) for p in result.permissions])
            )
        self.put_step(
            StepRecord(
                run_id=self.run_id,
                key=name,
                step=step.name,
                instance=key,
                agent=agent,
                status=status,
                attempt=attempt,
                started=started,
                finished=time.time(),
                session_id=result.session_id if result else None,
                result=result.to_json(max_turn_bytes=self.max_turn_bytes) if result else None,
                value=value,
                value_stored=stored,
                error=result.error if result else None,
                error_kind=result.error_kind if result else None,
                usage=result.usage if result else None,
                traceback=traceback,
            )
        )
        if status == "interrupted":
            return  # the run reports its interruption as a whole
        data: dict[str, Any] = {"status": status, "changes": len(branch.changes)}
        if result is not None:
            data.update(stopReason=result.stop_reason, wallSeconds=round(result.wall_seconds, 3))
            if result.error:
                data["error"] = result.error
                data["errorKind"] = result.error_kind
        kind: EventType = "step_finished" if status == "succeeded" else "step_failed"
        self.emit(RunEvent(kind, self.run_id, step.name, key, agent, data))

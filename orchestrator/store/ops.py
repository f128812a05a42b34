"""Writes to the run store as values, to hand several to :meth:`RunStore.write_many` at once.

Each op mirrors one write method of :class:`~orchestrator.store.RunStore` and takes the same
arguments; ``store.write_many([PutStep(a), AddEvent(run_id, e)])`` does what
``await store.put_step(a); await store.add_event(run_id, e)`` does, in that order, but in one
worker-thread hop and one transaction: every op lands or none does. Ops check what they can when
they are made (as the methods check their arguments before touching the database).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any, TypeAlias

from attrs import field, frozen

from ._rows import RUN_UPDATABLE
from .records import SessionRecord, StepRecord, StoredChange

__all__ = [
    "AddConflicts",
    "AddEvent",
    "AddPermissions",
    "PutChanges",
    "PutSession",
    "PutStep",
    "StoreOp",
    "UpdateRun",
]


def _changes(value: Iterable[StoredChange]) -> tuple[StoredChange, ...]:
    return tuple(value)


def _records(value: Iterable[Mapping[str, Any]]) -> tuple[Mapping[str, Any], ...]:
    return tuple(value)


def _snapshot(value: Mapping[str, Any]) -> Mapping[str, Any]:
    # an op is a value: changing the caller's dict afterwards must not change what is written
    return MappingProxyType(dict(value))


@frozen
class PutStep:
    """:meth:`~orchestrator.store.RunStore.put_step`: record a step, replacing its old record."""

    step: StepRecord


@frozen
class PutChanges:
    """:meth:`~orchestrator.store.RunStore.put_changes`: a step's change set and its diffs.

    Raises :class:`ValueError` when a path appears twice in ``changes``.
    """

    run_id: str
    #: the step key the change set belongs to
    key: str
    changes: tuple[StoredChange, ...] = field(converter=_changes)
    #: the unified diff against the run's base
    diff: str
    #: the step's own changes against what it forked from
    own_diff: str = ""
    #: the step's own changes as values (``write`` or ``delete``, no base digest): what a
    #: replay writes where the agent wrote behind the client's back
    own: tuple[StoredChange, ...] = field(converter=_changes, default=())

    def __attrs_post_init__(self) -> None:
        for changes, what in ((self.changes, "change set"), (self.own, "own change set")):
            seen: set[str] = set()
            for change in changes:
                if change.path in seen:
                    raise ValueError(
                        f"path {change.path!r} appears twice in the {what} of {self.key!r}"
                    )
                seen.add(change.path)
        for change in self.own:
            if change.kind == "mode":
                raise ValueError(
                    f"the own change of {change.path!r} in {self.key!r} is a mode change: "
                    "own changes are writes (content and mode) or deletions"
                )


@frozen
class PutSession:
    """:meth:`~orchestrator.store.RunStore.put_session`: the session that served an attempt."""

    session: SessionRecord


@frozen
class AddPermissions:
    """:meth:`~orchestrator.store.RunStore.add_permissions`: append permission decisions."""

    run_id: str
    key: str
    records: tuple[Mapping[str, Any], ...] = field(converter=_records)


@frozen
class AddConflicts:
    """:meth:`~orchestrator.store.RunStore.add_conflicts`: append merge conflicts of a step."""

    run_id: str
    key: str
    conflicts: tuple[Mapping[str, Any], ...] = field(converter=_records)


@frozen
class AddEvent:
    """:meth:`~orchestrator.store.RunStore.add_event`: append an event to the run's timeline."""

    run_id: str
    event: Mapping[str, Any] = field(converter=_snapshot)


@frozen
class UpdateRun:
    """:meth:`~orchestrator.store.RunStore.update_run`: change fields of a run.

    Raises :class:`TypeError` for a field that cannot change; the values are validated when the
    op is written, as :class:`~orchestrator.store.RunRecord` validates them.
    """

    run_id: str
    fields: Mapping[str, Any] = field(converter=_snapshot)

    def __attrs_post_init__(self) -> None:
        unknown = set(self.fields) - RUN_UPDATABLE
        if unknown:
            raise TypeError(f"update_run: not a changeable run field: {', '.join(sorted(unknown))}")


#: one write for :meth:`~orchestrator.store.RunStore.write_many`
StoreOp: TypeAlias = (
    PutStep | PutChanges | PutSession | AddPermissions | AddConflicts | AddEvent | UpdateRun
)

"""Recorded runs: list them, show one as its ``--json`` object, print its diff."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
import trio

from .._names import display_names, name_json
from .._words import count
from ..errors import UsageError
from ..pipeline.branches import FINAL
from ..state import state_directory
from ..store import RunRecord, RunStore, StepRecord, open_run_store
from ._face import check_trio_face
from ._lock import run_owner
from .default_policy import count_default_rejections
from .verdict import Verdict, judge

__all__ = [
    "LATER",
    "compare_agent_json",
    "compare_verdict",
    "did_nothing",
    "diff_run",
    "finished_run_json",
    "get_run",
    "get_run_json",
    "list_runs",
    "no_such_step",
    "rebuild_run_json",
]


async def diff_run(
    run_id: str, *, step: str | None = None, state_dir: str | os.PathLike[str] | None = None
) -> str:
    """The unified diff of a run's changes (or one step's), as stored."""
    check_trio_face("diff_run")  # before anything starts
    async with open_run_store(state_directory(state_dir)) as store:
        record = await store.get_run(run_id)
        steps = await store.steps(record.run_id)
        if step is None:
            # the final changes; before a run has them, what its instances did so far (an
            # interrupted one's changes as far as it got)
            keys = (
                [FINAL]
                if FINAL in await store.change_keys(record.run_id)
                else [s.key for s in steps if s.status in ("succeeded", "interrupted")]
            )
        else:
            keys = [s.key for s in steps if s.key == step or s.step == step]
            if not keys:
                raise no_such_step(record.run_id, step, steps)
        return "".join([await store.diff(record.run_id, key) for key in keys])


def no_such_step(run_id: str, step: str, steps: Sequence[StepRecord]) -> UsageError:
    """The error for ``step`` (a step name or ``STEP[KEY]``) that names none of the run's
    ``steps``; it lists those that finished."""
    known = sorted({s.key for s in steps if s.status == "succeeded"})
    return UsageError(f"run {run_id} has no step {step!r} (finished: {', '.join(known) or 'none'})")


async def list_runs(
    *, state_dir: str | os.PathLike[str] | None = None, limit: int | None = 50
) -> list[RunRecord]:
    """The recorded runs, newest first; one recorded ``running`` whose process is gone reads
    ``interrupted`` (see :func:`as_seen`)."""
    check_trio_face("list_runs")  # before anything starts
    async with open_run_store(state_directory(state_dir)) as store:
        return [(await as_seen(r, store))[0] for r in await store.list_runs(limit=limit)]


async def as_seen(
    record: RunRecord, store: RunStore, steps: list[StepRecord] | None = None
) -> tuple[RunRecord, list[StepRecord]]:
    """A run (and its step records) as they stand, not only as recorded.

    A process killed outright (SIGKILL, a crash, a reboot) leaves its run recorded ``running``:
    when the process that holds the run's lock is gone, the run reads ``interrupted`` with
    :attr:`~orchestrator.store.RunRecord.status_reason` ``its process is gone``, and its running
    and pending steps ``interrupted``, as an interrupted run's are (a resume goes on with it).
    When that cannot be checked from here (another machine, container or boot shares the state
    directory; a run recorded by an older release), it stays ``running`` with the reason.
    """
    steps = list(steps or ())
    if record.status != "running":
        return record, steps
    run_dir = store.path.parent / "runs" / record.run_id
    owner = await trio.to_thread.run_sync(run_owner, run_dir)
    if owner.state == "alive":
        return record, steps
    if owner.state == "unknown":
        return attrs.evolve(record, status_reason=owner.reason), steps
    record = attrs.evolve(record, status="interrupted", status_reason=owner.reason)
    steps = [
        attrs.evolve(s, status="interrupted") if s.status in ("running", "pending") else s
        for s in steps
    ]
    return record, steps


def _step_entry() -> dict[str, Any]:
    """A step's entry in a run's ``--json`` object before any of its records is read."""
    return {
        "status": "pending",
        "instances": {},
        "error": None,
        "errorKind": None,
        "cause": None,
        "traceback": None,
    }


async def get_run_json(
    run_id: str, *, state_dir: str | os.PathLike[str] | None = None, store: RunStore | None = None
) -> dict[str, Any]:
    """A run as its ``--json`` object: the one the run returned, as recorded at its end.

    What a later apply changes is read as it stands now (:data:`LATER`: ``applied``,
    ``appliedSteps``, a comparison's agents' ``applied``). A run with no such object (running,
    interrupted, crashed, or recorded by a release that kept none) is rebuilt from its records,
    without what only its process knew (``wallSeconds``, ``reused``, a resume's ``restored``).
    """
    check_trio_face("get_run_json")  # before anything starts
    if store is None:
        async with open_run_store(state_directory(state_dir)) as opened:
            return await get_run_json(run_id, store=opened)
    record = await store.get_run(run_id)
    record, steps = await as_seen(record, store, await store.steps(record.run_id))
    rebuilt = await _rebuild(record, steps, store)
    kept = _kept_result(record)
    if kept is None:
        nothing, warnings = did_nothing(rebuilt)
        return {**rebuilt, "didNothing": nothing, "warnings": list(warnings)}
    # the record's own fields fill in what an older release's object lacks
    shown = {**{k: rebuilt[k] for k in _RECORD_FIELDS}, **kept}
    shown.update((key, rebuilt[key]) for key in LATER if key in rebuilt)
    if record.kind == "compare" and isinstance(shown.get("agents"), list):
        written = {a.get("name"): a.get("applied") for a in rebuilt.get("agents") or ()}
        shown["agents"] = [
            {**a, "applied": written.get(a.get("name"), a.get("applied"))}
            if isinstance(a, dict)
            else a
            for a in shown["agents"]
        ]
    return shown


#: the fields of a run's object that change after its end: a later apply (``apply_run``) sets
#: them, as a comparison's agents' ``applied``; the rest is the object the run returned
LATER = ("applied", "appliedSteps")

#: the fields every run's object takes from its record
_RECORD_FIELDS = (
    "kind",
    "runId",
    "status",
    "statusReason",
    "cwd",
    "created",
    "finished",
    "sandbox",
    "mcpServers",
    "defaultRejections",
)


def _kept_result(record: RunRecord) -> dict[str, Any] | None:
    """The object the run returned, kept in its record, if it is the record's as it stands.

    A resume starts the run again (``finished`` cleared): the object of an earlier attempt is
    not this one's, whose end may never have come (interrupted, crashed) and kept none.
    """
    kept = record.result
    if not kept or kept.get("finished") != record.finished or kept.get("status") != record.status:
        return None
    return dict(kept)


def finished_run_json(
    rebuilt: Mapping[str, Any],
    *,
    wall_seconds: float,
    reused: Iterable[str],
    workspace_changed: Sequence[str],
    patch_left_out: Sequence[str],
    branches: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """The object a run returns at its end (and keeps in its record): its records' object
    (:func:`rebuild_run_json`) with what only its process knows."""
    result = {
        **rebuilt,
        "wallSeconds": round(wall_seconds, 3),
        # instances finished in an earlier attempt and reused by this resume
        "reused": sorted(reused),
        # asked to apply: the files that changed in the workspace during the run
        "workspaceChanged": display_names(workspace_changed),
        # changed files whose content at the start of the run is gone from the workspace:
        # changes.patch leaves them out (the run store keeps their changes)
        "patchLeftOut": display_names(patch_left_out),
    }
    if branches is not None:
        # what the branch directories cost: made, reused, bytes copied, peak disk
        result["branches"] = dict(branches)
    nothing, warnings = did_nothing(result)
    return {**result, "didNothing": nothing, "warnings": list(warnings)}


def did_nothing(result: Mapping[str, Any]) -> tuple[bool, tuple[str, ...]]:
    """Whether the run of ``result`` (its ``--json`` object) asked for permissions, had every
    one refused and changed nothing; and the warning that says so."""
    instances = [
        instance
        for entry in (result.get("steps") or {}).values()
        for instance in (entry.get("instances") or {}).values()
    ]
    instances += list(result.get("agents") or ())  # a comparison's, one per agent
    asked = [p for i in instances for p in i.get("permissions") or ()]
    changed = result.get("changes") or any(i.get("changes") for i in instances)
    if not asked or changed or any(p.get("verdict") == "allow" for p in asked):
        return False, ()
    requests = count(len(asked), "permission request")
    return True, (f"every one of the run's {requests} was refused and it changed nothing",)


async def rebuild_run_json(run_id: str, *, store: RunStore) -> dict[str, Any]:
    """A run's object as its records give it, without what only its process knew (see
    :func:`finished_run_json`)."""
    record = await store.get_run(run_id)
    record, steps = await as_seen(record, store, await store.steps(record.run_id))
    return await _rebuild(record, steps, store)


async def _rebuild(record: RunRecord, steps: list[StepRecord], store: RunStore) -> dict[str, Any]:
    """A run's object from its records: its steps, its agents, its final changes, its applies."""
    options = dict(record.options)
    graph = options.get("graph") or {"nodes": [], "edges": []}
    # the steps whose instances are keyed (by agent or item): a record of such a step without
    # an instance key is the step's own (skipped, failed while set up, or run over nothing)
    fanning = {
        node["name"]
        for node in graph.get("nodes", [])
        if node.get("over") is not None or len(node.get("agents") or ()) > 1
    }
    by_step: dict[str, dict[str, Any]] = {}
    for node in graph.get("nodes", []):
        by_step[node["name"]] = _step_entry()
    final_diff = ""
    final_changes: list[dict[str, Any]] = []
    for s in steps:
        entry = by_step.setdefault(s.step, _step_entry())
        own = s.instance is None and s.agent is None and s.result is None
        # a Python step's one instance, skipped because the run's budget was spent, is an
        # instance all the same (a step's own record of a skip has no error kind)
        own = own and not (s.status == "skipped" and s.error_kind == "budget")
        if own and s.status in ("skipped", "failed"):
            entry.update(
                status=s.status,
                error=s.error,
                errorKind=s.error_kind,
                cause=s.cause,
                traceback=s.traceback,
            )
        if own and s.key == s.step and (s.status == "skipped" or s.step in fanning):
            if s.status not in ("skipped", "failed"):
                entry["status"] = s.status
            continue
        body = dict(s.result) if s.result is not None else {}
        body.update(
            status=s.status,
            agent=s.agent,
            error=s.error or body.get("error"),
            errorKind=s.error_kind or body.get("errorKind"),
            traceback=s.traceback,
            attempt=s.attempt,
        )
        if s.result is None:
            body["value"] = s.value
            body["wallSeconds"] = (
                round((s.finished or s.started or 0) - (s.started or 0), 3) if s.finished else None
            )
        entry["instances"][s.instance if s.instance is not None else s.step] = body
    for entry in by_step.values():
        statuses = [i["status"] for i in entry["instances"].values()]
        if statuses and entry["status"] not in ("failed", "skipped"):
            if "failed" in statuses or "skipped" in statuses:
                # an instance skipped because the run's budget was spent fails its step, as
                # the runner counts it (its dependants were skipped)
                ended = "failed" if "failed" in statuses else "skipped"
                failed = next(i for i in entry["instances"].values() if i["status"] == ended)
                entry.update(
                    status="failed",
                    error=failed["error"],
                    errorKind=failed["errorKind"],
                    traceback=failed["traceback"],
                )
            elif "running" in statuses:
                entry["status"] = "running"
            elif "interrupted" in statuses:
                entry["status"] = "interrupted"
            elif all(x == "succeeded" for x in statuses):
                entry["status"] = "succeeded"
        elif entry["status"] == "pending" and record.status == "interrupted":
            # never started: the run was interrupted before it got there (a resume runs it)
            entry["status"] = "interrupted"
    if FINAL in await store.change_keys(record.run_id):
        final_diff = await store.diff(record.run_id, FINAL)
        for c in await store.change_entries(record.run_id, FINAL):
            listed: dict[str, Any] = {
                **name_json(c.path),
                "change": "deleted"
                if c.kind == "delete"
                else ("modified" if c.base_digest else "added"),
            }
            if c.kind == "write" and c.target is not None:
                listed.update(name_json(c.target, "symlink"))
            final_changes.append(listed)
    result: dict[str, Any] = {
        "kind": record.kind,
        "runId": record.run_id,
        "status": record.status,
        # why the status reads as it does, when the record alone cannot say (or null)
        "statusReason": record.status_reason,
        "cwd": record.cwd,
        "created": record.created,
        "finished": record.finished,
        "applied": record.applied is not None,
        # what confined its agents (Landlock), or null
        "sandbox": options.get("sandbox"),
        # the MCP servers each session had, by step and agent label (secrets redacted)
        "mcpServers": options.get("mcpServers"),
        # the permission requests rejected because no policy was given
        "defaultRejections": count_default_rejections(
            await store.permissions(record.run_id),
            options,
            {s.key: s.started for s in steps if s.started is not None},
        ).to_json(),
    }
    # what the applies wrote to the workspace: the run's final changes, or step instances
    applied_keys = [
        key
        for apply in await store.applies(record.run_id)
        if apply.git_branch is None
        for key in apply.keys or ()
    ]
    if record.kind == "compare":
        compare_info = options.get("compare") or {}
        verify = (options.get("verify") or {}).get("compare")
        # a comparison's agents are alternatives: ``applied`` names the one written to the
        # workspace (the latest, if several were), or is null
        written = [
            key[len("compare[") : -1]
            for key in applied_keys
            if key.startswith("compare[") and key.endswith("]")
        ]
        agents = []
        for key, body in by_step.get("compare", {}).get("instances", {}).items():
            one = compare_agent_json(body, key, record.run_id, written[-1:] == [key])
            if verify and not one.get("verify"):
                one["verify"] = None
            agents.append(one)
        result.update(
            task=compare_info.get("task") or record.inputs.get("task"),
            # the most rounds each agent had (1: the verify command ran once, no feedback)
            maxRounds=int(compare_info.get("rounds") or 1),
            agents=agents,
            applied=written[-1] if written else None,
            **judge(agents).to_json(),
        )
    else:
        result.update(
            pipeline=record.pipeline,
            name=graph.get("name"),
            inputs=dict(record.inputs),
            graph=graph,
            steps=by_step,
            changes=final_changes,
            diff=final_diff,
            # the step instances applied on their own (``apply RUN --step``), in apply order
            appliedSteps=list(dict.fromkeys(k for k in applied_keys if k != FINAL)),
        )
    result["conflicts"] = await store.conflicts(record.run_id)
    return result


def compare_agent_json(
    body: dict[str, Any], name: str, run_id: str, applied: bool
) -> dict[str, Any]:
    """One agent's entry in a comparison's object: its step instance's fields, ``name`` (its
    label), and the fields of a ``prompt`` object (``agent`` {name, version, reportedName, quirks},
    ``runId``, ``applied``, ``workspaceChanged``), so one reader serves both."""
    info = body.get("agentInfo") or {}
    return {
        **body,
        "name": name,
        "runId": run_id,
        "agent": {
            "name": name,
            "version": info.get("version") or None,
            "reportedName": info.get("name") or None,
            "quirks": list(body.get("quirks") or []),
        },
        "applied": applied,
        "workspaceChanged": [],
    }


async def compare_verdict(run_id: str, *, store: RunStore) -> Verdict:
    """The verdict of the comparison ``run_id`` as recorded: who succeeded, who won."""
    return judge((await rebuild_run_json(run_id, store=store)).get("agents") or [])


async def get_run(run_id: str, *, state_dir: str | os.PathLike[str] | None = None) -> RunRecord:
    """The record of the run that ``run_id`` (a unique prefix is enough) names."""
    async with open_run_store(state_directory(state_dir)) as store:
        return await store.get_run(run_id)

"""Recorded runs: list them, show one as its ``--json`` object, print its diff; a batch run's
object, its repositories' diffs and its report."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import attrs
import trio

from .._names import display_names, name_json
from .._words import count
from ..errors import RunNotFound, UsageError
from ..pipeline.branches import FINAL
from ..state import state_directory
from ..store import RunRecord, RunStore, StepRecord, open_run_store
from ._face import check_trio_face
from ._lock import run_owner
from .default_policy import count_default_rejections
from .verdict import Verdict, judge

if TYPE_CHECKING:
    from ..report import ReportPaths

__all__ = [
    "BATCH_UNFINISHED",
    "LATER",
    "RunGroup",
    "batch_diffs",
    "batch_json",
    "batch_refused",
    "compare_agent_json",
    "compare_verdict",
    "did_nothing",
    "diff_run",
    "finished_run_json",
    "get_run",
    "get_run_json",
    "list_run_groups",
    "list_runs",
    "no_such_step",
    "rebuild_run_json",
    "write_batch_report",
]


async def diff_run(
    run_id: str, *, step: str | None = None, state_dir: str | os.PathLike[str] | None = None
) -> str:
    """The unified diff of a run's changes (or one step's), as stored."""
    check_trio_face("diff_run")  # before anything starts
    async with open_run_store(state_directory(state_dir)) as store:
        record = await store.get_run(run_id)
        if record.kind == "batch":
            raise batch_refused(record.run_id, "diff")
        return await _stored_diff(store, record.run_id, step)


async def _stored_diff(store: RunStore, run_id: str, step: str | None) -> str:
    """The diff of run ``run_id`` (or of its ``step``) as :func:`diff_run` gives it."""
    steps = await store.steps(run_id)
    if step is None:
        # the final changes; before a run has them, what its instances did so far (an
        # interrupted one's changes as far as it got)
        keys = (
            [FINAL]
            if FINAL in await store.change_keys(run_id)
            else [s.key for s in steps if s.status in ("succeeded", "interrupted")]
        )
    else:
        keys = [s.key for s in steps if s.key == step or s.step == step]
        if not keys:
            raise no_such_step(run_id, step, steps)
    return "".join([await store.diff(run_id, key) for key in keys])


def batch_refused(run_id: str, doing: str) -> UsageError:
    """The error for ``doing`` (diff, apply) on batch run ``run_id``: its repositories' changes
    are in its child runs, one per repository."""
    return UsageError(
        f"run {run_id} is a batch run: cannot {doing} it as one run; each repository's changes "
        f"are in its own run (orchestrator show {run_id} lists them): {doing} those"
    )


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


#: a top-level run and, for a batch run, its child runs (one per repository), oldest first
RunGroup: TypeAlias = tuple[RunRecord, list[RunRecord]]


async def list_run_groups(
    *, state_dir: str | os.PathLike[str] | None = None, limit: int | None = 50
) -> list[RunGroup]:
    """The runs that belong to no batch, newest first (``limit`` counts them), each with its
    child runs when it is a batch; every run as :func:`as_seen` reads it."""
    async with open_run_store(state_directory(state_dir)) as store:
        groups: list[RunGroup] = []
        for record in await store.list_runs(limit=limit, top_level=True):
            seen = (await as_seen(record, store))[0]
            kids = await store.children(record.run_id) if record.kind == "batch" else []
            groups.append((seen, [(await as_seen(c, store))[0] for c in kids]))
        return groups


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
    A pipeline's or comparison's object has ``parent``: the batch run it is one repository of
    (or null). A batch run gives its batch object (see :func:`batch_json`).
    """
    check_trio_face("get_run_json")  # before anything starts
    if store is None:
        async with open_run_store(state_directory(state_dir)) as opened:
            return await get_run_json(run_id, store=opened)
    record = await store.get_run(run_id)
    if record.kind == "batch":
        return await _batch_json(record, store)
    record, steps = await as_seen(record, store, await store.steps(record.run_id))
    rebuilt = await _rebuild(record, steps, store)
    kept = _kept_result(record)
    if kept is None:
        nothing, warnings = did_nothing(rebuilt)
        return {**rebuilt, "didNothing": nothing, "warnings": list(warnings)}
    # the record's own fields fill in what an older release's object lacks
    shown = {**{k: rebuilt[k] for k in _RECORD_FIELDS}, **kept}
    shown.update((key, rebuilt[key]) for key in LATER if key in rebuilt)
    if record.kind != "prompt":  # a prompt's object is the prompt's: no batch runs one
        # set when a batch takes the run in (after the run returned its object)
        shown["parent"] = record.parent
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
    if record.kind != "prompt":  # a prompt's object is the prompt's: no batch runs one
        # the batch run it is one repository of, or null
        result["parent"] = record.parent
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


# ------------------------------------------------------------------------------------- batches

#: the statuses of a batch's repository that has not finished (an interrupted batch's read
#: ``interrupted``)
BATCH_UNFINISHED = ("pending", "running")


def _repo_entry(spec: Any) -> dict[str, Any]:
    """A repository's entry in a batch object before anything is known of its run: from its
    spec as the batch's options record it (or a bare source)."""
    given = dict(spec) if isinstance(spec, Mapping) else {"source": spec}
    source = str(given.get("source") or given.get("url") or given.get("path") or "")
    name = str(given.get("name") or Path(source.rstrip("/")).name or source or "?")
    return {
        "name": name,
        "source": source,
        "url": given.get("url"),
        "path": given.get("path"),
        "ref": given.get("ref"),
        "head": None,
        "runId": None,
        "status": "pending",
        "exitCode": None,
        "error": None,
        "skipped": None,
        "files": None,
        "added": None,
        "removed": None,
        "verify": None,
        "applied": False,
        "branch": None,
        "branchCommit": None,
        "pushed": None,
        "tokens": None,
        "cost": None,
        "seconds": None,
    }


def _counts(repos: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """How many repositories of a batch ended each way."""
    ended = ("succeeded", "failed", "skipped", "interrupted")
    return {status: sum(1 for r in repos if r.get("status") == status) for status in ended}


def batch_json(record: RunRecord) -> dict[str, Any]:
    """The batch object of batch run ``record`` (see :func:`get_run_json`), from its record.

    The object the batch keeps in its record (updated as repositories finish), with the
    record's status; what it lacks (a batch that kept none yet) from its options. When the
    record reads ``interrupted`` (Ctrl-C, or its process is gone), the repositories that had
    not finished read ``interrupted`` too.
    """
    options = dict(record.options)
    kept = dict(record.result) if isinstance(record.result, Mapping) else {}
    budget = options.get("budget")
    budget = dict(budget) if isinstance(budget, Mapping) else {}
    finished = record.finished
    pipeline = record.pipeline
    base: dict[str, Any] = {
        "runId": record.run_id,
        "kind": "batch",
        "status": record.status,
        "exitCode": None,
        "pipeline": pipeline,
        "pipelineName": Path(pipeline).stem if pipeline else None,
        "seconds": None if finished is None else round(max(0.0, finished - record.created), 3),
        "maxRepos": options.get("maxRepos"),
        "maxSessions": options.get("maxSessions"),
        "counts": {},
        "budget": {
            "maxTokens": budget.get("maxTokens"),
            "maxCost": budget.get("maxCost"),
            "maxSeconds": budget.get("maxSeconds"),
            "onSpent": budget.get("onSpent") or "finish",
            "tokens": None,
            "cost": None,
            "seconds": None,
            "spent": None,
        },
        "repos": [_repo_entry(spec) for spec in options.get("repos") or ()],
    }
    batch = {**base, **kept}
    batch.update(runId=record.run_id, kind="batch", status=record.status)
    repos = [dict(r) for r in batch.get("repos") or () if isinstance(r, Mapping)]
    if record.status == "interrupted":
        for entry in repos:
            if entry.get("status") in BATCH_UNFINISHED:
                entry["status"] = "interrupted"
    batch["repos"] = repos
    if not kept.get("counts") or record.status == "interrupted":
        batch["counts"] = _counts(repos)
    # why the status reads as it does when the record alone cannot say (or null)
    batch["statusReason"] = record.status_reason
    return batch


async def _batch_json(record: RunRecord, store: RunStore) -> dict[str, Any]:
    return batch_json((await as_seen(record, store))[0])


async def batch_diffs(run_id: str, *, store: RunStore) -> dict[str, str]:
    """Each repository's diff of batch run ``run_id``, by its name, in the batch's order: its
    child run's final changes (as :func:`diff_run` gives them); "" for a repository whose run
    changed nothing, never started, or is no longer recorded."""
    record = await store.get_run(run_id)
    if record.kind != "batch":
        raise UsageError(f"run {record.run_id} is a {record.kind} run, not a batch run")
    diffs: dict[str, str] = {}
    for i, entry in enumerate(batch_json(record)["repos"]):
        name = str(entry.get("name") or f"repository {i + 1}")
        child = entry.get("runId")
        if name in diffs:  # names are unique within a batch; a hand-made record may not be
            name = f"{name} ({child or i + 1})"
        text = ""
        if isinstance(child, str) and child:
            try:
                text = await _stored_diff(store, child, None)
            except RunNotFound:
                text = ""
        diffs[name] = text
    return diffs


async def write_batch_report(
    run_id: str,
    out_dir: str | os.PathLike[str],
    *,
    state_dir: str | os.PathLike[str] | None = None,
    store: RunStore | None = None,
) -> tuple[dict[str, Any], ReportPaths]:
    """Write the report of batch run ``run_id`` (its table and each repository's diff) as
    ``report.html`` and ``report.md`` in ``out_dir``; the batch object and where it went.

    Reads the run store (``store``, else the one of ``state_dir``); raises
    :class:`~orchestrator.errors.ReportError` when the directory cannot be written.
    """
    from ..report import render_batch_report

    if store is None:
        async with open_run_store(state_directory(state_dir)) as opened:
            return await write_batch_report(run_id, out_dir, store=opened)
    record = await store.get_run(run_id)
    if record.kind != "batch":
        raise UsageError(f"run {record.run_id} is a {record.kind} run, not a batch run")
    batch = await _batch_json(record, store)
    diffs = await batch_diffs(record.run_id, store=store)
    paths = await trio.to_thread.run_sync(render_batch_report, batch, diffs, out_dir)
    return batch, paths

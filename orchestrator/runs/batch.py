"""Batches: one pipeline over many repositories, each repository a child run of one batch run.

A batch is a run of its own (kind ``batch``) whose record holds one entry per repository
(:class:`~orchestrator.runs._batchrepo.RepoOutcome`, kept as a step row each as it changes, so a
batch killed midway still says what each repository came to). Each repository runs the pipeline
through :func:`~orchestrator.runs.run_pipeline`, the one run path, as a child run (its record's
``parent`` is the batch): with the same inputs, policy, agents and config, within one bound on
live agent sessions shared by all of them (``max_sessions``) and at most ``max_repos``
repositories at once. A budget (tokens, cost, seconds) spans the whole batch: once it is spent,
no repository or step starts, and running turns finish or are cancelled as asked.

Nothing touches a repository unless asked: ``apply`` writes a local checkout's changes in place
(the same all-or-nothing apply); ``git_branch`` commits them on a new branch (the working tree,
index and current branch left alone) and ``push`` pushes that branch. A repository whose run did
not succeed (a step failed, a check never passed, conflicts) or whose verify failed gets neither.
"""

from __future__ import annotations

import functools
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import attrs
import trio
from attrs import frozen

from .._log import get_logger
from ..agent.permissions import Escalate
from ..cluster._connect import ClusterSpec, cluster_spec
from ..cluster._driver import ClusterSession, open_cluster, rate_keys_of
from ..config import Config
from ..errors import (
    UsageError,
)
from ..mcp import McpServer
from ..pipeline import Pipeline, load_pipeline
from ..pipeline._agent_step import label_run_agents
from ..pipeline._budget import RunBudget
from ..pipeline.results import RunEvent
from ..policy import PolicySet
from ..sandbox import SandboxChoice
from ..state import state_directory
from ..store import RunRecord, open_run_store
from ..supervisor import Connector
from ..vfs.pool import reuse_enabled_by_env
from ._batchinput import (
    GIVEN_IN_CODE,
    check_branch,
    check_message,
    check_positive,
    make_budget,
    policy_source,
    read_repos,
    recorded_spec,
    restored_specs,
)
from ._batchjob import BatchJob
from ._batchrepo import (
    REPO_STEP,
    RepoOutcome,
)
from ._face import check_trio_face
from ._lock import hold_run_lock
from ._repos import RepoSpec
from .run import launchable

log = get_logger(__name__)

__all__ = ["BatchOutcome", "RepoOutcome", "batch", "resume_batch"]

BatchStatus = Literal["succeeded", "failed", "interrupted"]
OnBudget = Literal["finish", "cancel"]


#: repositories at once, unless asked otherwise
DEFAULT_MAX_REPOS = 4


@frozen
class BatchOutcome:
    """How a batch ended: :attr:`result` is its ``--json`` object (see the README's
    "Batches"), :attr:`repos` its entries, typed."""

    run_id: str
    status: BatchStatus
    result: Mapping[str, Any]
    repos: tuple[RepoOutcome, ...]

    @property
    def exit_code(self) -> int:
        """0 when every repository succeeded, 1 when any did not, 130 interrupted."""
        return {"succeeded": 0, "failed": 1, "interrupted": 130}[self.status]

    @property
    def failed(self) -> tuple[RepoOutcome, ...]:
        """The repositories that did not succeed (failed, skipped, interrupted, not begun)."""
        return tuple(r for r in self.repos if not r.succeeded)


async def batch(
    pipeline: Pipeline | str | os.PathLike[str],
    repos: Sequence[str | RepoSpec] = (),
    inputs: Mapping[str, Any] | None = None,
    *,
    repos_file: str | os.PathLike[str] | None = None,
    cwd: str | os.PathLike[str] = ".",
    policy: str | os.PathLike[str] | PolicySet | None = None,
    escalate: Escalate | None = None,
    config: Config | None = None,
    max_repos: int | None = None,
    max_sessions: int | None = None,
    max_file_size: int | str | None = None,
    apply: bool = False,
    git_branch: str | None = None,
    push: str | None = None,
    message: str | None = None,
    max_tokens: int | None = None,
    max_cost: float | None = None,
    max_seconds: float | None = None,
    on_budget: OnBudget = "finish",
    on_event: Callable[[RunEvent], None] | None = None,
    state_dir: str | os.PathLike[str] | None = None,
    connector: Connector | None = None,
    sandbox: SandboxChoice = None,
    record_transcripts: bool = True,
    mcp_servers: Sequence[McpServer | str] | None = None,
    clone_timeout: float | None = 600,
    cluster: str | ClusterSpec | None = None,
) -> BatchOutcome:
    """Run ``pipeline`` in every repository of ``repos`` (and of the list in ``repos_file``),
    each as a child run of one batch run.

    A repository is a local directory (read as it is, never modified unless ``apply``) or a
    git URL, optionally with a ref (``"URL REF"``), cloned shallow into a cache in the state
    directory and fetched again by later batches (see :mod:`orchestrator.runs._repos`).
    Relative paths are read from ``cwd`` (the list's from the list's directory). Every child
    run gets the same ``inputs``, ``policy``, agents and ``config`` (by default the one of
    ``cwd``: a repository's own project config is never read); at most ``max_repos``
    repositories run at once (default 4) and ``max_sessions`` agent sessions across all of
    them (default: the config's, else 8).

    ``apply`` writes each local repository's changes in place, all or nothing, as
    :func:`~orchestrator.runs.run_pipeline` does. ``git_branch`` commits each repository's
    changes on a new branch of that name (its working tree, index and current branch left
    alone), with ``message`` as the commit message when given (a template that may name
    ``{batch_id}``, ``{run_id}``, ``{pipeline}`` and ``{repo}``); ``push`` then pushes it to that
    remote. A repository whose run did not succeed, or whose verify failed, gets no branch.

    ``max_tokens``, ``max_cost`` and ``max_seconds`` budget the whole batch (tokens and cost as
    the agents report them): once one is spent, no repository or step starts, those left are
    ``skipped`` (``budget``), and running turns finish (``on_budget="finish"``) or are
    cancelled (``"cancel"``). ``on_event`` sees the batch's events (``batch_started``,
    ``repo_started``, ``repo_finished``, ``batch_finished``) and every child run's, with
    ``repo`` in their data. ``cluster`` runs every repository's agent turns on that Ray
    cluster (one connection, one coordinator holding the budget for every node; without
    ``max_sessions``, as many at once as its agent slots). The other options are
    :func:`run_pipeline`'s.

    Bad input (the pipeline, its inputs, the list, an option) raises before anything is
    recorded or started; a repository that cannot be reached (a clone that fails) fails alone.
    """
    check_trio_face("batch")  # before anything starts
    reuse_enabled_by_env()  # a bad word of the environment on directory reuse: refused now
    root = Path(cwd).expanduser().resolve()
    if not root.is_dir():
        raise UsageError(f"the batch's directory {cwd} is not a directory")
    pipe = pipeline if isinstance(pipeline, Pipeline) else load_pipeline(pipeline)
    values = pipe.check_inputs(inputs or {})
    check_positive("max_repos", max_repos)
    check_positive("max_sessions", max_sessions)
    if push is not None and git_branch is None:
        raise UsageError("pushing needs a git branch to push: name the branch to commit on")
    if apply and git_branch is not None:
        raise UsageError(
            "apply writes the changes into each checkout, a git branch commits them beside it: "
            "choose one"
        )
    check_message(message)
    if git_branch is not None:
        await trio.to_thread.run_sync(check_branch, git_branch)
    if message is not None and git_branch is None:
        raise UsageError("a commit message template needs a git branch to commit on")
    budget = make_budget(max_tokens, max_cost, max_seconds, on_budget)
    specs = await trio.to_thread.run_sync(read_repos, repos, repos_file, root)
    if apply:
        cloned = [s.source for s in specs if s.url is not None]
        if cloned:
            raise UsageError(
                f"apply writes local checkouts in place; {cloned[0]} is cloned into a cache: "
                "commit on a git branch (and push it) instead"
            )
    cfg = (
        config
        if config is not None
        else await trio.to_thread.run_sync(
            functools.partial(Config.load, root, state_dir=state_dir)
        )
    )
    with_agents = pipe.with_agents(values)
    if connector is None:
        with_agents.check_agents(lambda name: launchable(cfg.resolve_agent(name)))
    else:
        with_agents.check_agents(cfg.resolve_agent)
    if isinstance(policy, str | os.PathLike) and policy is not None:
        PolicySet.load(os.fspath(policy))  # a policy that cannot load: before anything starts
    on_cluster = cluster_spec(cluster)
    if on_cluster is not None and on_cluster.rates:  # a rate that names no agent: now
        labelled = label_run_agents(with_agents, cfg.resolve_agent, base=os.getcwd())
        rate_keys_of(on_cluster.rates, labelled.values(), cfg.resolve_agent)
    # the batch's directory is no workspace: each repository's run checks the state directory
    # is not inside it
    state = state_directory(state_dir)
    batch_id = uuid.uuid4().hex[:12]
    sessions = max_sessions or cfg.max_sessions or 8
    repos_at_once = max_repos or DEFAULT_MAX_REPOS
    run_options: dict[str, Any] = {
        "policy": policy,
        "escalate": escalate,
        "max_sessions": sessions,
        "max_file_size": max_file_size,
        "connector": connector,
        "sandbox": sandbox,
        "record_transcripts": record_transcripts,
        "mcp_servers": mcp_servers,
    }
    options = {
        "repos": [recorded_spec(s) for s in specs],
        "maxRepos": repos_at_once,
        "maxSessions": sessions,
        "maxSessionsGiven": max_sessions is not None,
        "apply": apply,
        "gitBranch": git_branch,
        "push": push,
        "message": message,
        "budget": {
            "maxTokens": max_tokens,
            "maxCost": max_cost,
            "maxSeconds": max_seconds,
            "onSpent": on_budget,
        },
        "policy": policy_source(policy),
        "cloneTimeout": clone_timeout,
        "recordTranscripts": record_transcripts,
    }
    record = RunRecord(
        run_id=batch_id,
        kind="batch",
        status="running",
        created=time.time(),
        cwd=str(root),
        pipeline=pipe.path,
        pipeline_digest=pipe.digest,
        inputs=_json_values(values),
        options=options,
    )
    return await _run_batch(
        record,
        state,
        pipe,
        values,
        specs,
        cfg,
        budget,
        run_options,
        on_event,
        clone_timeout,
        previous={},
        cluster=on_cluster,
    )


async def _run_batch(
    record: RunRecord,
    state: Path,
    pipe: Pipeline,
    values: Mapping[str, Any],
    specs: tuple[RepoSpec, ...],
    cfg: Config,
    budget: RunBudget,
    run_options: Mapping[str, Any],
    on_event: Callable[[RunEvent], None] | None,
    clone_timeout: float | None,
    *,
    previous: Mapping[str, RepoOutcome],
    cluster: ClusterSpec | None = None,
) -> BatchOutcome:
    """Run (or resume: ``previous`` holds the earlier attempt's entries) the batch ``record``."""
    batch_id = record.run_id
    options = record.options
    run_dir = state / "runs" / batch_id
    resuming = bool(previous)
    with hold_run_lock(run_dir, batch_id, doing="resume"):
        async with open_run_store(state) as store, _on_cluster(cluster, budget) as session:
            limit = int(options["maxSessions"])
            if session is not None:
                # every repository's runs place their turns on the one cluster session; the
                # live sessions are the cluster's agent slots unless a limit was given
                if not options.get("maxSessionsGiven"):
                    limit = session.slots
                run_options = {**run_options, "_cluster": session, "max_sessions": limit}
            if resuming:
                await store.update_run(batch_id, status="running", finished=None, error=None)
            else:
                await store.create_run(record)
            job = BatchJob(
                store=store,
                batch_id=batch_id,
                state=state,
                pipe=pipe,
                inputs=values,
                specs=specs,
                config=cfg,
                budget=budget,
                slots=trio.Semaphore(limit),
                max_repos=int(options["maxRepos"]),
                max_sessions=limit,
                apply=bool(options.get("apply")),
                git_branch=options.get("gitBranch"),
                push=options.get("push"),
                message=options.get("message"),
                run_options=run_options,
                on_event=on_event,
                clone_timeout=clone_timeout,
            )
            for spec in specs:
                earlier = previous.get(spec.name)
                job.entries[spec.name] = earlier or RepoOutcome.pending(spec)
                if earlier is not None and earlier.run_id and not earlier.succeeded:
                    job.children[spec.name] = earlier.run_id
            if not resuming:
                for spec in specs:
                    await job.save(job.entries[spec.name])
            started = time.monotonic()
            budget.start()
            job.emit(
                "batch_started",
                kind="batch",
                pipeline=pipe.name,
                repos=[s.name for s in specs],
                resumed=resuming,
            )
            status: BatchStatus = "interrupted"
            try:
                await job.run()
                ok = all(job.entries[s.name].succeeded for s in specs)
                status = "succeeded" if ok else "failed"
            finally:
                with trio.CancelScope(shield=True):
                    result = job.result(status, time.monotonic() - started)
                    failed = [n for n, e in job.entries.items() if not e.succeeded]
                    await store.update_run(
                        batch_id,
                        status=status,
                        finished=time.time(),
                        result=result,
                        error=(
                            None
                            if status == "succeeded"
                            else f"{len(failed)} of {len(specs)} repositories did not succeed"
                        ),
                    )
                    job.emit("batch_finished", status=status, counts=result["counts"])
            log.info("batch finished", batch=batch_id, status=status, **result["counts"])
            return BatchOutcome(batch_id, status, result, tuple(job.entries[s.name] for s in specs))


@asynccontextmanager
async def _on_cluster(
    spec: ClusterSpec | None, budget: RunBudget
) -> AsyncIterator[ClusterSession | None]:
    """The batch's cluster session for the block (None: one machine)."""
    if spec is None:
        yield None
        return
    async with open_cluster(spec, budget=budget) as session:
        yield session


async def resume_batch(
    batch_id: str,
    *,
    state_dir: str | os.PathLike[str] | None = None,
    pipeline: Pipeline | str | os.PathLike[str] | None = None,
    policy: str | os.PathLike[str] | PolicySet | None = None,
    escalate: Escalate | None = None,
    config: Config | None = None,
    max_repos: int | None = None,
    max_sessions: int | None = None,
    max_tokens: int | None = None,
    max_cost: float | None = None,
    max_seconds: float | None = None,
    on_budget: OnBudget | None = None,
    on_event: Callable[[RunEvent], None] | None = None,
    connector: Connector | None = None,
    sandbox: SandboxChoice = None,
    cluster: str | ClusterSpec | None = None,
) -> BatchOutcome:
    """Run batch ``batch_id`` again: the repositories that succeeded are kept; the others run
    again, each resuming its child run (only the steps that did not succeed run again) or, when
    it has none (a clone that failed, a repository skipped), starting one.

    The batch goes on with its recorded options (repositories, apply, branch, push, budgets);
    a budget counts again from nothing, and ``max_tokens``, ``max_cost``, ``max_seconds``,
    ``on_budget``, ``max_repos``, ``max_sessions`` and ``policy`` replace the recorded ones;
    ``cluster`` runs this attempt on a cluster (as :func:`batch`).
    """
    check_trio_face("resume_batch")  # before anything starts
    reuse_enabled_by_env()  # as batch()
    check_positive("max_repos", max_repos)
    check_positive("max_sessions", max_sessions)
    state = state_directory(state_dir)
    async with open_run_store(state) as store:
        record = await store.get_run(batch_id)
        if record.kind != "batch":
            raise UsageError(f"run {record.run_id} is a {record.kind} run, not a batch")
        rows = [s for s in await store.steps(record.run_id) if s.step == REPO_STEP]
    previous = {
        row.key: RepoOutcome.from_json(row.result) for row in rows if row.result is not None
    }
    options = dict(record.options)
    specs = await trio.to_thread.run_sync(restored_specs, options.get("repos") or (), state)
    if not specs:
        raise UsageError(f"batch {record.run_id} records no repositories")
    if isinstance(pipeline, Pipeline):
        pipe = pipeline
    elif pipeline is not None or record.pipeline:
        pipe = load_pipeline(pipeline if pipeline is not None else str(record.pipeline))
    else:
        raise UsageError(
            f"batch {record.run_id} ran a pipeline built in code, which no file holds: "
            "give that pipeline to resume it"
        )
    if pipe.digest != record.pipeline_digest:
        log.warning("the pipeline changed since the batch", pipeline=pipe.path or pipe.name)
    values = pipe.check_inputs(dict(record.inputs))
    recorded = dict(options.get("budget") or {})
    budget = make_budget(
        max_tokens if max_tokens is not None else recorded.get("maxTokens"),
        max_cost if max_cost is not None else recorded.get("maxCost"),
        max_seconds if max_seconds is not None else recorded.get("maxSeconds"),
        on_budget or recorded.get("onSpent") or "finish",
    )
    options["budget"] = {
        "maxTokens": budget.max_tokens,
        "maxCost": budget.max_cost,
        "maxSeconds": budget.max_seconds,
        "onSpent": budget.on_spent,
    }
    if max_repos is not None:
        options["maxRepos"] = max_repos
    if max_sessions is not None:
        options["maxSessions"] = max_sessions
        options["maxSessionsGiven"] = True
    cfg = (
        config
        if config is not None
        else await trio.to_thread.run_sync(
            functools.partial(Config.load, record.cwd, state_dir=state)
        )
    )
    recorded_policy = options.get("policy")
    run_options: dict[str, Any] = {
        "policy": policy
        if policy is not None
        else (recorded_policy if recorded_policy != GIVEN_IN_CODE else None),
        "escalate": escalate,
        "max_sessions": int(options["maxSessions"]),
        "connector": connector,
        "sandbox": sandbox,
        "record_transcripts": bool(options.get("recordTranscripts", True)),
    }
    updated = attrs.evolve(record, options=options)
    async with open_run_store(state) as store:
        await store.update_run(record.run_id, options=options)
    return await _run_batch(
        updated,
        state,
        pipe,
        values,
        specs,
        cfg,
        budget,
        run_options,
        on_event,
        options.get("cloneTimeout", 600),
        previous=previous or {s.name: RepoOutcome.pending(s) for s in specs},
        cluster=cluster_spec(cluster),
    )


def _json_values(values: Mapping[str, Any]) -> dict[str, Any]:
    from .run import _json_inputs

    return _json_inputs(values)

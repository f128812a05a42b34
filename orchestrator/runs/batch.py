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

import contextlib
import functools
import os
import string
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import attrs
import trio
from attrs import frozen

from .._log import get_logger
from ..agent.permissions import Escalate
from ..config import Config
from ..errors import (
    OrchestratorError,
    PushFailed,
    RepoUnavailable,
    RunBusy,
    RunNotFound,
    UsageError,
)
from ..mcp import McpServer
from ..pipeline import Pipeline, load_pipeline
from ..pipeline._budget import RunBudget
from ..pipeline._recording import call_listener
from ..pipeline.results import RunEvent
from ..policy import PolicySet
from ..sandbox import SandboxChoice
from ..state import state_directory
from ..store import RunRecord, RunStore, open_run_store
from ..supervisor import Connector
from ._batchrepo import (
    REPO_STEP,
    RepoOutcome,
    budget_only_failures,
    child_figures,
    push_branch,
)
from ._clones import open_checkout
from ._face import check_trio_face
from ._lock import hold_run_lock
from ._repos import RepoSpec, label_repos, parse_repos, repo_spec
from .apply import apply_recorded
from .resume import resume_run
from .run import RunOutcome, launchable, run_pipeline

log = get_logger(__name__)

__all__ = ["BatchOutcome", "RepoOutcome", "batch", "resume_batch"]

BatchStatus = Literal["succeeded", "failed", "interrupted"]
OnBudget = Literal["finish", "cancel"]
#: the fields a commit message template may name
MESSAGE_FIELDS = frozenset({"batch_id", "run_id", "pipeline", "repo"})
#: seconds between two writes of a running batch's object to its record
RESULT_EVERY = 1.0
#: repositories at once, unless asked otherwise
DEFAULT_MAX_REPOS = 4
#: seconds a repository's commit waits for its own finished run's lock (see _run_lock)
RUN_LOCK_WAIT = 5.0


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


def _check_message(template: str | None) -> None:
    """A commit message template names only :data:`MESSAGE_FIELDS`; UsageError otherwise."""
    if template is None:
        return
    if not template.strip():
        raise UsageError("the commit message template is empty")
    try:
        fields = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as e:
        raise UsageError(f"the commit message template {template!r}: {e}") from None
    unknown = sorted({f for f in fields if f not in MESSAGE_FIELDS} - {""})
    if "" in fields or unknown:
        raise UsageError(
            f"the commit message template names {', '.join(unknown) or '{}'}: it may name "
            + ", ".join("{" + f + "}" for f in sorted(MESSAGE_FIELDS))
        )


def _read_repos(
    repos: Sequence[str | RepoSpec], repos_file: str | os.PathLike[str] | None, cwd: Path
) -> tuple[RepoSpec, ...]:
    """The batch's repositories: the file's, then the ones given, labelled (blocking)."""
    specs: list[RepoSpec] = []
    if repos_file is not None:
        path = Path(repos_file).expanduser()
        if not path.is_absolute():
            path = cwd / path
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise UsageError(
                f"the repository list {repos_file}: not UTF-8 text (byte {e.start})"
            ) from None
        except OSError as e:
            raise UsageError(f"the repository list {repos_file}: {e.strerror or e}") from None
        specs += parse_repos(text, base=path.parent, origin=os.fspath(repos_file))
    for item in repos:
        specs.append(item if isinstance(item, RepoSpec) else repo_spec(item, base=cwd))
    if not specs:
        raise UsageError("no repositories: give a list of them, or one at least")
    return label_repos(specs)


@attrs.define(eq=False)
class _Batch:
    """One attempt of a batch: its repositories' entries, and the work of each."""

    store: RunStore
    batch_id: str
    state: Path
    pipe: Pipeline
    inputs: Mapping[str, Any]
    specs: tuple[RepoSpec, ...]
    config: Config
    budget: RunBudget
    slots: trio.Semaphore
    max_repos: int
    max_sessions: int
    apply: bool
    git_branch: str | None
    push: str | None
    message: str | None
    run_options: Mapping[str, Any]
    on_event: Callable[[RunEvent], None] | None
    clone_timeout: float | None
    entries: dict[str, RepoOutcome] = attrs.field(factory=dict)
    #: when the batch's object was last written to its record (see :meth:`save`)
    written: float = 0.0
    began: float = attrs.field(factory=time.monotonic)
    started_at: dict[str, float] = attrs.field(factory=dict)
    #: the child runs of an earlier attempt, by repository: resumed rather than started anew
    children: dict[str, str] = attrs.field(factory=dict)

    # ------------------------------------------------------------------ records

    async def save(self, entry: RepoOutcome) -> None:
        """Keep ``entry`` (also in the store, at once: a batch killed later still has it)."""
        self.entries[entry.name] = entry
        started = self.started_at.get(entry.name)
        done = entry.status not in ("pending", "running")
        with trio.CancelScope(shield=True):
            await self.store.put_step(
                entry.to_step(self.batch_id, started, time.time() if done else None)
            )
            # the whole object too, for `show` while it runs: at most once a second, so a
            # batch of many repositories does not rewrite it for each one
            now = time.monotonic()
            if done and now - self.written >= RESULT_EVERY:
                self.written = now
                await self.store.update_run(
                    self.batch_id, result=self.result("running", now - self.began)
                )

    def emit(self, type_: str, **data: Any) -> None:
        if self.on_event is not None:
            event = RunEvent(type_, self.batch_id, data=data)  # type: ignore[arg-type]
            _notify(self.on_event, event)

    # ------------------------------------------------------------------ scheduling

    async def run(self) -> None:
        """Every repository not yet succeeded, at most :attr:`max_repos` at once, in order."""
        limiter = trio.Semaphore(self.max_repos)
        async with trio.open_nursery() as nursery:
            for spec in self.specs:
                if self.entries[spec.name].succeeded:
                    continue
                await limiter.acquire()
                spent = self.budget.spent
                if spent is not None:
                    limiter.release()
                    await self._skip(spec, spent)
                    continue
                nursery.start_soon(self._one, spec, limiter, name=f"repository {spec.name}")

    async def _skip(self, spec: RepoSpec, why: str) -> None:
        entry = self.entries[spec.name].evolve(
            status="skipped", skipped="budget", error=f"not started: the budget is spent ({why})"
        )
        await self.save(entry)
        self.emit("repo_finished", repo=spec.name, **_event_entry(entry))

    async def _one(self, spec: RepoSpec, limiter: trio.Semaphore) -> None:
        try:
            await self._repository(spec)
        finally:
            limiter.release()

    async def _repository(self, spec: RepoSpec) -> None:
        """Check out, run (or resume) the pipeline, then commit and push as asked."""
        began = time.monotonic()
        self.started_at[spec.name] = time.time()
        entry = self.entries[spec.name].evolve(
            status="running", error=None, skipped=None, exit_code=None, warnings=()
        )
        await self.save(entry)
        self.emit("repo_started", repo=spec.name, source=spec.source)
        try:
            entry = await self._work(spec, entry)
        except trio.Cancelled:
            entry = self.entries[spec.name]
            await self.save(
                entry.evolve(status="interrupted", seconds=_since(began), exit_code=130)
            )
            raise
        entry = entry.evolve(seconds=_since(began))
        await self.save(entry)
        self.emit("repo_finished", repo=spec.name, **_event_entry(entry))

    async def _work(self, spec: RepoSpec, entry: RepoOutcome) -> RepoOutcome:
        resumed = self.children.get(spec.name)
        # a clone is resumed at the commit its run started from: the branch may have moved on
        checkout_spec = spec
        if resumed is not None and spec.url is not None and entry.head is not None:
            checkout_spec = attrs.evolve(spec, ref=entry.head)
        try:
            async with open_checkout(
                checkout_spec, self.state, timeout=self.clone_timeout
            ) as checkout:
                entry = entry.evolve(path=str(checkout.path), head=checkout.head)
                await self.save(entry)
                outcome = await self._child(spec, checkout.path, resumed, entry)
                if isinstance(outcome, RepoOutcome):  # it failed before its run did anything
                    return outcome
                entry = self._from_child(entry, outcome)
                if entry.succeeded and self.git_branch is not None:
                    entry = await self._commit(entry, checkout.path)
                return entry
        except RepoUnavailable as e:
            return entry.evolve(status="failed", error=str(e), exit_code=2)

    async def _child(
        self, spec: RepoSpec, cwd: Path, resumed: str | None, entry: RepoOutcome
    ) -> RunOutcome | RepoOutcome:
        """The repository's child run (started, or an earlier one resumed); an entry instead
        when it could not run at all (refused before it started, or raised)."""
        seen: list[str] = []
        name = spec.name

        def on_event(event: RunEvent) -> None:
            if event.type == "run_started" and not seen:
                seen.append(event.run_id)
            if self.on_event is not None:
                _notify(self.on_event, attrs.evolve(event, data={**event.data, "repo": name}))

        wants = getattr(self.on_event, "wants_updates", True) if self.on_event else False
        on_event.wants_updates = wants  # type: ignore[attr-defined]
        try:
            if resumed is not None:
                return await resume_run(
                    resumed,
                    state_dir=self.state,
                    config=self.config,
                    apply=self.apply,
                    on_event=on_event,
                    _budget=self.budget,
                    _slots=self.slots,
                    **{k: v for k, v in self.run_options.items() if k in _RESUME_OPTIONS},
                )
            return await run_pipeline(
                self.pipe,
                self.inputs,
                cwd=cwd,
                state_dir=self.state,
                config=self.config,
                apply=self.apply,
                on_event=on_event,
                _parent=self.batch_id,
                _budget=self.budget,
                _slots=self.slots,
                **self.run_options,
            )
        except RunNotFound as e:  # the earlier child run was pruned: a new one
            if resumed is None:
                raise
            log.info("the repository's run is gone; starting it anew", repo=name, error=str(e))
            self.children.pop(name, None)
            return await self._child(spec, cwd, None, entry)
        except OrchestratorError as e:
            code = 2 if isinstance(e, UsageError) else 1
            run_id = seen[0] if seen else resumed
            return entry.evolve(status="failed", error=_one_line(e), exit_code=code, run_id=run_id)

    def _from_child(self, entry: RepoOutcome, outcome: RunOutcome) -> RepoOutcome:
        result = outcome.result
        figures = child_figures(result)
        status: Any = "succeeded"
        error: str | None = None
        skipped: str | None = None
        code = outcome.exit_code
        if outcome.status == "interrupted":
            status = "interrupted"
        elif outcome.status != "succeeded" or code != 0:
            status = "failed"
            error = _child_error(result, outcome)
            if outcome.status == "failed" and budget_only_failures(result):
                status, skipped = "skipped", "budget"
                spent = self.budget.spent
                error = f"stopped: the budget is spent ({spent})" if spent else error
        elif figures["verify"] == "failed":
            status, error = "failed", "verify failed"
        # this attempt's sessions, as the batch's budget counted them (the record's figures
        # when the budget saw none: a run whose agents report no usage)
        used = self.budget.usage(outcome.run_id)
        if used.get("tokens") is not None or used.get("cost") is not None:
            figures.update(tokens=used.get("tokens"), cost=used.get("cost"))
        warnings = tuple(str(w) for w in result.get("warnings") or ())
        if status == "succeeded" and not figures["files"]:
            warnings += ("the pipeline changed nothing in this repository",)
        return entry.evolve(
            run_id=outcome.run_id,
            status=status,
            exit_code=code,
            error=error,
            skipped=skipped,
            applied=bool(result.get("applied")),
            warnings=warnings,
            **figures,
        )

    async def _commit(self, entry: RepoOutcome, cwd: Path) -> RepoOutcome:
        """The repository's changes committed on the batch's new branch, and pushed."""
        assert self.git_branch is not None and entry.run_id is not None
        run_id = entry.run_id
        if entry.branch is None or entry.branch_commit is None:
            if not entry.files:
                return entry  # nothing to commit: no branch (the warning says why)
            message = None
            if self.message is not None:
                message = self.message.format(
                    batch_id=self.batch_id, run_id=run_id, pipeline=self.pipe.name, repo=entry.name
                )
                message = message if message.endswith("\n") else message + "\n"
            try:
                async with _run_lock(self.state / "runs" / run_id, run_id):
                    applied = await apply_recorded(
                        self.store,
                        run_id,
                        state=self.state,
                        git_branch=self.git_branch,
                        message=message,
                    )
            except OrchestratorError as e:
                return entry.evolve(status="failed", error=_one_line(e), exit_code=1)
            if applied.workspace_changed:
                paths = ", ".join(applied.workspace_changed[:5])
                return entry.evolve(
                    status="failed",
                    exit_code=3,
                    error=f"no branch: files differ at HEAD from the run's base ({paths})",
                )
            if not applied.applied:
                return entry
            entry = entry.evolve(branch=self.git_branch, branch_commit=applied.git_commit)
            await self.save(entry)
        if self.push is not None and entry.pushed is None:
            try:
                await push_branch(cwd, self.push, self.git_branch, timeout=self.clone_timeout)
            except PushFailed as e:
                return entry.evolve(status="failed", error=str(e), exit_code=1)
            entry = entry.evolve(pushed=self.push)
        return entry

    # ------------------------------------------------------------------ the object

    def result(self, status: str, seconds: float) -> dict[str, Any]:
        """The batch object (``--json``) as things stand."""
        entries = [self.entries[s.name] for s in self.specs]
        counts = dict.fromkeys(("succeeded", "failed", "skipped", "interrupted", "pending"), 0)
        for entry in entries:
            key = entry.status
            if key == "running" and status != "running":  # the batch ended while it ran
                key = "interrupted"
            counts[key] = counts.get(key, 0) + 1
        code = {"succeeded": 0, "failed": 1, "interrupted": 130}.get(status)
        return {
            "runId": self.batch_id,
            "kind": "batch",
            "status": status,
            "exitCode": code,
            "pipeline": self.pipe.path,
            "pipelineName": self.pipe.name,
            "seconds": round(seconds, 3),
            "maxRepos": self.max_repos,
            "maxSessions": self.max_sessions,
            "counts": counts,
            "budget": self.budget.statistics(),
            "gitBranch": self.git_branch,
            "push": self.push,
            "apply": self.apply,
            "repos": [e.to_json() for e in entries],
        }


#: the child run options a resume of a child takes again
_RESUME_OPTIONS = frozenset({"policy", "escalate", "max_sessions", "connector", "sandbox"})


@contextlib.asynccontextmanager
async def _run_lock(run_dir: Path, run_id: str) -> AsyncIterator[None]:
    """Hold the lock of a child run this batch just ran, for its commit.

    The run released it as it ended; until the commit takes it again, another run starting in
    the same state directory (another repository's, in this process or not) may hold it for a
    moment while it looks for leftovers of dead runs (``move_leftovers``). That is no reason to
    fail the repository: the lock is polled for up to :data:`RUN_LOCK_WAIT` seconds, then
    :class:`RunBusy` (someone really holds it: an apply or resume of the run elsewhere).
    """
    deadline = trio.current_time() + RUN_LOCK_WAIT
    delay = 0.005
    with contextlib.ExitStack() as stack:
        while True:
            try:
                stack.enter_context(hold_run_lock(run_dir, run_id, doing="apply"))
                break
            except RunBusy:
                if trio.current_time() >= deadline:
                    raise
            await trio.sleep(delay)
            delay = min(delay * 2, 0.2)
        yield


def _notify(listener: Callable[[RunEvent], None], event: RunEvent) -> None:
    call_listener(listener, event, event_type=event.type)


def _event_entry(entry: RepoOutcome) -> dict[str, Any]:
    data = entry.to_json()
    data.pop("name", None)
    return data


def _since(began: float) -> float:
    return round(time.monotonic() - began, 3)


def _one_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0] if "\n" in text else text


def _child_error(result: Mapping[str, Any], outcome: RunOutcome) -> str:
    """Why a child run did not succeed, one line: its first failed instance's error."""
    if outcome.status == "conflicts":
        conflicts = result.get("conflicts") or []
        return f"merge conflicts ({len(conflicts)})"
    if outcome.workspace_changed:
        return "not applied: the repository changed during the run"
    steps = result.get("steps")
    for name, step in steps.items() if isinstance(steps, Mapping) else ():
        instances = step.get("instances") if isinstance(step, Mapping) else None
        for key, inst in instances.items() if isinstance(instances, Mapping) else ():
            if isinstance(inst, Mapping) and inst.get("status") == "failed" and inst.get("error"):
                where = name if key in (None, "", name) else f"{name}[{key}]"
                return f"{where}: {str(inst['error']).splitlines()[0]}"
    error = result.get("error")
    return str(error).splitlines()[0] if error else f"run {outcome.status}"


def _budget(
    max_tokens: int | None, max_cost: float | None, max_seconds: float | None, on_budget: str
) -> RunBudget:
    for name, value in (
        ("max_tokens", max_tokens),
        ("max_cost", max_cost),
        ("max_seconds", max_seconds),
    ):
        if value is not None and (isinstance(value, bool) or not value > 0):
            raise UsageError(f"{name} must be above 0, not {value!r}")
    if on_budget not in ("finish", "cancel"):
        raise UsageError(f"on_budget is finish or cancel, not {on_budget!r}")
    return RunBudget(
        max_tokens=max_tokens,
        max_cost=max_cost,
        max_seconds=max_seconds,
        on_spent=on_budget,  # type: ignore[arg-type]
    )


def _positive(name: str, value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise UsageError(f"{name} must be a whole number of 1 or more, not {value!r}")


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
    ``repo`` in their data. The other options are :func:`run_pipeline`'s.

    Bad input (the pipeline, its inputs, the list, an option) raises before anything is
    recorded or started; a repository that cannot be reached (a clone that fails) fails alone.
    """
    check_trio_face("batch")  # before anything starts
    root = Path(cwd).expanduser().resolve()
    if not root.is_dir():
        raise UsageError(f"the batch's directory {cwd} is not a directory")
    pipe = pipeline if isinstance(pipeline, Pipeline) else load_pipeline(pipeline)
    values = pipe.check_inputs(inputs or {})
    _positive("max_repos", max_repos)
    _positive("max_sessions", max_sessions)
    if push is not None and git_branch is None:
        raise UsageError("pushing needs a git branch to push: name the branch to commit on")
    if apply and git_branch is not None:
        raise UsageError(
            "apply writes the changes into each checkout, a git branch commits them beside it: "
            "choose one"
        )
    _check_message(message)
    if message is not None and git_branch is None:
        raise UsageError("a commit message template needs a git branch to commit on")
    budget = _budget(max_tokens, max_cost, max_seconds, on_budget)
    specs = await trio.to_thread.run_sync(_read_repos, repos, repos_file, root)
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
    state = state_directory(state_dir, workspace=root)
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
        "repos": [s.to_json() for s in specs],
        "maxRepos": repos_at_once,
        "maxSessions": sessions,
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
        "policy": _policy_source(policy),
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
) -> BatchOutcome:
    """Run (or resume: ``previous`` holds the earlier attempt's entries) the batch ``record``."""
    batch_id = record.run_id
    options = record.options
    run_dir = state / "runs" / batch_id
    resuming = bool(previous)
    with hold_run_lock(run_dir, batch_id, doing="resume"):
        async with open_run_store(state) as store:
            if resuming:
                await store.update_run(batch_id, status="running", finished=None, error=None)
            else:
                await store.create_run(record)
            job = _Batch(
                store=store,
                batch_id=batch_id,
                state=state,
                pipe=pipe,
                inputs=values,
                specs=specs,
                config=cfg,
                budget=budget,
                slots=trio.Semaphore(int(options["maxSessions"])),
                max_repos=int(options["maxRepos"]),
                max_sessions=int(options["maxSessions"]),
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
) -> BatchOutcome:
    """Run batch ``batch_id`` again: the repositories that succeeded are kept; the others run
    again, each resuming its child run (only the steps that did not succeed run again) or, when
    it has none (a clone that failed, a repository skipped), starting one.

    The batch goes on with its recorded options (repositories, apply, branch, push, budgets);
    a budget counts again from nothing, and ``max_tokens``, ``max_cost``, ``max_seconds``,
    ``on_budget``, ``max_repos``, ``max_sessions`` and ``policy`` replace the recorded ones.
    """
    check_trio_face("resume_batch")  # before anything starts
    _positive("max_repos", max_repos)
    _positive("max_sessions", max_sessions)
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
    specs = tuple(RepoSpec.from_json(r) for r in options.get("repos") or ())
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
    budget = _budget(
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
    )


def _policy_source(policy: str | os.PathLike[str] | PolicySet | None) -> str | None:
    """The policy as the batch's record keeps it: a name or a file, or a mark for one given in
    code (a resume then needs it given again)."""
    if policy is None or isinstance(policy, str):
        return policy
    if isinstance(policy, os.PathLike):
        return os.fspath(policy)
    return GIVEN_IN_CODE


#: how the record names a policy given as a :class:`PolicySet`
GIVEN_IN_CODE = "(given in code)"


def _json_values(values: Mapping[str, Any]) -> dict[str, Any]:
    from .run import _json_inputs

    return _json_inputs(values)

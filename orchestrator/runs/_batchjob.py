"""One attempt of a batch: its repositories' entries and the work of each (checkout, child run,
commit, push), at most so many at once (see :mod:`.batch`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import trio

from .._log import get_logger
from ..config import Config
from ..errors import (
    OrchestratorError,
    PushFailed,
    RepoUnavailable,
    RunBusy,
    RunNotFound,
    UsageError,
)
from ..pipeline import Pipeline
from ..pipeline._budget import RunBudget
from ..pipeline._recording import call_listener
from ..pipeline.results import RunEvent
from ..store import RunStore
from ._batchinput import DEFAULT_MESSAGE, REDACTED
from ._batchrepo import (
    RepoOutcome,
    budget_only_failures,
    child_figures,
    push_branch,
)
from ._clones import open_checkout
from ._lock import LOCK_PATIENCE, wait_run_lock
from ._repos import RepoSpec
from .apply import apply_recorded
from .resume import resume_run
from .run import RunOutcome, run_pipeline

log = get_logger(__name__)

#: seconds between two writes of a running batch's object to its record
RESULT_EVERY = 1.0


@attrs.define(eq=False)
class BatchJob:
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
        self.emit("repo_started", repo=spec.name, source=spec.shown)
        try:
            entry = await self._work(spec, entry)
        except Exception as e:  # a defect of ours, or the OS: this repository fails, not all
            log.exception("repository failed", repo=spec.name)
            entry = self.entries[spec.name].evolve(
                status="failed", exit_code=1, error=f"internal error: {type(e).__name__}: {e}"
            )
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
        if spec.url is not None and REDACTED in spec.url:  # a resume whose clone is gone
            return entry.evolve(
                status="failed",
                exit_code=2,
                error=f"the credentials of {spec.url} are not recorded and its clone is gone: "
                "start a new batch with the repository list",
            )
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
                # known at once: a batch interrupted from now on resumes this run, not a new one
                self.entries[name] = self.entries[name].evolve(run_id=event.run_id)
            if self.on_event is not None:
                _notify(self.on_event, attrs.evolve(event, data={**event.data, "repo": name}))

        wants = getattr(self.on_event, "wants_updates", True) if self.on_event else False
        on_event.wants_updates = wants  # type: ignore[attr-defined]
        try:
            if resumed is not None:
                return await self._resume_child(resumed, on_event)
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

    async def _resume_child(self, run_id: str, on_event: Callable[[RunEvent], None]) -> RunOutcome:
        """Resume the repository's earlier child run; its lock may be held a moment by another
        run moving leftovers (see :func:`wait_run_lock`): it waits for it as an apply does."""
        deadline = trio.current_time() + LOCK_PATIENCE
        while True:
            try:
                return await resume_run(
                    run_id,
                    state_dir=self.state,
                    config=self.config,
                    apply=self.apply,
                    on_event=on_event,
                    _budget=self.budget,
                    _slots=self.slots,
                    **{k: v for k, v in self.run_options.items() if k in _RESUME_OPTIONS},
                )
            except RunBusy:  # refused before anything started: nothing to undo
                if trio.current_time() >= deadline:
                    raise
                await trio.sleep(0.02)

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
            message = (self.message or DEFAULT_MESSAGE).format(
                batch_id=self.batch_id, run_id=run_id, pipeline=self.pipe.name, repo=entry.name
            )
            message = message if message.endswith("\n") else message + "\n"
            try:
                async with wait_run_lock(self.state / "runs" / run_id, run_id, doing="apply"):
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
_RESUME_OPTIONS = frozenset(
    {"policy", "escalate", "max_sessions", "connector", "sandbox", "_cluster"}
)


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

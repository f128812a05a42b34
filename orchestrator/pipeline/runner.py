"""Running a pipeline: the DAG scheduled on trio, each step on its own branch, all recorded.

Each step starts as soon as the steps it depends on are done. Before a step runs, the branches
of its parents are merged (its ``merge`` strategy settles conflicts, or the step fails with them)
and every instance of the step forks its own branch from the merge: one per agent and per item
when it fans out. Agent steps get a session leased from an :class:`AgentPool` (the
:class:`~orchestrator.supervisor.Supervisor`) in their branch's directory; Python steps run in a
worker thread (or on the loop, if ``async``). A failed step skips its descendants with the cause;
independent steps go on. Everything is written to the run store as it happens, so a run can be
shown, resumed (finished instances are reused with their branches) and applied later.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, Protocol, TypeVar

import structlog
import trio
from attrs import define, field

from ..agent.client import AcpSession
from ..agent.content import PromptInput
from ..agent.elicitation import PolicyElicitationService
from ..agent.permissions import Escalate, PolicyPermissionService
from ..agent.services import ClientServices
from ..agent.terminals import open_terminal_service
from ..agent.turn import TurnResult
from ..agents import AgentSpec
from ..errors import UsageError
from ..policy import PolicySet
from ..protocol import types as t
from ..store import AddConflicts, AddEvent, AddPermissions, PutChanges, PutStep, StepRecord
from ..vfs import (
    Branch,
    BranchFileSystem,
    ChangeSet,
    MergeResult,
    Snapshot,
    Workdir,
    materialize,
    merge_branches,
)
from ._branches import change_kinds, conflict_json, diff_of, stored_changes
from ._calls import (
    MISSING,
    call,
    describe,
    item_key,
    jsonable,
    prompt_input,
    run_verify,
    safe,
    stored_value,
    update_event,
)
from ._writer import StoreWriter
from .results import EventType, Results, RunEvent, StepContext, StepResult, StepStatus
from .spec import Pipeline, Step

__all__ = ["AgentPool", "BranchIO", "LeaseLike", "PipelineRunner"]

log = structlog.get_logger(__name__)

EventSink = Callable[[RunEvent], None]
_T = TypeVar("_T")
_U = TypeVar("_U")


class LeaseLike(Protocol):
    """What the runner needs of a leased session."""

    @property
    def session(self) -> AcpSession: ...

    async def prompt(
        self,
        prompt: PromptInput,
        *,
        timeout: float | None = None,
        idle_timeout: float | None = None,
        on_update: Callable[[t.SessionUpdate], None] | None = None,
    ) -> TurnResult: ...


class AgentPool(Protocol):
    """Where agent steps get their sessions (the supervisor satisfies it)."""

    def lease(
        self,
        spec: AgentSpec,
        *,
        cwd: str | os.PathLike[str],
        services: ClientServices | None = None,
        step: str | None = None,
    ) -> AbstractAsyncContextManager[LeaseLike]: ...


@define(eq=False)
class StepState:
    """A step's progress in one run."""

    step: Step
    status: StepStatus = "pending"
    done: trio.Event = field(factory=trio.Event)
    #: instance key (None for a single instance) -> its result or value
    outputs: dict[str | None, Any] = field(factory=dict)
    #: the branches of the succeeded instances, for the step's dependents
    branches: list[Branch] = field(factory=list)
    error: str | None = None
    cause: str | None = None
    started: float | None = None
    finished: float | None = None
    #: instances failed (for the summary)
    failures: dict[str | None, str] = field(factory=dict)
    #: the failed step a skip comes from (through skipped steps), if any
    root_failure: str | None = None
    #: conflicts found merging the parents: (conflict JSON)
    conflicts: list[dict[str, Any]] = field(factory=list)

    def value(self) -> Any:
        """What a dependent receives."""
        if self.step.fans_out:
            return Results(self.step.name, {str(k): v for k, v in self.outputs.items()})
        return self.outputs.get(None)


@define(eq=False)
class BranchIO:
    """What a run spent on branch directories: creating, harvesting and removing them.

    ``<kind>_seconds`` is the wall time of the operations (measured around them in their worker
    thread), ``<kind>_cpu_seconds`` their CPU time and ``<kind>_count`` how many ran, for kinds
    ``materialize``, ``harvest`` and ``remove``. ``critical_seconds`` is the wall time during
    which some step waited for its directory to be made or harvested, or the run waited for the
    last removals (``drain_seconds``, also counted in ``critical_seconds``): time that counts in
    the run's wall time. Removals run in the background otherwise, beside the next steps.
    """

    seconds: dict[str, float] = field(factory=dict)
    cpu_seconds: dict[str, float] = field(factory=dict)
    counts: dict[str, int] = field(factory=dict)
    critical_seconds: float = 0.0
    drain_seconds: float = 0.0
    _waiting: int = 0
    _since: float = 0.0

    def add(self, kind: str, count: int, seconds: float, cpu: float) -> None:
        """Count ``count`` operations of ``kind`` that took ``seconds`` (``cpu`` of CPU)."""
        self.seconds[kind] = self.seconds.get(kind, 0.0) + seconds
        self.cpu_seconds[kind] = self.cpu_seconds.get(kind, 0.0) + cpu
        self.counts[kind] = self.counts.get(kind, 0) + count

    def wait_started(self) -> None:
        """A step (or the run) starts waiting for branch I/O."""
        if self._waiting == 0:
            self._since = time.perf_counter()
        self._waiting += 1

    def wait_ended(self) -> None:
        """It stopped waiting (overlapping waits count once)."""
        self._waiting -= 1
        if self._waiting == 0:
            self.critical_seconds += time.perf_counter() - self._since

    def to_json(self) -> dict[str, float | int]:
        """The figures as one flat mapping."""
        out: dict[str, float | int] = {
            "critical_seconds": self.critical_seconds,
            "drain_seconds": self.drain_seconds,
        }
        for kind in ("materialize", "harvest", "remove"):
            out[f"{kind}_seconds"] = self.seconds.get(kind, 0.0)
            out[f"{kind}_cpu_seconds"] = self.cpu_seconds.get(kind, 0.0)
            out[f"{kind}_count"] = self.counts.get(kind, 0)
        return out


def _timed(work: Callable[[], _T]) -> Callable[[], tuple[_T, float, float]]:
    """``work`` returning also its wall and CPU time (measured in the thread that runs it)."""

    def run() -> tuple[_T, float, float]:
        wall, cpu = time.perf_counter(), time.thread_time()
        result = work()
        return result, time.perf_counter() - wall, time.thread_time() - cpu

    return run


@define(eq=False)
class _Reaper:
    """Removes finished branch directories in the background, on a few threads of its own.

    Deleting a directory waits on the filesystem (an ``rmdir`` can take milliseconds on a
    journaled disk that discards freed blocks) and nothing a step reports depends on it, so
    steps queue their directories here and go on: queueing costs no thread hop. The threads
    start with the first directory; :meth:`finish` lets them empty the queue and joins them
    (the run waits for that, also when it is cancelled: no thread outlives the run).
    """

    io: BranchIO
    workers: int = 2
    _queue: queue.SimpleQueue[Workdir | None] = field(factory=queue.SimpleQueue)
    _threads: list[threading.Thread] = field(factory=list)
    #: per thread: [directories removed, wall seconds, CPU seconds], read after the join
    _totals: list[list[float]] = field(factory=list)

    def put(self, workdir: Workdir) -> None:
        """Queue ``workdir`` for removal (never waits)."""
        self._queue.put(workdir)
        if len(self._threads) < self.workers:
            totals = [0.0, 0.0, 0.0]
            thread = threading.Thread(
                target=self._serve, args=(totals,), name="branch-reaper", daemon=True
            )
            self._totals.append(totals)
            self._threads.append(thread)
            thread.start()

    def _serve(self, totals: list[float]) -> None:
        while (workdir := self._queue.get()) is not None:
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                workdir.remove()
            except Exception:  # a directory left behind must not stop the others
                log.exception("removing a branch directory failed", directory=workdir.root)
            totals[0] += 1
            totals[1] += time.perf_counter() - wall
            totals[2] += time.thread_time() - cpu

    def _join(self) -> None:
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            thread.join()

    async def finish(self) -> None:
        """Wait until every queued directory is removed (shield it when cancelled)."""
        if self._threads:
            await trio.to_thread.run_sync(self._join)
        for count, seconds, cpu in self._totals:
            self.io.add("remove", int(count), seconds, cpu)
        self._threads, self._totals = [], []


@define(eq=False)
class PipelineRunner:
    """One run of one pipeline; :meth:`run` executes it (see :mod:`orchestrator.api`)."""

    pipeline: Pipeline
    inputs: Mapping[str, Any]
    run_id: str
    workspace: Path
    snapshot: Snapshot
    #: the run store's write-behind queue
    writer: StoreWriter
    pool: AgentPool
    resolve_agent: Callable[[str], AgentSpec]
    run_dir: Path
    policy: PolicySet = field(factory=PolicySet)
    load_policy: Callable[[str], PolicySet] = PolicySet.load
    escalate: Escalate | None = None
    on_event: EventSink | None = None
    verify: Mapping[str, str] = field(factory=dict)
    #: instances already finished in an earlier attempt of this run: key -> (record, branch)
    reused: Mapping[str, tuple[StepRecord, Branch]] = field(factory=dict)
    parallel: int = 8
    states: dict[str, StepState] = field(factory=dict)
    _slots: trio.Semaphore = field(init=False)
    #: the specs of the agents in use, by label ("alice=demo" runs the demo agent as alice)
    _specs: dict[str, AgentSpec] = field(init=False, factory=dict)
    _branch_keys: dict[str, str | None] = field(init=False, factory=dict)
    #: what branch directories cost this run (see :meth:`statistics`)
    io: BranchIO = field(init=False, factory=BranchIO)
    _reaper: _Reaper = field(init=False)
    #: branch directory names taken in this run (names are made unique)
    _dir_names: set[str] = field(init=False, factory=set)
    #: branch name -> (net changes, diff against the run's base, own diff), from the turn
    _pending_diffs: dict[str, tuple[ChangeSet, str, str]] = field(init=False, factory=dict)
    #: policies by name, loaded once per run
    _policies: dict[str, PolicySet] = field(init=False, factory=dict)
    #: agents as resolved, by how steps name them
    _resolved: dict[str, AgentSpec] = field(init=False, factory=dict)
    #: each step's parents, in definition order
    _parents: dict[str, list[str]] = field(init=False, factory=dict)

    def __attrs_post_init__(self) -> None:
        self._slots = trio.Semaphore(max(self.parallel, 1))
        self.states = {name: StepState(s) for name, s in self.pipeline.steps.items()}
        self._reaper = _Reaper(self.io)
        # once for all steps (Pipeline.parents walks every step on each call)
        index = {name: i for i, name in enumerate(self.pipeline.steps)}
        graph = self.pipeline.graph
        self._parents = {
            name: sorted((p for p in graph.predecessors(name) if p in index), key=index.__getitem__)
            for name in self.pipeline.steps
        }

    def _agent(self, text: str) -> AgentSpec:
        spec = self._resolved.get(text)
        if spec is None:
            spec = self._resolved[text] = self.resolve_agent(text)
        return spec

    def statistics(self) -> dict[str, float | int]:
        """Branch directory I/O so far (see :class:`BranchIO`)."""
        return self.io.to_json()

    # ------------------------------------------------------------------ events

    async def emit(self, event: RunEvent) -> None:
        """Report ``event`` to the listener and keep it in the store."""
        self._emit(event)

    def _emit(self, event: RunEvent) -> None:
        if self.on_event is not None:
            try:
                self.on_event(event)
            except Exception:
                log.exception("event listener failed", event=event.type)
        self.writer.put(AddEvent(self.run_id, event.to_json()))

    def _emit_nowait(self, event: RunEvent) -> None:
        if self.on_event is not None:
            try:
                self.on_event(event)
            except Exception:
                log.exception("event listener failed", event=event.type)

    # ------------------------------------------------------------------ scheduling

    async def run(self) -> None:
        """Run every step, each as soon as its dependencies are done.

        Finished branch directories are removed in the background meanwhile; the run ends
        when they are all gone (also when it is cancelled).
        """
        try:
            async with trio.open_nursery() as nursery:
                for name in self.pipeline.order():
                    nursery.start_soon(self._run_step, self.states[name], name=f"step {name}")
        finally:
            # from here on the run only waits for the last removals
            self.io.wait_started()
            waiting = time.perf_counter()
            with trio.CancelScope(shield=True):
                await self._reaper.finish()
            self.io.wait_ended()
            self.io.drain_seconds += time.perf_counter() - waiting

    async def _run_step(self, state: StepState) -> None:
        step = state.step
        try:
            parents = self._parents[step.name]
            for dep in parents:
                await self.states[dep].done.wait()
            blocked = [d for d in parents if self.states[d].status != "succeeded"]
            if blocked:
                first = self.states[blocked[0]]
                if first.status == "failed":
                    state.root_failure = blocked[0]
                    cause = f"skipped because {blocked[0]} failed"
                elif first.root_failure is not None:
                    state.root_failure = first.root_failure
                    cause = f"skipped because {first.root_failure} failed (via {blocked[0]})"
                else:
                    cause = f"skipped because {blocked[0]} was skipped"
                self._skip(state, cause)
                return
            await self._execute(state)
        finally:
            state.done.set()

    def _skip(self, state: StepState, cause: str) -> None:
        state.status = "skipped"
        state.cause = cause
        state.finished = time.time()
        self._put_step(
            StepRecord(
                run_id=self.run_id,
                key=state.step.name,
                step=state.step.name,
                instance=None,
                agent=None,
                status="skipped",
                cause=cause,
                finished=state.finished,
            )
        )
        self._emit(RunEvent("step_skipped", self.run_id, state.step.name, data={"cause": cause}))

    def _arguments(self, step: Step, names: Sequence[str]) -> dict[str, Any]:
        args: dict[str, Any] = {}
        for name in names:
            if name in ("item", "workdir", "ctx"):
                continue
            if name in self.states:
                args[name] = self.states[name].value()
            elif name in self.inputs:
                args[name] = self.inputs[name]
        return args

    async def _execute(self, state: StepState) -> None:
        step = state.step
        state.started = time.time()
        args = self._arguments(step, step.dependencies)
        if step.when is not None:
            wanted = {k: v for k, v in args.items() if k in step.when_params}
            if not await call(step.when, wanted):
                self._skip(state, "its condition was false")
                return
        base = await self._merge_parents(state)
        if base is None:
            return
        instances = self._instances(step, args)
        state.status = "running"
        # pending records first, so the store lists instances in fan-out order
        for key, agent, _ in instances:
            name = f"{step.name}[{key}]" if key is not None else step.name
            if name not in self.reused:
                self._record(name, step, key, agent, "pending", 1)
        if len(instances) == 1:
            # one instance: no nursery of its own (a nursery costs more than the call)
            key, agent, item = instances[0]
            await self._instance(state, base, args, key, agent, item)
        else:
            async with trio.open_nursery() as nursery:
                for key, agent, item in instances:
                    nursery.start_soon(self._instance, state, base, args, key, agent, item)
        # fan-out order, not completion order: merges and Results must be deterministic
        order = {key: i for i, (key, _, _) in enumerate(instances)}
        state.outputs = dict(sorted(state.outputs.items(), key=lambda kv: order[kv[0]]))
        state.branches.sort(key=lambda b: order[self._branch_keys[b.name]])
        state.finished = time.time()
        if state.failures:
            state.status = "failed"
            first = next(iter(state.failures.items()))
            where = f"{step.name}[{first[0]}]" if first[0] is not None else step.name
            state.error = f"{where}: {first[1]}"
        else:
            state.status = "succeeded"

    def _instances(
        self, step: Step, args: Mapping[str, Any]
    ) -> list[tuple[str | None, str | None, Any]]:
        agents: list[str | None] = [None]
        if step.agents:
            specs = [self._agent(a) for a in step.agents]
            self._specs.update((spec.name, spec) for spec in specs)
            agents = [spec.name for spec in specs]
        if step.over is None:
            items: list[tuple[str | None, Any]] = [(None, MISSING)]
        else:
            source = args.get(step.over, MISSING)
            if source is MISSING:
                raise UsageError(f"step {step.name}: nothing to fan out over ({step.over})")
            values = (
                list(source.items()) if isinstance(source, Mapping) else list(enumerate(source))
            )
            items = [(item_key(k, v, isinstance(source, Mapping)), v) for k, v in values]
            if len({k for k, _ in items}) != len(items):
                items = [(str(i), v) for i, (_, v) in enumerate(items)]
        out: list[tuple[str | None, str | None, Any]] = []
        for agent in agents:
            for ikey, item in items:
                if len(agents) > 1 and ikey is not None:
                    key: str | None = f"{agent}/{ikey}"
                elif len(agents) > 1:
                    key = agent
                else:
                    key = ikey
                out.append((key, agent, item))
        return out

    async def _merge_parents(self, state: StepState) -> Branch | MergeResult | Snapshot | None:
        """The tree the step's instances fork from; None when the merge failed the step."""
        step = state.step
        branches = [b for dep in self._parents[step.name] for b in self.states[dep].branches]
        if not branches:
            return self.snapshot
        if len(branches) == 1:
            return branches[0]
        merged = await trio.to_thread.run_sync(
            lambda: merge_branches(branches, strategy=step.merge)
        )
        for conflict in merged.resolved:
            state.conflicts.append(conflict_json(step.name, conflict, step.merge))
        for conflict in merged.conflicts:
            state.conflicts.append(conflict_json(step.name, conflict, "fail"))
        if state.conflicts:
            self.writer.put(AddConflicts(self.run_id, step.name, list(state.conflicts)))
            for c in state.conflicts:
                self._emit(
                    RunEvent(
                        "conflict",
                        self.run_id,
                        step.name,
                        data={k: c[k] for k in ("path", "kind", "branches", "resolution")},
                    )
                )
        if merged.conflicts:
            paths = ", ".join(sorted({c.path for c in merged.conflicts}))
            state.status = "failed"
            state.error = f"merge conflict in {paths} (merge={step.merge!r})"
            state.finished = time.time()
            self._put_step(
                StepRecord(
                    run_id=self.run_id,
                    key=step.name,
                    step=step.name,
                    instance=None,
                    agent=None,
                    status="failed",
                    error=state.error,
                    started=state.started,
                    finished=state.finished,
                )
            )
            self._emit(RunEvent("step_failed", self.run_id, step.name, data={"error": state.error}))
            return None
        return merged

    # ------------------------------------------------------------------ one instance

    async def _instance(
        self,
        state: StepState,
        base: Branch | MergeResult | Snapshot,
        args: Mapping[str, Any],
        key: str | None,
        agent: str | None,
        item: Any,
    ) -> None:
        step = state.step
        name = f"{step.name}[{key}]" if key is not None else step.name
        reused = self.reused.get(name)
        if reused is not None:
            record, branch = reused
            state.outputs[key] = (
                StepResult.from_json(record.result) if record.result is not None else record.value
            )
            state.branches.append(branch)
            self._branch_keys[branch.name] = key
            self._emit(RunEvent("step_reused", self.run_id, step.name, key, agent))
            return
        attempt = 1
        while True:
            # an instance counts as started once it holds a slot (not while it waits for one)
            # and keeps it until its outcome is recorded
            async with self._slots:
                retry = await self._run_attempt(state, base, args, name, key, agent, item, attempt)
            if not retry:
                return
            attempt += 1

    async def _run_attempt(
        self,
        state: StepState,
        base: Branch | MergeResult | Snapshot,
        args: Mapping[str, Any],
        name: str,
        key: str | None,
        agent: str | None,
        item: Any,
        attempt: int,
    ) -> bool:
        """One attempt of one instance, recorded; True when it failed and may be retried."""
        step = state.step
        branch = _fork(base, name)
        self._pending_diffs.pop(name, None)
        started = time.time()
        self._record(name, step, key, agent, "running", attempt, started=started)
        self._emit(
            RunEvent("step_started", self.run_id, step.name, key, agent, {"attempt": attempt})
        )
        try:
            output = await self._attempt(state, branch, args, name, key, agent, item, attempt)
        except trio.Cancelled:
            raise
        except Exception as e:
            error = describe(e)
            if attempt <= step.retries:
                self._emit(
                    RunEvent(
                        "step_retry",
                        self.run_id,
                        step.name,
                        key,
                        agent,
                        {"error": error, "attempt": attempt},
                    )
                )
                return True
            state.failures[key] = error
            self._record(name, step, key, agent, "failed", attempt, started=started, error=error)
            self._emit(
                RunEvent("step_failed", self.run_id, step.name, key, agent, {"error": error})
            )
            return False
        if isinstance(output, StepResult) and not output.ok:
            state.failures[key] = output.error or "failed"
        else:
            state.outputs[key] = output
            state.branches.append(branch)
            self._branch_keys[branch.name] = key
        self._finish(name, step, key, agent, output, branch, attempt, started)
        return False

    async def _attempt(
        self,
        state: StepState,
        branch: Branch,
        args: Mapping[str, Any],
        name: str,
        key: str | None,
        agent: str | None,
        item: Any,
        attempt: int,
    ) -> Any:
        step = state.step
        ctx = StepContext(
            run_id=self.run_id,
            step=step.name,
            key=key,
            agent=agent,
            workspace=self.workspace,
            inputs=self.inputs,
            attempt=attempt,
        )
        call_args = {k: v for k, v in args.items() if k in step.params}
        if "ctx" in step.params:
            call_args["ctx"] = ctx
        if "item" in step.params:
            call_args["item"] = item
        needs_dir = agent is not None or step.wants_workdir
        if not needs_dir:
            return await call(step.fn, call_args)
        workdir = await self._branch_io(
            "materialize", lambda: materialize(branch, self._directory(name, attempt))
        )
        try:
            if "workdir" in step.params:
                call_args["workdir"] = Path(workdir.root)
            if agent is None:
                value = await call(step.fn, call_args)
                await self._harvest(workdir)
                return value
            prompt = await call(step.fn, call_args, inline=True)
            return await self._agent_turn(step, name, key, agent, item, prompt, workdir, attempt)
        finally:
            # removed in the background: nothing the step reports depends on it
            self._reaper.put(workdir)

    def _directory(self, name: str, attempt: int) -> Path:
        """A fresh directory for one attempt's branch: one level under ``branches/``."""
        base = f"{safe(name)}-{attempt}"
        unique, n = base, 1
        # distinct instance names can look alike once made safe for a file name
        while unique in self._dir_names:
            n += 1
            unique = f"{base}.{n}"
        self._dir_names.add(unique)
        return self.run_dir / "branches" / unique

    async def _branch_io(self, kind: str, work: Callable[[], _T]) -> _T:
        """``work`` (directory I/O of a step) in a worker thread, timed into :attr:`io`."""
        result, _ = await self._branch_io_then(kind, work, lambda: None)
        return result

    async def _branch_io_then(
        self, kind: str, work: Callable[[], _T], then: Callable[[], _U]
    ) -> tuple[_T, _U]:
        """:meth:`_branch_io`, and ``then`` (not I/O, not timed) in the same thread hop."""
        timed = _timed(work)

        def both() -> tuple[tuple[_T, float, float], _U, float]:
            first = timed()
            started = time.perf_counter()
            return first, then(), time.perf_counter() - started

        self.io.wait_started()
        try:
            (result, seconds, cpu), after, other = await trio.to_thread.run_sync(both)
        finally:
            self.io.wait_ended()
        self.io.add(kind, 1, seconds, cpu)
        # the waiting time above spans ``then`` too, which is not I/O
        self.io.critical_seconds -= other
        return result, after

    async def _harvest(self, workdir: Workdir) -> None:
        """Harvest the branch directory, and compute the branch's diffs in the same thread hop.

        The diffs are kept for :meth:`_finish` (and the agent step's result): nothing changes
        the branch after its last harvest. Only the harvest counts as directory I/O.
        """
        branch = workdir.branch
        _, diffs = await self._branch_io_then(
            "harvest", lambda: workdir.harvest(full=True), lambda: _diffs(branch)
        )
        self._pending_diffs[branch.name] = diffs

    async def _agent_turn(
        self,
        step: Step,
        name: str,
        key: str | None,
        agent: str,
        item: Any,
        prompt: Any,
        workdir: Workdir,
        attempt: int,
    ) -> StepResult:
        spec = self._specs[agent]
        policy = self._policy_for(step, spec)
        permission = PolicyPermissionService(policy, escalate=self.escalate)
        fs = BranchFileSystem(workdir)
        started = time.monotonic()
        budget = step.budget
        timeout = step.timeout
        if budget is not None and budget.max_seconds is not None:
            timeout = min(timeout or budget.max_seconds, budget.max_seconds)
        limit = budget.max_tokens if budget is not None else None
        over_budget: list[int] = []
        async with open_terminal_service(
            command_check=permission.check_command, on_exit=fs.on_terminal_exit
        ) as terminals:
            services = ClientServices(
                fs=fs,
                terminal=terminals,
                permission=permission,
                elicitation=PolicyElicitationService.from_policy(policy),
            )
            async with self.pool.lease(
                spec, cwd=workdir.root, services=services, step=name
            ) as lease:
                session = lease.session
                if step.mode:
                    await session.set_mode(step.mode)
                if step.model:
                    await session.set_model(step.model)
                exceeded = trio.Event()
                listener = self.on_event

                def on_update(update: t.SessionUpdate) -> None:
                    if listener is not None:
                        self._emit_nowait(update_event(self.run_id, step.name, key, agent, update))
                    if (
                        limit is not None
                        and isinstance(update, t.UsageUpdate)
                        and update.used > limit
                        and not exceeded.is_set()
                    ):
                        over_budget.append(update.used)
                        exceeded.set()

                # updates are only for the listener and the token budget: without either,
                # the turn need not call back at all
                wants_updates = listener is not None or limit is not None
                if limit is None:
                    turn = await lease.prompt(
                        prompt_input(prompt),
                        timeout=timeout,
                        idle_timeout=step.idle_timeout,
                        on_update=on_update if wants_updates else None,
                    )
                else:
                    async with trio.open_nursery() as nursery:

                        async def cancel_on_budget() -> None:
                            await exceeded.wait()
                            await session.cancel()

                        nursery.start_soon(cancel_on_budget)
                        turn = await lease.prompt(
                            prompt_input(prompt),
                            timeout=timeout,
                            idle_timeout=step.idle_timeout,
                            on_update=on_update,
                        )
                        nursery.cancel_scope.cancel()
                info = lease.session.connection.agent_info
        await self._harvest(workdir)
        for record in turn.permissions:
            self._emit(
                RunEvent(
                    "permission",
                    self.run_id,
                    step.name,
                    key,
                    agent,
                    {"verdict": record.verdict, "title": record.title, "rule": record.rule},
                )
            )
        verify = None
        command = self.verify.get(step.name)
        if command is not None:
            verify = await run_verify(command, Path(workdir.root))
        error = None
        if over_budget:
            error = f"budget exceeded: {over_budget[0]} tokens > {step.budget.max_tokens}"  # type: ignore[union-attr]
        branch = fs.workdir.branch
        # computed once here and reused when the instance is recorded
        diffs = self._pending_diffs[branch.name]
        return StepResult(
            step=step.name,
            key=key,
            agent=agent,
            status="failed" if error else "succeeded",
            text=turn.text,
            stop_reason=turn.stop_reason,
            item=jsonable(item),
            agent_info={"name": info.name, "version": info.version} if info else None,
            session_id=lease.session.session_id,
            tool_calls=tuple(c.to_json() for c in turn.tool_calls.values()),
            permissions=tuple(p.to_json() for p in permission.records),
            usage=turn.usage_json(),
            changes=change_kinds(branch.base, branch.changes),
            diff=diffs[2],
            verify=verify,
            error=error,
            wall_seconds=time.monotonic() - started,
            attempt=attempt,
        )

    def _policy_for(self, step: Step, spec: AgentSpec) -> PolicySet:
        chosen = step.policy or spec.policy
        if not chosen:
            return self.policy
        # loaded once per run: every step of the run sees the same rules
        policy = self._policies.get(chosen)
        if policy is None:
            policy = self._policies[chosen] = self.load_policy(chosen)
        return policy

    # ------------------------------------------------------------------ recording

    def _put_step(self, record: StepRecord) -> None:
        self.writer.put(PutStep(record))

    def _record(
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
    ) -> None:
        self._put_step(
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
            )
        )

    def _finish(
        self,
        name: str,
        step: Step,
        key: str | None,
        agent: str | None,
        output: Any,
        branch: Branch,
        attempt: int,
        started: float,
    ) -> None:
        branch.close()
        result = output if isinstance(output, StepResult) else None
        value, stored = (None, False) if result is not None else stored_value(output)
        status: StepStatus = result.status if result is not None else "succeeded"
        known = self._pending_diffs.pop(branch.name, None)
        net, run_diff, own_diff = known if known is not None else _diffs(branch)
        if result is not None:
            own_diff = result.diff
        self.writer.put(
            PutChanges(self.run_id, name, stored_changes(self.snapshot, net), run_diff, own_diff)
        )
        if result is not None and result.permissions:
            self.writer.put(
                AddPermissions(self.run_id, name, [dict(p) for p in result.permissions])
            )
        self._put_step(
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
                result=result.to_json() if result else None,
                value=value,
                value_stored=stored,
                error=result.error if result else None,
                usage=result.usage if result else None,
            )
        )
        data: dict[str, Any] = {"status": status, "changes": len(branch.changes)}
        if result is not None:
            data.update(stopReason=result.stop_reason, wallSeconds=round(result.wall_seconds, 3))
            if result.error:
                data["error"] = result.error
        kind: EventType = "step_finished" if status == "succeeded" else "step_failed"
        self._emit(RunEvent(kind, self.run_id, step.name, key, agent, data))


def _diffs(branch: Branch) -> tuple[ChangeSet, str, str]:
    """A branch's net changes, their diff against the run's base, and its own diff.

    The own diff is of the branch's changes against what it forked from (:func:`diff_of`);
    for a branch forked from the workspace with nothing undone that is the same diff, made once.
    """
    net = branch.net_changes()
    own = branch.changes
    if not net and not own:
        return net, "", ""
    run_diff = diff_of(branch, net)
    if branch.base is branch.root and net == own:
        return net, run_diff, run_diff
    return net, run_diff, diff_of(branch)


def _fork(base: Branch | MergeResult | Snapshot, name: str) -> Branch:
    if isinstance(base, Branch):
        return base.fork(name)
    if isinstance(base, MergeResult):
        return base.fork(name)
    return Branch.from_tree(base, name)

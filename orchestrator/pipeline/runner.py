"""Running a pipeline: the DAG scheduled on trio, each step on its own branch, all recorded.

Each step starts as soon as the steps it depends on are done. Before a step runs, the branches
of its parents are merged (its ``merge`` strategy settles conflicts, or the step fails with them)
and every instance of the step forks its own branch from the merge: one per agent and per item
when it fans out. Agent steps get a session leased from an :class:`AgentPool` (the
:class:`~orchestrator.supervisor.Supervisor`) in their branch's directory; Python steps run in a
worker thread (or on the loop, if ``async``). A failed step skips its descendants with the cause;
independent steps go on. Everything is written to the run store as it happens, so a run can be
shown, resumed (finished instances are reused with their branches) and applied later.

This module schedules the steps; its parts live beside it: ``_instance`` (one instance and its
attempts), ``_agent_step`` (an agent's turn), ``_branchio`` (branch directories and what they
cost), ``_recording`` (events and records for the store) and ``_state`` (what they share).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import trio
from attrs import define, field

from .._names import display_names
from .._sizes import DEFAULT_MAX_FILE_SIZE
from ..agent.permissions import Escalate
from ..agent.services import ClientServices
from ..agent.turn import DEFAULT_MAX_TURN_RECORD_BYTES
from ..agents import AgentSpec
from ..errors import ErrorKind, UsageError
from ..mcp import McpServer
from ..policy import PolicySet
from ..protocol import types as t
from ..sandbox import Sandbox
from ..store import StepRecord
from ..vfs import Branch, MergeResult, Snapshot, merge_branches
from ..vfs.pool import DirPool
from ._agent_step import AgentTurns, label_run_agents
from ._branchio import BranchCosts, BranchDirs, BranchIO
from ._budget import RunBudget
from ._calls import MISSING, call, describe, error_kind, fan_out_items, user_traceback
from ._instance import InstanceExecutor, fork_from
from ._recording import EventSink, Recorder
from ._remote import RemoteTurns
from ._state import AgentPool, LeaseLike, StepState
from ._writer import StoreWriter
from .branches import conflict_json
from .results import RunEvent
from .spec import Pipeline, Step

__all__ = ["AgentPool", "BranchIO", "LeaseLike", "PipelineRunner", "StepState", "label_run_agents"]


#: the background remover of branch directories, by the name it had here
@define(eq=False)
class PipelineRunner:
    """One run of one pipeline; :meth:`run` executes it (see :mod:`orchestrator.runs`)."""

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
    #: instances that failed their check in every round of an earlier attempt: key ->
    #: (record, branch); their first attempt goes on from that branch
    continued: Mapping[str, tuple[StepRecord, Branch]] = field(factory=dict)
    parallel: int = 8
    #: a callback for every session update of every agent turn
    on_update: Callable[[t.SessionUpdate], None] | None = None
    #: replaces the permission, terminal and elicitation services of every session
    services: ClientServices | None = None
    #: the run's agents under their labels, by how steps name them; None: resolved here
    #: with :attr:`resolve_agent` (see :func:`label_run_agents`)
    agents: Mapping[str, AgentSpec] | None = None
    #: the sandbox of each (step, agent label) whose agent runs confined
    sandboxes: Mapping[tuple[str, str], Sandbox] = field(factory=dict)
    #: the MCP servers of each (step, agent label) whose sessions get some
    mcp_servers: Mapping[tuple[str, str], tuple[McpServer, ...]] = field(factory=dict)
    #: the largest content (bytes) a changed file of a step's branch may have; a step's own
    #: ``max_file_size`` replaces it; None: no limit
    max_file_size: int | None = DEFAULT_MAX_FILE_SIZE
    #: what the run store keeps of a turn's text and of its tool calls, in bytes each (None:
    #: all of them); see :func:`~orchestrator.pipeline.results.cut_turn`
    max_turn_record_bytes: int | None = DEFAULT_MAX_TURN_RECORD_BYTES
    #: reuse finished branch directories for branches of the same tree (see
    #: :mod:`orchestrator.vfs.pool`); ``run_pipeline`` turns it off when the environment
    #: variable ``ORCHESTRATOR_REUSE_DIRS`` says no
    reuse_dirs: bool = True
    #: a budget the run shares with others (a batch's runs): every usage update counts against
    #: it; once spent, no instance starts (each is recorded skipped, error kind ``budget``) and
    #: running turns finish or are cancelled as it says (see :mod:`._budget`)
    budget: RunBudget | None = None
    #: the slots instances hold while they run, when shared with other runs (at most that many
    #: instances, so live sessions, across them all); None: the run's own, :attr:`parallel`
    slots: trio.Semaphore | None = None
    #: where agent turns run when not in this process (a cluster's nodes)
    remote: RemoteTurns | None = None
    states: dict[str, StepState] = field(factory=dict)
    #: files branches changed that changed in the workspace too before a branch kept their
    #: content, so merges found no base for them (see :attr:`MergeResult.base_gone`)
    base_gone: set[str] = field(init=False, factory=set)
    #: what branch directories cost this run (see :meth:`statistics`)
    io: BranchIO = field(init=False, factory=BranchIO)
    #: each step's parents, in definition order
    _parents: dict[str, list[str]] = field(init=False, factory=dict)
    # the parts of a run, made from the fields above
    _recorder: Recorder = field(init=False)
    _dirs: BranchDirs = field(init=False)
    _turns: AgentTurns = field(init=False)
    _executor: InstanceExecutor = field(init=False)

    def __attrs_post_init__(self) -> None:
        # steps whose agents run inputs name run with the agents the inputs give
        self.pipeline = self.pipeline.with_agents(self.inputs)
        self.states = {name: StepState(s) for name, s in self.pipeline.steps.items()}
        self._parents = {name: self.pipeline.parents(name) for name in self.pipeline.steps}
        self._recorder = Recorder(
            self.run_id, self.writer, self.snapshot, self.on_event, self.max_turn_record_bytes
        )
        pool = None
        if self.reuse_dirs:
            # as many as can be in use at once: one per slot
            pool = DirPool(str(self.run_dir / "branches" / ".pool"), max(self.parallel, 1))
        self._dirs = BranchDirs(
            self.run_dir, self.io, self.max_file_size, pool, limit=max(self.parallel, 1)
        )
        self._turns = AgentTurns(
            run_id=self.run_id,
            pool=self.pool,
            agents=(
                self.agents
                if self.agents is not None
                else label_run_agents(self.pipeline, self.resolve_agent)
            ),
            recorder=self._recorder,
            dirs=self._dirs,
            policy=self.policy,
            load_policy=self.load_policy,
            escalate=self.escalate,
            verify=self.verify,
            on_update=self.on_update,
            services=self.services,
            sandboxes=self.sandboxes,
            mcp_servers=self.mcp_servers,
            budget=self.budget,
        )
        slots = self.slots if self.slots is not None else trio.Semaphore(max(self.parallel, 1))
        self._executor = InstanceExecutor(
            run_id=self.run_id,
            workspace=self.workspace,
            inputs=self.inputs,
            reused=self.reused,
            continued=self.continued,
            slots=slots,
            recorder=self._recorder,
            dirs=self._dirs,
            turns=self._turns,
            budget=self.budget,
            remote=self.remote,
        )
        # this run's instances waiting for a slot will want directories: part of what a copy
        # would serve (the slots' own count would take in other runs' instances, when shared)
        executor = self._executor
        self._dirs.pending = lambda: executor.waiting

    def statistics(self) -> dict[str, float | int]:
        """Branch directory I/O so far (see :class:`BranchIO`)."""
        return self.io.to_json()

    @property
    def branch_costs(self) -> BranchCosts:
        """Branch directories made and reused so far, bytes copied and peak disk."""
        return self._dirs.costs

    @property
    def dir_pool(self) -> DirPool | None:
        """The run's pool of branch directories (None when reuse is off): its
        :attr:`~orchestrator.vfs.pool.DirPool.stats` count directories made and reused and
        what resetting them cost."""
        return self._dirs.pool

    async def emit(self, event: RunEvent) -> None:
        """Report ``event`` to the listener and keep it in the store."""
        self._recorder.emit(event)

    # ------------------------------------------------------------------ scheduling

    async def run(self) -> None:
        """Run every step, each as soon as its dependencies are done.

        Finished branch directories are removed in the background meanwhile; the run ends
        when they are all gone (also when it is cancelled).
        """
        # at its end the run only waits for the last removals
        async with self._dirs.serving(), trio.open_nursery() as nursery:
            for name in self.pipeline.order():
                nursery.start_soon(self._run_step, self.states[name], name=f"step {name}")

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
            try:
                await self._execute(state)
            except trio.Cancelled:
                raise
            except Exception as e:
                # a step's own set-up failed (its condition, its fan-out source): the step
                # fails and its descendants are skipped; the rest of the run goes on
                self._fail(state, describe(e), error_kind(e), traceback=user_traceback(e))
        finally:
            state.done.set()

    # A step that ends before any instance of it starts (skipped, or failed in its input
    # stage: its condition, its parents' merge, its fan-out source) ends here, once, with its
    # own record and one ending event; its instances report their own endings otherwise.

    def _skip(self, state: StepState, cause: str) -> None:
        state.status = "skipped"
        state.cause = cause
        state.finished = time.time()
        self._recorder.skipped(state.step.name, cause, state.finished)

    def _fail(
        self, state: StepState, error: str, kind: ErrorKind, *, traceback: str | None = None
    ) -> None:
        state.status = "failed"
        state.error = error
        state.error_kind = kind
        state.finished = time.time()
        self._recorder.step_failed(
            state.step.name, error, kind, state.started, state.finished, traceback=traceback
        )

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
        if not instances:
            # a fan-out over an empty source ran over nothing: done, and its dependents get
            # an empty Results; its own record says so, as no instance record can
            if not isinstance(base, Snapshot):
                # what its parents changed still reaches its dependents and the run's result
                passed = fork_from(base, step.name)
                passed.close()
                state.branches.append(passed)
            state.status = "succeeded"
            state.finished = time.time()
            self._recorder.no_instances(step.name, state.started, state.finished)
            return
        state.status = "running"
        # pending records first, so the store lists instances in fan-out order
        for key, agent, _ in instances:
            name = f"{step.name}[{key}]" if key is not None else step.name
            if name not in self.reused:
                self._recorder.record(name, step, key, agent, "pending", 1)
        if len(instances) == 1:
            # one instance: no nursery of its own (a nursery costs more than the call)
            key, agent, item = instances[0]
            await self._executor.run(state, base, args, key, agent, item)
        else:
            async with trio.open_nursery() as nursery:
                for key, agent, item in instances:
                    nursery.start_soon(self._executor.run, state, base, args, key, agent, item)
        # fan-out order, not completion order: merges and Results must be deterministic
        order = {key: i for i, (key, _, _) in enumerate(instances)}
        state.outputs = dict(sorted(state.outputs.items(), key=lambda kv: order[kv[0]]))
        branch_keys = self._executor.branch_keys
        state.branches.sort(key=lambda b: order[branch_keys[b.name]])
        state.finished = time.time()
        if state.failures:
            state.status = "failed"
            first = next(iter(state.failures.items()))
            where = f"{step.name}[{first[0]}]" if first[0] is not None else step.name
            state.error = f"{where}: {first[1]}"
            state.error_kind = state.failure_kinds.get(first[0], "internal")
        else:
            state.status = "succeeded"

    def _instances(
        self, step: Step, args: Mapping[str, Any]
    ) -> list[tuple[str | None, str | None, Any]]:
        agents: list[str | None] = [None]
        if step.agents:
            agents = list(self._turns.use(step.agents))
        if step.over is None:
            items: list[tuple[str | None, Any]] = [(None, MISSING)]
        else:
            source = args.get(step.over, MISSING)
            if source is MISSING:
                raise UsageError(f"step {step.name}: nothing to fan out over ({step.over})")
            items = list(fan_out_items(source))
        out: list[tuple[str | None, str | None, Any]] = []
        for agent in agents:
            for ikey, item in items:
                by_agent = len(agents) > 1 or step.keyed_by_agent
                if by_agent and ikey is not None:
                    key: str | None = f"{agent}/{ikey}"
                elif by_agent:
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
        self.base_gone.update(merged.base_gone)
        for conflict in merged.resolved:
            state.conflicts.append(conflict_json(step.name, conflict, step.merge))
        for conflict in merged.conflicts:
            state.conflicts.append(conflict_json(step.name, conflict, "fail"))
        if state.conflicts:
            self._recorder.conflicts(step.name, state.conflicts)
        if merged.conflicts:
            paths = ", ".join(display_names(sorted({c.path for c in merged.conflicts})))
            self._fail(state, f"merge conflict in {paths} (merge={step.merge!r})", "conflict")
            return None
        return merged

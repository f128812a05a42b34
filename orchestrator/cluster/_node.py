"""The supervisor of one cluster node: the one-machine supervisor, hosted in a Ray actor.

:class:`NodeSupervisor` is the actor's class (made remote by the driver, pinned to its node,
never restarted nor retried: a prompt costs money). It starts a trio loop in a thread and keeps
its token; each call is a plain method that hands the work to that loop. (An ``async def`` on the
class would make Ray run it as an asyncio actor and serialise every call: the coroutines live
at module level.)

Per run, the node opens a supervisor of its own (agent processes, transcripts under the node's
scratch directory) and branch directories; per turn it makes the instance's tree from the
manifest the driver sent, from the blobs it sent before (each once per node), runs the turn there
as the one-machine runner does (:class:`~orchestrator.pipeline._agent_step.AgentTurns`), and
gives back what the turn changed, its result and its events. Before each prompt it claims the
attempt's round with the coordinator (a prompt is never sent twice) and waits for the agent's
request rate.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio
from attrs import define, field, frozen

from .._log import get_logger
from ..agent import _sweep, reaper
from ..agent.services import ClientServices
from ..agent.session import ClientOptions
from ..agent.turn import TurnResult
from ..agents import AgentSpec
from ..errors import ClusterError
from ..pipeline._agent_step import AgentTurns
from ..pipeline._branchio import BranchDirs, BranchIO
from ..pipeline._budget import NotStarted, RunBudget
from ..pipeline._calls import MISSING, call, describe, error_kind, user_traceback
from ..pipeline._recording import Recorder
from ..pipeline._remote import RemoteReply, RemoteTurn
from ..pipeline._state import LeaseLike
from ..pipeline.results import RunEvent, StepResult
from ..policy import PolicySet
from ..protocol import types as t
from ..store.ops import PutSession
from ..supervisor import Limits, Supervisor, open_supervisor
from ..vfs import Branch, Snapshot, Workspace
from ..vfs.pool import DirPool
from ._keys import round_key
from ._trees import BlobStore, Manifest, TreeCache, change_states

__all__ = ["NodeSupervisor", "RunHostConfig"]

log = get_logger(__name__)

#: how long a node's supervisor may take to end its agents when it stops
STOP_GRACE = 20.0
#: how often the node's supervisor checks that the raylet that started it is alive
PARENT_POLL = 1.0
#: how often a node asks the coordinator whether the run's budget is spent, while turns of the
#: run run there (one question for all of them)
BUDGET_POLL = 0.2


@frozen
class RunHostConfig:
    """What a node needs to host one run's turns (picklable)."""

    run_id: str
    options: ClientOptions
    max_turn_transcript_bytes: int | None
    max_file_size: int | None
    #: what running turns do once the run's budget is spent; None: the run has no budget
    on_spent: str | None = None
    reuse_dirs: bool = True


#: base trees a run keeps on a node when no turn uses them (the next fan-out item reuses one)
KEEP_BASES = 4


@define(eq=False)
class _Base:
    """One base tree of a run on a node: its snapshot, and its hold on the tree cache."""

    snapshot: Snapshot
    held: contextlib.ExitStack
    users: int = 0


@define(eq=False)
class _RunHost:
    """One run's supervisor and branch directories on this node."""

    config: RunHostConfig
    directory: Path
    supervisor: Supervisor
    dirs: BranchDirs
    close: trio.Event = field(factory=trio.Event)
    closed: trio.Event = field(factory=trio.Event)
    #: the base trees of this run's turns by manifest digest, least recently used first: a
    #: snapshot of a tree cache directory, held there while turns use it (and a few after)
    bases: dict[str, _Base] = field(factory=dict)
    base_lock: trio.Lock = field(factory=trio.Lock)
    #: the budgets of the run's turns running here: one poll of the coordinator serves them
    budgets: set[_NodeBudget] = field(factory=set)
    #: set when a budget joins :attr:`budgets` (and replaced)
    joined: trio.Event = field(factory=trio.Event)
    #: the coordinator's word that the run's budget is spent, once it is
    spent: str | None = None


@define(eq=False)
class _NodeState:
    """What the node's trio loop holds."""

    node: str
    slots: int
    scratch: Path
    coordinator: Any
    store: BlobStore
    trees: TreeCache
    token: trio.lowlevel.TrioToken | None = None
    nursery: trio.Nursery | None = None
    runs: dict[str, _RunHost] = field(factory=dict)
    #: the cancel scope of each turn running, by the driver's call id
    calls: dict[str, trio.CancelScope] = field(factory=dict)
    #: turns cancelled before they began
    cancelled: set[str] = field(factory=set)
    stop: trio.Event = field(factory=trio.Event)
    #: the raylet that started this process is gone: the node is lost
    orphaned: bool = False


class NodeSupervisor:
    """The Ray actor of one node (see the module docstring); sync methods only."""

    def __init__(
        self,
        node: str,
        slots: int,
        coordinator: Any,
        scratch: str | None = None,
        *,
        in_ray: bool = True,
    ):
        # Ray kills a worker's children with it: the watchdog that ends the agents' process
        # trees when this process dies must not be one
        if in_ray:
            reaper.detach_watchdog()
        base = scratch or os.environ.get("ORCHESTRATOR_NODE_SCRATCH") or tempfile.gettempdir()
        _sweep_scratch(Path(base))
        root = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=base))
        # whose it is: a later supervisor on this node deletes it if this one was killed
        (root / OWNER).write_text(f"{os.getpid()} {_sweep.start_time(os.getpid())}\n")
        store = BlobStore(root / "blobs")
        self._state = _NodeState(
            node=node,
            slots=slots,
            scratch=root,
            coordinator=coordinator,
            store=store,
            trees=TreeCache(root / "trees", store),
        )
        started = threading.Event()
        self._thread = threading.Thread(
            target=trio.run, args=(_main, self._state, started), daemon=True, name="node-trio"
        )
        self._thread.start()
        started.wait()
        # however the actor ends (killed by Ray as its driver died: an exit of the process),
        # its agents and their commands end first
        if in_ray:  # (a test may host it in its own process)
            atexit.register(self.shutdown)
            # a node whose raylet died leaves its workers running: this one ends with it
            self._parent = os.getppid()
            threading.Thread(target=self._watch_parent, daemon=True, name="node-parent").start()

    def ready(self) -> int:
        """The actor's process id, once its loop runs."""
        return os.getpid()

    def open_run(self, config: RunHostConfig) -> None:
        """Host run ``config.run_id``'s turns (once per run)."""
        self._run(_open_run, self._state, config)

    def put_blobs(self, blobs: Mapping[str, bytes]) -> int:
        """Keep ``blobs`` (digest -> content, each checked); how many the node holds now."""
        _keep_blobs(self._state.store, blobs)
        return len(blobs)

    def run_turn(self, call_id: str, turn: RemoteTurn, manifest: Manifest) -> RemoteReply:
        """Run one turn on the tree of ``manifest``, whose blobs the node holds (see
        :meth:`put_blobs` and the module docstring)."""
        reply: RemoteReply = self._run(_serve_turn, self._state, call_id, turn, manifest)
        return reply

    def cancel(self, call_id: str) -> None:
        """Cancel turn ``call_id`` the ACP way; its :meth:`run_turn` returns what it did."""
        state = self._state
        assert state.token is not None
        trio.from_thread.run_sync(_cancel, state, call_id, trio_token=state.token)

    def close_run(self, run_id: str) -> dict[str, bytes]:
        """Stop hosting ``run_id`` (its agents end); its wire transcripts, by file name."""
        files: dict[str, bytes] = self._run(_close_run, self._state, run_id)
        return files

    def shutdown(self) -> None:
        """End every run's agents and the loop; the scratch directory is deleted."""
        state = self._state
        if state.token is not None and self._thread.is_alive():
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(state.stop.set, trio_token=state.token)
            self._thread.join(STOP_GRACE)
        shutil.rmtree(state.scratch, ignore_errors=True)

    def _watch_parent(self) -> None:
        while os.getppid() == self._parent:
            time.sleep(PARENT_POLL)
        log.warning("the node's raylet is gone: ending its agents", node=self._state.node)
        self._state.orphaned = True  # the turns it cuts short are the node's loss
        self.shutdown()
        os._exit(1)

    def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        state = self._state
        if state.token is None or not self._thread.is_alive():
            raise ClusterError(f"node {state.node}: its supervisor has stopped")
        return trio.from_thread.run(fn, *args, trio_token=state.token)


#: the scratch directories of node supervisors, and the file in each naming its process
SCRATCH_PREFIX = "orchestrator-node-"
OWNER = "owner"


def _sweep_scratch(base: Path) -> None:
    """Delete the scratch directories in ``base`` of node supervisors that are gone (killed
    with their node's worker, or their driver: what they held is nobody's now)."""
    try:
        entries = list(base.iterdir())
    except OSError:
        return
    for entry in entries:
        if not entry.name.startswith(SCRATCH_PREFIX) or not entry.is_dir():
            continue
        try:
            pid, started = (int(x) for x in (entry / OWNER).read_text().split())
        except (OSError, ValueError):
            continue  # not one of ours, or being made: left alone
        if not _sweep.running_since(pid, started):
            shutil.rmtree(entry, ignore_errors=True)


async def _main(state: _NodeState, started: threading.Event) -> None:
    state.token = trio.lowlevel.current_trio_token()
    async with trio.open_nursery() as nursery:
        state.nursery = nursery
        started.set()
        await state.stop.wait()
        for host in state.runs.values():
            host.close.set()
    for host in state.runs.values():
        _let_go(host, keep=0)


async def _open_run(state: _NodeState, config: RunHostConfig) -> None:
    if config.run_id in state.runs:
        return
    assert state.nursery is not None
    await state.nursery.start(_host_run, state, config)


async def _host_run(
    state: _NodeState, config: RunHostConfig, *, task_status: trio.TaskStatus[_RunHost]
) -> None:
    directory = state.scratch / "runs" / config.run_id
    await trio.to_thread.run_sync(lambda: directory.mkdir(parents=True, exist_ok=True))
    async with open_supervisor(
        Limits(
            max_sessions=state.slots,
            max_turn_transcript_bytes=config.max_turn_transcript_bytes,
        ),
        options=config.options,
        transcripts=directory / "transcripts",
        workdir=directory,
    ) as supervisor:
        pool = None
        if config.reuse_dirs:
            pool = DirPool(str(directory / "branches" / ".pool"), max(state.slots, 1))
        dirs = BranchDirs(directory, BranchIO(), config.max_file_size, pool, limit=state.slots)
        async with dirs.serving(), trio.open_nursery() as nursery:
            host = _RunHost(config, directory, supervisor, dirs)
            state.runs[config.run_id] = host
            if config.on_spent is not None and state.coordinator is not None:
                nursery.start_soon(_poll_budget, state, host)
            task_status.started(host)
            await host.close.wait()
            nursery.cancel_scope.cancel()
    host.closed.set()


async def _close_run(state: _NodeState, run_id: str) -> dict[str, bytes]:
    host = state.runs.get(run_id)
    if host is None:
        return {}
    host.close.set()
    await host.closed.wait()
    del state.runs[run_id]
    _let_go(host, keep=0)

    def collect() -> dict[str, bytes]:
        out = {}
        folder = host.directory / "transcripts"
        if folder.is_dir():
            out = {p.name: p.read_bytes() for p in sorted(folder.glob("*.jsonl"))}
        shutil.rmtree(host.directory, ignore_errors=True)
        return out

    return await trio.to_thread.run_sync(collect)


def _cancel(state: _NodeState, call_id: str) -> None:
    scope = state.calls.get(call_id)
    if scope is None:
        state.cancelled.add(call_id)  # not begun yet: it will not begin
    else:
        scope.cancel()


@asynccontextmanager
async def _base(state: _NodeState, host: _RunHost, manifest: Manifest) -> AsyncIterator[Snapshot]:
    """The tree of ``manifest`` as a snapshot of a directory of the node's tree cache, for the
    block: one per manifest per run, so instances of one tree share branch directories (the
    pool's key); held while turns use it, let go once :data:`KEEP_BASES` others are newer."""
    async with host.base_lock:
        base = host.bases.pop(manifest.digest, None)
        if base is None:

            def make() -> _Base:
                held = contextlib.ExitStack()
                try:
                    directory = held.enter_context(state.trees.open(manifest))
                    # every path shipped is part of the tree, whatever its patterns say, and
                    # no repository around the node's cache has a say
                    tree = frozenset(entry.path for entry in manifest.entries)
                    return _Base(Workspace.open(directory).snapshot(tracked=tree), held)
                except BaseException:
                    held.close()
                    raise

            base = await trio.to_thread.run_sync(make)
        host.bases[manifest.digest] = base  # the most recently used last
        base.users += 1
    try:
        yield base.snapshot
    finally:
        base.users -= 1
        _let_go(host, keep=KEEP_BASES)


def _let_go(host: _RunHost, *, keep: int) -> None:
    """Let the tree cache evict the bases no turn uses, but the ``keep`` most recent."""
    idle = [d for d, b in host.bases.items() if b.users == 0]
    for digest in idle[: max(len(idle) - keep, 0)]:
        host.bases.pop(digest).held.close()


class _Collect:
    """The listener and store writer of a turn's recorder on a node: it keeps the events the
    turn emits, for the driver to record; per-update events are declined (the driver's
    listener does not see a node's session updates)."""

    wants_updates = False

    def __init__(self) -> None:
        self.events: list[RunEvent] = []
        #: the sessions that served the turn (see :attr:`RemoteReply.sessions`)
        self.sessions: list[tuple[str, int, str, str, str]] = []

    def __call__(self, event: RunEvent) -> None:
        self.events.append(event)

    def put(self, op: object) -> None:
        """The driver stores the events and sessions it is given back; nothing else."""
        if isinstance(op, PutSession):
            s = op.session
            self.sessions.append((s.key, s.attempt, s.agent, s.source, s.session_id))


@define(eq=False)
class _NodeBudget(RunBudget):
    """The run's budget as a node sees it: what its sessions report goes to the coordinator,
    which says when the budget (shared by every node) is spent."""

    coordinator: Any = None
    call_id: str = ""
    #: the coordinator's word: how the budget was spent, once it is
    remote_spent: str | None = None
    #: each session's highest figures, for the driver: key -> (tokens, cost)
    latest: dict[str, tuple[int | None, float | None]] = field(factory=dict)

    def key(self, session: object) -> str:
        return f"{self.call_id}:{id(session)}"

    def observe(
        self, session: object, used: int | None, cost: float | None, *, run: str | None = None
    ) -> None:
        super().observe(session, used, cost, run=run)
        key = self.key(session)
        before = self.latest.get(key, (None, None))
        self.latest[key] = (_highest(before[0], used), _highest(before[1], cost))
        if self.coordinator is not None:
            # not waited for: the poll (and the driver) hears the verdict
            self.coordinator.observe.remote(key, used, cost, run)

    @property
    def spent(self) -> str | None:
        return self.remote_spent

    def learn(self, spent: str | None) -> None:
        if spent is not None and self.remote_spent is None:
            self.remote_spent = spent
            self._waiting.unpark_all()


def _is_ray_error(e: BaseException) -> bool:
    """Whether ``e`` is Ray's own (a call to the coordinator that failed)."""
    import ray

    return isinstance(e, ray.exceptions.RayError) or type(e).__module__.startswith("ray.")


def _highest(a: Any, b: Any) -> Any:
    if b is None or (a is not None and a >= b):
        return a
    return b


async def _ask(ref: Any) -> Any:
    import ray

    return await trio.to_thread.run_sync(ray.get, ref, abandon_on_cancel=True)


async def _poll_budget(state: _NodeState, host: _RunHost) -> None:
    """While turns of the run with a budget run here, ask the coordinator every
    :data:`BUDGET_POLL` seconds whether the budget is spent, for all of them at once."""
    while host.spent is None:
        if not host.budgets:
            await host.joined.wait()
            continue
        try:
            spent = await _ask(state.coordinator.spent.remote())
        except Exception as e:  # the coordinator out of reach for now: asked again
            log.warning("the coordinator did not answer", error=str(e).splitlines()[0])
            await trio.sleep(BUDGET_POLL)
            continue
        if spent is not None:
            host.spent = spent
            for budget in host.budgets:
                budget.learn(spent)
            return
        await trio.sleep(BUDGET_POLL)


@define(eq=False)
class _GatedLease:
    """A lease whose prompts each claim their round first and wait for the agent's rate."""

    inner: LeaseLike
    gate: Callable[[], Any]

    @property
    def session(self) -> Any:
        return self.inner.session

    async def prompt(self, prompt: Any, **kwargs: Any) -> TurnResult:
        await self.gate()
        return await self.inner.prompt(prompt, **kwargs)


@define(eq=False)
class _GatedPool:
    inner: Supervisor
    gate: Callable[[], Any]

    def lease(
        self,
        spec: AgentSpec,
        *,
        cwd: str | os.PathLike[str],
        services: ClientServices | None = None,
        step: str | None = None,
        mcp_servers: Sequence[t.McpServer] = (),
        instance: str | None = None,
    ) -> AbstractAsyncContextManager[LeaseLike]:
        return self._lease(
            spec,
            cwd=cwd,
            services=services,
            step=step,
            mcp_servers=mcp_servers,
            instance=instance,
        )

    @asynccontextmanager
    async def _lease(self, spec: AgentSpec, **kwargs: Any) -> AsyncIterator[LeaseLike]:
        async with self.inner.lease(spec, **kwargs) as lease:
            yield _GatedLease(lease, self.gate)


def _no_policy(name: str) -> PolicySet:
    raise ClusterError(f"policy {name!r}: a node runs the policy the driver resolved")


async def _serve_turn(
    state: _NodeState,
    call_id: str,
    turn: RemoteTurn,
    manifest: Manifest,
) -> RemoteReply:
    host = state.runs.get(turn.run_id)
    if host is None:
        raise ClusterError(f"node {state.node}: run {turn.run_id} is not open here")
    async with _base(state, host, manifest) as snapshot:
        return await _serve_on(state, host, snapshot, call_id, turn)


async def _serve_on(
    state: _NodeState, host: _RunHost, snapshot: Snapshot, call_id: str, turn: RemoteTurn
) -> RemoteReply:
    """:func:`_serve_turn` on the snapshot of its tree."""
    branch = Branch.from_tree(snapshot, turn.name)
    collect = _Collect()
    recorder = Recorder(
        turn.run_id,
        collect,  # type: ignore[arg-type]
        snapshot,
        collect,
        turn.max_turn_record_bytes,
    )
    step = turn.step
    coordinator = state.coordinator
    budget = _NodeBudget(
        call_id=call_id,
        coordinator=coordinator,
        on_spent=host.config.on_spent or "finish",  # type: ignore[arg-type]
    )
    rounds = 0

    async def gate() -> None:
        # a prompt goes once: the attempt's round is claimed first (a retried call finds it
        # taken), then the agent's request rate is waited for
        nonlocal rounds
        rounds += 1
        if coordinator is None:
            return
        key = round_key(turn, rounds)
        if not await _ask(coordinator.claim.remote(key, call_id)):
            raise ClusterError(
                f"{turn.name}: round {rounds} of attempt {turn.attempt} was sent before: "
                "not sent again"
            )
        while turn.rate_key is not None:
            wait = await _ask(coordinator.take.remote(turn.rate_key))
            if wait <= 0:
                return
            await trio.sleep(wait)

    turns = AgentTurns(
        run_id=turn.run_id,
        pool=_GatedPool(host.supervisor, gate),
        agents={turn.agent: turn.spec},
        recorder=recorder,
        dirs=host.dirs,
        policy=turn.policy,
        load_policy=_no_policy,
        escalate=None,
        verify={step.name: turn.verify} if turn.verify is not None else {},
        specs={turn.agent: turn.spec},
        sandboxes={(step.name, turn.agent): turn.sandbox} if turn.sandbox is not None else {},
        mcp_servers={(step.name, turn.agent): turn.mcp_servers} if turn.mcp_servers else {},
        budget=budget if host.config.on_spent is not None else None,
    )
    result: StepResult | None = None
    error: tuple[str, Any, str | None] | None = None
    not_started: str | None = None
    scope = trio.CancelScope()
    if call_id in state.cancelled:
        scope.cancel()
    state.calls[call_id] = scope
    budgeted = host.config.on_spent is not None and coordinator is not None
    try:
        with scope:
            if budgeted:
                # the coordinator's word now (before the first prompt), then the run's poll's
                budget.learn(host.spent or await _ask(coordinator.spent.remote()))
                host.budgets.add(budget)
                host.joined.set()
                host.joined = trio.Event()
            try:
                result = await _turn(host, turns, turn, branch)
            except NotStarted as e:
                not_started = e.spent
            except Exception as e:
                result = turns.take_interrupted(turn.name)
                error = (describe(e), error_kind(e), user_traceback(e))
                if _is_ray_error(e):  # the coordinator is out of reach: this node is cut off
                    error = (
                        f"node {state.node} lost the cluster: {describe(e)}",
                        "node-lost",
                        None,
                    )
    finally:
        host.budgets.discard(budget)
        state.calls.pop(call_id, None)
        state.cancelled.discard(call_id)
    cancelled = scope.cancelled_caught
    if cancelled:
        result = turns.take_interrupted(turn.name)
    if state.orphaned and (error is not None or cancelled):
        # ended because the node was lost (its supervisor ends its agents): said so
        cancelled = False
        lost = f"node {state.node} was lost during the turn (its raylet ended)"
        error = (lost, "node-lost", None)
    return RemoteReply(
        result=_portable(result),
        states=change_states(branch),
        events=tuple(collect.events),
        error=error,
        cancelled=cancelled,
        not_started=not_started,
        usage=tuple((key, used, cost) for key, (used, cost) in budget.latest.items()),
        sessions=tuple(collect.sessions),
    )


async def _turn(host: _RunHost, turns: AgentTurns, turn: RemoteTurn, branch: Branch) -> StepResult:
    step = turn.step
    workdir = await host.dirs.materialize(
        branch, turn.name, turn.attempt, max_file_size=turn.max_file_size
    )
    try:
        prompt = turn.prompt
        if prompt is None:  # the step function wants the branch directory
            args = {**turn.call_args, "workdir": Path(workdir.root)}
            prompt = await call(step.fn, args, inline=True)
        return await turns.turn(
            step,
            turn.name,
            turn.key,
            turn.agent,
            MISSING if turn.no_item else turn.item,
            prompt,
            workdir,
            turn.attempt,
            feedback=turn.feedback,
        )
    finally:
        host.dirs.remove(workdir)


def _keep_blobs(store: BlobStore, blobs: Mapping[str, bytes]) -> None:
    for digest, data in blobs.items():
        store.put(digest, data)


def _portable(result: StepResult | None) -> StepResult | None:
    """``result`` without its typed turn, which stays on the node (the record never held it)."""
    if result is None:
        return None
    return attrs.evolve(result, turn=None)

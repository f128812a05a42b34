"""The driver's side of a cluster: its nodes' supervisors, the coordinator, and placing turns.

:func:`open_cluster` connects to the cluster, starts one :class:`~._node.NodeSupervisor` actor
on each node that offers ``agent_slots`` (holding them) and one coordinator actor, and ends them
all with the block: their agents end with them. :meth:`ClusterSession.open_run` hosts one run on
every node; its :class:`ClusterTurns` place each agent turn on the node with the most free
slots, ship the instance's tree (only the blobs that node has not seen), and wait for the
reply in a worker thread (never ``ray.get`` on trio's thread).

No prompt is sent twice: the actors are never restarted and their calls never retried (Ray's
defaults would run a prompt again after a worker died), and each round of each attempt is
claimed with the coordinator before its prompt goes. A node lost during a turn leaves the
turn's outcome unknown: the instance fails with kind ``node-lost`` and the node takes no more
turns; a resume runs the instance again.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import attrs
import trio
from attrs import define, field

from .._log import get_logger
from ..agent.transcript import TranscriptFile
from ..agents import AgentSpec
from ..errors import ClusterError, OrchestratorError, UsageError
from ..pipeline._budget import RunBudget
from ..pipeline._remote import RemoteReply, RemoteTurn
from ..pipeline.spec import Step
from ..vfs import Branch
from ._connect import AgentNode, ClusterSpec, connect, import_ray
from ._coordinator import Coordinator
from ._keys import first_round_key
from ._node import NodeSupervisor, RunHostConfig
from ._trees import Manifest, blobs_for, manifest_of

__all__ = ["ClusterSession", "ClusterTurns", "open_cluster"]

log = get_logger(__name__)

#: how long a cancelled turn may take to end on its node and say what it did
CANCEL_GRACE = 15.0
#: how long a node's supervisor may take to start (its slots may be held by another run):
#: one that does not is left out
START_TIMEOUT = 60.0
#: the most blob bytes sent to a node in one call
SHIP_BYTES = 32 * 1024 * 1024
#: how long the nodes may take to end their agents at the end
STOP_TIMEOUT = 20.0


def _short(node_id: str) -> str:
    return node_id[:8]


@define(eq=False)
class _Node:
    info: AgentNode
    actor: Any
    free: int
    #: the blob digests it holds (it keeps them for the session)
    seen: set[str] = field(factory=set)
    lost: bool = False
    #: when a turn was last placed on it (a count): among nodes as free, the one that waited
    #: longest takes the next turn
    placed: int = 0
    #: held while blobs are sent to it: a turn needing blobs another turn is sending waits
    #: for them to be there
    shipping: trio.Lock = field(factory=trio.Lock)


@define(eq=False)
class ClusterSession:
    """A connection to a cluster and the actors of this process (see :func:`open_cluster`)."""

    spec: ClusterSpec
    ray: ModuleType
    nodes: list[_Node]
    coordinator: Any
    budget: RunBudget | None
    #: the worker threads waiting for replies
    waits: trio.CapacityLimiter = field(factory=lambda: trio.CapacityLimiter(1000))
    _changed: trio.Event = field(factory=trio.Event)
    _modules: set[str] = field(factory=set)
    _placed: int = 0

    @property
    def slots(self) -> int:
        """Agent slots of the nodes not lost."""
        return sum(n.info.slots for n in self.nodes if not n.lost)

    @asynccontextmanager
    async def open_run(
        self,
        config: RunHostConfig,
        transcripts: Path | None,
        copy: TranscriptFile | None = None,
    ) -> AsyncIterator[ClusterTurns]:
        """Host run ``config.run_id`` for the block, on each node when its first turn of the
        run goes there; at its end each of those nodes' wire transcripts are written to
        ``transcripts`` (``LABEL@NODE.jsonl``), and their lines to ``copy`` (the run's live
        transcript file), if given."""
        turns = ClusterTurns(self, config.run_id, config)
        try:
            yield turns
        finally:
            with trio.CancelScope(shield=True):
                for node in turns.hosted:
                    if node.lost:
                        continue
                    try:
                        files = await self._get(node.actor.close_run.remote(config.run_id))
                    except Exception as e:  # a node lost at the end: its transcripts with it
                        log.warning("node lost", node=_short(node.info.node_id), error=str(e))
                        node.lost = True
                        continue
                    if transcripts is not None and files:
                        await trio.to_thread.run_sync(
                            _write_transcripts, transcripts, _short(node.info.node_id), files
                        )
                    if copy is not None:
                        for data in files.values():
                            copy.write(data)

    async def _get(self, ref: Any, timeout: float | None = None) -> Any:
        ray = self.ray
        return await trio.to_thread.run_sync(
            lambda: ray.get(ref, timeout=timeout), abandon_on_cancel=True, limiter=self.waits
        )

    async def _take(self, digests: frozenset[str] = frozenset()) -> _Node:
        """The node with the most free slots, once one has a free slot; among those as free,
        the one that holds the most of ``digests`` (the turn's tree), then the one idle
        longest."""
        while True:
            live = [n for n in self.nodes if not n.lost]
            if not live:
                raise ClusterError("no node of the cluster is left to run agents")
            node = max(live, key=lambda n: (n.free, -len(digests - n.seen), -n.placed))
            if node.free > 0:
                node.free -= 1
                self._placed += 1
                node.placed = self._placed
                return node
            await self._changed.wait()

    def _give(self, node: _Node) -> None:
        node.free += 1
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _by_value(self, step: Step) -> None:
        """The pipeline's own modules travel by value: a node cannot import a pipeline file
        loaded here (nor a test's module)."""
        for fn in (step.fn, step.check, step.feedback):
            name = getattr(fn, "__module__", None)
            if not isinstance(name, str) or name in self._modules:
                continue
            if name.split(".")[0] in ("orchestrator", "builtins"):
                continue
            module = sys.modules.get(name)
            if module is not None:
                self.ray.cloudpickle.register_pickle_by_value(module)
                self._modules.add(name)


@define(eq=False)
class ClusterTurns:
    """One run's agent turns on the cluster (satisfies
    :class:`~orchestrator.pipeline._remote.RemoteTurns`)."""

    session: ClusterSession
    run_id: str
    config: RunHostConfig
    #: the request rate each agent's prompts count against (the rate's name), by label
    rate_keys: dict[str, str] = field(factory=dict)
    #: the nodes hosting the run (its first turn there opened it), in that order
    hosted: list[_Node] = field(factory=list)
    _hosting: dict[int, trio.Event] = field(factory=dict)
    #: the manifests of the trees fresh branches forked from: id -> (tree, manifest); the
    #: instances of a fan-out share one
    _manifests: dict[int, tuple[object, Manifest]] = field(factory=dict)

    async def _manifest(self, branch: Branch) -> Manifest:
        """``branch``'s manifest; a branch with no changes of its own has its base's."""
        if branch.changes:
            return await trio.to_thread.run_sync(manifest_of, branch)
        base = branch.base
        known = self._manifests.get(id(base))
        if known is not None and known[0] is base:
            return known[1]
        manifest = await trio.to_thread.run_sync(manifest_of, branch)
        self._manifests[id(base)] = (base, manifest)
        return manifest

    async def _host(self, node: _Node) -> None:
        """Open the run on ``node`` unless it is (once: turns placed there meanwhile wait)."""
        opened = self._hosting.get(id(node))
        if opened is not None:
            await opened.wait()
            return
        opened = self._hosting[id(node)] = trio.Event()
        try:
            await self.session._get(node.actor.open_run.remote(self.config))
            self.hosted.append(node)
        finally:
            opened.set()

    async def run_turn(
        self,
        turn: RemoteTurn,
        branch: Branch,
        *,
        on_cancelled: Callable[[RemoteReply], None],
    ) -> RemoteReply:
        """Run ``turn`` on a node (see the module docstring). A node lost before the turn's
        first prompt was claimed (so never sent) is left, and the turn placed on another."""
        session = self.session
        turn = attrs.evolve(turn, rate_key=self.rate_keys.get(turn.agent))
        manifest = await self._manifest(branch)
        digests = manifest.digests()
        while True:
            node = await session._take(digests)
            try:
                reply, unsent = await self._on(node, turn, branch, manifest, digests, on_cancelled)
            finally:
                session._give(node)
            if not unsent:
                return reply
            log.info("placed again: its node was lost before it began", instance=turn.name)

    async def _on(
        self,
        node: _Node,
        turn: RemoteTurn,
        branch: Branch,
        manifest: Manifest,
        digests: frozenset[str],
        on_cancelled: Callable[[RemoteReply], None],
    ) -> tuple[RemoteReply, bool]:
        """``turn`` on ``node``: its reply, and whether the node was lost before its first
        prompt was claimed (the turn may go elsewhere)."""
        session = self.session
        session._by_value(turn.step)
        call_id = uuid.uuid4().hex
        ref = None
        try:
            await self._host(node)
            async with node.shipping:
                while not digests <= node.seen:
                    # in parts: a large tree never sits whole in memory or in one message
                    seen = frozenset(node.seen)
                    blobs = await trio.to_thread.run_sync(
                        functools.partial(blobs_for, branch, manifest, seen, limit=SHIP_BYTES)
                    )
                    await session._get(node.actor.put_blobs.remote(blobs))
                    node.seen.update(blobs)
            try:
                ref = node.actor.run_turn.remote(call_id, turn, manifest)
            except Exception as e:  # it cannot be pickled: said without the objects' reprs
                return _failed(turn, _unsendable(session.ray, turn, e), "usage"), False
            reply: RemoteReply = await session._get(ref)
        except trio.Cancelled:
            if ref is None:
                raise
            with trio.CancelScope(shield=True), trio.move_on_after(CANCEL_GRACE):
                node.actor.cancel.remote(call_id)
                with contextlib.suppress(Exception):
                    on_cancelled(from_node(_short(node.info.node_id), await session._get(ref)))
            raise
        except Exception as e:
            if not _is_lost(session.ray, e):
                return _failed(turn, f"{turn.name}: {_cause(e)}", "internal"), False
            node.lost = True
            session._wake()
            where = _short(node.info.node_id)
            log.warning("node lost", node=where, instance=turn.name, error=_cause(e))
            first = first_round_key(turn)
            holder = await session._get(session.coordinator.holder.remote(first))
            if holder != call_id:  # never claimed: its prompt was never sent
                return _failed(turn, "", "node-lost"), True
            return _failed(
                turn,
                f"node {where} was lost during the turn: its outcome is unknown "
                "(not sent again; a resume runs it)",
                "node-lost",
            ), False
        return from_node(_short(node.info.node_id), reply), False


def rate_keys_of(
    rates: Mapping[str, Any],
    agents: Iterable[AgentSpec],
    resolve: Callable[[str], AgentSpec],
    *,
    strict: bool = True,
) -> dict[str, str]:
    """Which rate each agent's prompts count against, by the agent's label: the rate named
    by its label, by the agent its label names a model of (``claude`` for ``claude:opus``),
    or by the agent the rate's name resolves to (the same program, whatever its label: so
    ``x=claude`` counts against ``claude``'s rate too). With ``strict``, a rate that no agent
    of the run counts against is a :class:`~orchestrator.errors.UsageError`."""
    programs: dict[str, tuple[str, ...]] = {}
    for name in rates:
        # not an agent's name: it may still be a label
        with contextlib.suppress(OrchestratorError):
            programs[name] = resolve(name).command
    keys: dict[str, str] = {}
    for spec in agents:
        for name in rates:
            label = spec.name
            if name in (label, label.partition(":")[0]) or programs.get(name) == spec.command:
                keys[label] = name
                break
    unused = [name for name in rates if name not in keys.values()]
    if strict and unused:
        raise UsageError(f"the rate of {unused[0]!r} names no agent of the run")
    return keys


def _unsendable(ray: ModuleType, turn: RemoteTurn, error: BaseException) -> str:
    """Why ``turn`` cannot go to a node, in one line naming the part that cannot be pickled;
    never the objects themselves (their reprs may hold secrets: an agent's environment)."""
    step = turn.step
    parts = (
        ("check function", step.check if callable(step.check) else None),
        ("feedback function", step.feedback),
        ("prompt function", step.fn if turn.prompt is None else None),
        ("inputs", dict(turn.call_args) or None),
        ("item", turn.item),
        ("prompt", turn.prompt),
    )
    what = "turn"
    for part, value in parts:
        if value is None:
            continue
        try:
            ray.cloudpickle.dumps(value)
        except Exception as e:
            what, error = part, e
            break
    text = str(error).splitlines()[0] if str(error) else ""
    cause = type(error).__name__ + (f": {text}" if text and len(text) <= 120 else "")
    return f"step {step.name}: its {what} cannot be sent to a cluster node ({cause})"


def _failed(turn: RemoteTurn, message: str, kind: Any) -> RemoteReply:
    return RemoteReply(result=None, states={}, events=(), error=(message, kind, None))


def _cause(e: BaseException) -> str:
    cause = getattr(e, "cause", None)
    if isinstance(cause, BaseException):
        return f"{type(cause).__name__}: {cause}"
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def _is_lost(ray: ModuleType, e: BaseException) -> bool:
    """Whether ``e`` says the actor (its node, its worker) is gone: any error of Ray's own, not
    one our code raised in the actor (a ``RayTaskError``)."""
    exc = ray.exceptions
    return isinstance(e, exc.RayError) and not isinstance(e, exc.RayTaskError)


def from_node(where: str, reply: RemoteReply) -> RemoteReply:
    """``reply`` of node ``where`` with its sessions' transcript sources named as the driver
    keeps that node's transcripts (``LABEL@NODE``, see :func:`_write_transcripts`)."""
    if not reply.sessions:
        return reply
    sessions = tuple(
        (name, attempt, agent, f"{source}@{where}", session_id)
        for name, attempt, agent, source, session_id in reply.sessions
    )
    return attrs.evolve(reply, sessions=sessions)


def _write_transcripts(folder: Path, node: str, files: dict[str, bytes]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        stem = name[: -len(".jsonl")] if name.endswith(".jsonl") else name
        (folder / f"{stem}@{node}.jsonl").write_bytes(data)


@asynccontextmanager
async def open_cluster(
    spec: ClusterSpec, *, budget: RunBudget | None = None
) -> AsyncIterator[ClusterSession]:
    """Connect to the cluster ``spec`` names and start this process's actors on it, for the
    block (see the module docstring). ``budget``: the run's (or batch's) budget, held by the
    coordinator for every node. Raises :class:`~orchestrator.errors.ClusterError` when Ray is
    not installed, the cluster cannot be reached, or no node offers agent slots."""
    ray = import_ray()
    with connect(spec) as nodes:
        strategies = ray.util.scheduling_strategies
        # the coordinator lives on the head: the cluster lives and dies with it (the driver's
        # own node may be any node, and be lost like any)
        here = _head_node(ray) or ray.get_runtime_context().get_node_id()
        coordinator = (
            ray.remote(Coordinator)
            .options(
                num_cpus=0,
                max_restarts=0,
                max_task_retries=0,
                scheduling_strategy=strategies.NodeAffinitySchedulingStrategy(here, soft=False),
            )
            .remote(
                max_tokens=budget.max_tokens if budget is not None else None,
                max_cost=budget.max_cost if budget is not None else None,
                max_seconds=budget.max_seconds if budget is not None else None,
                rates=dict(spec.rates),
            )
        )
        remote = ray.remote(NodeSupervisor)
        made: list[_Node] = []
        try:
            for info in nodes:
                actor = remote.options(
                    num_cpus=0,
                    resources={"agent_slots": info.slots},
                    max_concurrency=info.slots * 2 + 8,
                    max_restarts=0,
                    max_task_retries=0,
                    scheduling_strategy=strategies.NodeAffinitySchedulingStrategy(
                        info.node_id, soft=False
                    ),
                ).remote(_short(info.node_id), info.slots, coordinator)
                made.append(_Node(info, actor, info.slots))
            session = ClusterSession(spec, ray, made, coordinator, budget)
            failures: list[str] = []

            async def ready(node: _Node) -> None:
                try:
                    await session._get(node.actor.ready.remote(), timeout=START_TIMEOUT)
                except Exception as e:  # a node that died (or is dying): left out
                    node.lost = True
                    where = _short(node.info.node_id)
                    log.warning("node left out", node=where, error=_cause(e))
                    failures.append(f"node {where}: its supervisor did not start: {_cause(e)}")

            async with trio.open_nursery() as nursery:
                for node in made:
                    nursery.start_soon(ready, node)
            if all(n.lost for n in made):
                raise ClusterError(
                    failures[0]
                    if len(failures) == 1
                    else f"no node's supervisor started ({failures[0]}; ...)"
                )
            if budget is not None:
                await session._get(coordinator.start.remote())
            yield session
        finally:
            with trio.CancelScope(shield=True):
                await _stop(ray, made, coordinator)


def _head_node(ray: ModuleType) -> str | None:
    """The head node's id, if Ray says which it is."""
    for node in ray.nodes():
        if node.get("Alive") and "node:__internal_head__" in (node.get("Resources") or {}):
            return str(node["NodeID"])
    return None


async def _stop(ray: ModuleType, nodes: list[_Node], coordinator: Any) -> None:
    """End every node's supervisor (its agents end), then the actors."""
    refs = [n.actor.shutdown.remote() for n in nodes if not n.lost]

    def wait() -> None:
        with contextlib.suppress(Exception):
            ray.wait(refs, num_returns=len(refs), timeout=STOP_TIMEOUT)
        for node in nodes:
            with contextlib.suppress(Exception):
                ray.kill(node.actor, no_restart=True)
        with contextlib.suppress(Exception):
            ray.kill(coordinator, no_restart=True)

    if refs or nodes:
        await trio.to_thread.run_sync(wait)

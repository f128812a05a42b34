"""A cluster session without Ray, for tests: the nodes' supervisors run in this process.

:class:`InProcessCluster` stands where :class:`orchestrator.cluster._driver.ClusterSession`
does (``run_pipeline(..., _cluster=...)``): each node is a real
:class:`~orchestrator.cluster._node.NodeSupervisor` (its own trio loop in a thread, its own
supervisor, tree cache and branch directories), called from worker threads as Ray would call
it, with manifests and blobs shipped as the driver ships them. What Ray adds (placement, loss
of a node, the coordinator) is tested against a real loopback cluster in test_cluster.py.
"""

from __future__ import annotations

import functools
import shutil
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio
from attrs import define, field

from orchestrator.cluster._driver import from_node
from orchestrator.cluster._node import NodeSupervisor, RunHostConfig
from orchestrator.cluster._trees import blobs_for, manifest_of
from orchestrator.pipeline._remote import RemoteReply, RemoteTurn
from orchestrator.vfs import Branch


@define
class _Spec:
    address: str = "in-process"
    rates: dict[str, object] = field(factory=dict)


@define(eq=False)
class InProcessCluster:
    """Nodes in this process (see the module docstring)."""

    nodes: list[NodeSupervisor]
    spec: _Spec = field(factory=_Spec)
    #: (node index, instance name) of every turn run, in order
    placed: list[tuple[int, str]] = field(factory=list)
    #: the blob digests each node was sent
    seen: list[set[str]] = field(factory=list)
    calls: ThreadPoolExecutor = field(factory=lambda: ThreadPoolExecutor(16))
    _next: int = 0

    @property
    def slots(self) -> int:
        return 2 * len(self.nodes)

    @asynccontextmanager
    async def open_run(
        self, config: RunHostConfig, transcripts: Path | None, copy: Any = None
    ) -> AsyncIterator[_Turns]:
        for node in self.nodes:
            await trio.to_thread.run_sync(node.open_run, config)
        try:
            yield _Turns(self)
        finally:
            for i, node in enumerate(self.nodes):
                files = await trio.to_thread.run_sync(node.close_run, config.run_id)
                if transcripts is not None:
                    transcripts.mkdir(parents=True, exist_ok=True)
                    for name, data in files.items():
                        (transcripts / f"{name[:-6]}@n{i}.jsonl").write_bytes(data)
                if copy is not None:
                    for data in files.values():
                        copy.write(data)


@define(eq=False)
class _Turns:
    cluster: InProcessCluster
    rate_keys: dict[str, str] = field(factory=dict)

    async def run_turn(
        self,
        turn: RemoteTurn,
        branch: Branch,
        *,
        on_cancelled: Callable[[RemoteReply], None],
    ) -> RemoteReply:
        cluster = self.cluster
        index = cluster._next % len(cluster.nodes)  # round robin
        cluster._next += 1
        cluster.placed.append((index, turn.name))
        node = cluster.nodes[index]
        manifest = manifest_of(branch)
        blobs = blobs_for(branch, manifest, cluster.seen[index])
        await trio.to_thread.run_sync(node.put_blobs, blobs)
        cluster.seen[index].update(blobs)
        call_id = uuid.uuid4().hex
        # the call runs in a thread of its own, as an actor's does: a future stands for Ray's
        # object reference
        future = cluster.calls.submit(node.run_turn, call_id, turn, manifest)
        try:
            reply: RemoteReply = await trio.to_thread.run_sync(
                future.result, abandon_on_cancel=True
            )
        except trio.Cancelled:
            # as the driver does: cancel the turn on its node, keep what it did
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(node.cancel, call_id)
                on_cancelled(from_node(f"n{index}", await trio.to_thread.run_sync(future.result)))
            raise
        return from_node(f"n{index}", reply)


@asynccontextmanager
async def in_process_cluster(count: int = 2) -> AsyncIterator[InProcessCluster]:
    """``count`` nodes of 2 slots each, shut down at the end (their agents end)."""
    nodes: list[NodeSupervisor] = []
    made = None
    try:
        for i in range(count):
            made_node = functools.partial(NodeSupervisor, f"n{i}", 2, None, in_ray=False)
            nodes.append(await trio.to_thread.run_sync(made_node))
        made = InProcessCluster(nodes, seen=[set() for _ in nodes])
        yield made
    finally:
        with trio.CancelScope(shield=True):
            for node in nodes:
                await trio.to_thread.run_sync(node.shutdown)
            if made is not None:
                made.calls.shutdown()


EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def copy_sample(tmp_path: Path, name: str) -> Path:
    """A copy of examples/sample-project at ``tmp_path/name``."""
    dest = tmp_path / name
    shutil.copytree(EXAMPLES / "sample-project", dest)
    return dest


def summary(outcome: Any) -> dict[str, Any]:
    """What a run's result says, apart from ids, times and where it ran: the same on a
    cluster as on one machine."""
    result = outcome.result
    steps = {
        name: (s["status"], {key: i["status"] for key, i in s["instances"].items()})
        for name, s in result["steps"].items()
    }
    conflicts = [(c["path"], c.get("resolution")) for c in result.get("conflicts") or ()]
    patch = Path(outcome.run_dir, "changes.patch")
    return {
        "status": outcome.status,
        "steps": steps,
        "conflicts": conflicts,
        "patch": patch.read_text() if patch.exists() else None,
    }

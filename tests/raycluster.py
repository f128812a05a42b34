"""A loopback Ray cluster for tests: two nodes on this machine, each offering agent slots.

Ray reads some settings when it is first imported, so :func:`ray_env` must run before anything
imports ray; :func:`start_cluster` does it. The cluster binds 127.0.0.1 only, keeps its files
under a short temporary directory (Ray's socket paths must stay under 107 bytes), uses no auth
token and sends no usage statistics. It is stopped by :meth:`LoopbackCluster.shutdown`, which
also SIGKILLs every process the cluster started that outlived it (never ``ray stop``: that
would kill every Ray process on the machine).
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: what each node offers unless a test asks otherwise
SLOTS = 2
#: the object store of each node (Ray's default is 30 % of the RAM, in /dev/shm)
OBJECT_STORE = 100_000_000

#: how the head finds a node dead: a missed health check every second, 5 in a row (Ray's
#: defaults take about 16 s here; a node stalled for seconds on a loaded CI box stays alive)
HEALTH_CHECK = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 1000,
    "health_check_timeout_ms": 3000,
    "health_check_failure_threshold": 5,
}

#: Ray's settings for a loopback cluster, set before ray is imported
RAY_ENV = {
    # otherwise Ray rewrites 127.0.0.1 to the LAN address and binds gRPC to every interface
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    # otherwise a first ray.init writes ~/.ray/auth_token and later clusters use token auth
    "RAY_AUTH_MODE": "disabled",
}


def ray_env() -> Path:
    """Set :data:`RAY_ENV` and a short ``RAY_TMPDIR`` (``/tmp/rayci-<pid>``) in this process,
    which the cluster's processes and the CLI subprocesses of tests inherit; the directory."""
    tmp = Path(f"/tmp/rayci-{os.getpid()}")
    tmp.mkdir(exist_ok=True)
    os.environ.update(RAY_ENV)
    os.environ["RAY_TMPDIR"] = str(tmp)
    return tmp


def _processes() -> dict[int, int]:
    """Every process alive now: its parent, by process id (from /proc)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return parents


#: the processes this process started for loopback clusters (each cluster's roots: its head's
#: and nodes' processes); what runs below them is the clusters' (Ray's workers, our actors).
#: Tests that look for processes a run left behind pass over them: a session's cluster stays
#: up while other tests run.
ROOTS: set[int] = set()


def is_cluster_process(pid: int) -> bool:
    """Whether ``pid`` is one of :data:`ROOTS`."""
    return pid in ROOTS


def _descendants(roots: set[int]) -> set[int]:
    """``roots`` and every descendant of theirs alive now."""
    children: dict[int, list[int]] = {}
    for pid, ppid in _processes().items():
        children.setdefault(ppid, []).append(pid)
    found = set(roots)
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _direct_children() -> set[int]:
    me = os.getpid()
    return {pid for pid, ppid in _processes().items() if ppid == me}


def _start_time(pid: int) -> str | None:
    """The start time of ``pid`` (to tell it from a later process given the same id)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _kill(pid: int, started: str | None) -> None:
    """SIGKILL ``pid`` if it is still the process that started at ``started``, and wait until
    it is gone (a pidfd becomes readable when the process exits; a zombie is gone enough)."""
    if started is None or _start_time(pid) != started:
        return
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        if _start_time(pid) != started:  # the id was reused before the pidfd was taken
            return
        signal.pidfd_send_signal(fd, signal.SIGKILL)
        select.select([fd], [], [], 30)
    except ProcessLookupError:
        pass
    finally:
        os.close(fd)


class LoopbackCluster:
    """Ray's ``cluster_utils.Cluster`` on this machine: a head node and more nodes, each with
    ``agent_slots``. This process (the tests' driver) is not connected by it: a test connects
    with ``ray.init(address=cluster.address)`` (or :func:`orchestrator.cluster._connect.connect`)
    and disconnects (``ray.shutdown()``) when it is done."""

    def __init__(self, tmp: Path, slots: int = SLOTS, *, own_tmp: bool = True) -> None:
        import ray.cluster_utils

        self.tmp = tmp
        self._own_tmp = own_tmp
        #: seconds it took to come up (every node), to shut down (set by :func:`start_cluster`)
        self.up_seconds: float | None = None
        self.down_seconds: float | None = None
        #: every process the cluster started, with its start time; the ones this process
        #: started itself (Ray's node processes; the rest descend from them)
        self._started: dict[int, str | None] = {}
        self._roots: set[int] = set()
        before = _direct_children()
        # Any: ray.cluster_utils is partly typed
        self._cluster: Any = ray.cluster_utils.Cluster(
            initialize_head=True,
            connect=False,
            head_node_args={**self._node_args(slots), "_system_config": HEALTH_CHECK},
            shutdown_at_exit=False,
        )
        self._roots |= _direct_children() - before
        ROOTS.update(self._roots)
        self._note_processes()

    @staticmethod
    def _node_args(slots: int) -> dict[str, Any]:
        return {
            "num_cpus": 1,
            "resources": {"agent_slots": slots} if slots else {},
            "object_store_memory": OBJECT_STORE,
            "include_dashboard": False,
            "node_ip_address": "127.0.0.1",
        }

    def _note_processes(self) -> None:
        """Note the processes of this cluster alive now: those this process started for it and
        their descendants (not another cluster's: tests may run two)."""
        for pid in _descendants(self._roots):
            self._started.setdefault(pid, _start_time(pid))

    @property
    def address(self) -> str:
        """The head's GCS address, ``127.0.0.1:PORT``: for ``ray.init(address=...)`` and the
        CLI's cluster option."""
        return str(self._cluster.address)

    @property
    def nodes(self) -> list[Any]:
        """Ray's node objects of the cluster (the head first); ``.unique_id`` is the node id."""
        return list(self._cluster.list_all_nodes())

    def add_node(self, slots: int = SLOTS, *, ip: str = "127.0.0.1") -> Any:
        """Start one more node offering ``slots`` agent slots (``0``: none); waits until it
        joined. Returns it (for :meth:`remove_node`). ``ip``: another loopback address
        (``127.0.0.2``) keeps drivers of this machine off it: a driver attaches to a node of
        its own address, and loses the cluster with that node."""
        before = _direct_children()
        node = self._cluster.add_node(
            wait=True, **{**self._node_args(slots), "node_ip_address": ip}
        )
        self._roots |= _direct_children() - before
        ROOTS.update(self._roots)
        self._note_processes()
        return node

    def remove_node(self, node: Any) -> None:
        """Kill ``node``'s processes at once (a lost machine, not a drained one)."""
        self._note_processes()
        self._cluster.remove_node(node, allow_graceful=False)

    def shutdown(self) -> None:
        """Stop every node, then SIGKILL any process the cluster started that is still alive,
        and remove the temporary directory if this cluster made it."""
        self._note_processes()
        try:
            self._cluster.shutdown()
        finally:
            for pid, started in self._started.items():
                _kill(pid, started)
            if self._own_tmp:
                shutil.rmtree(self.tmp, ignore_errors=True)


def survivors(cluster: LoopbackCluster) -> list[int]:
    """The processes the cluster started that are still alive (zombies count as gone)."""
    alive = []
    for pid, started in cluster._started.items():
        if started is None or _start_time(pid) != started:
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X"):
            alive.append(pid)
    return alive


@contextlib.contextmanager
def start_cluster(nodes: int = 2, slots: int = SLOTS) -> Iterator[LoopbackCluster]:
    """A loopback cluster of ``nodes`` nodes (the head one of them), ``slots`` agent slots
    each (0: none), for the block. Several may run at once (each has its own ports)."""
    own = not Path(f"/tmp/rayci-{os.getpid()}").exists()
    tmp = ray_env()
    began = time.monotonic()
    cluster = LoopbackCluster(tmp, slots, own_tmp=own)
    try:
        for _ in range(nodes - 1):
            cluster.add_node(slots)
        cluster.up_seconds = time.monotonic() - began
        yield cluster
    finally:
        began = time.monotonic()
        cluster.shutdown()
        cluster.down_seconds = time.monotonic() - began

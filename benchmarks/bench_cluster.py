"""Cluster benchmark: the per-instance overhead of running agent turns on a Ray cluster.

Run ``.venv/bin/python benchmarks/bench_cluster.py`` (``--help`` for the flags; needs the
``[ray]`` extra). Unless ``--cluster ADDR`` names a running cluster, the script starts a
loopback cluster of ``--nodes`` (default 2) nodes on this machine, ``--slots`` agent slots
each (default 2), bound to 127.0.0.1, with its files under a short ``/tmp/raybench-<pid>``
(no auth token, no usage statistics); its up and down times are reported apart, and every
process it started is gone at the end (SIGKILL for survivors; never ``ray stop``).

Each kind runs in a fresh worker process (this script with ``--worker``), ``--repeat`` times,
the one-machine and the cluster path alternating; the best run of each counts:

- **batch**: ``batch_sync`` of a one-step pipeline (the demo agent replaces ``old`` with
  ``new`` in ``app.txt``) over ``--repos`` small committed repositories (bench_batch.py's,
  made once into ``--cache``), no git branch, ``--max-repos`` (default: the cluster's slots)
  at a time: on this machine, and with ``cluster=`` (same ``max_repos``).
- **fanout**: ``run_pipeline_sync`` of one step ``over=`` ``--items`` items (each creates
  one file) in one project, ``max_sessions`` = the cluster's slots, on both paths.

A cluster worker connects first (timed apart: ``connect s``), so that the timed run holds
the run's own costs: the node supervisors and the coordinator started and stopped, trees
shipped, turns placed and replies handled. Figures: wall time per repository (item), and
per instance from the first instance's start to the last one's end (the span: without the
run's start and end, where the cluster session opens and closes), the per-instance overhead
of the cluster path (difference and ratio), and the driver process's
CPU per instance (all its threads, Ray's included; its children apart: agents and git on
this machine). Every run is checked: all succeeded, each repository's ``changes.patch`` the
same on both paths (the fan-out's too), the repositories untouched.

The **micro** section (a worker connected to the cluster) breaks the overhead down:
``manifest_of`` of a tree of 100 and 10,000 files (``--trees``; first, hashing; then again),
the blobs of that tree shipped to a node the first time (``blobs_for`` + ``put_blobs``),
again to a node that has them (the driver sends nothing: a set comparison) and resent
anyway, one actor round trip (``ready``), a run hosted and ended on a node
(``open_run``, ``close_run``: each repository of a batch is a run), one coordinator call
(``claim``, ``take``, ``spent``) one at a time and its throughput with many in flight (one
actor, one call at a time), and the cluster session's start and stop (``open_cluster``).
The coordinator calls of a turn are counted from the code paths (one claim and one take per
prompt; with a budget, one ``spent`` at the start and one every ``BUDGET_POLL`` seconds of
the turn, plus an ``observe`` per usage report).

``--json`` prints the figures as JSON (they are always written to ``--output``). The exit
status is 1 when a run was wrong. A script to run, never a timed test; Linux only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from pathlib import Path
from typing import Any

from bench_batch import FILES, PIPELINE, check_repos, make_repos

__all__ = ["main"]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results" / "cluster.json"
DEFAULT_CACHE = ROOT / ".cache" / "bench-batch"

#: Ray's settings for a loopback cluster (see tests/raycluster.py), set before ray is imported
RAY_ENV = {
    # otherwise Ray rewrites 127.0.0.1 to the LAN address and binds gRPC to every interface
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    # otherwise a first ray.init writes ~/.ray/auth_token and later clusters use token auth
    "RAY_AUTH_MODE": "disabled",
}
#: each node's object store (Ray's default is 30 % of the RAM, in /dev/shm)
OBJECT_STORE = 100_000_000

FANOUT = '''\
"""The benchmark's fan-out: one demo turn per item, each creating one file."""

from orchestrator import step


@step
def items() -> list[str]:
    """The items."""
    return [f"i{{n:05d}}" for n in range({items})]


@step(agent="demo", over="items")
def make(item: str) -> str:
    """One new file per item."""
    return f'create out/{{item}}.txt with "{{item}}"\\n'
'''

#: the tree sizes of the micro section (files)
TREE_SIZES = (100, 10_000)


# ---------------------------------------------------------------------------- the cluster


def _processes() -> dict[int, int]:
    """Every process alive now: its parent, by process id."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    return parents


def _start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _descendants() -> dict[int, str | None]:
    """This process's descendants alive now, with their start times."""
    children: dict[int, list[int]] = {}
    for pid, ppid in _processes().items():
        children.setdefault(ppid, []).append(pid)
    found: dict[int, str | None] = {}
    todo = [os.getpid()]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found[child] = _start_time(child)
                todo.append(child)
    return found


@contextmanager
def loopback_cluster(nodes: int, slots: int, times: dict[str, float]) -> Iterator[str]:
    """A loopback cluster of ``nodes`` nodes with ``slots`` agent slots each, for the block:
    its address. ``times`` gets ``up`` and ``down`` seconds. This process does not connect."""
    import ray.cluster_utils

    args = {
        "num_cpus": 1,
        "resources": {"agent_slots": slots},
        "object_store_memory": OBJECT_STORE,
        "include_dashboard": False,
        "node_ip_address": "127.0.0.1",
    }
    began = time.perf_counter()
    started: dict[int, str | None] = {}
    cluster: Any = None  # Any: ray.cluster_utils is partly typed
    try:
        cluster = ray.cluster_utils.Cluster(
            initialize_head=True, connect=False, head_node_args=args, shutdown_at_exit=False
        )
        for _ in range(nodes - 1):
            cluster.add_node(wait=True, **args)
        cluster.wait_for_nodes()
        times["up"] = time.perf_counter() - began
        started.update(_descendants())
        yield str(cluster.address)
    finally:
        started.update(_descendants())
        began = time.perf_counter()
        try:
            if cluster is not None:
                cluster.shutdown()
        finally:
            # whatever outlived the shutdown (never `ray stop`: every Ray process of the box)
            for pid, when in started.items():
                if when is not None and _start_time(pid) == when:
                    with suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            times["down"] = time.perf_counter() - began


# ---------------------------------------------------------------------------- the worker


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def _connected(address: str | None) -> AbstractContextManager[Any]:
    if address is None:
        return nullcontext()
    from orchestrator.cluster._connect import ClusterSpec, connect

    return connect(ClusterSpec(address))


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def worker(args: argparse.Namespace) -> int:
    """One run (``--kind``) in this process; its figures as JSON on stdout."""
    if args.kind == "micro":
        json.dump(micro(args), sys.stdout)
        return 0
    from orchestrator import batch_sync, run_pipeline_sync
    from orchestrator.pipeline.results import RunEvent

    address = args.address or None
    cluster = f"ray:{address}" if address else None
    # when the first instance began and the last one ended: the span without the run's (or
    # batch's) start and end, where the cluster session is opened and closed
    first: float | None = None
    last: float | None = None
    starts, ends = (
        (("repo_started",), ("repo_finished",))
        if args.kind == "batch"
        else (("step_started",), ("step_finished", "step_failed"))
    )

    def on_event(event: RunEvent) -> None:
        nonlocal first, last
        if args.kind == "fanout" and event.step != "make":
            return
        if event.type in starts and first is None:
            first = time.perf_counter()
        elif event.type in ends:
            last = time.perf_counter()

    on_event.wants_updates = False  # type: ignore[attr-defined]
    began = time.perf_counter()
    with _connected(address):
        connect_seconds = time.perf_counter() - began
        cpu = time.process_time()
        kids = _cpu(resource.RUSAGE_CHILDREN)
        began = time.perf_counter()
        if args.kind == "batch":
            outcome = batch_sync(
                args.pipeline,
                repos_file=args.repos_file,
                cwd=args.cwd,
                policy="edit",
                max_repos=args.max_sessions,
                state_dir=args.state,
                cluster=cluster,
                on_event=on_event,
            )
        else:
            run = run_pipeline_sync(
                args.pipeline,
                cwd=args.cwd,
                policy="edit",
                max_sessions=args.max_sessions,
                state_dir=args.state,
                cluster=cluster,
                on_event=on_event,
            )
        wall = time.perf_counter() - began
        cpu = time.process_time() - cpu
        kids = _cpu(resource.RUSAGE_CHILDREN) - kids
    found: dict[str, Any] = {
        "seconds": wall,
        "connect_seconds": connect_seconds if address else None,
        "driver_cpu_seconds": cpu,
        "children_cpu_seconds": kids,
        "span_seconds": last - first if first is not None and last is not None else None,
    }
    if args.kind == "batch":
        patches = sorted(Path(args.state).rglob("changes.patch"))
        texts = {p.read_text() for p in patches}
        found.update(
            status=outcome.status,
            failed=[f"{r.name}: {r.error}" for r in outcome.failed][:5],
            instances=len(outcome.repos),
            changes=sorted({(r.files, r.added, r.removed) for r in outcome.repos}, key=str),
            patches=len(patches),
            # one change, the same in every repository
            patch=_digest(next(iter(texts))) if len(texts) == 1 else None,
            patch_ok=len(texts) == 1 and all("+an new line" in t for t in texts),
            run_seconds=sorted(r.seconds or 0.0 for r in outcome.repos),
        )
    else:
        patch = Path(run.run_dir, "changes.patch")
        text = patch.read_text() if patch.exists() else ""
        instances = run.result["steps"]["make"]["instances"]
        found.update(
            status=run.status,
            failed=[k for k, i in instances.items() if i["status"] != "succeeded"][:5],
            instances=len(instances),
            patch=_digest(text) if text else None,
            patch_ok=text.count("+++ b/out/") == args.items,
        )
    json.dump(found, sys.stdout)
    return 0


# ---------------------------------------------------------------------------- micro


def _make_tree(root: Path, files: int) -> None:
    """``files`` small files, 100 to a directory (each content unique)."""
    for i in range(files):
        path = root / f"d{i // 100:03d}" / f"f{i:05d}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"file {i}\n" + "some content of a source file\n" * 6)


def _times(samples: list[float]) -> dict[str, float]:
    """Median and 90th percentile, in milliseconds."""
    ordered = sorted(samples)
    return {
        "p50_ms": 1000 * statistics.median(ordered),
        "p90_ms": 1000 * ordered[int(0.9 * (len(ordered) - 1))],
    }


def micro(args: argparse.Namespace) -> dict[str, Any]:
    """The overhead's parts, measured one by one on the cluster at ``args.address``."""
    import trio

    from orchestrator.agent.session import ClientOptions
    from orchestrator.cluster._connect import ClusterSpec
    from orchestrator.cluster._driver import open_cluster
    from orchestrator.cluster._node import BUDGET_POLL, RunHostConfig
    from orchestrator.cluster._trees import blobs_for, manifest_of
    from orchestrator.vfs import Branch, Workspace

    address: str = args.address
    calls = args.calls
    found: dict[str, Any] = {"budget_poll_seconds": BUDGET_POLL}
    work = Path(tempfile.mkdtemp(prefix="micro-", dir=args.cache))

    async def main() -> None:
        began = time.perf_counter()
        session_cm = open_cluster(ClusterSpec(address))
        session = await session_cm.__aenter__()
        try:
            found["open_cluster_ms"] = 1000 * (time.perf_counter() - began)
            ray = session.ray
            node = session.nodes[0]

            async def get(ref: Any) -> Any:
                return await session._get(ref)  # the driver's way: ray.get in a worker thread

            # one actor round trip, and one coordinator call of each kind, one at a time
            makers: tuple[tuple[str, Callable[[int], Any]], ...] = (
                ("ready", lambda i: node.actor.ready.remote()),
                ("claim", lambda i: session.coordinator.claim.remote(f"bench/{i}", "me")),
                ("take", lambda i: session.coordinator.take.remote("demo")),
                ("spent", lambda i: session.coordinator.spent.remote()),
            )
            for name, make in makers:
                samples = []
                for i in range(calls):
                    t0 = time.perf_counter()
                    await get(make(i))
                    samples.append(time.perf_counter() - t0)
                found[f"{name}_rtt"] = _times(samples)
            # a run hosted on a node and ended there (each repository of a batch is a run:
            # it costs this on each node one of its turns went to)
            samples = []
            for i in range(max(5, calls // 10)):
                t0 = time.perf_counter()
                config = RunHostConfig(f"bench-{i}", ClientOptions(), None, None)
                await get(node.actor.open_run.remote(config))
                await get(node.actor.close_run.remote(config.run_id))
                samples.append(time.perf_counter() - t0)
            found["run_host_per_node"] = _times(samples)
            samples = []
            for _ in range(calls):  # the same without the worker thread
                t0 = time.perf_counter()
                ray.get(node.actor.ready.remote())
                samples.append(time.perf_counter() - t0)
            found["ready_rtt_direct"] = _times(samples)
            # the coordinator's capacity: many calls in flight, one actor serving one at a time
            burst = 20 * calls
            t0 = time.perf_counter()
            refs = [session.coordinator.take.remote("demo") for _ in range(burst)]
            await trio.to_thread.run_sync(ray.get, refs)
            found["coordinator_calls_per_second"] = burst / (time.perf_counter() - t0)
            cpu0 = time.process_time()
            refs = [session.coordinator.claim.remote(f"b/{i}", "me") for i in range(burst)]
            await trio.to_thread.run_sync(ray.get, refs)
            found["driver_cpu_ms_per_coordinator_call"] = (
                1000 * (time.process_time() - cpu0) / burst
            )

            trees = []
            for size in args.trees:
                root = work / f"tree-{size}"
                await trio.to_thread.run_sync(_make_tree, root, size)
                snapshot = Workspace.open(str(root)).snapshot()
                branch = Branch.from_tree(snapshot, "bench")
                t0 = time.perf_counter()
                manifest = manifest_of(branch)
                first = time.perf_counter() - t0
                t0 = time.perf_counter()
                manifest = manifest_of(Branch.from_tree(snapshot, "bench2"))
                again = time.perf_counter() - t0
                target = session.nodes[-1]  # a node that has none of these blobs
                t0 = time.perf_counter()
                blobs = blobs_for(branch, manifest, frozenset(target.seen))
                read = time.perf_counter() - t0
                t0 = time.perf_counter()
                await get(target.actor.put_blobs.remote(blobs))
                put = time.perf_counter() - t0
                target.seen.update(blobs)
                t0 = time.perf_counter()
                seen = manifest.digests() <= target.seen  # what the driver checks per turn
                check = time.perf_counter() - t0
                assert seen
                t0 = time.perf_counter()
                await get(target.actor.put_blobs.remote(blobs))
                resend = time.perf_counter() - t0
                trees.append(
                    {
                        "files": size,
                        "bytes": sum(len(b) for b in blobs.values()),
                        "manifest_first_ms": 1000 * first,
                        "manifest_again_ms": 1000 * again,
                        "blobs_read_ms": 1000 * read,
                        "put_blobs_first_ms": 1000 * put,
                        "seen_check_ms": 1000 * check,
                        "put_blobs_resend_ms": 1000 * resend,
                    }
                )
            found["trees"] = trees
        finally:
            began = time.perf_counter()
            await session_cm.__aexit__(None, None, None)
            found["close_cluster_ms"] = 1000 * (time.perf_counter() - began)

    try:
        trio.run(main)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return found


# ---------------------------------------------------------------------------- the runs


def _spawn(args: argparse.Namespace, kind: str, address: str | None, extra: list[str]) -> Any:
    """This script as a worker doing ``kind``; its figures (RuntimeError if it failed)."""
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", "--kind", kind]
    command += ["--address", address or "", "--cache", str(args.cache), *extra]
    proc = subprocess.run(command, capture_output=True, check=False)
    if proc.returncode != 0:
        lines = proc.stderr.decode(errors="replace").strip().splitlines()
        raise RuntimeError(
            f"the {kind} worker failed ({proc.returncode}): {lines[-1] if lines else '?'}"
        )
    return json.loads(proc.stdout)


def run_once(args: argparse.Namespace, kind: str, address: str | None) -> dict[str, Any]:
    """One batch or fan-out, on this machine (``address`` None) or the cluster; checked."""
    work = Path(tempfile.mkdtemp(prefix="run-", dir=args.cache))
    try:
        cwd = work / "cwd"
        cwd.mkdir()
        pipeline = work / "p.py"
        extra = ["--state", str(work / "state"), "--cwd", str(cwd)]
        extra += ["--max-sessions", str(args.max_sessions), "--items", str(args.items)]
        if kind == "batch":
            listing, repos = make_repos(args.cache, args.repos)
            pipeline.write_text(PIPELINE)
            extra += ["--repos-file", str(listing)]
        else:
            for name, text in FILES.items():
                (cwd / name).parent.mkdir(parents=True, exist_ok=True)
                (cwd / name).write_text(text)
            pipeline.write_text(FANOUT.format(items=args.items))
        found: dict[str, Any] = _spawn(args, kind, address, [*extra, "--pipeline", str(pipeline)])
        where = "cluster" if address else "local"
        want = args.repos if kind == "batch" else args.items
        if found["status"] != "succeeded" or found["instances"] != want:
            raise RuntimeError(f"{kind} {where}: {found['status']}: {found['failed']}")
        if not found["patch_ok"]:
            raise RuntimeError(f"{kind} {where}: the changes are not those expected")
        if kind == "batch":
            if found["changes"] != [[1, 2, 2]] or found["patches"] != args.repos:
                raise RuntimeError(f"batch {where}: changes {found['changes']}")
            check_repos(repos, None)
        else:
            if any(p.name == "out" for p in cwd.iterdir()):
                raise RuntimeError(f"fanout {where}: the project was changed")
        return found
    finally:
        shutil.rmtree(work, ignore_errors=True)


def measure(args: argparse.Namespace, address: str) -> dict[str, Any]:
    """Both kinds on both paths, alternating, ``args.repeat`` times; then the micro section."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for _ in range(args.repeat):
        for kind in args.kinds:
            for where, at in (("local", None), ("cluster", address)):
                found = run_once(args, kind, at)
                runs.setdefault(f"{kind}/{where}", []).append(found)
                print(
                    f"  {kind:<7} {where:<8} {found['seconds']:7.2f} s  driver cpu "
                    f"{found['driver_cpu_seconds']:6.2f} s",
                    file=sys.stderr,
                    flush=True,
                )
    for kind in args.kinds:  # the same changes on both paths
        patches = {r["patch"] for w in ("local", "cluster") for r in runs[f"{kind}/{w}"]}
        if len(patches) != 1:
            raise RuntimeError(f"{kind}: the changes differ between the paths")
    result: dict[str, Any] = {"runs": runs}
    if not args.no_micro:
        extra = ["--calls", str(args.calls), "--trees", *map(str, args.trees)]
        result["micro"] = _spawn(args, "micro", address, extra)
    return result


# ---------------------------------------------------------------------------- the report


def _best_span(runs: list[dict[str, Any]], n: int) -> float | None:
    spans = [r["span_seconds"] for r in runs if r["span_seconds"] is not None]
    return 1000 * min(spans) / n if spans else None


def _ms(value: float | None, sign: str = "") -> str:
    return "n/a" if value is None else f"{value:{sign}.1f}"


def report(found: dict[str, Any], args: argparse.Namespace, times: dict[str, Any]) -> Any:
    """The figures (returned) and, unless ``--json``, the tables (printed)."""
    rows = []
    overhead = {}
    for kind in args.kinds:
        n = args.repos if kind == "batch" else args.items
        best = {}
        for where in ("local", "cluster"):
            rs = found["runs"][f"{kind}/{where}"]
            run = min(rs, key=lambda r: r["seconds"])
            best[where] = run
            rows.append(
                {
                    "kind": kind,
                    "path": where,
                    "instances": n,
                    "seconds": run["seconds"],
                    "ms_per_instance": 1000 * run["seconds"] / n,
                    "driver_cpu_ms_per_instance": 1000 * run["driver_cpu_seconds"] / n,
                    "children_cpu_ms_per_instance": 1000 * run["children_cpu_seconds"] / n,
                    "connect_seconds": run["connect_seconds"],
                    # the first instance's start to the last one's end, best of the runs
                    "span_ms_per_instance": _best_span(rs, n),
                    "all_seconds": [r["seconds"] for r in rs],
                    "median_run_seconds": (
                        statistics.median(run["run_seconds"]) if "run_seconds" in run else None
                    ),
                }
            )
        local, cluster = best["local"], best["cluster"]
        spans = [_best_span(found["runs"][f"{kind}/{w}"], n) for w in ("local", "cluster")]
        overhead[kind] = {
            "span_ms_per_instance": (
                spans[1] - spans[0] if spans[0] is not None and spans[1] is not None else None
            ),
            "wall_ms_per_instance": 1000 * (cluster["seconds"] - local["seconds"]) / n,
            "wall_ratio": cluster["seconds"] / local["seconds"],
            "driver_cpu_ms_per_instance": 1000
            * (cluster["driver_cpu_seconds"] - local["driver_cpu_seconds"])
            / n,
            "driver_cpu_ratio": cluster["driver_cpu_seconds"] / local["driver_cpu_seconds"],
        }
    figures: dict[str, Any] = {
        "repos": args.repos,
        "items": args.items,
        "nodes": args.nodes if not args.cluster else None,
        "slots": args.slots,
        "max_sessions": args.max_sessions,
        "repeat": args.repeat,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "cluster": args.cluster or "loopback",
        "cluster_up_seconds": times.get("up"),
        "cluster_down_seconds": times.get("down"),
        "rows": rows,
        "overhead": overhead,
        "micro": found.get("micro"),
    }
    if args.json:
        print(json.dumps(figures, indent=2))
        return figures
    where = (
        f"an existing cluster at {args.cluster}"
        if args.cluster
        else f"a loopback cluster of {args.nodes} nodes x {args.slots} slots "
        f"(up {times['up']:.1f} s, down {times.get('down', 0):.1f} s)"
    )
    print(
        f"Cluster: {where}; {args.repos} repositories, {args.items} items, "
        f"{args.max_sessions} at once; {platform.system()} {os.cpu_count()} CPUs, "
        f"best of {args.repeat}"
    )
    print(
        f"{'kind':<7} {'path':<8} {'wall s':>7} {'ms/inst':>8} {'span ms/inst':>12} "
        f"{'driver cpu ms/inst':>19} "
        f"{'children cpu ms/inst':>21} {'connect s':>9}"
    )
    for row in rows:
        connect = row["connect_seconds"]
        print(
            f"{row['kind']:<7} {row['path']:<8} {row['seconds']:7.2f} "
            f"{row['ms_per_instance']:8.1f} {_ms(row['span_ms_per_instance']):>12} "
            f"{row['driver_cpu_ms_per_instance']:19.1f} "
            f"{row['children_cpu_ms_per_instance']:21.1f} "
            + (f"{connect:9.2f}" if connect is not None else f"{'':>9}")
        )
    for kind, o in overhead.items():
        print(
            f"{kind}: cluster overhead {o['wall_ms_per_instance']:+.1f} ms wall per instance "
            f"({o['wall_ratio']:.2f}x; {_ms(o['span_ms_per_instance'], '+')} ms once "
            f"running), driver CPU {o['driver_cpu_ms_per_instance']:+.1f} ms "
            f"per instance ({o['driver_cpu_ratio']:.2f}x)"
        )
    m = found.get("micro")
    if m:
        print(
            f"micro: open_cluster {m['open_cluster_ms']:.0f} ms, close {m['close_cluster_ms']:.0f}"
            f" ms; round trip p50 (p90) ms: ready {m['ready_rtt']['p50_ms']:.2f} "
            f"({m['ready_rtt']['p90_ms']:.2f}), direct ray.get "
            f"{m['ready_rtt_direct']['p50_ms']:.2f}; coordinator claim "
            f"{m['claim_rtt']['p50_ms']:.2f}, take {m['take_rtt']['p50_ms']:.2f}, spent "
            f"{m['spent_rtt']['p50_ms']:.2f}; a run hosted and ended, per node "
            f"{m['run_host_per_node']['p50_ms']:.1f}"
        )
        print(
            f"micro: coordinator {m['coordinator_calls_per_second']:.0f} calls/s with many in "
            f"flight; driver CPU {m['driver_cpu_ms_per_coordinator_call']:.3f} ms per call"
        )
        for t in m["trees"]:
            print(
                f"micro: tree of {t['files']} files ({t['bytes'] / 1024:.0f} KiB): manifest "
                f"{t['manifest_first_ms']:.1f} ms first, {t['manifest_again_ms']:.1f} ms again;"
                f" blobs read {t['blobs_read_ms']:.1f} ms, put_blobs "
                f"{t['put_blobs_first_ms']:.1f} ms first, seen check "
                f"{t['seen_check_ms']:.3f} ms, resent {t['put_blobs_resend_ms']:.1f} ms"
            )
        print(
            "coordinator calls per turn: 1 claim + 1 take per prompt (more takes when a rate "
            f"refuses); with a budget also 1 spent + 1 per {m['budget_poll_seconds']:g} s of "
            "the turn (+ 1 observe per usage report)"
        )
    return figures


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; 1 if a run was wrong."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repos", type=int, default=40, help="batch repositories (default 40)")
    parser.add_argument("--items", type=int, default=40, help="fan-out items (default 40)")
    parser.add_argument("--nodes", type=int, default=2, help="loopback cluster nodes (2)")
    parser.add_argument("--slots", type=int, default=2, help="agent slots per node (2)")
    parser.add_argument(
        "--max-sessions",
        type=int,
        help="repositories (batch) or live agents (fan-out) at once on both paths "
        "(default: nodes x slots)",
    )
    parser.add_argument("--repeat", type=int, default=3, help="runs of each (best counts)")
    parser.add_argument(
        "--kinds", nargs="+", choices=("batch", "fanout"), default=["batch", "fanout"]
    )
    parser.add_argument("--cluster", help="an existing cluster's HOST:PORT (no loopback)")
    parser.add_argument("--no-micro", action="store_true", help="leave out the micro section")
    parser.add_argument("--calls", type=int, default=200, help="micro: calls per round trip")
    parser.add_argument(
        "--trees",
        type=int,
        nargs="+",
        default=list(TREE_SIZES),
        help="micro: the sizes of the trees shipped, in files (default 100 10000)",
    )
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    # the worker process (internal)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--kind", help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    parser.add_argument("--repos-file", help=argparse.SUPPRESS)
    parser.add_argument("--pipeline", help=argparse.SUPPRESS)
    parser.add_argument("--cwd", help=argparse.SUPPRESS)
    parser.add_argument("--state", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        from orchestrator.errors import OrchestratorError

        try:
            return worker(args)
        except OrchestratorError as e:  # one line for the parent to show
            print(f"{type(e).__name__}: {e}", file=sys.stderr)
            return 1
    if min(args.repos, args.items, args.nodes, args.slots, args.repeat, args.calls) < 1:
        parser.error("--repos, --items, --nodes, --slots, --repeat and --calls are 1 or more")
    if min(args.trees) < 1:
        parser.error("--trees are 1 or more files each")
    if args.max_sessions is None:
        args.max_sessions = args.nodes * args.slots
    if args.max_sessions < 1:
        parser.error("--max-sessions is 1 or more")
    if args.cluster and args.cluster.startswith("ray:") and not args.cluster.startswith("ray://"):
        args.cluster = args.cluster[len("ray:") :]
    args.cache = args.cache.resolve()
    args.cache.mkdir(parents=True, exist_ok=True)
    times: dict[str, Any] = {}
    tmp: Path | None = None
    if not args.cluster:
        # before anything imports ray; the workers and the cluster's processes inherit them
        tmp = Path(f"/tmp/raybench-{os.getpid()}")
        tmp.mkdir(exist_ok=True)
        os.environ.update(RAY_ENV)
        os.environ["RAY_TMPDIR"] = str(tmp)
    try:
        if args.cluster:
            found = measure(args, args.cluster)
        else:
            with loopback_cluster(args.nodes, args.slots, times) as address:
                print(f"  cluster up in {times['up']:.1f} s at {address}", file=sys.stderr)
                found = measure(args, address)
    except (RuntimeError, subprocess.CalledProcessError) as e:
        print(f"bench_cluster: {e}", file=sys.stderr)
        return 1
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    figures = report(found, args, times)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(figures, indent=2) + "\n")
    if not args.json:
        print(f"written: {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

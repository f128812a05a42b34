"""Runs on a loopback Ray cluster of two nodes (tests/raycluster.py): the demo pipeline gives the
same result as on one machine with turns on both nodes; a budget and a request rate hold across
nodes; a worker killed mid-turn sends no second prompt; a removed node's instance is recorded
``node-lost`` and a resume finishes it; Ctrl-C on the command line leaves nothing running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import trio
from inprocess_cluster import EXAMPLES, copy_sample, summary
from schema_check import FrameValidator

from orchestrator import batch, compare, resume_run, run_pipeline
from orchestrator.cluster._connect import ClusterSpec
from orchestrator.cluster._coordinator import Rate
from orchestrator.store import open_run_store

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def pids_of(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()] if path.exists() else []


async def wait_for_lines(path: Path, count: int, timeout: float = 60) -> list[int]:
    """The pids written to ``path``, once there are ``count`` of them."""
    with trio.fail_after(timeout):
        while len(pids_of(path)) < count:  # noqa: ASYNC110 - polling a file the agent writes
            await trio.sleep(0.05)
    return pids_of(path)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def waiting_commands(marker: Path) -> list[int]:
    """The processes running a wait.sh (the turns' waiting shells) of this test."""
    found = []
    needle = b"wait.sh"
    del marker
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


async def wait_gone(pids: list[int], timeout: float = 20) -> None:
    with trio.fail_after(timeout):
        while any(alive(p) for p in pids):  # noqa: ASYNC110 - polling /proc
            await trio.sleep(0.05)


async def steps_of(state_dir: Path, run_id: str) -> dict[str, Any]:
    async with open_run_store(state_dir) as store:
        return {s.key: s for s in await store.steps(run_id)}


async def test_the_demo_pipeline_runs_across_both_nodes(
    ray_cluster: Any, tmp_path: Path, state_dir: Path
) -> None:
    """examples/demo_pipeline.py with --cluster: the same statuses and final diff as on one
    machine, its turns' transcripts from both nodes, the cluster recorded with the run."""
    pipeline = EXAMPLES / "demo_pipeline.py"
    here = await run_pipeline(pipeline, cwd=copy_sample(tmp_path, "here"), policy="edit")
    there = await run_pipeline(
        pipeline, cwd=copy_sample(tmp_path, "there"), policy="edit", cluster=ray_cluster.address
    )
    assert here.status == "succeeded"
    assert summary(there) == summary(here)
    async with open_run_store(state_dir) as store:
        sources = await store.transcript_sources(there.run_id)
        record = await store.get_run(there.run_id)
    nodes = {s.rpartition("@")[2] for s in sources if "@" in s}
    assert len(nodes) == 2, sources
    assert record.options["cluster"] == ray_cluster.address


#: the demo prompt that runs the project's wait.sh (see :func:`waiting_project`)
WAITING_PROMPT = "run sh wait.sh\n"


def waiting_project(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A project whose ``wait.sh`` notes the pid of the node supervisor that runs it, then
    waits (at most 60 s) until a marker file exists: (project, marker, pids)."""
    project, marker, pids = tmp_path / "p", tmp_path / "go", tmp_path / "pids"
    project.mkdir()
    (project / "a.txt").write_text("a\n")
    (project / "wait.sh").write_text(
        # the terminal's shell (sh -c LINE) is the parent: the supervisor is its parent
        f"test -e {marker} && exit 0\nawk '{{print $4}}' /proc/$PPID/stat >> {pids}\ni=0\n"
        f"while [ ! -e {marker} ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done\n"
    )
    return project, marker, pids


def waiting_pipeline(tmp_path: Path, items: int) -> Path:
    """A fan-out over ``items`` whose turns run wait.sh, then create a file each."""
    path = tmp_path / "wait.py"
    path.write_text(
        "from orchestrator import step\n\n\n"
        f"@step\ndef items() -> list[str]:\n    return {[f'i{n}' for n in range(items)]!r}\n\n\n"
        '@step(agent="demo", over="items")\n'
        "def wait(item: str) -> str:\n"
        f"    return {WAITING_PROMPT!r} + f'create {{item}}.txt with \"{{item}}\"\\n'\n"
    )
    return path


async def test_a_worker_killed_mid_turn_sends_no_second_prompt(
    ray_cluster: Any, tmp_path: Path, state_dir: Path
) -> None:
    """SIGKILL of the node supervisor running a turn: the instance is recorded failed
    ``node-lost`` (never re-sent: its command ran once), its agent and command end with it,
    the other instance finishes; a resume runs the lost one again and the run succeeds."""
    project, marker, pids = waiting_project(tmp_path)
    path = waiting_pipeline(tmp_path, 2)
    outcome: list[Any] = []

    async def run() -> None:
        outcome.append(
            await run_pipeline(path, cwd=project, policy="trusted", cluster=ray_cluster.address)
        )

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        first, second = await wait_for_lines(pids, 2)
        assert first != second  # one turn on each node
        os.kill(first, signal.SIGKILL)
        await wait_gone([first])
        await trio.sleep(0.5)
        marker.touch()  # the other turn may end now
    [done] = outcome
    assert done.status == "failed"
    instances = done.result["steps"]["wait"]["instances"]
    kinds = sorted(i["errorKind"] or "ok" for i in instances.values())
    assert kinds == ["node-lost", "ok"]
    assert pids_of(pids) == [first, second]  # each command ran once: nothing sent again
    assert not waiting_commands(marker)
    again = await resume_run(done.run_id, cluster=ray_cluster.address)
    assert again.status == "succeeded"
    assert pids_of(pids) == [first, second]  # the marker exists: the command went straight on


async def test_a_removed_node_fails_its_instances_and_resume_finishes_them(
    ray_cluster: Any, tmp_path: Path, state_dir: Path
) -> None:
    """A third node joins, takes one of three turns and is removed mid-turn: that instance is
    recorded ``node-lost``, the two others succeed; resume (on the two nodes left) finishes it."""
    extra = ray_cluster.add_node(2, ip="127.0.0.2")  # a node the driver is not attached to
    try:
        project, marker, pids = waiting_project(tmp_path)
        path = waiting_pipeline(tmp_path, 3)
        outcome: list[Any] = []

        async def run() -> None:
            outcome.append(
                await run_pipeline(path, cwd=project, policy="trusted", cluster=ray_cluster.address)
            )

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)
            await wait_for_lines(pids, 3)
            ray_cluster.remove_node(extra)
            extra = None
            await trio.sleep(1)
            marker.touch()
    finally:
        if extra is not None:
            ray_cluster.remove_node(extra)
    [done] = outcome
    instances = done.result["steps"]["wait"]["instances"]
    kinds = sorted(i["errorKind"] or "ok" for i in instances.values())
    assert kinds == ["node-lost", "ok", "ok"], [i.get("error") for i in instances.values()]
    # the lost node's supervisor (its raylet killed under it) ended itself and its agents
    await wait_gone(pids_of(pids))
    assert not waiting_commands(marker)
    again = await resume_run(done.run_id, cluster=ray_cluster.address)
    assert again.status == "succeeded", again.result["steps"]
    assert sorted(p.name for p in project.iterdir()) == ["a.txt", "wait.sh"]  # nothing applied


async def test_a_request_rate_holds_across_nodes(
    ray_cluster: Any, tmp_path: Path, state_dir: Path
) -> None:
    """demo=2/s over six turns on two nodes: the prompts went at least 0.5 s apart in all
    (their commands' start times span at least 2.5 s, less the commands' own jitter)."""
    project = tmp_path / "p"
    project.mkdir()
    times = tmp_path / "times"
    (project / "stamp.sh").write_text(f"date +%s.%N >> {times}\n")
    path = tmp_path / "rate.py"
    path.write_text(
        "from orchestrator import step\n\n\n"
        "@step\ndef items() -> list[int]:\n    return list(range(6))\n\n\n"
        '@step(agent="demo", over="items")\n'
        "def stamp(item: int) -> str:\n"
        "    return 'run sh stamp.sh\\n'\n"
    )
    spec = ClusterSpec(ray_cluster.address, rates={"demo": Rate(2, 1.0)})
    outcome = await run_pipeline(path, cwd=project, policy="trusted", cluster=spec)
    assert outcome.status == "succeeded"
    stamps = sorted(float(x) for x in times.read_text().split())
    assert len(stamps) == 6
    assert stamps[-1] - stamps[0] >= 2.3


def make_repo(root: Path, name: str, seconds: int) -> Path:
    """A repository whose wait.sh notes it started, waits until two have, then sleeps."""
    repo = root / name
    repo.mkdir(parents=True)
    started = root / "started"
    (repo / "wait.sh").write_text(
        f"echo {name} >> {started}\n"
        f"while [ $(wc -l < {started}) -lt 2 ]; do sleep 0.05; done\nsleep {seconds}\n"
    )
    (repo / "app.txt").write_text("old\n")
    return repo


async def test_a_budget_holds_across_nodes(
    ray_cluster: Any, tmp_path: Path, state_dir: Path
) -> None:
    """A batch of two repositories, their turns running at once on the two nodes, with a token
    budget (on_budget cancel) that only the short turn's report goes over: the long turn, which
    reported nothing, is cancelled within seconds (kind ``budget``): only the coordinator,
    which every node reports to, knew the budget was spent."""
    path = tmp_path / "b.py"
    path.write_text(
        'from orchestrator import step\n\n\n@step(agent="demo")\ndef go() -> str:\n'
        '    return "run sh wait.sh\\n"\n'
    )
    repos = [make_repo(tmp_path, "short", 0), make_repo(tmp_path, "long", 40)]
    began = time.monotonic()
    outcome = await batch(
        path,
        [str(r) for r in repos],
        cwd=tmp_path,
        policy="trusted",
        max_repos=2,
        max_tokens=20,
        on_budget="cancel",
        cluster=ray_cluster.address,
    )
    assert time.monotonic() - began < 30
    by_name = {r.name: r for r in outcome.repos}
    # the long turn ran (its command began) and was stopped by the budget
    assert (tmp_path / "started").read_text().split() in (["short", "long"], ["long", "short"])
    long = by_name["long"]
    assert (long.skipped, long.error) == ("budget", f"stopped: {_spent(by_name)}"), long
    assert not waiting_commands(tmp_path)


def _spent(repos: dict[str, Any]) -> str:
    """What the batch says of a budget the short turn's tokens went over."""
    return f"the budget is spent (tokens: {repos['short'].tokens} used of 20)"


PIPELINE_FOREVER = """\
from orchestrator import step


@step(agent="demo")
def wait() -> str:
    return {prompt!r}
"""


def test_ctrl_c_leaves_nothing_running(ray_cluster: Any, tmp_path: Path, state_dir: Path) -> None:
    """orchestrator run --cluster, SIGINT while the turn waits on a node: exit 130, the run
    recorded interrupted, the node supervisor, the agent and its command all gone."""
    project, marker, pids = waiting_project(tmp_path)
    path = tmp_path / "forever.py"
    path.write_text(PIPELINE_FOREVER.format(prompt=WAITING_PROMPT))
    exe = Path(sys.executable).parent / "orchestrator"
    proc = subprocess.Popen(
        [str(exe), "run", str(path), "--cwd", str(project), "--policy", "trusted",
         "--cluster", f"ray:{ray_cluster.address}", "--no-progress", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while not pids_of(pids):
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline
            time.sleep(0.05)
        [actor] = pids_of(pids)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert b"Traceback" not in err
    deadline = time.monotonic() + 20
    while (alive(actor) or waiting_commands(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(actor)
    assert not waiting_commands(marker)
    runs = subprocess.run(
        [str(exe), "runs", "--json"], capture_output=True, text=True, check=True
    ).stdout
    assert '"interrupted"' in runs


async def test_a_comparison_on_the_cluster_with_its_transcript(
    ray_cluster: Any, tmp_path: Path, state_dir: Path
) -> None:
    """compare on the cluster: each agent's turn on a node, the verdict as on one machine, and
    --transcript gets every node's frames (at the end of the run)."""
    project = tmp_path / "p"
    project.mkdir()
    (project / "app.txt").write_text("old\n")
    task = 'replace "old" with "new" in app.txt'
    wire = tmp_path / "wire.jsonl"
    there = await compare(
        ["alice=demo", "bob=demo"], task, cwd=project, policy="edit", verify="grep -q new app.txt",
        transcript=wire, cluster=ray_cluster.address,
    )  # fmt: skip
    here = await compare(
        ["alice=demo", "bob=demo"], task, cwd=project, policy="edit", verify="grep -q new app.txt"
    )
    assert there.status == here.status == "succeeded"
    assert sorted(there.result["succeeded"]) == sorted(here.result["succeeded"]) == ["alice", "bob"]
    frames = [json.loads(line) for line in wire.read_text().splitlines()]
    prompts = [
        f for f in frames if f["dir"] == "send" and f["msg"].get("method") == "session/prompt"
    ]
    assert sorted(f["agent"] for f in prompts) == ["alice", "bob"]
    # the nodes' frames are checked against the ACP schema as this process's are
    validators: dict[str, FrameValidator] = {}
    for f in frames:
        validators.setdefault(f["agent"], FrameValidator()).feed(f["dir"], f["msg"])
    assert sum(v.validated for v in validators.values()) >= 6
    assert (project / "app.txt").read_text() == "old\n"


def test_a_killed_driver_leaves_nothing_on_the_nodes(
    ray_cluster: Any, tmp_path: Path, state_dir: Path
) -> None:
    """SIGKILL of `orchestrator run --cluster` while its turn waits on a node: Ray ends the
    driver's actors, and the node supervisor ends its agent and the agent's command first."""
    project, marker, pids = waiting_project(tmp_path)
    path = tmp_path / "forever.py"
    path.write_text(PIPELINE_FOREVER.format(prompt=WAITING_PROMPT))
    exe = Path(sys.executable).parent / "orchestrator"
    proc = subprocess.Popen(
        [str(exe), "run", str(path), "--cwd", str(project), "--policy", "trusted",
         "--cluster", ray_cluster.address, "--no-progress"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while not pids_of(pids):
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline
            time.sleep(0.05)
        [actor] = pids_of(pids)
        proc.kill()
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
    deadline = time.monotonic() + 30
    while (alive(actor) or waiting_commands(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(actor)
    assert not waiting_commands(marker)

"""Agent turns run by node supervisors (orchestrator.cluster._node) in this process, without Ray:
the demo pipeline gives the same result as on one machine, the nodes' transcripts and events come
back to the driver's record, a step whose prompt wants its branch directory gets the node's, and
a failing or cancelled turn is recorded as a local one is."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from inprocess_cluster import EXAMPLES, copy_sample, in_process_cluster, summary

from orchestrator import replay_run, run_pipeline
from orchestrator.runs.replay_record import replay_record
from orchestrator.store import open_run_store

pytestmark = pytest.mark.slow


async def test_the_demo_pipeline_gives_the_same_result_on_nodes(
    tmp_path: Path, state_dir: Path
) -> None:
    """The demo pipeline (fan-out, two agents on one step, a merge, a Python step) run with its
    agent turns on two node supervisors: same statuses, same conflicts, same final diff as on
    one machine; turns went to both nodes, and each node's transcripts are in the record."""
    pipeline = EXAMPLES / "demo_pipeline.py"
    here = await run_pipeline(pipeline, cwd=copy_sample(tmp_path, "here"), policy="edit")
    async with in_process_cluster(2) as cluster:
        there = await run_pipeline(
            pipeline,
            cwd=copy_sample(tmp_path, "there"),
            policy="edit",
            _cluster=cluster,  # type: ignore[arg-type]
        )
    assert here.status == "succeeded", here.result
    assert summary(there) == summary(here)
    assert {i for i, _ in cluster.placed} == {0, 1}
    async with open_run_store(state_dir) as store:
        labels = set(await store.transcript_sources(there.run_id))
    assert any(label.endswith("@n0") for label in labels), labels
    assert any(label.endswith("@n1") for label in labels), labels
    run = await _record(state_dir, there.run_id)
    assert run.options["cluster"] == "in-process"
    # what a replay needs came back from the nodes: each attempt's session, on its node
    record = await replay_record(there.run_id, state_dir=state_dir)
    sessions = [s for attempts in record.steps.values() for s in attempts]
    assert sessions and all(s.replayable for s in sessions), [s.why for s in sessions]
    assert {s.source.rpartition("@")[2] for s in sessions} == {"n0", "n1"}
    again = await replay_run(there.run_id, state_dir=state_dir, cwd=copy_sample(tmp_path, "again"))
    assert again.status == "succeeded", again.result
    assert again.result["replay"]["divergences"] == []
    assert summary(again) == summary(here)


def _sleeping(marker: Path) -> list[int]:
    """The processes running ``sleep 30`` (the turn's command) now."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv[:2] == [b"sleep", b"30"]:
                found.append(int(entry.name))
    return found


async def _record(state_dir: Path, run_id: str) -> Any:
    async with open_run_store(state_dir) as store:
        return await store.get_run(run_id)


WORKDIR_PIPELINE = """\
from pathlib import Path
from orchestrator import step


@step(agent="demo", check="grep -q new app.txt")
def fix(workdir: Path) -> str:
    name = sorted(p.name for p in workdir.iterdir() if p.suffix == ".txt")[0]
    return f'replace "old" with "new" in {name}\\n'


@step(agent="demo")
def fail() -> str:
    raise ValueError("no prompt for you")
"""


async def test_a_prompt_that_wants_its_directory_and_a_failing_one(
    tmp_path: Path, state_dir: Path
) -> None:
    """A prompt function with ``workdir`` is called on the node in the branch directory there;
    one that raises fails its instance with kind ``exception`` and its traceback, as on one
    machine."""
    project = tmp_path / "p"
    project.mkdir()
    (project / "app.txt").write_text("old\n")
    path = tmp_path / "pipe.py"
    path.write_text(WORKDIR_PIPELINE)
    async with in_process_cluster(1) as cluster:
        outcome = await run_pipeline(
            path,
            cwd=project,
            policy="edit",
            _cluster=cluster,  # type: ignore[arg-type]
        )
    steps = outcome.result["steps"]
    assert steps["fix"]["status"] == "succeeded"
    assert "+new" in Path(outcome.run_dir, "changes.patch").read_text()
    assert steps["fail"]["status"] == "failed"
    assert steps["fail"]["errorKind"] == "exception"
    assert "no prompt for you" in steps["fail"]["error"]
    assert (project / "app.txt").read_text() == "old\n"  # nothing applied


SLEEP_PIPELINE = """\
from orchestrator import step


@step(agent="demo")
def slow() -> str:
    return 'create made.txt with "made"\\nrun sleep 30\\n'
"""


async def test_a_cancelled_run_keeps_what_the_node_did(tmp_path: Path, state_dir: Path) -> None:
    """Cancelled while its turn runs on a node, the run is recorded interrupted, with what the
    turn wrote (harvested on the node) kept in its instance; no agent or sleep is left."""
    project = tmp_path / "p"
    project.mkdir()
    (project / "app.txt").write_text("old\n")
    path = tmp_path / "pipe.py"
    path.write_text(SLEEP_PIPELINE)
    started: list[str] = []

    def on_event(event: Any) -> None:
        if event.type == "run_started":
            started.append(event.run_id)

    async with in_process_cluster(1) as cluster, trio.open_nursery() as nursery:
        scope = trio.CancelScope()

        async def run() -> None:
            with scope:
                await run_pipeline(
                    path, cwd=project, policy="trusted", on_event=on_event,
                    _cluster=cluster,  # type: ignore[arg-type]
                )  # fmt: skip

        nursery.start_soon(run)
        with trio.fail_after(60):  # cancelled once the turn's command runs
            while not _sleeping(project):  # noqa: ASYNC110 - polling /proc
                await trio.sleep(0.02)
        scope.cancel()
    assert started
    assert not _sleeping(project), "a command of the cancelled turn is still running"
    record = await _record(state_dir, started[0])
    assert record.status == "interrupted"
    async with open_run_store(state_dir) as store:
        steps = {s.step: s for s in await store.steps(started[0])}
    assert steps["slow"].status == "interrupted"
    assert {"path": "made.txt", "change": "added"} in (steps["slow"].result or {})["changes"]


def test_a_rate_counts_every_label_of_its_agent(tmp_path: Path) -> None:
    """A rate named for an agent covers it under any label (alice=demo, demo:demo-slow) and
    not another program; a rate that names no agent of the run is refused."""
    from orchestrator.cluster._coordinator import Rate
    from orchestrator.cluster._driver import rate_keys_of
    from orchestrator.config import Config
    from orchestrator.errors import UsageError

    config = Config.load(tmp_path, environ={"HOME": str(tmp_path)})
    specs = [config.resolve_agent(t) for t in ("alice=demo", "demo:demo-slow", "echo=cat")]
    rates = {"demo": Rate(1, 1.0)}
    keys = rate_keys_of(rates, specs, config.resolve_agent)
    assert keys == {"alice": "demo", "demo:demo-slow": "demo"}
    with pytest.raises(UsageError, match="the rate of 'nosuch' names no agent of the run"):
        rate_keys_of({"nosuch": Rate(1, 1.0)}, specs, config.resolve_agent)
    assert rate_keys_of({"nosuch": Rate(1, 1.0)}, specs, config.resolve_agent, strict=False) == {}

"""The batch through the library: ``batch``, ``resume_batch`` and ``batch_sync`` with the demo agent
on small local git repositories (its events, its shared session bound, an interrupted batch
resumed, a resume of what is not a batch refused)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import trio

from orchestrator import batch, batch_sync, list_runs, resume_batch, run_pipeline
from orchestrator.errors import UsageError
from orchestrator.pipeline.results import RunEvent
from orchestrator.store import open_run_store

pytestmark = pytest.mark.slow

PIPELINE = """\
from orchestrator import step


@step(agent="demo", check="test ! -e FAIL")
def fix() -> str:
    return 'replace "old" with "new" in app.txt\\n'
"""
GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
    "GIT_CONFIG_NOSYSTEM": "1",
    "HOME": "/nonexistent",
    "PATH": "/usr/bin:/bin",
}


def make_repo(root: Path, name: str, *, fail: bool = False) -> Path:
    """A git repository ``root/name`` with ``app.txt`` committed (and ``FAIL`` when ``fail``)."""
    repo = root / name
    repo.mkdir(parents=True)
    (repo / "app.txt").write_text("greeting = old\n")
    if fail:
        (repo / "FAIL").write_text("not yet\n")
    for argv in (["init", "-q"], ["add", "."], ["commit", "-qm", "start"]):
        subprocess.run(["git", *argv], cwd=repo, env=GIT_ENV, check=True, capture_output=True)
    return repo


def write_pipeline(tmp_path: Path) -> Path:
    path = tmp_path / "fix.py"
    path.write_text(PIPELINE)
    return path


async def test_on_event_sees_the_batch_and_each_repository_runs(
    tmp_path: Path, state_dir: Path
) -> None:
    """on_event: batch_started first, batch_finished last, each repository's repo_started and
    repo_finished, and its child run's events with data["repo"] and that run's id."""
    repos = [make_repo(tmp_path, "good"), make_repo(tmp_path, "bad", fail=True)]
    seen: list[RunEvent] = []
    outcome = await batch(
        write_pipeline(tmp_path), [str(r) for r in repos], cwd=tmp_path, policy="edit",
        on_event=seen.append, state_dir=state_dir,
    )  # fmt: skip
    assert (outcome.status, outcome.exit_code) == ("failed", 1)
    assert [r.name for r in outcome.failed] == ["bad"]
    kids = {r.name: r.run_id for r in outcome.repos}
    assert all(kids.values())
    assert seen[0].type == "batch_started" and seen[-1].type == "batch_finished"
    assert seen[0].data["repos"] == ["good", "bad"] and seen[0].data["resumed"] is False
    assert seen[-1].data["status"] == "failed"
    assert all(e.run_id == outcome.run_id for e in seen if e.type.startswith(("batch_", "repo_")))
    finished = {e.data["repo"]: e.data["status"] for e in seen if e.type == "repo_finished"}
    assert finished == {"good": "succeeded", "bad": "failed"}
    for name in ("good", "bad"):
        started = [i for i, e in enumerate(seen) if e.type == "repo_started" and
                   e.data["repo"] == name]  # fmt: skip
        ended = [i for i, e in enumerate(seen) if e.type == "repo_finished" and
                 e.data["repo"] == name]  # fmt: skip
        assert len(started) == len(ended) == 1
        child = [e for e in seen[started[0] : ended[0]] if e.data.get("repo") == name and
                 not e.type.startswith("repo_")]  # fmt: skip
        types = [e.type for e in child]
        assert types[0] == "run_started" and "step_started" in types, types
        assert "run_finished" in types, types
        assert {e.run_id for e in child} == {kids[name]}
    children = [e for e in seen if not e.type.startswith(("batch_", "repo_"))]
    assert all(e.data.get("repo") in kids for e in children)


async def test_one_session_at_a_time_across_repositories(tmp_path: Path, state_dir: Path) -> None:
    """max_sessions=1 over 3 repositories run at once: a step starts only once the step of
    another repository running before it has finished (never two sessions live)."""
    repos = [make_repo(tmp_path, f"r{i}") for i in range(3)]
    seen: list[RunEvent] = []
    outcome = await batch(
        write_pipeline(tmp_path), [str(r) for r in repos], cwd=tmp_path, policy="edit",
        max_repos=3, max_sessions=1, on_event=seen.append, state_dir=state_dir,
    )  # fmt: skip
    assert outcome.status == "succeeded", outcome.result
    assert outcome.result["maxSessions"] == 1
    steps = [
        (e.type, e.data["repo"])
        for e in seen
        if e.type in ("step_started", "step_finished", "step_failed")
    ]
    assert len(steps) == 6, steps
    live: set[str] = set()
    for kind, repo in steps:
        if kind == "step_started":
            assert not live, f"{repo} started while {live} ran"
            live.add(repo)
        else:
            live.discard(repo)
    assert sorted(repo for kind, repo in steps if kind == "step_started") == ["r0", "r1", "r2"]


async def test_an_interrupted_batch_resumes_the_same_child_runs(
    tmp_path: Path, state_dir: Path
) -> None:
    """A batch cancelled while a repository's step runs: that repository reads interrupted
    with its child run's id, and resume_batch resumes that run (no new one)."""
    repos = [make_repo(tmp_path, "only")]
    pipeline = write_pipeline(tmp_path)
    seen: list[RunEvent] = []
    with trio.CancelScope() as scope:

        def on_event(event: RunEvent) -> None:
            seen.append(event)
            if event.type == "step_started":
                scope.cancel()

        await batch(
            pipeline, [str(r) for r in repos], cwd=tmp_path, policy="edit",
            on_event=on_event, state_dir=state_dir,
        )  # fmt: skip
    assert scope.cancelled_caught
    [started] = [e for e in seen if e.type == "run_started"]
    [batch_started] = [e for e in seen if e.type == "batch_started"]
    async with open_run_store(state_dir) as store:
        record = await store.get_run(batch_started.run_id)
        assert record.status == "interrupted" and record.result is not None
        [entry] = record.result["repos"]
        assert (entry["status"], entry["runId"]) == ("interrupted", started.run_id)
        before = {r.run_id for r in await store.list_runs(limit=None)}

    outcome = await resume_batch(batch_started.run_id, state_dir=state_dir)
    assert outcome.status == "succeeded", outcome.result
    assert outcome.repos[0].run_id == started.run_id
    async with open_run_store(state_dir) as store:
        assert {r.run_id for r in await store.list_runs(limit=None)} == before


async def test_resume_batch_of_a_run_that_is_not_a_batch_is_refused(
    tmp_path: Path, state_dir: Path
) -> None:
    """resume_batch of a pipeline run: UsageError naming it, and the run left as it was."""
    repo = make_repo(tmp_path, "solo")
    done = await run_pipeline(write_pipeline(tmp_path), cwd=repo, policy="edit",
                              state_dir=state_dir)  # fmt: skip
    async with open_run_store(state_dir) as store:
        before = await store.get_run(done.run_id)
    with pytest.raises(UsageError, match=f"run {done.run_id} is a pipeline run, not a batch"):
        await resume_batch(done.run_id, state_dir=state_dir)
    async with open_run_store(state_dir) as store:
        assert await store.get_run(done.run_id) == before


def test_batch_sync_runs_a_batch(tmp_path: Path, state_dir: Path) -> None:
    """batch_sync (no event loop of the caller's): the same outcome as batch."""
    repos = [make_repo(tmp_path, "a"), make_repo(tmp_path, "b", fail=True)]
    outcome = batch_sync(
        write_pipeline(tmp_path), [str(r) for r in repos], cwd=tmp_path, policy="edit",
        state_dir=state_dir,
    )  # fmt: skip
    assert (outcome.status, outcome.exit_code) == ("failed", 1)
    assert [(r.name, r.status, r.verify) for r in outcome.repos] == [
        ("a", "succeeded", "passed"),
        ("b", "failed", "failed"),
    ]
    assert outcome.result["repos"][0]["files"] == 1
    assert (tmp_path / "a" / "app.txt").read_text() == "greeting = old\n"  # nothing applied


async def test_one_string_is_not_a_list_of_repositories(tmp_path: Path, state_dir: Path) -> None:
    """A string given as the repositories (not a list of them) is a UsageError, not a batch
    over its characters; so is an item that is neither a path, a URL nor a RepoSpec."""
    pipeline = tmp_path / "p.py"
    pipeline.write_text(
        "from orchestrator import step\n\n\n@step()\ndef one() -> int:\n    return 1\n"
    )
    with pytest.raises(UsageError, match="a list of them"):
        await batch(pipeline, str(tmp_path))
    with pytest.raises(UsageError, match="not int"):
        await batch(pipeline, [123])  # type: ignore[list-item]
    assert await list_runs() == []

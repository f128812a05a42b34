"""Batch runs recorded as the batch command records them, for the tests of the read side.

A batch record (kind ``batch``) holding the batch object of ``BATCH-FORMAT``, and child runs made
by real ``run_pipeline`` runs of the demo agent on small git repositories, each made the batch's
child through the run store. Imported by plain name (``from batch_records import make_batch``).
"""

from __future__ import annotations

import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from orchestrator.report._diff import count_lines, parse_diff
from orchestrator.runs import run_pipeline
from orchestrator.store import RunRecord, open_run_store

#: the pipeline each repository runs: the demo agent's edit, then a check that fails on demand
PIPELINE = """\
from orchestrator import step


@step(agent="demo")
def edit(task: str) -> str:
    return task


@step()
def verify(edit: object, fail: bool) -> str:
    if fail:
        raise RuntimeError("verification failed")
    return "verified"
"""
TASK = 'replace "colour" with "color" in README.md'


def git_repo(root: Path, name: str) -> Path:
    """A git repository ``root/name`` with one commit of README.md."""
    repo = root / name
    repo.mkdir(parents=True)
    (repo / "README.md").write_text(f"# {name}\n\nThe colour of money.\n")
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
        "PATH": "/usr/bin:/bin",
    }
    for argv in (["init", "-q"], ["add", "README.md"], ["commit", "-qm", "start"]):
        subprocess.run(["git", *argv], cwd=repo, check=True, env=env, capture_output=True)
    return repo


def entry(name: str, **fields: Any) -> dict[str, Any]:
    """A repository's entry of a batch object, every field as the format has it."""
    base: dict[str, Any] = {
        "name": name,
        "source": f"../{name}",
        "url": None,
        "path": None,
        "ref": None,
        "head": None,
        "runId": None,
        "status": "pending",
        "exitCode": None,
        "error": None,
        "skipped": None,
        "files": None,
        "added": None,
        "removed": None,
        "verify": None,
        "applied": False,
        "branch": None,
        "branchCommit": None,
        "pushed": None,
        "tokens": None,
        "cost": None,
        "seconds": None,
    }
    return {**base, **fields}


def batch_object(
    run_id: str, pipeline: Path, repos: list[dict[str, Any]], status: str
) -> dict[str, Any]:
    """The batch object of ``repos``, its counts from them."""
    counts = {
        s: sum(1 for r in repos if r["status"] == s)
        for s in ("succeeded", "failed", "skipped", "interrupted")
    }
    return {
        "runId": run_id,
        "kind": "batch",
        "status": status,
        "exitCode": None if status == "running" else (0 if status == "succeeded" else 1),
        "pipeline": str(pipeline),
        "pipelineName": pipeline.stem,
        "seconds": 4.5,
        "maxRepos": 2,
        "maxSessions": 4,
        "counts": counts,
        "budget": {
            "maxTokens": None,
            "maxCost": None,
            "maxSeconds": None,
            "onSpent": "finish",
            "tokens": None,
            "cost": None,
            "seconds": 4.5,
            "spent": None,
        },
        "repos": repos,
    }


async def make_batch(
    base: Path, state: Path, ran: dict[str, bool], *, status: str = "failed", age: float = 0.0
) -> tuple[str, dict[str, str]]:
    """A batch whose repositories ``ran`` (name: whether its verify step fails) each ran the
    pipeline as a child run, plus ``clone-x`` whose clone failed and ``skip-x`` skipped by the
    budget; started ``age`` seconds ago. The batch's id, and its child runs' ids by name."""
    folder = base / f"batch-{uuid.uuid4().hex[:6]}"
    folder.mkdir()
    pipeline = folder / "fix.py"
    pipeline.write_text(PIPELINE)
    batch_id = uuid.uuid4().hex[:12]
    created = time.time() - age
    specs = [{"name": n, "source": f"../{n}"} for n in [*ran, "clone-x", "skip-x"]]
    async with open_run_store(state) as store:
        await store.create_run(
            RunRecord(
                batch_id,
                "batch",
                "running",
                created,
                str(folder),
                pipeline=str(pipeline),
                options={"repos": specs, "maxRepos": 2, "maxSessions": 4},
            )
        )
    repos, children = [], {}
    for name, fail in ran.items():
        repo = git_repo(folder, name)
        done = await run_pipeline(
            pipeline, {"task": TASK, "fail": fail}, cwd=repo, policy="edit", state_dir=state
        )
        children[name] = done.run_id
        diff = str(done.result.get("diff") or "")
        added, removed = count_lines(parse_diff(diff))
        repos.append(
            entry(
                name,
                path=str(repo),
                runId=done.run_id,
                status=done.status if done.status in ("succeeded", "failed") else "failed",
                exitCode=int(done.exit_code),
                error="step verify failed: verification failed" if fail else None,
                files=len(done.result.get("changes") or ()),
                added=added,
                removed=removed,
                verify="failed" if fail else "passed",
                branch=None if fail else "agent/fix",
                pushed=None if fail else "origin",
                tokens=100,
                seconds=1.5,
            )
        )
    repos.append(entry("clone-x", status="failed", error="clone failed: no such repository"))
    repos.append(entry("skip-x", status="skipped", skipped="budget", error="the budget was spent"))
    result = batch_object(batch_id, pipeline, repos, status)
    async with open_run_store(state) as store:
        for child in children.values():
            await store.set_parent(child, batch_id)
        finished = None if status == "running" else time.time()
        await store.update_run(batch_id, status=status, finished=finished, result=result)
    return batch_id, children

"""Reused branch directories in runs: every instance sees exactly its tree, reuse or not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from log_capture import capture_logs
from run_helpers import config, landlock_missing, spec_for

from orchestrator.pipeline import Pipeline, step
from orchestrator.runs import RunOutcome, diff_run, run_pipeline
from orchestrator.testing import AgentScript, Say, Spawn, Turn
from orchestrator.vfs import Branch, Workspace, materialize, pool
from orchestrator.vfs.testing import make_tree

LIMIT = 60.0


@pytest.fixture(autouse=True)
def pool_small_trees(monkeypatch: pytest.MonkeyPatch) -> None:
    """The workspaces here are small: pool their directories all the same."""
    monkeypatch.setattr(pool, "REUSE_MIN_FILES", 0)


#: lists the whole tree of its working directory (ignored files and ``.git`` included) and
#: logs whether it is the expected one; ``dump DIR`` prints the listing of DIR instead
WITNESS = r"""
import hashlib, json, os, stat, sys

def tree(root):
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root)
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ["link", os.readlink(full).replace(root, "ROOT")]
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ["dir", stat.S_IMODE(st.st_mode)]
            else:
                with open(full, "rb") as f:
                    data = f.read()
                out[rel] = ["file", stat.S_IMODE(st.st_mode), hashlib.sha256(data).hexdigest()]
    return out

if sys.argv[1] == "dump":
    print(json.dumps(tree(sys.argv[2])))
else:
    with open(sys.argv[1]) as f:
        expected = json.load(f)
    got = tree(os.getcwd())
    diff = sorted(k for k in expected.keys() | got.keys() if expected.get(k) != got.get(k))
    with open(os.path.join(sys.argv[2], f"{os.getpid()}.json"), "w") as f:
        json.dump({"diff": diff, "ino": os.stat(".").st_ino}, f)
"""

#: what an agent does to its directory on disk, the same in every instance: edits, a
#: deletion, a rename, modes, a link replaced, ignored files, .git directories, empty ones
VANDAL = r"""
import os
open("README.md", "w").write("# rewritten\n")
os.remove("docs/old.txt")
os.rename("src/util.py", "src/util2.py")
os.chmod("run.sh", 0o644)
os.chmod("src", 0o700)
os.remove("link.md")
os.symlink("src/main.py", "link.md")
open("x.log", "w").write("ignored\n")
os.makedirs("build", exist_ok=True)
open("build/out.o", "w").write("ignored\n")
os.makedirs(".git/objects")
open(".git/HEAD", "w").write("ref: refs/heads/main\n")
os.makedirs("src/.git")
open("src/.git/config", "w").write("[core]\n")
os.makedirs("empty/nested/dirs")
os.makedirs("new")
open("new/added.txt", "w").write("added\n")
"""


def make_workspace(tmp_path: Path) -> Path:
    """A workspace with an executable, a relative and an absolute link, ignored files, .git."""
    ws = make_tree(
        tmp_path / "ws",
        {
            "README.md": "# readme\n",
            "docs/old.txt": "old\n",
            "src/main.py": "print('hi')\n",
            "src/util.py": "x = 1\n",
            ".gitignore": "*.log\nbuild/\n",
            "app.log": "ignored\n",
            ".git/config": "[core]\n",
        },
    )
    (ws / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (ws / "run.sh").chmod(0o755)
    (ws / "link.md").symlink_to("README.md")
    (ws / "abs.md").symlink_to(ws / "src/main.py")
    return ws


def expected_listing(tmp_path: Path, ws: Path, witness: Path) -> Path:
    """The listing of a fresh checkout of the workspace, as the witness makes it."""
    wd = materialize(Branch.from_tree(Workspace.open(ws).snapshot(), "x"), tmp_path / "fresh")
    wd.close()
    out = subprocess.run(
        [sys.executable, str(witness), "dump", wd.root], capture_output=True, check=True
    ).stdout
    path = tmp_path / "expected.json"
    path.write_bytes(out)
    return path


def fan_out(agent: str, count: int) -> Pipeline:
    """items -> one branch of ``agent`` per item -> nothing after."""

    @step
    def items() -> list[str]:
        return [f"item{n:02d}" for n in range(count)]

    @step(agent=agent, over="items")
    def work(item: str) -> str:
        return f"work on {item}"

    return Pipeline.from_steps([items, work], name="fan")


async def run(pipe: Pipeline, ws: Path, cfg: Any, **kwargs: Any) -> RunOutcome:
    with trio.fail_after(LIMIT):
        return await run_pipeline(pipe, {}, cwd=ws, config=cfg, **kwargs)


def verdicts(log_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(log_dir.iterdir())]


async def test_every_instance_sees_exactly_the_base_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Instances that each vandalize their directory: the next ones still see the base tree,
    directories are reused (unless switched off), and the result is the same either way."""
    witness = tmp_path / "witness.py"
    witness.write_text(WITNESS)
    vandal = tmp_path / "vandal.py"
    vandal.write_text(VANDAL)
    diffs = []
    for reuse in (True, False):
        monkeypatch.setenv("ORCHESTRATOR_REUSE_DIRS", "1" if reuse else "0")
        top = tmp_path / f"reuse-{reuse}"
        ws = make_workspace(top)
        log_dir = top / "seen"
        log_dir.mkdir()
        expected = expected_listing(top, ws, witness)
        script = AgentScript(
            turns=(
                Turn(
                    steps=(
                        Spawn((sys.executable, str(witness), str(expected), str(log_dir))),
                        Spawn((sys.executable, str(vandal))),
                        Say("done"),
                    )
                ),
            )
        )
        with capture_logs() as logs:
            outcome = await run(
                fan_out("w", 8), ws, config(spec_for(script, top, "w")), max_sessions=2
            )
        assert outcome.status == "succeeded", outcome.result
        seen = verdicts(log_dir)
        assert len(seen) == 8
        assert [s["diff"] for s in seen] == [[]] * 8
        reused = [e for e in logs if e.get("event") == "branch directory reused"]
        assert (len(reused) > 0) is reuse
        diff = await diff_run(outcome.run_id)
        assert "# rewritten" in diff and "added.txt" in diff and "x.log" not in diff
        assert ".git/" not in diff
        diffs.append(diff.replace(str(ws), "WS"))
    # the merged result is the same with reuse on and off
    assert diffs[0] == diffs[1]


async def test_a_directory_a_daemon_still_writes_into_is_never_reused(tmp_path: Path) -> None:
    """Each instance leaves a job running that keeps writing in its directory: no directory
    it holds is reused, and every instance still sees the base tree."""
    ws = make_workspace(tmp_path)
    witness = tmp_path / "witness.py"
    witness.write_text(WITNESS)
    log_dir = tmp_path / "seen"
    log_dir.mkdir()
    expected = expected_listing(tmp_path, ws, witness)
    daemon = (
        sys.executable,
        "-c",
        # the same content every time: instances that harvest it do not conflict
        "import time\nwhile True:\n    open('daemon.txt', 'w').write('x')\n    time.sleep(0.01)",
    )
    script = AgentScript(
        turns=(
            Turn(
                steps=(
                    Spawn((sys.executable, str(witness), str(expected), str(log_dir))),
                    Spawn(daemon, detach=True),
                    Say("done"),
                )
            ),
        )
    )
    with capture_logs() as logs:
        outcome = await run(
            fan_out("d", 6), ws, config(spec_for(script, tmp_path, "d")), max_sessions=2
        )
    assert outcome.status == "succeeded", outcome.result
    seen = verdicts(log_dir)
    assert [s["diff"] for s in seen] == [[]] * 6
    assert not [e for e in logs if e.get("event") == "branch directory reused"]


def demo_fan_out(names: list[str]) -> Pipeline:
    """A fan-out over ``names`` whose demo agent replaces "colour" with "color" in each."""

    @step
    def items() -> list[str]:
        return names

    @step(agent="demo", over="items")
    def fix(item: str) -> str:
        return f'replace "colour" with "color" in {item}\n'

    return Pipeline.from_steps([items, fix], name="demo")


async def test_the_demo_agent_merges_the_same_with_and_without_reuse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A demo fan-out editing one file per item: the run's diff is the same, reuse on or off."""
    files = {f"f{n}.md": f"colour {n}\n" for n in range(6)}
    diffs = []
    for reuse in ("1", "0"):
        monkeypatch.setenv("ORCHESTRATOR_REUSE_DIRS", reuse)
        ws = make_tree(tmp_path / f"ws{reuse}", files)
        with capture_logs() as logs:
            outcome = await run(
                demo_fan_out(sorted(files)),
                ws,
                None,
                max_sessions=2,
                policy="edit",
            )
        assert outcome.status == "succeeded", outcome.result
        reused = [e for e in logs if e.get("event") == "branch directory reused"]
        assert (len(reused) > 0) is (reuse == "1")
        diffs.append((await diff_run(outcome.run_id)).replace(str(ws), "WS"))
    assert diffs[0] == diffs[1]
    assert diffs[0].count("+color") == 6
    assert os.environ["ORCHESTRATOR_REUSE_DIRS"] == "0"


@pytest.mark.skipif(landlock_missing() is not None, reason=str(landlock_missing()))
async def test_a_sandboxed_fan_out_reuses_its_directories(tmp_path: Path) -> None:
    """Confined agents (a process per session, working in its branch directory) are gone when
    their instance ends: the next instance gets the directory reset, not a fresh copy."""
    files = {f"f{n}.md": f"colour {n}\n" for n in range(4)}
    ws = make_tree(tmp_path / "ws", files)
    outcome = await run(
        demo_fan_out(sorted(files)),
        ws,
        None,
        max_sessions=1,
        policy="edit",
        sandbox=True,
    )
    assert outcome.status == "succeeded", outcome.result
    assert outcome.result["branches"]["made"] == 1
    assert outcome.result["branches"]["reused"] == 3
    assert (await diff_run(outcome.run_id)).count("+color") == 4


async def test_a_step_after_a_step_resets_its_directories_to_the_merged_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fan-out forked from a first fan-out's merged result gets the first one's directories
    reset to that result: each instance sees exactly it, and the run's diff is the same with
    reuse on and off."""
    witness = tmp_path / "witness.py"
    witness.write_text(WITNESS)
    vandal = tmp_path / "vandal.py"
    vandal.write_text(VANDAL)
    items_of = [f"f{n}.md" for n in range(4)]
    diffs = []
    for reuse in (True, False):
        monkeypatch.setenv("ORCHESTRATOR_REUSE_DIRS", "1" if reuse else "0")
        top = tmp_path / f"reuse-{reuse}"
        ws = make_workspace(top)
        merged = make_workspace(top / "merged")  # the workspace as the first step leaves it
        for name in items_of:
            (ws / name).write_text(f"colour {name}\n")
            (merged / name).write_text(f"color {name}\n")
        log_dir = top / "seen"
        log_dir.mkdir()
        expected = expected_listing(top / "merged", merged, witness)
        script = AgentScript(
            turns=(
                Turn(
                    steps=(
                        Spawn((sys.executable, str(witness), str(expected), str(log_dir))),
                        Spawn((sys.executable, str(vandal))),
                        Say("done"),
                    )
                ),
            )
        )

        @step
        def items() -> list[str]:
            return items_of

        @step(agent="demo", over="items")
        def fix(item: str) -> str:
            return f'replace "colour" with "color" in {item}\n'

        @step(agent="w", over="items")
        def check(item: str, fix: Any) -> str:
            return f"check {item}"

        with capture_logs() as logs:
            outcome = await run(
                Pipeline.from_steps([items, fix, check], name="two"),
                ws,
                config(spec_for(script, top, "w")),
                max_sessions=2,
                policy="edit",
            )
        assert outcome.status == "succeeded", outcome.result
        seen = verdicts(log_dir)
        assert [s["diff"] for s in seen] == [[]] * len(items_of)
        reused = [e for e in logs if e.get("event") == "branch directory reused"]
        assert (len(reused) > 0) is reuse
        # the second step's first instance finds only the first step's directories in the
        # pool: it resets one, writing the files the steps' trees differ in
        onto = [e for e in reused if e.get("differing") == len(items_of)]
        assert (len(onto) > 0) is reuse
        assert all(e["branch"].startswith("check") for e in onto)
        diff = await diff_run(outcome.run_id)
        assert diff.count("+color") == len(items_of) and "# rewritten" in diff
        diffs.append(diff.replace(str(ws), "WS"))
    assert diffs[0] == diffs[1]

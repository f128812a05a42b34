"""The virtual filesystem end to end: the real ACP client, scripted agents as real subprocesses.

Each agent works on its own branch of a temporary workspace, the way
:func:`orchestrator.runs.prompt` runs one (snapshot, ``Branch.from_tree``, materialize under the
state directory, ``BranchFileSystem`` as the fs service, terminals harvesting on exit, a full
harvest after the turn), but the branches are kept so two of them can be merged. What each agent
did is read back from its JSON-lines record. The agents are processes, so time is real: every wait
is bounded by ``trio.fail_after`` and every test checks that no agent process is left.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import stat
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
from attrs import define, field
from conftest import pid_gone
from run_helpers import project_config

from orchestrator.agent.branchfs import BranchFileSystem
from orchestrator.agent.client import open_agent
from orchestrator.agent.permissions import PolicyPermissionService
from orchestrator.agent.services import ClientServices, SessionContext
from orchestrator.agent.terminals import open_terminal_service
from orchestrator.agent.turn import TurnResult
from orchestrator.agents import AgentSpec
from orchestrator.policy import PolicySet
from orchestrator.protocol import types as t
from orchestrator.runs import prompt
from orchestrator.testing import (
    AgentScript,
    DeleteDisk,
    ReadFile,
    Replace,
    Say,
    Step,
    Terminal,
    Turn,
    WriteDisk,
    WriteFile,
)
from orchestrator.testing.scripted_agent import AgentRecord, scripted_agent_command
from orchestrator.vfs import (
    Branch,
    ConflictStrategy,
    ConflictWatch,
    Delete,
    EarlyWarning,
    MergeConflictError,
    Snapshot,
    Workdir,
    Workspace,
    WorkspaceChanged,
    Write,
    apply_changes_async,
    materialize_async,
    merge_branches,
    unified_diff,
)

LIMIT = 30.0  # seconds any test here may take (each agent is a fresh Python process)
CLI = Path(sys.executable).parent / "orchestrator"
EXIT_WORKSPACE_CHANGED = 3
INVALID_PARAMS = -32602

BASE_DOC = "".join(f"line {n}\n" for n in range(1, 13)).encode()


# --------------------------------------------------------------------------- helpers

#: what a tree holds: path -> (kind, mode, content digest or link target, mtime_ns)
TreeState = dict[str, tuple[str, int, str, int]]


def tree_state(root: Path, *, skip: tuple[Path, ...] = ()) -> TreeState:
    """Every entry under ``root`` (symlinks not followed) with its bytes' hash and mtime.

    Equal states mean the tree is byte-for-byte the same and no file was even rewritten.
    """
    found: TreeState = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if Path(dirpath, d) not in skip]
        for name in sorted(dirnames + filenames):
            full = Path(dirpath, name)
            rel = str(full.relative_to(root))
            st = full.lstat()
            if stat.S_ISLNK(st.st_mode):
                found[rel] = ("link", st.st_mode, os.readlink(full), st.st_mtime_ns)
            elif stat.S_ISDIR(st.st_mode):
                found[rel] = ("dir", st.st_mode, "", 0)  # its mtime moves with temp files
            else:
                data = hashlib.sha256(full.read_bytes()).hexdigest()
                found[rel] = ("file", st.st_mode, data, st.st_mtime_ns)
    return found


def write_tree(root: Path, files: dict[str, bytes]) -> Path:
    """Create ``root`` holding ``files``."""
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def running_with(marker: str) -> list[int]:
    """Pids of live (non-zombie) processes whose command line mentions ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline and not pid_gone(int(entry)):
            found.append(int(entry))
    return found


@pytest.fixture(autouse=True)
def no_agent_left(tmp_path: Path) -> Iterator[None]:
    """After each test, no process started from this test's scripts is alive."""
    yield
    # every script and record of a test lives under its tmp_path
    assert running_with(str(tmp_path)) == [], "an agent process outlived its test"


def agent_script(steps: tuple[Step, ...], record: Path) -> AgentScript:
    """An agent that plays ``steps`` then says "done", recording to ``record``."""
    return AgentScript(turns=(Turn(steps=(*steps, Say("done"))),), record_path=str(record))


@define
class BranchRun:
    """One agent's branch: its working directory, fs service, and what its run left."""

    branch: Branch
    workdir: Workdir
    fs: BranchFileSystem
    record_path: Path
    turn: TurnResult | None = None
    #: the branch's files right after each terminal-exit harvest, before the turn went on
    at_terminal_exit: list[dict[str, bytes | None]] = field(factory=list)

    @property
    def root(self) -> Path:
        """The branch directory (the agent's cwd)."""
        return Path(self.workdir.root)

    def record(self) -> AgentRecord:
        """What the agent recorded (read once it has exited)."""
        return AgentRecord.from_jsonl(self.record_path)

    async def on_terminal_exit(
        self, ctx: SessionContext, terminal_id: str, status: t.TerminalExitStatus
    ) -> None:
        """The fs service's hook, then a look at what the branch holds at that moment."""
        await self.fs.on_terminal_exit(ctx, terminal_id, status)
        states = {path: self.branch.state(path) for path in self.branch.changes}
        self.at_terminal_exit.append(
            {path: None if state is None else state.data for path, state in states.items()}
        )


@define
class Lab:
    """A workspace snapshotted once, and branches of it, each for one scripted agent."""

    snapshot: Snapshot
    state_dir: Path
    agents_dir: Path
    watch: ConflictWatch = field(factory=ConflictWatch)
    runs: list[BranchRun] = field(factory=list)

    async def fork(self, name: str) -> BranchRun:
        """A branch of the snapshot, materialized under the state directory."""
        branch = Branch.from_tree(self.snapshot, name, watch=self.watch)
        workdir = await materialize_async(branch, self.state_dir / "branches" / name)
        run = BranchRun(
            branch, workdir, BranchFileSystem(workdir), self.agents_dir / f"{name}.jsonl"
        )
        self.runs.append(run)
        return run

    async def play(self, run: BranchRun, steps: tuple[Step, ...]) -> None:
        """Run a scripted agent (a subprocess) for one turn on ``run``'s branch, then harvest."""
        command = scripted_agent_command(agent_script(steps, run.record_path), self.agents_dir)
        permission = PolicyPermissionService(PolicySet.from_preset("trusted"))
        pid: int | None = None
        async with open_terminal_service(
            command_check=permission.check_command, on_exit=run.on_terminal_exit
        ) as terminals:
            services = ClientServices(fs=run.fs, terminal=terminals, permission=permission)
            async with open_agent(
                command,
                name=run.branch.name,
                cwd=run.root,
                services=services,
                term_grace=1.0,
            ) as conn:
                pid = conn.pid
                session = await conn.new_session(run.root)
                run.turn = await session.prompt("go")
        await run.fs.harvest(full=True)
        assert pid is not None and pid_gone(pid), f"agent {pid} outlived its connection"


@asynccontextmanager
async def open_lab(workspace: Path, state_dir: Path, agents_dir: Path) -> AsyncIterator[Lab]:
    """Snapshot ``workspace``; on exit remove every branch directory."""
    agents_dir.mkdir(exist_ok=True)
    snapshot = await trio.to_thread.run_sync(Workspace.open(workspace).snapshot)
    lab = Lab(snapshot, state_dir, agents_dir)
    try:
        yield lab
    finally:
        with trio.CancelScope(shield=True):
            for run in lab.runs:
                await trio.to_thread.run_sync(run.workdir.remove)


def replaced(data: bytes, old: str, new: str) -> bytes:
    """``data`` with one line replaced (asserting it was there)."""
    assert old.encode() in data
    return data.replace(old.encode(), new.encode(), 1)


# --------------------------------------------------------------------------- merging two agents


async def test_two_agents_in_different_regions_merge_and_apply(
    tmp_path: Path, state_dir: Path
) -> None:
    """fs/* edit + on-disk edit of one file in different regions: clean merge, exact apply."""
    ws = write_tree(tmp_path / "ws", {"doc.txt": BASE_DOC, "other.txt": b"untouched\n"})
    ours = replaced(BASE_DOC, "line 2\n", "line 2 by a\n")
    theirs = replaced(BASE_DOC, "line 11\n", "line 11 by b\n")
    combined = replaced(ours, "line 11\n", "line 11 by b\n")
    before = tree_state(ws)
    with trio.fail_after(LIMIT):
        async with open_lab(ws, state_dir, tmp_path / "agents") as lab:
            a, b = await lab.fork("a"), await lab.fork("b")
            with lab.watch.subscribe() as warnings:
                async with trio.open_nursery() as nursery:  # both agents run at once
                    edit = Replace("line 2\n", "line 2 by a\n")
                    nursery.start_soon(lab.play, a, (ReadFile("doc.txt", then_write=edit),))
                    nursery.start_soon(lab.play, b, (WriteDisk("doc.txt", theirs.decode()),))
                warning = await warnings.receive()
            a.branch.close()
            b.branch.close()
            assert tree_state(ws) == before  # agents never write the workspace
            result = merge_branches([a.branch, b.branch])
            applied = await apply_changes_async(result, state_dir=state_dir)

    assert isinstance(warning, EarlyWarning)
    assert (warning.path, set(warning.branches)) == ("doc.txt", {"a", "b"})
    assert lab.watch.history == [warning]
    record_a, record_b = a.record(), b.record()
    assert [e["content"] for e in record_a.of("fs_read")] == [BASE_DOC.decode()]
    (write,) = record_a.of("fs_write")
    assert (write["path"], write["content"], write["result"]) == (
        str(a.root / "doc.txt"),
        ours.decode(),
        {},
    )
    assert [e["path"] for e in record_b.of("disk_write")] == [str(b.root / "doc.txt")]
    assert a.turn is not None and b.turn is not None
    assert (a.turn.text, b.turn.text) == ("done", "done")
    assert a.branch.read("doc.txt") == ours and b.branch.read("doc.txt") == theirs
    assert result.ok and result.resolved == () and result.sources == ("a", "b")
    assert list(result.changes) == ["doc.txt"]
    assert applied.applied and applied.written == ("doc.txt",)
    after = tree_state(ws)
    assert (ws / "doc.txt").read_bytes() == combined
    assert {k: v for k, v in after.items() if k != "doc.txt"} == {
        k: v for k, v in before.items() if k != "doc.txt"
    }


async def test_same_region_conflicts_and_leaves_the_workspace_unchanged(
    tmp_path: Path, state_dir: Path
) -> None:
    """Same line: a Conflict with all versions; "fail" applies nothing; ours/theirs settle it."""
    ws = write_tree(tmp_path / "ws", {"doc.txt": BASE_DOC, "other.txt": b"untouched\n"})
    ours = replaced(BASE_DOC, "line 6\n", "line 6 by a\n")
    theirs = replaced(BASE_DOC, "line 6\n", "line 6 by b\n")
    before = tree_state(ws)
    with trio.fail_after(LIMIT):
        async with open_lab(ws, state_dir, tmp_path / "agents") as lab:
            a, b = await lab.fork("a"), await lab.fork("b")
            async with trio.open_nursery() as nursery:
                edit = Replace("line 6\n", "line 6 by a\n")
                nursery.start_soon(lab.play, a, (ReadFile("doc.txt", then_write=edit),))
                steps = (WriteDisk("doc.txt", theirs.decode()), WriteFile("other.txt", "by b\n"))
                nursery.start_soon(lab.play, b, steps)
            a.branch.close()
            b.branch.close()
            failed = merge_branches([a.branch, b.branch], strategy="fail")
            with pytest.raises(MergeConflictError):
                await apply_changes_async(failed, state_dir=state_dir)
            unchanged = tree_state(ws)
            by_ours = merge_branches([a.branch, b.branch], strategy=ConflictStrategy.OURS)
            by_theirs = merge_branches([a.branch, b.branch], strategy="theirs")
            applied = await apply_changes_async(by_theirs, state_dir=state_dir)
            too_late = await apply_changes_async(by_ours, state_dir=state_dir)

    assert [w.path for w in lab.watch.history] == ["doc.txt"]
    assert not failed.ok
    (conflict,) = failed.conflicts
    assert (conflict.path, conflict.kind) == ("doc.txt", "content")
    assert (conflict.base, conflict.ours, conflict.theirs) == (BASE_DOC, ours, theirs)
    assert (conflict.ours_name, conflict.theirs_name) == ("a", "b")
    assert [(h.base, h.ours, h.theirs) for h in conflict.hunks] == [((5, 6), (5, 6), (5, 6))]
    markers = conflict.with_markers()
    assert b"<<<<<<< a\nline 6 by a\n||||||| base\nline 6\n=======\nline 6 by b\n>>>>>>> b\n" in (
        markers
    )
    # the conflicted file stays at its base version; the clean part is merged but not applied
    assert list(failed.changes) == ["other.txt"]
    assert unchanged == before
    # asked for, the strategies settle it, and say so
    assert by_ours.ok and [c.path for c in by_ours.resolved] == ["doc.txt"]
    assert by_theirs.ok and [c.path for c in by_theirs.resolved] == ["doc.txt"]
    ours_change, theirs_change = by_ours.changes["doc.txt"], by_theirs.changes["doc.txt"]
    assert isinstance(ours_change, Write) and ours_change.data == ours
    assert isinstance(theirs_change, Write) and theirs_change.data == theirs
    assert applied.applied and sorted(applied.written) == ["doc.txt", "other.txt"]
    assert (ws / "doc.txt").read_bytes() == theirs
    # the snapshot no longer matches the workspace: a second apply is refused, all of it
    assert not too_late.applied
    assert sorted(c.path for c in too_late.conflicts) == ["doc.txt", "other.txt"]
    assert (ws / "doc.txt").read_bytes() == theirs
    assert (ws / "other.txt").read_bytes() == b"by b\n"


# --------------------------------------------------------------------------- harvesting


async def test_disk_writes_terminal_commands_and_deletions_are_harvested(
    tmp_path: Path, state_dir: Path
) -> None:
    """write_disk, `sed -i` in a terminal (harvested on exit), delete_disk, fs/write: all kept."""
    ws = write_tree(
        tmp_path / "ws",
        {
            "notes.txt": b"original notes\n",
            "sed_me.txt": b"alpha\nbeta\n",
            "obsolete.txt": b"old\n",
            "keep.txt": b"kept\n",
        },
    )
    steps: tuple[Step, ...] = (
        WriteDisk("notes.txt", "rewritten on disk\n"),
        WriteDisk("fresh/by_disk.txt", "new on disk\n"),
        Terminal("sed -i 's/alpha/ALPHA/' sed_me.txt"),
        ReadFile("sed_me.txt"),
        DeleteDisk("obsolete.txt"),
        WriteFile("made/by/fs.txt", "created through fs\n"),
    )
    with trio.fail_after(LIMIT):
        async with open_lab(ws, state_dir, tmp_path / "agents") as lab:
            run = await lab.fork("solo")
            await lab.play(run, steps)
            changes = run.branch.changes
            diff = unified_diff(run.branch)
            applied = await apply_changes_async(run.branch, state_dir=state_dir)

    record = run.record()
    (term,) = record.of("terminal")
    assert term["exitStatus"]["exitCode"] == 0
    # harvested when the command exited, before the turn went on (or ended)
    assert run.at_terminal_exit == [
        {
            "notes.txt": b"rewritten on disk\n",
            "fresh/by_disk.txt": b"new on disk\n",
            "sed_me.txt": b"ALPHA\nbeta\n",
        }
    ]
    assert [e["content"] for e in record.of("fs_read")] == ["ALPHA\nbeta\n"]
    assert [e.get("error") for e in record.of("fs_write")] == [None]
    assert [(e["path"], e["existed"]) for e in record.of("disk_delete")] == [
        (str(run.root / "obsolete.txt"), True)
    ]
    assert sorted(changes) == [
        "fresh/by_disk.txt",
        "made/by/fs.txt",
        "notes.txt",
        "obsolete.txt",
        "sed_me.txt",
    ]
    assert isinstance(changes["obsolete.txt"], Delete)
    contents = {p: c.data for p, c in changes.items() if isinstance(c, Write)}
    assert contents == {
        "fresh/by_disk.txt": b"new on disk\n",
        "made/by/fs.txt": b"created through fs\n",
        "notes.txt": b"rewritten on disk\n",
        "sed_me.txt": b"ALPHA\nbeta\n",
    }
    assert "-alpha\n+ALPHA\n" in diff and "+++ /dev/null" in diff
    assert applied.applied
    assert sorted(applied.written) == sorted(contents) and applied.deleted == ("obsolete.txt",)
    assert {str(p.relative_to(ws)): p.read_bytes() for p in ws.rglob("*") if p.is_file()} == {
        **contents,
        "keep.txt": b"kept\n",
    }


# --------------------------------------------------------------------------- refusals


async def test_escapes_are_refused_and_nothing_outside_the_branch_changes(
    tmp_path: Path, state_dir: Path
) -> None:
    """`..`, absolute paths outside and symlinks out of the branch: -32602, nothing written."""
    outside = write_tree(
        tmp_path / "outside", {"secret.txt": b"top secret\n", "dir/inner.txt": b"inner\n"}
    )
    ws = write_tree(tmp_path / "ws", {"notes.txt": b"notes\n"})
    (ws / "link_file").symlink_to(outside / "secret.txt")
    (ws / "link_dir").symlink_to(outside / "dir")
    (ws / "dangling").symlink_to(outside / "not_yet.txt")
    beside = write_tree(state_dir / "branches", {"outside.txt": b"beside the branch\n"})
    before = (tree_state(ws), tree_state(outside), tree_state(state_dir, skip=(beside / "a",)))
    with trio.fail_after(LIMIT):
        async with open_lab(ws, state_dir, tmp_path / "agents") as lab:
            run = await lab.fork("a")
            root = str(run.root)
            refused: tuple[Step, ...] = (
                ReadFile(f"{root}/../outside.txt"),
                WriteFile(f"{root}/../outside.txt", "pwned"),
                ReadFile("../outside.txt"),  # relative: the agent joins it to its cwd
                ReadFile(str(ws / "notes.txt")),
                WriteFile(str(ws / "notes.txt"), "pwned"),
                WriteFile(str(outside / "new.txt"), "pwned"),
                ReadFile("/etc/passwd"),
                ReadFile("link_file"),
                WriteFile("link_file", "pwned"),
                ReadFile("link_dir/inner.txt"),
                WriteFile("link_dir/planted.txt", "pwned"),
                WriteFile("dangling", "pwned"),
            )
            allowed: tuple[Step, ...] = (
                ReadFile(f"{root}/sub/../notes.txt"),  # `..` that stays inside is fine
                WriteFile("ok.txt", "fine\n"),
            )
            await lab.play(run, (*refused, *allowed))
            changes = dict(run.branch.changes)
            links = {n: os.readlink(run.root / n) for n in ("link_file", "link_dir", "dangling")}
            after = (
                tree_state(ws),
                tree_state(outside),
                tree_state(state_dir, skip=(beside / "a",)),
            )

    record = run.record()
    answers = [e for e in record.events if e["event"] in ("fs_read", "fs_write")]
    assert len(answers) == len(refused) + len(allowed)
    for event in answers[: len(refused)]:
        error = event.get("error")
        assert isinstance(error, dict), event
        assert error["code"] == INVALID_PARAMS, event
        assert "outside the branch directory" in error["message"], event
        assert event["event"] == "fs_write" or "content" not in event  # nothing was read
    assert all("through a symlink" in e["error"]["message"] for e in answers[7 : len(refused)])
    read_ok, write_ok = answers[len(refused) :]
    assert read_ok["content"] == "notes\n"
    assert write_ok["result"] == {}
    assert after == before
    assert not (outside / "not_yet.txt").exists() and not (outside / "new.txt").exists()
    assert list(changes) == ["ok.txt"]
    assert links == {
        "link_file": str(outside / "secret.txt"),
        "link_dir": str(outside / "dir"),
        "dangling": str(outside / "not_yet.txt"),
    }


# --------------------------------------------------------------------------- api.prompt and CLI


def project(root: Path) -> Path:
    """A small workspace for the prompt runs."""
    files = {"notes.txt": b"one\ntwo\nthree\n", "obsolete.txt": b"old\n", "keep.txt": b"kept\n"}
    return write_tree(root, files)


async def test_prompt_lists_diffs_and_applies_the_changes(tmp_path: Path, state_dir: Path) -> None:
    """api.prompt: changes with their kinds, the diff, and apply=True writes exactly them."""
    ws = project(tmp_path / "ws")
    agents = tmp_path / "agents"
    agents.mkdir()
    record = agents / "record.jsonl"
    steps: tuple[Step, ...] = (
        ReadFile("notes.txt", then_write=Replace("two", "TWO")),
        Terminal("sed -i 's/three/THREE/' notes.txt"),
        WriteFile("docs/new.md", "# New\n"),
        DeleteDisk("obsolete.txt"),
    )
    spec = AgentSpec("scripted", tuple(scripted_agent_command(agent_script(steps, record), agents)))
    with trio.fail_after(LIMIT):
        run = await prompt(spec, "go", cwd=ws, policy="trusted", apply=True, state_dir=state_dir)

    assert run.turn.stop_reason == "end_turn" and run.turn.text == "done"
    assert sorted((c.path, c.change) for c in run.changes) == [
        ("docs/new.md", "added"),
        ("notes.txt", "modified"),
        ("obsolete.txt", "deleted"),
    ]
    for line in ("-two", "+TWO", "-three", "+THREE", "+# New", "--- a/obsolete.txt", "-old"):
        assert f"\n{line}\n" in run.diff, line
    assert run.applied and run.workspace_changed == ()
    assert (Path(run.run_dir) / "changes.patch").is_file()
    assert {str(p.relative_to(ws)): p.read_bytes() for p in ws.rglob("*") if p.is_file()} == {
        "notes.txt": b"one\nTWO\nTHREE\n",
        "docs/new.md": b"# New\n",
        "keep.txt": b"kept\n",
    }
    # the agent worked in its branch directory, which is gone afterwards
    (session,) = AgentRecord.from_jsonl(record).of("session_new")
    assert Path(session["cwd"]).is_relative_to(Path(run.run_dir).resolve())
    assert not Path(session["cwd"]).exists()


def outside_edit_steps(ws: Path) -> tuple[Step, ...]:
    """Edit notes.txt in the branch, add a file, and meanwhile change notes.txt in the workspace
    itself (an absolute path: someone else editing the user's file during the run)."""
    return (
        ReadFile("notes.txt", then_write=Replace("two", "TWO")),
        WriteFile("docs/new.md", "# New\n"),
        WriteDisk(str(ws / "notes.txt"), "someone else\n"),
    )


async def test_apply_refuses_a_file_changed_in_the_workspace_during_the_run(
    tmp_path: Path, state_dir: Path
) -> None:
    """Someone edits a file the agent also changed: apply_changes refuses and writes nothing."""
    ws = project(tmp_path / "ws")
    before = tree_state(ws)
    with trio.fail_after(LIMIT):
        async with open_lab(ws, state_dir, tmp_path / "agents") as lab:
            run = await lab.fork("a")
            await lab.play(run, outside_edit_steps(ws))
            changes = sorted(run.branch.changes)
            outcome = await apply_changes_async(run.branch, state_dir=state_dir)

    assert changes == ["docs/new.md", "notes.txt"]
    assert not outcome.applied and outcome.written == ()
    assert [(c.path, c.reason) for c in outcome.conflicts] == [
        ("notes.txt", "changed in the workspace after the snapshot")
    ]
    assert (ws / "notes.txt").read_bytes() == b"someone else\n"
    assert not (ws / "docs").exists()
    after = tree_state(ws)
    assert {k: v for k, v in after.items() if k != "notes.txt"} == {
        k: v for k, v in before.items() if k != "notes.txt"
    }


async def test_prompt_apply_is_refused_when_the_workspace_changed(
    tmp_path: Path, state_dir: Path
) -> None:
    """A file changed in the workspace during the run: workspaceChanged, and nothing is written."""
    ws = project(tmp_path / "ws")
    agents = tmp_path / "agents"
    agents.mkdir()
    record = agents / "record.jsonl"
    command = scripted_agent_command(agent_script(outside_edit_steps(ws), record), agents)
    before = tree_state(ws)
    with trio.fail_after(LIMIT):
        try:
            run = await prompt(
                AgentSpec("scripted", tuple(command)),
                "go",
                cwd=ws,
                policy="trusted",
                apply=True,
                state_dir=state_dir,
            )
        except WorkspaceChanged as e:
            pytest.fail(f"prompt raised instead of reporting workspaceChanged: {e!r}")

    assert sorted((c.path, c.change) for c in run.changes) == [
        ("docs/new.md", "added"),
        ("notes.txt", "modified"),
    ]
    assert not run.applied
    assert run.workspace_changed == ("notes.txt",)
    assert run.to_json()["workspaceChanged"] == ["notes.txt"]
    assert (ws / "notes.txt").read_bytes() == b"someone else\n"  # the outside edit stays
    assert not (ws / "docs").exists()  # all or nothing: the clean new file is not written
    after = tree_state(ws)
    assert {k: v for k, v in after.items() if k != "notes.txt"} == {
        k: v for k, v in before.items() if k != "notes.txt"
    }
    patch = (Path(run.run_dir) / "changes.patch").read_text("utf-8")
    assert "+# New" in patch  # the work is kept for later
    # notes.txt was changed before the workspace file was: the run kept what it changed it from
    assert "-two\n+TWO\n" in patch and run.patch_left_out == ()


@pytest.mark.skipif(not CLI.is_file(), reason=f"console script {CLI} not installed")
async def test_cli_apply_conflict_exits_3(tmp_path: Path, state_dir: Path) -> None:
    """`orchestrator prompt --apply --json` with an outside edit: exit 3, workspaceChanged."""
    ws = project(tmp_path / "ws")
    agents = tmp_path / "agents"
    agents.mkdir()
    command = scripted_agent_command(
        agent_script(outside_edit_steps(ws), agents / "record.jsonl"), agents
    )
    agent = "scripted=" + shlex.join(command)
    args = [str(CLI), "prompt", "--apply", "--json", "--policy", "trusted", "--agent", agent]
    args += ["--state-dir", str(state_dir), "--cwd", str(ws), "go"]
    with trio.fail_after(LIMIT):
        done = await trio.run_process(args, capture_stdout=True, capture_stderr=True, check=False)

    assert done.returncode == EXIT_WORKSPACE_CHANGED, done.stderr.decode()
    data: dict[str, Any] = orjson.loads(done.stdout)
    assert (data["applied"], data["workspaceChanged"]) == (False, ["notes.txt"])
    assert sorted((c["path"], c["change"]) for c in data["changes"]) == [
        ("docs/new.md", "added"),
        ("notes.txt", "modified"),
    ]
    assert data["patch"] and Path(data["patch"]).is_file()
    assert (ws / "notes.txt").read_bytes() == b"someone else\n"
    assert not (ws / "docs").exists()


@pytest.mark.skipif(not CLI.is_file(), reason=f"console script {CLI} not installed")
async def test_cli_prompt_keeps_work_when_the_workspace_changed_during_the_run(
    tmp_path: Path, state_dir: Path
) -> None:
    """prompt without --apply, a file edited meanwhile: succeeded, diff and patch keep the work."""
    ws = project(tmp_path / "ws")
    agents = tmp_path / "agents"
    agents.mkdir()
    command = scripted_agent_command(
        agent_script(outside_edit_steps(ws), agents / "record.jsonl"), agents
    )
    agent = "scripted=" + shlex.join(command)
    base = [str(CLI), "--log-json"]
    state = ["--state-dir", str(state_dir)]

    async def cli(*argv: str) -> subprocess.CompletedProcess[bytes]:
        with trio.fail_after(LIMIT):
            return await trio.run_process(
                [*base, *argv, *state], capture_stdout=True, capture_stderr=True, check=False
            )

    done = await cli(
        "prompt", "--json", "--policy", "trusted", "--agent", agent, "--cwd", str(ws), "go"
    )
    assert done.returncode == 0, done.stderr.decode()
    data: dict[str, Any] = orjson.loads(done.stdout)
    assert (data["status"], data["applied"]) == ("succeeded", False)
    assert Path(data["patch"]).stat().st_size > 0
    assert "+one\nTWO" in Path(data["patch"]).read_text() or "TWO" in data["diff"]
    diff = await cli("diff", data["runId"])
    assert "notes.txt" in diff.stdout.decode()
    assert "docs/new.md" in diff.stdout.decode()
    applied = await cli("apply", data["runId"], "--json")
    assert applied.returncode == EXIT_WORKSPACE_CHANGED, applied.stderr.decode()
    refused: dict[str, Any] = orjson.loads(applied.stdout)
    assert refused["workspaceChanged"] == ["notes.txt"]
    assert (ws / "notes.txt").read_bytes() == b"someone else\n"
    assert not (ws / "docs").exists()


NOTES = b"one\ntwo\nthree\n"
ONE_STEP = """\
from orchestrator import step


@step(agent="scripted")
def second(task: str) -> str:
    return "go"
"""


def aged(root: Path) -> Path:
    """Push every file's mtime an hour back, as for files not just written: the snapshot hashes
    none of them up front (racily clean files it would)."""
    old = 1_700_000_000
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            os.utime(os.path.join(dirpath, name), (old, old), follow_symlinks=False)
    return root


def outside_then_own_edit(ws: Path) -> tuple[Step, ...]:
    """notes.txt changes in the workspace itself (an absolute path) before the run read it; then
    the agent edits its own copy on disk, behind the client's back."""
    return (
        WriteDisk(str(ws / "notes.txt"), "someone else\n"),
        WriteDisk("notes.txt", "one\nTWO\nthree\n"),
    )


async def console(*argv: str, state_dir: Path) -> subprocess.CompletedProcess[bytes]:
    """The console script, to its end."""
    with trio.fail_after(LIMIT):
        return await trio.run_process(
            [str(CLI), *argv, "--state-dir", str(state_dir)],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )


@pytest.mark.skipif(not CLI.is_file(), reason=f"console script {CLI} not installed")
async def test_cli_run_change_applies_once_the_workspace_file_is_restored(
    tmp_path: Path, state_dir: Path
) -> None:
    """run --apply: a file changed in the workspace before the run read it exits 3; once the
    file is as it was, apply RUN writes the run's change (the base is what the run copied)."""
    ws = project(tmp_path / "ws")
    agents = tmp_path / "agents"
    agents.mkdir()
    command = scripted_agent_command(
        agent_script(outside_then_own_edit(ws), agents / "record.jsonl"), agents
    )
    project_config(ws, f"[agents.scripted]\ncommand = {orjson.dumps(command).decode()}\n")
    aged(ws)
    pipeline = tmp_path / "slow.py"
    pipeline.write_text(ONE_STEP)
    args = ("run", str(pipeline), "--cwd", str(ws), "--set", "task=x", "--policy", "trusted")
    done = await console(*args, "--apply", "--no-progress", state_dir=state_dir)
    assert done.returncode == EXIT_WORKSPACE_CHANGED, done.stderr.decode()
    listed = await console("runs", "--json", state_dir=state_dir)
    run_id = orjson.loads(listed.stdout)["runs"][0]["runId"]
    assert (ws / "notes.txt").read_bytes() == b"someone else\n"

    (ws / "notes.txt").write_bytes(NOTES)  # the user restores the file
    applied = await console("apply", run_id, "--json", state_dir=state_dir)
    assert applied.returncode == 0, applied.stderr.decode()
    assert orjson.loads(applied.stdout)["written"] == ["notes.txt"]
    assert (ws / "notes.txt").read_bytes() == b"one\nTWO\nthree\n"
    err = done.stdout.decode()  # the result
    assert "NOT applied: changed in the workspace during the run: notes.txt" in err
    assert (
        f"the changes are kept in the run store: orchestrator diff {run_id} shows them; "
        f"once those files are as they were when the run started: orchestrator apply {run_id}"
    ) in err


@pytest.mark.skipif(not CLI.is_file(), reason=f"console script {CLI} not installed")
async def test_cli_prompt_never_points_at_a_patch_that_lacks_the_change(
    tmp_path: Path, state_dir: Path
) -> None:
    """prompt --apply, the agent's copy edited after the workspace file changed: changes.patch
    cannot hold that change, so the message sends to the run store, and --json says so."""
    ws = project(tmp_path / "ws")
    agents = tmp_path / "agents"
    agents.mkdir()
    command = scripted_agent_command(
        agent_script(outside_then_own_edit(ws), agents / "record.jsonl"), agents
    )
    agent = "scripted=" + shlex.join(command)
    aged(ws)
    args = ("prompt", "--apply", "--policy", "trusted", "--agent", agent, "--cwd", str(ws))
    done = await console(*args, "go", state_dir=state_dir)
    assert done.returncode == EXIT_WORKSPACE_CHANGED, done.stderr.decode()
    listed = await console("runs", "--json", state_dir=state_dir)
    run_id = orjson.loads(listed.stdout)["runs"][0]["runId"]
    patch = state_dir / "runs" / run_id / "changes.patch"
    assert patch.read_bytes() == b""
    err = done.stdout.decode()  # the result
    assert f"the changes are kept in the run store ({patch} leaves out notes.txt): " in err
    assert f"orchestrator diff {run_id} shows them" in err
    assert f"orchestrator apply {run_id} writes them" in err

    (ws / "notes.txt").write_bytes(NOTES)
    aged(ws)
    done = await console(*args, "--json", "go", state_dir=state_dir)
    assert done.returncode == EXIT_WORKSPACE_CHANGED, done.stderr.decode()
    data: dict[str, Any] = orjson.loads(done.stdout)
    assert (data["workspaceChanged"], data["patchLeftOut"]) == (["notes.txt"], ["notes.txt"])


@pytest.mark.skipif(not CLI.is_file(), reason=f"console script {CLI} not installed")
async def test_cli_prompt_patch_holds_a_change_to_a_file_changed_in_the_workspace(
    tmp_path: Path, state_dir: Path
) -> None:
    """The workspace file changes, then the agent edits it through fs/*: the untouched copy it
    read was the base, so changes.patch applies to the file as it was, diff RUN is a plain diff,
    and the message names the patch."""
    ws = project(tmp_path / "ws")
    agents = tmp_path / "agents"
    agents.mkdir()
    steps = (
        WriteDisk(str(ws / "notes.txt"), "someone else\n"),
        ReadFile("notes.txt", then_write=Replace("two", "TWO")),
    )
    command = scripted_agent_command(agent_script(steps, agents / "record.jsonl"), agents)
    agent = "scripted=" + shlex.join(command)
    aged(ws)
    args = ("prompt", "--apply", "--policy", "trusted", "--agent", agent, "--cwd", str(ws))
    done = await console(*args, "go", state_dir=state_dir)
    assert done.returncode == EXIT_WORKSPACE_CHANGED, done.stderr.decode()
    listed = await console("runs", "--json", state_dir=state_dir)
    run_id = orjson.loads(listed.stdout)["runs"][0]["runId"]
    patch = state_dir / "runs" / run_id / "changes.patch"
    diff = (await console("diff", run_id, state_dir=state_dir)).stdout.decode()
    assert "@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three\n" in diff

    (ws / "notes.txt").write_bytes(NOTES)  # as it was: the patch applies to it
    with trio.fail_after(LIMIT):
        await trio.run_process(["git", "apply", str(patch)], cwd=ws, capture_stderr=True)
    assert (ws / "notes.txt").read_bytes() == b"one\nTWO\nthree\n"
    assert f"the changes are kept in the run store and in {patch}: " in done.stdout.decode()

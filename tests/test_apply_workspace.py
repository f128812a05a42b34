"""What an apply leaves in the workspace: modes, type changes in ``changes.patch``, and a crash.

Through the console script, with the demo agent editing files and running shell commands: a
mode the user set after the run stays unless the run set one; a file become a symlink (and the
reverse) makes a ``changes.patch`` that ``git apply`` takes and that gives the tree ``apply``
gives; an ``apply`` killed midway is named by ``runs``, ``show`` and ``diff`` until it is
finished, and the command they name finishes it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from run_helpers import CLI, as_json, immutable, run_cli

from orchestrator.cli.output import output_schema
from orchestrator.vfs.testing import capture, git

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CLI.is_file(), reason=f"console script {CLI} not installed"),
]

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project holding a few text files, a script and a symlink."""
    root = (tmp_path / "P").resolve()
    root.mkdir()
    for i in range(4):
        (root / f"f{i}.txt").write_text(f"old {i}\n")
    (root / "secret.txt").write_text("token\n")
    (root / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (root / "file").write_text("a file\n")
    (root / "link").symlink_to("f0.txt")
    return root


async def prompt(project: Path, state: Path, *instructions: str) -> str:
    """``orchestrator prompt --json`` of the demo agent given ``instructions``; the run id."""
    done = await run_cli(
        "prompt", "--agent", "demo", "--policy", "trusted", "--json", "--cwd", str(project),
        "\n".join(instructions), cwd=project.parent, state=state,
    )  # fmt: skip
    assert done.returncode == EXIT_OK, done.stderr.decode()
    result = as_json(done)
    assert not result["applied"]
    return str(result["runId"])


async def cli(project: Path, state: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    """The console script, beside the project."""
    return await run_cli(*args, cwd=project.parent, state=state)


def mode_of(path: Path) -> int:
    """The permission bits of ``path``."""
    return stat.S_IMODE(path.lstat().st_mode)


# --------------------------------------------------------------------------- modes


async def test_a_content_change_keeps_the_mode_the_user_set_after_the_run(
    project: Path, state_dir: Path
) -> None:
    """chmod 600 after the run, then apply a change of the file's content: it stays 600."""
    run_id = await prompt(project, state_dir, 'append "second" to secret.txt')
    (project / "secret.txt").chmod(0o600)
    done = await cli(project, state_dir, "apply", run_id)
    assert done.returncode == EXIT_OK, done.stderr.decode()
    assert (project / "secret.txt").read_text() == "token\nsecond\n"
    assert mode_of(project / "secret.txt") == 0o600


async def test_a_mode_the_run_set_is_applied(project: Path, state_dir: Path) -> None:
    """A mode the run set (alone, or with new content) is applied over the user's later one."""
    run_id = await prompt(
        project, state_dir, "run chmod 755 run.sh", "run chmod 700 f1.txt",
        'append "more" to f1.txt',
    )  # fmt: skip
    (project / "run.sh").chmod(0o600)
    (project / "f1.txt").chmod(0o640)
    done = await cli(project, state_dir, "apply", run_id)
    assert done.returncode == EXIT_OK, done.stderr.decode()
    assert mode_of(project / "run.sh") == 0o755
    assert (project / "f1.txt").read_text() == "old 1\nmore\n"
    assert mode_of(project / "f1.txt") == 0o700


async def test_setuid_setgid_and_sticky_bits_are_never_applied(
    project: Path, state_dir: Path
) -> None:
    """An agent's chmod 6755 (or 1777) is recorded and applied as 755 (777), shown as git's
    100755: the special bits never reach the user's files, the run's diff or changes.patch."""
    run_id = await prompt(project, state_dir, "run chmod 6755 run.sh", "run chmod 1777 f1.txt")
    shown = await cli(project, state_dir, "show", run_id, "--diff")
    assert shown.returncode == EXIT_OK, shown.stderr.decode()
    patch = (state_dir / "runs" / run_id / "changes.patch").read_text()
    for text in (shown.stdout.decode(), patch):
        modes = [line for line in text.splitlines() if "mode" in line]  # not the command line
        assert any("100755" in line for line in modes), modes
        assert not [line for line in modes if "6755" in line or "1777" in line], modes
    done = await cli(project, state_dir, "apply", run_id)
    assert done.returncode == EXIT_OK, done.stderr.decode()
    assert mode_of(project / "run.sh") == 0o755
    assert mode_of(project / "f1.txt") == 0o777


# --------------------------------------------------------------------------- type changes


async def test_changes_patch_of_type_changes_applies_with_git_as_apply_does(
    project: Path, state_dir: Path, tmp_path: Path
) -> None:
    """A symlink become a file and a file become a symlink: changes.patch passes git apply
    --check, and git apply gives the tree that orchestrator apply gives."""
    git(project, "init", "-q", "-b", "main")
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "initial")
    run_id = await prompt(
        project, state_dir, "run rm link", "create link with 'now a file'",
        "run rm file && ln -s f2.txt file",
    )  # fmt: skip
    patch = state_dir / "runs" / run_id / "changes.patch"
    by_git = tmp_path / "by-git"
    shutil.copytree(project, by_git, symlinks=True)
    git(by_git, "apply", "--check", str(patch))
    git(by_git, "apply", str(patch))
    done = await cli(project, state_dir, "apply", run_id)
    assert done.returncode == EXIT_OK, done.stderr.decode()
    assert (project / "link").read_text() == "now a file"
    assert os.readlink(project / "file") == "f2.txt"

    def tree(root: Path) -> dict[str, tuple[bytes, int]]:
        return {k: v for k, v in capture(root).items() if not k.startswith(".git")}

    assert tree(by_git) == tree(project)


# --------------------------------------------------------------------------- a crash mid-apply

# The console script's `apply`, paused after its Nth file (the apply's own test hook) until a
# file `go` exists, so that the test can SIGKILL or interrupt it there.
PAUSED_APPLY = r"""
import os, sys, time
import trio
import orchestrator.runs.apply as runs_apply
from orchestrator.cli import main
from orchestrator.vfs import apply_changes

marker, after, go = sys.argv[1], int(sys.argv[2]), sys.argv[3]
done = []

def pause(path):
    done.append(path)
    if len(done) != after:
        return
    with open(marker, "a") as f:
        f.write(path + "\n")
    deadline = time.monotonic() + 120
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.01)

async def paused(source, changes=None, **options):
    return await trio.to_thread.run_sync(
        lambda: apply_changes(source, changes, on_file=pause, **options)
    )

runs_apply.apply_changes_async = paused
sys.exit(main(sys.argv[4:]))
"""


def kill_apply_midway(
    project: Path, state: Path, run_id: str, marker: Path, *, after: int = 1
) -> None:
    """Run ``orchestrator apply RUN`` and SIGKILL it once its first ``after`` files are
    written."""
    child = paused_apply(state, run_id, marker, marker.with_name("never"), after=after)
    try:
        wait_for_pause(child, marker)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
        assert child.stderr is not None
        child.stderr.close()
    assert child.returncode == -signal.SIGKILL


def paused_apply(
    state: Path, run_id: str, marker: Path, go: Path, *args: str, after: int = 1
) -> subprocess.Popen[bytes]:
    """``orchestrator apply RUN ARGS`` that pauses after ``after`` files until ``go`` exists
    (its stderr piped)."""
    return paused_command(state, marker, go, "apply", run_id, *args, after=after)


def paused_command(
    state: Path, marker: Path, go: Path, *args: str, after: int = 1, stdout: int | None = None
) -> subprocess.Popen[bytes]:
    """``orchestrator ARGS`` whose apply pauses after ``after`` files until ``go`` exists
    (its stderr piped; its stdout as ``stdout`` says)."""
    env = {**os.environ, "ORCHESTRATOR_STATE_DIR": str(state)}
    return subprocess.Popen(
        [sys.executable, "-c", PAUSED_APPLY, str(marker), str(after), str(go), *args],
        cwd=REPO, env=env, stderr=subprocess.PIPE, stdout=stdout,
    )  # fmt: skip


def read_until(child: subprocess.Popen[bytes], said: bytes, needle: bytes) -> bytes:
    """``said`` and the lines of the child's stderr read after it, until ``needle`` is in
    them."""
    assert child.stderr is not None
    while needle not in said:
        line = child.stderr.readline()
        assert line, said.decode()
        said += line
    return said


def interrupt_midway(
    child: subprocess.Popen[bytes], marker: Path, go: Path, *, times: int = 1
) -> tuple[str, str]:
    """SIGINT the paused ``child`` ``times`` times once it pauses (each heard), let it go on,
    and wait for its end; its stderr and its stdout (empty if not piped)."""
    assert child.stderr is not None
    said, out = b"", b""
    try:
        wait_for_pause(child, marker)
        for heard in (b"interrupted", b"interrupted again")[:times]:
            child.send_signal(signal.SIGINT)
            said = read_until(child, said, heard)
        go.touch()
        said += child.stderr.read()
        if child.stdout is not None:
            out = child.stdout.read()
    finally:
        go.touch()
        child.wait(timeout=60)
        child.stderr.close()
        if child.stdout is not None:
            child.stdout.close()
    return said.decode(), out.decode()


def wait_for_pause(child: subprocess.Popen[bytes], marker: Path) -> None:
    """Wait until the paused apply has written the files it pauses after."""
    deadline = time.monotonic() + 60
    while not (marker.exists() and marker.read_text().strip()):
        assert child.poll() is None, "the apply exited before its pause"
        assert time.monotonic() < deadline, "the apply never reached its pause"
        time.sleep(0.05)


async def interrupted(project: Path, state: Path, run_id: str) -> dict[str, Any]:
    """Check that runs, show and diff (text and --json) name the interrupted apply of
    ``run_id``; its ``applyInterrupted`` object."""
    line = f"interrupted apply: run {run_id}'s changes are half written to {project}"
    finish = f"orchestrator apply {run_id}"
    for args in (("runs",), ("show", run_id), ("diff", run_id)):
        done = await cli(project, state, *args)
        assert done.returncode == EXIT_OK, done.stderr.decode()
        assert line in done.stderr.decode() and finish in done.stderr.decode()
    listed = await cli(project, state, "runs")
    assert f"{run_id}  " in listed.stdout.decode()
    assert "apply-interrupted" in listed.stdout.decode()
    diff = await cli(project, state, "diff", run_id)
    assert diff.stdout.decode().startswith("--- a/f0.txt")  # the diff on stdout, untouched
    objects = []
    for args in (("runs",), ("show", run_id), ("diff", run_id)):
        done = await cli(project, state, *args, "--json")
        assert done.returncode == EXIT_OK, done.stderr.decode()
        document = as_json(done)
        jsonschema.Draft202012Validator(output_schema()).validate(document)
        if "runs" in document:
            (document,) = [r for r in document["runs"] if r["runId"] == run_id]
        objects.append(document)
    found = [o["applyInterrupted"] for o in objects]
    assert found[0] == found[1] == found[2]
    shown = found[0]
    assert (shown["runId"], shown["workspace"], shown["finish"]) == (run_id, str(project), finish)
    assert shown["files"] == [f"f{i}.txt" for i in range(4)]
    assert Path(shown["journal"]).is_dir()
    return dict(shown)


async def test_a_crash_during_apply_is_named_until_the_named_command_finishes_it(
    project: Path, state_dir: Path, tmp_path: Path
) -> None:
    """apply killed after its first file: runs, show and diff say the workspace is half
    written and name `orchestrator apply RUN`, which finishes it; then they say nothing."""
    run_id = await prompt(project, state_dir, "replace 'old' with 'new' in f*.txt")
    kill_apply_midway(project, state_dir, run_id, tmp_path / "marker")
    assert (project / "f0.txt").read_text() == "new 0\n"
    assert (project / "f3.txt").read_text() == "old 3\n"  # half written
    assert (await interrupted(project, state_dir, run_id))["edited"] == []
    shown = (await cli(project, state_dir, "show", run_id)).stdout.decode()
    assert "its apply was cut short: the workspace holds part of its changes" in shown, shown
    assert "not applied" not in shown and "nothing was written" not in shown, shown

    done = await cli(project, state_dir, "apply", run_id)
    assert done.returncode == EXIT_OK, done.stderr.decode()
    said = done.stderr.decode()
    assert f"finished the interrupted apply of run {run_id} to {project} first: completed" in said
    assert f"applied run {run_id}: 4 files" in said
    assert [(project / f"f{i}.txt").read_text() for i in range(4)] == [
        f"new {i}\n" for i in range(4)
    ]
    for args in (("runs",), ("show", run_id), ("diff", run_id)):
        done = await cli(project, state_dir, *args)
        assert "interrupted apply" not in done.stderr.decode()
        shown = as_json(await cli(project, state_dir, *args, "--json"))
        assert (shown["runs"][0] if "runs" in shown else shown)["applyInterrupted"] is None
    assert as_json(await cli(project, state_dir, "show", run_id, "--json"))["applied"] is True
    again = await cli(project, state_dir, "apply", run_id)
    assert again.returncode == EXIT_FAILED and "already applied" in again.stderr.decode()


async def test_a_recovery_that_cannot_write_says_so_in_one_line_and_goes_on_later(
    project: Path, state_dir: Path, tmp_path: Path
) -> None:
    """apply killed after its first file, then f3.txt made immutable: the next apply cannot
    finish the interrupted one and says so in one line, exit 2, no traceback, the journal
    kept; once f3.txt can be written, the next apply finishes it."""
    run_id = await prompt(project, state_dir, "replace 'old' with 'new' in f*.txt")
    kill_apply_midway(project, state_dir, run_id, tmp_path / "marker")
    f3 = project / "f3.txt"
    if not immutable(f3, True):
        pytest.skip("chattr +i is refused here (it needs root and a file system with the flag)")
    try:
        stuck = await cli(project, state_dir, "apply", run_id)
    finally:
        immutable(f3, False)
    said = stuck.stderr.decode()
    assert stuck.returncode == EXIT_USAGE, said
    assert "Traceback" not in said, said
    (line,) = [line for line in said.splitlines() if "error:" in line]
    assert "could not be completed" in line and "is half written" in line, line
    assert f3.read_text() == "old 3\n"
    finished = await cli(project, state_dir, "apply", run_id)
    assert finished.returncode == EXIT_OK, finished.stderr.decode()
    assert [(project / f"f{i}.txt").read_text() for i in range(4)] == [
        f"new {i}\n" for i in range(4)
    ]


async def test_an_apply_of_another_run_finishes_the_interrupted_one_first(
    project: Path, state_dir: Path, tmp_path: Path
) -> None:
    """While a crash left run A half applied, apply of run B completes A's first, says so,
    records it as A's apply, then applies B."""
    first = await prompt(project, state_dir, "replace 'old' with 'new' in f*.txt")
    second = await prompt(project, state_dir, 'append "more" to secret.txt')
    kill_apply_midway(project, state_dir, first, tmp_path / "marker")
    await interrupted(project, state_dir, first)
    shown = await cli(project, state_dir, "show", second)  # the other run, same workspace
    assert f"interrupted apply: run {first}'s changes are half written" in shown.stderr.decode()
    done = await cli(project, state_dir, "apply", second, "--json")
    assert done.returncode == EXIT_OK, done.stderr.decode()
    result = as_json(done)
    jsonschema.Draft202012Validator(output_schema()).validate(result)
    assert result["applied"] and result["written"] == ["secret.txt"]
    (recovered,) = result["recovered"]
    assert (recovered["runId"], recovered["action"], recovered["problems"]) == (
        first,
        "completed",
        [],
    )
    assert [(project / f"f{i}.txt").read_text() for i in range(4)] == [
        f"new {i}\n" for i in range(4)
    ]
    assert (project / "secret.txt").read_text() == "token\nmore\n"
    assert as_json(await cli(project, state_dir, "show", first, "--json"))["applied"] is True


async def test_an_interrupted_apply_that_cannot_be_completed_is_rolled_back_around_edits(
    project: Path, state_dir: Path, tmp_path: Path
) -> None:
    """A file of the interrupted apply edited after the crash: an apply of another run rolls
    the interrupted one back except for that file, says exactly that, then applies."""
    first = await prompt(project, state_dir, "replace 'old' with 'new' in f*.txt")
    second = await prompt(project, state_dir, 'append "more" to secret.txt')
    kill_apply_midway(project, state_dir, first, tmp_path / "marker")
    await interrupted(project, state_dir, first)
    (project / "f3.txt").write_text("edited after the crash\n")
    listed = await cli(project, state_dir, "runs")
    assert "f3.txt changed since: it cannot be completed" in listed.stderr.decode()
    assert (await interrupted(project, state_dir, first))["edited"] == ["f3.txt"]
    done = await cli(project, state_dir, "apply", second)
    assert done.returncode == EXIT_OK, done.stderr.decode()
    said = done.stderr.decode()
    assert (
        f"rolled back the interrupted apply of run {first} to {project} first, as it could not "
        "be completed: f3.txt changed since the crash and are left as they are (its changes to "
        "them not made); 1 file restored, the other files hold what they held before it"
    ) in said
    assert f"applied run {second}: 1 file" in said
    assert (project / "f3.txt").read_text() == "edited after the crash\n"
    assert [(project / f"f{i}.txt").read_text() for i in range(3)] == [
        f"old {i}\n" for i in range(3)
    ]
    assert (project / "secret.txt").read_text() == "token\nmore\n"
    assert as_json(await cli(project, state_dir, "show", first, "--json"))["applied"] is False
    for args in (("runs",), ("show", first)):
        assert "interrupted apply" not in (await cli(project, state_dir, *args)).stderr.decode()


async def test_a_crash_then_edits_leave_the_workspace_as_the_apply_says(
    project: Path, state_dir: Path, tmp_path: Path
) -> None:
    """apply killed after two files, a written one and an unwritten one edited since, a temp
    file left: apply RUN rolls the rest back, keeps both edits, removes the temp file, says
    so in --json, and finds those files changed since the run (exit 3): nothing of it applied."""
    run_id = await prompt(project, state_dir, "replace 'old' with 'new' in f*.txt")
    kill_apply_midway(project, state_dir, run_id, tmp_path / "marker", after=2)
    assert [(project / f"f{i}.txt").read_text() for i in range(4)] == [
        "new 0\n", "new 1\n", "old 2\n", "old 3\n",
    ]  # fmt: skip
    (project / ".f2.txt.0123456789ab.orch-tmp").write_text("new 2\n")  # a write cut short
    (project / "f0.txt").write_text("new 0, edited\n")
    (project / "f3.txt").write_text("old 3, edited\n")
    done = await cli(project, state_dir, "apply", run_id, "--json")
    assert done.returncode == 3, done.stderr.decode()
    result = as_json(done)
    jsonschema.Draft202012Validator(output_schema()).validate(result)
    assert (result["applied"], result["written"]) == (False, [])
    assert result["workspaceChanged"] == ["f0.txt", "f3.txt"]
    (recovered,) = result["recovered"]
    assert (recovered["runId"], recovered["action"]) == (run_id, "rolled back")
    assert (recovered["problems"], recovered["edited"]) == (["f0.txt", "f3.txt"],) * 2
    assert recovered["changed"] == ["f1.txt"]
    kept = Path(recovered["journal"])
    assert kept.is_dir() and kept.name.startswith(".kept-")
    assert [(project / f"f{i}.txt").read_text() for i in range(4)] == [
        "new 0, edited\n", "old 1\n", "old 2\n", "old 3, edited\n",
    ]  # fmt: skip
    assert not [p for p in os.listdir(project) if p.endswith(".orch-tmp")]
    shown = as_json(await cli(project, state_dir, "show", run_id, "--json"))
    assert (shown["applied"], shown["applyInterrupted"]) == (False, None)
    again = await cli(project, state_dir, "apply", run_id)
    assert again.returncode == 3
    assert "f0.txt, f3.txt; none of its changes were written" in again.stderr.decode()
    assert "interrupted" not in again.stderr.decode()


# --------------------------------------------------------------------------- Ctrl-C mid-apply


async def test_an_interrupt_during_the_write_completes_the_apply_and_exits_0(
    project: Path, state_dir: Path, tmp_path: Path
) -> None:
    """SIGINT twice once apply has written its first file: the apply is completed and
    recorded, the command says the interrupt came while it was finishing (not that turns or
    agents end), exits 0."""
    run_id = await prompt(project, state_dir, "replace 'old' with 'new' in f*.txt")
    marker, go = tmp_path / "marker", tmp_path / "go"
    child = paused_apply(state_dir, run_id, marker, go)
    text, _ = interrupt_midway(child, marker, go, times=2)
    assert child.returncode == EXIT_OK, text
    assert f"applied run {run_id}: 4 files written" in text
    assert "interrupted while the apply was finishing, so it was completed" in text
    assert "turns" not in text and "agents" not in text, text  # an apply runs none
    assert [(project / f"f{i}.txt").read_text() for i in range(4)] == [
        f"new {i}\n" for i in range(4)
    ]
    assert as_json(await cli(project, state_dir, "show", run_id, "--json"))["applied"] is True


async def test_an_interrupt_during_prompt_apply_write_says_the_run_completed(
    project: Path, state_dir: Path, tmp_path: Path
) -> None:
    """SIGINT while prompt --apply writes: the run is past its point of no return, so the
    apply completes, the command exits 0 saying so, and never says to resume the run."""
    marker, go = tmp_path / "marker", tmp_path / "go"
    child = paused_command(
        state_dir, marker, go, "prompt", "--agent", "demo", "--policy", "trusted", "--apply",
        "--cwd", str(project), "replace 'old' with 'new' in f*.txt", stdout=subprocess.PIPE,
    )  # fmt: skip
    text, out = interrupt_midway(child, marker, go)
    assert child.returncode == EXIT_OK, text
    assert "applied to the workspace (4 files)" in out, out
    assert "interrupted while the run was finishing, so it was completed" in text, text
    assert "resume" not in text, text
    assert [(project / f"f{i}.txt").read_text() for i in range(4)] == [
        f"new {i}\n" for i in range(4)
    ]


async def test_an_interrupt_then_a_failed_write_exits_1_without_offering_a_resume(
    project: Path, state_dir: Path, tmp_path: Path
) -> None:
    """SIGINT while prompt --apply writes, then a write fails (f3.txt immutable): the apply
    is undone, the command says why and exits 1, not 130, and offers no resume (the run
    succeeded and stays so)."""
    f3 = project / "f3.txt"
    if not immutable(f3, True):
        pytest.skip("chattr +i is refused here (it needs root and a file system with the flag)")
    marker, go = tmp_path / "marker", tmp_path / "go"
    try:
        child = paused_command(
            state_dir, marker, go, "prompt", "--agent", "demo", "--policy", "trusted",
            "--apply", "--cwd", str(project), "replace 'old' with 'new' in f*.txt",
        )  # fmt: skip
        text, _ = interrupt_midway(child, marker, go)
    finally:
        immutable(f3, False)
    assert child.returncode == EXIT_FAILED, text
    assert "apply failed and was rolled back" in text, text
    assert "resume" not in text, text
    assert [(project / f"f{i}.txt").read_text() for i in range(4)] == [
        f"old {i}\n" for i in range(4)
    ]


async def test_a_rolled_back_apply_of_many_files_is_logged_in_a_few_names(
    project: Path, state_dir: Path
) -> None:
    """An interrupted apply of 300 files rolled back: its log line names ten and says how many
    more; apply --json lists all 300."""
    run_id = await prompt(project, state_dir, 'append "more" to secret.txt')
    journal = state_dir / "applies" / "j1"
    journal.mkdir(parents=True)
    entries = [
        # new files whose journaled contents never got written: rolled back (left absent)
        {"path": f"n{i:03}.txt", "action": "write", "new": f"new/{i}",
         "new_digest": "0" * 64, "new_mode": 0o100644}
        for i in range(300)
    ]  # fmt: skip
    body = {"version": 1, "workspace": str(project), "created": 1.0, "entries": entries}
    (journal / "journal.json").write_text(json.dumps(body))
    done = await cli(project, state_dir, "apply", run_id, "--json")
    assert done.returncode == EXIT_OK, done.stderr.decode()
    (recovered,) = as_json(done)["recovered"]
    assert recovered["action"] == "rolled back"
    assert recovered["files"] == [e["path"] for e in entries]
    said = done.stderr.decode()
    assert "n009.txt" in said and "and 290 more" in said
    assert "n010.txt" not in said, said
    assert not journal.exists()

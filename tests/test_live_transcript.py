"""``--transcript FILE`` is written as the frames pass, through the console script: it grows
during a turn, and an orchestrator killed mid-turn leaves the frames it had seen in it."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
from conftest import pid_gone
from run_helpers import (
    CLI,
    CLI_LIMIT,
    agent_command,
    as_json,
    one_line_error,
    project_config,
    run_cli,
    write_script,
)

from orchestrator.store import open_run_store
from orchestrator.testing import Flood, ReadFile, Say, Stall, Terminal, Turn

pytestmark = pytest.mark.skipif(not CLI.is_file(), reason=f"console script {CLI} not installed")

#: generous: a poll that ends early when the condition holds, never a fixed wait
DEADLINE = 30.0


async def until(condition: Callable[[], bool], within: float = DEADLINE) -> None:
    """Poll ``condition`` until it holds; fail after ``within`` seconds."""
    # Polling: nothing signals another process's write to a file, or its death.
    with trio.move_on_after(within):
        while not condition():  # noqa: ASYNC110
            await trio.sleep(0.01)
    assert condition(), f"not within {within} s"


def frames(path: Path) -> list[dict[str, Any]]:
    """The whole lines of the transcript file so far."""
    if not path.exists():
        return []
    *lines, _partial = path.read_bytes().split(b"\n")
    return [orjson.loads(line) for line in lines]


def said(path: Path, text: str) -> bool:
    """Whether the transcript holds an ``agent_message_chunk`` update carrying ``text``."""
    for e in frames(path):
        update = e.get("msg", {}).get("params", {}).get("update", {})
        if update.get("content", {}).get("text") == text:
            return True
    return False


def methods(lines: list[dict[str, Any]], direction: str) -> list[str]:
    """The methods of the requests and notifications going ``direction``, in order."""
    return [e["msg"]["method"] for e in lines if e["dir"] == direction and "method" in e["msg"]]


def answered(lines: list[dict[str, Any]], method: str) -> bool:
    """Whether the agent answered our ``method`` request (with a result)."""
    ids = {e["msg"]["id"] for e in lines if e["dir"] == "send" and e["msg"].get("method") == method}
    return any(
        e["dir"] == "recv" and e["msg"].get("id") in ids and "result" in e["msg"] for e in lines
    )


async def test_a_killed_orchestrator_leaves_the_frames_it_saw(
    tmp_path: Path, project: Path, state_dir: Path
) -> None:
    """SIGKILL mid-turn: the transcript holds the handshake, the prompt and every update the
    agent sent before it stalled; the agent is gone too."""
    wire, pidfile = tmp_path / "wire.ndjson", tmp_path / "agent.pid"
    script = write_script(
        tmp_path / "a.json",
        Turn(steps=(Say("one"), Say("two"), Say("last before the wait"), Stall())),
    )
    pid = shlex.quote(str(pidfile))
    agent = f"echo $$ > {pid}.tmp && mv {pid}.tmp {pid}; exec {shlex.join(agent_command(script))}"
    argv = [str(CLI), "prompt", "--json", "--cwd", str(project), "--transcript", str(wire)]
    argv += ["--agent", f"a={shlex.join(['sh', '-c', agent])}", "go"]
    env = {**os.environ, "ORCHESTRATOR_STATE_DIR": str(state_dir)}
    with trio.fail_after(CLI_LIMIT):
        cli = await trio.lowlevel.open_process(
            argv, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            # the agent's last update before it stalls reaches the file while the turn waits
            await until(lambda: said(wire, "last before the wait") or cli.poll() is not None)
            assert cli.poll() is None, "the command ended before the agent stalled"
            agent_pid = int(pidfile.read_text())
            cli.send_signal(signal.SIGKILL)
            assert await cli.wait() == -signal.SIGKILL
        finally:
            if cli.returncode is None:
                cli.kill()
                with trio.CancelScope(shield=True):
                    await cli.wait()
        await until(lambda: pid_gone(agent_pid))
    lines = frames(wire)
    assert wire.read_bytes().endswith(b"\n")  # whole lines only
    assert methods(lines, "send") == ["initialize", "session/new", "session/prompt"]
    assert answered(lines, "initialize") and answered(lines, "session/new")
    texts = [
        e["msg"]["params"]["update"]["content"]["text"]
        for e in lines
        if e["dir"] == "recv" and e["msg"].get("method") == "session/update"
    ]
    assert texts == ["one", "two", "last before the wait"]
    assert not answered(lines, "session/prompt")  # the turn never ended
    assert {e["agent"] for e in lines} == {"a"}


async def test_the_transcript_grows_while_the_turn_runs(
    tmp_path: Path, project: Path, state_dir: Path
) -> None:
    """What ``tail -f`` sees: the frames before a wait are in the file while the turn still
    waits, the rest (the turn's end) once it goes on; nothing is written twice."""
    wire, release = tmp_path / "wire.ndjson", tmp_path / "release"
    (project / "wait.sh").write_text(
        f"until [ -e {shlex.quote(str(release))} ]; do sleep 0.01; done\n"
    )
    steps = (Say("before"), Terminal(command="sh wait.sh"), Say("after"))
    script = write_script(tmp_path / "a.json", Turn(steps=steps))
    argv = [str(CLI), "prompt", "--json", "--policy", "trusted", "--cwd", str(project)]
    argv += ["--transcript", str(wire), "--agent", f"a={shlex.join(agent_command(script))}", "go"]
    env = {**os.environ, "ORCHESTRATOR_STATE_DIR": str(state_dir)}
    with trio.fail_after(CLI_LIMIT):
        cli = await trio.lowlevel.open_process(
            argv, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            # the terminal waits for the release file: the turn cannot end before it exists
            await until(
                lambda: (
                    "terminal/wait_for_exit" in methods(frames(wire), "recv")
                    or cli.poll() is not None
                )
            )
            assert cli.poll() is None, "the command ended before the terminal waited"
            during = frames(wire)
            assert said(wire, "before") and not said(wire, "after")
            assert not answered(during, "session/prompt")
            release.touch()
            assert await cli.wait() == 0
        finally:
            if cli.returncode is None:
                cli.kill()
                with trio.CancelScope(shield=True):
                    await cli.wait()
    after = frames(wire)
    assert after[: len(during)] == during
    assert said(wire, "after") and answered(after, "session/prompt")


async def test_a_transcript_on_a_full_disk_is_reported_once_and_the_run_goes_on(
    tmp_path: Path, project: Path, state_dir: Path
) -> None:
    """Every write of the file fails (``/dev/full``): the run succeeds and records its wire
    transcript in the store, and stderr says once that the file could not be written."""
    script = write_script(tmp_path / "a.json", Turn(steps=(Say("one"), Say("two"))))
    done = await run_cli(
        "prompt", "--json", "--cwd", str(project), "--transcript", "/dev/full",
        "--agent", f"a={shlex.join(agent_command(script))}", "go",
        cwd=tmp_path, state=state_dir,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    assert as_json(done)["text"] == "onetwo"
    stderr = done.stderr.decode()
    assert stderr.count("cannot write the transcript") == 1, stderr
    async with open_run_store(state_dir) as store:
        kept = await store.transcript(as_json(done)["runId"])
    assert [e["msg"]["method"] for e in kept if e["dir"] == "send"][:2] == [
        "initialize",
        "session/new",
    ]


async def test_a_fifo_nobody_reads_is_refused_before_the_agent_starts(
    tmp_path: Path, project: Path, state_dir: Path
) -> None:
    """A FIFO without a reader: one line, exit 2, at once; the agent never starts (it used to
    block the run for good, deaf to signals, once the agent had started)."""
    fifo, started = tmp_path / "ff", tmp_path / "started"
    os.mkfifo(fifo)
    script = write_script(tmp_path / "a.json", Turn(steps=(Say("one"),)))
    agent = f"touch {shlex.quote(str(started))}; exec {shlex.join(agent_command(script))}"
    argv = [str(CLI), "prompt", "--cwd", str(project), "--transcript", str(fifo)]
    argv += ["--agent", f"a={shlex.join(['sh', '-c', agent])}", "go"]
    env = {**os.environ, "ORCHESTRATOR_STATE_DIR": str(state_dir)}
    # output to files, not pipes, and a timeout that kills: a hung run (deaf to SIGTERM, its
    # agent holding any pipe) fails the test instead of hanging it
    with (tmp_path / "out").open("w+b") as out, (tmp_path / "err").open("w+b") as err:
        ran = await trio.to_thread.run_sync(
            lambda: subprocess.run(argv, cwd=tmp_path, env=env, stdout=out, stderr=err, timeout=30)
        )
        out.seek(0), err.seek(0)
        done = subprocess.CompletedProcess(argv, ran.returncode, out.read(), err.read())
    assert "no process is reading the FIFO" in one_line_error(done)
    assert not started.exists()


async def test_a_fifo_with_a_reader_gets_the_transcript(
    tmp_path: Path, project: Path, state_dir: Path
) -> None:
    """A FIFO that a process reads (as ``>(cat)`` gives) takes the transcript like a file."""
    fifo = tmp_path / "ff"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        script = write_script(tmp_path / "a.json", Turn(steps=(Say("one"),)))
        done = await run_cli(
            "prompt", "--json", "--cwd", str(project), "--transcript", str(fifo),
            "--agent", f"a={shlex.join(agent_command(script))}", "go",
            cwd=tmp_path, state=state_dir,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr.decode()
        got = os.read(reader, 1 << 16)  # a turn this small fits in the pipe's buffer
    finally:
        os.close(reader)
    lines = [orjson.loads(line) for line in got.splitlines()]
    assert methods(lines, "send") == ["initialize", "session/new", "session/prompt"]
    assert answered(lines, "session/prompt")


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("dangling", "dangling: where it leads does not exist"),
        ("loop", "loop: Too many levels of symbolic links"),
        ("", "transcript: the path is empty"),
        ("project/f2.md", "is inside the workspace"),
        ("project", "is inside the workspace"),
        ("state/runs.sqlite3", "is inside the state directory"),
        ("via-link/runs.sqlite3", "is inside the state directory"),
    ],
)
async def test_a_transcript_path_that_cannot_be_used_is_refused_before_anything_starts(
    tmp_path: Path, project: Path, state_dir: Path, where: str, message: str
) -> None:
    """A dangling link, a link loop, an empty path, a file of the workspace or of the state
    directory (through a link too): one line, exit 2, and nothing is written or started."""
    (tmp_path / "dangling").symlink_to("/nonexistent/x")
    (tmp_path / "loop").symlink_to("loop")
    (tmp_path / "state").symlink_to(state_dir)
    (tmp_path / "via-link").symlink_to("state")
    script = write_script(tmp_path / "a.json", Turn(steps=(Say("one"),)))
    done = await run_cli(
        "prompt", "--cwd", str(project), "--transcript", where,
        "--agent", f"a={shlex.join(agent_command(script))}", "go",
        cwd=tmp_path, state=state_dir,
    )  # fmt: skip
    assert message in one_line_error(done)
    assert sorted(p.name for p in project.iterdir()) == ["README.md"]
    assert not list((state_dir / "runs").glob("*/transcripts"))
    assert not (tmp_path / "a.jsonl").exists()  # the agent never started


async def test_a_flood_over_the_turn_cap_keeps_the_turns_end_in_the_transcript(
    tmp_path: Path, project: Path, state_dir: Path
) -> None:
    """A flood of updates past ``max_turn_record_bytes``: the updates after the cut are left
    out (the file stays small), the agent's later request, our answer and the
    ``session/prompt`` response (its stopReason) are kept, and a ``cut`` line counts the rest."""
    project_config(project, "[limits]\nmax_turn_record_bytes = 4096\n")
    wire = tmp_path / "wire.ndjson"
    steps = (Flood(count=2000), ReadFile(path="README.md"), Say("after the flood"))
    script = write_script(tmp_path / "a.json", Turn(steps=steps))
    done = await run_cli(
        "prompt", "--json", "--cwd", str(project), "--transcript", str(wire),
        "--agent", f"a={shlex.join(agent_command(script))}", "go",
        cwd=tmp_path, state=state_dir,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    lines = frames(wire)
    assert answered(lines, "session/prompt")
    end = [e for e in lines if e["dir"] == "recv" and "stopReason" in e["msg"].get("result", {})]
    assert [e["msg"]["result"]["stopReason"] for e in end] == ["end_turn"]
    assert "fs/read_text_file" in methods(lines, "recv")
    read = next(e["msg"]["id"] for e in lines if e["msg"].get("method") == "fs/read_text_file")
    assert any(e["dir"] == "send" and e["msg"].get("id") == read for e in lines)
    assert not said(wire, "after the flood")  # an update past the cut
    (cut,) = [e for e in lines if e["dir"] == "cut"]
    assert cut["limit"] == 4096 and cut["frames"] > 1000
    assert wire.stat().st_size < 3 * 4096


async def test_resume_takes_a_transcript_and_its_usage_errors_point_at_its_help(
    tmp_path: Path, state_dir: Path
) -> None:
    """``resume RUN --transcript FILE`` is a command line resume takes; an option it does not
    take is refused pointing at ``orchestrator resume --help``, where its options are."""
    done = await run_cli(
        "resume", "0123456789ab", "--transcript", str(tmp_path / "w"), "--bogus",
        cwd=tmp_path, state=state_dir,
    )  # fmt: skip
    line = one_line_error(done)
    assert line.endswith("unrecognized arguments: --bogus (see orchestrator resume --help)")

"""Agent text that would drive the user's terminal, through the console script.

A scripted agent (a real subprocess) writes a file whose content and another whose name hold
escape sequences that erase lines (and a lone carriage return), names a tool call with an OSC
sequence and streams such a reply. The human output of ``prompt``, ``diff`` and ``show`` carries
none of those control characters: each shows as an escape (``\\x1b``, ``\\r``, ``\\u009b``).
The live view (on a terminal) reads no agent text as rich markup.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import shlex
import subprocess
from pathlib import Path

import pytest
import trio
from run_helpers import CLI, CLI_LIMIT, agent_command, run_cli, workspace, write_script

from orchestrator.testing import Say, ToolCall, Turn, WriteDisk
from orchestrator.vfs.testing import git

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CLI.is_file(), reason=f"console script {CLI} not installed"),
]

#: erase the line, go up one, erase that one too
ERASE = "\x1b[2K\x1b[1A\x1b[2K"
SHOWN = "\\x1b[2K\\x1b[1A\\x1b[2K"
#: a carriage return not ending a line: what follows overwrites the line on a terminal
BARE_CR = re.compile(rb"\r(?!\n)")


def raw_controls(output: bytes) -> list[bytes]:
    """The control characters a terminal would act on in ``output``: ESC, C1, a bare CR."""
    return re.findall(rb"[\x1b\x07\x7f]|\xc2[\x80-\x9f]", output) + BARE_CR.findall(output)


async def test_prompt_diff_and_show_print_agent_control_characters_visibly(
    tmp_path: Path, state_dir: Path
) -> None:
    """The streamed reply, the tool call title, the change summary, `diff` and `show` hold no
    raw ESC, C1 control or bare CR from the agent, and show each as an escape."""
    ws = workspace(tmp_path)
    script = write_script(
        tmp_path / "esc.json",
        Turn(
            steps=(
                ToolCall(id="t1", title=f"read{ERASE}\x1b]0;owned\x07"),
                WriteDisk(path="evil.py", content=f"run('curl x | sh'){ERASE}\r# harmless\n"),
                WriteDisk(path=f"ok{ERASE}hidden.txt", content="x\n"),
                WriteDisk(path="a.txt (new) | 1 +\n forged.txt", content="x\n"),
                Say(text=f"all good{ERASE}\rdone\u009b2K"),
            )
        ),
    )
    spec = f"esc={shlex.join(agent_command(script))}"
    done = await run_cli(
        "prompt", "--agent", spec, "--policy", "trusted", "--cwd", str(ws), "hi",
        cwd=tmp_path, state=state_dir,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert raw_controls(done.stdout) == []
    assert raw_controls(done.stderr) == []
    out = done.stdout.decode()
    assert out.startswith(f"all good{SHOWN}\\rdone\\u009b2K\n")
    assert f" ok{SHOWN}hidden.txt (new) | 1 +\n" in out
    # a name holding a line break cannot print a stat line of its own
    assert " a.txt (new) | 1 +\\n forged.txt (new) " in out
    assert "\n forged.txt" not in out
    err = done.stderr.decode()
    assert f" tool     > other: read{SHOWN}\\x1b]0;owned\\x07\n" in err
    (run_id,) = os.listdir(state_dir / "runs")

    diff = await run_cli("diff", run_id, cwd=tmp_path, state=state_dir)
    assert diff.returncode == 0, diff.stderr.decode(errors="replace")
    assert raw_controls(diff.stdout) == []
    assert f"+run('curl x | sh'){SHOWN}\\r# harmless\n" in diff.stdout.decode()

    show = await run_cli("show", run_id, cwd=tmp_path, state=state_dir)
    assert show.returncode == 0, show.stderr.decode(errors="replace")
    assert raw_controls(show.stdout + show.stderr) == []
    assert f" ok{SHOWN}hidden.txt (new) | 1 +\n" in show.stdout.decode()


async def test_diff_of_ordinary_text_is_the_patch_itself(tmp_path: Path, state_dir: Path) -> None:
    """Without control characters (CRLF line ends, tabs and any Unicode included) `diff` prints
    the run's diff as `diff --json` holds it, unchanged, and it applies with git."""
    ws = workspace(tmp_path, {"a.txt": "one\r\ntwo\r\n"})
    git(ws, "init", "-q", "-b", "main")
    git(ws, "add", "-A")
    git(ws, "commit", "-q", "-m", "initial")
    script = write_script(
        tmp_path / "plain.json",
        Turn(
            steps=(
                WriteDisk(path="a.txt", content="one\r\nzwei \u00e9\u4e2d\U0001f600\r\n"),
                WriteDisk(path="tab\there.txt", content="\tindented\n"),
            )
        ),
    )
    spec = f"plain={shlex.join(agent_command(script))}"
    done = await run_cli(
        "prompt", "--agent", spec, "--policy", "trusted", "--cwd", str(ws), "hi",
        cwd=tmp_path, state=state_dir,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    (run_id,) = os.listdir(state_dir / "runs")
    diff = await run_cli("diff", run_id, cwd=tmp_path, state=state_dir)
    as_json = await run_cli("diff", run_id, "--json", cwd=tmp_path, state=state_dir)
    assert diff.stdout == json.loads(as_json.stdout)["diff"].encode()
    (tmp_path / "out.patch").write_bytes(diff.stdout)
    git(ws, "apply", str(tmp_path / "out.patch"))
    assert (ws / "a.txt").read_bytes() == "one\r\nzwei \u00e9\u4e2d\U0001f600\r\n".encode()


def _run_on_terminal(argv: list[str], cwd: Path, state: Path) -> tuple[int, bytes]:
    """Run ``argv`` with its stderr on a pseudo-terminal (so the live view is on); its exit
    code and everything it wrote there."""
    controller, terminal = pty.openpty()
    env = {**os.environ, "ORCHESTRATOR_STATE_DIR": str(state), "COLUMNS": "200"}
    with subprocess.Popen(
        argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=terminal,
    ) as proc:  # fmt: skip
        os.close(terminal)
        shown = b""
        try:
            while True:
                ready, _, _ = select.select([controller], [], [], CLI_LIMIT)
                assert ready, "the command wrote nothing for too long"
                try:
                    chunk = os.read(controller, 65536)
                except OSError:  # EIO: every writer closed the terminal
                    break
                if not chunk:
                    break
                shown += chunk
        finally:
            os.close(controller)
        return proc.wait(CLI_LIMIT), shown


async def test_live_view_reads_no_markup_in_agent_text(tmp_path: Path, state_dir: Path) -> None:
    """`compare` on a terminal with a task holding `[/x]` (the demo agent puts it in its tool
    call title, shown in the live view) finishes and shows it as text."""
    ws = workspace(tmp_path, {"a.txt": "hi\n"})
    argv = [str(CLI), "compare", "--agent", "a=demo", "--agent", "b=demo", "--cwd", str(ws)]
    argv.append('replace "hi" with "[/x]" in *.txt')
    code, shown = await trio.to_thread.run_sync(_run_on_terminal, argv, tmp_path, state_dir)
    assert b"Traceback" not in shown
    assert code == 0, shown.decode(errors="replace")
    assert b"[/x]" in shown

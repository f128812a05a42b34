"""What a person sees on stderr during a run: the live table on a terminal (through a
pseudo-terminal, at 80 and 200 columns), log-format lines off one; and a library that prints
nothing unless its caller configures logging."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import pty
import re
import select
import shutil
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from attrs import define
from run_helpers import configure, write_agent

from orchestrator.testing import Say, Turn, Update

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "examples" / "sample-project"
DEMO_PIPELINE = ROOT / "examples" / "demo_pipeline.py"
LIVE_PIPELINE = ROOT / "tests" / "pipelines" / "live_view.py"
CLI = Path(sys.executable).parent / "orchestrator"
#: seconds a whole command may take (its agents are Python subprocesses)
LIMIT = 120.0
#: a task whose text reads as rich markup, and a file name that does
MARKUP_TASK = 'create notes-[/x].md with "[bold]x[/bold]"'
#: an escape sequence (the terminal's own control sequences, not the content)
_ESCAPE = re.compile(r"\x1b(\[[0-9;?]*[ -/]*[@-~]|\][^\x07]*\x07|[()][0-9A-Za-z]|[=>])")

#: one piece of terminal output: a control sequence (its number and final letter), another
#: escape sequence, or one character
_TERMINAL_OUTPUT = re.compile(r"\x1b\[([0-9;?]*)[ -/]*([@-~])|" + _ESCAPE.pattern + "|.", re.S)

pytestmark = pytest.mark.slow


@define
class Screen:
    """What a command wrote to the terminal, its standard output and its exit code."""

    raw: str
    stdout: str
    code: int
    columns: int = 80

    @property
    def text(self) -> str:
        """The terminal output without its control sequences."""
        return _ESCAPE.sub("", self.raw)

    @property
    def lines(self) -> list[str]:
        """Each line drawn (a redraw starts a line with a carriage return)."""
        return [line for line in re.split(r"[\r\n]+", self.text) if line.strip()]

    @property
    def table(self) -> list[str]:
        """The lines of the live table: its header, rule and rows."""
        return [line for line in self.lines if any(c in line for c in "│┃━")]

    @property
    def shown(self) -> list[str]:
        """The lines left on the terminal at the end: the output played on a terminal
        ``columns`` wide that moves its cursor and erases lines as asked (tall enough never to
        scroll)."""
        rows: list[list[str]] = []
        row = col = 0
        for token in _TERMINAL_OUTPUT.finditer(self.raw):
            text, kind = token.group(0), token.group(2)
            n = int(token.group(1)) if (token.group(1) or "").isdigit() else 0
            if kind == "A":
                row = max(0, row - (n or 1))
            elif kind == "B":
                row += n or 1
            elif kind == "G":
                col = max(0, n - 1)
            elif text == "\r":
                col = 0
            elif text == "\n":
                row += 1
            elif not text.startswith("\x1b") and col >= self.columns:
                row, col = row + 1, 0  # the line is full: the text goes on below
            rows += [[] for _ in range(row + 1 - len(rows))]
            if kind == "K":  # erase the line (2), or from the cursor to its end (0)
                del rows[row][0 if n == 2 else col :]
            elif not text.startswith("\x1b") and text not in "\r\n":
                line = rows[row]
                line += [" "] * (col + 1 - len(line))
                line[col] = text
                col += 1
        return ["".join(line).rstrip() for line in rows]


def _controlling_terminal() -> None:
    """In the child, after setsid: its stdin, the pseudo-terminal, becomes its terminal
    (``/dev/tty``, where questions are asked; Ctrl-C typed there interrupts it)."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def in_terminal(
    *args: str,
    cwd: Path,
    state: Path,
    columns: int,
    watch: Callable[[str], None] | None = None,
    typing: Callable[[str], bytes] | None = None,
) -> Screen:
    """Run the console script with its stdin and stderr on a pseudo-terminal ``columns`` wide,
    its controlling terminal (stdout a pipe); ``watch`` sees the terminal text so far each time
    more arrives, and what ``typing`` returns for it is typed at the terminal."""
    main, side = pty.openpty()
    fcntl.ioctl(side, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = {**os.environ, "ORCHESTRATOR_STATE_DIR": str(state), "COLUMNS": str(columns)}
    env.update(LINES="50", TERM="xterm-256color")
    for name in ("NO_COLOR", "FORCE_COLOR"):
        env.pop(name, None)
    proc = subprocess.Popen(
        [str(CLI), *args],
        stdin=side,
        stdout=subprocess.PIPE,
        stderr=side,
        cwd=cwd,
        env=env,
        start_new_session=True,
        preexec_fn=_controlling_terminal,
    )
    os.close(side)
    raw = b""
    deadline = time.monotonic() + LIMIT
    try:
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"still running after {LIMIT} s:\n{_ESCAPE.sub('', raw.decode())}"
            ready, _, _ = select.select([main], [], [], left)
            if not ready:
                continue
            try:
                chunk = os.read(main, 65536)
            except OSError as e:  # EIO: every writer of the terminal is gone
                if e.errno != errno.EIO:
                    raise
                break
            if not chunk:
                break
            raw += chunk
            if watch is not None:
                watch(_ESCAPE.sub("", raw.decode(errors="replace")))
            if typing is not None:
                os.write(main, typing(_ESCAPE.sub("", raw.decode(errors="replace"))))
        assert proc.stdout is not None
        stdout = proc.stdout.read().decode()
        code = proc.wait(timeout=LIMIT)
    finally:
        os.close(main)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    return Screen(raw.decode(errors="replace"), stdout, code, columns)


def cli(*args: str, state: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run the console script off a terminal (stdout and stderr are pipes)."""
    env = {**os.environ, "ORCHESTRATOR_STATE_DIR": str(state)}
    return subprocess.run(
        [str(CLI), *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=LIMIT
    )


@pytest.fixture
def sample(tmp_path: Path) -> Path:
    """A copy of the sample project."""
    target = tmp_path / "sample-project"
    shutil.copytree(SAMPLE, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


class _Release:
    """Opens the pipeline's ``hold`` step (it reads a named pipe) once the live table showed
    two different elapsed times on the step's row: the table was redrawn with no event."""

    def __init__(self, fifo: Path):
        self.fifo = fifo
        self.seen: set[str] = set()
        self.sent = False

    def __call__(self, text: str) -> None:
        if self.sent:
            return
        self.seen |= set(re.findall(r"\bhold\b[^\r\n]*?running\s*│\s*([0-9.]+s)", text))
        if len(self.seen) < 2:
            return
        try:  # the step opens the pipe for reading as it starts: a writer can open it then
            fd = os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as e:
            if e.errno != errno.ENXIO:  # no reader yet: the next redraw tries again
                raise
            return
        with os.fdopen(fd, "w") as pipe:
            pipe.write("go\n")
        self.sent = True


@pytest.mark.parametrize("columns", [80, 200])
def test_live_table_ticks_and_shows_instance_keys(
    tmp_path: Path, project: Path, state_dir: Path, columns: int
) -> None:
    """On a terminal, a pipeline's live table names each instance (``work[a]``), shows agent
    text as text, fits the width, and its elapsed time moves while no event arrives."""
    fifo = tmp_path / "release"
    os.mkfifo(fifo)
    release = _Release(fifo)
    screen = in_terminal(
        "run",
        str(LIVE_PIPELINE),
        "--cwd",
        str(project),
        "--policy",
        "trusted",
        "--set",
        f"task={MARKUP_TASK}",
        "--set",
        f"release={fifo}",
        cwd=tmp_path,
        state=state_dir,
        columns=columns,
        watch=release,
    )
    assert screen.code == 0, screen.text
    assert release.sent, screen.text  # two frames with different times, no event between
    assert "Traceback" not in screen.text
    for key in ("work[a]", "work[b]", "hold"):
        assert re.search(rf"^ {re.escape(key)} .*│ succeeded ", screen.text, re.M), key
    assert "Create notes-[/x].md" in screen.text  # the agent's tool call title, as written
    assert max(len(line) for line in screen.table) <= columns


@pytest.mark.parametrize("columns", [80, 200])
def test_compare_live_table_fits_the_width(
    tmp_path: Path, project: Path, state_dir: Path, columns: int
) -> None:
    """``compare`` with a task holding ``[/x]`` runs to its end on a terminal; at 80 columns
    the table leaves out the agent and tokens columns and keeps each whole name and state, at
    200 it shows every column."""
    long_name = "a-rather-long-agent-label"
    screen = in_terminal(
        "compare",
        "--agent",
        f"{long_name}=demo",
        "--agent",
        "b=demo",
        "--cwd",
        str(project),
        "--policy",
        "edit",
        MARKUP_TASK,
        cwd=tmp_path,
        state=state_dir,
        columns=columns,
    )
    assert screen.code == 0, screen.text
    assert "Traceback" not in screen.text and "MarkupError" not in screen.text
    rows = screen.table
    assert any(f" compare[{long_name}] " in row and " succeeded " in row for row in rows)
    assert any(" compare[b] " in row and " succeeded " in row for row in rows)
    # the last table drawn, with both rows (an early one, before any row, has room for all)
    header = [line for line in screen.lines if line.lstrip().startswith("step ")][-1]
    columns_shown = [c.strip() for c in header.split("┃")]
    if columns == 80:
        assert columns_shown == ["step", "state", "time", "last tool call"]
    else:
        assert columns_shown == ["step", "agent", "state", "time", "tokens", "last tool call"]
        assert "Create notes-[/x].md (notes-[/x].md)" in screen.text
    assert max(len(line) for line in screen.table) <= columns


_PLAIN = re.compile(r"^\d\d:\d\d:\d\d (debug|info|warning|error|critical) +\S")


def _progress_part(stderr: str, last: str) -> list[str]:
    """The progress and log lines of a run's stderr: up to the first line matching ``last``,
    the end of the run (what is printed after it is the result, not progress)."""
    lines = stderr.splitlines()
    end = next(i for i, line in enumerate(lines) if re.search(last, line))
    return lines[: end + 1]


def test_off_a_terminal_progress_and_logs_are_plain_lines(
    tmp_path: Path, sample: Path, state_dir: Path
) -> None:
    """Off a terminal, progress and log lines share one plain format, and the merge conflict
    of the demo pipeline is reported once on stderr (the result lists it)."""
    done = cli(
        "-v", "run", str(DEMO_PIPELINE), "--cwd", str(sample), "--policy", "trusted",
        state=state_dir, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    # the result (its `run RUN: succeeded` line included) is on stdout: stderr is progress
    assert re.search(r"^run \w+: succeeded$", done.stdout, re.MULTILINE), done.stdout
    progress = done.stderr.splitlines()
    assert not [line for line in progress if re.search(r"run \w+: succeeded", line)]
    assert [line for line in progress if not _PLAIN.match(line)] == []
    assert any(" info    agent process started " in line for line in progress)  # a log line
    assert any(" info    started  rename[shop/cart.py] (demo)" in line for line in progress)
    conflicts = [line for line in progress if "README.md" in line and "conflict" in line]
    assert [line[9:] for line in conflicts] == [
        "warning conflict check: README.md (content) resolution=ours"
    ]


def test_log_json_makes_every_progress_and_log_line_json(
    tmp_path: Path, sample: Path, state_dir: Path
) -> None:
    """With ``--log-json`` each progress event and log line is one JSON object on stderr, the
    conflict among them once."""
    done = cli(
        "--log-json", "run", str(DEMO_PIPELINE), "--cwd", str(sample), "--policy", "trusted",
        state=state_dir, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    progress = _progress_part(done.stderr, '"event":"run_finished"')
    entries = [json.loads(line) for line in progress]
    assert {"timestamp", "level", "logger", "event"} <= set(entries[0])
    started = [e for e in entries if e["event"] == "step_started"]
    assert {e["instance"] for e in started} >= {"rename[shop/cart.py]", "docs[alice]", "check"}
    conflicts = [e for e in entries if "README.md" in json.dumps(e) and "conflict" in e["event"]]
    assert [(c["event"], c["path"], c["resolution"]) for c in conflicts] == [
        ("conflict", "README.md", "ours")
    ]
    assert entries[-1]["event"] == "run_finished" and entries[-1]["status"] == "succeeded"


# --------------------------------------------------------------------------- the library's logs

PROMPT_SCRIPT = """\
import logging, sys
if sys.argv[1] == "configured":
    logging.basicConfig(level=logging.INFO)
from orchestrator import prompt_sync
run = prompt_sync("demo", 'append "world" to notes.md', cwd=sys.argv[2], policy="edit")
print("stop:", run.turn.stop_reason)
"""


def _python(*args: str, state: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ORCHESTRATOR_STATE_DIR": str(state)}
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=LIMIT
    )


def test_library_prints_nothing_unless_logging_is_configured(
    tmp_path: Path, project: Path, state_dir: Path
) -> None:
    """``prompt_sync`` writes no log line to stdout or stderr; with ``logging.basicConfig``
    its lines appear on stderr, under ``orchestrator`` loggers."""
    (project / "notes.md").write_text("hello\n")
    script = tmp_path / "prompt.py"
    script.write_text(PROMPT_SCRIPT)
    quiet = _python(str(script), "quiet", str(project), state=state_dir, cwd=tmp_path)
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "stop: end_turn\n", "")
    loud = _python(str(script), "configured", str(project), state=state_dir, cwd=tmp_path)
    assert (loud.returncode, loud.stdout) == (0, "stop: end_turn\n")
    assert "INFO:orchestrator.agent.process:agent process started agent=demo" in loud.stderr


def test_library_example_prints_only_its_own_lines(tmp_path: Path, state_dir: Path) -> None:
    """``examples/library_script.py`` prints its six lines and nothing else."""
    done = _python(str(ROOT / "examples" / "library_script.py"), state=state_dir, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert [line.split(":")[0].split()[0] for line in done.stdout.splitlines()] == [
        "a",
        "b",
        "winner",
        "pipeline",
        "check",
        "applied",
    ]


def test_a_failing_event_listener_is_logged_and_the_run_goes_on(
    tmp_path: Path, project: Path
) -> None:
    """An ``on_event`` callback that raises (a progress view that cannot draw) is one error
    line in the log, with its traceback; the run still succeeds."""
    from log_capture import capture_logs

    from orchestrator import run_pipeline_sync

    pipeline = tmp_path / "one.py"
    pipeline.write_text(
        "from orchestrator.pipeline import step\n\n\n@step\ndef only() -> str:\n    return 'x'\n"
    )

    def listener(event: object) -> None:
        raise ValueError("cannot draw [/x]")

    with capture_logs() as logs:
        run = run_pipeline_sync(pipeline, cwd=project, on_event=listener)
    assert run.status == "succeeded"
    failed = [e for e in logs if e["event"] == "event listener failed"]
    assert failed and all(e["log_level"] == "error" and e["exc_info"] for e in failed)
    assert failed[0]["event_type"] == "run_started"


# --------------------------------------------------------------------------- questions, Ctrl-C

ASK_POLICY = """\
preset = "trusted"
ask_timeout = 30

[[rules]]
name = "ask to edit"
verdict = "ask"
kinds = ["edit"]
"""
#: a demo agent's task: a command, an edit (the question), a command after the answer
ASK_TASK = 'run sleep 1\nreplace "colour" with "color" in README.md\nrun sleep 2'
ONE_STEP = """\
from orchestrator import step


@step(agent="demo")
def edit(task: str) -> str:
    return task
"""


class _Answer:
    """Types ``y`` and Enter at each new question, once the question is on the terminal."""

    def __init__(self) -> None:
        self.answered = 0

    def __call__(self, text: str) -> bytes:
        if text.count("Allow?") <= self.answered:
            return b""
        self.answered += 1
        return b"y\r"


def _after_each_question(shown: list[str], answered: int) -> None:
    """Each question is on the screen in full, answered, and the table goes on below it."""
    asked = [i for i, line in enumerate(shown) if line.startswith("Allow?")]
    assert len(asked) == answered, "\n".join(shown)
    # the path is as long as the temporary directory: the terminal may wrap it onto more lines
    question = re.compile(
        r"Permission request from [^\n]*\n  edit: [^\n]*\n  path: [^\n]*\n(?:[^ \n][^\n]*\n)*"
        r"  rule: run/ask to edit\nAllow\? [^\n]*: y$"
    )
    for at in asked:
        above = "\n".join(shown[: at + 1])
        assert question.search(above[above.rindex("Permission request from ") :]), above
    after = shown[asked[-1] + 1 :]
    assert any(" succeeded " in line for line in after), "\n".join(shown)


def test_an_answered_question_stays_on_the_screen(
    tmp_path: Path, project: Path, state_dir: Path
) -> None:
    """A question asked while the live table is up, and its answer, stay on the screen; the
    table is drawn again below them."""
    (project / "README.md").write_text("# project\n\nIn colour.\n")
    (tmp_path / "ask.toml").write_text(ASK_POLICY)
    (tmp_path / "ask1.py").write_text(ONE_STEP)
    answer = _Answer()
    screen = in_terminal(
        "run", "ask1.py", "--policy", "ask.toml", "--cwd", str(project), "--set",
        f"task={ASK_TASK}",
        cwd=tmp_path, state=state_dir, columns=100, typing=answer,
    )  # fmt: skip
    assert screen.code == 0, screen.text
    _after_each_question(screen.shown, 1)


def test_two_answered_questions_of_compare_stay_on_the_screen(
    tmp_path: Path, project: Path, state_dir: Path
) -> None:
    """``compare`` with two agents asks twice; both questions and answers stay on the screen
    above the table drawn after them."""
    (project / "README.md").write_text("# project\n\nIn colour.\n")
    (tmp_path / "ask.toml").write_text(ASK_POLICY)
    answer = _Answer()
    screen = in_terminal(
        "compare", "--agent", "demo", "--agent", "b=demo", "--policy", "ask.toml",
        "--cwd", str(project), ASK_TASK,
        cwd=tmp_path, state=state_dir, columns=100, typing=answer,
    )  # fmt: skip
    assert screen.code == 0, screen.text
    _after_each_question(screen.shown, 2)


class _Interrupt:
    """Types Ctrl-C once the table shows the step running its command."""

    def __init__(self) -> None:
        self.sent = False

    def __call__(self, text: str) -> bytes:
        if self.sent or not re.search(r"running\s*│[^\r\n]*│ Run sleep 30", text):
            return b""
        self.sent = True
        return b"\x03"


def test_the_last_frame_after_ctrl_c_shows_the_steps_interrupted(
    tmp_path: Path, project: Path, state_dir: Path
) -> None:
    """Ctrl-C during a run: its last table shows the step that was running as interrupted,
    as the run is recorded, not still running."""
    (tmp_path / "slow.py").write_text(ONE_STEP)
    interrupt = _Interrupt()
    screen = in_terminal(
        "run", "slow.py", "--policy", "trusted", "--cwd", str(project), "--set",
        "task=run sleep 30",
        cwd=tmp_path, state=state_dir, columns=100, typing=interrupt,
    )  # fmt: skip
    assert interrupt.sent, screen.text
    assert screen.code == 130, screen.text
    rows = [line for line in screen.shown if line.startswith(" edit ")]
    assert len(rows) == 1, "\n".join(screen.shown)
    assert re.match(r" edit +│ demo +│ interrupted +│ [0-9.]+s ", rows[0]), "\n".join(screen.shown)


def test_a_long_step_name_leaves_out_the_last_tool_call_before_it_folds(
    tmp_path: Path, project: Path, state_dir: Path
) -> None:
    """At 60 columns a long instance name keeps its line whole: the last tool call column is
    left out first, the name is folded only when the step, state and time alone do not fit."""
    (project / "README.md").write_text("# project\n\nIn colour.\n")
    long_name = "a-long-agent-name"
    screen = in_terminal(
        "compare", "--agent", f"{long_name}=demo", "--agent", "b=demo", "--policy", "trusted",
        "--cwd", str(project), 'run sleep 2\nreplace "colour" with "color" in README.md',
        cwd=tmp_path, state=state_dir, columns=60,
    )  # fmt: skip
    assert screen.code == 0, screen.text
    rows = [line for line in screen.table if "│" in line]
    assert rows, screen.text
    assert {row.split("│")[0].strip() for row in rows} == {f"compare[{long_name}]", "compare[b]"}
    header = [line for line in screen.lines if line.lstrip().startswith("step ")][-1]
    assert [c.strip() for c in header.split("┃")] == ["step", "state", "time"]
    assert max(len(line) for line in screen.table) <= 60


NOTICE_PIPELINE = """\
from orchestrator import step


@step(agent="noter")
def write(task: str) -> str:
    return task
"""


def test_a_notice_stays_on_the_screen_above_the_live_table(
    tmp_path: Path, project: Path, state_dir: Path
) -> None:
    """On a terminal, an agent's notice is a line printed above the live table that stays on
    the screen once the run ended, not a cell the next update overwrites."""
    notice = {"sessionUpdate": "notice", "severity": "warning", "title": "Context almost full"}
    turn = Turn(steps=(Update(notice), Say("done\n")))
    configure(project, noter=write_agent(tmp_path / "noter.json", turn))
    pipeline = tmp_path / "notice.py"
    pipeline.write_text(NOTICE_PIPELINE)
    screen = in_terminal(
        "run", str(pipeline), "--cwd", str(project), "--set", "task=go",
        cwd=tmp_path, state=state_dir, columns=100,
    )  # fmt: skip
    assert screen.code == 0, screen.text
    shown = screen.shown
    [line] = [n for n, text in enumerate(shown) if "write: Context almost full" in text]
    assert re.search(r"\bwarning\s+notice\s+write: Context almost full$", shown[line])
    # the table's last frame is drawn below it
    assert any(re.search(r"^ write .*│ succeeded ", text) for text in shown[line + 1 :])
